"""What an annotation says of a name: a tensor, known not to be one (a container or a plain value), or unknown.

A leaf module: the project model (``model``) files class attributes by their annotations
while it loads a file, and the kind evaluator (``kinds``), which reads that model, files
parameters and locals the same way; both import it, and it imports neither.
"""

from __future__ import annotations

import ast

_TENSOR_TYPES = {"Tensor", "LongTensor", "IntTensor", "BoolTensor", "FloatTensor", "HalfTensor", "ByteTensor",
                 "Parameter"}
_CONTAINERS = {"List", "list", "Dict", "dict", "Tuple", "tuple", "Set", "set", "FrozenSet", "frozenset", "Sequence",
               "MutableSequence", "Iterable", "Iterator", "Generator", "Mapping", "MutableMapping", "Deque", "deque",
               "DefaultDict", "defaultdict", "OrderedDict", "Callable", "Type", "type", "Collection", "Counter"}
_PLAIN = {"int", "float", "bool", "str", "bytes", "complex", "None", "Any", "object", "device", "dtype", "Event",
          "Stream"}
_TRANSPARENT = {"Optional", "Annotated", "ClassVar", "Final", "Required", "NotRequired", "ReadOnly"}


def annotation_kind(node: ast.expr | None) -> str | None:
    """'tensor', 'other' (known not to be a tensor) or None (unknown) for an annotation."""
    if node is None:
        return None
    if isinstance(node, ast.Constant):
        if node.value is None:
            return "none"
        if isinstance(node.value, str):
            try:
                return annotation_kind(ast.parse(node.value, mode="eval").body)
            except SyntaxError:
                return None
        return None
    if isinstance(node, (ast.Name, ast.Attribute)):
        last = node.id if isinstance(node, ast.Name) else node.attr
        if last in _TENSOR_TYPES:
            return "tensor"
        if last in _CONTAINERS or last in _PLAIN:
            return "other"
        return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _union([node.left, node.right])
    if isinstance(node, ast.Subscript):
        base = node.value.id if isinstance(node.value, ast.Name) else (
            node.value.attr if isinstance(node.value, ast.Attribute) else None)
        args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if base in _TRANSPARENT:
            return annotation_kind(args[0])
        if base == "Union":
            return _union(args)
        if base in _CONTAINERS:
            return "other"
    return None


def _union(members: list[ast.expr]) -> str | None:
    kinds = [annotation_kind(m) for m in members]
    kinds = [k for k in kinds if k != "none"]
    if kinds and all(k == "tensor" for k in kinds):
        return "tensor"
    if kinds and all(k == "other" for k in kinds):
        return "other"
    return None


def note_annotation(annotation: ast.expr | None, name: str, tensors: set[str], not_tensors: set[str]) -> None:
    """File ``name`` under tensors or pinned non-tensors by its annotation (unknown: neither)."""
    kind = annotation_kind(annotation)
    if kind == "tensor":
        tensors.add(name)
    elif kind == "other":
        not_tensors.add(name)
