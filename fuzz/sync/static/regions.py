"""Allowed regions: code on a free path that SPEC.md lets synchronise, or that never runs on a GPU.

Why path sensitivity: one ``free`` holds both modes (``if self.lazy: …; return``, then
the eager code), and diagnostics sync right before a ``raise``. SPEC.md §3 allows the
eager free to synchronise, and a sync on the way to an exception costs nothing in
steady state; reporting them buries the real lazy-path syncs. Each kind below is
allowed by default, listed with ``-v``, and made strict with ``--strict KIND``.

Kinds, and how a region is recognised:

- ``eager``: the branch of a lazy/eager test that is not lazy (``if self.lazy: … else:
  <eager>``, ``if not self.lazy_compaction: <eager>``), the rest of a block after the
  lazy branch returns, or a function whose name says eager.
- ``error-path``: a block that raises on every path (an ``if``/``else``/``except``
  body ending in ``raise``, or in a call to a function that always raises).
- ``cpu-only``: a branch guarded by a CPU-only test (``not x.is_cuda``, ``x.is_cpu``,
  ``x.device.type == "cpu"``, ``not torch.cuda.is_available()``), or the rest of a
  block after the CUDA branch returns.
- ``checked``: a checked-mode or debug branch (``if self.checked:``; validation reads the
  tables by design), or a function named debug.
- ``flush``: a function named flush or compact (SPEC.md §3: flush may synchronise).

There is no set-up kind: a function the free path calls (``reset_slots``, a helper's
``__init__``) runs on every step whatever its name, and set-up that no free path calls
is never checked.

A call made inside a region carries the region into the callee. Tests compose: ``not``
flips a test, ``a and b`` is in a region when either implies it, ``a or b`` when both do.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass

from . import vocab

KINDS = {
    "eager": "eager free may synchronise (SPEC.md §3)",
    "error-path": "runs only on the way to a raise: costs nothing in steady state",
    "cpu-only": "a CPU-only branch never runs on a GPU",
    "checked": "checked mode reads the tables to raise ContractViolation, by design",
    "flush": "flush and compaction may synchronise (SPEC.md §3)",
}


@dataclass(frozen=True)
class Exemption:
    kind: str
    detail: str  # where it comes from, e.g. "the else branch of `if self.lazy:` (line 12)"
    path: str
    function: str
    start: int
    end: int

    @property
    def reason(self) -> str:
        return f"{self.detail}; {KINDS[self.kind]}"


# ------------------------------------------------------------------ atoms


def _ident(node: ast.expr) -> str | None:
    """The last identifier of a flag: ``self.config.lazy`` -> lazy; ``self.is_checked()`` -> is_checked."""
    if isinstance(node, ast.Call) and not node.args:
        node = node.func
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _str_const(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Call) and vocab.torch_attr(node.func) == "device" and node.args:
        return _str_const(node.args[0])
    return None


def _compare(node: ast.Compare) -> tuple[ast.expr, ast.expr, bool] | None:
    """(left, right, positive) of a single ``==``/``!=``/``is``/``is not``/``in (…)``."""
    if len(node.ops) != 1:
        return None
    op, right = node.ops[0], node.comparators[0]
    if isinstance(op, (ast.Eq, ast.Is)):
        return node.left, right, True
    if isinstance(op, (ast.NotEq, ast.IsNot)):
        return node.left, right, False
    if isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Tuple, ast.List, ast.Set)) and len(right.elts) == 1:
        return node.left, right.elts[0], isinstance(op, ast.In)
    return None


def checked_atom(node: ast.expr) -> bool | None:
    name = _ident(node)
    if name == "__debug__" or (name and set(vocab.name_words(name)) & vocab.CHECKED_WORDS):
        return True
    return None


def eager_atom(node: ast.expr) -> bool | None:
    """True: the atom being true means eager; False: it being false means eager."""
    if isinstance(node, ast.Compare):
        parts = _compare(node)
        if parts is None:
            return None
        left, right, positive = parts
        if isinstance(right, ast.Constant) and isinstance(right.value, bool):  # self.lazy is False
            inner = eager_atom(left)
            return None if inner is None else (inner if positive == right.value else not inner)
        # the mode is a string or an enum member: self.mode == "eager", self.mode is Mode.LAZY, "lazy" != mode
        for label in (_str_const(right), right.attr if isinstance(right, ast.Attribute) else None, _str_const(left)):
            words = set(vocab.name_words(label or ""))
            if "eager" in words:
                return positive
            if "lazy" in words:
                return not positive
        return None
    name = _ident(node)
    if not name:
        return None
    words = set(vocab.name_words(name))
    if "eager" in words:
        return True
    if "lazy" in words:
        return False
    return None


def _mentions_device(node: ast.expr) -> bool:
    text = ast.unparse(node)
    return "device" in text or text.startswith("str(")


def cpu_atom(node: ast.expr) -> bool | None:
    """True: the atom being true means CPU only; False: it being false means CPU only."""
    if isinstance(node, ast.Attribute) and node.attr in ("is_cuda", "is_cpu"):
        return node.attr == "is_cpu"
    if isinstance(node, ast.Call) and vocab.torch_attr(node.func) == "cuda.is_available":
        return False
    if isinstance(node, ast.Compare):
        parts = _compare(node)
        if parts is None:
            return None
        left, right, positive = parts
        value, other = (_str_const(right), left) if _str_const(right) is not None else (_str_const(left), right)
        if value is None or not _mentions_device(other):
            return None
        device = value.split(":")[0]
        if device == "cpu":
            return positive
        if device == "cuda":
            return not positive
    return None


ATOMS: dict[str, Callable[[ast.expr], bool | None]] = {"checked": checked_atom, "eager": eager_atom,
                                                      "cpu-only": cpu_atom}


def implies(test: ast.expr, atom: Callable[[ast.expr], bool | None]) -> tuple[bool, bool]:
    """(test true ⇒ in the region, test false ⇒ in the region)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        t, f = implies(test.operand, atom)
        return f, t
    if isinstance(test, ast.BoolOp):
        parts = [implies(v, atom) for v in test.values]
        if isinstance(test.op, ast.And):
            return any(t for t, _ in parts), all(f for _, f in parts)
        return all(t for t, _ in parts), any(f for _, f in parts)
    polarity = atom(test)
    if polarity is None:
        return False, False
    return (True, False) if polarity else (False, True)


