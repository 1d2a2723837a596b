"""Chains of pools through the fuzzer (docs/spec.md §6): the chain ops, refusals, the
differential runner on both CPU tiers, the planted chain bugs' cases, features and the
coverage report."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import kvref
from fuzz.engine import guide
from fuzz.engine.case import CaseError, load_case
from fuzz.engine.chain_gen import CHAIN_FEATURES, FLOAT_FEATURES, is_chain_seed
from fuzz.engine.chain_ops import CHAIN_KINDS, ChainAlloc, ChainGate
from fuzz.engine.dispatch import replay
from fuzz.engine.features import Collector
from fuzz.engine.kinds import parse_ops
from fuzz.engine.oplang import Op, OpError
from fuzz.engine.runner import PoolRun
from fuzz.engine.tiers import make_tier
from fuzz.engine.tracks.small import SmallTrack
from fuzz.engine.verdict import SetupError
from fuzz.tools import coverage_report
from fuzz.tools.mutants import MUTANTS, mutant_tier
from kvref.config import ChainConfig

REPO = Path(__file__).resolve().parents[2]
CASES = REPO / "tests" / "fixtures" / "chain_mutants"
CHAIN_MUTANTS = [m for m in MUTANTS if m.name.startswith(("chain-", "float-"))]
INTERPRET = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                               reason="Triton's interpreter is off (a GPU is present)")
TIERS = ["torch", pytest.param("interpret", marks=INTERPRET)]


def chain_config() -> kvref.PoolConfig:
    peer = kvref.PoolConfig(num_pages=16, page_size=2, grow="down")
    return kvref.PoolConfig(num_pages=24, min_page=2, chain=ChainConfig(48, (2, 3), (peer,)))


def test_chain_ops_are_typed_records_with_their_json_form():
    for kind in CHAIN_KINDS:
        cls = Op.registry[kind]
        fields = {"pool": 1, "n": 2, "tokens": [2, 3], "stamps": [7, 8], "urgent": True, "open": False, "side": "low",
                  "min_bytes": 3}
        op = Op.from_json({"op": kind, **{f: fields[f] for f in cls.field_names()}})
        assert Op.from_json(op.to_json()) == op
    with pytest.raises(OpError, match="pool"):
        ChainAlloc("0", 1)
    with pytest.raises(OpError, match="open"):
        ChainGate(0, 1)


def test_a_chain_op_on_a_single_pool_is_refused_clearly_on_both_sides():
    run = PoolRun(kvref.PoolConfig(num_pages=8), make_tier("torch"))
    out = run.step(ChainAlloc(0, 2))
    assert isinstance(out.error, kvref.ContractViolation) and "single pool" in str(out.error)
    run.finish()


def test_a_case_with_a_chain_op_the_config_cannot_run_is_refused_on_loading(tmp_path):
    case = json.loads((CASES / "chain-frontier-off-by-one.json").read_text())
    single = {**case, "config": {"num_pages": 8}}
    (tmp_path / "single.json").write_text(json.dumps(single))
    with pytest.raises(CaseError, match="has no chain"):
        load_case(tmp_path / "single.json")


def test_a_case_naming_a_pool_the_chain_lacks_loads_and_the_spec_refuses_the_op(tmp_path):
    """The generator names a missing pool on purpose (a broken precondition): a case holding such
    an op was once refused on loading, so a campaign's own case file (one H200 run's flaky
    fixture) could not be replayed or rated."""
    case = json.loads((CASES / "chain-frontier-off-by-one.json").read_text())
    far = {**case, "ops": [{"op": "chain_alloc", "pool": 5, "n": 1}]}
    (tmp_path / "far.json").write_text(json.dumps(far))
    loaded = load_case(tmp_path / "far.json")
    run = PoolRun(loaded.config, make_tier("torch"))
    out = run.step(loaded.ops[0])
    assert isinstance(out.error, kvref.ContractViolation) and "pool 5" in str(out.error), out
    run.finish()


def test_an_allocator_without_chains_is_a_setup_error_for_a_chain_config():
    from fuzz.engine.allocators import attach

    tier = attach(make_tier("torch"), str(REPO / "tests" / "fixtures" / "allocators" / "heap_allocator.py"))
    with pytest.raises(SetupError, match="has no .chain"):
        PoolRun(chain_config(), tier)


@pytest.mark.parametrize("backend", TIERS)
def test_chain_seeds_run_clean_on_our_allocator(backend):
    seeds = [s for s in range(60) if is_chain_seed(s)][: 6 if backend == "torch" else 2]
    track, tier = SmallTrack(), make_tier(backend)
    kinds = set()
    for seed in seeds:
        seq = track.run_sequence(tier, seed, 120 if backend == "torch" else 50)
        assert seq.config.chain is not None and seq.divergence is None, (seed, seq.divergence)
        kinds |= set(seq.run.stats.by_kind)
    if backend == "torch":
        assert set(CHAIN_KINDS) <= kinds, set(CHAIN_KINDS) - kinds


@pytest.mark.parametrize("backend", TIERS)
@pytest.mark.parametrize("m", CHAIN_MUTANTS, ids=[m.name for m in CHAIN_MUTANTS])
def test_each_planted_chain_bug_has_a_case_that_replays(m, backend):
    """Its minimized case (found by a default torch campaign: ``kvfuzz mutants --backend torch``)
    fails on the mutant with the case's signature and passes on ours."""
    case = load_case(CASES / f"{m.name}.json")
    assert case.config.chain is not None and len(case.ops) <= 10
    divergence, _ = replay(case.config, case.ops, mutant_tier(m, backend), knobs=case.knobs)
    assert divergence is not None and divergence.signature == case.signature, divergence
    divergence, _ = replay(case.config, case.ops, make_tier(backend), knobs=case.knobs)
    assert divergence is None, divergence


@pytest.mark.parametrize("layout", [2, 3])
def test_a_chain_run_yields_chain_features_and_the_report_names_the_rest(tmp_path, layout):
    track, tier = SmallTrack(), make_tier("torch")
    seq = next(seq for s in range(200) if is_chain_seed(s)
               if len((seq := track.run_sequence(tier, s, 150)).config.members) == layout)
    col = Collector()
    col.add_run(seq.run)
    chain = {n for n in col.names if n.startswith("chain|")}
    listed = set(CHAIN_FEATURES) | (set(FLOAT_FEATURES) if layout == 3 else set())
    assert chain and {n.split("|", 1)[1] for n in chain} <= listed
    assert (layout == 3) == any(n.split("|", 1)[1] in FLOAT_FEATURES for n in chain)
    c = guide.Corpus(tmp_path)
    c.add({"stream": [0.5], "marks": [], "knobs": None, "r2t": "int64", "features": sorted(chain), "ops": 3,
           "cost_s": 0.1})
    rep = coverage_report.report([tmp_path])
    assert set(rep["chain"]["reached"]) == {n.split("|", 1)[1] for n in chain}
    assert set(rep["chain"]["never"]) == listed - set(rep["chain"]["reached"])
    text = coverage_report.text(rep)
    assert f"chain: reached {len(rep['chain']['reached'])}" in text
    assert all(f"never: chain: {f}" in text for f in rep["chain"]["never"])


def test_chain_ops_parse_from_a_case_file():
    ops = parse_ops(json.loads((CASES / "chain-memo-ignores-gate.json").read_text())["ops"])
    assert {op.kind for op in ops} <= set(CHAIN_KINDS)
