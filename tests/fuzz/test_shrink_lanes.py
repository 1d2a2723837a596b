"""Candidates side by side: a fault case's candidates run several at once, each in a fresh child of
its own, and the case, its 1-minimal check and the candidates counted against the cap are the ones
a single executor gives (``minimize.Minimizer.upcoming``, ``lanes``, ``confirm.Confirmer``)."""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path

import pytest

import kvref
from fuzz.engine import supervise
from fuzz.engine.case import Case, load_case
from fuzz.engine.confirm import Confirmer
from fuzz.engine.lanes import LanePool, Lanes, default_width, side_by_side
from fuzz.engine.minimize import Minimizer
from fuzz.engine.ops import Alloc, Free
from fuzz.engine.tiers import TierSpec
from fuzz.engine.verdict import Finding, Signature
from tests.fuzz.test_engine import REPO, kvfuzz, show
from tests.fuzz.test_replayable import Process, _case, _past

needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="Triton's interpreter is off (a GPU is present)")
FAKES = REPO / "tests/fuzz/fixtures/kernels"
SIG = Signature("free", "state", "p2v")


def _ops(rng: random.Random, n: int) -> list:
    return [Alloc(rng.randint(1, 4)) if rng.random() < 0.5 else Free(tuple(sorted(rng.sample(range(1, 9), 2))))
            for _ in range(n)]


def _minimized(ops, needed, width: int, cap: int | None, pages: int = 9):
    """A minimizer whose candidates fail when they hold ``needed`` in a pool of ``pages`` or more,
    ``width`` of them a batch; (what it answers and counts, the batches' sizes)."""
    def judge(config, cand):
        return Finding(SIG, 0, {"step": 0}) if config.num_pages >= pages and all(n in cand for n in needed) else None

    sizes: list[int] = []

    def batch(cands):
        sizes.append(len(cands))
        return [judge(*c) for c in cands]

    m = Minimizer(None, SIG, judge=judge, batch=batch, width=width, max_replays=cap)
    config, kept, _ = m.run(kvref.PoolConfig(num_pages=24, multiplier=2), ops)
    return (config, kept, m.one_minimal, m.stopped, m.replays, m.saved, m.report()), sizes, m


def test_the_minimizer_gives_the_same_case_count_and_check_at_any_width_and_cap():
    """Twelve sequences, every width from 1 to 5 and caps from 1 candidate to none: the case, the
    1-minimal flag, why it stopped and every count (candidates, cache hits, per pass) are width 1's.
    Wider batches did run ahead (else this would test nothing)."""
    rng = random.Random(7)
    ran_ahead = 0
    for _ in range(12):
        ops = _ops(rng, rng.randint(6, 24))
        needed = rng.sample(ops, rng.randint(1, min(3, len(ops))))
        for cap in (1, 2, 3, 5, 8, 13, 21, 34, 55, None):
            alone, sizes, _ = _minimized(ops, needed, 1, cap)
            assert sizes == []  # one at a time: never a batch
            for width in (2, 3, 5):
                got, sizes, m = _minimized(ops, needed, width, cap)
                assert got == alone, (width, cap, ops, needed)
                assert max(sizes, default=1) <= width
                ran_ahead += m.ran_ahead
    assert ran_ahead > 0


def test_a_candidate_run_ahead_counts_only_once_the_order_reaches_it():
    """Every candidate judged at width 3 is either counted (the order reached it) or still waits
    unreached, uncounted: the count is width 1's, the work beyond it is what ran ahead in vain."""
    ops = [Alloc(2), Free((1, 2)), Alloc(3), Alloc(1), Free((3, 4)), Alloc(2), Free((5, 6)), Alloc(1)]
    needed = [Alloc(3), Free((3, 4))]
    alone, _, _ = _minimized(ops, needed, 1, None)
    wide, sizes, m = _minimized(ops, needed, 3, None)
    assert max(sizes) == 3 and m.unreached, sizes
    assert sum(sizes) == m.replays + m.unreached and m.replays == alone[4]
    assert m.rounds == len(sizes) < m.replays  # fewer turns one after the other than candidates


class FailsOnly(Minimizer):
    """A minimizer that runs ahead only what follows a candidate that is not kept."""

    def upcoming(self, if_fails=(), if_kept=()):
        super().upcoming(if_fails)


