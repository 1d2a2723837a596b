"""The fast seeded generator: pool configs and op sequences, by scenario.

It reads the spec allocator it is given (never the target) to know which requests are
live, so nearly every op is valid; contract violations are produced on purpose at a low
rate. Scenarios weight the op mix the way a server's workloads differ. The ops
themselves come from the shared grammar (``shapes``), the one the Hypothesis state
machine draws from too.
"""

from __future__ import annotations

import bisect
import itertools
import random

import kvref

from . import shapes
from .chain_gen import ChainGenerator, chain_params, is_chain_seed
from .ops import R2T_DTYPES, Alloc, Clear, Fire, Free, KernelOp, Op
from .spec_side import Capabilities, Outcome, SpecSide, unsupported

SCENARIOS = {
    #               alloc free flush fwd fire write read table packed xlate clear raw
    "churn":        (30, 26, 6, 5, 5, 10, 6, 6, 2, 3, 1, 2),
    "fragment":     (25, 35, 14, 3, 3, 8, 6, 3, 1, 2, 0, 2),
    "full":         (45, 18, 8, 4, 4, 8, 5, 4, 1, 2, 1, 2),
    "long":         (20, 15, 8, 6, 6, 12, 8, 14, 4, 4, 1, 2),
    "short":        (35, 32, 6, 5, 5, 6, 4, 4, 1, 2, 0, 2),
    "inflight":     (22, 20, 16, 14, 8, 8, 5, 4, 1, 2, 0, 2),
    "kernels":      (10, 8, 2, 1, 1, 2, 2, 10, 4, 6, 0, 54),  # mostly kernel-level ops on raw tables
}
HOSTILE = ("spec", "off", "all")  # which contract-breaking inputs a run makes and probes (runner.PoolRun)


def contract_rate(hostile: str) -> float:
    """How often the generator breaks a contract on purpose: never when hostile is off."""
    return 0.0 if hostile == "off" else 0.03


KINDS = ("alloc", "free", "flush", "forward", "fire", "write", "read", "read_table", "read_table_packed",
         "translate", "clear", "raw")
NO_CONTRACT = 0.5  # an op's first draw, where it breaks no contract (``contract_rate`` is far below)


def op_draws(scenario: str, kind: str, urgent: bool | None = None) -> list[float] | None:
    """The first draws of an op of ``kind`` as ``OpGenerator`` draws one in ``scenario``: no contract
    broken, the kind (``choices`` over the scenario's weights: the middle of its share) and, for a
    flush, whether it is urgent (``shapes.flush_op``'s chance); None where the scenario never
    draws the kind (or is a chain's, whose generator draws otherwise)."""
    weights = SCENARIOS.get(scenario)
    if weights is None or not weights[KINDS.index(kind)]:
        return None
    i = KINDS.index(kind)
    draws = [NO_CONTRACT, (sum(weights[:i]) + weights[i] / 2) / sum(weights)]
    if urgent is not None:
        draws.append(shapes.URGENT / 2 if urgent else (1 + shapes.URGENT) / 2)
    return draws


def drawn_kind(scenario: str, draws) -> str | None:
    """The kind of op whose first ``draws`` these are in ``scenario`` (None: a contract broken on
    purpose, or a chain's scenario)."""
    weights = SCENARIOS.get(scenario)
    if weights is None or len(draws) < 2 or draws[0] < contract_rate("spec"):
        return None
    return KINDS[bisect.bisect(list(itertools.accumulate(weights)), draws[1] * sum(weights))]
ALLOC_MODE = {"long": "long", "short": "short", "full": "full"}


def random_config(rng: random.Random) -> kvref.PoolConfig:
    ps = rng.choice((1, 1, 1, 2, 4, 16))
    num_pages = rng.choice((4, 8, 16, 32, 64)) + rng.randint(0, 8)
    if ps == 16:
        num_pages = min(num_pages, 24)
    return kvref.PoolConfig(
        num_pages=num_pages,
        min_page=rng.choice((1, 1, 2, 3)),
        page_size=ps,
        grow=rng.choice(("up", "down")),
        lazy=rng.random() < 0.75,
        multiplier=rng.choice((1, 1, 2, 3, 16)),
        max_moves=rng.choice((0, 1, 2, 4, 8, 64)),
    )


