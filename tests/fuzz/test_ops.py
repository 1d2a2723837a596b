"""The typed op language (fuzz.engine.ops), the shared grammar both generators draw from
(fuzz.engine.shapes), typed case files and the minimizer's cache."""

from __future__ import annotations

import dataclasses
import json
import random
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvref
from fuzz.engine import shapes, strategies
from fuzz.engine.allocators import has_chains
from fuzz.engine.case import Case, Signature
from fuzz.engine.chain_ops import CHAIN_KINDS
from fuzz.engine.dispatch import replay
from fuzz.engine.generate import make_generator, sequence_params
from fuzz.engine.kinds import parse_ops
from fuzz.engine.minimize import Minimizer, NotReproducible
from fuzz.engine.ops import KERNEL_KINDS, POOL_KINDS, Alloc, Free, Ints, Op, OpError, ReadTablePacked, Rows
from fuzz.engine.runner import PoolRun
from fuzz.engine.tiers import make_tier

REPO = Path(__file__).resolve().parents[2]
CORPUS = sorted((REPO / "tests/corpus").glob("*.json"))
KINDS = sorted(Op.registry)


# ---- records and their JSON ---------------------------------------------------------------


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_corpus_ops_and_cases_round_trip_byte_for_byte(path):
    data = json.loads(path.read_text())
    for op in data["ops"]:
        assert json.dumps(Op.from_json(op).to_json()) == json.dumps(op)
    assert json.dumps(Case.from_json(data).to_json()) == json.dumps(data)  # key order included


def _wrong_value(hint):
    """A value of the wrong type for a field annotated ``hint``."""
    if hint is bool:
        return 1
    if hint is int:
        return True
    if hint is str:
        return 3
    if hint == Rows:
        return [[1], "2"]
    return [1, "2"]


def _good_value(hint):
    return {int: 3, bool: False, str: "x"}.get(hint, [[1, 2]] if hint == Rows else [1, 2])


@pytest.mark.parametrize("kind", KINDS)
def test_every_field_is_checked_on_construction(kind):
    cls = Op.registry[kind]
    hints = typing.get_type_hints(cls)
    names = cls.field_names()
    defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
    good = {name: defaults.get(name, _good_value(hints[name])) for name in names} | getattr(cls, "example", {})
    op = cls(**good)  # a record that checks what its fields mean, not only their types, names a valid instance
    assert Op.from_json(op.to_json()) == op and hash(op) == hash(Op.from_json(op.to_json()))
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(op, names[0], good[names[0]]) if names else op.__setattr__("x", 1)
    for name in names:
        with pytest.raises(OpError, match=f"'{name}'(\\[\\d+\\])? must be"):
            cls(**dict(good, **{name: _wrong_value(hints[name])}))


def test_optional_fields_accept_null():
    op = ReadTablePacked([[1]], [0], [1], None, [0, 1], 1, 1)
    assert op.kv_start is None and op.to_json()["kv_start"] is None
    assert typing.get_type_hints(ReadTablePacked)["kv_start"] == (Ints | None)


@pytest.mark.parametrize("bad, needle", [
    ({"op": "explode"}, "not an op"),
    ({"n": 2}, "not an op"),
    ({"op": "alloc"}, "needs fields"),
    ({"op": "alloc", "n": 2, "urgent": True}, "needs fields"),
    ("alloc", "not an op"),
])
def test_from_json_refuses_what_is_not_an_op(bad, needle):
    with pytest.raises(OpError, match=needle):
        Op.from_json(bad)
    with pytest.raises(OpError, match=r"ops\[1\]"):
        parse_ops([{"op": "fire"}, bad])


def _elements(op: Op) -> int:
    """How many ids an op carries."""
    def count(v):
        return sum(count(x) for x in v) if isinstance(v, (list, tuple)) else 1
    return count([v for k, v in op.to_json().items() if k != "op"])


def test_shrink_candidates_are_valid_smaller_ops_of_the_same_kind():
    seen = set()
    for seed in range(40):
        config, scenario, rng = sequence_params(seed)
        gen, run = make_generator(rng, config, scenario), PoolRun(config, make_tier("torch"))
        for _ in range(60):
            op = gen.next_op(run.spec)
            gen.observe(op, run.step(op))
            for cand in op.shrink():
                assert type(cand) is type(op) and cand != op
                assert _elements(cand) <= _elements(op)
                seen.add(op.kind)
        run.finish()
    assert {"alloc", "free", "read_table", "read_table_packed", "k_bind"} <= seen


def test_signature_has_one_text_form_and_one_file_name_form():
    sig = Signature("read_table", "result", "out")
    assert str(sig) == "read_table/result/out"
    assert sig.slug() == "read_table-result-out"
    assert Signature.from_json(sig.to_json()) == sig
    assert Signature("end", "state", "p2v[3]").slug() == "end-state-p2v_3_"


# ---- one grammar, two generators ----------------------------------------------------------


# Seeds 0-11 of 120 ops already reach every op and violation kind (measured); twice that.
# (The Hypothesis side keeps its 400 examples: unseeded, eight runs needed 134 to 254 of them.)
def _seeded_kinds(n_seeds: int = 24) -> tuple[set[str], set[str]]:
    op_kinds, violation_kinds = set(), set()
    tier = make_tier("torch")
    for seed in range(n_seeds):
        config, scenario, rng = sequence_params(seed, has_chains(tier))
        gen = make_generator(rng, config, scenario, contract_rate=0.25)
        run = PoolRun(config, tier)
        for _ in range(120):
            op = gen.next_op(run.spec)
            op_kinds.add(op.kind)
            gen.observe(op, run.step(op))
        violation_kinds |= set(gen.violations)
    return op_kinds, violation_kinds


