"""Shrink a failing op sequence while it keeps failing the same way: one minimizer for all.

Campaigns, ``kvfuzz minimize``, the mutant hunts and every track use this one. Passes
are registered with ``@minimize_pass`` (each a function with a docstring saying why it
exists) and run to a fixed point: after a round, only the passes that made progress in
it run again, until a round changes nothing or the deadline passes. Per-pass statistics
(candidates tried / kept) go into the case (``minimize``).

A candidate counts only if it fails with the **same signature** and, for a failure on
hostile input, in the same **hostile class** (the spec's kind of refusal: a read table
past ``max_pages`` must not slide into a token past ``v2p``). A flaky failure is judged by
"fails at least once in ``tries`` runs".

Who runs a candidate is the ``judge``: in this process (``local_judge``) or a supervised
child (``supervise.Executor``) when a candidate may crash or hang, so a fault is one more
answer ("this candidate dies with SIGSEGV") rather than the end of the minimizer. Every
candidate is replayed from scratch unless it was tried before (a cache: the passes
revisit the same sequences).

Candidates side by side (``batch``, ``width``): where each candidate costs a fresh child (a
crash, a hang, a case with history), a pass says what it would ask for next, should the
candidate it asks for now not be kept and should it be kept (``upcoming``), and the minimizer
runs that candidate together with the ``width - 1`` likeliest of those at once (the chances from
the pass's own kept/tried: a hang case keeps most of its shrunk ops, a ddmin round keeps few of
its complements; a kept hang waits out an op-timeout, so running only what follows a candidate
that is not kept would leave every kept one on the critical path). The passes still walk their
candidates one by one and adopt the first that fails alike: those run ahead wait in ``_ahead``
until the walk reaches them, and only then count (``replays``, the cap, the per-pass
statistics). So the result, the 1-minimal check and the cap's meaning are those of one
candidate at a time, on any machine and at any width, given the same answers; a candidate run
ahead that the walk never reaches costs time on a core that was free, not budget. A flaky case
(``tries > 1``) runs one at a time: its "fails once in ``tries`` runs" stops at its first
failure, which a batch would not know.
"""

from __future__ import annotations

import itertools
import re
import time
from dataclasses import dataclass, replace
from typing import Callable

import kvref

from .ops import Op
from .supervise import NotRun
from .verdict import Signature

LOOKAHEAD_SCAN = 256  # candidates of ``upcoming`` a batch looks through for ones not run yet


class NotReproducible(Exception):
    """The sequence handed to the minimizer does not fail with its signature."""


def local_judge(tier, knobs: dict | None = None, **kw) -> Callable:
    """Replay candidates in this process (fine when nothing can crash it); ``NotRun`` for one that
    passed with an op that could not run here, as a supervised child's "unknown" (``_answer``: not
    seen to fail)."""
    def judge(config, ops):
        from .dispatch import judge

        return judge(config, ops, tier, knobs=knobs, **kw)[0]
    return judge


def hostile_kind(failure) -> str | None:
    """The class of hostile input a failure was found with: the spec's refusal with its
    numbers and id lists blanked (None for a failure on valid input)."""
    if failure is None:
        return None
    refusal = getattr(failure, "refusal", None)  # a Divergence
    if refusal is None and isinstance(getattr(failure, "divergence", None), dict):  # a Finding, a Case
        refusal = failure.divergence.get("refusal")
    if not refusal:
        return None
    return re.sub(r"-?\d+", "N", re.sub(r"\[[^\]]*\]", "[..]", refusal))


@dataclass
class Candidate:
    config: kvref.PoolConfig
    ops: list[Op]


PASSES: list[tuple[str, Callable]] = []


def minimize_pass(name: str):
    """Register a pass: ``fn(m, cand) -> Candidate | None`` (None: no progress)."""
    def register(fn):
        PASSES.append((name, fn))
        return fn
    return register