def test_candidates_that_would_be_kept_run_ahead_of_each_other_too():
    """A hang case keeps most of its shrunk ops (each kept one hangs: an op-timeout each). Run
    ahead only after candidates that are not kept, every kept one takes a turn of its own; with
    what follows a kept one run ahead too (the pass's kept/tried rate says which is likelier),
    the same case takes fewer turns."""
    sig = Signature("free", "timeout", "no-progress")
    ops = [Alloc(64), Alloc(60), Alloc(50), Alloc(40), Free((1,))]

    def judge(config, cand):  # all five ops needed, every alloc of at least a page
        ok = len(cand) == 5 and all(isinstance(o, Alloc) and o.n for o in cand[:4]) and cand[4] == Free((1,))
        return Finding(sig, len(cand) - 1, {"step": len(cand) - 1}) if ok and config.num_pages >= 40 else None

    got, turns = set(), {}
    for kind in (Minimizer, FailsOnly):
        for width in (1, 3):
            m = kind(None, sig, judge=judge, batch=lambda cands: [judge(*c) for c in cands], width=width)
            config, kept, _ = m.run(kvref.PoolConfig(num_pages=40), ops)
            got.add((config, tuple(kept), m.replays, tuple(m.report().items())))
            turns[kind, width] = m.rounds
    assert len(got) == 1 and next(iter(got))[1] == (Alloc(1),) * 4 + (Free((1,)),), got
    assert turns[Minimizer, 3] < turns[FailsOnly, 3] < turns[Minimizer, 1], turns


def test_a_flaky_case_is_shrunk_one_candidate_at_a_time():
    """``tries > 1`` (fails once in ``tries``) stops at a candidate's first failure, which a batch
    cannot know: the batch is never called."""
    def batch(cands):
        raise AssertionError("a flaky case ran a batch")

    m = Minimizer(None, SIG, judge=lambda config, ops: Finding(SIG, 0, {"step": 0}) if Alloc(3) in ops else None,
                  tries=3, batch=batch, width=4)
    _, kept, _ = m.run(kvref.PoolConfig(num_pages=8), [Alloc(1), Alloc(3), Alloc(2)])
    assert kept == [Alloc(3)] and m.width == 1


def test_side_by_side_answers_in_order_with_an_exception_as_its_calls_answer():
    def boom():
        raise ValueError("lane 1")

    answers = side_by_side([lambda: 1, boom, lambda: 3])
    assert answers[0] == 1 and answers[2] == 3 and isinstance(answers[1], ValueError)


def test_the_default_width_is_half_the_cores_one_to_four():
    assert [default_width(n) for n in (1, 2, 3, 4, 8, 16, 128)] == [1, 1, 1, 2, 4, 4, 4]


class Sibling(Process):
    """``Process`` (a set that exits on its Nth free of a process, history included) as an executor
    of its own, as lanes start them; every instance's jobs go to ``log``."""

    def __init__(self, at: int, log: list):
        super().__init__(at)
        self.log, self.children, self.jobs = log, 0, 0

    def prestart(self):
        pass

    def close(self):
        pass

    def run(self, config, ops, knobs=None, mode=None, history=None, fresh=False, **kw):
        self.log.append((self, fresh))
        self.jobs += 1
        return super().run(config, ops, knobs, mode, history=history, fresh=fresh, **kw)


def _confirmed(width: int, cap: int | None, ops, history, at: int):
    log: list = []
    confirmer = Confirmer(Sibling(at, log), tries=3, shrink_jobs=width, sibling=lambda: Sibling(at, log),
                          **({"cap": cap} if cap else {}))
    done = confirmer.confirm(_case(ops, _crash_at(ops, history, at)), lambda: history)
    return done, log


def _crash_at(ops, history, at):
    from tests.fuzz.test_replayable import _crash

    return _crash(_step_of(ops, history, at))


def _step_of(ops, history, at):
    count = sum(1 for h in history for op in h["ops"] if op["op"] == "free")
    for step, op in enumerate(ops):
        count += isinstance(op, Free)
        if count == at:
            return step
    raise AssertionError("the worker's history and ops do not reach the Nth free")


