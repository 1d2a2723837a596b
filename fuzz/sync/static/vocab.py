"""The words and torch API facts the checker relies on, in one place.

Why a module of its own: the kind evaluator, the rule families and the region
classifier all need the same facts (which torch calls return tensors, which methods
return host values, what names a page table); keeping them together lets a fact be
corrected once.
"""

from __future__ import annotations

import ast
import fnmatch
import re

# ------------------------------------------------------------------ names


def name_words(name: str) -> list[str]:
    """``_free_lazy`` -> [free, lazy]; ``freePages`` -> [free, pages]; ``V2PTable`` -> [v2p, table]."""
    words: list[str] = []
    for part in name.split("_"):
        words.extend(w.lower() for w in re.findall(r"[A-Z0-9]+(?![a-z])|[A-Z]?[a-z0-9]+", part))
    return words


def snake(name: str) -> str:
    """The name in snake case, leading underscores kept, so one pattern fits both spellings."""
    lead = len(name) - len(name.lstrip("_"))
    return "_" * lead + "_".join(name_words(name))


def matches_root(qualname: str, pattern: str) -> bool:
    """Whether a function is an entry point named by ``pattern``.

    A pattern with a dot matches the qualified name (``Pool.free``); one without matches
    the bare name, spelled as written or in snake case. A pattern that does not start
    with ``_`` never matches a private name: ``free_*`` names ``free_group_end``, not
    ``_free_eager``.
    """
    name = qualname.rsplit(".", 1)[-1]
    if "." in pattern:
        return fnmatch.fnmatchcase(qualname, pattern)
    if name.startswith("_") and not pattern.startswith("_"):
        return False
    return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(snake(name), pattern)


# The public free entry points of a paged pool and the read-table build (SPEC.md §3,
# §5). ``free_*`` covers the kernel-set entry ``free_unbind_inplace`` and free groups.
DEFAULT_ROOTS = (
    "free", "free_*", "_free_lazy", "release", "release_*", "evict", "evict_*", "unbind", "unbind_*",
    "dealloc", "dealloc_*", "deallocate", "tombstone", "tombstone_*", "build_*read_table*",
)

# Words in a function name that put the whole function in an allowed region. Set-up names
# (``reset``, ``clear``, ``init``) are not among them: a ``reset_slots`` that the lazy
# free calls runs on every step, and what no free path calls is not checked anyway.
NAME_EXEMPTIONS = {
    "eager": "eager",
    "flush": "flush",
    "flushes": "flush",
    "compact": "flush",
    "compaction": "flush",
    "debug": "checked",
}

CHECKED_WORDS = {"checked", "debug", "validate", "validation"}
TABLE_WORDS = {"v2p", "p2v"}
TABLE_SUBSTRINGS = ("virtual_to_physical", "physical_to_virtual")


def is_table_name(name: str) -> bool:
    low = name.lower()
    if any(s in low for s in TABLE_SUBSTRINGS):
        return True
    return any(w in TABLE_WORDS for w in name_words(name))


def is_host_name(name: str) -> bool:
    """``seq_lens_cpu``, ``host_indices``: a tensor so named lives in host memory (SGLang's convention)."""
    return bool({"cpu", "host"} & set(name_words(name)))


def name_exemption(name: str) -> str | None:
    """The allowed-region kind a function's name puts it in (``_free_eager`` -> eager)."""
    for w in name_words(name):
        if w in NAME_EXEMPTIONS:
            return NAME_EXEMPTIONS[w]
    return None


# ------------------------------------------------------------------ torch API facts

# torch.* calls that do not return a tensor
TORCH_NON_TENSOR = {
    "is_tensor", "numel", "get_device_module", "device", "Size", "finfo", "iinfo", "dtype", "Generator",
    "get_default_device", "get_default_dtype", "is_floating_point", "is_nonzero", "equal", "allclose",
    "result_type", "promote_types", "can_cast", "compile", "no_grad", "inference_mode", "set_grad_enabled",
    "is_grad_enabled", "manual_seed", "use_deterministic_algorithms", "empty_cache",
}
TORCH_NON_TENSOR_MODULES = {"cuda", "backends", "cpu", "accelerator", "distributed", "mps", "xpu", "testing",
                            "library", "utils", "ops", "_dynamo", "compiler", "overrides", "jit", "autograd"}
