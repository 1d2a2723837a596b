"""docs/spec.md §6: a chain's float pool, the middle member between two END pools.

A float is not a band growing from an end: it is a span ``[low, high)`` of physical pages
somewhere between its neighbours' frontiers, with holes inside it. Its rules are SGLang
0.5.23's ``FloatMultiEndedAllocator`` (``unified_sub_pool.py``), which this follows where
the issue and SPEC are silent:

- **Holes first.** An alloc takes holes before it extends the span, from one end of the
  ascending hole list, the two ends in turn (the next request from the other end); all of
  them when it takes all, in list order. Fresh pages extend the side with the larger gap,
  or the other side when the larger cannot take them; from empty the span is placed at the
  middle of the free region, so gap stays on both sides.
- **Zero-copy free.** A free unbinds its pages and appends them to the holes, with no
  move and no watermark change; a float whose last live page goes is parked empty at
  ``num_pages``, and an empty float is *transparent*: its neighbours see through it.
  Holes at the span's edges are absorbed later, at a flush (urgent or not), which moves
  nothing, settles nothing and passes any move gate.
- **Moves on demand only.** ``make_room(side, min_bytes)`` opens at least ``min_bytes``
  on one side by relocating the fewest live pages (to holes on the far side, then to fresh
  pages past the far edge; every live page when the ask exceeds them), or changes nothing
  when it cannot or its move gate is closed; ``compact_holes(retreat_side)`` closes every
  hole by packing the live pages toward the other side. Both settle the in-flight forward
  before they look at the pages (its event fires), unless the gate is closed.
- A float frees eagerly (``lazy`` is False in its config): it has no pending pages and,
  like an eager pool, its free does not wait for the in-flight forward.

``live_pages`` is derived (span minus holes), as SGLang derives it; the snapshot's
``watermark`` is the pair ``[low, high]``.
"""

from __future__ import annotations

from . import kernels
from .allocator import Allocator
from .errors import ContractViolation

SIDES = ("low", "high")