class Minimizer:
    """``judge(config, ops)`` returns the candidate's failure (anything with a ``signature``)
    or None; the default replays it here on ``tier``."""

    def __init__(self, tier, signature: Signature, deadline: float | None = None, knobs: dict | None = None,
                 judge: Callable | None = None, *, hostile: str | None = None, tries: int = 1,
                 max_replays: int | None = None, batch: Callable | None = None, width: int = 1):
        self.judge = judge or local_judge(tier, knobs)
        # ``batch([(config, ops), ...])``: their answers, run at once (an exception is its candidate's answer)
        self.width = max(1, width) if batch is not None and tries <= 1 else 1
        self.batch = batch
        self.signature = signature
        self.hostile = hostile  # hostile_kind of the original failure (None: found on valid input)
        self.deadline = deadline
        self.max_replays = max_replays  # a budget of work: the same result on any machine, loaded or not
        self.tries = max(1, tries)
        self.replays = 0
        self.saved = 0
        self.stats: dict[str, list[int]] = {}  # pass -> [tried, kept]
        self._tried: dict[tuple, object] = {}
        self._ahead: dict[tuple, object] = {}  # answers of candidates run ahead, not yet reached by the walk
        self._next: tuple = (iter(()), iter(()))  # what the pass asks for next (``upcoming``)
        self.ran_ahead = 0  # candidates run beside the one asked for (reached later or not)
        self.rounds = 0  # judge calls and batches, one after the other: the candidates' turns in time
        self._pass: str | None = None
        self.one_minimal = False  # the result was checked: no single op can go (run() sets it)
        self.stopped: str | None = None  # why it ended before that check: "cap" or "deadline"

    def out_of_time(self) -> bool:
        if self.max_replays is not None and self.replays >= self.max_replays:
            self.stopped = self.stopped or "cap"
            return True
        if self.deadline is not None and time.monotonic() >= self.deadline:
            self.stopped = self.stopped or "deadline"
            return True
        return False

    def same(self, failure) -> bool:
        return (failure is not None and failure.signature == self.signature
                and (self.hostile is None or hostile_kind(failure) == self.hostile))

    def fails(self, config: kvref.PoolConfig, ops: list[Op]):
        """The failure if this candidate fails alike (in one of ``tries`` runs), else None."""
        key = (config, tuple(ops))
        if key in self._tried:
            self.saved += 1
            return self._tried[key]
        verdict = None
        for _ in range(self.tries):
            self.replays += 1
            if self._pass is not None:
                self.stats.setdefault(self._pass, [0, 0])[0] += 1
            d = self._answer(key)
            if self.same(d):
                verdict = d
                break
            if self.out_of_time():
                break
        self._tried[key] = verdict
        return verdict

    def upcoming(self, if_fails=(), if_kept=()) -> None:
        """What the pass asks for next, each a ``(config, ops)``: ``if_fails``, in its order,
        should the candidate it asks for now (and each of these) not fail alike; ``if_kept``,
        should it (and each of these in turn) fail alike and be kept. The likelier ones run beside
        the candidate asked for (``_likely``); nothing is built at width 1."""
        if self.width > 1:
            self._next = (iter(if_fails), iter(if_kept))

    def _likely(self, key: tuple, room: int) -> list[tuple]:
        """Up to ``room`` candidates of ``upcoming`` not run yet, the likelier first: the k-th of
        ``if_fails`` is reached with the chance that k candidates in a row do not fail, the k-th of
        ``if_kept`` that k in a row do, each chance from the pass's own kept/tried so far."""
        tried, kept = self.stats.get(self._pass, [0, 0]) if self._pass else (0, 0)
        p = (kept + 1) / (tried + 2)
        chances, later, scanned = [1 - p, p], [], 0
        while len(later) < room and scanned < LOOKAHEAD_SCAN and any(c > 0 for c in chances):
            side = 0 if chances[0] >= chances[1] else 1
            cand = next(self._next[side], None)
            scanned += 1
            if cand is None:
                chances[side] = 0
                continue
            chances[side] *= 1 - p if side == 0 else p
            k = (cand[0], tuple(cand[1]))
            if k != key and k not in self._tried and k not in self._ahead and k not in later:
                later.append(k)
        return later

    def _answer(self, key: tuple):
        """The judge's answer for ``key``: run ahead already, or run now with the likeliest
        candidates of ``upcoming`` beside it (no more than the cap has room to reach)."""
        if key in self._ahead:
            d = self._ahead.pop(key)
        elif self.width == 1:
            self.rounds += 1
            try:  # a failure is an answer (a Divergence, an exception not raised), returned as it is
                return self.judge(key[0], list(key[1]))
            except NotRun:  # a candidate that could not run is not seen to fail
                return None
        else:
            room = self.width - 1 if self.max_replays is None else min(self.width - 1, self.max_replays - self.replays)
            later = self._likely(key, room) if room > 0 else []
            answers = self.batch([(c, list(o)) for c, o in [key, *later]])
            self.rounds += 1
            self._ahead.update(zip(later, answers[1:]))
            self.ran_ahead += len(later)
            d = answers[0]
        if isinstance(d, NotRun):  # as above, from a lane (whose answers are exceptions only when it raised)
            return None
        if isinstance(d, BaseException):
            raise d
        return d

    @property
    def unreached(self) -> int:
        """Candidates run ahead that the order has not reached (work beyond the count)."""
        return len(self._ahead)

    def keep(self) -> None:
        if self._pass is not None:
            self.stats.setdefault(self._pass, [0, 0])[1] += 1

    def run(self, config, ops: list[Op], known=None):
        """(config, ops, failure): the smallest candidate found that still fails alike.
        ``known``: a failure of ``(config, ops)`` seen already (a rate's replay), taken for its
        first replay when it fails alike."""
        if self.same(known):
            self._tried[(config, tuple(ops))] = known
        d = self.fails(config, ops)
        if d is None:
            raise NotReproducible(f"the sequence does not fail with {self.signature}; nothing to minimize")
        step = getattr(d, "step", None)
        if isinstance(step, int) and 0 <= step < len(ops) - 1 and self.fails(config, ops[: step + 1]):
            ops = ops[: step + 1]  # nothing after the failing op matters
        cand = Candidate(config, list(ops))
        while True:
            cand = self._fixed_point(cand)
            # The passes after drop-ops (a shrunk op, a merged pair, a smaller pool) may leave an op
            # that can now go, and a round runs again only the passes that progressed: every single
            # removal is tried on the result itself (most are in the cache), so it is 1-minimal.
            self._pass = "one-minimal"
            smaller, complete = _drop_one(self, cand)
            self._pass = None
            if smaller is None:
                self.one_minimal = complete
                break
            cand = smaller
        return cand.config, cand.ops, self.fails(cand.config, cand.ops) or d

    def _fixed_point(self, cand: Candidate) -> Candidate:
        """The passes in rounds, each round only those that progressed in the one before."""
        active = [name for name, _ in PASSES]
        while active and not self.out_of_time():
            progressed = []
            for name, fn in PASSES:
                if name not in active or self.out_of_time():
                    continue
                self._pass = name
                self.upcoming()  # each pass names its own
                better = fn(self, cand)
                self._pass = None
                if better is not None and (better.config, better.ops) != (cand.config, cand.ops):
                    cand = better
                    progressed.append(name)
            active = progressed
        return cand

    def report(self) -> dict:
        """Per-pass statistics for the case: ``{pass: "tried/kept"}``."""
        return {name: f"{t}/{k}" for name, (t, k) in self.stats.items()}


