"""Value features from the op and the spec (``spec_features``): a team's kernels, whose names and
parameters kvfuzz does not know, get the trips, last-block and kv_start features their planted
bugs need, and an allocator kvfuzz did not write gets how the spec's flush stopped."""

from __future__ import annotations

import functools
import os
import random

import pytest

import kvref
from fuzz.engine import features, guide, spec_features, streams
from fuzz.engine.ops import Alloc, ReadTable, ReadTablePacked
from fuzz.engine.runner import PoolRun
from fuzz.engine.tiers import make_tier
from fuzz.engine.verdict import Divergence
from fuzz.tools import coverage_report

FOREIGN = "tests/fixtures/kernels/foreign"
interpret = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter is off")


def test_the_block_is_the_largest_power_of_two_constexpr_whose_grid_starts_inside_the_table():
    assert spec_features.block_of({"W": 4, "STEP": 8, "BUG": 0}, 4, 2, 20) == 8
    assert spec_features.block_of({"W": 16, "STEP": 8}, 16, 3, 20) == 8  # the page size's constexpr set aside
    assert spec_features.block_of({"W": 8, "STEP": 8}, 8, 1, 20) == 8  # page size and block alike: either
    assert spec_features.block_of({"B": 128}, 1, 2, 100) is None  # a second program would start past the table
    assert spec_features.block_of({"PS": 1, "BUG": 2}, 1, 1, 9) == 2  # a 0/1/2 flag is a candidate at worst
    # a block as long as the page beside a flag of 2: the page size set aside once, not the block with it
    # (team_tables_kv_start.py at page size 16 passes W=16, STEP=16, BUG=2: a block of 2 counts eight times the trips)
    assert spec_features.block_of({"W": 16, "STEP": 16, "BUG": 2}, 16, 3, 34) == 16
    assert spec_features.block_of({"N": 6}, 1, 1, 9) is None


def _derived(lengths, dims, constexprs, page_size=1, cap=None, starts=None):
    spec_features._TABLE[0] = spec_features.Table(tuple(lengths), cap or max(lengths), page_size, starts)
    out, goals = set(), {}
    try:
        spec_features.derived_trips("k", constexprs, dims, out, goals)
    finally:
        spec_features.end_op()
    return out, goals


def test_trips_follow_the_strided_loop_over_a_flat_or_a_2d_grid():
    out, goals = _derived([20] * 17, (17,), {"STEP": 8})  # 17 rows, one program each: 0-7, 8-15, 16-19
    assert "trips|k|3+|partial" in out and "mask|k|row/8|partial" in out
    assert goals["trips|k|3+|partial"] == [20, 5, 8, 3, 8]
    out, _ = _derived([16] * 4, (8,), {"STEP": 8}, cap=16)  # 2 programs a row, stride 16: one full trip each
    assert {n for n in out if n.startswith("trips")} == {"trips|k|1|full"}
    out, _ = _derived([5, 40], (2, 3), {"BLOCK": 16}, cap=40)  # the legacy grid: one trip by construction
    assert "trips|k|1|partial" in out and "trips|k|0|none" in out and not any("|2|" in n for n in out)
    assert _derived([5], (3,), {"STEP": 8}) == (set(), {})  # 3 programs for 1 row, none may start past 5: no block


