"""A case that replays: rated from fresh processes only, fault cases shrunk to 1-minimal, flaky sets replayed enough.

The unit tests drive ``Confirmer`` with executors that act out a kernel set whose fault comes
from a process-wide counter (a reused process fails where a fresh one does not) or from two
ops of the case; the campaign tests run the four fixtures of ``benchmarks/replay_matrix.py``
(exit, SIGKILL and hang on the Nth call of a process; a store lost one call in three) on the
interpreter, bounded by work, one seed each (the benchmark runs ten: its table is in
``benchmarks/results/replay-matrix-interpret/``).
"""

from __future__ import annotations

import os

import pytest

import kvref
from fuzz.engine.case import Case
from fuzz.engine.confirm import Confirmer, needless_parts, set_mark
from fuzz.engine.minimize import Minimizer
from fuzz.engine.ops import Alloc, Free
from fuzz.engine.verdict import Fault, Finding, Signature

needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="Triton's interpreter is off (a GPU is present)")
CRASH = Signature("free", "crash", "exit-0")


def _crash(step: int = 0) -> Finding:
    fault = Fault(kind="crash", reason="exit-0", message="exited with status 0", exitcode=0)
    return Finding(CRASH, step, {"step": step, "op": {"op": "free"}, "oracle": "crash", "field": "exit-0",
                                 "message": "exited with status 0"}, fault)


class Process:
    """An executor acting out a kernel set whose Nth free of a process exits it: its counter
    lives as long as its child, and a replay's history counts too. Records each job's ``fresh``."""

    def __init__(self, at: int):
        self.at, self.count, self.fresh = at, 0, []

    def standby(self, fresh=None, depth=1):
        pass

    def run(self, config, ops, knobs=None, mode=None, history=None, fresh=False, **kw):
        self.fresh.append(fresh)
        if fresh:
            self.count = 0
        frees = [sum(1 for op in h["ops"] if op["op"] == "free") for h in history or ()]
        self.count += sum(frees)
        for step, op in enumerate(ops):
            if isinstance(op, Free):
                self.count += 1
                if self.count == self.at:
                    self.count = 0  # the child died: the next job starts a fresh one
                    return _crash(step)
        return None


def _case(ops, finding) -> Case:
    return Case.found(config=kvref.PoolConfig(num_pages=16), ops=ops, divergence=finding, original_len=len(ops))


def _past(ops) -> dict:
    return {"config": kvref.PoolConfig(num_pages=16).to_json(), "ops": [op.to_json() for op in ops], "seed": 0}


def test_a_rate_counts_only_fresh_replays_and_a_reuse_only_failure_goes_to_the_history_search():
    """A set that exits on the 3rd free of a process, a case of two frees: a second replay in the
    same child would fail (the executor's history, not the case's) and make a 1/3 "flaky" rate.
    Every replay of the rate runs fresh, none reproduces, and the worker's history is what it needs."""
    ops = [Alloc(2), Free((1,)), Free((2,))]
    process = Process(at=3)
    history = [_past([Alloc(1), Free((1,))])]
    done = Confirmer(process, tries=3, minimize=False).confirm(_case(ops, _crash(2)), lambda: history)
    assert all(process.fresh), process.fresh
    rate = done.reproduced
    assert rate["k"] == rate["n"] == rate["fresh"] >= 1 and not done.flaky, rate
    assert done.history["reproduced"] and len(done.history["sequences"]) == 1, done.history
    mark = set_mark([done], "exit_nth.py")
    assert mark and "history" in mark["seen"][0]
    assert done.with_fields(nondeterministic=mark).replay_tries() > 1 and done.replay_tries() == 1
    # ... but it fails every time after that history: kvfuzz minimize tries each candidate once
    assert mark["by_chance"] is False and done.with_fields(nondeterministic=mark).shrink_tries() == 1
    old_mark = {k: v for k, v in mark.items() if k != "by_chance"}  # a case file from before by_chance
    assert done.with_fields(nondeterministic=old_mark).shrink_tries() > 1


