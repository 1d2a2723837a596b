"""Comparing a production op's results: the oracle's tensor against the target's, on the device.

A mismatch inside a buffer's live prefix is a ``result`` divergence; past it (the poison
a read table must not touch) a ``memory`` one. Only the first divergent element is read
back to the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .. import lazy
from .. import vector_oracle as vo
from ..ops import PACKED_SLACK, POISON
from ..verdict import Divergence

torch = lazy.Torch(globals())  # imported where first used: lazy.py says why


@dataclass
class Compare:
    """One result to diff: the oracle's tensor and the target's. ``live`` (a thunk giving a
    bool mask) splits a mismatch into ``result`` (inside the live prefix) and ``memory``
    (poison past it); ``where`` names an element for the message."""

    field: str
    expected: torch.Tensor
    actual: object
    live: Callable[[], torch.Tensor] | None = None
    where: Callable[[object], str] | None = None


def table_live(shape, n_cols: list[int], device) -> torch.Tensor:
    """bool mask of a read-table buffer (one guard row first): the live prefix of each batch row."""
    live = torch.zeros(shape, dtype=torch.bool, device=device)
    if n_cols:
        n = torch.tensor(n_cols, dtype=torch.int64, device=device)
        live[1:1 + len(n_cols)] = torch.arange(shape[1], device=device).view(1, -1) < n.view(-1, 1)
    return live


def packed_live(numel: int, spans: list[tuple[int, int]], device) -> torch.Tensor:
    """bool mask of a packed buffer (PACKED_SLACK guard first): [start, start + n) of each row."""
    live = torch.zeros(numel, dtype=torch.bool, device=device)
    for start, n in spans:
        live[PACKED_SLACK + start:PACKED_SLACK + start + n] = True
    return live


def result_divergence(i: int, op, cmp: Compare) -> None:
    """Raise the divergence of a comparison that disagreed: ``result`` inside the live prefix,
    ``memory`` past it."""
    exp, got = cmp.expected, cmp.actual
    kind = op.kind if op else "end"
    if cmp.live is not None:
        live = cmp.live()
        zero = torch.zeros((), dtype=exp.dtype, device=exp.device)
        hit = vo.first_mismatch(torch.where(live, exp, zero), torch.where(live, got, zero))
        if hit is not None:
            at, e, g = hit
            where = cmp.where(at) if cmp.where else str(at)
            raise Divergence(i, op, "result", cmp.field, e, g, f"{kind}: {where} differs (live prefix)")
        at, e, g = vo.first_mismatch(exp, got)
        where = cmp.where(at) if cmp.where else str(at)
        raise Divergence(i, op, "memory", cmp.field, e, g, f"{kind}: {where} changed past the live prefix "
                         f"(poison {POISON:#x})")
    at, e, g = vo.first_mismatch(exp, got)
    raise Divergence(i, op, "result", cmp.field, e, g, f"{kind}: {cmp.field}[{at}] differs")
