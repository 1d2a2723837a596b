"""docs/spec.md §6: a chain of pools over one byte buffer, as plain Python.

SPEC §1-§4 describe one pool with its own index room. In a unified memory pool the pools
are a chain over one byte buffer: member 0 grows up from byte 0, the last member grows down
from the top, each with its own bytes per page, tables, holes, pending pages and watermark;
a three-member chain has a float pool between them (``kvref.float_pool``). A member's room is
the gap to its neighbour's byte frontier as well as its index room; an alloc that falls
short runs the relief ladder; a neighbour's holes count toward *schedulable* capacity only
while its move gate is open; capacities are memoised on the chain's state.

Rules, SGLang 0.5.23's (``unified_sub_pool.py``) unless said otherwise:

- Byte frontiers (``frontiers``): grow up ``[min * epp, wm * epp)``, grow down
  ``[(wm + 1) * epp, num_pages * epp)``, a float ``[low * epp, high * epp)``. An empty float
  is *transparent*: every walk along the chain sees through it to the member beyond.
- The gap of an END member is the bytes from its growth frontier to the nearest
  non-transparent member's facing frontier (or the buffer's end), floored at 0; a float's
  region is the pages between its two such neighbours (``region``), its gaps the free pages
  on each side of its span.
- ``available(i) = (min(gap // epp, index_room) + holes) * ps`` (holes only when lazy); a
  float's uses the larger of its two gaps and its index room ``capacity - live``.
  ``schedulable(i)`` adds to the gap the holes' bytes of the growth-side neighbour when that
  neighbour is a lazy END pool with its gate open (a float: of each side's neighbour).
- ``joint()``: the bytes the chain could still hand out: each free band between facing
  frontiers counted once, plus every member's holes.
- The relief ladder (``_ladder``): an urgent flush of the short member's growth-side
  neighbour, never of the short member itself (its own holes already count); then, when that
  neighbour is a float, the float is asked to open the side facing the short member
  (``_open_short_side``, SGLang's ``_float_open_short_side``). A float short on its own
  alloc flushes the neighbour on each side *(kvref: its schedulable capacity credits both;
  SGLang flushes the low one only, rule* ``float_ladder_low_only`` *)*.
- *(kvref)* The ladder runs only when the alloc then succeeds: ``alloc`` runs it on the
  chain and, when the alloc would still fail, puts every member back as it was, so a failed
  alloc changes no pool. SGLang 0.5.23 runs it whatever the shortfall and before it checks
  the free list, and keeps what it did (rule ``ladder_flushes_when_short``).
- A closed move gate (``set_gate``) makes an END member's flush move nothing and wait on
  nothing (fired pending sources still rejoin its holes), and a float's ``make_room`` and
  ``compact_holes`` do nothing, as SGLang's ``moves_blocked`` does.
- Capacities are memoised on a key of the chain's state (every member's watermark, live
  count, hole and pending counts) and the gates of the neighbours the schedulable view
  credits: SGLang's ``_capacity_epoch`` summed over the chain, plus the gate in
  ``_schedulable_capacity_key``. A memoised value always equals a fresh recompute
  (``kvref.invariants.check_chain``).
- ``feature_log``: what the chain did, for the guided track (which rung ran and the gate it
  met, the gate at each flush, the frontier distance after each op, what a float did).
"""

from __future__ import annotations

import copy

from .errors import ContractViolation

# A member's attributes that are its make-up, not its state (a ladder undone leaves them be).
_STRUCTURE = frozenset({"config", "rules", "chain", "frontier_room", "gate_open", "pool"})


class MemberCalls:
    """The per-pool calls a chain hands to the member as they are: every chain (kvref's, the
    device's, an adapter of another allocator's) supplies ``member(pool)``, ``is_float(pool)`` and
    ``gates``, and overrides what it does more than pass on."""

    def free(self, pool: int, tokens) -> None:
        self.member(pool).free(tokens)

    def flush(self, pool: int, urgent: bool = False) -> None:
        self.member(pool).flush(urgent)

    def _float(self, pool: int, what: str):
        m = self.member(pool)
        if not self.is_float(pool):
            raise ContractViolation(f"{what}: pool {pool} is an END pool; only a float ({what}) moves on demand")
        return m

    def make_room(self, pool: int, side: str, min_bytes: int) -> int:
        """A float's ``make_room``: the bytes open on ``side`` afterwards."""
        return self._float(pool, "make_room").make_room(side, min_bytes)

    def compact(self, pool: int, retreat_side: str) -> int:
        """A float's ``compact_holes``: the pages it moved."""
        return self._float(pool, "compact_holes").compact_holes(retreat_side)

    def forward(self, pool: int, tokens) -> None:
        self.member(pool).forward(tokens)

    def fire(self, pool: int) -> None:
        self.member(pool).fire()

    def write(self, pool: int, tokens, stamps) -> None:
        self.member(pool).write(tokens, stamps)

    def read(self, pool: int, tokens) -> list[int]:
        return self.member(pool).read(tokens)

    def set_gate(self, pool: int, open_: bool) -> None:
        self.member(pool)
        if not isinstance(open_, bool):
            raise ContractViolation(f"set_gate: open must be a bool, got {open_!r}")
        self.gates[pool] = open_