class TwoOps:
    """A fault that needs two given ops of the case, whatever else runs (a deterministic crash)."""

    def __init__(self, needed):
        self.needed, self.jobs = needed, []

    def standby(self, fresh=None, depth=1):
        pass

    def run(self, config, ops, knobs=None, mode=None, history=None, fresh=False, **kw):
        self.jobs.append((list(ops), fresh))
        if all(n in ops for n in self.needed):
            return _crash(max(ops.index(n) for n in self.needed))
        return None


def test_a_fault_case_is_probed_once_shrunk_in_fresh_children_then_rated_and_is_one_minimal():
    ops = [Alloc(3), Alloc(1), Free((1,)), Alloc(2), Free((2, 3)), Alloc(1), Free((4,)), Alloc(2)]
    needed = [Alloc(2), Free((4,))]
    process = TwoOps(needed)
    case = _case(ops, _crash(6))
    done = Confirmer(process, tries=3).confirm(case)
    assert process.jobs[0] == (ops, True)  # the probe: the case as found, once
    assert all(fresh for _, fresh in process.jobs), "a candidate ran in a reused child"
    assert [op for op in done.ops] == needed and done.lengths == {"original": 8, "minimized": 2}, done.ops
    assert process.jobs[-3:] == [(needed, True)] * 3  # the rate is the minimized case's, after shrinking
    assert done.reproduced == {"k": 3, "n": 3, "fresh": 3} and not done.flaky
    assert done.minimal["one_minimal"] and done.minimal["fresh"], done.minimal
    assert needless_parts(done, TwoOps(needed)) == []
    assert needless_parts(case, TwoOps(needed)) == [f"op {i}" for i in (0, 1, 2, 3, 4, 5, 7)]  # Alloc(2) twice
    lanes = [TwoOps(needed) for _ in range(3)]  # the parts three at once: the same answer, each part once
    assert needless_parts(case, lanes[0], lanes[1:]) == [f"op {i}" for i in (0, 1, 2, 3, 4, 5, 7)]
    assert [len(e.jobs) for e in lanes] == [3, 3, 2] and all(fresh for e in lanes for _, fresh in e.jobs)


HANG = Signature("free", "timeout", "no-progress")


class HangsOn:
    """An executor whose case hangs on the given fresh replays only (a rare hang, or none: a
    stall the machine made), counted from 1."""

    def __init__(self, *on):
        self.on, self.runs = set(on), 0

    def standby(self, fresh=None, depth=1):
        pass

    def run(self, config, ops, knobs=None, mode=None, history=None, fresh=False, **kw):
        self.runs += 1
        if self.runs not in self.on:
            return None
        fault = Fault(kind="timeout", reason="no-progress", message="no progress")
        return Finding(HANG, len(ops) - 1, {"step": len(ops) - 1, "op": {"op": "free"}, "oracle": "timeout",
                                           "field": "no-progress"}, fault)


def test_a_hang_that_does_not_come_back_at_once_is_replayed_more_and_rated_honestly():
    """A hang's first fresh replay that passes is cheap (no op-timeout), so a few more are run:
    a hang that comes back on the third is rated 1 of 3, flaky; one that never does (a stall of
    a loaded host) says it did not reproduce in five fresh processes."""
    ops = [Alloc(2), Free((1,))]
    found = Finding(HANG, 1, {"step": 1, "op": {"op": "free"}, "oracle": "timeout", "field": "no-progress"},
                    Fault(kind="timeout", reason="no-progress", message="no progress"))
    rare = Confirmer(HangsOn(3), tries=5, minimize=False).confirm(_case(ops, found))
    assert rare.reproduced["k"] == 1 and rare.reproduced["n"] == 5 and rare.flaky, rare.reproduced
    assert not (rare.history or {}).get("note"), rare.history
    never = Confirmer(HangsOn(), tries=5, minimize=False).confirm(_case(ops, found))
    assert never.reproduced["k"] == 0 and never.reproduced["n"] == 5, never.reproduced
    assert "did not reproduce in 5 fresh processes: kept as found" in never.history["note"], never.history


