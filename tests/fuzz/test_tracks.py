"""One engine, two tracks: the same campaign, worker, replay and minimizer for both scales.

The production track's cases replay in this process (``--in-process``) as the small
track's do, a CUDA fault is named the same at either scale, and a worker that met one is
replaced (its context would be poisoned)."""

from __future__ import annotations

import json

import pytest

import kvref
from fuzz.engine import tracks
from fuzz.engine.case import Case, load_case, write_case
from fuzz.engine.dispatch import replay
from fuzz.engine.ops import Alloc, ReadTable
from fuzz.engine.production.ops import PReadTable, PRows, PSetup
from fuzz.engine.tiers import make_tier
from fuzz.engine.verdict import poisoned
from tests.fuzz.test_engine import REPO, kvfuzz, show

FAKE = REPO / "tests/fuzz/fixtures/kernels/fake_cuda_fault.py"
PAST_PREFIX = REPO / "tests/fuzz/fixtures/kernels/past_prefix.py"
CONFIG = kvref.PoolConfig(num_pages=300)
PRODUCTION_OPS = [PSetup(n=200, v=(1, 299, 7, 3, 0), p=(1, 200, 11, 5, 0)),
                  PRows(seed=3, rows=4, width=40, src=(0, 301, 1, 0, 0, 301, 17, 9), pad_every=0),
                  PReadTable(seed=5, bs=3, max_pages=30, req=(1, 0, 4), long_len=20, n_long=1, legacy=False)]


def test_the_tracks_own_their_ops():
    assert tracks.of_ops([Alloc(2)]).name == "small"
    assert tracks.of_ops(PRODUCTION_OPS).name == "production"
    assert tracks.of_ops([]).name == "small"
    with pytest.raises(ValueError, match="mixes"):
        tracks.of_ops([Alloc(2), *PRODUCTION_OPS])


@pytest.mark.parametrize("scale", ["small", "production"])
def test_a_cuda_fault_has_one_name_at_either_scale(scale):
    tier = make_tier("torch", str(FAKE))
    if scale == "small":
        ops = [Alloc(4), ReadTable(rows=((1, 2), (3, 4)), req_idx=(0, 1), seq_lens=(2, 2), max_pages=2, width=2,
                                   legacy=False)]
        config = kvref.PoolConfig(num_pages=8)
    else:
        ops, config = PRODUCTION_OPS, CONFIG
    d, _ = replay(config, ops, tier)
    assert d is not None and d.signature.oracle == "crash" and d.signature.field == "cuda-illegal-address", d
    assert poisoned(d)


def _case(tmp_path, config, ops, kernels, signature_from) -> str:
    d, _ = replay(config, ops, make_tier("torch", str(kernels)))
    assert d is not None
    case = Case.found(config=config, ops=ops, divergence=d, original_len=len(ops), tier="torch",
                      kernels=str(kernels))
    return str(write_case(case, tmp_path))


@pytest.mark.parametrize("scale", ["small", "production"])
def test_replay_in_process_works_at_either_scale(scale, tmp_path):
    if scale == "small":
        ops = [Alloc(4), ReadTable(rows=((2, 3, 4, 5),), req_idx=(0,), seq_lens=(3,), max_pages=4, width=4,
                                   legacy=False)]
        path = _case(tmp_path, kvref.PoolConfig(num_pages=12), ops, PAST_PREFIX, "read_table")
    else:
        path = _case(tmp_path, CONFIG, PRODUCTION_OPS, FAKE, "p_read_table")
    case = load_case(path)
    for flags in (("--in-process",), ()):
        r = kvfuzz("replay", path, *flags, timeout=240)
        assert r.returncode == 1, show(r)
        assert "same signature" in r.stdout and str(case.signature) in r.stdout, show(r)