# tensor methods that return something other than a tensor
NON_TENSOR_METHODS = {
    "item", "tolist", "numel", "nelement", "dim", "ndimension", "size", "stride", "data_ptr", "element_size",
    "is_contiguous", "numpy", "storage_offset", "get_device", "is_pinned", "untyped_storage", "is_floating_point",
    "equal", "allclose", "is_set_to", "__len__", "type", "is_nonzero", "synchronize", "record", "query",
    "wait", "record_stream", "register_hook", "backward",
}
SCALAR_METHODS = {"item", "numel", "nelement", "dim", "ndimension", "size", "stride", "element_size",
                  "storage_offset", "get_device", "data_ptr"}
SCALAR_ATTRS = {"ndim"}
MASK_METHODS = {"bool", "eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf", "isfinite", "logical_not",
                "logical_and", "logical_or", "logical_xor", "isin", "eq_", "ne_", "signbit", "isneginf", "isposinf"}
MASK_FUNCS = {"isin", "logical_not", "logical_and", "logical_or", "logical_xor", "eq", "ne", "lt", "le", "gt",
              "ge", "isnan", "isinf", "isfinite", "greater", "less", "greater_equal", "less_equal", "not_equal",
              "signbit"}
FACTORIES = {"tensor", "as_tensor", "asarray", "zeros", "ones", "empty", "full", "arange", "range", "linspace",
             "randperm", "randint", "eye", "LongTensor", "IntTensor", "BoolTensor", "FloatTensor", "Tensor",
             "from_numpy", "empty_strided"}
FROM_HOST_DATA = {"tensor", "as_tensor", "asarray", "LongTensor", "IntTensor", "BoolTensor", "FloatTensor",
                  "from_numpy"}
SIZE_FACTORIES = {"zeros", "ones", "empty", "full", "arange", "range", "linspace", "randperm", "randint", "eye"}
TOMBSTONE_METHODS = {"index_fill_", "fill_", "masked_fill_", "scatter_", "index_put_", "index_fill", "masked_fill"}
VIEW_METHODS = {"view", "reshape", "flatten", "view_as", "narrow", "__getitem__", "as_strided", "squeeze", "unsqueeze"}
DTYPES = {"int8", "int16", "int32", "int64", "long", "int", "bool", "uint8", "float", "float16", "float32",
          "float64", "bfloat16", "half", "double"}

# ------------------------------------------------------------------ small AST helpers


def torch_attr(node: ast.expr) -> str | None:
    """'nonzero' for torch.nonzero, 'cuda.synchronize' for torch.cuda.synchronize; None otherwise."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id == "torch" and parts:
        return ".".join(reversed(parts))
    return None


def kwarg(call: ast.Call, name: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


def is_literal_cpu(node: ast.expr | None) -> bool:
    if node is None:
        return False
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.split(":")[0] == "cpu"
    if isinstance(node, ast.Call) and torch_attr(node.func) == "device" and node.args:
        return is_literal_cpu(node.args[0])
    return False


def is_true(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def is_dtype(node: ast.expr) -> bool:
    text = ast.unparse(node)
    return text.startswith("torch.") and text.split(".")[-1] in DTYPES


def is_scalar_constant(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float, bool)) and node.value is not None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd, ast.Invert)):
        return is_scalar_constant(node.operand)
    if isinstance(node, ast.BinOp):
        return is_scalar_constant(node.left) and is_scalar_constant(node.right)
    return False


def is_negative_constant(node: ast.expr, negative_names=frozenset()) -> bool:
    """``-1`` parses as ``UnaryOp(USub, Constant(1))``: a tombstone is a unary minus, not a literal."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return is_scalar_constant(node.operand)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value < 0
    if isinstance(node, ast.Name) and node.id in negative_names:
        return True
    return isinstance(node, ast.Attribute) and node.attr in negative_names


def pair_targets(target: ast.expr, value: ast.expr):
    """Pairs (target, value) of an assignment, tuple unpacking included."""
    if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) and len(
        target.elts
    ) == len(value.elts):
        for t, v in zip(target.elts, value.elts, strict=True):
            yield from pair_targets(t, v)
    else:
        yield target, value


def segment(node: ast.AST, limit: int = 60) -> str:
    try:
        text = ast.unparse(node)
    except Exception:  # pragma: no cover - unparse handles every expression node
        text = type(node).__name__
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def decorator_is_kernel(dec: ast.expr) -> bool:
    target = dec.func if isinstance(dec, ast.Call) else dec
    text = ast.unparse(target)
    return text.split(".")[-1] in {"jit", "autotune", "heuristics"} and ("triton" in text or text in {"jit"})


def has_decorator(node, *names: str) -> bool:
    return any(ast.unparse(d) in names for d in node.decorator_list)