def test_a_case_that_needs_its_history_is_the_same_at_width_1_and_3_whatever_the_cap():
    """A set that exits on its 5th free of a process, a case whose worker had run three sequences
    (two frees among them) before it: its probe, the history search, the shrinking of its ops
    and of its history, each candidate in a fresh process; at width 3 and width 1 the same ops,
    history, ``minimal`` and rate, at the default cap and at caps that stop it early."""
    ops = [Alloc(2), Free((1,)), Alloc(1), Alloc(3), Free((2,)), Alloc(2), Free((3,)), Alloc(1)]
    history = [_past([Alloc(1), Free((1,))]), _past([Alloc(2)]), _past([Alloc(1), Free((1,))])]
    minimal = {}
    for cap in (None, 4, 9, 15):
        alone, log = _confirmed(1, cap, ops, history, at=5)
        assert len({id(e) for e, _ in log}) == 1
        wide, log = _confirmed(3, cap, ops, history, at=5)
        assert all(fresh for _, fresh in log), "a candidate ran in a reused child"
        assert len({id(e) for e, _ in log}) >= 3  # siblings took some of the jobs
        assert (wide.ops, wide.history, wide.minimal, wide.reproduced) == (
            alone.ops, alone.history, alone.minimal, alone.reproduced), cap
        minimal[cap] = alone.minimal
        if cap is None:
            assert alone.minimal["one_minimal"] and len(alone.history["sequences"]) == 2, alone.minimal
            assert alone.ops == [Free((1,)), Free((2,)), Free((3,))], alone.ops
    assert not minimal[4]["one_minimal"] and "cap of 4" in minimal[4]["note"], minimal


def test_a_batch_runs_its_candidates_in_fresh_children_of_their_own_at_the_same_time(tmp_path):
    """Three candidates, each of them a free of two pages on ``meet.py``, whose first such free
    waits until three processes have reached theirs: each child met three, so the three ran at
    the same time, in three processes (three pid files), each its executor's first job."""
    meet = tmp_path / "meet"
    meet.mkdir()
    spec = TierSpec("torch", str(FAKES / "meet.py"))
    env = {"KVFUZZ_FIXTURE_MEET_DIR": str(meet), "KVFUZZ_FIXTURE_MEET_N": "3"}

    def make():
        return supervise.Executor(spec, op_timeout=120, log_dir=tmp_path, env=env)

    config = kvref.PoolConfig(num_pages=16)
    cands = [(config, [Alloc(2), Free((1, 2))]), (config, [Alloc(3), Free((1, 2))]),
             (config, [Alloc(4), Free((2, 3))])]
    executor = make()
    lanes = Lanes(executor, 3, make)
    try:
        answers = lanes.batch(lambda e: lambda c, o: e.run(c, o, fresh=True))(cands)
        assert answers == [None, None, None], answers
        met = {p.stem: p.read_text() for p in meet.glob("*.met")}
        assert len(met) == 3 and set(met.values()) == {"3"}, met
        assert [e.jobs for e in lanes.executors] == [1, 1, 1]
    finally:
        lanes.close()
        executor.close()
    assert lanes.open_siblings == [] and len(lanes.siblings) == 2


class _Idle:
    """An executor that only counts: what ``Lanes`` asks of a sibling (its child started ahead,
    stood by, closed), and each candidate answered by the lane it ran on."""

    def __init__(self, name: str, started: list):
        self.name, self.closed = name, False
        started.append(self)

    def prestart(self):
        pass

    def standby(self, depth: int = 1):
        pass

    def close(self):
        self.closed = True


def test_a_campaigns_cases_share_its_siblings_and_each_search_keeps_its_width_to_its_end():
    """Two cases confirmed side by side, each asking for 3 lanes, from a campaign pool of 2
    siblings: the first search gets its 3, the second 1 (its own executor: every candidate still
    answered, one at a time) until the first closes; then the next search gets the 3 again."""
    pool, started = LanePool(2), []
    a = Lanes(_Idle("a", []), 3, lambda: _Idle("a-sib", started), pool)
    b = Lanes(_Idle("b", []), 3, lambda: _Idle("b-sib", started), pool)
    cands = [(None, [i]) for i in range(3)]
    lane_of = lambda e: lambda config, ops: (e.name, ops[0])  # noqa: E731 - a judge per lane
    assert a.batch(lane_of)(cands) == [("a", 0), ("a-sib", 1), ("a-sib", 2)]
    assert (a.width, pool.free) == (3, 0)
    assert b.reserve() == 1 and b.batch(lane_of)(cands[:1]) == [("b", 0)]
    at, reached = b.first([lambda e, i=i: (e.name == "b" and i == 2) for i in range(3)])
    assert (at, reached) == (2, 3)  # one lane: each test in turn, all reached
    a.close()
    assert pool.free == 2 and all(e.closed for e in started) and a.width == 3
    assert b.width == 1  # granted when its search began; kept to its end
    b.close()
    assert b.reserve() == 3 and pool.free == 0
    b.close()
    assert pool.free == 2 and [e.name for e in started] == ["a-sib", "a-sib"]