def classify(test: ast.expr, strict: frozenset[str]) -> tuple[str | None, str | None]:
    """The region kinds of (the true branch, the false branch) of a test."""
    body = orelse = None
    for kind, atom in ATOMS.items():
        if kind in strict:
            continue
        t, f = implies(test, atom)
        body = body or (kind if t else None)
        orelse = orelse or (kind if f else None)
    return body, orelse


# ------------------------------------------------------------------ termination


def _escapes(stmts: list[ast.stmt]) -> bool:
    """A ``return``, or a ``break``/``continue`` that leaves the block, somewhere inside."""

    def walk(node: ast.AST, in_loop: bool) -> bool:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return False
        if isinstance(node, ast.Return):
            return True
        if isinstance(node, (ast.Break, ast.Continue)) and not in_loop:
            return True
        loop = in_loop or isinstance(node, (ast.For, ast.AsyncFor, ast.While))
        return any(walk(child, loop) for child in ast.iter_child_nodes(node))

    return any(walk(s, False) for s in stmts)


def _ends(stmts: list[ast.stmt], final: tuple[type, ...], always_raises: Callable[[ast.Call], bool]) -> bool:
    if not stmts:
        return False
    last = stmts[-1]
    if isinstance(last, final):
        return True
    if isinstance(last, ast.Assert) and isinstance(last.test, ast.Constant) and not last.test.value:
        return True
    if isinstance(last, ast.If):
        return _ends(last.body, final, always_raises) and _ends(last.orelse, final, always_raises)
    if isinstance(last, (ast.With, ast.AsyncWith)):
        return _ends(last.body, final, always_raises)
    if isinstance(last, ast.Try):
        return _ends(last.body, final, always_raises) and all(
            _ends(h.body, final, always_raises) for h in last.handlers)
    if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
        return always_raises(last.value)
    return False


def terminates(stmts: list[ast.stmt], always_raises: Callable[[ast.Call], bool]) -> bool:
    """Control never falls off the end of the block (return, raise, break, continue)."""
    return _ends(stmts, (ast.Return, ast.Raise, ast.Break, ast.Continue), always_raises)


def raises(stmts: list[ast.stmt], always_raises: Callable[[ast.Call], bool]) -> bool:
    """Every path through the block ends in an exception: the block is an error path."""
    return _ends(stmts, (ast.Raise,), always_raises) and not _escapes(stmts)