def test_a_packed_rows_kv_start_is_named_against_its_trips_with_a_goal():
    out, goals = _derived([40, 3], (2,), {"W": 4, "STEP": 16}, page_size=4, cap=43, starts=(1, 4))
    assert {"start|k|unaligned|trips 3+", "start|k|aligned|trips 1"} <= out
    assert goals["start|k|unaligned|trips 3+"] == [40, 9, 16, 3, 16]
    assert guide.missing({}, "start|k|unaligned|trips 3+", goals["start|k|unaligned|trips 3+"]) == []  # never past 3
    assert guide.missing({}, "start|k|unaligned|trips 2", [20, 13, 16, 2, 16]) == [(3, None)]  # the same start, a trip on
    assert guide.missing({features.feature_id("start|k|unaligned|trips 3+")}, "start|k|unaligned|trips 2",
                         [20, 13, 16, 2, 16]) == []
    # an aligned row of 2+ trips is a stone for an unaligned one as long (``mutations.realign``); of 1 trip, none
    assert guide.missing({}, "start|k|aligned|trips 4-7", [70, 11, 16, 5, 16]) == [(5, None)]
    assert guide.missing({features.feature_id("start|k|unaligned|trips 4-7")}, "start|k|aligned|trips 4-7",
                         [70, 11, 16, 5, 16]) == []
    assert guide.missing({}, "start|k|aligned|trips 1", goals["start|k|aligned|trips 1"]) == []
    assert guide.aimed_edit({"goals": goals}, "start|k|aligned|trips 1", None) == "realign"
    # at page size 1 no start is unaligned: a row of one trip aims at two, one of 2+ at as long (paged by reconfig)
    assert guide.missing({}, "start|k|page size 1|trips 1", [10, 7, 16, 1, 16]) == [(2, None)]
    assert guide.missing({}, "start|k|page size 1|trips 4-7", [70, 11, 16, 5, 16]) == [(5, None)]
    assert guide.missing({}, "start|k|page size 1|trips 0", [0, 1, 16, 0, 16]) == []
    assert guide.missing({features.feature_id("start|k|unaligned|trips 2")}, "start|k|page size 1|trips 2",
                         [20, 13, 16, 2, 16]) == []


def _run_table(kernels, op, page_size=1, tokens=40):
    """``op`` (its rows over tokens 0..tokens-1 of one alloc) on ``kernels`` under a collector: its
    feature names, and the divergence it made (None: clean)."""
    tier = make_tier("interpret", f"{FOREIGN}/{kernels}")
    run = PoolRun(kvref.PoolConfig(num_pages=64, min_page=1, page_size=page_size), tier)
    toks = run.step(Alloc(tokens)).result
    op = op(toks)
    with features.Collector() as col:
        col.at([], 0)
        try:
            run.step(op)
            found = None
        except Divergence as d:
            found = d
    return col.names, found


@interpret
@pytest.mark.parametrize("fixture", ["team_tables.py", "team_tables_third_trip.py"])
def test_a_teams_read_table_reaches_three_trips_with_a_partial_block_as_its_bug_needs(fixture):
    def op(pages):
        return lambda toks: ReadTable([toks[:24]], [0] * 17, [pages] * 17, pages, 24, False)

    names, found = _run_table(fixture, op(20))
    assert "trips|_gather_pages|3+|partial" in names
    assert (found is not None) == (fixture == "team_tables_third_trip.py")  # the feature is the bug's shape
    assert not [n for n in names if any(p in n for p in ("lens", "hop", "per_row", "STEP"))]  # nothing keyed on names
    names, found = _run_table(fixture, op(16))  # two full trips: the bug stays hidden
    assert "trips|_gather_pages|2|full" in names and not any("3+" in n for n in names) and found is None


@interpret
def test_a_table_the_spec_refuses_is_probed_but_names_no_trip_reached():
    """seq_lens past max_pages: SPEC promises memory safety, so the kernel runs as a probe (its grid
    is seen), but no oracle checks what it reads: its trips must not count as reached."""
    def op(max_pages):
        return lambda toks: ReadTable([toks[:24]], [0] * 17, [20] * 17, max_pages, 24, False)

    checked, _ = _run_table("team_tables.py", op(20))
    probed, _ = _run_table("team_tables.py", op(8))
    assert "trips|_gather_pages|3+|partial" in checked
    assert "grid|_gather_pages|dim0|5" in probed  # the probe launched
    assert not [n for n in probed if n.split("|")[0] in ("trips", "mask", "progress", "start")]