class FloatPool(Allocator):
    """A float member of a ``kvref.chain.Chain`` (built by the chain, never alone)."""

    def __init__(self, config, rules=frozenset()):
        if not config.is_float:
            raise ContractViolation(f"FloatPool needs a float config, got grow={config.grow!r}")
        self.low = self.high = config.num_pages
        super().__init__(config, rules)

    # ---- geometry ---------------------------------------------------------------------------
    @property
    def up(self) -> bool:
        return False

    @property
    def live_pages(self) -> int:
        return self.high - self.low - len(self.holes)

    @live_pages.setter
    def live_pages(self, _value) -> None:
        """Derived from the span and the holes: the base class's bookkeeping has nothing to set."""

    def span(self) -> range:
        return range(self.low, self.high)

    def index_room(self) -> int:
        return self.config.capacity_pages - self.live_pages

    def transparent(self) -> bool:
        return self.live_pages == 0

    def gaps(self) -> tuple[int, int]:
        """(low, high): free pages between each edge of the span and the region's bound; both
        the whole region while the float is empty."""
        lo, hi = self.chain.region(self.pool)
        if self.transparent():
            return (max(0, hi - lo),) * 2
        return max(0, self.low - lo), max(0, hi - self.high)

    def _blocked(self) -> bool:
        return self.gate_open is not None and not self.gate_open()

    # ---- lifecycle ----------------------------------------------------------------------------
    def clear(self) -> None:
        super().clear()
        self.low = self.high = self.config.num_pages
        self.watermark = None
        self.holes_dirty = False  # a free since the last absorb: the edges may be holes
        self.next_end = "low"  # the end of the hole list the next hole-taking alloc takes from

    def _park_if_empty(self) -> bool:
        if self.live_pages:
            return False
        self.low = self.high = self.config.num_pages
        self.holes = []
        self.holes_dirty = False
        return True

    # ---- alloc ------------------------------------------------------------------------------------
    def alloc(self, n_tokens: int) -> list[int] | None:
        c = self.config
        k = self._pages_asked(n_tokens)
        if k == 0:
            return []
        if k > len(self.free_virtual):
            return None
        phys = self._take(k)
        if phys is None:
            return None
        vp = self.free_virtual[:k]
        del self.free_virtual[:k]
        kernels.bind(self.v2p, self.p2v, vp, phys)
        return [v * c.page_size + o for v in vp for o in range(c.page_size)]

    def _take(self, k: int) -> list[int] | None:
        """``k`` physical pages, holes first; None (nothing changed) when the region cannot
        hold the fresh ones."""
        n_drain = min(k, len(self.holes))
        need = k - n_drain
        fresh: list[int] = []
        if need:
            lo, hi = self.chain.region(self.pool)
            if self.transparent():
                if need > hi - lo:
                    return None
                start = lo + (hi - lo - need) // 2
                self.low, self.high = start, start + need
                self.chain.note("float|alloc|midpoint")  # an empty float has no holes
            else:
                gap_low, gap_high = self.low - lo, hi - self.high
                for side in (("high", "low") if gap_high >= gap_low else ("low", "high")):
                    if side == "high" and need <= gap_high:
                        start, self.high = self.high, self.high + need
                        break
                    if side == "low" and need <= gap_low:
                        start = self.low = self.low - need
                        break
                else:
                    return None
                self.chain.note(f"float|alloc|extend {side}{'+holes' if n_drain else ''}")
            fresh = list(range(start, start + need))
        drained: list[int] = []
        if n_drain:
            drained = self._take_holes(n_drain, self.next_end)
            self.next_end = "high" if self.next_end == "low" else "low"
            if not need:
                self.chain.note("float|alloc|holes")
        return drained + fresh

    def _take_holes(self, n: int, end: str) -> list[int]:
        if n == len(self.holes):
            taken, self.holes = self.holes, []
            return taken
        ordered = sorted(self.holes)
        if end == "low":
            taken, self.holes = ordered[:n], ordered[n:]
        else:
            taken, self.holes = ordered[len(ordered) - n:], ordered[:len(ordered) - n]
        return taken

    # ---- free, flush --------------------------------------------------------------------------------
    def free(self, tokens) -> None:
        pages = self._pages_freed(tokens)
        if not pages:
            return
        phys = kernels.free_unbind(self.v2p, self.p2v, pages)
        self.free_virtual.extend(pages)
        self._forget(pages)
        self.holes.extend(phys)
        self.holes_dirty = True
        if self._park_if_empty():
            self.chain.note("float|park")

    def flush(self, urgent: bool = False) -> None:
        """Absorb the holes at the span's edges: no move, no settle, whatever the gate."""
        if self.absorb():
            self.chain.note("float|absorb")

    def absorb(self) -> int:
        """Pages handed back at the span's edges (SGLang's ``_absorb_span_boundary_holes``)."""
        if self._park_if_empty() or not self.holes_dirty or not self.holes:
            self.holes_dirty = False
            return 0
        self.holes_dirty = False
        before = len(self.span())
        holes = set(self.holes)
        while self.low in holes:
            holes.remove(self.low)
            self.low += 1
        while self.high - 1 in holes:
            holes.remove(self.high - 1)
            self.high -= 1
        if before != len(self.span()):
            self.holes = sorted(holes)
        return before - len(self.span())

    # ---- moves on demand ------------------------------------------------------------------------------
    def _live_sorted(self) -> list[int]:
        holes = set(self.holes)
        return [p for p in self.span() if p not in holes]

    def make_room(self, side: str, min_bytes: int) -> int:
        """Open at least ``min_bytes`` between the ``side`` edge and the region's bound; the
        bytes open on that side afterwards (fewer: nothing changed)."""
        if side not in SIDES:
            raise ContractViolation(f"make_room: side must be 'low' or 'high', got {side!r}")
        if not isinstance(min_bytes, int) or isinstance(min_bytes, bool):
            raise ContractViolation(f"make_room: min_bytes must be an int, got {min_bytes!r}")
        epp = self.chain.bytes_per_page[self.pool]
        gap_bytes = self.gaps()[SIDES.index(side)] * epp
        if self._blocked():
            self.chain.note("make_room|gated")
            return gap_bytes
        self.fire()  # the forward's writes land before any page moves
        lo, hi = self.chain.region(self.pool)
        if gap_bytes >= min_bytes or self.transparent():
            self.chain.note("make_room|open already")
            return gap_bytes
        live = self.live_pages
        if (hi - lo - live) * epp < min_bytes:
            self.chain.note("make_room|impossible")
            return gap_bytes
        need = -(-(min_bytes - gap_bytes) // epp)
        live_sorted = self._live_sorted()
        if need >= live:
            final = list(range(lo, lo + live)) if side == "high" else list(range(hi - live, hi))
            self._relocate(live_sorted, final)
            self.chain.note("make_room|leapfrog")
            return self.gaps()[SIDES.index(side)] * epp
        srcs = (live_sorted[::-1] if side == "high" else live_sorted)[:need]
        if side == "high":
            dsts = sorted(h for h in self.holes if h < min(srcs))[:len(srcs)]
        else:
            dsts = sorted((h for h in self.holes if h > max(srcs)), reverse=True)[:len(srcs)]
        fresh = len(srcs) - len(dsts)
        if fresh:
            gap_low, gap_high = self.gaps()
            if fresh > (gap_low if side == "high" else gap_high):
                self.chain.note("make_room|no far room")
                return gap_bytes
            dsts += (list(range(self.low - 1, self.low - 1 - fresh, -1)) if side == "high"
                     else list(range(self.high, self.high + fresh)))
        self._move_pages(list(zip(srcs, dsts)))
        kept = sorted((set(live_sorted) - set(srcs)) | set(dsts))
        self.low, self.high = kept[0], kept[-1] + 1
        kept_set = set(kept)
        self.holes = [p for p in range(self.low, self.high) if p not in kept_set]
        self.holes_dirty = True
        self.absorb()
        self.chain.note("make_room|moved" + ("+fresh" if fresh else ""))
        return self.gaps()[SIDES.index(side)] * epp

    def compact_holes(self, retreat_side: str) -> int:
        """Close every hole, packing the live pages away from ``retreat_side``; pages moved."""
        if retreat_side not in SIDES:
            raise ContractViolation(f"compact_holes: retreat_side must be 'low' or 'high', got {retreat_side!r}")
        if self._blocked() or not self.holes:
            self.chain.note("compact|" + ("gated" if self.holes else "no holes"))
            return 0
        self.fire()
        live_sorted = self._live_sorted()
        n = len(live_sorted)
        final = list(range(self.low, self.low + n)) if retreat_side == "high" else list(range(self.high - n, self.high))
        self.chain.note("compact|moved")
        return self._relocate(live_sorted, final)

    def _relocate(self, live_sorted: list[int], final: list[int]) -> int:
        pairs = [(s, d) for s, d in zip(live_sorted, final) if s != d]
        self._move_pages(pairs)
        if final:
            self.low, self.high = final[0], final[-1] + 1
        else:
            self.low = self.high = self.config.num_pages
        self.holes = []
        return len(pairs)

    def _move_pages(self, pairs: list[tuple[int, int]]) -> None:
        """Every ``src -> dst`` at once: data and both tables, each source's ``p2v`` row
        cleared unless a page moves into it."""
        ps = self.config.page_size
        data = {s: self.kv[s * ps:(s + 1) * ps] for s, _ in pairs}
        moved = {s: self.p2v[s] for s, _ in pairs}
        for s, _ in pairs:
            self.p2v[s] = -1
        for s, d in pairs:
            self.kv[d * ps:(d + 1) * ps] = data[s]
            self.v2p[moved[s]] = d
            self.p2v[d] = moved[s]

    # ---- state ------------------------------------------------------------------------------------------
    def snapshot(self) -> dict:
        snap = super().snapshot()
        snap["watermark"] = [self.low, self.high]
        return snap
