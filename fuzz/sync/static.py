"""Static no-host-sync check over allocator sources (SPEC.md §5, oracle 5, first of three).

``kvfuzz check-sync [PATH…]`` parses Python files (no import, no execution), finds the
free paths itself, and reports every form of SPEC.md §5 that makes the host wait for
the GPU, as ``path:line:col: CODE message``. Exit 1 on findings, 2 on a path that
cannot be read or parsed, 0 when clean.

How free paths are found (never a hand-kept list of our own method names):

1. Roots by name: a function or method whose name has a word meaning "give pages back"
   (free, release, tombstone, unbind, evict, dealloc, reclaim, recycle, retire), or
   the read-table build (the words "read" and "table"). Names are split into words on
   ``_`` and camelCase, so ``_free_lazy`` and ``freePages`` match and ``freeze`` does not.
2. Roots by behaviour: a function that writes a tombstone into a page table
   (``table[...] = -1``, ``table.index_fill_(0, idx, -1)``, ``table.fill_(-1)``, a
   ``masked_fill_``/``scatter_``/``index_put_`` with a negative constant), or that calls
   a function whose name is a free word (``self.kernels.free_unbind_inplace(...)``).
3. Reachability: every function or method of the same module that a free path calls
   (``self.m()``, ``cls.m()``, ``Class.m()``, ``super().m()``, ``f()``, nested defs),
   transitively, with page tables and tensors passed as arguments tracked into the
   callee's parameters (``self._tomb(self.v2p, idx)`` makes the callee's parameter a
   table).

Page tables are recognised by name (``v2p``, ``p2v``, ``virtual_to_physical``,
``physical_to_virtual``, as a word of the name, e.g. ``self._v2p``, ``v2p_buf``), and
through aliases: a local, an attribute (``self.table = self.v2p`` anywhere in the
class), a tuple unpacking, a slice view (``v2p[1:]``) or a parameter that receives one.

Exemptions, each from the spec rather than from our code: functions whose name says
eager, flush, compact, clear, reset, init or debug (SPEC.md §3: eager free and flush
may synchronise; set-up and debugging are not the free path) are neither roots nor
followed; the test and body of an ``if`` whose test names ``checked``, ``debug`` or
``validate`` (``if self.checked:``: checked mode reads the tables to raise
ContractViolation, by design) are skipped; a private helper (``_name``) whose every
call site is in an exempt function or a checked-mode branch inherits the exemption
(public functions are entry points and stay roots); Triton ``@jit`` kernels are device
code and are skipped. One line is allowed by a pragma that gives its reason:
``# sync-ok: <reason>``; a pragma without a reason is itself a finding.

What is statically knowable, and the heuristics used where it is not:

- A value is a *tensor* when it is a page table, a parameter annotated ``Tensor``, the
  result of a ``torch.*`` call, of a tensor method, of indexing or arithmetic on a
  tensor, or a name or ``self.attr`` assigned from one (flow-insensitive: one tensor
  assignment makes the name a tensor). Unknown names are not tensors: ``int(n)`` with
  an unannotated, unassigned ``n`` is not reported.
- A value is a *Python scalar* when it is a numeric constant, ``-1`` (which parses as
  ``UnaryOp(USub, Constant(1))``), a module/class constant such as ``TOMBSTONE = -1``,
  ``int()``/``len()``/``.item()``/``.numel()``/``.shape[i]`` results, arithmetic over
  these, or a local assigned only from them.
- A value is a *boolean mask* when it is a comparison of tensors, ``~mask``,
  ``mask & mask``, ``.bool()``, ``.eq()``…, ``torch.isin``/``torch.logical_*`` or a name
  assigned from one.
- A *host tensor* is a factory called without ``device=`` (``torch.tensor([...])``,
  ``torch.arange(n)``), or ``.cpu()``/``.pin_memory()`` of a tensor.

Forms reported (SPEC.md §5 and the ones it implies):

====== ==========================================================================
SYNC01 ``.item()``                          SYNC02 ``.tolist()``
SYNC03 ``.cpu()``, ``.to("cpu")``            SYNC04 ``.numpy()``
SYNC05 ``int()/float()/bool()/complex()`` of a tensor (also ``range(t)``)
SYNC06 truth test of a tensor: ``if t:``, ``while t:``, ``assert t``, ``not t``,
       ``a and t``, ``x if t else y``, a comprehension filter
SYNC07 ``torch.nonzero``/``argwhere``/``.nonzero()``/one-argument ``torch.where``
SYNC08 ``torch.unique``/``unique_consecutive``/``.unique()``
SYNC09 ``masked_select``                     SYNC10 boolean-mask indexing
SYNC11 ``torch.tensor(data, device=…)`` and ``.to(device)``/``.cuda()`` of a host tensor
SYNC12 a Python scalar (or a host tensor) stored into a page table through an
       integer or tensor index: ``table[idx] = -1``, ``table[3] = 0``
SYNC13 ``*.synchronize()``                   SYNC14 a host tensor used as an index
SYNC15 ``copy_`` between host and device without ``non_blocking=True``
SYNC16 a tensor used as a Python int: a size argument of a factory, a slice bound
SYNC17 ``repeat_interleave`` with tensor repeats and no ``output_size``
SYNC18 ``torch.equal``/``allclose`` (a Python bool read from the device)
SYNC19 formatting a tensor: f-strings, ``str()``, ``repr()``, ``print()``
SYNC20 a 0-dim integer tensor (``idx[0]``) used as an index: ATen calls ``.item()``
SYNC00 a ``# sync-ok:`` pragma without a reason
====== ==========================================================================

Not reported, on purpose: ``index_fill_``, ``fill_``, ``masked_fill_``, ``scatter_``
with a scalar (the scalar is a kernel argument); slice assignment ``table[a:b] = -1``
(a ``fill_`` on a view); ``table[mask] = -1`` (ATen lowers it to ``masked_fill_``);
device-valued scatters ``table[idx] = vals``; kernel launches ``kernel[grid](...)``;
``numel``/``shape``/``len``/``size``.

Limits: no type inference across modules (a tensor returned by another module's
function is unknown; a table reached only through a container is unknown); a
Python-scalar store whose right-hand side is an unknown name is not reported;
``table[i] = -1`` on a table that is not 1-D is reported although a row fill would not
synchronise; calls through variables, ``getattr`` or decorators are not followed;
names decide roots and exemptions, so a free path called ``recompute_holes`` that
neither tombstones nor is called from a free path is not found. The calibration
corpus (``fuzz.sync.calibrate``) measures the cost of these heuristics against a GPU.
"""

from __future__ import annotations

import ast
import importlib.util
import io
import os
import re
import sys
import tokenize
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = ["Finding", "FilePlan", "check_file", "check_source", "default_paths", "main"]

# --------------------------------------------------------------------------- vocabulary

