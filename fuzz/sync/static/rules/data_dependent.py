"""Outputs whose size depends on the data: the host must learn the size before it can allocate."""

from __future__ import annotations

import ast

from ..records import Family, Rule
from ..vocab import kwarg, segment

READS_COUNT = "has a data-dependent output size: the host reads the count back from the GPU"

NONZERO = Rule(
    "SYNC07", "nonzero", "`torch.nonzero`, `torch.argwhere`, `.nonzero()`, one-argument `torch.where`",
    f"`{{form}}` {READS_COUNT}",
    "the number of hits sizes the output, so the host reads it before allocating",
    "live = torch.nonzero(self.p2v >= 0)", "live = torch.nonzero_static(self.p2v >= 0, size=8, fill_value=-1)")
UNIQUE = Rule(
    "SYNC08", "unique", "`torch.unique`, `torch.unique_consecutive`, `.unique()`",
    f"`{{form}}` {READS_COUNT}",
    "the number of distinct values sizes the output, so the host reads it before allocating",
    "pages = torch.unique(pages // 4)", "pages = torch.div(pages[::4], 4, rounding_mode='floor')")
MASKED_SELECT = Rule(
    "SYNC09", "masked-select", "`torch.masked_select`, `.masked_select()`",
    f"`{{form}}` {READS_COUNT}",
    "the number of selected elements sizes the output",
    "live = torch.masked_select(self.v2p, self.v2p >= 0)", "live = torch.where(self.v2p >= 0, self.v2p, -1)")
BOOL_MASK_INDEX = Rule(
    "SYNC10", "bool-mask-index", "boolean-mask indexing: `t[mask]` (read), `t[mask] = tensor`, `index_put_((mask,), tensor)`",
    "boolean-mask indexing `{form}` is lowered to nonzero(): the host reads the count back from the GPU",
    "ATen turns the mask into indices with nonzero(), whose size the host must read",
    "stale = self.p2v[self.p2v == -1]", "self.p2v.masked_fill_(self.p2v == -1, 0)")
REPEAT_INTERLEAVE = Rule(
    "SYNC17", "repeat-interleave", "`repeat_interleave` with tensor repeats and no `output_size=`",
    "`{form}` without output_size sums the repeats on the device and reads the total back",
    "the output length is the sum of the repeats, read back to allocate",
    "tok = torch.repeat_interleave(pages, torch.ones_like(pages))",
    "tok = torch.repeat_interleave(pages, torch.ones_like(pages), output_size=pages.numel())")


def _call(ck, node: ast.Call, t: str | None) -> None:
    ev = ck.ev
    if t is not None and node.args and ev.is_host(node.args[0]):
        return  # sized on the host: no count to read back
    if t is not None:
        if t in ("nonzero", "argwhere"):
            ck.report(NONZERO, node, f"torch.{t}(...)")
        elif t == "where" and len(node.args) == 1 and not node.keywords:
            ck.report(NONZERO, node, "torch.where(cond)")
        elif t in ("unique", "unique_consecutive"):
            ck.report(UNIQUE, node, f"torch.{t}(...)")
        elif t == "masked_select":
            ck.report(MASKED_SELECT, node, "torch.masked_select(...)")
        elif t == "repeat_interleave":
            repeats = node.args[1] if len(node.args) > 1 else kwarg(node, "repeats")
            if (repeats is None or ev.is_tensor(repeats)) and kwarg(node, "output_size") is None:
                ck.report(REPEAT_INTERLEAVE, node, segment(node))
        return
    if not isinstance(node.func, ast.Attribute) or ev.is_host(node.func.value):
        return
    meth, recv = node.func.attr, node.func.value
    if meth in ("nonzero", "argwhere"):
        ck.report(NONZERO, node, segment(node))
    elif meth in ("unique", "unique_consecutive"):
        ck.report(UNIQUE, node, segment(node))
    elif meth == "masked_select":
        ck.report(MASKED_SELECT, node, segment(node))
    elif meth == "repeat_interleave" and ev.is_tensor(recv):
        repeats = node.args[0] if node.args else kwarg(node, "repeats")
        if repeats is not None and ev.is_tensor(repeats) and kwarg(node, "output_size") is None:
            ck.report(REPEAT_INTERLEAVE, node, segment(node))
    elif meth in ("index_put_", "index_put") and len(node.args) >= 2 and ev.is_tensor(recv):
        indices, value = node.args[0], node.args[1]
        elts = indices.elts if isinstance(indices, (ast.Tuple, ast.List)) else []
        if any(ev.is_mask(e) for e in elts) and not (ev.is_host(value) or ev.is_pyscalar(value)):
            ck.report(BOOL_MASK_INDEX, node, segment(node))


def _index(ck, node: ast.Subscript, parts: list[ast.expr], store_value: ast.expr | None) -> None:
    """``t[mask]`` reads; ``t[mask] = scalar`` is the masked_fill_ fast path and does not sync."""
    ev = ck.ev
    if ev.is_host(node.value):
        return  # a host tensor masked on the host
    for part in parts:
        if not isinstance(part, ast.Slice) and ev.is_mask(part):
            if store_value is None or not ev.is_pyscalar(store_value):
                ck.report(BOOL_MASK_INDEX, node, segment(node))


FAMILY = Family(
    "data-dependent", "Outputs whose size depends on the data",
    (NONZERO, UNIQUE, MASKED_SELECT, BOOL_MASK_INDEX, REPEAT_INTERLEAVE),
    {"call": _call, "index": _index},
)
