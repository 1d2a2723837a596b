"""Known reads (``guide.KnownReads``): a pure op the target already ran and passed from the same
history of state-changing ops is not run again, and what its launches reached is replayed."""

from __future__ import annotations

import os

import pytest

import kvref
from fuzz.engine import corpus, features, guide, knobs, launches
from fuzz.engine.ops import Alloc, ReadTable
from fuzz.engine.runner import PoolRun
from fuzz.engine.tiers import make_tier
from fuzz.engine.verdict import Divergence
from tests.fuzz.test_hostile import Spy

CONFIG = kvref.PoolConfig(num_pages=8)
TABLE = ReadTable([[1, 2, 3]], [0], [3], 3, 3, False)


class WrongSpy(Spy):
    """Our torch path, its read table one entry wrong."""

    def build_kv_read_table(self, **kw):
        out = super().build_kv_read_table(**kw)
        kw["out"][0, 0] += 1
        return out


def _tier(spy):
    base = make_tier("torch")
    return type(base)(base.backend, "spy", spy, base.device)


def _known():
    known = guide.KnownReads()
    known.collector = features.Collector()
    return known


def test_a_read_from_a_known_history_is_not_run_again_and_another_history_runs_it():
    spy = Spy()
    tier, known = _tier(spy), _known()
    run = PoolRun(CONFIG, tier, known=known)
    run.step(Alloc(3))
    first, again = run.step(TABLE), run.step(TABLE)  # a read leaves the state: the same history
    assert spy.read_tables == 1 and run.known_hits == 1 and first.result == again.result
    other = PoolRun(CONFIG, tier, known=known)  # another run, the same config and ops: known too
    other.step(Alloc(3))
    other.step(TABLE)
    assert spy.read_tables == 1 and other.known_hits == 1
    other.step(Alloc(2))  # a state-changing op: a new history, so the same read runs
    other.step(TABLE)
    assert spy.read_tables == 2
    plain = PoolRun(CONFIG, tier)  # no known reads: every read runs
    plain.step(Alloc(3))
    plain.step(TABLE)
    plain.step(TABLE)
    assert spy.read_tables == 4 and plain.known_hits == 0


def test_a_read_that_diverged_is_never_known():
    tier, known = _tier(WrongSpy()), _known()
    for _ in range(2):  # the second run meets the same read from the same history: it runs again, and fails again
        run = PoolRun(CONFIG, tier, known=known)
        run.step(Alloc(3))
        with pytest.raises(Divergence, match="read_table"):
            run.step(TABLE)
        assert run.known_hits == 0
    assert not known.memo


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter is off (a GPU is present)")
def test_a_known_reads_features_are_replayed_as_its_launches_gave_them():
    """The second run of the same ops launches no read-table kernel, and its collector holds the
    same value features, trip goals, the op that reached each, and programs as the first's."""
    tier, known = make_tier("interpret"), guide.KnownReads()
    ops = [Alloc(6), ReadTable([[1, 2, 3, 4, 5, 6]], [0], [6], 6, 6, False)]
    seen = []
    try:
        for _ in range(2):
            col = known.collector = features.Collector()
            run = PoolRun(CONFIG, tier, knobs={"BLOCK_COLS": 4, "BLOCK_IDS": 4, "TARGET_BLOCKS": 2}, known=known)
            with col, launches.Recorder() as rec:
                for op in ops:
                    col.op += 1
                    run.step(op)
            seen.append((col, [ln.name for ln in rec.launches]))
    finally:
        knobs.apply(tier.kernels, None)  # the knobs back at their defaults for the tests after this one
    (first, ran), (second, ran_again) = seen
    assert "read_table_kernel" in ran and "read_table_kernel" not in ran_again and len(ran_again) < len(ran)
    assert any(n.startswith("trips|read_table_kernel|") for n in first.names)
    assert (second.names, second.where, second.goals, second.programs) == (
        first.names, first.where, first.goals, first.programs)


def test_a_guided_run_with_known_reads_is_the_run_without_them(tmp_path, monkeypatch):
    """The same plans, ops and corpus with and without them; mutated plans replay their entry's reads."""
    monkeypatch.setattr(guide, "SEED_ENTRIES", 2)
    monkeypatch.setattr(corpus, "_yield", lambda entry: 1.0)  # an entry's energy not by its CPU seconds: they vary
    tier, out = make_tier("torch"), []
    for on in (True, False):
        if not on:
            monkeypatch.setattr(guide, "program_order_mode", lambda: "shuffled")  # known reads off
        track, hits, ops = guide.GuidedTrack(tmp_path / str(on)), 0, []
        for seed in range(24):  # enough mutated plans to replay a read, whatever configs the corpus keeps
            track.plan(tier, seed)
            seq = track.run_sequence(tier, seed, 40)
            hits += seq.run.known_hits
            ops.append([op.to_json() for op in seq.ops])
        entries = sorted((e["features"], e["where"], e["ops"]) for e in track.corpus.entries)
        out.append((ops, entries, hits))
    (ops, entries, hits), (ops_off, entries_off, hits_off) = out
    assert hits > 0 and hits_off == 0
    assert ops == ops_off and entries == entries_off


def test_a_run_not_replaying_runs_every_read_and_records_them_for_the_next():
    """A code-traced run (``replaying`` off) meets its reads' arcs by running them, and what it
    ran is known to the next untraced run."""
    spy = Spy()
    tier, known = _tier(spy), _known()
    known.replaying = False
    run = PoolRun(CONFIG, tier, known=known)
    run.step(Alloc(3))
    run.step(TABLE)
    run.step(TABLE)
    assert spy.read_tables == 2 and run.known_hits == 0 and len(known.memo) == 1
    known.replaying = True
    again = PoolRun(CONFIG, tier, known=known)
    again.step(Alloc(3))
    again.step(TABLE)
    assert spy.read_tables == 2 and again.known_hits == 1
