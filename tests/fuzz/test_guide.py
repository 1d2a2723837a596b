"""Guided generation: features, the corpus on disk, merge, the coverage report."""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from fuzz.engine import features, generate, guide, mutations, streams
from fuzz.engine.corpus import FORMAT, merge
from fuzz.engine.tiers import make_tier
from fuzz.tools import coverage_report
from tests.fuzz.test_engine import REPO, cli_env, kvfuzz


def test_a_choice_stream_replays_the_ops_it_made_and_a_mutation_stays_valid(tmp_path, monkeypatch):
    """What the worker ran is what the parent rebuilds from the stream it wrote under .seq/
    (a dead worker's case), for a fresh and for a mutated sequence; mutations change streams."""
    monkeypatch.setattr(guide, "SEED_ENTRIES", 1)
    tier = make_tier("torch")
    track = guide.GuidedTrack(tmp_path)
    ran = {}
    for seed in range(6):
        track.plan(tier, seed)
        seq = track.run_sequence(tier, seed, 30)
        assert seq.divergence is None, seq.divergence
        ran[seed] = [op.to_json() for op in seq.ops]
        _, _, again = track.regenerate(seed, 30, {"corpus": str(tmp_path), "has": track.worker_info(tier)["has"]})
        assert [op.to_json() for op in again] == ran[seed]
    assert track.kept >= 1
    seed = next(s for s in range(6, 60) if track.plan(tier, s)["how"] != ["fresh"])
    seq = track.run_sequence(tier, seed, 30)  # a mutated stream: still a valid sequence, still rebuilt as it ran
    assert seq.divergence is None, seq.divergence
    _, _, again = track.regenerate(seed, 30, {"corpus": str(tmp_path), "has": track.worker_info(tier)["has"]})
    assert [op.to_json() for op in again] == [op.to_json() for op in seq.ops]
    entry = track.corpus.entries[0]
    changed = [guide.mutate(entry, entry, random.Random(i), tier.kernels)[0] != entry["stream"] for i in range(8)]
    assert sum(changed) >= 4, changed


def test_launch_features_count_trips_and_the_last_block_of_a_read_table():
    """A read table of 10 live pages, BLOCK 4, one column program (col_stride 4): trips 3 with
    a partial last block (cols 8..11 for 10 pages); 12 pages: its last block full."""
    class FakeLaunch:
        name = "read_table_kernel"

        def __init__(self, n):
            import torch

            from kvkernels import triton_kernels

            self.fn = triton_kernels.read_table_kernel
            self.args = ()
            self.kwargs = {"seq_lens_ptr": torch.tensor([n]), "max_pages": 64, "col_stride": 4, "BLOCK": 4, "PAGE_SIZE": 1}
            self.grid_dims = (1, 1)

    for n, edge in ((10, "partial"), (12, "full")):
        out: set[str] = set()
        features.launch_features(FakeLaunch(n), out)
        assert f"trips|read_table_kernel|3+|{edge}" in out, sorted(out)
        assert "mask|read_table_kernel|max_pages/BLOCK|full" in out
    assert features.feature_id("trips|k|1|full") >> 40 == features.DOMAINS.index("trips")
    assert features.feature_id("code|a>b") != features.feature_id("code|b>a")



def test_a_gpu_read_tables_trips_come_from_the_host_copy_of_its_rows_and_the_device_is_never_read():
    """On CUDA a read table's seq_lens lives on the GPU: its trips features come from the values the
    runner copied there (``features.host_copy``, noted in ``PoolRun.batch``), matched by pointer and
    size; a tensor nobody noted, or one of another size at that pointer, gives none, and the
    device tensor's values are never asked for."""
    from kvkernels import triton_kernels

    class OnGpu:  # a stand-in CUDA tensor: reading its values fails the test
        is_cpu = False

        def __init__(self, ptr, n):
            self.ptr, self.n = ptr, n

        def data_ptr(self):
            return self.ptr

        def numel(self):
            return self.n

        def tolist(self):
            raise AssertionError("the device was read")

    def launch(lens):
        return type("L", (), {"name": "read_table_kernel", "fn": triton_kernels.read_table_kernel, "args": (),
                              "grid_dims": (1, 1), "kwargs": {"seq_lens_ptr": lens, "max_pages": 64, "col_stride": 4,
                                                              "BLOCK": 4, "PAGE_SIZE": 1}})

    noted = OnGpu(0x7F00, 1)
    features.host_copy(noted, [10])
    out: set[str] = set()
    features.launch_features(launch(noted), out)
    assert "trips|read_table_kernel|3+|partial" in out, sorted(out)
    for stranger in (OnGpu(0x8F00, 1), OnGpu(0x7F00, 2)):  # not noted; noted, but not this size
        out = set()
        features.launch_features(launch(stranger), out)
        assert "mask|read_table_kernel|max_pages/BLOCK|full" in out and not any(f.startswith("trips|") for f in out)
    features.host_copy(OnGpu(0x9F00, 1), [3])  # the next op's rows replace the last op's
    out = set()
    features.launch_features(launch(noted), out)
    assert not any(f.startswith("trips|") for f in out), out