@pytest.mark.slow
def test_a_worker_that_met_a_cuda_fault_is_replaced(tmp_path):
    summary = tmp_path / "summary.json"
    r = kvfuzz("run", "--backend", "torch", "--kernels", FAKE, "--scale", "production", "--max-sequences", 2,
               "--ops-per-sequence", 40, "--no-minimize", "--reproduce", 1, "--out", tmp_path / "cases",
               "--summary", summary, timeout=240)  # seed 0: the fault in each sequence's first ops; 2 sequences
    # so that the second runs in the replaced worker
    # (each replay of a poisoned worker's case is a fresh child: rating and shrinking it, unbounded
    # by a budget, took minutes on a loaded runner; neither is what this test is about)
    assert r.returncode == 1, show(r)
    data = json.loads(summary.read_text())
    sigs = {f["signature"] for f in data["failures"]}
    assert "p_read_table/crash/cuda-illegal-address" in sigs or "g_read_table/crash/cuda-illegal-address" in sigs, sigs
    assert data["restarts"] >= 1, data  # the poisoned worker asked to be replaced


def test_a_cuda_error_surfacing_in_the_harness_is_a_crash_of_that_op(monkeypatch):
    """A sticky CUDA fault surfaces at the next touch of device memory, often the harness's
    own (a copy of the tables, a free-memory query): at production scale too it is a crash
    case of the op, never a harness error (exit 3)."""
    from fuzz.engine import vector_oracle

    def faulted(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(vector_oracle, "read_table", faulted)
    d, _ = replay(CONFIG, PRODUCTION_OPS, make_tier("torch"))
    assert d is not None and (d.kind, d.oracle, d.field) == ("p_read_table", "crash", "cuda-illegal-address"), d


def test_what_could_not_be_checked_is_in_the_summary(tmp_path):
    """On the torch tier a CUDA-graph capture launches no Triton kernel: graph replay is not
    applicable there. A run says so, with a count, instead of counting it as clean."""
    summary = tmp_path / "summary.json"
    r = kvfuzz("run", "--backend", "torch", "--scale", "production", "--max-sequences", 1, "--ops-per-sequence", 40,
               "--op-timeout", 120, "--out", tmp_path / "cases", "--summary", summary, timeout=240)
    # seed 0: two g_read_table in 40 ops. (3 whole production sequences on torch ran past 240 s on a
    # loaded runner, op timeouts included.) An op-timeout of its own: auto gives a sequence's first long
    # op 10 s, and its longest op took 2.0 s on an idle core (1.9 beside two busy loops, on the child's
    # own clock): 5x, which a slower machine or memory pressure may not keep, and a spurious timeout
    # here would fail a clean run.
    assert r.returncode == 0, show(r)
    data = json.loads(summary.read_text())
    reasons = data["not_applicable"]
    assert any("launched no Triton kernel" in why for why in reasons) and all(n > 0 for n in reasons.values()), data
    assert "not checked" in r.stderr, show(r)


@pytest.mark.parametrize("scale, warmups", [("small", 8), ("production", 4)])
def test_a_gpu_worker_warms_up_first_and_its_history_rebuilds_those_sequences(scale, warmups):
    """A GPU worker of either scale runs its track's warm-up sequences before it is timed, and
    a finding that needs its worker's history gets them back first, then the worker's own."""
    from fuzz.engine.campaign import CampaignOptions
    from fuzz.engine.generate import warmup_seed
    from fuzz.engine.slot import Slot, sequence_seed

    track = tracks.get(scale)
    assert track.gpu_warmup == warmups
    opts = CampaignOptions(backend="cuda", scale=scale, seed=3, ops_per_sequence=4)
    slot = Slot(1)
    slot.hello, slot.warm, slot.start_k = track.worker_info(make_tier("torch")), True, 0
    history = slot.history(opts, upto_k=2)()
    expected = [warmup_seed(i) for i in range(warmups)] + [sequence_seed(opts, 1, k) for k in range(2)]
    assert [h["seed"] for h in history] == expected
    assert all(len(h["ops"]) == 4 for h in history)
    assert [h["seed"] for h in slot.history(opts, upto_k=2, seed=warmup_seed(2))()] == expected[:2]
