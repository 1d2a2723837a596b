"""What kind of value an expression holds: page table, tensor, mask, host tensor, Python scalar.

What is statically knowable, and the heuristics used where it is not:

- A *tensor*: a page table, a parameter or name annotated as one (``Tensor``,
  ``Optional[Tensor]``, ``Tensor | None``, a string annotation of those), the result
  of a ``torch.*`` call, of a tensor method, of a function of the checked tree whose
  return annotation is a tensor, of indexing or arithmetic on a tensor, or a name or
  ``self.attr`` assigned from one (flow-insensitive). A container annotation
  (``List[Tensor]``, ``Optional[List[Tensor]]``, ``dict[str, Tensor]``) is *not* a
  tensor, and pins the name: no assignment makes it one. Unknown names are not tensors.
- A *Python scalar*: a numeric constant, ``-1`` (``UnaryOp(USub, Constant(1))``), a
  module or class constant (``TOMBSTONE = -1``, also imported from the checked tree),
  ``int()``/``len()``/``.item()``/``.numel()``/``.shape[i]``, arithmetic over these, or
  a local assigned only from them.
- A *boolean mask*: a comparison of tensors, ``~mask``, ``mask & mask``, ``.bool()``,
  ``.eq()``…, ``torch.isin``/``torch.logical_*``, or a name assigned from one.
- A *host tensor*: a factory called without ``device=`` (``torch.tensor([...])``),
  ``.cpu()``/``.pin_memory()`` of a tensor, or a tensor whose name says so
  (``seq_lens_cpu``, ``host_indices``). Reading a host tensor back is no sync, so the
  host-read and data-dependent rules skip it; copying it to the device is one.
- A *page table*: a name with the word ``v2p``/``p2v`` (or ``virtual_to_physical``…),
  an alias of one (local, ``self.attr``, tuple unpacking, slice view, parameter).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field

from . import vocab
from .annotations import annotation_kind, note_annotation
from .model import Class, Func, Module, Project


@dataclass
class Env:
    """The kinds of a function's names in one calling context."""

    tables: set[str] = field(default_factory=set)
    tensors: set[str] = field(default_factory=set)
    masks: set[str] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)
    scalars: set[str] = field(default_factory=set)
    not_scalars: set[str] = field(default_factory=set)
    not_tensors: set[str] = field(default_factory=set)  # annotated as a container or a plain value

    def key(self) -> tuple:
        return (frozenset(self.tables), frozenset(self.tensors), frozenset(self.masks), frozenset(self.hosts),
                frozenset(self.scalars))


def class_attrs(project: Project, cls: Class) -> None:
    """``self.X = <expr>`` anywhere in the class: tables, tensors, host tensors, masks, scalars."""
    if cls.attrs_done:
        return
    cls.attrs_done = True
    assigns: list[tuple[str, ast.expr, object]] = []
    for func in cls.methods.values():
        fn = func.node
        selfname = fn.args.args[0].arg if fn.args.args else "self"
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    for tgt, val in vocab.pair_targets(t, node.value):
                        if isinstance(tgt, ast.Attribute) and isinstance(tgt.value, ast.Name) and tgt.value.id == selfname:
                            assigns.append((tgt.attr, val, func))
            elif isinstance(node, ast.AnnAssign):
                t = node.target
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == selfname:
                    note_annotation(node.annotation, t.attr, cls.tensor_attrs, cls.not_tensor_attrs)
                    if node.value is not None:
                        assigns.append((t.attr, node.value, func))
    scalar_only: dict[str, bool] = {}
    merged = Env(cls.table_attrs, cls.tensor_attrs, cls.mask_attrs, cls.host_attrs, cls.scalar_attrs)
    for _ in range(4):  # a small fixpoint: aliases of aliases
        for attr, val, func in assigns:
            ev = Eval(project, cls.module, merged, Env(), func.self_name())
            if vocab.is_table_name(attr) or ev.is_table(val):
                cls.table_attrs.add(attr)
            if attr not in cls.not_tensor_attrs and ev.is_tensor(val):
                cls.tensor_attrs.add(attr)
            if ev.is_host(val):
                cls.host_attrs.add(attr)
            if ev.is_mask(val):
                cls.mask_attrs.add(attr)
            scalar_only[attr] = scalar_only.get(attr, True) and ev.is_pyscalar(val)
    for attr, ok in scalar_only.items():
        if ok and attr not in cls.tensor_attrs:
            cls.scalar_attrs.add(attr)
    cls.tensor_attrs -= cls.not_tensor_attrs