def test_a_launch_shapes_features_are_memoized_and_its_trips_are_not():
    """The same shape again gives the same features from the memo; another size others; and a
    row of other contents in a tensor of the same size its own trips (read from it every time)."""
    import torch

    from kvkernels import triton_kernels

    def launch(lens, max_pages=64):
        return type("L", (), {"name": "read_table_kernel",
                              "fn": triton_kernels.read_table_kernel, "args": (), "grid_dims": (1, 1),
                              "kwargs": {"seq_lens_ptr": torch.tensor(lens), "max_pages": max_pages, "col_stride": 4,
                                         "BLOCK": 4, "PAGE_SIZE": 1}})

    features._MEMO.clear()
    first, again, other, longer = set(), set(), set(), set()
    features.launch_features(launch([10]), first)
    held = len(features._MEMO)
    assert held >= 2  # the launch's entry, and max_pages's
    features.launch_features(launch([10]), again)
    assert again == first and len(features._MEMO) == held
    features.launch_features(launch([10], max_pages=63), other)
    assert "mask|read_table_kernel|max_pages/BLOCK|partial" in other - first and len(features._MEMO) == held + 2  # its entry, its max_pages
    features.launch_features(launch([5]), longer)
    assert "trips|read_table_kernel|2|partial" in longer and "trips|read_table_kernel|3+|partial" in first - longer
    # the memo keys a kernel by its id: an entry whose kernel is another object (a freed kernel's
    # id taken again) is built anew, not served
    for key, entry in list(features._MEMO.items()):
        if getattr(entry, "fn", None) is triton_kernels.read_table_kernel:
            features._MEMO[key] = entry._replace(names=("grid|stale",), fn=object())
    fresh = set()
    features.launch_features(launch([10]), fresh)
    assert fresh == first


def test_a_collector_alone_takes_launches_light_and_reaches_what_described_launches_do(monkeypatch):
    """With a collector the only observer, the hook builds no ``Launch`` (``launches._run_light``),
    nor does the collector (a new shape's entry is read from the kernel's parameters), and a
    sequence reaches the same features at the same ops, with the same goals and programs, as when
    another observer makes the hook describe every launch."""
    from fuzz.engine import launches, tracks

    tier, track = make_tier("interpret"), tracks.get("small")
    described, real = [0], launches._describe

    def counting(*a, **k):
        described[0] += 1
        return real(*a, **k)

    monkeypatch.setattr(launches, "_describe", counting)
    runs = []
    for extra in (None, lambda launch: None):
        features._MEMO.clear()
        stop = launches.observe(extra) if extra else (lambda: None)
        described[0] = 0
        try:
            with features.Collector() as col:
                light = launches._LIGHT[0]
                track.run_sequence(tier, 3, 60)
        finally:
            stop()
        runs.append((light, described[0], col.names, col.where, col.goals, col.programs))
    (light, n_light, *got), (heavy, n_heavy, *want) = runs
    assert got == want and got[0] and got[-1] > 0
    assert light and not heavy and n_light == 0 < n_heavy


def test_a_deferred_collector_reaches_the_same_features_at_the_same_ops(tmp_path, monkeypatch):
    """The CUDA tier's collector makes a launch's features at its op's end (``deferred``): the
    guided track's sequences keep the same features, the same op for each (``where``) and the same
    goals, and a launch's programs are counted at once (a fresh sequence's launch budget reads
    them between launches: here, as each op begins, before the launches kept are made). Run
    here on the interpreter, deferred and not."""
    from fuzz.engine import features as feats

    monkeypatch.setattr(guide, "SEED_ENTRIES", 10**6)  # every sequence fresh: the same ops both ways
    tier, kept = make_tier("interpret"), {}
    for deferred in (False, True):
        made, programs = [], []

        class Probe(feats.Collector):
            def __init__(self, code, deferred=False, flag=deferred, made=made):
                super().__init__(code, deferred=flag)
                made.append(self)

            def at(self, marks, pos, programs=programs):
                programs.append(self.programs)
                super().at(marks, pos)

        monkeypatch.setattr(guide, "Collector", Probe)
        track, ops = guide.GuidedTrack(tmp_path / str(deferred)), []
        for seed in range(2):
            track.plan(tier, seed)
            seq = track.run_sequence(tier, seed, 40)
            assert seq.divergence is None, seq.divergence
            ops.append([op.to_json() for op in seq.ops])
        entries = [{k: e[k] for k in ("features", "where", "goals", "ops")} for e in track.corpus.entries]
        kept[deferred] = (ops, entries, programs, [c._pending is not None for c in made])
    (ops, entries, programs, flags), (d_ops, d_entries, d_programs, d_flags) = kept[False], kept[True]
    assert d_ops == ops and d_entries == entries and d_programs == programs and programs[-1] > 0
    assert not any(flags) and len(d_flags) == 2 and all(d_flags)
    assert len({op for e in entries for op in e["where"].values()}) > 3  # features first reached at several ops


