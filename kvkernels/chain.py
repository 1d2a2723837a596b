"""DeviceChain: docs/spec.md §6's chain of pools over one byte buffer, on DeviceAllocators.

Member 0 is the ``DeviceAllocator`` whose config has the ``chain``; it builds this chain,
which builds the peers (members 1..): END pools of member 0's class, a float as a
``kvkernels.float_pool.DeviceFloat``, their tables from the same ``buffers`` factory under a
``poolI.`` prefix (so a harness's red zones tell them apart).

Why it is shaped this way:
- Everything the chain decides (gaps, capacities, the relief ladder) is host arithmetic
  over each member's host ints (watermark, live count, hole and pending counts, a float's
  span): a chain op adds no device read to the members' own ops, and the lazy free path
  stays free of synchronisation (SPEC §5).
- The ladder is planned before it runs: an END neighbour's urgent flush would give back
  every page of its span that is not live; a float's, its edge holes; the float's
  ``make_room`` is a pure plan (``DeviceFloat.plan_room``). Only a ladder after which the
  alloc fits runs, so a failed alloc changes no pool (docs/spec.md §6) and no flush is spent
  on an alloc that fails anyway.
- Capacities are memoised on a key of that host state and the gates of the neighbours the
  schedulable view credits, so a memo is never read across a change it depends on (SGLang
  0.5.23 keys its memo on a chain-wide epoch plus the drain state, for the same reason).
- The chain interface (``alloc``, ``free``, ``flush``, ``forward``, ``fire``, ``write``,
  ``read``, ``set_gate``, ``relieve``, ``make_room``, ``compact``, ``capacity``,
  ``snapshot``, each naming its pool) is the one a team's chain is driven through
  (docs/allocators.md).
"""

from __future__ import annotations

from kvref.chain import MemberCalls
from kvref.errors import ContractViolation


def _prefixed(buffers, prefix: str):
    def make(name: str, rows: int, fill: int, row_len: int = 1):
        return buffers(prefix + name, rows, fill, row_len)
    return make