def test_a_case_the_candidate_cap_stops_says_so_and_names_kvfuzz_minimize():
    ops = [Alloc(3), Alloc(1), Free((1,)), Alloc(2), Free((2, 3)), Alloc(1), Free((4,)), Alloc(2)]
    done = Confirmer(TwoOps([Alloc(2), Free((4,))]), tries=3, cap=3).confirm(_case(ops, _crash(6)))
    assert done.minimal["one_minimal"] is False and done.minimal["candidates"] <= 3, done.minimal
    assert "kvfuzz minimize" in done.minimal["note"] and "cap of 3" in done.minimal["note"], done.minimal
    assert done.reproduced["k"] == 3  # still rated, from fresh processes


def test_the_minimizer_checks_every_single_removal_of_its_result():
    """Whatever the passes did last, each single op of the result is tried without it: a flag
    the case keeps; a work cap that ends it first leaves the flag down."""
    sig = Signature("free", "state", "p2v")
    ops = [Alloc(2), Free((1, 2)), Alloc(2), Alloc(1), Free((3,))]

    def judge(config, cand):
        return Finding(sig, 0, {"step": 0}) if Free((3,)) in cand and Alloc(1) in cand else None

    m = Minimizer(None, sig, judge=judge)
    _, kept, _ = m.run(kvref.PoolConfig(num_pages=8), ops)
    assert m.one_minimal and all(judge(None, kept[:i] + kept[i + 1:]) is None for i in range(len(kept))), kept
    capped = Minimizer(None, sig, judge=judge, max_replays=2)
    capped.run(kvref.PoolConfig(num_pages=8), ops)
    assert not capped.one_minimal and capped.stopped == "cap"


def test_a_case_kept_as_found_because_its_minimized_version_fails_less_says_so():
    """A state case whose shrunk versions fail on their first two runs only (the minimizer's, and
    the suite's own check of it), then never in its own rate: the case as found is kept, and its
    ``minimal`` says why (a file without it left a reader guessing why 25 ops were not shrunk)."""
    sig = Signature("free", "state", "p2v")
    ops = [Alloc(2), Free((1, 2)), Alloc(2), Alloc(1)]
    runs: dict = {}

    class Replays:
        def standby(self, fresh=None, depth=1):
            pass

        def run(self, config, cand, knobs=None, mode=None, **kw):
            key = (config, tuple(cand))
            runs[key] = runs.get(key, 0) + 1
            full = list(cand) == ops
            return Finding(sig, 1, {"step": 1}) if full or (Free((1, 2)) in cand and runs[key] <= 2) else None

    done = Confirmer(Replays(), tries=5).confirm(_case(ops, Finding(sig, 1, {"step": 1})))
    assert done.ops == ops and done.reproduced["k"] == 5, done
    assert done.minimal["one_minimal"] is False and "failed 0/5" in done.minimal["note"], done.minimal


def test_a_flaky_rate_marks_every_case_of_its_set_and_a_deterministic_set_none():
    sig = Signature("free", "state", "p2v")
    ops = [Alloc(2), Free((1, 2))]
    flaky = _case(ops, Finding(sig, 1, {"step": 1})).with_fields(reproduced={"k": 2, "n": 5, "fresh": 5}, flaky=True)
    steady = _case(ops, _crash(1)).with_fields(reproduced={"k": 3, "n": 3, "fresh": 3}, flaky=False)
    assert set_mark([steady], "x.py") is None
    mark = set_mark([flaky, steady], "x.py")
    assert mark["seen"] == ["free/state/p2v reproduced 2/5"]
    assert steady.replay_tries() == 1 and steady.with_fields(nondeterministic=mark).replay_tries() >= 5
    assert mark["by_chance"] is True and steady.with_fields(nondeterministic=mark).shrink_tries() >= 5
    assert flaky.shrink_tries() >= 5 and steady.shrink_tries() == 1