def _hypothesis_kinds() -> tuple[set[str], set[str]]:
    op_kinds, violation_kinds = set(), set()

    def material(config):
        spec = kvref.Allocator(config)
        live = [r for r in (spec.alloc(k * config.page_size) for k in (2, 1, 3)) if r]
        dead = [live.pop(0)] if len(live) > 1 else []
        for run in dead:
            spec.free(run)
        return live, dead

    pooled = strategies.pool_configs(page_sizes=(1, 2, 4)).flatmap(
        lambda c: st.tuples(st.just(c), st.just(material(c))))

    # derandomized: each violation kind is 4-5 % of the draws (measured over 4,000), so 400 random
    # ones missed one ~2e-7 of the time; fixed draws cover them all in every run, or in none
    @settings(max_examples=400, database=None, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(pooled, st.data())
    def draw(config_material, data):
        config, (live, dead) = config_material
        op_kinds.add(data.draw(strategies.pool_ops(config, live, dead)).kind)
        op_kinds.add(data.draw(strategies.raw_ops(config, {1: 2, 3: 4})).kind)
        kind, _ = data.draw(st.composite(lambda d: shapes.violation_op(
            shapes.HypothesisChooser(d), config, live, dead, {1: 2}))())
        violation_kinds.add(kind)

    draw()
    return op_kinds, violation_kinds


def test_both_generators_cover_the_same_kinds():
    seeded_ops, seeded_violations = _seeded_kinds()
    hyp_ops, hyp_violations = _hypothesis_kinds()
    small = set(POOL_KINDS + KERNEL_KINDS)  # production-scale kinds (fuzz.engine.production) have their own generator
    # chain seeds' ops come from the chain generator alone (chain_gen; tests/fuzz/test_chain.py covers them)
    chain = seeded_ops & set(CHAIN_KINDS)
    assert chain, "no chain seed among the seeded sequences"
    seeded_ops -= chain
    assert seeded_ops == hyp_ops == small, (seeded_ops ^ small, hyp_ops ^ small)
    assert seeded_violations == hyp_violations == set(shapes.VIOLATIONS), (
        set(shapes.VIOLATIONS) - seeded_violations, set(shapes.VIOLATIONS) - hyp_violations)


def test_every_violation_kind_is_refused_by_the_spec():
    for seed in range(30):
        rng = random.Random(seed)
        config = kvref.PoolConfig(num_pages=12, min_page=2, page_size=rng.choice((1, 2, 4)))
        ch = shapes.RandomChooser(rng)
        for kind, build in shapes.VIOLATIONS.items():
            run = PoolRun(config, make_tier("torch"))
            live = [run.step(Alloc(2 * config.page_size)).result, run.step(Alloc(config.page_size)).result]
            dead = [run.step(Alloc(config.page_size)).result]
            run.step(Free(dead[0]))
            run.step(shapes.raw_op(ch, config, {}))
            bound = {v: p for v, p in enumerate(run.raw_spec["v2p"]) if p > 0}
            op = build(ch, config, live, dead, bound)
            if not op:
                continue
            assert run.step(op).error is not None, (kind, op)
            run.finish()


# ---- the minimizer ---------------------------------------------------------------------------


def test_not_reproducible_is_not_a_value_error():
    assert not issubclass(NotReproducible, ValueError)  # ContractViolation is one
    with pytest.raises(NotReproducible):
        Minimizer(make_tier("torch"), Signature("free", "state", "p2v")).run(
            kvref.PoolConfig(num_pages=8), [Alloc(2), Free([1, 2])])


def test_the_minimizer_never_replays_a_candidate_twice(monkeypatch):
    fake = str(REPO / "tests/fuzz/fixtures/kernels/past_prefix.py")
    tier = make_tier("torch", fake)
    config = kvref.PoolConfig(num_pages=12, page_size=2, multiplier=3)
    ops = parse_ops([{"op": "alloc", "n": 6}, {"op": "alloc", "n": 4}, {"op": "write", "tokens": [2], "stamps": [1]},
                     {"op": "read_table", "rows": [[2, 3, 4, 5, 6, 7], [8, 9, 10, 11]], "req_idx": [0, 1],
                      "seq_lens": [3, 4], "max_pages": 3, "width": 6, "legacy": False}])
    d, _ = replay(config, ops, tier)
    assert d is not None
    calls = []
    import fuzz.engine.dispatch as dispatch

    real = dispatch.replay
    monkeypatch.setattr(dispatch, "replay", lambda c, o, t, **kw: calls.append((c, tuple(o))) or real(c, o, t, **kw))
    m = Minimizer(tier, d.signature)
    small_config, small, small_d = m.run(config, ops)
    assert small_d.signature == d.signature and len(small) <= 2
    # +1: the suite's own check (tests/conftest.py) judges the minimized case once more
    assert len(calls) - 1 == len(set(calls)) == m.replays
    assert m.saved > 0  # the strategies did revisit candidates