def test_the_corpus_survives_a_killed_campaign_and_the_next_one_resumes_from_it(tmp_path):
    corpus = tmp_path / "corpus"
    cmd = [sys.executable, "-m", "fuzz", "run", "--corpus", str(corpus), "--budget-s", "300",
           "--out", str(tmp_path / "out"), "--ops-per-sequence", "30"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=cli_env(),
                            start_new_session=True)
    start = time.monotonic()
    try:
        while len(list(corpus.glob("*.json"))) < guide.SEED_ENTRIES:
            assert proc.poll() is None and time.monotonic() - start < 120, "no corpus entry written in time"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    kept = guide.Corpus(corpus)
    assert len(kept.entries) >= guide.SEED_ENTRIES and all(e["features"] and e["stream"] for e in kept.entries)
    before = set(kept._files)
    shutil.rmtree(corpus / ".seq")  # the killed run's streams: what the resumed run writes is its own
    # A few sequences, bounded by work, not seconds (a loaded machine's workers may not even be up
    # in 15 s). A run that ignored the corpus would draw each of them fresh: it would hold fewer
    # than SEED_ENTRIES entries of its own before the last one. Which plans are fresh is seeded.
    r = kvfuzz("run", "--corpus", corpus, "--max-sequences", guide.SEED_ENTRIES, "--out", tmp_path / "out2",
               "--ops-per-sequence", 30, "--json")
    assert r.returncode == 0, r.stderr
    after = guide.Corpus(corpus)
    assert before <= set(after._files)  # nothing lost; what it found is added to the same directory
    seqs = [json.loads(p.read_text()) for p in (corpus / ".seq").glob("*.json")]
    # a mutation of a corpus entry carries the entry's op marks; a fresh sequence has none
    assert seqs and any(s.get("marks") for s in seqs), "the resumed run mutated no loaded entry"


def _entry(features_, ops=10):
    rng = random.Random(f"{sorted(features_)} {ops}")  # its stream the same in every run (a test's mutations of it too)
    return {"stream": [rng.random() for _ in range(ops)], "marks": list(range(1, ops)), "knobs": None, "r2t": "int64",
            "features": sorted(features_), "ops": ops, "cost_s": 0.1}


def test_merge_keeps_the_smallest_subset_covering_the_union(tmp_path):
    a, b = guide.Corpus(tmp_path / "a"), guide.Corpus(tmp_path / "b")
    assert a.add(_entry({"op|alloc", "op|free"}, ops=50))
    assert a.add(_entry({"op|flush"}, ops=5))
    assert b.add(_entry({"op|alloc", "op|free", "op|flush"}, ops=20))  # covers both of a's
    assert b.add(_entry({"hostile|translate"}, ops=5))
    assert not b.add(_entry({"op|alloc"}))  # nothing new: not kept
    read, kept, n = merge([tmp_path / "a", tmp_path / "b"], tmp_path / "m")
    assert (read, kept, n) == (4, 2, 4)
    merged = guide.Corpus(tmp_path / "m")
    assert merged.features == a.features | b.features
    assert sorted(e["ops"] for e in merged.entries) == [5, 20]
    r = kvfuzz("merge", "--corpus", tmp_path / "a", tmp_path / "nowhere", "--out", tmp_path / "m2")
    assert r.returncode == 2 and "nowhere" in r.stderr


def test_entries_of_an_older_format_are_not_read_and_the_campaign_says_so(tmp_path):
    """A nightly corpus kept by an older kvfuzz: its streams replay differently, so they are left
    out, and the worker's hello notes it (the campaign prints a worker's notes)."""
    root = tmp_path / "corpus"
    kept = guide.Corpus(root)
    assert kept.add(_entry({"op|alloc"}, ops=5)) and kept.note() is None
    (root / "old.json").write_text(json.dumps({**_entry({"op|free"}), "format": "kvfuzz-corpus/2"}))
    again = guide.Corpus(root)
    assert len(again.entries) == 1 and again.other_formats == {"kvfuzz-corpus/2": 1}
    assert "1 entries not read (1 of kvfuzz-corpus/2" in again.note() and FORMAT in again.note()
    info = guide.GuidedTrack(root).worker_info(make_tier("torch"))
    assert any("kvfuzz-corpus/2" in n for n in info["notes"]), info


def test_the_report_names_what_no_sequence_reached(tmp_path):
    c = guide.Corpus(tmp_path)
    c.add(_entry({"trips|read_table_kernel|1|partial", "trips|read_table_kernel|2|partial",
                  "mask|bind_kernel|N/BLOCK|partial", "code|kvref/allocator.py|-1>100"}))
    rep = coverage_report.report([tmp_path])
    never = rep["kernels"]["read_table_kernel"]["never"]
    assert "no program ever ran 3+ trips with a partial last block" in never
    assert "no program ever ran 2 trips with a partial last block" not in never
    assert rep["kernels"]["bind_kernel"]["never"] == ["N/BLOCK: never a full last block"]
    alloc = rep["code"]["kvref/allocator.py"]
    assert any(v["never"] for v in alloc.values()) and rep["features"]["code"] == 1
    r = kvfuzz("coverage", tmp_path)
    assert r.returncode == 0 and "never: read_table_kernel: no program ever ran 3+ trips" in r.stdout
    assert "bind_kernel: reached 1: N/BLOCK partial\n" in r.stdout, r.stdout  # what was reached, named
    assert "read_table_kernel: reached 2: trips 1 (partial last block), trips 2 (partial last block)\n" in r.stdout


