"""req_to_token as int32 or int64 (SPEC §2), at both scales: drawn per sequence, recorded in the
ops (so in the case), built in that dtype on the target; the spec side reads plain ints."""

from __future__ import annotations

import collections
import dataclasses
import os
import types

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

import kvref
from fuzz.engine import generate, shapes, strategies
from fuzz.engine.generate import regenerate, sequence_params, sequence_r2t_dtype, warmup_seed
from fuzz.engine.ops import Alloc, Op, OpError, ReadTable, ReadTablePacked
from fuzz.engine.production import generator as scale
from fuzz.engine.production.limits import ScaleLimits
from fuzz.engine.production.ops import PRows
from fuzz.engine.runner import PoolRun
from fuzz.engine.tiers import make_tier
from fuzz.engine.tracks import get as get_track

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
BACKENDS = ["torch", pytest.param("interpret", marks=pytest.mark.skipif(
    not INTERPRET, reason="Triton's interpreter is off (a GPU is present)"))]


def _recording(tier):
    """The tier with a kernel set that notes the dtype of every req_to_token it is handed."""
    seen = collections.Counter()
    proxy = types.ModuleType(f"recording_{tier.kernels.__name__}")
    for name in dir(tier.kernels):
        fn = getattr(tier.kernels, name)
        if name.startswith("build_kv_read_table") and callable(fn):
            def wrap(*a, _fn=fn, _name=name, **kw):
                seen[(_name, str(kw["req_to_token"].dtype))] += 1
                return _fn(*a, **kw)
            setattr(proxy, name, wrap)
        elif not name.startswith("__"):
            setattr(proxy, name, fn)
    return dataclasses.replace(tier, kernels=proxy), seen


# ---- the small track ---------------------------------------------------------------------------


def test_old_ops_keep_their_json_and_int32_is_recorded():
    op = ReadTable([[2, 3]], [0], [2], 2, 2, False)
    assert op.r2t_dtype == "int64" and "r2t_dtype" not in op.to_json()
    op32 = dataclasses.replace(op, r2t_dtype="int32")
    assert op32.to_json()["r2t_dtype"] == "int32" and Op.from_json(op32.to_json()) == op32
    assert dataclasses.replace(op32, r2t_dtype="int64") in list(op32.shrink())
    with pytest.raises(OpError, match="r2t_dtype must be one of"):
        dataclasses.replace(op, r2t_dtype="int16")
    with pytest.raises(OpError, match="does not fit"):
        ReadTablePacked([[2**31]], [0], [1], None, [0, 1], 1, 1, r2t_dtype="int32")


def test_one_dtype_per_sequence_half_the_seeds_each_and_warmup_covers_both():
    dtypes = collections.Counter(sequence_r2t_dtype(s) for s in range(200))
    assert 60 < dtypes["int32"] < 140 and dtypes["int32"] + dtypes["int64"] == 200
    warm = {(sequence_params(warmup_seed(i))[0].page_size, sequence_r2t_dtype(warmup_seed(i))) for i in range(8)}
    assert len(warm) == 8  # every page size with both dtypes: a GPU worker compiles all before it is timed


