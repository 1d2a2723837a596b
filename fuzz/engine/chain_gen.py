"""The chain generator: configs of pools over one byte buffer, and chain op sequences.

Every fifth seed is a chain seed (``is_chain_seed``), interleaved with the others so a short
campaign meets both. Its chain config and scenario come from an RNG of their own
(``chain_params``), so its op stream's RNG is the one the seed had before chains existed, and
an allocator without chains runs the seed's single pool instead, exactly as before
(``generate.sequence_params``). A chain sequence aims at what only a chain has (docs/spec.md
§6): allocs sized at the pool's available and schedulable capacity and one page past them,
so the frontiers meet and the relief ladder runs; move gates toggled between allocs and
flushes; holes made on one side while the other is short; with a float between the ends,
its holes, its moves on demand and the ladder's second rung. Like ``generate.OpGenerator`` it
reads only the spec (``spec.chain``).

The configs are ones a server builds (SGLang's ``UnifiedKVPool``): every member's reserved
floor is the shared padding sink (``ChainConfig.min_page_for``), and the KV members share one
page size while a state member (a Mamba-like pool) may have pages of one slot.
"""

from __future__ import annotations

import random

import kvref
from kvref.config import ChainConfig

from . import shapes
from .chain_ops import (
    LAYOUTS,
    ChainAlloc,
    ChainCapacity,
    ChainCompact,
    ChainFire,
    ChainFlush,
    ChainForward,
    ChainFree,
    ChainGate,
    ChainMakeRoom,
    ChainOp,
    ChainRead,
    ChainRelieve,
    ChainWrite,
    layouts_of,
)

CHAIN_EVERY = 5  # every fifth seed is a chain seed
CHAIN_SCENARIOS = {
    #                alloc free flush fwd fire gate relieve capacity write read room (a float's moves)
    "chain-meet":   (40, 15, 6, 4, 4, 6, 5, 10, 6, 4, 4),
    "chain-gates":  (25, 18, 10, 5, 5, 18, 6, 8, 3, 2, 6),
    "chain-holes":  (30, 28, 8, 4, 4, 8, 8, 6, 2, 2, 8),
}
KINDS = ("alloc", "free", "flush", "forward", "fire", "gate", "relieve", "capacity", "write", "read", "room")
# What the guided track learns of a chain (kvref.chain.Chain.feature_log), as ``chain|...``
# features; ``kvfuzz coverage`` names those of this list a corpus never reached.
CHAIN_FEATURES = tuple(
    ["alloc|direct", "alloc|relieved", "alloc|short", "ladder|neighbour|gate=open", "ladder|neighbour|gate=closed"]
    + [f"flush|{u}|gate={g}|{h}" for u in ("lazy", "urgent") for g in ("open", "closed") for h in ("holes", "none")]
    + [f"frontier|{b}" for b in ("0", "1", "2-4", "5+")])
# What only a chain with a float reaches (kvref.float_pool, kvref.chain): listed apart, so a
# corpus kept against an allocator without floats is not told it never reached them.
FLOAT_FEATURES = (
    "ladder|float|gate=open", "ladder|float|gate=closed", "ladder|make_room", "float|alloc|midpoint",
    "float|alloc|extend high", "float|alloc|extend low",
    "float|alloc|extend high+holes", "float|alloc|extend low+holes", "float|alloc|holes", "float|park",
    "float|flush|holes", "float|flush|none", "float|absorb", "make_room|moved", "make_room|moved+fresh",
    "make_room|leapfrog", "make_room|open already", "make_room|impossible", "make_room|no far room",
    "make_room|gated", "compact|moved", "compact|gated", "compact|no holes")


def is_chain_seed(seed: int) -> bool:
    return seed % CHAIN_EVERY == CHAIN_EVERY - 1


def chain_params(seed: int, layouts=LAYOUTS) -> tuple[kvref.PoolConfig, str]:
    """A chain seed's config and scenario, from an RNG of the seed's own (not its op stream's)."""
    rng = random.Random(seed * 7_919 + 0xC4A1)
    return random_chain_config(rng, layouts), rng.choice(sorted(CHAIN_SCENARIOS))


def random_chain_config(rng: random.Random, layouts=LAYOUTS) -> kvref.PoolConfig:
    """Two END pools over one buffer (and, where the allocator builds one, a float between
    them), each with its own bytes per page and mode, and page sizes as a server has them:
    the KV members' one page size, a state member's of one slot."""
    layouts = layouts_of(layouts) or ("two",)
    layout = layouts[0] if len(layouts) == 1 else rng.choice(layouts)
    if layout == "float":
        epp = rng.choice(((2, 3, 2), (3, 2, 4), (2, 2, 2), (4, 3, 2), (2, 4, 3), (1, 2, 1)))
    else:
        epp = rng.choice(((1, 1), (2, 3), (3, 2), (2, 2), (4, 3), (2, 5)))
    total = rng.choice((24, 36, 48, 60)) * max(epp) // 2
    kv_page = rng.choice((1, 1, 2, 4))
    grows = ChainConfig.LAYOUTS[len(epp)]
    sink = max(epp)

    def member(i: int) -> kvref.PoolConfig:
        is_float = grows[i] == "float"
        state = not is_float and rng.random() < 0.2  # pages of one slot, beside KV pages of kv_page
        return kvref.PoolConfig(num_pages=total // epp[i], min_page=-(-sink // epp[i]),
                                page_size=1 if state else kv_page, grow=grows[i],
                                lazy=not is_float and rng.random() < 0.85, multiplier=rng.choice((1, 2)),
                                max_moves=rng.choice((0, 1, 2, 4, 64)))

    first, *peers = [member(i) for i in range(len(epp))]
    chain = ChainConfig(total, epp, tuple(peers))
    return kvref.PoolConfig(**{**first.to_json(), "chain": chain})