def test_guided_is_the_small_tracks_only(tmp_path):
    r = kvfuzz("run", "--corpus", tmp_path / "c", "--scale", "production", "--budget-s", 1, "--out", tmp_path)
    assert r.returncode == 2 and "--scale small" in r.stderr


def _never(rep: dict) -> set[str]:
    out = {f"{k}: {why}" for k, v in rep["kernels"].items() for why in v["never"]}
    return out | {f"{f}:{line}" for f, per in rep["code"].items() for v in per.values() for line in v["never"]}


def test_what_blind_sequences_never_reached_is_named_and_guided_ones_reach_some_of_it(tmp_path, monkeypatch):
    """Interpreter, our kernels: a corpus of blind sequences (every plan fresh), its report's
    never-reached list; guided sequences resumed from that corpus reach items of that list."""
    import shutil

    tier = make_tier("interpret")
    monkeypatch.setattr(guide, "CODE_EVERY", 1)
    monkeypatch.setattr(guide, "FRESH", 1.0)
    blind = guide.GuidedTrack(tmp_path / "blind")
    for seed in range(5):
        blind.plan(tier, seed)
        blind.run_sequence(tier, seed, 40)
    never = _never(coverage_report.report([tmp_path / "blind"]))
    assert any("trips" in n for n in never) and any("kvref/allocator.py" in n for n in never)
    shutil.copytree(tmp_path / "blind", tmp_path / "guided", ignore=shutil.ignore_patterns(".seq"))
    monkeypatch.setattr(guide, "FRESH", 0.0)
    monkeypatch.setattr(guide, "SEED_ENTRIES", 1)
    guided = guide.GuidedTrack(tmp_path / "guided")
    for seed in range(5, 12):
        assert guided.plan(tier, seed)["how"] != ["fresh"]
        guided.run_sequence(tier, seed, 40)
    reached = never - _never(coverage_report.report([tmp_path / "guided"]))
    assert reached, "guided sequences reached nothing the blind ones had not"


def test_the_fixture_bugs_still_apply_to_our_kernels():
    from fuzz.tools.mutants import FIXTURES, SRC, mutated_source

    for m in FIXTURES:
        assert mutated_source(m) != (SRC / m.file).read_text()


def test_the_state_machine_reports_its_features_to_hypothesis_target(monkeypatch):
    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test

    from fuzz.engine import strategies

    seen = []
    monkeypatch.setattr(strategies, "target", lambda value, label: seen.append((label, value)))
    run_state_machine_as_test(strategies.DifferentialMachine,
                              settings=settings(max_examples=3, stateful_step_count=6, deadline=None, database=None))
    assert seen and all(label == "kvfuzz features" for label, _ in seen)
    assert max(v for _, v in seen) >= 1  # at least the op kinds it ran


def test_an_integer_is_one_draw_with_its_range_so_a_nudge_moves_it_by_units():
    rng = streams.ChoiceRandom([0.55, 0.99], fresh_seed=1)
    assert rng.randint(1, 10) == 6 and rng.choice("abc") == "c"
    assert rng.ranges == [10, 3] and rng.pos == 2
    seg = [[0.55, 10]]
    mutations.nudge(seg, random.Random(0))
    moved = int(seg[0][0] * 10) - 5
    assert moved in (-3, -2, -1, 1, 2, 3), seg


def test_each_op_reads_its_own_segment_so_an_edit_leaves_later_ops_draws_in_place():
    """Config draw 0.1, op 0 given [0.2, 0.3], op 1 given [0.4]: op 0 drawing three (its surplus
    fresh) or one (the rest unread) leaves op 1 reading 0.4; past the marks, ops draw fresh,
    each from its own key (the same draws whatever the ops before consumed)."""
    def run(op0_draws):
        rng = streams.ChoiceRandom([0.1, 0.2, 0.3, 0.4], fresh_seed=7, marks=[1, 3])
        out = [rng.random()]
        for n in (op0_draws, 1, 2):
            rng.begin_op()
            out.append([rng.random() for _ in range(n)])
        return out, rng
    (cfg, op0, op1, op2), rng = run(3)
    assert cfg == 0.1 and op0[:2] == [0.2, 0.3] and op1 == [0.4] and rng.pos == 7
    (_, short0, short1, short2), _ = run(1)
    assert short0 == [0.2] and short1 == [0.4] and short2 == op2 and op0[2] not in op2