def test_the_generator_gives_every_read_table_of_a_sequence_its_dtype(monkeypatch):
    # single pools (a chain seed's ops read no tables; chains=False gives it its single pool)
    ops_of = {seed: regenerate(seed, 150, has=["build_kv_read_table_packed"], chains=False)[2] for seed in range(6)}
    for seed, ops in ops_of.items():
        tables = [op for op in ops if isinstance(op, (ReadTable, ReadTablePacked))]
        assert tables and {op.r2t_dtype for op in tables} == {sequence_r2t_dtype(seed)}
    # The stream is the one it was before dtypes were drawn, but for the dtype of its read tables.
    monkeypatch.setattr(generate, "sequence_r2t_dtype", lambda seed: "int64")
    for seed, ops in ops_of.items():
        plain = regenerate(seed, 150, has=["build_kv_read_table_packed"], chains=False)[2]
        assert [shapes.with_r2t_dtype(op, sequence_r2t_dtype(seed)) for op in plain] == ops


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_the_target_gets_req_to_token_in_the_ops_dtype(backend, dtype):
    tier, seen = _recording(make_tier(backend))
    config = kvref.PoolConfig(num_pages=16, min_page=1, page_size=2, multiplier=3)
    run = PoolRun(config, tier)
    toks = run.step(Alloc(8)).result
    rows = [toks[:6] + [-1, toks[7]], toks[2:8]]
    ops = [ReadTable(rows, [1, 0, 1], [6, 8, 3], 4, 8, False, r2t_dtype=dtype),
           ReadTable(rows[:1], [0], [7], 5, 10, True, r2t_dtype=dtype),
           ReadTablePacked(rows, [0, 1], [3, 2], [1, 0], [0, 3, 5], 5, 8, r2t_dtype=dtype),
           ReadTable(rows, [0], [9 * 2 + 1], 4, 8, False, r2t_dtype=dtype)]  # seq_lens past max_pages: probed
    for op in ops:
        run.step(op)
    run.finish()
    assert run.stats.hostile.get("read_table_seq_lens") == 1
    assert {d for (_, d) in seen} == {f"torch.{dtype}"} and sum(seen.values()) >= 4


def test_the_state_machine_draws_a_dtype_per_run():
    dtypes = set()

    class Recording(strategies.DifferentialMachine):
        def _do(self, op):
            out = super()._do(op)
            if isinstance(self.ops[-1], (ReadTable, ReadTablePacked)):
                dtypes.add(self.ops[-1].r2t_dtype)
                assert self.ops[-1].r2t_dtype == self.r2t_dtype
            return out

    # derandomized: with Hypothesis' own random seed, 25 runs of which only some reach a read
    # table drew one dtype alone about once in a few dozen suites (seen in a full run)
    run_state_machine_as_test(Recording, settings=settings(max_examples=25, stateful_step_count=12, deadline=None,
                                                           derandomize=True, database=None,
                                                           suppress_health_check=list(HealthCheck)))
    assert dtypes == {"int32", "int64"}


# ---- the production track ----------------------------------------------------------------------


def test_p_rows_keeps_its_json_and_builds_its_dtype():
    op = PRows(seed=3, rows=4, width=9, src=(0, 17, 1, 0, 0, 17, 5, 2), pad_every=13)
    assert op.dtype == "int32" and "dtype" not in op.to_json()
    config = kvref.PoolConfig(num_pages=16)
    r32 = op.build(config, "cpu")
    r64 = dataclasses.replace(op, dtype="int64").build(config, "cpu")
    assert str(r32.dtype) == "torch.int32" and str(r64.dtype) == "torch.int64" and r32.tolist() == r64.tolist()
    assert dataclasses.replace(op, dtype="int64").to_json()["dtype"] == "int64"


@pytest.mark.parametrize("backend", BACKENDS)
def test_production_sequences_run_both_dtypes_clean(backend):
    tier, seen = _recording(make_tier(backend))
    track = get_track("production")
    dtypes = {}
    for seed in range(4):
        seq = track.run_sequence(tier, seed, 10, limits=ScaleLimits.small(), mix=scale.EAGER_MIX)
        assert seq.divergence is None, seq.divergence
        dtypes[seed] = {op.dtype for op in seq.ops if op.kind == "p_rows"}
        assert dtypes[seed] <= {scale.sequence_r2t_dtype(seed)}
    assert {scale.sequence_r2t_dtype(s) for s in range(4)} == {"int32", "int64"}
    assert {d for (_, d) in seen} == {"torch.int32", "torch.int64"}


def test_graph_ops_take_the_sequence_dtype():
    info = {**scale.scale_info(make_tier("torch")), "gpu": True}
    for seed in range(12):
        _, gen = scale.generator(seed, info, mix=scale.GRAPH_MIX)
        ops = [gen.next_op() for _ in range(4)]
        assert {op.dtype for op in ops if op.kind == "g_read_table"} == {scale.sequence_r2t_dtype(seed)}
