"""The chain ops: ops on one pool of a chain of pools sharing one byte buffer (docs/spec.md §6).

Each names its pool (``pool``: the member's index, 0 = the config's own pool). They run on
the spec's ``kvref.chain.Chain`` and on the target's chain (``DeviceChain``, or a team's
chain behind the allocator protocol: docs/allocators.md), both reached through pool 0's
allocator (``.chain``). A chain op on a config without a chain is refused by both sides
with a ContractViolation that says so (and a case file holding one is refused on loading:
``check_chain_ops``). After every op that can change a pool, the runner compares every
member's state, the gates, and the chain's invariants (``runner.PoolRun.check_state``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import kvref

from .ops import Alloc, Flush, Ints, OpError, PoolOp, _TokenOp

__all__ = ["CHAIN_KINDS", "LAYOUTS", "ChainOp", "check_chain_ops", "layouts_of"]

LAYOUTS = ("two", "float")  # two END pools; the two ends with a float pool between them (ChainConfig.LAYOUTS)


def layouts_of(chains) -> tuple[str, ...]:
    """The chain layouts an allocator builds, from its ``KVFUZZ_CHAINS`` (True: every one;
    False or None: none; else the layouts it names)."""
    if chains is True:
        return LAYOUTS
    if not chains:
        return ()
    return tuple(x for x in LAYOUTS if x in set(chains))


def _chain(side, kind: str):
    chain = getattr(side, "chain", None)
    if chain is None:
        raise kvref.ContractViolation(f"{kind}: a chain op needs a config with a chain (PoolConfig.chain); "
                                      "this config is a single pool")
    return chain


@dataclass(frozen=True)
class ChainOp(PoolOp):
    """An op on pool ``pool`` of the chain. ``call`` names the chain method, ``args()`` its
    arguments after the pool; the target's tokens and stamps go as guarded tensors."""

    full_check = True
    call = ""

    def args(self, t=None) -> tuple:
        return ()

    def spec(self, s):
        return getattr(_chain(s, self.kind), self.call)(self.pool, *self.args())

    def target(self, t):
        out = getattr(_chain(t.alloc, self.kind), self.call)(self.pool, *self.args(t))
        return out.tolist() if hasattr(out, "tolist") else out

    def shrink(self):
        if self.pool > 0:
            yield dataclasses.replace(self, pool=0)


@dataclass(frozen=True)
class ChainAlloc(ChainOp):
    kind = "chain_alloc"
    call = "alloc"
    pool: int
    n: int

    def args(self, t=None):
        return (self.n,)

    def shrink(self):
        for smaller in Alloc(self.n).shrink():
            yield ChainAlloc(self.pool, smaller.n)

    def merge(self, following):
        if isinstance(following, ChainAlloc) and following.pool == self.pool and self.n > 0 and following.n > 0:
            return ChainAlloc(self.pool, self.n + following.n)
        return None


@dataclass(frozen=True)
class _ChainTokens(ChainOp):
    pool: int
    tokens: Ints

    def args(self, t=None):
        return (list(self.tokens),) if t is None else (t.tokens("tokens", self.tokens),)

    token_ids = _TokenOp.token_ids  # a pool op's tokens, kept and halved as the single pool's are
    shrink = _TokenOp.shrink


@dataclass(frozen=True)
class ChainFree(_ChainTokens):
    kind = "chain_free"
    call = "free"


@dataclass(frozen=True)
class ChainForward(_ChainTokens):
    kind = "chain_forward"
    call = "forward"


@dataclass(frozen=True)
class ChainRead(_ChainTokens):
    kind = "chain_read"
    call = "read"
    full_check = False


@dataclass(frozen=True)
class ChainWrite(ChainOp):
    kind = "chain_write"
    call = "write"
    pool: int
    tokens: Ints
    stamps: Ints

    def args(self, t=None):
        if t is None:
            return list(self.tokens), list(self.stamps)
        return t.tokens("tokens", self.tokens), t.data("stamps", self.stamps)

    def token_ids(self):
        return iter(self.tokens)

    def shrink(self):
        n = len(self.tokens)
        if n > 1:
            yield ChainWrite(self.pool, self.tokens[: n // 2], self.stamps[: n // 2])
            yield ChainWrite(self.pool, self.tokens[:1], self.stamps[:1])


@dataclass(frozen=True)
class ChainFlush(ChainOp):
    kind = "chain_flush"
    call = "flush"
    pool: int
    urgent: bool

    def args(self, t=None):
        return (self.urgent,)

    def shrink(self):
        for less in Flush(self.urgent).shrink():
            yield ChainFlush(self.pool, less.urgent)


@dataclass(frozen=True)
class ChainFire(ChainOp):
    kind = "chain_fire"
    call = "fire"
    pool: int


@dataclass(frozen=True)
class ChainGate(ChainOp):
    """Open or close pool ``pool``'s move gate (SGLang: a callable the disaggregation or
    host-transfer code installs; here kvfuzz decides)."""

    kind = "chain_gate"
    call = "set_gate"
    pool: int
    open: bool

    def args(self, t=None):
        return (self.open,)


@dataclass(frozen=True)
class ChainRelieve(ChainOp):
    """The relief ladder for pool ``pool``, as a short alloc runs it: an urgent flush of its
    growth-side neighbour."""

    kind = "chain_relieve"
    call = "relieve"
    pool: int


@dataclass(frozen=True)
class ChainMakeRoom(ChainOp):
    """A float's ``make_room``: open at least ``bytes`` between its ``side`` edge and its
    neighbour (SGLang's composites call it; the ladder's second rung does too); the result is
    the bytes open there afterwards. On an END pool it is refused (a ContractViolation)."""

    kind = "chain_make_room"
    call = "make_room"
    pool: int
    side: str
    min_bytes: int

    def args(self, t=None):
        return self.side, self.min_bytes

    def shrink(self):
        yield from super().shrink()
        if self.min_bytes > 1:
            yield dataclasses.replace(self, min_bytes=self.min_bytes // 2)


@dataclass(frozen=True)
class ChainCompact(ChainOp):
    """A float's ``compact_holes``: close every hole, packing its live pages away from
    ``side``; the result is the pages moved."""

    kind = "chain_compact"
    call = "compact"
    pool: int
    side: str

    def args(self, t=None):
        return (self.side,)


@dataclass(frozen=True)
class ChainCapacity(ChainOp):
    """``[available, schedulable, joint]`` of pool ``pool`` as the chain reports it: the
    target's memoised values against the spec's (always equal to a fresh recompute). Not
    ``pure``: asking fills the memo a later stale read would come from."""

    kind = "chain_capacity"
    call = "capacity"
    full_check = False
    pool: int


CHAIN_KINDS = tuple(k for k, c in PoolOp.registry.items() if isinstance(c, type) and issubclass(c, ChainOp))


def check_chain_ops(config: kvref.PoolConfig, ops) -> None:
    """Refuse (OpError) chain ops on a config without a chain: such a file was never written by
    a campaign. An op naming a pool the chain lacks is not refused here: the generator emits it
    on purpose (``chain_no_such_pool``, a broken precondition), the spec refuses it when it runs,
    and a case holding it must load and replay like any other."""
    for i, op in enumerate(ops):
        if isinstance(op, ChainOp) and config.chain is None:
            raise OpError(f"ops[{i}]: {op.kind} is a chain op, but the config has no chain (a single pool)")