def _drop_one(m: Minimizer, c: Candidate) -> tuple[Candidate | None, bool]:
    """(the candidate without one of its ops that still fails alike, the last op first, or None;
    whether every single removal was tried)."""
    m.upcoming((c.config, c.ops[:i] + c.ops[i + 1:]) for i in range(len(c.ops) - 1, -1, -1))
    for i in range(len(c.ops) - 1, -1, -1) if len(c.ops) > 1 else ():
        key = (c.config, tuple(c.ops[:i] + c.ops[i + 1:]))
        if key not in m._tried and m.out_of_time():
            return None, False
        cand = c.ops[:i] + c.ops[i + 1:]
        if m.fails(c.config, cand):
            m.keep()
            return Candidate(c.config, cand), True
    return None, True


# ---- the passes, in the order a round runs them ---------------------------------------------------


@minimize_pass("keep-prerequisites")
def keep_prerequisites(m: Minimizer, c: Candidate) -> Candidate | None:
    """The failing op alone with the last op of each prerequisite kind before it (a
    production read table needs only its setup and its rows; a small-track kernel bug that
    needs no state, none): one replay that, when it holds, spares most of delta debugging's
    (its halves and quarters of a long sequence, each replayed). Ops mark themselves
    ``prerequisite``."""
    last = len(c.ops) - 1
    keep = {last}
    seen: set[str] = set()
    for j in range(last - 1, -1, -1):
        op = c.ops[j]
        if getattr(op, "prerequisite", False) and op.kind not in seen:
            seen.add(op.kind)
            keep.add(j)
    if len(keep) == len(c.ops):
        return None
    core = [c.ops[j] for j in sorted(keep)]
    if m.fails(c.config, core):
        m.keep()
        return Candidate(c.config, core)
    return None


def _spec_results(config: kvref.PoolConfig, ops: list[Op]) -> list | None:
    """Each op's result replayed on the spec alone (None for an op it refused); None where the spec
    cannot replay one at all (an op it raises on outright): the other passes shrink such a case."""
    from .spec_side import SpecSide

    side = SpecSide(config)
    try:
        return [out.result if (out := side.apply(op)).error is None else None for op in ops]
    except Exception:  # noqa: BLE001
        return None


