"""Every op a generator emits as valid meets SPEC §2's preconditions (``kvref.preconditions``).

What counts as valid input is the spec's to say: an op a generator hands the target as
valid but that breaks a clause turns a kernel that follows SPEC to the letter into a false
finding (a far packed read table with ``indptr[bs] > max_tokens`` and an ``out`` of only the
lengths' sum). These tests drive every generator (the small track's, its
warm-up seeds that the compile track learns from, and the production track's with far,
graph and packed read tables, at interpreter and at GPU limits) through many sequences,
generation only (the spec side is kvref, production ops are checked from their
parameters: no kernel runs), and assert that no op emitted as valid breaks a clause.
Hypothesis shrinks a failure to the first seed and the shortest prefix that still breaks
one; the message names the op and the clause.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvref
from fuzz.engine import gate
from fuzz.engine.generate import (
    WARMUP_SEQUENCES,
    contract_rate,
    make_generator,
    sequence_params,
    sequence_r2t_dtype,
    warmup_seed,
)
from fuzz.engine.production.generator import generator, scale_info
from fuzz.engine.production.hostile import HostileOp
from fuzz.engine.production.ops import PRows
from fuzz.engine.raw_ops import KernelOp
from fuzz.engine.spec_side import Capabilities, SpecSide, unsupported
from fuzz.engine.tiers import OPTIONAL, make_tier


def _settings(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))

READ_MIX = {"p_read_table_far": 3, "g_read_table": 2, "p_read_table_packed": 3, "p_read_table": 2, "p_alloc_bind": 1,
            "p_free_unbind": 1, "p_bind": 1}


def _small_violation(seed: int, n_ops: int) -> str | None:
    """The first op of ``seed``'s small sequence emitted as valid that the spec refuses with a
    SPEC §2 clause (the allocator's own kernel calls included), described, or None."""
    config, scenario, rng = sequence_params(seed)
    gen = make_generator(rng, config, scenario, contract_rate=contract_rate("spec"), r2t_dtype=sequence_r2t_dtype(seed))
    side, tier = SpecSide(config), Capabilities(OPTIONAL)
    for i in range(n_ops):
        op = gen.next_op(side.spec)
        out = side.apply(op) if op.supported_by(tier) else unsupported(op)
        if gen.last_violation is None and gate.spec_refusal(out.error):
            return f"seed {seed} step {i} {op}: {out.error.clause}: {out.error}"
        if gen.last_violation is not None and gate.spec_refusal(out.error):
            # a hostile op breaks only the clauses of its hostile class (when it has one)
            cls = op.hostile_class(side.raw if isinstance(op, KernelOp) else side.spec, tier)
            if cls is not None and out.error.clause not in gate.HOSTILE_CLAUSES[cls]:
                return f"seed {seed} step {i} {op}: hostile class {cls} but it breaks {out.error.clause}"
        gen.observe(op, out)
    return None


@functools.cache
def _info(gpu: bool) -> dict:
    return {**scale_info(make_tier("torch")), "gpu": gpu}


class _Twin:
    """What a production op's preflight reads of a run (``config``, ``rows_shape``), kept
    from the ops alone."""

    def __init__(self, config: kvref.PoolConfig):
        self.config, self.rows_shape = config, None


def _production_violation(seed: int, n_ops: int, gpu: bool, mix: dict | None) -> str | None:
    config, gen = generator(seed, _info(gpu), mix=mix)
    twin = _Twin(config)
    for i in range(n_ops):
        op = gen.next_op()
        if isinstance(op, PRows):
            twin.rows_shape = (op.rows, op.width)
        if isinstance(op, HostileOp):
            continue  # breaks a clause on purpose (its hostile class)
        try:
            op.preflight(twin)
        except kvref.ContractViolation as exc:
            return f"seed {seed} step {i} (gpu={gpu}) {op.kind}: {exc.clause}: {exc}; op {op}"
    return None


@_settings(1000)
@given(seed=st.integers(0, 2**32), n_ops=st.integers(1, 60))
def test_small_generator_emits_only_valid_input(seed, n_ops):
    assert _small_violation(seed, n_ops) is None


def test_warmup_sequences_the_compile_track_learns_from_are_valid():
    """``--scale compile`` learns its shapes from these sequences (``tracks.compile.learn``)."""
    for i in range(WARMUP_SEQUENCES):
        assert _small_violation(warmup_seed(i), 40) is None


@_settings(120)
@given(seed=st.integers(0, 2**32), n_ops=st.integers(1, 24), gpu=st.booleans(),
       mix=st.sampled_from([None, READ_MIX]))
def test_production_generator_emits_only_valid_input(seed, n_ops, gpu, mix):
    assert _production_violation(seed, n_ops, gpu, mix) is None


@_settings(60)
@given(seed=st.integers(0, 2**32), n_ops=st.integers(1, 12), gpu=st.booleans())
def test_far_read_tables_are_valid_input(seed, n_ops, gpu):
    """The far read table alone (where a false alarm once hid), in both forms."""
    assert _production_violation(seed, n_ops, gpu, {"p_read_table_far": 4, "p_read_table": 1}) is None


def test_every_hostile_class_names_registered_clauses():
    from fuzz.engine.production.hostile import PFreeUnbindAny, PReadTableOverflow, PReadTablePackedDisagree

    for cls in (PFreeUnbindAny, PReadTableOverflow, PReadTablePackedDisagree):
        assert cls.probe_class in gate.HOSTILE_CLAUSES, cls
    for cls, clauses in gate.HOSTILE_CLAUSES.items():
        assert set(clauses) <= set(kvref.preconditions.CLAUSES), cls


def test_issue_22s_far_packed_call_breaks_two_clauses():
    """The check the property stands on can fail: a far packed call that breaks it (bs 3, max_tokens
    2870 = the long row, indptr the lengths' running sum, out holding only that sum)."""
    from kvref import preconditions as pre

    call = dict(bs=3, seq_lens=[2870, 5, 9], indptr=[0, 2870, 2875, 2884], page_size=1, width=4096)
    for max_tokens, out_len, clause in ((2870, 2884, "read_table_packed.indptr_within_max_tokens"),
                                        (2884, 2870, "read_table_packed.out_holds_max_tokens")):
        with pytest.raises(kvref.ContractViolation) as err:
            pre.check_read_table_packed(max_tokens=max_tokens, out_len=out_len, **call)
        assert err.value.clause == clause and clause in str(err.value)
    pre.check_read_table_packed(max_tokens=2884, out_len=2884, **call)  # the buffer captured at max_tokens


# ---- the gate: a generated valid op that breaks a clause ends the run before the target sees it ----


class _NoTarget:
    """A kernel set that fails any test calling it: the gate must stop the op first."""

    def __getattr__(self, name):
        raise AssertionError(f"the target was called ({name}) with an op SPEC refuses")


def _gapped_packed():
    from fuzz.engine.production.ops import PReadTablePacked

    return PReadTablePacked(seed=3, bs=2, max_tokens=64, req=(1, 0, 2), long_len=8, n_long=2, gap=3,
                            has_start=False, row_cap=8)


def test_a_production_op_breaking_a_clause_is_a_harness_error_when_generated_and_a_refusal_in_a_replay():
    from fuzz.engine.production.ops import PRows
    from fuzz.engine.production.run import ScaleRun

    tier = make_tier("torch")
    for gated in (True, False):
        run = ScaleRun(kvref.PoolConfig(num_pages=64), tier)
        run.gate = gated
        run.step(PRows(1, 2, 64, (1, 60, 1, 0, 0, 60, 5, 1), 0))
        run.tier = type("T", (), {"kernels": _NoTarget(), "has": lambda self, fn: True, "device": "cpu"})()
        if gated:
            with pytest.raises(gate.GeneratedInvalid) as err:
                run.step(_gapped_packed())
            assert err.value.clause == "read_table_packed.indptr_consistent"
            assert "p_read_table_packed" in str(err.value) and "indptr_consistent" in str(err.value)
        else:
            out = run.step(_gapped_packed())
            assert out.error.clause == "read_table_packed.indptr_consistent" and run.stats.contract_ops == 1


def test_a_small_op_breaking_a_clause_is_a_harness_error_when_generated(monkeypatch):
    from fuzz.engine import shapes
    from fuzz.engine.ops import ReadTablePacked
    from fuzz.engine.runner import PoolRun
    from fuzz.engine.tracks.small import SmallTrack

    gapped = ReadTablePacked([[1, 2, 3]], [0], [2], None, [0, 3], 3, 4)  # span 3, seq_lens 2
    run = PoolRun(kvref.PoolConfig(num_pages=16), make_tier("torch"))
    with pytest.raises(gate.GeneratedInvalid) as err:
        run.step(gapped, generated_valid=True)
    assert err.value.clause == "read_table_packed.indptr_consistent"
    assert run.step(gapped).error.clause == "read_table_packed.indptr_consistent"  # a replay: a refusal
    # Through the track: a generator that emits it as valid ends the sequence with the gate's error.
    monkeypatch.setattr(shapes, "read_table_packed_op", lambda *a, **k: gapped)
    with pytest.raises(gate.GeneratedInvalid):
        for seed in range(20):
            SmallTrack().run_sequence(make_tier("torch"), seed, 60)


def test_the_vector_oracle_checks_the_same_clauses_on_the_tensors(monkeypatch):
    """A production op whose preflight missed a clause is still caught by the oracle's flags
    (one host read with the results), under the same name, before any finding."""
    import torch

    from fuzz.engine import vector_oracle as vo
    from fuzz.engine.production.ops import PReadTablePacked, PRows
    from fuzz.engine.production.run import ScaleRun

    L = torch.int64
    args = dict(req_to_token=torch.arange(8, dtype=L).reshape(1, 8), req_pool_indices=torch.zeros(2, dtype=L),
                v2p=torch.arange(10, dtype=L), multiplier=1, page_size=1)
    for seq, indptr, max_tokens, clause in (([3, 3], [0, 3, 6], 4, "read_table_packed.indptr_within_max_tokens"),
                                            ([3, 2], [0, 3, 6], 6, "read_table_packed.indptr_consistent"),
                                            ([3, 3], [0, 3, 6], 6, None)):
        flags = []
        vo.read_table_packed(seq_lens=torch.tensor(seq), indptr=torch.tensor(indptr), max_tokens=max_tokens,
                             out=torch.zeros(6, dtype=torch.int32), clauses=flags, **args)
        assert vo.broken_clause(flags) == clause and not flags
    with pytest.raises(kvref.ContractViolation) as err:  # a shape clause: on the host, at once
        vo.read_table_packed(seq_lens=torch.tensor([3, 3]), indptr=torch.tensor([0, 3, 6]), max_tokens=8,
                             out=torch.zeros(6, dtype=torch.int32), clauses=[], **args)
    assert err.value.clause == "read_table_packed.out_holds_max_tokens"
    flags = []
    vo.read_table(seq_lens=torch.tensor([5, 1]), max_pages=4, out=torch.zeros(2, 4, dtype=torch.int32),
                  clauses=flags, **args)
    assert vo.broken_clause(flags) == "read_table.max_pages_covers_rows"

    monkeypatch.setattr(PReadTablePacked, "preflight", lambda self, ctx: None)  # a preflight that misses it
    run = ScaleRun(kvref.PoolConfig(num_pages=64), make_tier("torch"))
    run.step(PRows(1, 2, 64, (1, 60, 1, 0, 0, 60, 5, 1), 0))
    with pytest.raises(gate.GeneratedInvalid) as err:
        run.step(_gapped_packed())
    assert err.value.clause == "read_table_packed.indptr_consistent"
