"""Guided generation aims at the kill's conjunction: trips x last block, per kernel."""

from __future__ import annotations

import dataclasses
import random

import torch

from fuzz.engine import features, guide, mutations
from tests.fuzz.test_guide import _entry


def _launch(n: int, stride: int, programs: int):
    """A read-table launch as the launch hook sees it: one row of ``n`` live pages, BLOCK 4,
    ``programs`` programs a row, ``stride`` between one program's trips."""
    from kvkernels import triton_kernels

    class FakeLaunch:
        name, fn, args, grid_dims = "read_table_kernel", triton_kernels.read_table_kernel, (), (1, programs)
        kwargs = {"seq_lens_ptr": torch.tensor([n]), "max_pages": 64, "col_stride": stride, "BLOCK": 4, "PAGE_SIZE": 1}

    return FakeLaunch()


def _trips_of(n: int, stride: int, programs: int = 1) -> set[str]:
    out: set[str] = set()
    features.launch_features(_launch(n, stride, programs), out, {})
    return {f for f in out if f.startswith("trips|")}


def test_row_target_gives_the_length_of_the_trips_and_last_block_asked_for():
    """From the goal a two-trip row left (6 pages, 3 short of a third trip, BLOCK 4, stride 4,
    or 8 with two programs), the lengths row_target gives make, per the launch hook, the trips
    and the last block asked for; without an edge, either."""
    for stride, programs in ((4, 1), (8, 2)):
        goals: dict = {}
        features.launch_features(_launch(2 * stride - 2, stride, programs), set(), goals)
        goal = goals["trips|read_table_kernel|2|partial"]
        assert goal[3:] == [2, stride], goal
        for trips, edge in ((3, "partial"), (3, "full"), (2, "full"), (2, "partial")):
            lengths = {mutations.row_target(goal, random.Random(i), trips, edge) for i in range(30)}
            assert len(lengths) == (3 if edge == "partial" else 1), lengths  # BLOCK 4: 1 to 3 pages into the last block
            for n in lengths:
                assert f"trips|read_table_kernel|{features.trip_bucket(trips)}|{edge}" in _trips_of(n, stride, programs), n
        either = {mutations.row_target(goal, random.Random(i)) for i in range(60)}
        assert either == set(range(goal[0] + goal[1], goal[0] + goal[1] + 4)), either  # one more trip, any edge
        assert all(any("|3+|" in f for f in _trips_of(n, stride, programs)) for n in either)


def test_the_aim_is_the_conjunction_no_entry_holds(tmp_path):
    """A stone at 2 trips partial, where 3 trips partial is held: aimed at 3 trips full, never
    at what is held; where everything next to it is held, one more trip either way."""
    c = guide.Corpus(tmp_path)
    c.add(_entry({"trips|k|2|partial", "trips|k|2|full", "trips|k|3+|partial"}))
    goal, why = [6, 3, 4, 2, 4], "trips|k|2|partial"
    assert guide.missing(c.counts, why, goal) == [(3, "full")]
    assert {guide.aim(goal, why, c.counts, random.Random(i)) for i in range(20)} == {(6, 12)}
    c.add(_entry({"trips|k|3+|full"}))
    assert guide.missing(c.counts, why, goal) == []
    assert {guide.aim(goal, why, c.counts, random.Random(i))[1] for i in range(40)} == {9, 10, 11, 12}
    assert guide.aim(None, why, c.counts, random.Random(0)) is None


def test_the_frontier_is_per_kernel_skips_a_closed_one_and_prefers_the_shortest_stride(tmp_path):
    """The packed table (tokens) makes many trips where the paged one makes one: the frontier
    draws a kernel first, leaves out one whose next trip features are all held, and among the
    entries of most trips takes those of the shortest stride (the fewest pages to one more)."""
    c = guide.Corpus(tmp_path)
    c.add({**_entry({"trips|k|1|partial", "op|a1"}), "goals": {"trips|k|1|partial": [3, 2, 4, 1, 4]}})
    c.add({**_entry({"trips|k|1|full", "op|a2"}), "goals": {"trips|k|1|full": [4, 1, 4, 1, 1024]}})
    c.add({**_entry({"trips|p|8+|partial", "op|a3"}), "goals": {"trips|p|8+|partial": [70, 3, 4, 9, 8]}})
    picked = {c.frontier(random.Random(i))[1] for i in range(30)}
    assert picked == {"trips|k|1|partial", "trips|p|8+|partial"}, picked
    c.add(_entry({"trips|p|8+|full"}))  # p's next trips, both edges, are held now
    picked = {c.frontier(random.Random(i))[1] for i in range(30)}
    assert picked == {"trips|k|1|partial"}, picked