class OpGenerator:
    """``r2t_dtype``: the dtype of every read table's ``req_to_token`` in this sequence
    (``sequence_r2t_dtype`` of its seed; int64 for a generator built without one)."""

    def __init__(self, rng: random.Random, config: kvref.PoolConfig, scenario: str, contract_rate: float = 0.03,
                 r2t_dtype: str = "int64"):
        self.rng = rng
        self.r2t_dtype = r2t_dtype
        self.ch = shapes.RandomChooser(rng)
        self.config = config
        self.scenario = scenario
        self.weights = SCENARIOS[scenario]
        self.contract_rate = contract_rate
        self.live: list[list[int]] = []
        self.dead: list[list[int]] = []
        self.stamp = 1
        self.raw_bound: dict[int, int] = {}  # the raw tables as the spec left them: v -> p
        self.violations: dict[str, int] = {}  # contract-violation kinds drawn, by name
        self._kept: list[int] | None = None  # what a partial free leaves live
        self.last_violation: str | None = None  # the contract the last op breaks on purpose (None: emitted valid)

    def _tokens(self) -> list[int]:
        return [t for r in self.live for t in r]

    def observe(self, op: Op, outcome) -> None:
        """Learn what the spec did with the op just run (``outcome``: runner.Outcome)."""
        if outcome.error is not None:
            return
        if isinstance(op, KernelOp):
            shapes.observe_raw(op, self.raw_bound)
        elif isinstance(op, Alloc) and outcome.result:
            self.live.append(list(outcome.result))
        elif isinstance(op, Free):
            gone = set(op.tokens)
            self.dead = (self.dead + [shapes.whole_pages(op.tokens, self.config.page_size)])[-16:]
            self.live = [r for r in self.live if gone.isdisjoint(r)]
            if self._kept:
                self.live.append(self._kept)
        elif isinstance(op, Clear):
            self.dead.extend(self.live)
            self.live = []
        self._kept = None

    def next_op(self, spec: kvref.Allocator) -> Op:
        return shapes.with_r2t_dtype(self._next_op(spec), self.r2t_dtype)

    def _next_op(self, spec: kvref.Allocator) -> Op:
        ch = self.ch
        self.last_violation = None
        if self.rng.random() < self.contract_rate:
            kind, op = shapes.violation_op(ch, self.config, self.live, self._dead_runs(spec), self.raw_bound)
            self.violations[kind] = self.violations.get(kind, 0) + 1
            self.last_violation = kind
            return op
        return getattr(self, f"_gen_{ch.weighted(KINDS, self.weights)}")(spec)

    # ---- one builder call per kind of the op mix ------------------------------------
    def _gen_alloc(self, spec):
        room = spec.index_room() + len(spec.holes)
        return shapes.alloc_op(self.ch, self.config, room, ALLOC_MODE.get(self.scenario, "usual"))

    def _gen_free(self, spec):
        live = shapes.freeable(spec, self.live)
        if not live:
            return self._gen_alloc(spec)
        op, self._kept = shapes.free_op(self.ch, self.config, live[self.rng.randrange(len(live))])
        return op

    def _gen_flush(self, spec):
        return shapes.flush_op(self.ch)

    def _gen_forward(self, spec):
        ch = self.ch
        reqs = ch.subset(self.live, ch.integer(1, min(len(self.live), 3))) if self.live else []
        return shapes.forward_op(ch, [t for r in reqs for t in r])

    def _gen_fire(self, spec):
        return Fire()

    def _gen_write(self, spec):
        op = shapes.write_op(self.ch, self._tokens(), self.stamp)
        self.stamp += len(op.tokens)
        return op

    def _gen_read(self, spec):
        return shapes.read_op(self.ch, self._tokens())

    def _gen_read_table(self, spec):
        return shapes.read_table_op(self.ch, self.config, self.live, self.dead)

    def _gen_read_table_packed(self, spec):
        return shapes.read_table_packed_op(self.ch, self.config, self.live, self.dead)

    def _gen_translate(self, spec):
        return shapes.translate_op(self.ch, self.config, self._tokens(), [t for r in self.dead for t in r])

    def _gen_clear(self, spec):
        return Clear()

    def _gen_raw(self, spec):
        return shapes.raw_op(self.ch, self.config, self.raw_bound)

    def _dead_runs(self, spec: kvref.Allocator) -> list[list[int]]:
        """Freed runs whose pages are all still unbound in the spec (so a second free is a
        double free, not a free of someone else's re-allocated page)."""
        ps = self.config.page_size
        return [r for r in self.dead if r and all(spec.v2p[t // ps] == -1 for t in r[::ps])]


WARMUP_BASE = 1 << 62  # seeds from here on are warm-up sequences (``warmup_seed``)
WARMUP_SEQUENCES = 8


def warmup_seed(i: int) -> int:
    """The seed of warm-up sequence ``i``: every page size, with the read-table-heavy and
    the kernel-level mixes, so a GPU worker compiles its kernels' variants before it is
    timed. A warm-up sequence is an ordinary one (its failures are cases like any other)."""
    return WARMUP_BASE + i


def sequence_params(seed: int, chains: bool = True) -> tuple[kvref.PoolConfig, str, random.Random]:
    """Everything a seed decides: the pool config, the scenario, the op stream's RNG. A chain
    seed (``chain_gen``) has a chain config and scenario when the allocator has chains
    (``chains``, ``allocators.Protocol.chains``), else the single pool it always had."""
    rng = random.Random(seed)
    config = random_config(rng)
    scenario = rng.choice(sorted(SCENARIOS))
    if chains and seed < WARMUP_BASE and is_chain_seed(seed):
        config, scenario = chain_params(seed)
    if seed >= WARMUP_BASE:
        i = seed - WARMUP_BASE
        config = kvref.PoolConfig(num_pages=48 + 16 * (i % 3), min_page=1 + i % 2, page_size=(1, 2, 4, 16)[i % 4],
                                  grow=("up", "down")[i % 2], lazy=True, multiplier=1 + 2 * (i % 2))
        scenario = ("long", "kernels")[(i // 4) % 2]
    return config, scenario, rng


def sequence_r2t_dtype(seed: int) -> str:
    """The ``req_to_token`` dtype of a sequence's read tables: int32 (SGLang's) or int64, half
    the seeds each. From its own RNG, so the op stream of a seed is the one it was before
    dtypes were drawn, but for the dtype of its read tables. Warm-up sequences take int64
    for their first four (every page size) and int32 for the next four, so a GPU worker
    compiles both before it is timed."""
    if seed >= WARMUP_BASE:
        return R2T_DTYPES[((seed - WARMUP_BASE) // 4) % 2]
    return R2T_DTYPES[random.Random(seed * 7_919 + 0x5EED).random() < 0.5]


def make_generator(rng: random.Random, config: kvref.PoolConfig, scenario: str, contract_rate: float = 0.03,
                   r2t_dtype: str = "int64"):
    """The generator of a sequence: ``ChainGenerator`` for a config with a chain (its ops name
    their pool), else ``OpGenerator``."""
    if config.chain is not None:
        return ChainGenerator(rng, config, scenario, contract_rate=contract_rate)
    return OpGenerator(rng, config, scenario, contract_rate=contract_rate, r2t_dtype=r2t_dtype)


def _unread(gen) -> Outcome:
    """What a pure op not run on the spec (``regenerate(reads=False)``) is taken to have done: refused
    where the generator broke a contract on purpose, else nothing."""
    why = getattr(gen, "last_violation", None)
    return Outcome() if why is None else Outcome(error=kvref.ContractViolation(f"{why}: drawn to break a contract"))


def regenerate(seed: int, n_ops: int, *, has=(), hostile: str = "spec", skips=(), params=None,
               r2t_dtype: str | None = None, on_op=None, rules=(), chains: bool = True, on_spec=None,
               reads: bool = True) -> tuple[kvref.PoolConfig, str, list[Op]]:
    """The first ``n_ops`` ops a worker ran for ``seed``, rebuilt from the spec alone.

    The stream depends on nothing the target does: the generator reads the spec, and an
    op the kernel set cannot run (``has``: its optional functions) is skipped exactly as
    the runner skips it, and so is an op kind the allocator lacks (``skips``, allocators.py);
    the spec follows the ``rules`` the allocator declares (``kvref.RULES``).
    ``hostile`` must be the campaign's (it sets the contract rate); ``chains`` whether the
    allocator has chains (the worker's ``info``). ``params`` and ``r2t_dtype``:
    what the seed would decide, given instead (a guided sequence's, ``guide``); ``on_op()``: called
    before each op is drawn, as in the small track's run (a mutation's shadow run, ``streams``);
    ``on_spec(op, spec, outcome)``: after the spec ran each op (a plan screened on the spec, ``screen``);
    ``reads`` off: a pure op is not run on the spec (a generator learns nothing from a read: the
    same ops, for a shadow run that needs only the state, without the spec's read tables)."""
    config, scenario, rng = params or sequence_params(seed, chains)
    gen = make_generator(rng, config, scenario, contract_rate=contract_rate(hostile),
                         r2t_dtype=r2t_dtype or sequence_r2t_dtype(seed))
    side, tier = SpecSide(config, rules), Capabilities(has)
    ops: list[Op] = []
    for _ in range(n_ops):
        if on_op is not None:
            on_op()
        op = gen.next_op(side.spec)
        ops.append(op)
        if not op.supported_by(tier) or op.kind in skips:
            out = unsupported(op)
        else:
            out = side.apply(op) if reads or not op.pure else _unread(gen)
        if on_spec is not None:
            on_spec(op, side.spec, out)
        gen.observe(op, out)
    return config, scenario, ops