@minimize_pass("keep-token-sources")
def keep_token_sources(m: Minimizer, c: Candidate) -> Candidate | None:
    """The failing op with only the allocs that returned the tokens it names, its tokens renamed to
    what those allocs return once the ops between are gone: a free of 49 pages needs the allocs of
    those pages, not the hundred ops that moved the pool first. Delta debugging cannot get there
    when the ids move: a case names tokens by id, and an op dropped before an alloc changes what the
    alloc returns (in a chain of pools on one buffer, an op of any pool), so most of its
    candidates free tokens nobody holds and fail otherwise (a chain's hang kept 48 of 146 ops after
    ddmin's 400 candidates). Two replays on the spec to find and rename them, one candidate judged."""
    from .chain_ops import ChainAlloc
    from .ops import Alloc

    last = c.ops[-1]
    names = getattr(last, "tokens", None)
    if not isinstance(names, tuple) or not names or len(c.ops) < 3:
        return None
    results = _spec_results(c.config, c.ops[:-1])
    if results is None:
        return None
    made = {}  # (pool, token) -> (the alloc that returned it last, its place in that result)
    for i, (op, got) in enumerate(zip(c.ops, results)):
        if isinstance(op, (Alloc, ChainAlloc)) and isinstance(got, list):
            made.update(((getattr(op, "pool", 0), t), (i, p)) for p, t in enumerate(got))
    sources = [made.get((getattr(last, "pool", 0), t)) for t in names]
    if None in sources:  # a token no alloc returned (a hostile probe's): nothing to rename it by
        return None
    keep = sorted({i for i, _ in sources})
    alone = _spec_results(c.config, [c.ops[i] for i in keep]) if len(keep) + 1 < len(c.ops) else None
    if alone is None:
        return None
    at = {i: j for j, i in enumerate(keep)}
    if any(not isinstance(alone[at[i]], list) or p >= len(alone[at[i]]) for i, p in sources):
        return None  # an alloc alone returns fewer tokens than it did in place
    core = [c.ops[i] for i in keep] + [replace(last, tokens=tuple(alone[at[i]][p] for i, p in sources))]
    if m.fails(c.config, core):
        m.keep()
        return Candidate(c.config, core)
    return None