def test_a_mutation_aimed_at_an_op_stops_a_tail_past_it_and_always_changes_something(tmp_path, monkeypatch):
    """A mutated plan aimed at the op that first reached a feature (its ``where``: op 3) runs
    ``TAIL`` ops past it, not the whole sequence; every mutated plan names a mutation applied;
    the parent rebuilds what ran."""
    monkeypatch.setattr(guide, "SEED_ENTRIES", 1)
    monkeypatch.setattr(guide, "FRESH", 0.0)
    tier = make_tier("torch")
    track = guide.GuidedTrack(tmp_path)
    for i in range(3):
        track.corpus.add({**_entry({f"trips|k|{i}|partial"}, ops=20), "where": {f"trips|k|{i}|partial": 3}})
    aimed = 0
    for seed in range(6):
        plan = track.plan(tier, seed)
        assert plan["how"] and plan["how"] != ["fresh"], plan
        seq = track.run_sequence(tier, seed, 150)
        if (plan["why"] or "").startswith("trips|k|"):  # picked for a feature op 3 reached (not one the runs since added)
            aimed += 1
            assert plan["length"] == 4 + guide.TAIL and len(seq.ops) == plan["length"], (plan["length"], len(seq.ops))
        _, _, again = track.regenerate(seed, len(seq.ops), {"corpus": str(tmp_path), "has": track.worker_info(tier)["has"]})
        assert [op.to_json() for op in again] == [op.to_json() for op in seq.ops]
    assert aimed >= 2, aimed


def test_room_gives_the_pool_its_most_pages_and_leaves_the_other_config_draws():
    """``room`` sets random_config's page-count draws (``ROOM_DRAWS``) to their largest: 64 + 8
    pages (24 at page size 16); the other config draws, and so page size, growth, are kept."""
    for seed in range(6):
        draws = streams.ChoiceRandom((), seed)
        before = generate.random_config(draws)
        segs = [[[u, n] for u, n in zip(draws.log, draws.ranges)]]
        assert mutations.room(segs)
        after, _, _ = streams.params_of(streams.flat(segs), seed, chains=False)  # a chain scenario's config is its own
        assert after.num_pages == (24 if after.page_size == 16 else 72), (before, after)
        assert (after.page_size, after.grow, after.max_moves) == (before.page_size, before.grow, before.max_moves)
        assert not mutations.room(segs)  # nothing left to raise


def test_resizing_the_alloc_that_fed_a_read_table_changes_the_rows_it_reads(tmp_path):
    """data_flow names the allocs whose tokens a table op's rows hold; resize sets one of them
    to a block-boundary size (checked on the shadow run), and the same read table, rebuilt from
    the mutated stream, reads a row of that alloc's new length: nearly always, since each op
    replays its own segment of the stream (read sequentially, a later free's permutation of
    the resized alloc's pages shifted every later draw: 19 of these 40 resizes kept the row)."""
    tier = make_tier("torch")
    track = guide.GuidedTrack(tmp_path)
    for seed in range(12):
        track.plan(tier, seed)
        track.run_sequence(tier, seed, 60)
    fed = [(e, int(t)) for e in track.corpus.entries for t, v in e["feeds"].items() if v]
    assert fed, "no kept entry has a read table fed by an alloc"
    tried = changed = 0
    for n, (entry, table) in enumerate(fed[:12]):
        shadow = track._shadow(tier, 10**6 + n, entry)
        ops, config, _ = shadow(entry["stream"], entry["marks"])
        before = streams.data_flow(config, ops)
        assert type(ops[table]).__name__ in ("ReadTable", "ReadTablePacked")
        assert before["feeds"][str(table)] == entry["feeds"][str(table)]
        for i in range(6):
            segs = mutations.resize(streams.segments(entry), entry, random.Random(i), shadow, table)
            if segs is None:
                continue
            tried += 1
            new_ops, new_config, _ = shadow(streams.flat(segs), streams.marks_of(segs))
            flow = streams.data_flow(new_config, new_ops)
            resized = [a for a, p in flow["pages"].items() if p != before["pages"].get(a)]
            assert resized, "resize reported a change the shadow run does not show"
            rows = {len(r) for r in getattr(new_ops[table], "rows", ())}
            rows_before = {len(r) for r in getattr(ops[table], "rows", ())}
            ps = new_config.page_size
            # the row now reads the alloc's new length, or (a partial free of it came between) a row
            # moved by exactly the tokens the resize added or took
            changed += any(int(a) in flow["feeds"].get(str(table), ())
                           and (flow["pages"][a] * ps in rows
                                or any(r + (flow["pages"][a] - before["pages"][a]) * ps in rows for r in rows_before))
                           for a in resized if a in before["pages"])
    assert tried >= 24 and changed >= 0.8 * tried, (tried, changed)
    aimed = hit = 0  # aimed (aim_row) at a row 3 to 5 longer than one the table read: one more trip of BLOCK 4
    for n, (entry, table) in enumerate(fed[:12]):
        shadow = track._shadow(tier, 10**6 + n, entry)
        ops, config, _ = shadow(entry["stream"], entry["marks"])
        pages = {int(k): v for k, v in entry["pages"].items()}
        for row, i in itertools.product(sorted(set(mutations.table_lengths(ops[table], config.page_size)) - {0})[:2], range(3)):
            target = row + 3 + i
            segs = mutations.aim_row(streams.segments(entry), pages, entry["feeds"][str(table)], random.Random(10 * row + i),
                                   shadow, table, (row, target))
            aimed += 1
            if segs is not None:
                new_ops, new_config, _ = shadow(streams.flat(segs), streams.marks_of(segs))
                assert target in mutations.table_lengths(new_ops[table], new_config.page_size)  # what it returns, it reached
                hit += 1
    # 27 of 60 where the corpus's fresh configs are its rarest (streams.rare_config) and chain scenarios are
    # drawn too: most kept entries are eager page-size-1 pools nearly full, whose rows cannot grow 3-5 pages
    # (their aims hit 1 of 6); 38 of 51 on a corpus of mostly small lazy pools
    assert aimed >= 12 and hit >= 0.4 * aimed, (aimed, hit)