_FREE_WORD = re.compile(
    r"^(free[ds]?|freeing|releas(e|es|ed|ing)|tombstones?|tombstoned|tombstoning|unbind(s|ing)?|unbound"
    r"|evict(s|ed|ion|ing)?|dealloc(ate|ates|ated|ation)?|reclaim(s|ed|ing)?|recycle[ds]?|retire[ds]?)$"
)
_EXEMPT_WORDS = {
    "eager": "SPEC.md §3: eager free may synchronise",
    "flush": "SPEC.md §3: flush may synchronise",
    "flushes": "SPEC.md §3: flush may synchronise",
    "compact": "SPEC.md §3: compaction runs in flush or eager free, which may synchronise",
    "compaction": "SPEC.md §3: compaction runs in flush or eager free, which may synchronise",
    "clear": "clear() returns the pool to its initial state; not the free path",
    "reset": "reset is set-up, not the free path",
    "init": "construction is set-up, not the free path",
    "debug": "debug code may read device values",
}
_CHECKED_GUARD_WORDS = {"checked", "debug", "validate", "validation"}
_TABLE_WORDS = {"v2p", "p2v"}
_TABLE_SUBSTRINGS = ("virtual_to_physical", "physical_to_virtual")

_TENSOR_ANNOTATIONS = re.compile(r"\b(Tensor|LongTensor|IntTensor|BoolTensor|FloatTensor)\b")

# torch.* calls that do not return a tensor
_TORCH_NON_TENSOR = {
    "is_tensor", "numel", "get_device_module", "device", "Size", "finfo", "iinfo", "dtype", "Generator",
    "get_default_device", "get_default_dtype", "is_floating_point", "is_nonzero", "equal", "allclose",
    "result_type", "promote_types", "can_cast", "compile", "no_grad", "inference_mode", "set_grad_enabled",
    "is_grad_enabled", "manual_seed", "use_deterministic_algorithms", "empty_cache",
}
_TORCH_NON_TENSOR_MODULES = {"cuda", "backends", "cpu", "accelerator", "distributed", "mps", "xpu", "testing",
                             "library", "utils", "ops", "_dynamo", "compiler", "overrides", "jit", "autograd"}
# tensor methods that return something other than a tensor
_NON_TENSOR_METHODS = {
    "item", "tolist", "numel", "nelement", "dim", "ndimension", "size", "stride", "data_ptr", "element_size",
    "is_contiguous", "numpy", "storage_offset", "get_device", "is_pinned", "untyped_storage", "is_floating_point",
    "equal", "allclose", "is_set_to", "__len__", "type", "is_nonzero", "synchronize", "record", "query",
    "wait", "record_stream", "register_hook", "backward",
}
_SCALAR_METHODS = {"item", "numel", "nelement", "dim", "ndimension", "size", "stride", "element_size",
                   "storage_offset", "get_device", "data_ptr"}
_SCALAR_ATTRS = {"ndim"}
_MASK_METHODS = {"bool", "eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf", "isfinite", "logical_not",
                 "logical_and", "logical_or", "logical_xor", "isin", "eq_", "ne_", "signbit", "isneginf", "isposinf"}
_MASK_FUNCS = {"isin", "logical_not", "logical_and", "logical_or", "logical_xor", "eq", "ne", "lt", "le", "gt",
               "ge", "isnan", "isinf", "isfinite", "greater", "less", "greater_equal", "less_equal", "not_equal",
               "signbit"}
_FACTORIES = {"tensor", "as_tensor", "asarray", "zeros", "ones", "empty", "full", "arange", "range", "linspace",
              "randperm", "randint", "eye", "LongTensor", "IntTensor", "BoolTensor", "FloatTensor", "Tensor",
              "from_numpy", "empty_strided"}
_FROM_HOST_DATA = {"tensor", "as_tensor", "asarray", "LongTensor", "IntTensor", "BoolTensor", "FloatTensor",
                   "from_numpy"}
_SIZE_FACTORIES = {"zeros", "ones", "empty", "full", "arange", "range", "linspace", "randperm", "randint", "eye"}
_TOMBSTONE_METHODS = {"index_fill_", "fill_", "masked_fill_", "scatter_", "index_put_", "index_fill", "masked_fill"}


def name_words(name: str) -> list[str]:
    words: list[str] = []
    for part in name.split("_"):
        words.extend(w.lower() for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+", part))
    return words


def is_free_name(name: str) -> bool:
    return any(_FREE_WORD.match(w) for w in name_words(name))


def is_read_table_name(name: str) -> bool:
    words = set(name_words(name))
    return "read" in words and "table" in words


def exempt_reason(name: str) -> str | None:
    for w in name_words(name):
        if w in _EXEMPT_WORDS:
            return _EXEMPT_WORDS[w]
    return None


def is_table_name(name: str) -> bool:
    low = name.lower()
    if any(s in low for s in _TABLE_SUBSTRINGS):
        return True
    return any(w in _TABLE_WORDS for w in name_words(name))


# --------------------------------------------------------------------------- results


@dataclass(frozen=True, order=True)
class Finding:
    path: str
    line: int
    col: int  # 1-based, as editors and linters print it
    code: str
    message: str

    def format(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.code} {self.message}"


@dataclass
class FilePlan:
    """What the checker decided about one file: the free paths, why, and what it skipped."""

    path: str
    roots: dict[str, str] = field(default_factory=dict)  # qualname -> why it is a root
    reached: dict[str, str] = field(default_factory=dict)  # qualname -> the chain that reaches it
    exempt: dict[str, str] = field(default_factory=dict)  # qualname -> reason
    findings: list[Finding] = field(default_factory=list)


class ParseError(Exception):
    pass


# --------------------------------------------------------------------------- module index


@dataclass
class _Func:
    qualname: str
    node: ast.FunctionDef | ast.AsyncFunctionDef
    cls: str | None
    is_kernel: bool


@dataclass
class _Class:
    name: str
    node: ast.ClassDef
    bases: list[str]
    methods: dict[str, str] = field(default_factory=dict)  # method name -> qualname
    table_attrs: set[str] = field(default_factory=set)
    tensor_attrs: set[str] = field(default_factory=set)
    host_attrs: set[str] = field(default_factory=set)
    mask_attrs: set[str] = field(default_factory=set)
    scalar_attrs: set[str] = field(default_factory=set)


def _decorator_is_kernel(dec: ast.expr) -> bool:
    target = dec.func if isinstance(dec, ast.Call) else dec
    text = ast.unparse(target)
    return text.split(".")[-1] in {"jit", "autotune", "heuristics"} and ("triton" in text or text in {"jit"})


def _is_scalar_constant(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float, bool)) and node.value is not None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd, ast.Invert)):
        return _is_scalar_constant(node.operand)
    if isinstance(node, ast.BinOp):
        return _is_scalar_constant(node.left) and _is_scalar_constant(node.right)
    return False