def _complements(ops: list[Op], n: int) -> list[list[Op]]:
    """ddmin's candidates at granularity ``n``: ``ops`` without each of its ``n`` chunks in turn."""
    chunk = -(-len(ops) // n)
    parts = [ops[i:i + chunk] for i in range(0, len(ops), chunk)]
    return [[op for j, p in enumerate(parts) if j != i for op in p] for i in range(len(parts))]


def _ddmin_fails(complements: list[list[Op]], i: int, ops: list[Op], n: int):
    """What ddmin asks for next should complement ``i`` and each after it not be kept: the rest of
    the round, then the round at twice the granularity."""
    yield from complements[i + 1:]
    if n < len(ops):
        yield from _complements(ops, min(len(ops), 2 * n))


def _ddmin_kept(ops: list[Op], n: int):
    """What ddmin asks for next should each candidate be kept: the first complement of each round after."""
    while len(ops) >= 2:
        ops, n = _complements(ops, n)[0], max(n - 1, 2)
        yield ops


@minimize_pass("drop-ops")
def drop_ops(m: Minimizer, c: Candidate) -> Candidate | None:
    """Delta debugging over ops (Zeller's ddmin): drop chunks, halving the chunk size."""
    ops, n, changed = c.ops, 2, False
    while len(ops) >= 2 and not m.out_of_time():
        complements = _complements(ops, n)
        reduced = False
        for i, complement in enumerate(complements):
            m.upcoming(((c.config, x) for x in _ddmin_fails(complements, i, ops, n)),
                       ((c.config, x) for x in _ddmin_kept(complement, max(n - 1, 2))))
            if m.fails(c.config, complement):
                m.keep()
                ops, n, reduced, changed = complement, max(n - 1, 2), True, True
                break
            if m.out_of_time():
                break
        if not reduced:
            if n >= len(ops):
                break
            n = min(len(ops), 2 * n)
    return Candidate(c.config, ops) if changed else None


def _shrunk_from(ops: list[Op], start: int, variant: int):
    """What shrink_ops asks for next should none be kept: op ``start``'s variants from ``variant``
    on, then each later op's, each in ``ops``."""
    for i in range(start, len(ops)):
        for v in itertools.islice(ops[i].shrink(), variant if i == start else 0, None):
            yield ops[:i] + [v] + ops[i + 1:]


def _shrunk_kept(ops: list[Op], start: int):
    """What shrink_ops asks for next should each be kept: the boldest variant of each later op."""
    for i in range(start, len(ops)):
        for v in ops[i].shrink():
            ops = ops[:i] + [v] + ops[i + 1:]
            yield ops
            break


@minimize_pass("shrink-ops")
def shrink_ops(m: Minimizer, c: Candidate) -> Candidate | None:
    """Each op's own smaller variants (``Op.shrink``: fewer tokens, smaller allocs, fewer
    rows, narrower tables, smaller production sizes), the boldest first."""
    ops, changed, again = c.ops, False, True
    while again and not m.out_of_time():
        again = False
        for i in range(len(ops)):
            variants = list(ops[i].shrink())
            for j, variant in enumerate(variants):
                cand = ops[:i] + [variant] + ops[i + 1:]
                m.upcoming(((c.config, x) for x in _shrunk_from(ops, i, j + 1)),
                           ((c.config, x) for x in _shrunk_kept(cand, i + 1)))
                if m.fails(c.config, cand):
                    m.keep()
                    ops, changed, again = cand, True, True
                    break
                if m.out_of_time():
                    return Candidate(c.config, ops) if changed else None
    return Candidate(c.config, ops) if changed else None


def _merged_at(ops: list[Op], i: int) -> list[Op] | None:
    """``ops`` with ops ``i`` and ``i + 1`` as one, or None where they do not merge."""
    merged = ops[i].merge(ops[i + 1]) if i + 1 < len(ops) else None
    return None if merged is None else ops[:i] + [merged] + ops[i + 2:]


def _merges_from(ops: list[Op], start: int):
    """What merge_ops asks for next should none be kept: each later pair that merges, merged."""
    for j in range(start, len(ops) - 1):
        if (merged := _merged_at(ops, j)) is not None:
            yield merged


@minimize_pass("merge-ops")
def merge_ops(m: Minimizer, c: Candidate) -> Candidate | None:
    """Two neighbours as one (``Op.merge``: consecutive allocs hand out the same pages as
    one alloc of their sum), which ddmin alone cannot do."""
    def kept_at(ops: list[Op], i: int):  # what it asks for next should each be kept: the same place merged again
        while (ops := _merged_at(ops, i)) is not None:
            yield ops

    ops, i, changed = c.ops, 0, False
    while i + 1 < len(ops) and not m.out_of_time():
        cand = _merged_at(ops, i)
        if cand is not None:
            m.upcoming(((c.config, x) for x in _merges_from(ops, i + 1)), ((c.config, x) for x in kept_at(cand, i)))
        if cand is not None and m.fails(c.config, cand):
            m.keep()
            ops, changed = cand, True
        else:
            i += 1
    return Candidate(c.config, ops) if changed else None


SIMPLER_POOLS = ({"max_moves": 0}, {"multiplier": 1}, {"min_page": 1})


def _smaller_pool(config: kvref.PoolConfig) -> kvref.PoolConfig | None:
    """The pool with a quarter of its pages above ``min_page`` fewer (None: as small as it goes)."""
    if config.num_pages <= config.min_page + 1:
        return None
    try:
        return replace(config, num_pages=config.num_pages - max(1, (config.num_pages - config.min_page) // 4))
    except kvref.ContractViolation:
        return None


def _simpler(config: kvref.PoolConfig, start: int):
    """The simpler pools ``shrink_config`` tries from change ``start`` on, should none be kept."""
    for change in SIMPLER_POOLS[start:]:
        try:
            cand = replace(config, **change)
        except kvref.ContractViolation:
            continue
        if cand != config:
            yield cand


def _smaller(config: kvref.PoolConfig):
    """The smaller pools ``shrink_config`` tries after ``config``, should each be kept."""
    while (config := _smaller_pool(config)) is not None:
        yield config


@minimize_pass("shrink-config")
def shrink_config(m: Minimizer, c: Candidate) -> Candidate | None:
    """A simpler pool (no move cap, multiplier 1, one reserved page), then a smaller one."""
    config = c.config
    for k, change in enumerate(SIMPLER_POOLS):
        if m.out_of_time():
            break
        try:
            cand = replace(config, **change)
        except kvref.ContractViolation:
            continue
        m.upcoming(((pool, c.ops) for pool in itertools.chain(_simpler(config, k + 1), _smaller(config))),
                   ((pool, c.ops) for pool in itertools.chain(_simpler(cand, k + 1), _smaller(cand))))
        if cand != config and m.fails(cand, c.ops):
            m.keep()
            config = cand
    while (cand := _smaller_pool(config)) is not None and not m.out_of_time():
        m.upcoming((), ((pool, c.ops) for pool in _smaller(cand)))
        if not m.fails(cand, c.ops):
            break
        m.keep()
        config = cand
    return Candidate(config, c.ops) if config != c.config else None