def test_a_case_of_a_set_failing_by_chance_replays_as_often_as_the_sets_least_reproduced_case_needs():
    """On an H100, flaky.py's case rated 4/5 passed 1 of 20 replays of its 11 tries (its set's other
    case was 3/5); a case rated 0/20 (it failed once, when found) took 1 try and passed 11 of 20."""
    sig = Signature("free", "state", "p2v")
    ops = [Alloc(2), Free((1, 2))]
    lucky = _case(ops, Finding(sig, 1, {"step": 1})).with_fields(reproduced={"k": 4, "n": 5, "fresh": 5}, flaky=True)
    other = lucky.with_fields(reproduced={"k": 3, "n": 5, "fresh": 5})
    mark = set_mark([lucky, other], "flaky.py")
    assert mark["lowest"] == {"k": 3, "n": 5}
    assert lucky.with_fields(nondeterministic=mark).replay_tries() == other.replay_tries() > lucky.replay_tries()
    never = lucky.with_fields(reproduced={"k": 0, "n": 20, "fresh": 20}, flaky=False)
    mark = set_mark([lucky, never], "flaky.py")
    assert mark["lowest"] == {"k": 0, "n": 20}
    assert never.with_fields(nondeterministic=mark).replay_tries() == 50  # no rate rules a pass out: the cap
    assert lucky.with_fields(nondeterministic=mark).replay_tries() == 50


KILL_DRIVER = """
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location("kill_nth", sys.argv[1])
k = importlib.util.module_from_spec(spec); spec.loader.exec_module(k)
v2p, p2v = torch.full((16,), -1, dtype=torch.int64), torch.full((16,), -1, dtype=torch.int64)
for i in range(5):
    print("start", i, flush=True)
    assert k.alloc_bind_inplace(torch.tensor([i]), v2p, p2v, i + 1).tolist() == [i + 1]
    print("done", i, flush=True)
"""


@needs_interpreter
def test_kill_nth_is_killed_on_the_nth_alloc_of_its_process():
    import signal
    import subprocess
    import sys

    from tests.fuzz.test_engine import REPO

    r = subprocess.run([sys.executable, "-c", KILL_DRIVER, str(REPO / "tests/fixtures/kernels/foreign/kill_nth.py")],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "KVFUZZ_FIXTURE_KILL_AT": "3", "TRITON_INTERPRET": "1"})
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr[-2000:])
    assert r.stdout.split() == ["start", "0", "done", "0", "start", "1", "done", "1", "start", "2"], r.stdout


# ---- the fixtures, one campaign each on the interpreter (benchmarks/replay_matrix.py runs ten) ---------


@pytest.mark.slow
@needs_interpreter
@pytest.mark.parametrize("name", ["exit_nth", "kill_nth", "hang_nth", "flaky"])
def test_each_fixture_campaign_gives_cases_that_replay_rated_fresh_and_one_minimal(name, tmp_path):
    from benchmarks.replay_matrix import campaign

    row = campaign(name, 0, "interpret", tmp_path, replays=3 if name == "flaky" else 1, sequences=4)
    assert row["rc"] == 1 and row["cases"], row
    for case in row["cases"]:
        assert case["reproduced"]["k"] >= 1 and case["reproduced"]["fresh"] == case["reproduced"]["n"], case
        assert case["replay_rcs"] and all(rc == 1 for rc in case["replay_rcs"]), case
        if name != "flaky":
            assert not case["flaky"] and case["needless"] == [] and case["minimal"]["one_minimal"], case
        if name == "flaky" or case["history"]:
            assert case["nondeterministic"], case
    assert row["ok"], row