def test_a_shrink_in_one_child_takes_no_sibling_from_the_campaigns_pool():
    """A state divergence (no fault, no history) shrinks in the confirmer's own child: the pool's
    siblings stay free for the fault cases confirmed beside it."""
    pool, free_seen = LanePool(2), []
    needed = [Alloc(2), Free((2,))]

    class StateOnly:
        def standby(self, fresh=None, depth=1):
            pass

        def run(self, config, ops, knobs=None, mode=None, history=None, fresh=False, **kw):
            free_seen.append(pool.free)
            if all(n in ops for n in needed):
                step = max(ops.index(n) for n in needed)
                return Finding(SIG, step, {"step": step, "op": {"op": "free"}, "oracle": "state", "field": "p2v"})
            return None

    ops = [Alloc(1), Alloc(2), Alloc(3), Free((1,)), Free((2,))]
    case = Case.found(config=kvref.PoolConfig(num_pages=16), ops=ops,
                      divergence=StateOnly().run(None, ops), original_len=len(ops))
    done = Confirmer(StateOnly(), tries=2, shrink_jobs=3, sibling=lambda: pytest.fail("a sibling started"),
                     pool=pool).confirm(case)
    assert done.ops == needed and free_seen and set(free_seen) == {2} and pool.free == 2


@pytest.mark.slow
@needs_interpreter
def test_a_fault_fixture_case_shrinks_to_the_same_case_at_width_1_and_3():
    """``exit_nth.py`` (exits on the 5th free of a process), a 30-op sequence of seed 0 on the
    interpreter: the case it kills its child with is shrunk in fresh children one at a time and
    three at a time, to the same ops, 1-minimal both times, with the same count of candidates."""
    from fuzz.engine.generate import regenerate

    spec = TierSpec("interpret", str(REPO / "tests/fixtures/kernels/foreign/exit_nth.py"))
    log_dir = Path(tempfile.mkdtemp(prefix="kvfuzz-lanes-"))

    def make():
        return supervise.Executor(spec, op_timeout=30, log_dir=log_dir, env={"KVFUZZ_FIXTURE_EXIT_AT": "5"})

    config, _, ops = regenerate(0, 30)
    probe = make()
    try:
        found = probe.run(config, ops, fresh=True)
    finally:
        probe.close()
    assert found is not None and found.fault is not None, found
    case = Case.found(config=config, ops=ops[:found.step + 1], divergence=found, original_len=found.step + 1)
    done = {}
    for width, pool in ((1, None), (3, None), ("3 of a spent pool", LanePool(0))):
        executor = make()
        confirmer = Confirmer(executor, tries=3, shrink_jobs=3 if pool else width, sibling=make, pool=pool)
        try:
            done[width] = confirmer.confirm(case)
        finally:
            executor.close()
        assert all(e.jobs <= e.children for e in [executor, *confirmer.lanes.siblings])
        assert bool(confirmer.lanes.siblings) == (width == 3)
    one, three, spent = done[1], done[3], done["3 of a spent pool"]
    assert (spent.config, spent.ops, spent.minimal, spent.reproduced) == (one.config, one.ops, one.minimal,
                                                                          one.reproduced)
    assert one.minimal["one_minimal"] and len(one.ops) < len(case.ops), one.minimal
    assert (three.config, three.ops, three.minimal, three.reproduced) == (one.config, one.ops, one.minimal,
                                                                          one.reproduced)
    # kvfuzz minimize, three at once, shrinks the case as found to the same ops
    path = case.with_fields(kernels=str(spec.kernels), tier="interpret").write(log_dir / "case.json")
    r = kvfuzz("minimize", path, "--shrink-jobs", 3, "--out", log_dir / "min.json", "--op-timeout", 30,
               KVFUZZ_FIXTURE_EXIT_AT="5")
    assert r.returncode == 0 and "1-minimal" in r.stdout and "3 at once" in r.stdout, show(r)
    assert load_case(log_dir / "min.json").ops == one.ops