def test_a_frontier_plan_is_one_aimed_edit_and_a_fresh_one_is_short(tmp_path, monkeypatch):
    """Fresh sequences run FRESH_OPS ops. A frontier plan on a stone whose stride spans its row
    (the grid covers it: one trip at any length) shrinks the knobs to their smallest, that edit
    alone, and runs AIM_TAIL past the stone's op; once the knobs are the smallest it resizes
    instead, and where no resize can apply (no data flow) it falls back to drawn mutations and
    the full TAIL."""
    from fuzz.engine.tiers import make_tier
    from kvkernels import launchers

    tier = make_tier("torch")
    track = guide.GuidedTrack(tmp_path)
    assert len(track.run_sequence(tier, 0, 200).ops) == guide.FRESH_OPS
    monkeypatch.setattr(guide, "FRESH", 0.0)
    monkeypatch.setattr(guide, "FRONTIER", 1.0)
    monkeypatch.setattr(guide, "AIMED", 1.0)
    least = mutations.smallest(launchers)
    assert least == {"BLOCK_COLS": 4, "BLOCK_IDS": 4, "TARGET_BLOCKS": 2}
    name = "trips|read_table_kernel|1|full"
    wide = {"BLOCK_COLS": 4, "BLOCK_IDS": 4, "TARGET_BLOCKS": 1024}
    for i in range(4):
        track.corpus.add({**_entry({name, f"op|a{i}"}, ops=20), "where": {name: 3}, "knobs": wide,
                          "goals": {name: [4, 4093, 4, 1, 4096]}})
    tier = dataclasses.replace(tier, kernels=launchers)  # plans only: the knobs are the launchers'
    plan = track.plan(tier, 10)
    assert plan["how"] == ["shrink"] and plan["knobs"] == least and plan["length"] == 4 + guide.AIM_TAIL, plan["how"]
    for e in track.corpus.entries:
        e["knobs"], e["goals"] = dict(least), {name: [4, 5, 4, 1, 8]}  # the smallest knobs: 2 programs, stride 8
    plan = track.plan(tier, 11)
    assert plan["how"] != ["resize"] and plan["length"] == 4 + guide.TAIL, plan["how"]  # no pages, no feeds


def test_a_fresh_sequence_ends_at_its_program_budget_and_rebuilds_as_it_ran(tmp_path, monkeypatch):
    """Interpreter: a fresh sequence stops once its launches ran FRESH_PROGRAMS programs (its
    cost there), fewer than FRESH_OPS ops; the entry kept says so, and the parent rebuilds the
    ops it ran from the stream under .seq/."""
    from fuzz.engine.tiers import make_tier

    monkeypatch.setattr(guide, "FRESH_PROGRAMS", 6)
    tier = make_tier("interpret")
    track = guide.GuidedTrack(tmp_path)
    track.plan(tier, 0)
    seq = track.run_sequence(tier, 0, 200)
    assert 0 < len(seq.ops) < guide.FRESH_OPS and seq.divergence is None
    assert track.corpus.entries[0]["ops"] == len(seq.ops)
    _, _, again = track.regenerate(0, len(seq.ops), {"corpus": str(tmp_path), "has": track.worker_info(tier)["has"]})
    assert [op.to_json() for op in again] == [op.to_json() for op in seq.ops]


def test_a_budget_drops_the_first_pure_op_it_refuses_and_ends_the_sequence_there():
    """``run_sequence(budget=)``: the first pure op (a read, a read table) whose launch the budget
    refuses is dropped before it runs; the ops before it are the unbudgeted sequence's, state-
    changing ops' launches are never asked, and the final check still runs clean."""
    from fuzz.engine import launches, tracks
    from fuzz.engine.tiers import make_tier

    tier, track = make_tier("interpret"), tracks.get("small")
    for seed in range(3):
        at, pure = [], []
        stop = launches.observe(lambda launch, pure=pure, at=at: pure.append(len(at) - 1))
        try:
            free = track.run_sequence(tier, seed, 30, on_op=lambda at=at: at.append(1))
        finally:
            stop()
        first = next(i for i in pure if free.ops[i].pure)
        asked = []
        seq = track.run_sequence(tier, seed, 30, budget=lambda n, asked=asked: asked.append(n) or True)
        assert [op.to_json() for op in seq.ops] == [op.to_json() for op in free.ops[:first]], seed
        assert len(asked) == 1 and seq.divergence is None and free.divergence is None

