"""docs/spec.md §6: a chain of END pools over one byte buffer, as plain Python.

SPEC §1-§4 describe one pool with its own index room. In a unified memory pool the pools
are a chain over one byte buffer: member 0 grows up from byte 0, member 1 grows down from
the top, each with its own bytes per page, tables, holes, pending pages and watermark. A
member's room is the gap to its neighbour's byte frontier as well as its index room; an
alloc that falls short asks the neighbour on its growth side for an urgent flush (the
relief ladder); a neighbour's holes count toward *schedulable* capacity only while its
move gate is open; capacities are memoised on the chain's state.

Rules, SGLang 0.5.23's (``unified_sub_pool.py``) unless said otherwise:

- Byte frontiers (``frontiers``): grow up ``[min * epp, wm * epp)``, grow down
  ``[(wm + 1) * epp, num_pages * epp)``; the gap of a member is the bytes from its growth
  frontier to the neighbour's facing frontier (or the buffer's end), floored at 0.
- ``available(i) = (min(gap // epp, index_room) + holes) * ps`` (holes only when lazy);
  ``schedulable(i)`` is the same with the growth-side neighbour's holes' bytes added to the
  gap, when that neighbour is lazy and its gate is open.
- ``joint()``: the bytes the chain could still hand out, each free band counted once,
  plus every lazy member's holes (two members see the same band: summing each member's
  gap counts it twice).
- The relief ladder (``relieve``): an urgent flush of the growth-side neighbour, never of
  the short pool itself (its own holes already count). No float pool is modelled, so the
  ladder has one rung.
- *(kvref)* ``alloc(i, n)`` runs the ladder only when ``n <= schedulable(i)``, when the
  neighbour's urgent flush is sure to make the room; otherwise it fails with nothing changed
  anywhere in the chain. SGLang 0.5.23 flushes the neighbour first whatever the
  shortfall, so a failed alloc there may leave the neighbour compacted.
- A closed move gate (``set_gate``) makes a member's flush move nothing and wait on nothing
  (fired pending sources still rejoin its holes), as SGLang's ``moves_blocked`` does.
- Capacities are memoised on a key of the chain's state (every member's watermark, live
  count, hole and pending counts) and, for the schedulable view, the neighbour's gate:
  SGLang's ``_capacity_epoch`` summed over the chain, plus the gate in
  ``_schedulable_capacity_key``. A memoised value always equals a fresh recompute
  (``kvref.invariants.check_chain``).
- ``feature_log``: what the chain did, for the guided track (which rung ran, the gate at
  each flush, the frontier distance after each op).
"""

from __future__ import annotations

from .errors import ContractViolation


