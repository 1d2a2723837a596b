"""Guided plans screened on the spec (``screen``), the grids a set's launches teach (``spec_features``),
and the edits that reach a conjunction's missing sibling (``conjunctions``)."""

from __future__ import annotations

import random

import kvref
from fuzz.engine import conjunctions, features, generate, guide, screen, spec_features, streams
from fuzz.engine.ops import Flush, ReadTable, ReadTablePacked
from fuzz.engine.tiers import make_tier


def test_a_launchers_grid_is_fitted_across_caps_and_batches_and_a_table_not_seen_is_predicted():
    """A team's launcher gives a row ``min(cdiv(16, bs), cdiv(cap, 8))`` programs (16 in all, blocks of 8):
    from launches at bs 1 and 8, the grid of bs 17 at a cap never seen is fitted, and with it a 17-row
    table's third trip over a partial block is predicted from the op alone."""
    def launcher(bs, cap):
        return (bs * min(-(-16 // bs), -(-cap // 8)),)

    seen = [(bs, cap, launcher(bs, cap), (("STEP", 8), ("W", 1))) for bs, cap in ((1, 12), (1, 30), (8, 30), (8, 9))]
    for bs, cap in ((17, 20), (8, 50), (2, 40), (1, 5)):
        assert spec_features.grid_at("k", seen, bs, 1, cap) == ((("STEP", 8), ("W", 1)), launcher(bs, cap))
    assert spec_features.grid_at("k", seen + [(2, 40, (2 * 7,), (("STEP", 8), ("W", 1)))], 4, 1, 40) is None  # no T fits
    spec_features.forget()
    try:
        for bs, cap, *_ in seen:
            op = ReadTable([list(range(cap))], [0] * bs, [cap] * bs, cap, cap, False)
            spec_features._TABLE[0], spec_features._KEY[0] = spec_features.table_of(op, 1), spec_features.shape_key(op, 1)
            spec_features.derived_trips("k", {"STEP": 8, "W": 1}, launcher(bs, cap), set(), {})
        spec_features.end_op()
        op = ReadTable([list(range(20))], [0] * 17, [20] * 17, 20, 20, False)  # bs 17: never launched
        assert "trips|k|3+|partial" in spec_features.predicted(op, 1)
        one = spec_features.predicted(ReadTable([list(range(20))], [0], [20], 20, 20, False), 1)  # 3 programs: one trip
        assert "trips|k|1|partial" in one and not any(n.startswith(("trips|k|2", "trips|k|3")) for n in one)
        assert spec_features.predicted(ReadTablePacked([[1]], [0], [1], None, [0, 1], 1, 1), 1) == set()  # no packed seen
    finally:
        spec_features.forget()


def test_the_block_is_the_constexpr_whose_value_explains_the_grid_by_name_whatever_the_page_size():
    """A flag that is a power of two (``BUG=2``) and a page size equal to the block (``W=16``, ``STEP=16``)
    left the largest-candidate rule on the flag; a grid of ``cdiv(cap, STEP)`` programs a row votes for
    ``STEP`` by name, so a launch at page size 16 takes 16."""
    spec_features.forget()
    try:
        assert spec_features.block_of({"W": 16, "STEP": 16, "BUG": 2}, 16, 1, 40) == 2  # untaught: the old rule
        spec_features.reveal("k", {"W": 4, "STEP": 16, "BUG": 2}, 3, 34)  # cdiv(34, 16) = 3: STEP, not W nor BUG
        assert spec_features.VOTES["k"] == {"STEP": 1}
        assert spec_features.block_of({"W": 16, "STEP": 16, "BUG": 2}, 16, 1, 40, spec_features.VOTES["k"]) == 16
        spec_features.reveal("k", {"W": 4, "STEP": 16}, 1, 34)  # one program a row says nothing
        assert spec_features.VOTES["k"] == {"STEP": 1}
    finally:
        spec_features.forget()


def test_a_kernel_whose_grid_always_spans_its_table_is_one_trip_and_a_refused_table_notes_nothing():
    spec_features.forget()
    try:
        for cap in range(9, 9 + spec_features.SPANNED):  # one block a program, the legacy grid
            op = ReadTable([list(range(cap))], [0], [cap], cap, cap, False)
            spec_features._TABLE[0] = spec_features.table_of(op, 1)
            spec_features.derived_trips("legacy", {"BLOCK": 8}, (1, -(-cap // 8)), set(), {})
        assert spec_features.one_trip("legacy") and not spec_features.one_trip("other")
        spec_features._TABLE[0] = spec_features.table_of(ReadTable([list(range(40))], [0] * 4, [40] * 4, 40, 40, False), 1)
        spec_features.derived_trips("strided", {"STEP": 8}, (4,), set(), {})  # one program a row over 40: 5 trips
        assert not spec_features.one_trip("strided")
        col = features.Collector()
        spec_features.ACTIVE.append(col)
        spec_features.note_op(ReadTable([[1, 2]], [0], [9], 1, 2, False), _spec("up"), kvref.ContractViolation("no"))
        assert spec_features._TABLE[0] is None  # a hostile probe's lengths claim trips no result shows
    finally:
        spec_features.ACTIVE.clear()
        spec_features.end_op()
        spec_features.forget()


def _spec(grow, **kw):
    return kvref.Allocator(kvref.PoolConfig(num_pages=12, min_page=1, page_size=1, grow=grow, lazy=True, **kw))


def test_a_walk_that_used_its_moves_before_a_pinned_page_is_named_by_its_move_limit():
    """Behind a reader the walk's moves are the batch its flush left pending (``Batches``): at its move
    limit the next source being pinned is not why it stopped."""
    for moves, want in ((0, "move limit"), (1, "move limit"), (8, "pinned page")):
        s, batches = _spec("up", max_moves=moves), spec_features.Batches()
        a, b = s.alloc(3), s.alloc(3)
        s.free(a)
        s.forward(b[1:2])  # the second page from the frontier pinned: the walk moves one first
        s.flush()
        assert batches.flushed(Flush(False), s)[0] == f"spec|flush|up|reader in flight|{want}", moves


def test_a_flushs_missing_siblings_name_the_edit_that_reaches_each():
    ids = {features.feature_id(f"spec|flush|up|{w}|{s}") for w in ("no reader", "reader in flight")
           for s in ("no holes", "frontier met", "pinned page", "move limit")}
    edits = conjunctions.flush_siblings("spec|flush|up|no reader|move limit", ids)
    assert [k for k, _ in edits] == ["config"]  # the other grow direction; a reader is held already
    (_, want), = edits
    assert want(kvref.PoolConfig(16, grow="down", lazy=True)) and not want(kvref.PoolConfig(16, grow="up", lazy=True))
    kinds = [(k, a) for k, a in conjunctions.flush_siblings("spec|flush|down|no reader|move limit", set())]
    assert ("reader", True) in kinds and kinds[0][0] == "config"
    assert conjunctions.flush_siblings("spec|flush|down|no reader|pending 1", set()) == []
    assert conjunctions.flush_siblings("trips|k|2|full", set()) == []


def test_an_ops_first_draws_make_the_kind_asked_for_and_a_reader_is_drawn_before_a_flush(tmp_path):
    """``generate.op_draws`` is the generator's own layout (the kind a draw picks, a flush's urgency);
    ``reader_edit`` draws a forward just before an entry's flush, which is then not urgent: the spec's
    flush meets a reader in flight there, the ops before it unchanged."""
    for scenario in generate.SCENARIOS:
        for kind in ("flush", "forward", "fire", "alloc"):
            draws = generate.op_draws(scenario, kind)
            assert draws is None or generate.drawn_kind(scenario, draws) == kind
    assert generate.op_draws("chain-meet", "flush") is None
    tier = make_tier("torch")
    track = guide.GuidedTrack(tmp_path, screening=False)
    info = track._info(tier)
    for seed in range(40):
        config, scenario, rng = streams.params_of([], seed)
        if not config.lazy or scenario not in generate.SCENARIOS:
            continue
        ops, _, drawn = screen.shadow(info, seed, {}, [], None, 60)
        flushes = [i for i, op in enumerate(ops) if op.kind == "flush"]
        if not flushes:
            continue
        entry = {**drawn, "ops": len(ops)}
        stream, marks = conjunctions.reader_edit(entry, flushes[0], True)
        again, _, _ = screen.shadow(info, seed, entry, stream, marks, flushes[0] + 2)
        assert [o.to_json() for o in again[:flushes[0]]] == [o.to_json() for o in ops[:flushes[0]]]
        assert again[flushes[0]].kind == "forward" and again[flushes[0] + 1] == Flush(False)
        return
    raise AssertionError("no lazy single-pool seed with a flush")


def test_a_plan_is_the_first_drawn_whose_shadow_reaches_a_conjunction_none_holds_and_runs_as_screened(tmp_path):
    """Fresh draws screened: the plan run is one whose shadow reached a flush stop the corpus lacks (the
    first drawn reaches none: its counts hold them all), its ops as drawn under its own seed; what
    ran is what the parent rebuilds."""
    tier = make_tier("torch")
    track = guide.GuidedTrack(tmp_path)
    info = track._info(tier)
    held = {features.feature_id(f"spec|flush|{g}|{w}|{s}") for g in ("up", "down") for w in ("no reader",)
            for s in ("no holes", "frontier met", "move limit")}
    picked = track.screen.pick(lambda a: track._fresh_plan(tier, 7, random.Random(a), a), info, held)
    assert picked.get("screened") and screen.conjunction(picked["screened"]) and all(features.feature_id(n) not in held for n in picked["screened"])
    names: set = set()
    screen.shadow(info, 7, {"r2t": picked["r2t"]}, picked["stream"], picked["marks"], picked["length"], names)
    assert set(picked["screened"]) <= names
    track._plans = {7: picked}
    seq = track.run_sequence(tier, 7, 200)
    _, _, again = track.regenerate(7, len(seq.ops), {"corpus": str(tmp_path), "has": info["has"]})
    assert [o.to_json() for o in again] == [o.to_json() for o in seq.ops]


def test_resample_keeps_the_variants_of_a_stones_table_the_spec_predicts_reach_something_new(tmp_path, monkeypatch):
    """The stone's read table drawn again from the same state: every variant is that kind, the ops
    before it unchanged; the ones predicted to reach a conjunction no entry holds are kept (here: the
    batches of 17 or more rows), as drawn, so the plan runs them; where none is, there is no plan."""
    monkeypatch.setattr(screen, "predicted", lambda op, ps: {"trips|k|3+|partial"} if len(op.seq_lens) >= 17 else set())
    tier = make_tier("torch")
    track = guide.GuidedTrack(tmp_path, screening=False)
    info = track._info(tier)
    for seed in range(60):
        ops, _, drawn = screen.shadow(info, seed, {}, [], None, 80)
        tables = [i for i, op in enumerate(ops) if op.kind == "read_table"]
        if not tables:
            continue
        entry, focus = {**drawn, "ops": len(ops)}, tables[0]
        got = screen.resample(info, seed, entry, focus, set())
        if got is None:  # no variant of 17 rows or more: nothing predicted, no plan
            continue
        stream, marks, kept, names = got
        again, _, _ = screen.shadow(info, seed, entry, stream, marks, focus + 1 + kept)
        assert [o.to_json() for o in again[:focus + 1]] == [o.to_json() for o in ops[:focus + 1]]
        variants = again[focus + 1:focus + 1 + kept]
        assert variants and all(v.kind == "read_table" for v in variants)
        assert names == {"trips|k|3+|partial"} and all(len(v.seq_lens) >= 17 for v in variants)
        return
    raise AssertionError("no read table whose variants reached a batch of 17")


def test_a_seeds_guided_sequences_are_the_same_in_every_run(tmp_path):
    """Planning reads no clock: the yield of an entry is per unit of work (ops and programs) and a
    plan is screened a fixed number of times, so two workers of the same seeds run the same ops (a
    campaign bounded by work, ``--max-sequences``, does the same work on any runner)."""
    tier = make_tier("torch")
    runs = []
    for name in ("a", "b"):
        track = guide.GuidedTrack(tmp_path / name)
        runs.append([[op.to_json() for op in track.run_sequence(tier, s, 200).ops]
                     for s in range(14) if track.plan(tier, s) is not None])
    assert runs[0] == runs[1] and len(runs[0]) == 14