def attr_kinds(project: Project, cls: Class | None) -> Env | None:
    """The ``self.X`` kinds of a class together with its bases (its MRO in the tree)."""
    if cls is None:
        return None
    out = Env()
    pinned: set[str] = set()
    for c in project.mro(cls):
        class_attrs(project, c)
        out.tables |= c.table_attrs
        out.tensors |= c.tensor_attrs
        out.hosts |= c.host_attrs
        out.masks |= c.mask_attrs
        out.scalars |= c.scalar_attrs
        pinned |= c.not_tensor_attrs
    out.tensors -= pinned
    out.scalars -= out.tensors
    return out


class Eval:
    """Classifies expressions within one function under one context."""

    def __init__(self, project: Project, mod: Module, attrs: Env | None, env: Env, self_name: str | None,
                 resolve: Callable[[ast.Call], Func | None] | None = None):
        self.project = project
        self.mod = mod
        self.attrs = attrs
        self.env = env
        self.self_name = self_name
        self.resolve = resolve  # where a call goes in the checked tree, for its return annotation

    def _self_attr(self, node: ast.expr) -> str | None:
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and self.self_name is not None and node.value.id == self.self_name):
            return node.attr
        return None

    # tables ------------------------------------------------------------------
    def is_table(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.env.tables or vocab.is_table_name(node.id)
        if isinstance(node, ast.Attribute):
            attr = self._self_attr(node)
            if attr is not None and self.attrs is not None and attr in self.attrs.tables:
                return True
            return vocab.is_table_name(node.attr)
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
            return self.is_table(node.value)  # a slice is a view of the table
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in vocab.VIEW_METHODS:
            return self.is_table(node.func.value)
        if isinstance(node, ast.NamedExpr):
            return self.is_table(node.value)
        return False

    # tensors -----------------------------------------------------------------
    def is_tensor(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name) and node.id in self.env.not_tensors:
            return False
        if self.is_table(node):
            return True
        if isinstance(node, ast.Name):
            return node.id in self.env.tensors
        if isinstance(node, ast.Attribute):
            attr = self._self_attr(node)
            if attr is not None and self.attrs is not None:
                return attr in self.attrs.tensors
            if node.attr in ("shape", "device", "dtype", "ndim", "is_cuda", "layout", "T"):
                return node.attr == "T" and self.is_tensor(node.value)
            return False
        if isinstance(node, ast.Subscript):
            if isinstance(node.value, ast.Attribute) and node.value.attr == "shape":
                return False
            return self.is_tensor(node.value)
        if isinstance(node, ast.Call):
            return self._call_is_tensor(node)
        if isinstance(node, ast.BinOp):
            return self.is_tensor(node.left) or self.is_tensor(node.right)
        if isinstance(node, ast.UnaryOp):
            return not isinstance(node.op, ast.Not) and self.is_tensor(node.operand)
        if isinstance(node, ast.Compare):
            if any(isinstance(op, (ast.Is, ast.IsNot, ast.In, ast.NotIn)) for op in node.ops):
                return False
            return self.is_tensor(node.left) or any(self.is_tensor(c) for c in node.comparators)
        if isinstance(node, ast.IfExp):
            return self.is_tensor(node.body) or self.is_tensor(node.orelse)
        if isinstance(node, ast.NamedExpr):
            return self.is_tensor(node.value)
        return False

    def _call_is_tensor(self, node: ast.Call) -> bool:
        t = vocab.torch_attr(node.func)
        if t is not None:
            head = t.split(".")[0]
            if head in vocab.TORCH_NON_TENSOR_MODULES or t in vocab.TORCH_NON_TENSOR:
                return False
            if t == "where" and len(node.args) == 1:
                return False  # a tuple of tensors
            return True
        callee = self.resolve(node) if self.resolve is not None else None
        if callee is not None:  # a function of the checked tree: its return annotation decides
            return annotation_kind(callee.node.returns) == "tensor"
        if isinstance(node.func, ast.Attribute):
            meth = node.func.attr
            if meth in vocab.NON_TENSOR_METHODS:
                return False
            return self.is_tensor(node.func.value)
        return False

    # masks -------------------------------------------------------------------
    def is_mask(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.env.masks or (node.id in self.env.tensors and "mask" in vocab.name_words(node.id))
        if isinstance(node, ast.Attribute):
            attr = self._self_attr(node)
            return attr is not None and self.attrs is not None and attr in self.attrs.masks
        if isinstance(node, ast.Compare):
            return self.is_tensor(node)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Invert):
            return self.is_mask(node.operand)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr, ast.BitXor)):
            return self.is_mask(node.left) or self.is_mask(node.right)
        if isinstance(node, ast.Call):
            t = vocab.torch_attr(node.func)
            if t in vocab.MASK_FUNCS:
                return True
            dtype = vocab.kwarg(node, "dtype")
            if t is not None and dtype is not None and ast.unparse(dtype) in ("torch.bool", "bool", "torch.uint8"):
                return True
            if isinstance(node.func, ast.Attribute) and node.func.attr in vocab.MASK_METHODS:
                return self.is_tensor(node.func.value) or node.func.attr == "bool"
            if isinstance(node.func, ast.Attribute) and node.func.attr == "to" and node.args:
                return ast.unparse(node.args[0]) in ("torch.bool", "torch.uint8")
        return False

    # host tensors --------------------------------------------------------------
    def is_device(self, node: ast.expr) -> bool:
        """A tensor in device memory, as far as the check can tell (a tensor not known to be on the host)."""
        return self.is_tensor(node) and not self.is_host(node)

    def is_host(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.env.hosts or (vocab.is_host_name(node.id) and node.id in self.env.tensors)
        if isinstance(node, ast.Attribute):
            attr = self._self_attr(node)
            if attr is None or self.attrs is None:
                return False
            return attr in self.attrs.hosts or (vocab.is_host_name(attr) and attr in self.attrs.tensors)
        if isinstance(node, ast.Call):
            t = vocab.torch_attr(node.func)
            if t in vocab.FACTORIES:
                device = vocab.kwarg(node, "device")
                if t in vocab.FROM_HOST_DATA and node.args and self.is_tensor(node.args[0]) and device is None:
                    return False  # torch.as_tensor(device_tensor) stays where it is
                return device is None or vocab.is_literal_cpu(device)
            if isinstance(node.func, ast.Attribute):
                meth = node.func.attr
                if meth in ("cpu", "pin_memory"):
                    return True
                if meth == "to":
                    target = node.args[0] if node.args else vocab.kwarg(node, "device")
                    if vocab.is_literal_cpu(target):
                        return True
                    if target is not None and not vocab.is_dtype(target):
                        return False  # moved to a device
                    return self.is_host(node.func.value)
                if meth in vocab.NON_TENSOR_METHODS:
                    return False
                return self.is_host(node.func.value)
        if isinstance(node, ast.Subscript):
            return self.is_host(node.value)
        if isinstance(node, ast.BinOp):
            return self.is_host(node.left) and (self.is_host(node.right) or not self.is_tensor(node.right))
        return False

    # python scalars ----------------------------------------------------------------
    def is_pyscalar(self, node: ast.expr) -> bool:
        if vocab.is_scalar_constant(node):
            return True
        if isinstance(node, ast.Name):
            if node.id in self.env.tensors or node.id in self.env.not_scalars:
                return False
            return node.id in self.env.scalars or self.project.is_scalar_name(self.mod, node.id)
        if isinstance(node, ast.Attribute):
            attr = self._self_attr(node)
            if attr is not None and self.attrs is not None:
                return attr in self.attrs.scalars
            if isinstance(node.value, ast.Name) and node.value.id in self.mod.classes:
                return node.attr in self.mod.classes[node.value.id].scalar_attrs
            return node.attr in vocab.SCALAR_ATTRS
        if isinstance(node, ast.UnaryOp):
            return not isinstance(node.op, ast.Not) and self.is_pyscalar(node.operand)
        if isinstance(node, ast.BinOp):
            return self.is_pyscalar(node.left) and self.is_pyscalar(node.right)
        if isinstance(node, ast.Subscript):
            return isinstance(node.value, ast.Attribute) and node.value.attr == "shape"
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id in ("int", "float", "len", "bool", "abs", "round"):
                return True
            if isinstance(node.func, ast.Name) and node.func.id in ("max", "min") and node.args:
                return all(self.is_pyscalar(a) for a in node.args)
            if isinstance(node.func, ast.Attribute) and node.func.attr in vocab.SCALAR_METHODS:
                return True
        if isinstance(node, ast.IfExp):
            return self.is_pyscalar(node.body) and self.is_pyscalar(node.orelse)
        return False