@interpret
@pytest.mark.parametrize("start", [1, 0])
def test_a_teams_packed_table_loses_an_unaligned_kv_start_on_its_second_trip(start):
    def op(toks):
        return ReadTablePacked([toks[:48]], [0] * 4, [40, 1, 1, 1], [start, 0, 0, 0], [0, 40, 41, 42, 43], 43, 48)

    names, found = _run_table("team_tables_kv_start.py", op, page_size=4, tokens=48)
    assert f"start|_gather_tokens|{'unaligned' if start else 'aligned'}|trips 3+" in names
    assert (found is not None) == bool(start)


def _spec(grow, **kw):
    return kvref.Allocator(kvref.PoolConfig(num_pages=12, min_page=1, page_size=1, grow=grow, lazy=True, **kw))


@pytest.mark.parametrize("grow", ["up", "down"])
def test_a_flush_is_named_by_how_the_walk_stopped(grow):
    s = _spec(grow)
    s.flush()
    assert spec_features.flush_features(s)[0] == f"spec|flush|{grow}|no reader|no holes"
    a, b = s.alloc(4), s.alloc(2)
    s.free(a[:2])
    s.forward(b)  # the frontier's pages are the in-flight forward's: the walk may not move them
    s.flush()
    assert spec_features.flush_features(s) == [f"spec|flush|{grow}|reader in flight|pinned page",
                                               f"spec|flush|{grow}|reader in flight|pending 0"]
    s.fire()
    s.flush()  # moved now, the holes absorbed: nothing left to walk
    assert spec_features.flush_features(s)[0] in (f"spec|flush|{grow}|no reader|no holes",
                                                  f"spec|flush|{grow}|no reader|frontier met")
    s = _spec(grow, max_moves=1)
    a, b = s.alloc(4), s.alloc(3)
    s.free(a)
    s.forward([])  # a reader in flight that writes nothing: only the move limit stops the walk
    s.flush()
    assert spec_features.flush_features(s)[0] == f"spec|flush|{grow}|reader in flight|move limit"
    assert spec_features.flush_features(s)[1] == f"spec|flush|{grow}|reader in flight|pending 1"
    for cap, stop in ((1, "move limit at a pinned page"), (8, "pinned page")):  # the cap barred the pinned page, or the pin
        s = _spec(grow, max_moves=cap)
        a, b = s.alloc(4), s.alloc(3)
        s.free(a[:2])
        second = sorted((s.v2p[v] for v in b), reverse=grow == "up")[1]  # the walk's second source
        s.forward([s.p2v[second]])  # one move, then a page the forward writes
        s.flush()
        assert spec_features.flush_features(s)[0] == f"spec|flush|{grow}|reader in flight|{stop}"


@interpret
def test_coverage_names_a_teams_kernels_with_the_trips_reached_and_never_reached(tmp_path):
    tier = make_tier("interpret", f"{FOREIGN}/team_tables.py")
    track = guide.GuidedTrack(tmp_path)
    for seed in range(3):
        track.plan(tier, seed)
        track.run_sequence(tier, seed, 40)
    rep = coverage_report.report([tmp_path])
    assert {"_gather_pages", "_gather_tokens"} <= set(rep["kernels"])
    pages = rep["kernels"]["_gather_pages"]
    assert any(r.startswith("trips ") for r in pages["reached"])
    assert "no program ever ran 3+ trips with a partial last block" in pages["never"]