def _is_negative_constant(node: ast.expr, negative_names: set[str] = frozenset()) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _is_scalar_constant(node.operand)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value < 0
    if isinstance(node, ast.Name) and node.id in negative_names:
        return True
    if isinstance(node, ast.Attribute) and node.attr in negative_names:
        return True
    return False


class _Module:
    def __init__(self, tree: ast.Module, path: str, source: str):
        self.tree = tree
        self.path = path
        self.lines = source.splitlines()
        self.functions: dict[str, _Func] = {}
        self.classes: dict[str, _Class] = {}
        self.module_scalars: set[str] = set()
        self.negative_names: set[str] = set()
        self.pragmas = _pragmas(source)
        for stmt in tree.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self._add_func(stmt, None, stmt.name)
            elif isinstance(stmt, ast.ClassDef):
                self._add_class(stmt)
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                self._module_constant(stmt, self.module_scalars)
        for cls in self.classes.values():
            self._class_attrs(cls)

    def _module_constant(self, stmt: ast.Assign | ast.AnnAssign, into: set[str]) -> None:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        value = stmt.value
        if value is None:
            return
        for t in targets:
            if isinstance(t, ast.Name) and _is_scalar_constant(value):
                into.add(t.id)
                if _is_negative_constant(value):
                    self.negative_names.add(t.id)

    def _add_func(self, node, cls: str | None, qualname: str) -> None:
        is_kernel = any(_decorator_is_kernel(d) for d in node.decorator_list)
        self.functions[qualname] = _Func(qualname, node, cls, is_kernel)

    def _add_class(self, node: ast.ClassDef) -> None:
        cls = _Class(node.name, node, [ast.unparse(b) for b in node.bases])
        self.classes[node.name] = cls
        for stmt in node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qual = f"{node.name}.{stmt.name}"
                cls.methods[stmt.name] = qual
                self._add_func(stmt, node.name, qual)
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                self._module_constant(stmt, cls.scalar_attrs)

    def _class_attrs(self, cls: _Class) -> None:
        """self.X = <expr> anywhere in the class: tables, tensors, host tensors, masks, scalars."""
        assigns: list[tuple[str, ast.expr, str]] = []
        for qual in cls.methods.values():
            fn = self.functions[qual].node
            selfname = fn.args.args[0].arg if fn.args.args else "self"
            for node in ast.walk(fn):
                if isinstance(node, ast.Assign):
                    for t in node.targets:
                        for tgt, val in _pair_targets(t, node.value):
                            if isinstance(tgt, ast.Attribute) and isinstance(tgt.value, ast.Name) and tgt.value.id == selfname:
                                assigns.append((tgt.attr, val, qual))
                elif isinstance(node, ast.AnnAssign) and node.value is not None:
                    t = node.target
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == selfname:
                        assigns.append((t.attr, node.value, qual))
                        if _TENSOR_ANNOTATIONS.search(ast.unparse(node.annotation)):
                            cls.tensor_attrs.add(t.attr)
        scalar_only: dict[str, bool] = {}
        for _ in range(4):  # a small fixpoint: aliases of aliases
            for attr, val, qual in assigns:
                ev = _Eval(self, cls, _Env(), self_name="self")
                ev.self_name = self.functions[qual].node.args.args[0].arg if self.functions[qual].node.args.args else "self"
                if is_table_name(attr) or ev.is_table(val):
                    cls.table_attrs.add(attr)
                if ev.is_tensor(val):
                    cls.tensor_attrs.add(attr)
                if ev.is_host(val):
                    cls.host_attrs.add(attr)
                if ev.is_mask(val):
                    cls.mask_attrs.add(attr)
                scalar_only[attr] = scalar_only.get(attr, True) and ev.is_pyscalar(val)
        for attr, ok in scalar_only.items():
            if ok and attr not in cls.tensor_attrs:
                cls.scalar_attrs.add(attr)

    def resolve_method(self, cls_name: str, meth: str, seen: set[str] | None = None) -> str | None:
        seen = seen or set()
        if cls_name in seen or cls_name not in self.classes:
            return None
        seen.add(cls_name)
        cls = self.classes[cls_name]
        if meth in cls.methods:
            return cls.methods[meth]
        for base in cls.bases:
            found = self.resolve_method(base.split(".")[-1], meth, seen)
            if found:
                return found
        return None


def _pair_targets(target: ast.expr, value: ast.expr) -> Iterable[tuple[ast.expr, ast.expr]]:
    if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) and len(
        target.elts
    ) == len(value.elts):
        for t, v in zip(target.elts, value.elts, strict=True):
            yield from _pair_targets(t, v)
    else:
        yield target, value


_PRAGMA = re.compile(r"#\s*sync-ok\s*(?::\s*(?P<reason>.*))?$")


def _pragmas(source: str) -> dict[int, str]:
    """line -> reason ('' when the pragma gives none)."""
    out: dict[int, str] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                m = _PRAGMA.search(tok.string)
                if m:
                    out[tok.start[0]] = (m.group("reason") or "").strip()
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return out


# --------------------------------------------------------------------------- expression kinds


@dataclass
class _Env:
    tables: set[str] = field(default_factory=set)
    tensors: set[str] = field(default_factory=set)
    masks: set[str] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)
    scalars: set[str] = field(default_factory=set)
    not_scalars: set[str] = field(default_factory=set)

    def key(self) -> tuple:
        return (frozenset(self.tables), frozenset(self.tensors), frozenset(self.masks), frozenset(self.hosts))


