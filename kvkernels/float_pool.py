"""DeviceFloat: docs/spec.md §6's float pool over torch tensors, a chain's middle member.

A span ``[low, high)`` of physical pages between two END pools' frontiers, with holes
inside it: holes are reused first (from the two ends of the sorted list in turn), fresh pages
extend the side with the larger gap (the middle of the free region from empty), a free is
zero-copy, an empty float is parked at ``num_pages`` and transparent to its neighbours, edge
holes are absorbed at a flush, and pages move only on demand (``make_room``,
``compact_holes``).

Why it is shaped this way:
- The free path stays free of host synchronisation (SPEC §5): ``holes`` is a device tensor
  grown with ``torch.cat``, and the span and the live count are host ints whose only device
  input is ``holes.numel()``. Taking holes sorts them on the device.
- Every decision that reads the holes (absorbing edges, making room, compacting) is planned
  on the host from one copy of them (``_plan_room`` and friends are pure), then applied as
  batched device ops; the chain uses the same plans to decide, before anything moves,
  whether its relief ladder would make an alloc fit (``DeviceChain``), so a ladder that would
  not is never run.
- The data moves with its pages in one batched copy: the planned moves are a permutation
  onto free pages (``_move_all``), applied all at once.
"""

from __future__ import annotations

import torch

from kvref.errors import ContractViolation

from . import checks
from .allocator import DeviceAllocator

SIDES = ("low", "high")


def absorbed(low: int, high: int, holes: list[int]) -> tuple[int, int, list[int]]:
    """The span and holes after the holes at its edges are handed back (nothing when none)."""
    hs = set(holes)
    new_low, new_high = low, high
    while new_low in hs:
        hs.remove(new_low)
        new_low += 1
    while new_high - 1 in hs:
        hs.remove(new_high - 1)
        new_high -= 1
    return (new_low, new_high, sorted(hs)) if (new_low, new_high) != (low, high) else (low, high, holes)