class Chain(MemberCalls):
    """The members of one chain; ``owner`` (a ``kvref.Allocator`` whose config has a
    ``chain``) is member 0 and builds its peers (``owner.peer``) under its rules."""

    def __init__(self, owner):
        cc = owner.config.chain
        self.total_bytes = cc.total_bytes
        self.bytes_per_page = cc.bytes_per_page
        self.members = [owner, *(owner.peer(peer) for peer in cc.peers)]
        self.rules = owner.rules
        self.gates = [True] * len(self.members)
        self._memo: dict[tuple, tuple] = {}
        self.feature_log: list[str] = []
        for i, m in enumerate(self.members):
            m.pool = i
            m.chain = self
            if not m.config.is_float:
                m.frontier_room = (lambda i=i: self.gap(i) // self.bytes_per_page[i])
            m.gate_open = (lambda i=i: self.gates[i])

    def note(self, event: str) -> None:
        self.feature_log.append(event)

    # ---- geometry ---------------------------------------------------------------------
    def member(self, pool: int):
        if not isinstance(pool, int) or isinstance(pool, bool) or not 0 <= pool < len(self.members):
            raise ContractViolation(f"pool {pool!r}: the chain has {len(self.members)} member(s), 0..{len(self.members) - 1}")
        return self.members[pool]

    def is_float(self, i: int) -> bool:
        return self.members[i].config.is_float

    def transparent(self, i: int) -> bool:
        return self.is_float(i) and self.members[i].transparent()

    def frontiers(self, i: int) -> tuple[int, int]:
        """Member i's byte span ``[low, high)``."""
        m, epp = self.members[i], self.bytes_per_page[i]
        c = m.config
        if c.is_float:
            return m.low * epp, m.high * epp
        if c.grow == "up":
            return c.min_page * epp, m.watermark * epp
        return (m.watermark + 1) * epp, c.num_pages * epp

    def _nearest(self, i: int, step: int) -> int | None:
        j = i + step
        while 0 <= j < len(self.members) and self.transparent(j):
            j += step
        return j if 0 <= j < len(self.members) else None

    def above(self, i: int) -> int | None:
        """The nearest member above i that is not transparent."""
        return self._nearest(i, 1)

    def below(self, i: int) -> int | None:
        return self._nearest(i, -1)

    def above_low(self, i: int) -> int:
        j = self.above(i)
        return self.total_bytes if j is None else self.frontiers(j)[0]

    def below_high(self, i: int) -> int:
        j = self.below(i)
        return 0 if j is None else self.frontiers(j)[1]

    def neighbour(self, i: int) -> int | None:
        """The member on i's growth side (up: above it; down: below it; a float: below it, as
        SGLang's growth side of a float is), not transparent, if any."""
        return self.above(i) if self.members[i].config.grow == "up" else self.below(i)

    def gap(self, i: int) -> int:
        """Bytes between member i's growth frontier and the facing one (or the buffer's end);
        a float's larger side."""
        if self.is_float(i):
            return max(self.members[i].gaps()) * self.bytes_per_page[i]
        low, high = self.frontiers(i)
        if self.members[i].config.grow == "up":
            return max(0, self.above_low(i) - high)
        return max(0, low - self.below_high(i))

    def region(self, i: int) -> tuple[int, int]:
        """A float's page bounds ``[lo, hi)`` between its neighbours (rounded inward)."""
        c, epp = self.members[i].config, self.bytes_per_page[i]
        return max(-(-self.below_high(i) // epp), c.min_page), min(self.above_low(i) // epp, c.num_pages)

    def drainable(self, j: int | None) -> int:
        """Bytes an urgent flush of member j would release for certain: its holes, when it is a
        lazy END pool whose gate is open."""
        if j is None or not self.members[j].config.lazy or not self.gates[j]:
            return 0
        return len(self.members[j].holes) * self.bytes_per_page[j]

    def credit(self, i: int) -> int:
        return self.drainable(self.neighbour(i))

    def _tokens(self, i: int, schedulable: bool) -> int:
        m, epp = self.members[i], self.bytes_per_page[i]
        if self.is_float(i):
            gap_low, gap_high = m.gaps()
            if schedulable:
                gap_low += self.drainable(self.below(i)) // epp
                gap_high += self.drainable(self.above(i)) // epp
            return (min(max(gap_low, gap_high), m.index_room()) + len(m.holes)) * m.config.page_size
        gap = self.gap(i) + (self.credit(i) if schedulable else 0)
        pages = min(gap // epp, m.index_room())
        return (pages + (len(m.holes) if m.config.lazy else 0)) * m.config.page_size

    def fresh(self, i: int) -> tuple[int, int, int]:
        """(available, schedulable, joint), recomputed."""
        return self._tokens(i, False), self._tokens(i, True), self.joint()

    def joint(self) -> int:
        shown = [i for i in range(len(self.members)) if not self.transparent(i)]
        bands = sum(max(0, self.frontiers(b)[0] - self.frontiers(a)[1]) for a, b in zip(shown, shown[1:]))
        if len(shown) == 1:  # a chain of one: the bytes above it
            bands = max(0, self.total_bytes - self.frontiers(0)[1])
        return bands + sum(len(m.holes) * self.bytes_per_page[i] for i, m in enumerate(self.members))

    def state_key(self) -> tuple:
        return tuple((m.low, m.high, len(m.holes)) if m.config.is_float else
                     (m.watermark, m.live_pages, len(m.holes), sum(len(p) for _, p in m.pending))
                     for m in self.members)

    def memo_key(self, i: int) -> tuple:
        credited = (self.below(i), self.above(i)) if self.is_float(i) else (self.neighbour(i),)
        return i, self.state_key(), tuple(None if j is None else self.gates[j] for j in credited)

    def capacity(self, pool: int) -> list[int]:
        """``[available, schedulable, joint]`` of ``pool``, memoised on ``memo_key``."""
        self.member(pool)
        key = self.memo_key(pool)
        if key not in self._memo:
            self._memo = {k: v for k, v in self._memo.items() if k[1] == key[1]}
            self._memo[key] = self.fresh(pool)
        return list(self._memo[key])

    def memo(self) -> dict[tuple, tuple]:
        return dict(self._memo)

    # ---- alloc and the relief ladder ----------------------------------------------------
    def alloc(self, pool: int, n_tokens: int):
        m = self.member(pool)
        if not isinstance(n_tokens, int) or isinstance(n_tokens, bool) or n_tokens % m.config.page_size \
                or n_tokens <= 0:
            return m.alloc(n_tokens)  # its refusals, or its empty result
        always = "ladder_flushes_when_short" in self.rules
        if not always and n_tokens // m.config.page_size > len(m.free_virtual):
            return None
        relieved = n_tokens > self.capacity(pool)[0]
        if relieved and not self._relieve_for(pool, n_tokens, keep=always):
            self.note("alloc|short")
            return None
        self.note("alloc|" + ("relieved" if relieved else "direct"))
        out = m.alloc(n_tokens)
        assert out is not None or always, "chain alloc: the relief ladder left the pool short"
        self._note_frontier(pool)
        return out

    def _relieve_for(self, pool: int, n_tokens: int, keep: bool) -> bool:
        """The ladder for an alloc of ``n_tokens``; whether the pool then has the room. Unless
        ``keep``, a ladder that leaves it short is undone on every member."""
        saved = None if keep else self._save()
        self._ladder(pool, n_tokens)
        if n_tokens <= self.capacity(pool)[0]:
            return True
        if saved is not None:
            self._restore(saved)
        return False

    def _ladder(self, pool: int, n_tokens: int) -> None:
        self.relieve(pool)
        if n_tokens > self.capacity(pool)[0]:
            j = self.neighbour(pool)
            if not self.is_float(pool) and j is not None and self.is_float(j):
                self.note("ladder|make_room")
                self._open_short_side(j, {pool: -(-n_tokens // self.members[pool].config.page_size)})

    def flush_targets(self, pool: int) -> list[int]:
        if not self.is_float(pool) or "float_ladder_low_only" in self.rules:
            return [j for j in (self.neighbour(pool),) if j is not None]
        return [j for j in (self.below(pool), self.above(pool)) if j is not None]

    def relieve(self, pool: int) -> None:
        """The relief ladder's first rung: an urgent flush of ``pool``'s growth-side neighbour
        (both neighbours of a float)."""
        self.member(pool)
        targets = self.flush_targets(pool)
        if not targets:
            self.note("ladder|none")
        for j in targets:
            kind = "float" if self.is_float(j) else "neighbour"
            self.note(f"ladder|{kind}|gate={'open' if self.gates[j] else 'closed'}")
            self.flush(j, True)

    def _open_short_side(self, f: int, demand: dict[int, int]) -> None:
        """SGLang's ``_float_open_short_side``: ask the float ``f`` to open the side facing the
        bands short of pages (``demand``: pages per member), or nothing when it cannot help."""
        flt = self.members[f]
        if flt.transparent() or not any(p > 0 for p in demand.values()):
            return
        for i, pages in demand.items():
            m = self.members[i]
            allocated = m.live_pages if self.is_float(i) else len(m.span())
            if pages > 0 and pages > m.config.num_pages - m.config.min_page - allocated:
                return  # its index space binds: bytes cannot fix that
        sides = {"low": 0, "high": 0}
        for i, pages in demand.items():
            if i == f or pages <= 0:
                continue
            m = self.members[i]
            ext = max(0, pages - (len(m.holes) if m.config.lazy else 0))
            sides["high" if m.config.grow == "down" else "low"] += ext * self.bytes_per_page[i]
        low, high = self.frontiers(f)
        band = {"low": max(0, low - self.below_high(f)), "high": max(0, self.above_low(f) - high)}
        surplus = {s: band[s] - sides[s] for s in sides}
        f_bytes = max(0, demand.get(f, 0) - len(flt.holes)) * self.bytes_per_page[f]
        slack = max(self.bytes_per_page[i] for i, p in demand.items() if p > 0)
        if surplus["low"] < 0 and surplus["high"] < 0:
            return  # opening one side closes the other
        if surplus["low"] < 0 or surplus["high"] < 0:
            short, far = ("low", "high") if surplus["low"] < 0 else ("high", "low")
            target = sides[short] + max(0, f_bytes - max(0, surplus[far])) + slack
            if target > band[short]:
                flt.make_room(short, target)
            return
        if f_bytes > max(surplus.values()):
            short = "low" if surplus["low"] >= surplus["high"] else "high"
            flt.make_room(short, sides[short] + f_bytes + slack)

    def _save(self) -> tuple:
        states = copy.deepcopy([{k: v for k, v in vars(m).items() if k not in _STRUCTURE} for m in self.members])
        return states, dict(self._memo), len(self.feature_log)

    def _restore(self, saved: tuple) -> None:
        states, self._memo, n_log = saved
        for m, state in zip(self.members, states):
            vars(m).update(state)
        del self.feature_log[n_log:]

    # ---- the other ops (the rest: MemberCalls) ---------------------------------------------
    def flush(self, pool: int, urgent: bool = False) -> None:
        m = self.member(pool)
        moved = len(m.holes) + sum(len(p) for _, p in m.pending)
        if self.is_float(pool):  # absorbs its edges, urgent or not, whatever its gate
            self.note(f"float|flush|{'holes' if moved else 'none'}")
        else:
            self.note(f"flush|{'urgent' if urgent else 'lazy'}|gate={'open' if self.gates[pool] else 'closed'}"
                      f"|{'holes' if moved else 'none'}")
        m.flush(urgent)
        self._note_frontier(pool)

    def make_room(self, pool: int, side: str, min_bytes: int) -> int:
        out = super().make_room(pool, side, min_bytes)
        self._note_frontier(pool)
        return out

    def _note_frontier(self, pool: int) -> None:
        gap = self.gap(pool) // self.bytes_per_page[pool]
        self.note("frontier|" + ("0" if gap == 0 else "1" if gap == 1 else "2-4" if gap <= 4 else "5+"))

    def snapshot(self) -> dict:
        """Every member's snapshot (SPEC §1's form; a float's watermark is ``[low, high]``) and
        the gates."""
        return {"pools": [m.snapshot() for m in self.members], "gates": list(self.gates)}