def _torch_attr(node: ast.expr) -> str | None:
    """'nonzero' for torch.nonzero, 'cuda.synchronize' for torch.cuda.synchronize; None otherwise."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in ("torch",) and parts:
        return ".".join(reversed(parts))
    return None


def _kwarg(call: ast.Call, name: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


def _is_literal_cpu(node: ast.expr | None) -> bool:
    if node is None:
        return False
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.split(":")[0] == "cpu"
    if isinstance(node, ast.Call) and _torch_attr(node.func) == "device" and node.args:
        return _is_literal_cpu(node.args[0])
    return False


def _is_true(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


class _Eval:
    """Classifies expressions within one function under one context."""

    def __init__(self, mod: _Module, cls: _Class | None, env: _Env, self_name: str | None):
        self.mod = mod
        self.cls = cls
        self.env = env
        self.self_name = self_name

    def _self_attr(self, node: ast.expr) -> str | None:
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and self.self_name is not None and node.value.id == self.self_name):
            return node.attr
        return None

    # tables ------------------------------------------------------------------
    def is_table(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.env.tables or is_table_name(node.id)
        if isinstance(node, ast.Attribute):
            attr = self._self_attr(node)
            if attr is not None and self.cls is not None and attr in self.cls.table_attrs:
                return True
            return is_table_name(node.attr)
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
            return self.is_table(node.value)  # a slice is a view of the table
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
            "view", "reshape", "flatten", "view_as", "narrow", "__getitem__", "as_strided", "squeeze", "unsqueeze"
        ):
            return self.is_table(node.func.value)
        if isinstance(node, ast.NamedExpr):
            return self.is_table(node.value)
        return False

    # tensors -----------------------------------------------------------------
    def is_tensor(self, node: ast.expr) -> bool:
        if self.is_table(node):
            return True
        if isinstance(node, ast.Name):
            return node.id in self.env.tensors
        if isinstance(node, ast.Attribute):
            attr = self._self_attr(node)
            if attr is not None and self.cls is not None:
                return attr in self.cls.tensor_attrs
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
        t = _torch_attr(node.func)
        if t is not None:
            head = t.split(".")[0]
            if head in _TORCH_NON_TENSOR_MODULES or t in _TORCH_NON_TENSOR:
                return False
            if t == "where" and len(node.args) == 1:
                return False  # a tuple of tensors
            return True
        if isinstance(node.func, ast.Attribute):
            meth = node.func.attr
            if meth in _NON_TENSOR_METHODS:
                return False
            return self.is_tensor(node.func.value)
        return False

    # masks -------------------------------------------------------------------
    def is_mask(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.env.masks or (node.id in self.env.tensors and "mask" in name_words(node.id))
        if isinstance(node, ast.Attribute):
            attr = self._self_attr(node)
            return attr is not None and self.cls is not None and attr in self.cls.mask_attrs
        if isinstance(node, ast.Compare):
            return self.is_tensor(node)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Invert):
            return self.is_mask(node.operand)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr, ast.BitXor)):
            return self.is_mask(node.left) or self.is_mask(node.right)
        if isinstance(node, ast.Call):
            t = _torch_attr(node.func)
            if t in _MASK_FUNCS:
                return True
            dtype = _kwarg(node, "dtype")
            if t is not None and dtype is not None and ast.unparse(dtype) in ("torch.bool", "bool", "torch.uint8"):
                return True
            if isinstance(node.func, ast.Attribute) and node.func.attr in _MASK_METHODS:
                return self.is_tensor(node.func.value) or node.func.attr == "bool"
            if isinstance(node.func, ast.Attribute) and node.func.attr == "to" and node.args:
                return ast.unparse(node.args[0]) in ("torch.bool", "torch.uint8")
        return False

    # host tensors --------------------------------------------------------------
    def is_host(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.env.hosts
        if isinstance(node, ast.Attribute):
            attr = self._self_attr(node)
            return attr is not None and self.cls is not None and attr in self.cls.host_attrs
        if isinstance(node, ast.Call):
            t = _torch_attr(node.func)
            if t in _FACTORIES:
                device = _kwarg(node, "device")
                if t in _FROM_HOST_DATA and node.args and self.is_tensor(node.args[0]) and device is None:
                    return False  # torch.as_tensor(device_tensor) stays where it is
                return device is None or _is_literal_cpu(device)
            if isinstance(node.func, ast.Attribute):
                meth = node.func.attr
                if meth in ("cpu", "pin_memory"):
                    return True
                if meth == "to":
                    target = node.args[0] if node.args else _kwarg(node, "device")
                    if _is_literal_cpu(target):
                        return True
                    if target is not None and not _is_dtype(target):
                        return False  # moved to a device
                    return self.is_host(node.func.value)
                if meth in _NON_TENSOR_METHODS:
                    return False
                return self.is_host(node.func.value)
        if isinstance(node, ast.Subscript):
            return self.is_host(node.value)
        if isinstance(node, ast.BinOp):
            return self.is_host(node.left) and (self.is_host(node.right) or not self.is_tensor(node.right))
        return False

    # python scalars ----------------------------------------------------------------
    def is_pyscalar(self, node: ast.expr) -> bool:
        if _is_scalar_constant(node):
            return True
        if isinstance(node, ast.Name):
            if node.id in self.env.tensors or node.id in self.env.not_scalars:
                return False
            return node.id in self.env.scalars or node.id in self.mod.module_scalars
        if isinstance(node, ast.Attribute):
            attr = self._self_attr(node)
            if attr is not None and self.cls is not None:
                return attr in self.cls.scalar_attrs
            if isinstance(node.value, ast.Name) and node.value.id in self.mod.classes:
                return node.attr in self.mod.classes[node.value.id].scalar_attrs
            return node.attr in _SCALAR_ATTRS
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
            if isinstance(node.func, ast.Attribute) and node.func.attr in _SCALAR_METHODS:
                return True
        if isinstance(node, ast.IfExp):
            return self.is_pyscalar(node.body) and self.is_pyscalar(node.orelse)
        return False


# --------------------------------------------------------------------------- the checker


_MESSAGES = {
    "SYNC01": "`.item()` copies a device value into a Python number: the host waits for the GPU",
    "SYNC02": "`.tolist()` copies the tensor to host memory: the host waits for the GPU",
    "SYNC03": "`{form}` copies the tensor to host memory: the host waits for the GPU",
    "SYNC04": "`.numpy()` needs the data in host memory (a device→host copy): the host waits for the GPU",
    "SYNC05": "`{form}` of a tensor reads its value on the host (`.item()`): the host waits for the GPU",
    "SYNC06": "truth test of a tensor (`{form}`) calls `bool()`, which reads the value on the host: the host waits for the GPU",
    "SYNC07": "`{form}` has a data-dependent output size: the host reads the count back from the GPU",
    "SYNC08": "`{form}` has a data-dependent output size: the host reads the count back from the GPU",
    "SYNC09": "`{form}` has a data-dependent output size: the host reads the count back from the GPU",
    "SYNC10": "boolean-mask indexing `{form}` is lowered to nonzero(): the host reads the count back from the GPU",
    "SYNC11": "`{form}` builds the data in pageable host memory and copies it to the device with a blocking copy",
    "SYNC12": "page-table store `{form}` of a Python scalar: it becomes a CPU tensor copied from pageable memory before the scatter, so the host waits (use index_fill_ or a kernel)",
    "SYNC12h": "page-table store `{form}` of a host tensor: a blocking host→device copy before the scatter",
    "SYNC13": "`{form}` blocks the host until the device has finished its queued work",
    "SYNC14": "`{form}` indexes a device tensor with a host tensor: the index is copied to the device with a blocking copy",
    "SYNC15": "`{form}` copies between host and device memory without non_blocking=True: the host waits",
    "SYNC16": "`{form}` uses a tensor as a Python int (`__index__` calls `.item()`): the host waits for the GPU",
    "SYNC17": "`{form}` without output_size sums the repeats on the device and reads the total back",
    "SYNC18": "`{form}` returns a Python bool read from the device: the host waits for the GPU",
    "SYNC19": "`{form}` formats a tensor, which reads its values back to the host",
    "SYNC20": "`{form}` indexes with a 0-dim integer tensor: ATen reads it with `.item()`, so the host waits",
}


def _segment(node: ast.AST, limit: int = 60) -> str:
    try:
        text = ast.unparse(node)
    except Exception:  # pragma: no cover - unparse handles every expression node
        text = type(node).__name__
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class _FunctionChecker(ast.NodeVisitor):
    """Reports the sync forms inside one function (in one context) and collects its calls."""

    def __init__(self, mod: _Module, func: _Func, env: _Env, chain: str, sink: list[Finding]):
        self.mod = mod
        self.func = func
        self.cls = mod.classes.get(func.cls) if func.cls else None
        args = func.node.args
        self.self_name = (args.posonlyargs + args.args)[0].arg if func.cls and (args.posonlyargs + args.args) else None
        self.env = env
        self.chain = chain
        self.sink = sink
        self.calls: list[tuple[str, _Env, ast.Call]] = []  # (qualname, callee context, call)
        self.ev = _Eval(mod, self.cls, env, self.self_name)
        self._build_env()

    # environment ---------------------------------------------------------------
    def _build_env(self) -> None:
        fn = self.func.node
        env = self.env
        params = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
        for a in params:
            if is_table_name(a.arg):
                env.tables.add(a.arg)
            if a.annotation is not None and _TENSOR_ANNOTATIONS.search(ast.unparse(a.annotation)):
                env.tensors.add(a.arg)
        for a in params:
            if a.arg in env.tables:
                env.tensors.add(a.arg)
            if a.arg not in env.tensors and a.arg not in env.scalars:
                env.not_scalars.add(a.arg)  # a parameter of unknown type is not a known scalar
        assigns: list[tuple[str, ast.expr, bool]] = []  # (name, value, is_iteration)
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    for tgt, val in _pair_targets(t, node.value):
                        if isinstance(tgt, ast.Name):
                            assigns.append((tgt.id, val, False))
                        elif isinstance(tgt, (ast.Tuple, ast.List)):
                            for elt in tgt.elts:
                                if isinstance(elt, ast.Name):
                                    assigns.append((elt.id, val, True))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                if _TENSOR_ANNOTATIONS.search(ast.unparse(node.annotation)):
                    env.tensors.add(node.target.id)
                if node.value is not None:
                    assigns.append((node.target.id, node.value, False))
            elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
                assigns.append((node.target.id, ast.BinOp(ast.Name(node.target.id), node.op, node.value), False))
            elif isinstance(node, (ast.For, ast.comprehension)):
                target = node.target
                names = [target] if isinstance(target, ast.Name) else [
                    e for e in getattr(target, "elts", []) if isinstance(e, ast.Name)]
                for n in names:
                    assigns.append((n.id, node.iter, True))
            elif isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
                assigns.append((node.target.id, node.value, False))
        scalar_votes: dict[str, bool]
        for _ in range(5):
            before = env.key()
            for name, val, iterated in assigns:
                if not iterated and self.ev.is_table(val):
                    env.tables.add(name)
                if self.ev.is_tensor(val):
                    env.tensors.add(name)
                if not iterated and self.ev.is_mask(val):
                    env.masks.add(name)
                if self.ev.is_host(val):
                    env.hosts.add(name)
            if env.key() == before:
                break
        assigned = {name for name, _, _ in assigns}
        env.not_scalars |= assigned - env.scalars
        for _ in range(4):  # locals assigned only from Python scalars (tomb = -1; fill = tomb)
            scalar_votes = {}
            for name, val, iterated in assigns:
                ok = (not iterated) and self.ev.is_pyscalar(val)
                scalar_votes[name] = scalar_votes.get(name, True) and ok
            new = {n for n, ok in scalar_votes.items() if ok and n not in env.tensors}
            if new <= env.scalars:
                break
            env.scalars |= new
            env.not_scalars -= new

    # reporting -----------------------------------------------------------------
    def report(self, node: ast.AST, code: str, form: str = "") -> None:
        line = getattr(node, "lineno", 1)
        col = getattr(node, "col_offset", 0) + 1
        message = _MESSAGES[code].format(form=form)
        self.sink.append(Finding(self.mod.path, line, col, code[:6], f"{message} [free path: {self.chain}]"))

    # traversal -----------------------------------------------------------------
    def run(self) -> None:
        for stmt in self.func.node.body:
            self.visit(stmt)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        # a nested def: its body runs when called; nested functions are checked as part of the parent
        for stmt in node.body:
            self.visit(stmt)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.visit(node.body)

    def visit_If(self, node: ast.If) -> None:
        if not _is_checked_guard(node.test):  # a checked-mode branch (test and body) may read the tables by design
            self._truth(node.test, "if ...:")
            self.visit(node.test)
            for stmt in node.body:
                self.visit(stmt)
        for stmt in node.orelse:
            self.visit(stmt)

    def visit_While(self, node: ast.While) -> None:
        self._truth(node.test, "while ...:")
        self.generic_visit(node)

    def visit_Assert(self, node: ast.Assert) -> None:
        self._truth(node.test, "assert ...")
        self.generic_visit(node)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self._truth(node.test, "... if ... else ...")
        self.generic_visit(node)

    def visit_comprehension(self, node: ast.comprehension) -> None:
        for cond in node.ifs:
            self._truth(cond, "comprehension filter")
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        for value in node.values[:-1]:
            self._truth(value, "and/or")
        self.generic_visit(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        if isinstance(node.op, ast.Not):
            self._truth(node.operand, "not ...")
        self.generic_visit(node)

    def _truth(self, test: ast.expr, form: str) -> None:
        if isinstance(test, ast.BoolOp):
            # the other operands are reported by visit_BoolOp; the last is tested by the enclosing form
            self._truth(test.values[-1], form)
            return
        if self.ev.is_tensor(test):
            self.report(test, "SYNC06", f"{form.replace('...', _segment(test, 40), 1)}")

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        for value in node.values:
            if isinstance(value, ast.FormattedValue) and self.ev.is_tensor(value.value):
                self.report(value.value, "SYNC19", "f\"{" + _segment(value.value, 40) + "}\"")
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.ctx, ast.Load):
            self._index_checks(node)
        self.generic_visit(node)

    def _index_checks(self, node: ast.Subscript, store_value: ast.expr | None = None) -> None:
        ev = self.ev
        base_is_tensor = ev.is_tensor(node.value)
        if not base_is_tensor:
            return
        idx = node.slice
        parts = idx.elts if isinstance(idx, ast.Tuple) else [idx]
        for part in parts:
            if isinstance(part, ast.Slice):
                for bound in (part.lower, part.upper, part.step):
                    if bound is not None and ev.is_tensor(bound):
                        self.report(bound, "SYNC16", f"{_segment(node)} (tensor slice bound)")
                continue
            if ev.is_mask(part):
                if store_value is None or not ev.is_pyscalar(store_value):
                    self.report(node, "SYNC10", _segment(node))
                continue
            if ev.is_host(part):
                self.report(node, "SYNC14", _segment(node))
                continue
            if self._is_zero_dim_index(part):
                self.report(part, "SYNC20", _segment(node))

    def _is_zero_dim_index(self, part: ast.expr) -> bool:
        """idx[0], idx[i] with a Python int: a 0-dim tensor (for the 1-D index tensors of a free path)."""
        if not isinstance(part, ast.Subscript) or not self.ev.is_tensor(part.value):
            return False
        inner = part.slice
        return not isinstance(inner, (ast.Slice, ast.Tuple)) and self.ev.is_pyscalar(inner)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._store(target, node.value)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.target, ast.Subscript):
            self._index_checks(node.target)  # t[mask] += 1 reads through the mask too
        self.generic_visit(node)

    def _store(self, target: ast.expr, value: ast.expr) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for t, v in _pair_targets(target, value):
                if t is not target:
                    self._store(t, v)
            return
        if not isinstance(target, ast.Subscript):
            return
        ev = self.ev
        self._index_checks(target, store_value=value)
        idx = target.slice
        parts = idx.elts if isinstance(idx, ast.Tuple) else [idx]
        if any(isinstance(p, ast.Slice) for p in parts) or any(ev.is_mask(p) for p in parts):
            return  # a fill_ on a view, or the masked_fill_ fast path
        is_table = ev.is_table(target.value)
        advanced = any(ev.is_tensor(p) for p in parts)
        if ev.is_pyscalar(value) and (is_table or (advanced and ev.is_tensor(target.value))):
            self.report(target, "SYNC12", f"{_segment(target)} = {_segment(value, 20)}")
        elif ev.is_host(value) and (is_table or ev.is_tensor(target.value)):
            self.report(target, "SYNC12h", f"{_segment(target)} = {_segment(value, 30)}")

    def visit_Call(self, node: ast.Call) -> None:
        self._call_checks(node)
        self._collect_call(node)
        self.generic_visit(node)

    def _call_checks(self, node: ast.Call) -> None:
        ev = self.ev
        func = node.func
        t = _torch_attr(func)
        if isinstance(func, ast.Name):
            name = func.id
            if name in ("int", "float", "bool", "complex") and node.args and ev.is_tensor(node.args[0]):
                self.report(node, "SYNC05", f"{name}({_segment(node.args[0], 40)})")
            elif name == "range" and any(ev.is_tensor(a) for a in node.args):
                self.report(node, "SYNC16", _segment(node))
            elif name in ("str", "repr", "format", "print") and any(ev.is_tensor(a) for a in node.args):
                self.report(node, "SYNC19", _segment(node))
            elif name in ("sorted", "max", "min", "any", "all") and len(node.args) == 1 and ev.is_tensor(node.args[0]):
                # iterating gives 0-dim tensors; comparing or testing them calls bool()
                self.report(node, "SYNC05", f"{name}({_segment(node.args[0], 40)})")
            return
        if t is not None:
            self._torch_call_checks(node, t)
            if t.endswith("synchronize"):
                return
        if not isinstance(func, ast.Attribute):
            return
        meth = func.attr
        recv = func.value
        if meth == "synchronize":
            self.report(node, "SYNC13", _segment(node))
            return
        if t is not None:
            return  # torch.<fn>(...): handled above, not a method on a tensor
        if meth == "item" and not node.args:
            self.report(node, "SYNC01")
        elif meth == "tolist":
            self.report(node, "SYNC02")
        elif meth == "cpu":
            self.report(node, "SYNC03", _segment(node))
        elif meth == "numpy":
            self.report(node, "SYNC04")
        elif meth in ("nonzero", "argwhere"):
            self.report(node, "SYNC07", _segment(node))
        elif meth in ("unique", "unique_consecutive"):
            self.report(node, "SYNC08", _segment(node))
        elif meth == "masked_select":
            self.report(node, "SYNC09", _segment(node))
        elif meth in ("equal", "allclose") and ev.is_tensor(recv):
            self.report(node, "SYNC18", _segment(node))
        elif meth == "repeat_interleave" and ev.is_tensor(recv):
            repeats = node.args[0] if node.args else _kwarg(node, "repeats")
            if repeats is not None and ev.is_tensor(repeats) and _kwarg(node, "output_size") is None:
                self.report(node, "SYNC17", _segment(node))
        elif meth in ("to", "cuda"):
            target = node.args[0] if node.args else _kwarg(node, "device")
            if meth == "to" and _is_literal_cpu(target):
                self.report(node, "SYNC03", _segment(node))
            elif ev.is_host(recv) and (meth == "cuda" or (target is not None and not _is_dtype(target))):
                if not _is_true(_kwarg(node, "non_blocking")):
                    self.report(node, "SYNC11", _segment(node))
        elif meth == "copy_" and node.args:
            src = node.args[0]
            crosses = (ev.is_host(recv) and ev.is_tensor(src) and not ev.is_host(src)) or (
                ev.is_host(src) and ev.is_tensor(recv) and not ev.is_host(recv)
            )
            if crosses and not _is_true(_kwarg(node, "non_blocking")):
                self.report(node, "SYNC15", _segment(node))
        elif meth in ("index_put_", "index_put") and len(node.args) >= 2 and ev.is_tensor(recv):
            indices, value = node.args[0], node.args[1]
            elts = indices.elts if isinstance(indices, (ast.Tuple, ast.List)) else []
            if any(ev.is_mask(e) for e in elts):
                if not (ev.is_host(value) or ev.is_pyscalar(value)):
                    self.report(node, "SYNC10", _segment(node))
            elif ev.is_host(value):
                self.report(node, "SYNC12h", _segment(node))

    def _torch_call_checks(self, node: ast.Call, t: str) -> None:
        ev = self.ev
        short = t.split(".")[-1]
        if t in ("nonzero", "argwhere"):
            self.report(node, "SYNC07", f"torch.{t}(...)")
        elif t == "where" and len(node.args) == 1 and not node.keywords:
            self.report(node, "SYNC07", "torch.where(cond)")
        elif t in ("unique", "unique_consecutive"):
            self.report(node, "SYNC08", f"torch.{t}(...)")
        elif t == "masked_select":
            self.report(node, "SYNC09", "torch.masked_select(...)")
        elif t in ("equal", "allclose"):
            self.report(node, "SYNC18", f"torch.{t}(...)")
        elif t == "repeat_interleave":
            repeats = node.args[1] if len(node.args) > 1 else _kwarg(node, "repeats")
            if (repeats is None or ev.is_tensor(repeats)) and _kwarg(node, "output_size") is None:
                self.report(node, "SYNC17", _segment(node))
        elif short == "synchronize":
            self.report(node, "SYNC13", _segment(node))
        elif t in _FROM_HOST_DATA:
            device = _kwarg(node, "device")
            data = node.args[0] if node.args else _kwarg(node, "data")
            if device is not None and not _is_literal_cpu(device) and not (data is not None and ev.is_tensor(data)):
                self.report(node, "SYNC11", _segment(node))
        if t in _SIZE_FACTORIES:
            for a in node.args:
                for elt in (a.elts if isinstance(a, (ast.Tuple, ast.List)) else [a]):
                    if ev.is_tensor(elt):
                        self.report(elt, "SYNC16", _segment(node))
                        return

    # calls into the same module ------------------------------------------------------
    def _collect_call(self, node: ast.Call) -> None:
        func = node.func
        target: str | None = None
        bound = False
        if isinstance(func, ast.Name):
            if func.id in self.mod.functions:
                target = func.id
            elif func.id in self.mod.classes:
                target = self.mod.resolve_method(func.id, "__init__")
                bound = True
        elif isinstance(func, ast.Attribute):
            recv = func.value
            if isinstance(recv, ast.Name) and self.func.cls and recv.id in (self.self_name, "cls"):
                target = self.mod.resolve_method(self.func.cls, func.attr)
                bound = True
            elif isinstance(recv, ast.Name) and recv.id in self.mod.classes:
                target = self.mod.resolve_method(recv.id, func.attr)
                callee = self.mod.functions.get(target) if target else None
                bound = bool(callee and _is_static_or_class(callee.node))
            elif (isinstance(recv, ast.Call) and isinstance(recv.func, ast.Name) and recv.func.id == "super"
                  and self.func.cls):
                for base in self.mod.classes[self.func.cls].bases:
                    target = self.mod.resolve_method(base.split(".")[-1], func.attr)
                    if target:
                        break
                bound = True
        if target is None or target not in self.mod.functions:
            return
        callee = self.mod.functions[target]
        cenv = _Env()
        fargs = callee.node.args
        params = [a.arg for a in fargs.posonlyargs + fargs.args]
        if bound and callee.cls and params and not _is_staticmethod(callee.node):
            params = params[1:]
        for p, a in zip(params, node.args, strict=False):
            self._bind_param(cenv, p, a)
        for kw in node.keywords:
            if kw.arg is not None:
                self._bind_param(cenv, kw.arg, kw.value)
        self.calls.append((target, cenv, node))

    def _bind_param(self, cenv: _Env, param: str, arg: ast.expr) -> None:
        if self.ev.is_table(arg):
            cenv.tables.add(param)
        if self.ev.is_tensor(arg):
            cenv.tensors.add(param)
        if self.ev.is_mask(arg):
            cenv.masks.add(param)
        if self.ev.is_host(arg):
            cenv.hosts.add(param)
        if self.ev.is_pyscalar(arg):
            cenv.scalars.add(param)


def _is_dtype(node: ast.expr) -> bool:
    text = ast.unparse(node)
    return text.startswith("torch.") and text.split(".")[-1] in {
        "int8", "int16", "int32", "int64", "long", "int", "bool", "uint8", "float", "float16", "float32",
        "float64", "bfloat16", "half", "double"}


def _is_staticmethod(node) -> bool:
    return any(ast.unparse(d) == "staticmethod" for d in node.decorator_list)


def _is_static_or_class(node) -> bool:
    return any(ast.unparse(d) in ("staticmethod", "classmethod") for d in node.decorator_list)


# --------------------------------------------------------------------------- roots


def _tombstone_write(mod: _Module, func: _Func) -> str | None:
    """'writes -1 into v2p at line N' when the function tombstones a page table."""
    cls = mod.classes.get(func.cls) if func.cls else None
    args = func.node.args.posonlyargs + func.node.args.args
    self_name = args[0].arg if func.cls and args else None
    checker_env = _Env()
    for a in func.node.args.posonlyargs + func.node.args.args + func.node.args.kwonlyargs:
        if is_table_name(a.arg):
            checker_env.tables.add(a.arg)
    ev = _Eval(mod, cls, checker_env, self_name)
    # local aliases (t = self.v2p)
    for node in ast.walk(func.node):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                for tgt, val in _pair_targets(t, node.value):
                    if isinstance(tgt, ast.Name) and ev.is_table(val):
                        checker_env.tables.add(tgt.id)
    negative = mod.negative_names
    for node in ast.walk(func.node):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Subscript) and ev.is_table(t.value):
                    v = node.value
                    if _is_negative_constant(v, negative) or (
                        isinstance(v, ast.Call) and _torch_attr(v.func) in ("full", "full_like")
                        and any(_is_negative_constant(a, negative) for a in v.args[1:])
                    ):
                        return f"writes a tombstone into {_segment(t.value, 30)} at line {node.lineno}"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in _TOMBSTONE_METHODS and ev.is_table(node.func.value):
                if any(_is_negative_constant(a, negative) for a in node.args) or any(
                    _is_negative_constant(k.value, negative) for k in node.keywords
                ):
                    return f"writes a tombstone into {_segment(node.func.value, 30)} at line {node.lineno}"
    return None


def _calls_free_function(func: _Func) -> str | None:
    for node in ast.walk(func.node):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else (
                node.func.id if isinstance(node.func, ast.Name) else None)
            if name and is_free_name(name) and not exempt_reason(name):
                return f"calls {name}() at line {node.lineno}"
    return None


def _short_name(qualname: str) -> str:
    return qualname.split(".")[-1]


def _is_checked_guard(test: ast.expr) -> bool:
    """``if self.checked:``, ``if debug:``, ``if __debug__:``: a branch that may read the tables by design."""
    names = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(test) if isinstance(n, ast.Attribute)}
    return any(set(name_words(n)) & _CHECKED_GUARD_WORDS or n == "__debug__" for n in names)


def _walk_split(node: ast.AST, guarded: bool = False):
    """Yield (node, inside a checked-mode branch) for every node under ``node``."""
    yield node, guarded
    if isinstance(node, ast.If) and _is_checked_guard(node.test):
        for child in [node.test, *node.body]:
            yield from _walk_split(child, True)
        for child in node.orelse:
            yield from _walk_split(child, guarded)
        return
    for child in ast.iter_child_nodes(node):
        yield from _walk_split(child, guarded)


def _callers(mod: _Module) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """qualname -> callers outside checked-mode branches, and callers inside them."""
    plain: dict[str, set[str]] = {q: set() for q in mod.functions}
    guarded: dict[str, set[str]] = {q: set() for q in mod.functions}
    for qual, func in mod.functions.items():
        if func.is_kernel:
            continue
        checker = _FunctionChecker(mod, func, _Env(), qual, [])
        for node, in_guard in _walk_split(func.node):
            if isinstance(node, ast.Call):
                before = len(checker.calls)
                checker._collect_call(node)
                for callee, _env, _call in checker.calls[before:]:
                    (guarded if in_guard else plain)[callee].add(qual)
    return plain, guarded


def _plan_roots(mod: _Module, forced: Sequence[str] = ()) -> tuple[dict[str, str], dict[str, str]]:
    roots: dict[str, str] = {}
    exempt: dict[str, str] = {}
    for qual, func in mod.functions.items():
        if func.is_kernel:
            continue
        name = _short_name(qual)
        if qual in forced or name in forced:
            roots[qual] = "named on the command line"
            continue
        why_exempt = exempt_reason(name)
        if why_exempt:
            exempt[qual] = why_exempt
            continue
        if is_free_name(name):
            roots[qual] = "its name says it frees pages"
        elif is_read_table_name(name):
            roots[qual] = "its name says it builds the read table"
        else:
            why = _tombstone_write(mod, func) or _calls_free_function(func)
            if why:
                roots[qual] = why
    # A private helper (``_name``) called only from exempt functions or from checked-mode
    # branches is part of their path (the page moves of flush and eager free, the
    # validation of checked mode). Public functions stay roots: they are entry points,
    # whatever calls them inside the module.
    plain, guarded = _callers(mod)
    changed = True
    while changed:
        changed = False
        for qual in list(roots):
            if not _short_name(qual).startswith("_") or roots[qual] == "named on the command line":
                continue
            who = plain.get(qual, set()) - {qual}
            in_checked = guarded.get(qual, set()) - {qual}
            if (who or in_checked) and all(c in exempt for c in who):
                where = [f"exempt {', '.join(sorted(who))}"] if who else []
                where += ["checked-mode branches of " + ", ".join(sorted(in_checked))] if in_checked else []
                exempt[qual] = "called only from " + " and ".join(where)
                del roots[qual]
                changed = True
    return roots, exempt


# --------------------------------------------------------------------------- driver


def check_source(source: str, path: str = "<string>", *, roots: Sequence[str] = ()) -> FilePlan:
    """Check one module's source. ``roots`` forces extra free-path roots by (qual)name."""
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as e:
        raise ParseError(f"{path}:{e.lineno or 0}:{(e.offset or 0)}: cannot parse: {e.msg}") from e
    mod = _Module(tree, path, source)
    plan = FilePlan(path)
    plan.roots, plan.exempt = _plan_roots(mod, roots)
    findings: list[Finding] = []
    seen: set[tuple[str, tuple]] = set()
    work: list[tuple[str, _Env, str]] = [(q, _Env(), q) for q in plan.roots]
    while work:
        qual, env, chain = work.pop(0)
        key = (qual, env.key())
        if key in seen:
            continue
        seen.add(key)
        plan.reached.setdefault(qual, chain)
        checker = _FunctionChecker(mod, mod.functions[qual], env, chain, findings)
        checker.run()
        for callee, cenv, _call in checker.calls:
            cfunc = mod.functions[callee]
            if cfunc.is_kernel or (callee in plan.exempt and callee not in plan.roots):
                continue
            work.append((callee, cenv, f"{callee} ← {chain}" if chain.count("←") < 4 else f"{callee} ← …"))
    # pragmas: allow a line with a reason; a pragma without one is a finding of its own
    kept: dict[tuple, Finding] = {}
    for f in findings:
        reason = mod.pragmas.get(f.line)
        if reason:
            continue
        k = (f.line, f.col, f.code)
        if k not in kept:
            kept[k] = f
    for line, reason in mod.pragmas.items():
        if not reason:
            kept[(line, 1, "SYNC00")] = Finding(
                path, line, 1, "SYNC00", "`# sync-ok:` pragma without a reason: write `# sync-ok: <why this sync is fine>`"
            )
    plan.findings = sorted(kept.values())
    return plan


