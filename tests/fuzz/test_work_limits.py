"""Campaigns bounded by work, not time: ``--max-sequences`` / ``--max-ops`` run the
same sequences on any machine for a seed and shard, the budget then only a safety cap;
``--stop-on-first`` ends once the first finding is confirmed, minimized and written; the
summary's ``stopped_by`` says which limit ended a campaign.

The runs here are torch-backend campaigns against ``past_prefix.py`` (its seed-0 sequence 0
fails at op 103 and minimizes to one op): seconds each, whatever the machine's load.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from fuzz.engine.campaign import CampaignOptions, stopped_by
from fuzz.engine.slot import Slot, sequence_seed, share, stop_reason
from fuzz.tools.reports import TIMING, without_timing
from tests.fuzz.test_engine import FAKES, kvfuzz, show

PAST_PREFIX = FAKES / "past_prefix.py"


@pytest.mark.parametrize("total", [0, 1, 5, 7, 12])
@pytest.mark.parametrize("workers", [1, 2, 3, 5])
def test_a_shard_total_splits_into_the_same_sequence_indices_for_any_worker_count(total, workers):
    shares = [share(total, workers, w) for w in range(workers)]
    assert sum(shares) == total and max(shares) - min(shares) <= 1
    opts = CampaignOptions(seed=4, workers=workers, shard=(1, 3))
    seeds = {sequence_seed(opts, w, k) for w in range(workers) for k in range(shares[w])}
    one = CampaignOptions(seed=4, workers=1, shard=(1, 3))
    assert seeds == {sequence_seed(one, 0, k) for k in range(total)}  # the first `total` of the shard's
    assert share(None, workers, 0) is None


def test_a_worker_stops_at_its_share_or_the_budget_whichever_comes_first():
    opts = CampaignOptions(workers=2, max_sequences=5, max_ops=1000)
    never = lambda: False  # noqa: E731
    far = float("inf")
    assert stop_reason(opts, 0, 2, 0, far, never) is None
    assert stop_reason(opts, 0, 3, 0, far, never) == "max-sequences"  # worker 0 of 2 runs 3 of 5
    assert stop_reason(opts, 1, 2, 0, far, never) == "max-sequences"  # worker 1 runs 2
    assert stop_reason(opts, 1, 0, 500, far, never) == "max-ops"
    assert stop_reason(opts, 1, 0, 499, far, never) is None
    assert stop_reason(opts, 1, 0, 0, 0.0, never) == "budget"
    assert stop_reason(CampaignOptions(), 0, 10**6, 10**9, far, lambda: True) == "exhausted"


def _slots(*reasons):
    slots = []
    for i, why in enumerate(reasons):
        slot = Slot(i)
        slot.done, slot.stopped_by = why is not None, why
        slots.append(slot)
    return slots


def test_stopped_by_names_the_budget_when_it_cut_any_worker_short():
    assert stopped_by(None, _slots("max-sequences", "max-sequences")) == "max-sequences"
    assert stopped_by(None, _slots("max-sequences", "budget")) == "budget"
    assert stopped_by(None, _slots("max-ops", None)) == "budget"  # one still running when the loop gave up
    assert stopped_by(None, _slots("max-ops", "max-sequences")) == "max-ops"
    assert stopped_by("first-finding", _slots(None)) == "first-finding"
    assert stopped_by("SIGTERM", _slots("budget")) == "signal"
    assert stopped_by("enough failures", _slots(None)) == "enough-failures"


def _run(out, summary, *extra, **env):
    r = kvfuzz("run", "--backend", "torch", "--kernels", PAST_PREFIX, "--workers", 1, "--seed", 0,
               "--out", out, "--summary", summary, *extra, timeout=300, **env)
    return r, json.loads(summary.read_text()) if summary.exists() else None


def _busy(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def test_same_seed_and_max_sequences_give_identical_cases_and_summaries_idle_and_under_load(tmp_path):
    """Two runs, the second with a busy-loop process on the CPU: byte-identical case files,
    and summaries equal but for their timing fields (reports.TIMING). One hog, not one per core:
    on ci/test.sh's 2-core runner two hogs starved the other pytest worker for as long as the
    run lasted (155 s in a loaded suite run)."""
    out, summary = tmp_path / "cases", tmp_path / "summary.json"
    first, data = _run(out, summary, "--max-sequences", 4)
    assert first.returncode == 1, show(first)
    shutil.move(out, tmp_path / "first")
    hogs = _busy(1)
    try:
        second, again = _run(out, summary, "--max-sequences", 4)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert second.returncode == 1, show(second)
    assert data["stopped_by"] == again["stopped_by"] == "max-sequences" and data["sequences"] == 4, data
    cases = {p.name: p.read_bytes() for p in sorted((tmp_path / "first").iterdir())}
    assert cases and cases == {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    assert without_timing(data) == without_timing(again)
    # the timing fields did differ: they are what was left out (any of them: elapsed_s alone, to the
    # millisecond, can come out equal in two runs by chance)
    assert any(data.get(k) != again.get(k) for k in TIMING), {k: (data.get(k), again.get(k)) for k in TIMING}


def test_stop_on_first_returns_once_the_first_case_is_written_and_minimized(tmp_path):
    """Bounded by work: a 200-sequence limit, but the run stops at the op that failed."""
    out, summary = tmp_path / "cases", tmp_path / "summary.json"
    r, data = _run(out, summary, "--max-sequences", 200, "--stop-on-first")
    assert r.returncode == 1, show(r)
    assert data["stopped_by"] == "first-finding" and "stopped_by=first-finding" in r.stdout, show(r)
    [failure] = data["failures"]
    # the worker stops itself in the sequence that failed: the same work however slow the parent is
    assert data["sequences"] == 1 and data["ops"] == failure["original_ops"], data
    # and what it ran is in the summary: its last stats reached the parent before it was halted
    assert sum(data["by_kind"].values()) == data["ops"], data["by_kind"]
    assert failure["minimized_ops"] < failure["original_ops"] and failure["minimized_ops"] <= 5, failure
    assert failure["reproduced"]["k"] >= 1, failure
    written = json.loads((out / next(p.name for p in out.iterdir())).read_text())
    assert written["lengths"]["minimized"] == len(written["ops"]) == failure["minimized_ops"] and written["minimize"]
    # where its seconds went, in order: the process, the first worker up and its first op, the
    # finding, its rate, its minimization, the rate of the minimized case, the case rewritten
    t, steps = data["timeline"], failure["confirm_timeline"]
    marks = [t["process_start"], 0.0, t["ready"], t["first_op"], failure["found_after_s"], steps["rated"],
             steps["minimized"], steps["rerated"], steps["written"], data["elapsed_s"]]
    assert marks == sorted(marks) and t["process_start"] < 0, (t, steps)
    # what confirming ran, counted at each step's end: the rate's replays, then the minimizer's
    work = failure["confirm_work"]
    assert work["rated"]["replays"] == failure["reproduced"]["n"] >= 1 <= work["rated"]["children"], work
    assert work["rated"]["replays"] < work["minimized"]["replays"] <= work["written"]["replays"], work


def test_the_first_op_is_noted_only_after_the_ready_it_follows():
    """A worker's op count is shared memory, its hello a queue message its feeder thread may
    still hold when the first ops are counted (in 3 of 30 runs of the stop-on-first campaign
    above, at 6528fbe, it came after them).
    A loop pass in between noted the first op before the ready, and the timeline's order above
    failed by chance; the first op waits for the hello."""
    from types import SimpleNamespace

    from fuzz.engine import supervise
    from fuzz.engine.campaign import Campaign
    from fuzz.engine.summary import Summary

    camp = Campaign.__new__(Campaign)
    camp.summary, camp.start = Summary(), 100.0
    slots = [0] * 8
    slots[supervise.OPS] = 3  # counted, the hello not yet come
    camp.slots = [SimpleNamespace(counted={"ops": 0}, child=SimpleNamespace(slots=slots))]
    camp._note_first_op(100.5)
    assert "first_op" not in camp.summary.timeline
    camp.summary.worker_ready(0.7, {})
    camp._note_first_op(100.7)
    assert camp.summary.timeline["ready"] <= camp.summary.timeline["first_op"] == pytest.approx(0.7)


def test_a_work_limit_the_budget_cut_short_is_not_clean(tmp_path):
    r = kvfuzz("run", "--backend", "torch", "--max-sequences", 100000, "--budget-s", 3, "--out", tmp_path / "o",
               "--summary", tmp_path / "s.json", timeout=120)
    assert r.returncode == 2 and "safety cap" in r.stderr and "--max-sequences 100000" in r.stderr, show(r)
    assert json.loads((tmp_path / "s.json").read_text())["stopped_by"] == "budget"


def test_max_ops_ends_each_worker_at_the_sequence_that_reaches_its_share(tmp_path):
    r = kvfuzz("run", "--backend", "torch", "--max-ops", 700, "--workers", 2, "--ops-per-sequence", 100,
               "--out", tmp_path / "o", "--summary", tmp_path / "s.json", timeout=300)
    data = json.loads((tmp_path / "s.json").read_text())
    assert r.returncode == 0 and data["stopped_by"] == "max-ops", show(r)
    assert data["ops"] == 800 and data["sequences"] == 8, data  # 350 each: 4 sequences of 100 per worker
    assert data["options"]["max_ops"] == 700