def test_realign_moves_an_aligned_kv_start_inside_its_page_and_leaves_what_came_before(tmp_path):
    """``mutations.realign`` (a frontier plan for ``start|K|aligned|trips 2+``): a packed table whose row
    started on a page's first token gets a row as long starting inside its page, by one of its own
    ``kv_start`` draws; the pool, every earlier op and the table's rows and requests are unchanged."""
    tier = make_tier("torch")
    track = guide.GuidedTrack(tmp_path)
    for seed in range(48):
        track.plan(tier, seed)
        track.run_sequence(tier, seed, 100)
    tried = hit = 0
    for n, entry in enumerate(track.corpus.entries):
        shadow = track._shadow(tier, 10**6 + n, entry)
        ops, config, _ = shadow(entry["stream"], entry["marks"])
        ps = config.page_size
        for t, op in enumerate(ops):
            if ps < 2 or op.kind != "read_table_packed" or op.kv_start is None:
                continue
            aligned = [m for s, m in zip(op.kv_start, mutations.table_lengths(op, ps)) if s % ps == 0 and m > 0]
            if not aligned:
                continue
            tried += 1
            segs = mutations.realign(streams.segments(entry), random.Random(t), shadow, t, (max(aligned), max(aligned)))
            if segs is None:
                continue
            hit += 1
            new_ops, new_config, _ = shadow(streams.flat(segs), streams.marks_of(segs))
            assert new_config == config and [o.to_json() for o in new_ops[:t]] == [o.to_json() for o in ops[:t]]
            new = new_ops[t]
            assert (new.rows, new.req_idx) == (op.rows, op.req_idx)
            assert any(s % ps and m >= max(aligned) for s, m in zip(new.kv_start, mutations.table_lengths(new, ps)))
    assert tried >= 3 and hit >= 0.5 * tried, (tried, hit)  # 3 of 3 at these seeds


def test_a_stepping_stone_is_emitted_two_trips_in_and_nearer_is_another_feature():
    """Two trips of BLOCK 4 (col_stride 4) over 8 pages: one page short of a third trip; over 6
    pages: three short. Distinct progress features, and neither is a third trip. A row far
    from its next trip makes none."""
    import torch

    from kvkernels import triton_kernels

    class FakeLaunch:
        name, fn, args, grid_dims = "read_table_kernel", triton_kernels.read_table_kernel, (), (1, 1)

        def __init__(self, n):
            self.kwargs = {"seq_lens_ptr": torch.tensor([n]), "max_pages": 64, "col_stride": 4, "BLOCK": 4, "PAGE_SIZE": 1}

    seen, goals = {}, {}
    for n in (6, 8):
        out: set[str] = set()
        features.launch_features(FakeLaunch(n), out, goals)
        assert not any("|3+|" in f for f in out), out
        seen[n] = {f for f in out if f.startswith("progress|")}
    # the row that reached each stone and its distance: [pages, short of a third trip, BLOCK, trips, stride]
    assert goals["progress|read_table_kernel|trips 2|short 1"] == [8, 1, 4, 2, 4]
    assert goals["trips|read_table_kernel|2|partial"] == [6, 3, 4, 2, 4]
    assert "progress|read_table_kernel|trips 2|short 1" in seen[8], seen
    assert "progress|read_table_kernel|trips 2|short 2" in seen[6], seen
    assert seen[6] != seen[8]
    far = FakeLaunch(20)  # 20 pages under one 512-page block: 493 short of a second trip, no stone
    far.kwargs = {**far.kwargs, "col_stride": 512, "BLOCK": 512}
    out = set()
    features.launch_features(far, out)
    assert "trips|read_table_kernel|1|partial" in out and not any(f.startswith("progress|") for f in out), out


