"""DeviceChain: docs/spec.md §6's chain of END pools over one byte buffer, on DeviceAllocators.

Member 0 is the ``DeviceAllocator`` whose config has the ``chain``; it builds this chain,
which builds the peers (members 1..) of the same class, their tables from the same
``buffers`` factory under a ``poolI.`` prefix (so a harness's red zones tell them apart).

Why it is shaped this way:
- Everything the chain decides (gaps, capacities, the relief ladder) is host arithmetic
  over each member's host ints (watermark, live count, hole and pending counts): a chain
  op adds no device read to the members' own ops, and the lazy free path stays free of
  synchronisation (SPEC §5).
- Capacities are memoised on a key of that host state and, for the schedulable view, the
  growth-side neighbour's gate, so a memo is never read across a change it depends on
  (SGLang 0.5.23 keys its memo on a chain-wide epoch plus the gate, for the same reason).
- The chain interface (``alloc``, ``free``, ``flush``, ``forward``, ``fire``, ``write``,
  ``read``, ``set_gate``, ``relieve``, ``capacity``, ``snapshot``, each naming its pool) is
  the one a team's chain is driven through (docs/allocators.md).
"""

from __future__ import annotations

from kvref.errors import ContractViolation


def _prefixed(buffers, prefix: str):
    def make(name: str, rows: int, fill: int, row_len: int = 1):
        return buffers(prefix + name, rows, fill, row_len)
    return make


class DeviceChain:
    def __init__(self, owner):
        cc = owner.config.chain
        self.total_bytes = cc.total_bytes
        self.bytes_per_page = cc.bytes_per_page
        peers = [type(owner)(peer, owner.kernels, owner.device, owner.checked, _prefixed(owner.buffers, f"pool{i}."))
                 for i, peer in enumerate(cc.peers, 1)]
        self.members = [owner, *peers]
        self.gates = [True] * len(self.members)
        self._memo: dict[tuple, tuple] = {}
        for i, m in enumerate(self.members):
            m.pool = i
            m.chain = self
            m.frontier_room = (lambda i=i: self.frontier_pages(i))
            m.gate_open = (lambda i=i: self.gates[i])

    # ---- geometry, from host state --------------------------------------------------------
    def member(self, pool: int):
        if not isinstance(pool, int) or isinstance(pool, bool) or not 0 <= pool < len(self.members):
            raise ContractViolation(f"pool {pool!r}: the chain has {len(self.members)} member(s), 0..{len(self.members) - 1}")
        return self.members[pool]

    def frontiers(self, i: int) -> tuple[int, int]:
        m, epp = self.members[i], self.bytes_per_page[i]
        if m.up:
            return m.config.min_page * epp, m.watermark * epp
        return (m.watermark + 1) * epp, m.config.num_pages * epp

    def neighbour(self, i: int) -> int | None:
        j = i + 1 if self.members[i].up else i - 1
        return j if 0 <= j < len(self.members) else None

    def gap(self, i: int) -> int:
        j = self.neighbour(i)
        low, high = self.frontiers(i)
        if self.members[i].up:
            return max(0, (self.total_bytes if j is None else self.frontiers(j)[0]) - high)
        return max(0, low - (0 if j is None else self.frontiers(j)[1]))

    def frontier_pages(self, i: int, extra: int = 0) -> int:
        """Pages of member i the bytes up to the facing frontier hold (``extra`` bytes more)."""
        return (self.gap(i) + extra) // self.bytes_per_page[i]

    def _holes(self, i: int) -> int:
        m = self.members[i]
        return m.holes.numel() if m.config.lazy else 0

    def credit(self, i: int) -> int:
        j = self.neighbour(i)
        if j is None or not self.members[j].config.lazy or not self.gates[j]:
            return 0
        return self._holes(j) * self.bytes_per_page[j]

    def _tokens(self, i: int, extra: int) -> int:
        m = self.members[i]
        index_room = m.config.capacity_pages - len(m._span())
        return (min(self.frontier_pages(i, extra), index_room) + self._holes(i)) * m.config.page_size

    def joint(self) -> int:
        bands = {}
        for i in range(len(self.members)):
            j = self.neighbour(i)
            bands[tuple(sorted((i, j if j is not None else -1 - i)))] = self.gap(i)
        holes = sum(self._holes(i) * self.bytes_per_page[i] for i in range(len(self.members)))
        return sum(bands.values()) + holes

    def state_key(self) -> tuple:
        return tuple((m.watermark, m.live_pages, m.holes.numel(), sum(p.numel() for _, p in m.pending))
                     for m in self.members)

    def memo_key(self, i: int) -> tuple:
        j = self.neighbour(i)
        return i, self.state_key(), None if j is None else self.gates[j]

    def capacity(self, pool: int) -> list[int]:
        """``[available, schedulable, joint]`` of ``pool`` (tokens, tokens, bytes), memoised."""
        self.member(pool)
        key = self.memo_key(pool)
        if key not in self._memo:
            self._memo = {k: v for k, v in self._memo.items() if k[1] == key[1]}
            self._memo[key] = (self._tokens(pool, 0), self._tokens(pool, self.credit(pool)), self.joint())
        return list(self._memo[key])

    # ---- the ops ----------------------------------------------------------------------------
    def alloc(self, pool: int, n_tokens: int):
        m = self.member(pool)
        if not isinstance(n_tokens, int) or isinstance(n_tokens, bool) or n_tokens % m.config.page_size \
                or n_tokens <= 0:
            return m.alloc(n_tokens)
        if n_tokens // m.config.page_size > m.free_virtual.numel():
            return None
        available, schedulable, _ = self.capacity(pool)
        if n_tokens > available:
            if n_tokens > schedulable:
                return None
            self.relieve(pool)
        return m.alloc(n_tokens)

    def relieve(self, pool: int) -> None:
        """The relief ladder: an urgent flush of ``pool``'s growth-side neighbour."""
        self.member(pool)
        j = self.neighbour(pool)
        if j is not None:
            self.flush(j, True)

    def free(self, pool: int, tokens) -> None:
        self.member(pool).free(tokens)

    def flush(self, pool: int, urgent: bool = False) -> None:
        self.member(pool).flush(urgent)

    def forward(self, pool: int, tokens) -> None:
        self.member(pool).forward(tokens)

    def fire(self, pool: int) -> None:
        self.member(pool).fire()

    def write(self, pool: int, tokens, stamps) -> None:
        self.member(pool).write(tokens, stamps)

    def read(self, pool: int, tokens):
        return self.member(pool).read(tokens)

    def set_gate(self, pool: int, open_: bool) -> None:
        self.member(pool)
        if not isinstance(open_, bool):
            raise ContractViolation(f"set_gate: open must be a bool, got {open_!r}")
        self.gates[pool] = open_

    def snapshot(self) -> dict:
        return {"pools": [m.snapshot() for m in self.members], "gates": list(self.gates)}