class DeviceFloat(DeviceAllocator):
    """A float member of a ``kvkernels.chain.DeviceChain`` (the chain builds it)."""

    def __init__(self, config, kernels=None, device="cpu", checked: bool = False, buffers=None):
        if not config.is_float:
            raise ContractViolation(f"DeviceFloat needs a float config, got grow={config.grow!r}")
        self.low = self.high = config.num_pages
        super().__init__(config, kernels, device, checked, buffers)

    # ---- geometry ------------------------------------------------------------------------------
    @property
    def up(self) -> bool:
        return False

    @property
    def live_pages(self) -> int:
        return self.high - self.low - self.holes.numel()

    @live_pages.setter
    def live_pages(self, _value) -> None:
        """Derived from the span and the holes' count: nothing to set."""

    def _span(self, wm=None) -> range:
        return range(self.low, self.high)

    def transparent(self) -> bool:
        return self.live_pages == 0

    def gaps(self, low=None, high=None, live=None) -> tuple[int, int]:
        """Free pages between each edge of the span (or of ``low``/``high``) and the region."""
        lo, hi = self.chain.region(self.pool)
        low, high = (self.low, self.high) if low is None else (low, high)
        if (self.live_pages if live is None else live) == 0:
            return (max(0, hi - lo),) * 2
        return max(0, low - lo), max(0, hi - high)

    def _blocked(self) -> bool:
        return self.gate_open is not None and not self.gate_open()

    def clear(self) -> None:
        super().clear()
        self.low = self.high = self.config.num_pages
        self.watermark = None
        self.holes_dirty = False
        self.next_end = "low"

    def _park_if_empty(self) -> bool:
        if self.live_pages:
            return False
        self.low = self.high = self.config.num_pages
        self.holes = self.holes[:0]
        self.holes_dirty = False
        return True

    # ---- alloc -----------------------------------------------------------------------------------
    def alloc(self, n_tokens: int):
        k = self._pages_asked(n_tokens)
        if k == 0:
            return torch.empty(0, dtype=torch.int64, device=self.device)
        if k > self.free_virtual.numel():
            return None
        phys = self._take(k)
        if phys is None:
            return None
        vp = self.free_virtual[:k]
        self.free_virtual = self.free_virtual[k:]
        self.kernels.bind_inplace(vp, phys, self.v2p, self.p2v)
        return self._tokens_of(vp)

    def _take(self, k: int) -> torch.Tensor | None:
        n_drain = min(k, self.holes.numel())
        need = k - n_drain
        fresh = self.holes[:0]
        if need:
            lo, hi = self.chain.region(self.pool)
            if self.transparent():
                if need > hi - lo:
                    return None
                start = lo + (hi - lo - need) // 2
                self.low, self.high = start, start + need
            else:
                gap_low, gap_high = self.low - lo, hi - self.high
                if need <= gap_high and (gap_high >= gap_low or need > gap_low):
                    start, self.high = self.high, self.high + need
                elif need <= gap_low:
                    start = self.low = self.low - need
                else:
                    return None
            fresh = torch.arange(start, start + need, dtype=torch.int64, device=self.device)
        if not n_drain:
            return fresh
        if n_drain == self.holes.numel():
            drained, self.holes = self.holes, self.holes[:0]
        else:
            ordered = torch.sort(self.holes).values
            n = ordered.numel()
            if self.next_end == "low":
                drained, self.holes = ordered[:n_drain], ordered[n_drain:]
            else:
                drained, self.holes = ordered[n - n_drain:], ordered[:n - n_drain]
        self.next_end = "high" if self.next_end == "low" else "low"
        return torch.cat((drained, fresh))

    # ---- free, flush -------------------------------------------------------------------------------
    def free(self, tokens: torch.Tensor) -> None:
        if tokens.numel() == 0:
            return
        if self.checked:
            checks.check_free(self.config, self.v2p, tokens)
        pages = self._pages_of_run(tokens)
        phys = self.kernels.free_unbind_inplace(pages, self.v2p, self.p2v)
        self.free_virtual = torch.cat((self.free_virtual, pages))
        self.holes = torch.cat((self.holes, phys))
        self.holes_dirty = True
        self._park_if_empty()

    def flush(self, urgent: bool = False) -> None:
        """Absorb the holes at the span's edges: no move, no settle, whatever the gate."""
        plan = self.plan_absorb()
        if plan is not None:
            self.low, self.high, holes = plan
            self.holes = self._long(holes)
        self.holes_dirty = False

    def plan_absorb(self) -> tuple[int, int, list[int]] | None:
        """The span and holes a flush would leave (None: it changes neither)."""
        if not self.holes_dirty or self.holes.numel() == 0 or self.transparent():
            return None
        after = absorbed(self.low, self.high, self.holes.tolist())
        return after if after[:2] != (self.low, self.high) else None

    # ---- moves on demand ------------------------------------------------------------------------------
    def plan_room(self, side: str, min_bytes: int, low=None, high=None, holes=None):
        """What ``make_room(side, min_bytes)`` would do, from the span ``low``/``high`` and the
        host list ``holes`` (default: the float's own): None when it moves nothing, else
        ``(moves, low, high, holes)`` after it."""
        if side not in SIDES:
            raise ContractViolation(f"make_room: side must be 'low' or 'high', got {side!r}")
        if not isinstance(min_bytes, int) or isinstance(min_bytes, bool):
            raise ContractViolation(f"make_room: min_bytes must be an int, got {min_bytes!r}")
        if low is None:
            low, high, holes = self.low, self.high, self.holes.tolist()
        epp = self.chain.bytes_per_page[self.pool]
        live_pages = [p for p in range(low, high) if p not in set(holes)]
        live = len(live_pages)
        gap_low, gap_high = self.gaps(low, high, live)
        gap = (gap_low if side == "low" else gap_high) * epp
        lo, hi = self.chain.region(self.pool)
        if self._blocked() or gap >= min_bytes or live == 0 or (hi - lo - live) * epp < min_bytes:
            return None
        need = -(-(min_bytes - gap) // epp)
        if need >= live:
            final = list(range(lo, lo + live)) if side == "high" else list(range(hi - live, hi))
            return [(s, d) for s, d in zip(live_pages, final) if s != d], final[0], final[-1] + 1, []
        srcs = (live_pages[::-1] if side == "high" else live_pages)[:need]
        if side == "high":
            dsts = sorted(h for h in holes if h < min(srcs))[:len(srcs)]
        else:
            dsts = sorted((h for h in holes if h > max(srcs)), reverse=True)[:len(srcs)]
        fresh = len(srcs) - len(dsts)
        if fresh > (gap_low if side == "high" else gap_high):
            return None
        dsts += list(range(low - 1, low - 1 - fresh, -1)) if side == "high" else list(range(high, high + fresh))
        kept = set(live_pages) - set(srcs) | set(dsts)
        new_low, new_high = min(kept), max(kept) + 1
        return (list(zip(srcs, dsts)), *absorbed(new_low, new_high, [p for p in range(new_low, new_high)
                                                                      if p not in kept]))

    def make_room(self, side: str, min_bytes: int) -> int:
        """Open at least ``min_bytes`` on ``side``; the bytes open there afterwards (fewer:
        nothing changed)."""
        plan = self.plan_room(side, min_bytes)
        if not self._blocked():
            self.fire()  # settled before any page is looked at, as SGLang does
        if plan is not None:
            self._apply(*plan)
        return self.gaps()[SIDES.index(side)] * self.chain.bytes_per_page[self.pool]

    def compact_holes(self, retreat_side: str) -> int:
        if retreat_side not in SIDES:
            raise ContractViolation(f"compact_holes: retreat_side must be 'low' or 'high', got {retreat_side!r}")
        if self._blocked() or self.holes.numel() == 0:
            return 0
        self.fire()
        holes = set(self.holes.tolist())
        live = [p for p in self._span() if p not in holes]
        final = list(range(self.low, self.low + len(live))) if retreat_side == "high" else \
            list(range(self.high - len(live), self.high))
        moves = [(s, d) for s, d in zip(live, final) if s != d]
        self._apply(moves, final[0], final[-1] + 1, [])
        return len(moves)

    def _apply(self, moves, low: int, high: int, holes: list[int]) -> None:
        self._move_all([s for s, _ in moves], [d for _, d in moves])
        self.low, self.high = low, high
        self.holes = self._long(holes)
        self.holes_dirty = False  # its edges are live: the plan absorbed them

    def _move_all(self, src: list[int], dst: list[int]) -> None:
        """Every ``src -> dst`` at once (a destination may be another move's source): the data,
        both tables, and ``p2v`` cleared on each source no page moved into."""
        if not src:
            return
        s, d = self._long(src), self._long(dst)
        pages = self.kv.view(self.config.num_pages, self.config.page_size)
        data, virtual = pages[s].clone(), self.p2v[s].clone()
        self.p2v.index_fill_(0, s, -1)
        pages[d] = data
        self.kernels.bind_inplace(virtual, d, self.v2p, self.p2v)

    # ---- state ---------------------------------------------------------------------------------------------
    def snapshot(self) -> dict:
        snap = super().snapshot()
        snap["watermark"] = [self.low, self.high]
        return snap
