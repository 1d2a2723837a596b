"""Deferred result checks (``ScaleRun.defer``): several read-table ops' flags read back at once.

On a GPU the production runner queues the checks of ops that compare results only and reads
them with one host read (``DEFER_CUDA``), so the device is not idle while the host draws the
next op. The verdict must be the one an immediate read gives: the same op, the same step,
the same divergence. These tests run the torch tier with ``KVFUZZ_DEFER_CHECKS`` set (on the
CPU the default is 1, an immediate read) against a kernel set wrong at one read-table call.
"""

from __future__ import annotations

import dataclasses

import pytest

import kvref
from fuzz.engine.production.generator import READ_HEAVY_MIX, regenerate, scale_info
from fuzz.engine.production.limits import ScaleLimits
from fuzz.engine.production.ops import PReadTable
from fuzz.engine.production.run import ScaleRun
from fuzz.engine.tiers import make_tier
from fuzz.engine.tracks import get as get_track

N_OPS = 40


class _WrongAt:
    """kvkernels, except that its ``nth`` read table (0-based; None: never) has one live entry off by one."""

    def __init__(self, base, nth):
        self._base, self._nth, self.calls = base, nth, 0

    def __getattr__(self, name):
        return getattr(self._base, name)

    def build_kv_read_table(self, **kw):
        self._base.build_kv_read_table(**kw)
        n, self.calls = self.calls, self.calls + 1
        if n == self._nth and int(kw["seq_lens"][0]) > 0:
            kw["out"][0, 0] += 1


def _run(monkeypatch, defer: int, nth, seed: int = 3):
    monkeypatch.setenv("KVFUZZ_DEFER_CHECKS", str(defer))
    base = make_tier("torch")
    tier = dataclasses.replace(base, kernels=_WrongAt(base.kernels, nth))
    seq = get_track("production").run_sequence(tier, seed, N_OPS, limits=ScaleLimits.small(), mix=READ_HEAVY_MIX,
                                               check_every=8)
    return seq, tier.kernels


def _first_live_call(monkeypatch, seed: int = 3) -> int:
    """The first read-table call of the clean sequence whose batch row 0 is live (the wrapper needs one)."""
    seq, kernels = _run(monkeypatch, 1, None, seed)
    assert seq.divergence is None
    calls = [op for op in seq.ops if isinstance(op, PReadTable) and not op.legacy]
    live = [k for k, op in enumerate(calls) if op.seq_lens(seq.config.page_size)[0] > 0]
    assert len(live) >= 2, "the seed draws too few read tables to test deferral"
    return live[1]


def test_a_deferred_check_reports_the_op_an_immediate_one_does(monkeypatch):
    nth = _first_live_call(monkeypatch)
    now, _ = _run(monkeypatch, 1, nth)
    later, _ = _run(monkeypatch, 8, nth)
    assert now.divergence is not None and later.divergence is not None
    a, b = now.divergence, later.divergence
    assert (a.step, a.oracle, a.field, a.message) == (b.step, b.oracle, b.field, b.message)
    assert now.ops[a.step] == later.ops[b.step] and isinstance(later.ops[b.step], PReadTable)
    # deferred: ops after the wrong one ran before the read that saw it
    assert len(later.ops) > len(now.ops) or b.step < len(later.ops) - 1


def test_deferring_reads_back_less_often_and_finish_reads_what_is_queued(monkeypatch):
    now, _ = _run(monkeypatch, 1, None)
    later, _ = _run(monkeypatch, 8, None)
    assert now.divergence is None and later.divergence is None
    assert later.run.host_reads < now.run.host_reads
    assert later.run.pending == []  # finish read everything
    assert later.run.elements_checked == now.run.elements_checked


def test_a_divergence_at_the_last_op_is_found_by_finish(monkeypatch):
    """The queued check of a sequence's last op is read at ``finish``: a replay of a case that
    ends at its divergent op still finds it."""
    nth = _first_live_call(monkeypatch)
    seq, _ = _run(monkeypatch, 1, nth)
    monkeypatch.setenv("KVFUZZ_DEFER_CHECKS", "8")
    base = make_tier("torch")
    tier = dataclasses.replace(base, kernels=_WrongAt(base.kernels, nth))
    d, run = get_track("production").replay(seq.config, seq.ops[: seq.divergence.step + 1], tier)
    assert run.defer == 8
    assert d is not None and d.step == seq.divergence.step and d.field == seq.divergence.field


def test_a_bad_defer_setting_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("KVFUZZ_DEFER_CHECKS", "many")
    with pytest.raises(kvref.ContractViolation, match="KVFUZZ_DEFER_CHECKS"):
        ScaleRun(kvref.PoolConfig(num_pages=64), make_tier("torch"))


@pytest.mark.cuda
def test_read_table_ops_between_host_reads_do_not_wait_for_the_device():
    """On a GPU, read-table ops make no synchronizing call but the checks' host reads
    (``torch.cuda.set_sync_debug_mode``): a blocking host-to-device copy of an op's inputs
    would wait for every queued kernel, and deferring the checks would then gain nothing. The
    CPU counterpart: the tests above (the same deferral on the torch tier)."""
    import warnings

    import torch

    tier = make_tier("cuda")
    config, ops = regenerate(11, 80, scale_info(tier), limits=ScaleLimits.small(), mix=READ_HEAVY_MIX)
    run = ScaleRun(config, tier, check_every=8)  # as a worker's read-heavy phase: the state every 8th op
    first = next(k for k, op in enumerate(ops) if isinstance(op, PReadTable))
    for op in ops[: first + 1]:  # set-up, rows, one read table: compiled and allocated before the count
        run.step(op)
    syncs, reads, counted = [], 0, 0
    for op in ops[first + 1:]:
        if not isinstance(op, PReadTable):
            run.step(op)
            continue
        reads0 = run.host_reads
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                run.step(op)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        syncs += [str(w.message)[:200] for w in seen if "synchroniz" in str(w.message)]
        reads += run.host_reads - reads0
        counted += 1
    assert run.defer > 1 and counted >= 8
    assert len(syncs) <= reads < counted, syncs[:3]