class Chain:
    """The members of one chain; ``owner`` (a ``kvref.Allocator`` whose config has a
    ``chain``) is member 0 and builds its peers of its own type."""

    def __init__(self, owner):
        cc = owner.config.chain
        self.total_bytes = cc.total_bytes
        self.bytes_per_page = cc.bytes_per_page
        self.members = [owner, *(type(owner)(peer) for peer in cc.peers)]
        self.gates = [True] * len(self.members)
        self._memo: dict[tuple, tuple] = {}
        self.feature_log: list[str] = []
        for i, m in enumerate(self.members):
            m.pool = i
            m.chain = self
            m.frontier_room = (lambda i=i: self.gap(i) // self.bytes_per_page[i])
            m.gate_open = (lambda i=i: self.gates[i])

    # ---- geometry ---------------------------------------------------------------------
    def member(self, pool: int):
        if not isinstance(pool, int) or isinstance(pool, bool) or not 0 <= pool < len(self.members):
            raise ContractViolation(f"pool {pool!r}: the chain has {len(self.members)} member(s), 0..{len(self.members) - 1}")
        return self.members[pool]

    def frontiers(self, i: int) -> tuple[int, int]:
        """Member i's byte span ``[low, high)``."""
        m, epp = self.members[i], self.bytes_per_page[i]
        c = m.config
        if c.grow == "up":
            return c.min_page * epp, m.watermark * epp
        return (m.watermark + 1) * epp, c.num_pages * epp

    def neighbour(self, i: int) -> int | None:
        """The member on i's growth side (up: above it; down: below it), if any."""
        j = i + 1 if self.members[i].config.grow == "up" else i - 1
        return j if 0 <= j < len(self.members) else None

    def gap(self, i: int) -> int:
        """Bytes between member i's growth frontier and the facing one (or the buffer's end)."""
        j = self.neighbour(i)
        low, high = self.frontiers(i)
        if self.members[i].config.grow == "up":
            return max(0, (self.total_bytes if j is None else self.frontiers(j)[0]) - high)
        return max(0, low - (0 if j is None else self.frontiers(j)[1]))

    def credit(self, i: int) -> int:
        """Bytes an urgent flush of i's neighbour would release: its holes, if it may move."""
        j = self.neighbour(i)
        if j is None or not self.members[j].config.lazy or not self.gates[j]:
            return 0
        return len(self.members[j].holes) * self.bytes_per_page[j]

    def _tokens(self, i: int, gap_bytes: int) -> int:
        m = self.members[i]
        pages = min(gap_bytes // self.bytes_per_page[i], m.index_room())
        return (pages + (len(m.holes) if m.config.lazy else 0)) * m.config.page_size

    def fresh(self, i: int) -> tuple[int, int, int]:
        """(available, schedulable, joint), recomputed."""
        return self._tokens(i, self.gap(i)), self._tokens(i, self.gap(i) + self.credit(i)), self.joint()

    def joint(self) -> int:
        bands = {}
        for i in range(len(self.members)):
            j = self.neighbour(i)
            bands[tuple(sorted((i, j if j is not None else -1 - i)))] = self.gap(i)
        holes = sum(len(m.holes) * self.bytes_per_page[i] for i, m in enumerate(self.members) if m.config.lazy)
        return sum(bands.values()) + holes

    def state_key(self) -> tuple:
        return tuple((m.watermark, m.live_pages, len(m.holes), sum(len(p) for _, p in m.pending))
                     for m in self.members)

    def memo_key(self, i: int) -> tuple:
        j = self.neighbour(i)
        return i, self.state_key(), None if j is None else self.gates[j]

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

    # ---- the ops ------------------------------------------------------------------------
    def alloc(self, pool: int, n_tokens: int):
        m = self.member(pool)
        if not isinstance(n_tokens, int) or isinstance(n_tokens, bool) or n_tokens % m.config.page_size \
                or n_tokens <= 0:
            return m.alloc(n_tokens)  # its refusals, or its empty result
        if n_tokens // m.config.page_size > len(m.free_virtual):
            return None
        available, schedulable, _ = self.capacity(pool)
        if n_tokens > available:
            if n_tokens > schedulable:
                self.feature_log.append("alloc|short")
                return None
            self.relieve(pool)
        self.feature_log.append("alloc|" + ("relieved" if n_tokens > available else "direct"))
        out = m.alloc(n_tokens)
        assert out is not None, "chain alloc: the relief ladder left the pool short"
        self._note_frontier(pool)
        return out

    def relieve(self, pool: int) -> None:
        """The relief ladder's rung: an urgent flush of ``pool``'s growth-side neighbour."""
        self.member(pool)
        j = self.neighbour(pool)
        if j is None:
            self.feature_log.append("ladder|none")
            return
        self.feature_log.append(f"ladder|neighbour|gate={'open' if self.gates[j] else 'closed'}")
        self.flush(j, True)

    def free(self, pool: int, tokens) -> None:
        self.member(pool).free(tokens)

    def flush(self, pool: int, urgent: bool = False) -> None:
        m = self.member(pool)
        moved = len(m.holes) + sum(len(p) for _, p in m.pending)
        self.feature_log.append(f"flush|{'urgent' if urgent else 'lazy'}|gate={'open' if self.gates[pool] else 'closed'}"
                                f"|{'holes' if moved else 'none'}")
        m.flush(urgent)
        self._note_frontier(pool)

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

    def _note_frontier(self, pool: int) -> None:
        gap = self.gap(pool) // self.bytes_per_page[pool]
        self.feature_log.append("frontier|" + ("0" if gap == 0 else "1" if gap == 1 else "2-4" if gap <= 4 else "5+"))

    def snapshot(self) -> dict:
        """Every member's snapshot (SPEC §1's form) and the gates."""
        return {"pools": [m.snapshot() for m in self.members], "gates": list(self.gates)}