class DeviceChain(MemberCalls):  # free, flush, make_room, ... passed on as they are
    float_class = None  # None: kvkernels.float_pool.DeviceFloat (a class attribute: a planted bug swaps it)

    def __init__(self, owner):
        float_class = self.float_class
        if float_class is None:
            from .float_pool import DeviceFloat as float_class

        cc = owner.config.chain
        self.total_bytes = cc.total_bytes
        self.bytes_per_page = cc.bytes_per_page
        peers = [(float_class if peer.is_float else type(owner))(
                     peer, owner.kernels, owner.device, owner.checked, _prefixed(owner.buffers, f"pool{i}."))
                 for i, peer in enumerate(cc.peers, 1)]
        self.members = [owner, *peers]
        self.gates = [True] * len(self.members)
        self._memo: dict[tuple, tuple] = {}
        for i, m in enumerate(self.members):
            m.pool = i
            m.chain = self
            if not m.config.is_float:
                m.frontier_room = (lambda i=i: self.frontier_pages(i))
            m.gate_open = (lambda i=i: self.gates[i])

    # ---- geometry, from host state --------------------------------------------------------
    def member(self, pool: int):
        if not isinstance(pool, int) or isinstance(pool, bool) or not 0 <= pool < len(self.members):
            raise ContractViolation(f"pool {pool!r}: the chain has {len(self.members)} member(s), 0..{len(self.members) - 1}")
        return self.members[pool]

    def is_float(self, i: int) -> bool:
        return self.members[i].config.is_float

    def transparent(self, i: int) -> bool:
        return self.is_float(i) and self.members[i].transparent()

    def frontiers(self, i: int) -> tuple[int, int]:
        m, epp = self.members[i], self.bytes_per_page[i]
        if self.is_float(i):
            return m.low * epp, m.high * epp
        if m.up:
            return m.config.min_page * epp, m.watermark * epp
        return (m.watermark + 1) * epp, m.config.num_pages * epp

    def _nearest(self, i: int, step: int) -> int | None:
        j = i + step
        while 0 <= j < len(self.members) and self.transparent(j):
            j += step
        return j if 0 <= j < len(self.members) else None

    def above(self, i: int) -> int | None:
        return self._nearest(i, 1)

    def below(self, i: int) -> int | None:
        return self._nearest(i, -1)

    def neighbour(self, i: int) -> int | None:
        """The nearest member that is not transparent on i's growth side (below, for a float)."""
        return self.above(i) if self.members[i].config.grow == "up" else self.below(i)

    def _facing(self, i: int, side: str) -> int:
        """The byte frontier facing member i on ``side``: the buffer's end where there is none."""
        j = self.above(i) if side == "high" else self.below(i)
        if j is None:
            return self.total_bytes if side == "high" else 0
        return self.frontiers(j)[0 if side == "high" else 1]

    def gap(self, i: int) -> int:
        if self.is_float(i):
            return max(self.members[i].gaps()) * self.bytes_per_page[i]
        low, high = self.frontiers(i)
        if self.members[i].up:
            return max(0, self._facing(i, "high") - high)
        return max(0, low - self._facing(i, "low"))

    def region(self, i: int) -> tuple[int, int]:
        c, epp = self.members[i].config, self.bytes_per_page[i]
        return max(-(-self._facing(i, "low") // epp), c.min_page), min(self._facing(i, "high") // epp, c.num_pages)

    def frontier_pages(self, i: int, extra: int = 0) -> int:
        """Pages of END member i the bytes up to the facing frontier hold (``extra`` bytes more)."""
        return (self.gap(i) + extra) // self.bytes_per_page[i]

    def _holes(self, i: int) -> int:
        m = self.members[i]
        return m.holes.numel() if m.config.lazy or self.is_float(i) else 0

    def drainable(self, j: int | None, pending: bool = False) -> int:
        """Bytes an urgent flush of lazy END member j gives back for certain, its gate open: its
        holes (and its pending pages, whose forward the flush completes, when ``pending``)."""
        if j is None or self.is_float(j) or not self.members[j].config.lazy or not self.gates[j]:
            return 0
        m = self.members[j]
        extra = sum(p.numel() for _, p in m.pending) if pending else 0
        return (m.holes.numel() + extra) * self.bytes_per_page[j]

    def _tokens(self, i: int, schedulable: bool) -> int:
        m = self.members[i]
        epp, ps = self.bytes_per_page[i], m.config.page_size
        if self.is_float(i):
            gap_low, gap_high = m.gaps()
            if schedulable:
                gap_low += self.drainable(self.below(i)) // epp
                gap_high += self.drainable(self.above(i)) // epp
            return (min(max(gap_low, gap_high), m.config.capacity_pages - m.live_pages) + self._holes(i)) * ps
        extra = self.drainable(self.neighbour(i)) if schedulable else 0
        index_room = m.config.capacity_pages - len(m._span())
        return (min(self.frontier_pages(i, extra), index_room) + self._holes(i)) * ps

    def joint(self) -> int:
        shown = [i for i in range(len(self.members)) if not self.transparent(i)]
        if len(shown) == 1:
            bands = max(0, self.total_bytes - self.frontiers(0)[1])
        else:
            bands = sum(max(0, self.frontiers(b)[0] - self.frontiers(a)[1]) for a, b in zip(shown, shown[1:]))
        return bands + sum(self._holes(i) * self.bytes_per_page[i] for i in range(len(self.members)))

    def state_key(self) -> tuple:
        return tuple((m.low, m.high, m.holes.numel()) if self.is_float(i) else
                     (m.watermark, m.live_pages, m.holes.numel(), sum(p.numel() for _, p in m.pending))
                     for i, m in enumerate(self.members))

    def memo_key(self, i: int) -> tuple:
        credited = (self.below(i), self.above(i)) if self.is_float(i) else (self.neighbour(i),)
        return i, self.state_key(), tuple(None if j is None else self.gates[j] for j in credited)

    def capacity(self, pool: int) -> list[int]:
        """``[available, schedulable, joint]`` of ``pool`` (tokens, tokens, bytes), memoised."""
        self.member(pool)
        key = self.memo_key(pool)
        if key not in self._memo:
            self._memo = {k: v for k, v in self._memo.items() if k[1] == key[1]}
            self._memo[key] = (self._tokens(pool, False), self._tokens(pool, True), self.joint())
        return list(self._memo[key])

    # ---- the ops ----------------------------------------------------------------------------
    def alloc(self, pool: int, n_tokens: int):
        m = self.member(pool)
        if not isinstance(n_tokens, int) or isinstance(n_tokens, bool) or n_tokens % m.config.page_size \
                or n_tokens <= 0:
            return m.alloc(n_tokens)
        if n_tokens // m.config.page_size > m.free_virtual.numel():
            return None
        if n_tokens > self.capacity(pool)[0]:
            plan = self._plan_ladder(pool, n_tokens)
            if plan is None:
                return None  # the ladder would leave it short: it does not run (docs/spec.md §6)
            self.relieve(pool)
            if plan:
                self.members[plan[0]].make_room(*plan[1:])
        return m.alloc(n_tokens)

    def flush_targets(self, pool: int) -> list[int]:
        targets = (self.below(pool), self.above(pool)) if self.is_float(pool) else (self.neighbour(pool),)
        return [j for j in targets if j is not None]

    def _plan_ladder(self, pool: int, n_tokens: int):
        """How the ladder would make ``n_tokens`` fit: ``()`` by the first rung, ``(float,
        side, bytes)`` with the float's ``make_room`` after it; None when it would not."""
        ps, epp = self.members[pool].config.page_size, self.bytes_per_page[pool]
        if self.is_float(pool):  # its neighbours' frontiers retreat by all they give back
            m, c = self.members[pool], self.members[pool].config
            low_end = self._facing(pool, "low") - self.drainable(self.below(pool), pending=True)
            high_end = self._facing(pool, "high") + self.drainable(self.above(pool), pending=True)
            lo, hi = max(-(-low_end // epp), c.min_page), min(high_end // epp, c.num_pages)
            gaps = (max(0, hi - lo),) if m.transparent() else (max(0, m.low - lo), max(0, hi - m.high))
            room = min(max(gaps), c.capacity_pages - m.live_pages) + self._holes(pool)
            return () if n_tokens <= room * ps else None
        j = self.neighbour(pool)
        if j is None:
            return None
        index_room = self.members[pool].config.capacity_pages - len(self.members[pool]._span())
        if not self.is_float(j):
            room = min(self.frontier_pages(pool, self.drainable(j, pending=True)), index_room) + self._holes(pool)
            return () if n_tokens <= room * ps else None
        f = self.members[j]
        plan = f.plan_absorb()
        low, high, holes = plan if plan is not None else (f.low, f.high, f.holes.tolist())
        short = "low" if self.members[pool].up else "high"
        edge = (low if short == "low" else high) * self.bytes_per_page[j]
        gap = (edge - self.frontiers(pool)[1]) if short == "low" else (self.frontiers(pool)[0] - edge)
        need = -(-n_tokens // ps)
        if need <= min(gap // epp, index_room) + self._holes(pool):
            return ()
        ask = self._short_side_ask(pool, j, need, low, high, holes)
        if ask is None or f.plan_room(ask[0], ask[1], low, high, holes) is None:
            return None
        return (j, *ask)

    def _short_side_ask(self, pool: int, f: int, need: int, low: int, high: int, holes: list[int]):
        """SGLang's ``_float_open_short_side`` for one short END member: the side of float ``f``
        (span ``low``/``high``, ``holes``) to open and the bytes to ask for, or None."""
        m, epp_f = self.members[pool], self.bytes_per_page[f]
        if need > m.config.capacity_pages - len(m._span()):
            return None
        side = "high" if m.config.grow == "down" else "low"
        want = max(0, need - self._holes(pool)) * self.bytes_per_page[pool]
        band = {"low": max(0, low * epp_f - self._facing(f, "low")),
                "high": max(0, self._facing(f, "high") - high * epp_f)}
        far = "high" if side == "low" else "low"
        if band[side] - want >= 0 or band[far] < 0:
            return None  # not short on that side (a float's own demand is nil here)
        target = want + self.bytes_per_page[pool]
        return (side, target) if target > band[side] else None

    def relieve(self, pool: int) -> None:
        """The relief ladder's first rung: an urgent flush of ``pool``'s growth-side neighbour
        (both neighbours of a float)."""
        self.member(pool)
        for j in self.flush_targets(pool):
            self.flush(j, True)

    def snapshot(self) -> dict:
        return {"pools": [m.snapshot() for m in self.members], "gates": list(self.gates)}