def test_coverage_lists_a_teams_kernel_bodies_once_a_sequence_traced_them(tmp_path, monkeypatch):
    """The team's file is read back from where the corpus noted it; its ``@triton.jit`` bodies are
    traced on the interpreter one guided sequence in ``KERNEL_CODE_EVERY``, and until one was, the
    report leaves them out and says so, rather than calling every kernel "never entered"."""
    monkeypatch.setattr(guide, "CODE_EVERY", 1)
    monkeypatch.setattr(guide, "KERNEL_CODE_EVERY", 2)
    tier = make_tier("interpret", f"{FOREIGN}/team_tables.py")
    track = guide.GuidedTrack(tmp_path)
    track.plan(tier, 0)
    track.run_sequence(tier, 0, 40)
    rep = coverage_report.report([tmp_path])
    assert "_gather_pages" not in rep["code"]["foreign/team_tables.py"] and not rep["kernel_bodies"]
    assert "@triton.jit bodies: not listed" in coverage_report.text(rep)
    track.plan(tier, 1)
    track.run_sequence(tier, 1, 40)  # the kernel bodies traced
    rep = coverage_report.report([tmp_path])
    assert rep["kernel_bodies"] and rep["code"]["foreign/team_tables.py"]["_gather_pages"]["lines"] > 10


def test_a_conjunction_its_config_cannot_reach_asks_for_the_one_config_draw_that_can():
    from fuzz.engine.generate import random_config
    from fuzz.engine.streams import ChoiceRandom

    ids = {features.feature_id(n) for n in ("start|k|page size 1|trips 2", "spec|flush|up|reader in flight|pinned page",
                                            "spec|flush|down|reader in flight|frontier met",
                                            "spec|flush|up|reader in flight|frontier met")}
    paged, = streams.reconfig_wants("trips|k|2|partial", ids)
    assert paged(kvref.PoolConfig(num_pages=8, page_size=4)) and not paged(kvref.PoolConfig(num_pages=8))
    assert streams.reconfig_wants("trips|k|2|partial", ids | {features.feature_id("start|k|unaligned|trips 2")}) == []
    flip, limit = streams.reconfig_wants("spec|flush|up|reader in flight|pinned page", ids)  # the other way; a short walk
    assert flip(kvref.PoolConfig(num_pages=8, grow="down")) and not flip(kvref.PoolConfig(num_pages=8, grow="up"))
    assert limit(kvref.PoolConfig(num_pages=8, grow="up", max_moves=2)) and not limit(kvref.PoolConfig(num_pages=8, grow="up"))
    shorter, = streams.reconfig_wants("spec|flush|down|reader in flight|frontier met", ids)  # its sibling: the move limit
    assert shorter(kvref.PoolConfig(num_pages=8, grow="down", max_moves=1))
    assert not shorter(kvref.PoolConfig(num_pages=8, grow="down", max_moves=64))
    assert streams.reconfig_wants("code|x|1>2", ids) == []
    # a walk capped at a pinned page: a shorter cap (the next move free) and a longer (the pin) are its siblings
    capped = "spec|flush|down|reader in flight|move limit at a pinned page"
    shorter, longer = streams.reconfig_wants(capped, ids | {features.feature_id(capped.replace("down", "up"))})
    assert shorter(kvref.PoolConfig(num_pages=8, grow="down", max_moves=1))
    assert longer(kvref.PoolConfig(num_pages=8, grow="down", max_moves=64))
    assert not longer(kvref.PoolConfig(num_pages=8, grow="down"))  # the default cap, 8

    draws = ChoiceRandom((), "kvfuzz-config:0")
    base = random_config(draws)
    stream = [*draws.log, 0.5, 0.25, 0.75]
    assert (base.grow, base.page_size, base.lazy) == ("down", 4, True)  # seed 0's: each want below differs
    for want in (functools.partial(streams._pool_shape, grow="up"), lambda c: c.page_size == 1):
        tuned = streams.retune(stream, 0, want, random.Random(0))
        got = random_config(ChoiceRandom(tuned, "x"))
        assert want(got) and tuned[len(draws.log):] == stream[len(draws.log):]  # the ops' draws untouched
        changed = [f for f in ("page_size", "grow", "lazy", "max_moves", "multiplier", "min_page") if getattr(got, f) != getattr(base, f)]
        assert len(changed) <= 1 or changed == ["page_size"]  # one draw: at most the field asked for