class ChainGenerator:
    """``next_op(spec)``, ``observe(op, outcome)`` and ``last_violation``, as ``OpGenerator``."""

    def __init__(self, rng: random.Random, config: kvref.PoolConfig, scenario: str, contract_rate: float = 0.03):
        self.rng, self.ch = rng, shapes.RandomChooser(rng)
        self.config, self.scenario = config, scenario
        self.weights = CHAIN_SCENARIOS.get(scenario, CHAIN_SCENARIOS["chain-meet"])
        self.contract_rate = contract_rate
        self.members = config.members
        self.live: list[list[list[int]]] = [[] for _ in self.members]
        self.dead: list[list[list[int]]] = [[] for _ in self.members]
        self.stamp = 1
        self.violations: dict[str, int] = {}
        self.last_violation: str | None = None
        self._kept: list[int] | None = None

    def observe(self, op, outcome) -> None:
        if outcome.error is not None or not isinstance(op, ChainOp):
            self._kept = None
            return
        if isinstance(op, ChainAlloc) and outcome.result:
            self.live[op.pool].append(list(outcome.result))
        elif isinstance(op, ChainFree):
            gone = set(op.tokens)
            ps = self.members[op.pool].page_size
            self.dead[op.pool] = (self.dead[op.pool] + [shapes.whole_pages(op.tokens, ps)])[-8:]
            self.live[op.pool] = [r for r in self.live[op.pool] if gone.isdisjoint(r)]
            if self._kept:
                self.live[op.pool].append(self._kept)
        self._kept = None

    def next_op(self, spec: kvref.Allocator) -> ChainOp:
        chain, ch = spec.chain, self.ch
        self.last_violation = None
        if self.rng.random() < self.contract_rate:
            op = self._violation(chain)
            if op is not None:
                return op
        pool = ch.integer(0, len(self.members) - 1)
        kinds, weights = KINDS, self.weights
        if not any(m.is_float for m in self.members):
            kinds, weights = KINDS[:-1], weights[:-1]  # no float: nothing moves on demand
        return getattr(self, f"_gen_{ch.weighted(kinds, weights)}")(chain, pool)

    def _violation(self, chain):
        """A double free of a run whose pages are all unbound, or a pool the chain lacks."""
        for pool in self.ch.permutation(range(len(self.members))):
            m, ps = chain.members[pool], self.members[pool].page_size
            dead = [r for r in self.dead[pool] if r and all(m.v2p[t // ps] == -1 for t in r[::ps])]
            if dead:
                self.last_violation = "chain_double_free"
                return ChainFree(pool, tuple(dead[-1]))
        self.last_violation = "chain_no_such_pool"
        return ChainAlloc(len(self.members), self.members[0].page_size)

    def _tokens(self, pool: int) -> list[int]:
        return [t for r in self.live[pool] for t in r]

    # ---- one builder per kind ------------------------------------------------------------
    def _gen_alloc(self, chain, pool):
        ps = self.members[pool].page_size
        available, schedulable, _ = chain.fresh(pool)
        r = self.rng.random()
        if r < 0.3:
            n = available
        elif r < 0.45:
            n = available + ps
        elif r < 0.6:
            n = schedulable
        elif r < 0.7:
            n = schedulable + ps
        else:
            n = ps * self.ch.integer(1, max(1, min(8, available // ps + 1)))
        return ChainAlloc(pool, max(n, ps))

    def _gen_free(self, chain, pool):
        live = shapes.freeable(chain.members[pool], self.live[pool])
        if not live:
            return self._gen_alloc(chain, pool)
        op, self._kept = shapes.free_op(self.ch, self.members[pool], live[self.rng.randrange(len(live))])
        return ChainFree(pool, op.tokens)

    def _gen_flush(self, chain, pool):
        return ChainFlush(pool, self.ch.chance(0.4))

    def _gen_forward(self, chain, pool):
        live = self.live[pool]
        reqs = self.ch.subset(live, self.ch.integer(1, min(len(live), 3))) if live else []
        return ChainForward(pool, shapes.forward_op(self.ch, [t for r in reqs for t in r]).tokens)

    def _gen_fire(self, chain, pool):
        return ChainFire(pool)

    def _gen_gate(self, chain, pool):
        return ChainGate(pool, not chain.gates[pool] if self.ch.chance(0.8) else chain.gates[pool])

    def _gen_relieve(self, chain, pool):
        return ChainRelieve(pool)

    def _gen_capacity(self, chain, pool):
        return ChainCapacity(pool)

    def _gen_room(self, chain, pool):
        """A float's moves on demand: ``make_room`` for its side's gap and a page or more past
        it (or past what the region can give), or ``compact_holes``."""
        f = next(i for i, m in enumerate(self.members) if m.is_float)
        side = self.ch.pick(("low", "high"))
        if self.ch.chance(0.25):
            return ChainCompact(f, side)
        epp = chain.bytes_per_page[f]
        gap = chain.members[f].gaps()[("low", "high").index(side)] * epp
        extra = self.ch.pick((0, 1, 1, 2, 3, 8))
        return ChainMakeRoom(f, side, max(1, gap + extra * epp - self.ch.integer(0, epp - 1)))

    def _gen_write(self, chain, pool):
        op = shapes.write_op(self.ch, self._tokens(pool), self.stamp)
        self.stamp += len(op.tokens)
        return ChainWrite(pool, op.tokens, op.stamps)

    def _gen_read(self, chain, pool):
        return ChainRead(pool, shapes.read_op(self.ch, self._tokens(pool)).tokens)