def test_energy_favours_rare_features_and_entries_that_keep_paying_per_cpu_second(tmp_path):
    """Energy is rarity times yield (new features per CPU s spent, the mutants kept from it
    included) against the median, bounded to [1/4, 2]: a dear entry or one picked often for
    nothing fades to a quarter, one whose mutants keep finding rises, to at most double; an
    untried one is not lowered."""
    c = guide.Corpus(tmp_path)
    c.add(_entry({"trips|k|2|partial", "op|alloc"}))
    c.add(_entry({"trips|k|2|partial", "progress|k|trips 2|short 1"}))
    c.add(_entry({"op|free", "op|alloc", "op|flush"}))
    for i in range(4):  # the median: two new features per 0.1 CPU s
        c.add(_entry({f"op|k{i}", f"mask|k{i}|n/BLOCK|full"}))
    plain, rare, other = c.entries[:3]
    assert [e["new"] for e in c.entries[:3]] == [2, 1, 2]
    assert c.energy(rare) > c.energy(plain)
    rarity = sum(1.0 / c.counts[f] for f in rare["ids"])
    rare["cost_s"] = 100.0  # a thousand times the others' CPU for its one new feature: untried, not less
    assert c.energy(rare) == pytest.approx(rarity)
    rare["picks"] = 1  # tried once for nothing
    assert c.energy(rare) == pytest.approx(0.25 * rarity)
    before = c.energy(plain)
    plain["picks"] = 50  # picked fifty times, nothing kept from it
    assert c.energy(plain) == pytest.approx(0.25 * sum(1.0 / c.counts[f] for f in plain["ids"] if f >> 40))
    assert c.energy(plain) < before
    other["picks"] = 1
    assert c.add(_entry({"op|alloc", *(f"trips|k{i}|3+|partial" for i in range(9))}), parent=other)
    assert other["yielded"] == 11 and "yielded" not in json.loads(max(tmp_path.glob("*.json"),
                                                                     key=os.path.getmtime).read_text())
    assert c.energy(other) == pytest.approx(2.0 * sum(1.0 / c.counts[f] for f in other["ids"] if f >> 40))
    picks = sum(e["picks"] for e in c.entries)
    c.pick(random.Random(0))
    assert sum(e["picks"] for e in c.entries) == picks + 1


def test_a_fresh_sequence_draws_every_scenario_its_tier_runs(tmp_path):
    """On a tier without chains a chain scenario stands for a single pool's (``params_of``), so the
    corpus never holds its name: were it aimed at as the one held least, fresh sequences would draw
    only the three single-pool scenarios the chain names map to, never ``inflight`` (a reader in
    flight, what a flush bug behind a reader needs) nor ``long``. With every scenario held once,
    fresh sequences draw all seven; with chains, the chain scenarios no entry holds come first."""
    from types import SimpleNamespace

    track = guide.GuidedTrack(tmp_path / "corpus")
    single = sorted(generate.SCENARIOS)
    track._corpus = SimpleNamespace(counts={features.feature_id(f"config|scenario|{n}"): 1 for n in single})

    def drawn(chains) -> set[str]:
        out = set()
        for seed in range(80):
            stream = track._fresh_stream(seed, random.Random(seed), chains)
            out.add(streams.params_of(stream, seed, chains=chains)[1])
        return out

    assert drawn(False) == set(single)
    assert drawn(True) == set(streams.CHAIN_SCENARIOS)


def test_rare_knobs_is_a_launch_knob_combination_the_corpus_holds_fewest_of(tmp_path):
    import itertools

    from kvkernels import launchers

    names = sorted(launchers.FUZZ_KNOBS)
    combos = [dict(zip(names, v)) for v in itertools.product(*(launchers.FUZZ_KNOBS[n] for n in names))]
    track = guide.GuidedTrack(tmp_path)
    for c in combos[1:]:
        assert track.corpus.add(_entry({features.knobs_feature(c)}))
    assert all(track.rare_knobs(launchers, random.Random(i)) == combos[0] for i in range(5))
    track.corpus.add(_entry({features.knobs_feature(combos[0]), "op|alloc"}))
    assert len({str(track.rare_knobs(launchers, random.Random(i))) for i in range(40)}) > 1


def test_a_trip_feature_aims_at_its_own_row_or_the_entrys_most_trips():
    entry = {"goals": {"trips|k|2|partial": [6, 3, 4, 2], "progress|k|trips 1|short 1": [3, 1, 4, 1]}}
    seen = {str(guide.frontier(entry, "progress|k|trips 1|short 1", random.Random(i))) for i in range(20)}
    assert seen == {"[3, 1, 4, 1]", "[6, 3, 4, 2]"}, seen
    assert guide.frontier(entry, "op|alloc", random.Random(0)) is None


def test_the_frontier_is_the_entries_whose_read_table_made_the_most_trips(tmp_path):
    c = guide.Corpus(tmp_path)
    assert c.frontier(random.Random(0)) is None  # no trip feature yet
    for trips, name in ((1, "trips|k|1|partial"), (2, "trips|k|2|partial"), (2, "trips|j|2|full")):
        c.add({**_entry({name}), "goals": {name: [4 * trips, 1, 4, trips], f"progress|k|row {trips}": [9, 1, 4, 9]}})
    picked = {c.frontier(random.Random(i))[1] for i in range(20)}
    assert picked == {"trips|k|2|partial", "trips|j|2|full"}, picked  # a progress goal's trips do not count
    assert sum(e["picks"] for e in c.entries) == 20
    # a packed row at page size 1 is a kv_start stone of its own kernel group (reconfig pages it)
    c.add({**_entry({"start|p|page size 1|trips 2"}), "goals": {"start|p|page size 1|trips 2": [20, 13, 16, 2, 16]}})
    picked = {c.frontier(random.Random(i))[1] for i in range(30)}
    assert "start|p|page size 1|trips 2" in picked, picked
    assert streams.reconfig_wants("start|p|page size 1|trips 2", c.counts)  # ... and reconfig asks for pages