def check_file(path: str, *, roots: Sequence[str] = ()) -> FilePlan:
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as e:
        raise ParseError(f"{path}: cannot read: {e.strerror or e}") from e
    try:
        source = tokenize.decode_source(raw) if hasattr(tokenize, "decode_source") else raw.decode("utf-8")
    except (UnicodeDecodeError, SyntaxError) as e:
        raise ParseError(f"{path}: cannot decode: {e}") from e
    return check_source(source, path, roots=roots)


def default_paths() -> list[str]:
    """Our allocator sources, located through the installed (or importable) kvkernels package."""
    spec = importlib.util.find_spec("kvkernels")
    if spec is None or not spec.submodule_search_locations:
        raise ParseError("kvkernels is not importable: cannot locate the default allocator sources")
    base = list(spec.submodule_search_locations)[0]
    return [_display(os.path.join(base, name)) for name in ("allocator.py", "launchers.py")]


def _display(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path


def _expand(paths: Sequence[str]) -> list[str]:
    out: list[str] = []
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
                out.extend(os.path.join(root, f) for f in sorted(files) if f.endswith(".py"))
        else:
            out.append(p)
    return out


def main(paths: list[str]) -> int:
    """``kvfuzz check-sync [PATH…]``: 0 clean, 1 findings, 2 unreadable or unparsable input."""
    verbose = False
    args = []
    for p in paths:
        if p in ("-v", "--verbose"):
            verbose = True
        else:
            args.append(p)
    try:
        files = _expand(args) if args else default_paths()
    except ParseError as e:
        print(f"check-sync: error: {e}", file=sys.stderr)
        return 2
    status = 0
    n_findings = 0
    n_paths = 0
    errors = 0
    for path in files:
        try:
            plan = check_file(path)
        except ParseError as e:
            print(f"check-sync: error: {e}", file=sys.stderr)
            errors += 1
            continue
        n_paths += len(plan.reached)
        if verbose:
            for qual, why in plan.roots.items():
                print(f"{path}: free path {qual}: {why}")
            for qual, chain in plan.reached.items():
                if qual not in plan.roots:
                    print(f"{path}: free path {qual}: reached from {chain.split(' ← ', 1)[-1]}")
            for qual, why in plan.exempt.items():
                print(f"{path}: exempt {qual}: {why}")
        for f in plan.findings:
            print(f.format())
        n_findings += len(plan.findings)
    if errors:
        status = 2
    elif n_findings:
        status = 1
    word = "finding" if n_findings == 1 else "findings"
    summary = f"check-sync: {n_findings} {word} in {len(files)} file(s), {n_paths} free-path function(s) checked"
    if errors:
        summary += f", {errors} file(s) could not be checked"
    print(summary)
    return status


if __name__ == "__main__":  # python -m fuzz.sync.static [PATH…]
    sys.exit(main(sys.argv[1:]))
