"""Choice streams, the guided track's inputs: the draws the seeded generator consumed, cut at op
marks, and the pool configs a corpus entry's ops are run in again.

An input is not an op list but the **choice stream** the seeded generator consumed
(``ChoiceRandom``: every draw is one float in [0, 1)), with marks where each op's draws
begin. The generator still reads the spec to build every op, so an edited stream
(``mutations.py``) is always a valid sequence (contract violations only at the generator's own
rate). The stream is replayed **op-aligned** (each op reads its own segment, its surplus fresh:
``ChoiceRandom``), so an edit to one op leaves the later ops' draws where they were. Draws past
the stream's end are fresh, so every sequence runs its full length.

Every integer is one draw (``ChoiceRandom._randbelow``: ``floor(u * n)``, no rejection loop)
and its range ``n`` is recorded, so an integer draw can be moved by whole units or set to a
value. ``data_flow`` records, for a kept entry, which alloc made each row every table op read
(the ops replayed on the spec, ~5 ms per 100 ops, only for entries kept): what the edits that
reach a feature's cause change. ``rare_config``, ``reconfig_wants`` and ``retune`` choose the
pool config a stream runs in: a fresh sequence's, and an entry's ops in the pool its missing
siblings need.
"""

from __future__ import annotations

import dataclasses
import functools
import random

from .chain_gen import CHAIN_SCENARIOS, layouts_of, random_chain_config
from .features import config_features, feature_id
from .generate import SCENARIOS, random_config
from .ops import Alloc
from .shapes import TABLE_OPS
from .spec_side import Capabilities, SpecSide, unsupported


class ChoiceRandom(random.Random):
    """``random.Random`` reading its draws from ``given`` (floats in [0, 1)), **op-aligned**:
    ``marks`` cut ``given`` into the config's draws and one segment per op (``segments``), and
    ``begin_op()`` (called before each op is drawn) moves to the next op's segment, whatever
    the op before consumed. An op that draws more than its segment holds gets its surplus from
    a fresh ``Random`` of its own (keyed by ``fresh_seed`` and the op's index), one that draws
    fewer leaves the rest unread. So an edit to one op's draws (a resize lengthens an alloc, a
    later free then permutes more pages) leaves every later op reading the draws it read
    before; read sequentially, a resize shifted them all (benchmarks/results/guided-vs-blind/
    stones-and-resizes.md: 11 of 18 resizes kept the read table on the resized row). Without marks,
    all of ``given`` is the config's and every op draws fresh (a fresh sequence). ``log`` is
    every draw made, ``ranges`` each draw's integer range (0 for a float), ``pos`` how many."""

    def __init__(self, given=(), fresh_seed: int | str = 0, marks=None):
        self.given, self.pos, self.log, self.ranges = list(given), 0, [], []
        self._cuts = [*(marks or ()), len(self.given)]
        self._seed, self.op, self._at, self._end = fresh_seed, -1, 0, self._cuts[0]
        self._fresh = random.Random(fresh_seed)
        super().__init__(0)

    def seed(self, *args, **kwargs):  # the stream is the state: nothing to seed
        pass

    def begin_op(self) -> None:
        """The next op's draws begin: its own segment of ``given``, then its own fresh draws."""
        self.op += 1
        k = self.op
        self._at = self._cuts[k] if k < len(self._cuts) - 1 else len(self.given)
        self._end = self._cuts[k + 1] if k < len(self._cuts) - 1 else len(self.given)
        self._fresh = None  # seeding one costs more than most ops' own draws

    def random(self) -> float:
        if self._at < self._end:
            u = self.given[self._at]
            self._at += 1
        else:  # an op's fresh draws: its own Random, seeded at its first
            self._fresh = self._fresh or random.Random(f"{self._seed}:op{self.op}")
            u = self._fresh.random()
        self.pos += 1
        self.log.append(u)
        self.ranges.append(0)
        return u

    def _randbelow(self, n: int) -> int:
        """One draw per integer in [0, n) (randint, choice, sample all come here), its range kept:
        a mutation can then set or move the integer exactly."""
        if not n:
            return 0
        u = self.random()
        self.ranges[-1] = n
        return min(int(u * n), n - 1)

    def getrandbits(self, k: int) -> int:
        if k <= 53:
            return self._randbelow(1 << k)
        return sum(self.getrandbits(min(53, k - i)) << i for i in range(0, k, 53))