def test_a_named_allocators_picks_go_to_how_its_flush_ended(tmp_path):
    """Where an allocator is under test, ``Corpus.pick`` weighs the spec domain (kvref's flush stops,
    the conjunctions its flush bugs sit at) far above code arcs and op kinds; a kernel set's tier
    keeps the rare conjunctions level, so its trips are not drowned by the allocator's stops."""
    from types import SimpleNamespace

    corpus = guide.Corpus(tmp_path / "c")
    code = [f"code|pool.py|{i}>{i + 1}" for i in range(60)]
    for i, names in enumerate([code[:30] + ["op|alloc"], code[30:] + ["op|free", "spec|flush|down|reader in flight|no holes"],
                               ["trips|k|2|partial", "spec|flush|up|no reader|move limit", "config|grow|down"]]):
        corpus.add({"stream": [i / 10], "marks": [], "features": names, "ops": 10})

    def spec_share(tier) -> float:
        rng = random.Random(0)
        return sum((corpus.pick(rng, guide.domain_weights(tier))[1] or "").startswith("spec|") for _ in range(400)) / 400

    named, ours = spec_share(SimpleNamespace(allocator_cls=object())), spec_share(SimpleNamespace(allocator_cls=None))
    assert named > 0.75 > ours, (named, ours)


def test_kill_ops_says_where_each_modes_ops_went():
    """The benchmark's account of a run's ops (``where_spent``): every op counted once, under the pool
    and plan kind of its sequence, and a kill of the pinned-page bug (a lazy pool growing down, by its
    fixture's docstring) only ever counted there."""
    from benchmarks import guided_vs_blind as bench

    name = "allocator=tests/fixtures/allocators/team_pool.py:pinned_check_grow_up_only"
    rows = bench.ops_to_kill([name], [0, 1], 3000, modes=("blind", "guided"), backend="torch")
    assert all(sum(r["spent"].values()) == r["ops"] for r in rows)
    assert {r["killed_in"] for r in rows if r["killed"]} <= {"down lazy|blind", "down lazy|fresh", "down lazy|reconfig",
                                                             "down lazy|mutation"}
    where = bench.where_spent(rows)
    for mode in ("blind", "guided"):
        mine = [w for w in where if w["mode"] == mode]
        assert abs(sum(w["share"] for w in mine) - 1) < 0.01
        assert sum(w["kills"] for w in mine) == sum(r["killed"] for r in rows if r["mode"] == mode)


def test_code_is_traced_less_once_it_stops_reaching_arcs(tmp_path, monkeypatch):
    """One sequence in ``CODE_EVERY`` is traced while code pays; per ``CODE_DRY`` traced sequences in a
    row that reached no arc the corpus lacked, the interval doubles (at most ``CODE_BACKOFF`` times);
    the kernel bodies keep their own schedule. A sequence run again reaches no new arc: dry."""
    traced = {dry: [i for i in range(64) if guide.code_schedule(i, dry)[0]] for dry in (0, 3, 4, 8, 99)}
    assert [len(traced[d]) for d in (0, 3, 4, 8, 99)] == [16, 16, 8, 4, 2]
    assert [i for i in range(64) if guide.code_schedule(i, 99)[1]] == [31, 63] == traced[99]
    monkeypatch.setattr(guide, "CODE_EVERY", 1)
    tier = make_tier("torch")
    track = guide.GuidedTrack(tmp_path / "c")
    track.plan(tier, 5)
    track.run_sequence(tier, 5, 30)
    assert track.code_dry == 0 and any(n.startswith("code|") for e in track.corpus.entries for n in e["features"])
    track.run_sequence(tier, 5, 30)
    assert track.code_dry == 1


def test_coverage_reads_a_teams_allocator_back_and_names_its_lines_never_run(tmp_path, monkeypatch):
    """``code|pkg/file.py|...`` names only a file's last two parts; the corpus notes where each measured
    file is, so ``kvfuzz coverage`` lists the lines of a team's allocator no sequence ran (and of a
    corpus merged from it), not only kvref's and kvkernels' files."""
    from pathlib import Path

    from fuzz.engine.tiers import TierSpec

    monkeypatch.setattr(guide, "CODE_EVERY", 1)
    team = Path(__file__).resolve().parents[1] / "fixtures/allocators/team_pool.py"
    tier = TierSpec("torch", allocator=f"{team}:HeapAllocator").make()
    track = guide.GuidedTrack(tmp_path / "c")
    for seed in range(2):
        track.plan(tier, seed)
        track.run_sequence(tier, seed, 40)
    merge([tmp_path / "c"], tmp_path / "m")
    for root in ("c", "m"):
        rep = coverage_report.report([tmp_path / root])
        heap = rep["code"].get("allocators/heap_allocator.py")
        assert heap and any(v["never"] for v in heap.values()), sorted(rep["code"])
        assert "fuzz/engine/allocators.py" not in str(rep["code"])
    assert "allocators/heap_allocator.py" in coverage_report.text(coverage_report.report([tmp_path / "m"]))