def params_of(stream, fresh_seed: int, marks=None, chains=True):
    """(config, scenario, rng) of a stream cut at ``marks`` (None: ops all fresh), as
    ``generate.sequence_params`` draws them from a seed; the caller's ``on_op`` calls
    ``rng.begin_op()``. A chain scenario draws its chain config next, from the same stream;
    for an allocator without chains (``chains``: the layouts it builds, as ``chain_gen.layouts_of``
    reads them; none) it stands for a single pool's scenario."""
    rng = ChoiceRandom(stream, fresh_seed, marks)
    config = random_config(rng)
    names = scenario_names()
    scenario = rng.choice(names)
    if scenario in CHAIN_SCENARIOS:
        if layouts_of(chains):
            config = random_chain_config(rng, layouts_of(chains))
        else:
            scenario = sorted(SCENARIOS)[names.index(scenario) % len(SCENARIOS)]
    return config, scenario, rng


def scenario_names() -> list[str]:
    """The scenarios a guided sequence draws from: the single pool's, then the chain's."""
    return sorted(SCENARIOS) + sorted(CHAIN_SCENARIOS)


def rare_scenario(counts, chains, rng) -> int:
    """The index in ``scenario_names()`` of a scenario the corpus (its feature ``counts``) holds
    fewest entries of, among those a tier with ``chains`` runs as themselves: every one, or the
    single pool's only (``params_of`` maps a chain scenario of a tier without chains to one of
    those, so its own name is never held: aimed at, it would always be the least held, and fresh
    sequences would draw only the three single-pool scenarios the chain names map to, never
    ``inflight`` nor ``long``)."""
    names = scenario_names()
    held = {i: counts.get(feature_id(f"config|scenario|{n}"), 0) for i, n in enumerate(names)
            if n in SCENARIOS or layouts_of(chains)}
    return rng.choice([i for i, n in held.items() if n == min(held.values())])


def data_flow(config, ops, has=(), skips=(), rules=()) -> dict:
    """``{"pages": {alloc op: pages}, "feeds": {table op: [the alloc ops whose tokens its rows
    hold]}}`` (op indices as strings, JSON's keys), from the ops replayed on the spec as the
    run applied them (an op the tier lacks is skipped as the runner skips it)."""
    side, tier, ps = SpecSide(config, rules), Capabilities(has), config.page_size
    made: dict[int, int] = {}  # token -> the alloc op that returned it (the latest)
    pages, feeds = {}, {}
    for i, op in enumerate(ops):
        out = side.apply(op) if op.supported_by(tier) and op.kind not in skips else unsupported(op)
        if isinstance(op, Alloc):
            pages[str(i)] = op.n // ps
            if out.error is None and out.result:
                made.update((t, i) for t in out.result)
        elif isinstance(op, TABLE_OPS):
            feeds[str(i)] = sorted({made[t] for row in op.rows for t in row if t in made})
    return {"pages": pages, "feeds": feeds}


def segments(entry: dict) -> list[list[list]]:
    """The stream cut at its op marks, each draw ``[u, range]`` (range: the integer's, 0 for a
    float): [config draws, op 0's draws, op 1's, ...]."""
    stream, marks = entry["stream"], entry["marks"]
    ranges = entry.get("ranges") or [0] * len(stream)
    cuts = [0, *marks, len(stream)]
    return [[[u, k] for u, k in zip(stream[x:y], ranges[x:y])] for x, y in zip(cuts, cuts[1:])]


def flat(segs) -> list[float]:
    return [d[0] for s in segs for d in s]


def marks_of(segs) -> list[int]:
    """Where each op's segment begins in ``flat(segs)`` (the marks ``segments`` cut at)."""
    out, at = [], 0
    for seg in segs[:-1]:
        at += len(seg)
        out.append(at)
    return out


# Pool configs: which config a corpus entry's missing siblings need, and the stream that runs its ops in
# it. A mutation keeps its entry's config (the stream's first draws), and a corpus grown from its first
# entries stays at their page size and grow direction, where a conjunction may need another.
START_TRIPS = ("2", "3+", "4-7", "8+")  # a packed row's kv_start must survive a second trip
CONFIG_TRIES = 4  # a fresh sequence's pool config: the least held of this many draws (``rare_config``)


def rare_config(counts, seed: int, want=None, tries: int = CONFIG_TRIES) -> list[float]:
    """The draws of a pool config (a stream's first draws), the one of ``tries`` drawn for ``seed``
    whose page size, growth and laziness the corpus (its feature ``counts``) holds fewest entries of,
    among those ``want(config)`` accepts (all, when none does)."""
    best = None
    for i in range(tries):
        draws = ChoiceRandom((), f"kvfuzz-config:{seed}" + (f":{i}" if i else ""))
        c = random_config(draws)
        held = sum(counts.get(feature_id(f), 0) for f in config_features(c, "", None) if "scenario" not in f)
        key = (want is not None and not want(c), held)
        if best is None or key < best[0]:
            best = (key, draws.log)
    return list(best[1])


def reconfig_wants(why: str | None, counts) -> list:
    """The pool configs (tests of one) in which the siblings of ``why`` that no entry holds can be
    reached, where its own config cannot reach them (empty: its config can). A packed table whose
    rows reached two trips only with an aligned ``kv_start`` (or at page size 1: aligned by
    construction) needs pages of 2+ tokens. A flush's stop met growing one way needs a lazy pool
    growing the other; a walk that ended before its move limit (or at it, by a pinned page), a
    smaller limit, and one cut short by it, no limit (so it reaches a pinned page). Mutations keep
    their entry's config (a corpus grown from its first entries stayed on one page size and grow
    direction), so ``retune`` changes the one draw these need."""
    parts = (why or "").split("|")
    wants = []
    if parts[0] in ("trips", "start") and len(parts) > 1:
        k = parts[1]
        if any(feature_id(f"start|{k}|{w}|trips {b}") in counts for w in ("aligned", "page size 1") for b in START_TRIPS) \
                and not any(feature_id(f"start|{k}|unaligned|trips {b}") in counts for b in START_TRIPS):
            wants.append(_paged)
    if parts[0] == "spec" and len(parts) > 4 and parts[1] == "flush":
        grow, who, stop = parts[2:5]
        other, limit = "down" if grow == "up" else "up", f"spec|flush|{grow}|{who}|move limit"
        if feature_id(f"spec|flush|{other}|{who}|{stop}") not in counts:
            wants.append(functools.partial(_pool_shape, grow=other))
        if stop in ("frontier met", "pinned page", "move limit at a pinned page") and feature_id(limit) not in counts:
            wants.append(functools.partial(_pool_shape, grow=grow, moves=(0, 2)))
        if stop.startswith("move limit") and feature_id(f"spec|flush|{grow}|{who}|pinned page") not in counts:
            wants.append(functools.partial(_pool_shape, grow=grow, moves=(9, 1 << 30)))
    return wants


def _paged(c) -> bool:
    return c.page_size > 1


def _pool_shape(c, grow: str, moves: tuple = (0, 1 << 30)) -> bool:
    """A lazy pool growing ``grow`` whose walk's move limit is within ``moves``."""
    return c.lazy and c.grow == grow and moves[0] <= c.max_moves <= moves[1]


def retune(stream: list, seed: int, want, rng: random.Random) -> list | None:
    """``stream`` with one of its pool config's draws changed so that ``want(config)`` holds and as
    few of its fields as may be differ (the grow direction alone, the page size alone): the entry's
    pool but for what its missing siblings need. None: no one draw does it."""
    def config(s):
        return random_config(ChoiceRandom(s, f"kvfuzz-retune:{seed}"))

    base = config(stream)
    fields = [f.name for f in dataclasses.fields(base)]
    best = []
    draws = ChoiceRandom((), "kvfuzz-count")
    random_config(draws)
    for i in range(len(draws.log)):  # the config's draws: a stream's first
        for x in (0.05, 0.2, 0.35, 0.5, 0.65, 0.8, 0.95):
            cand = [*stream[:i], x, *stream[i + 1:]]
            c = config(cand)
            if want(c):
                best.append((sum(getattr(c, f) != getattr(base, f) for f in fields), i, x, cand))
    if not best:
        return None
    least = min(b[0] for b in best)
    return rng.choice([b[3] for b in best if b[0] == least])
