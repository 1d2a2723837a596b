"""Hostile inputs: only where SPEC promises memory safety (``--hostile spec``), none
(``off``) or all (``all``); probes run the op's kernels alone on guarded tables whose
canaries cannot be mistaken for ids in either direction."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

import kvref
from fuzz.engine import shapes
from fuzz.engine.generate import contract_rate, make_generator, sequence_params
from fuzz.engine.kinds import parse_ops
from fuzz.engine.memory import RedZones, index_canary
from fuzz.engine.ops import Alloc, Free, KFreeUnbind, ReadTable, ReadTablePacked
from fuzz.engine.runner import PoolRun
from fuzz.engine.spec_side import SpecSide
from fuzz.engine.tiers import make_tier
from fuzz.engine.tracks import get as get_track
from fuzz.engine.verdict import Divergence

REPO = Path(__file__).resolve().parents[2]
TRUSTING = str(REPO / "tests/fixtures/kernels/foreign/trusting.py")
needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="Triton's interpreter is off (a GPU is present)")


class Spy:
    """A kernel set (our torch path) that counts read-table calls."""

    def __init__(self):
        import kvkernels.torch_path as tp

        self.tp, self.read_tables = tp, 0
        for name in ("alloc_bind_inplace", "free_unbind_inplace", "bind_inplace", "translate_tokens",
                     "build_kv_read_table_packed", "build_kv_read_table_legacy"):
            setattr(self, name, getattr(tp, name))

    def build_kv_read_table(self, **kw):
        self.read_tables += 1
        return self.tp.build_kv_read_table(**kw)


def _spy_tier():
    base = make_tier("torch")
    spy = Spy()
    return type(base)(base.backend, "spy", spy, base.device), spy


def test_off_makes_no_contract_violations_and_probes_nothing():
    tier = make_tier("torch")
    for seed in range(20):
        seq = get_track("small").run_sequence(tier, seed, 150, hostile="off")
        d, run = seq.divergence, seq.run
        assert d is None and run.stats.contract_ops == 0 and not run.stats.hostile


def test_a_read_table_too_narrow_for_max_pages_is_never_run_unchecked_under_spec():
    """SPEC promises nothing for a req_to_token narrower than max_pages pages: the kernel
    would read past it. Under ``spec`` it is refused and not probed; ``all`` probes it."""
    config = kvref.PoolConfig(num_pages=8)
    narrow = ReadTable([[1, 2]], [0], [2], 4, 2, False)  # width 2 < (4 - 1) * 1 + 1
    for hostile, probed in (("spec", 0), ("all", 1)):
        tier, spy = _spy_tier()
        run = PoolRun(config, tier, hostile=hostile)
        run.step(Alloc(2))
        assert run.step(narrow).error is not None
        assert spy.read_tables == probed, hostile
        assert sum(run.stats.hostile.values()) == probed


def test_a_seq_len_past_max_pages_is_probed_under_spec():
    config = kvref.PoolConfig(num_pages=8)
    tier, spy = _spy_tier()
    run = PoolRun(config, tier, hostile="spec")
    run.step(Alloc(3))
    assert run.step(ReadTable([[1, 2, 3]], [0], [9], 3, 3, False)).error is not None  # seq_len 9 > 3 pages
    assert spy.read_tables == 1 and run.stats.hostile == {"read_table_seq_lens": 1}


@needs_interpreter
@pytest.mark.parametrize("op", [Free([3]), KFreeUnbind([3])], ids=["pool free", "kernel-level free"])
def test_a_kernel_that_trusts_its_callers_shows_a_double_free_as_a_red_zone_write(op):
    """trusting.py stores p2v[v2p[v]] unmasked: a double free reads -1 and writes p2v[-1],
    which lands in the front red zone (a memory finding), not in the fuzzer's memory."""
    tier = make_tier("interpret", TRUSTING)
    run = PoolRun(kvref.PoolConfig(num_pages=8), tier, hostile="spec")
    prelude = parse_ops([{"op": "alloc", "n": 4}, {"op": "free", "tokens": [3]}] if isinstance(op, Free) else
                        [{"op": "k_alloc_bind", "v": [3], "start": 2}, {"op": "k_free_unbind", "v": [3]}])
    for p in prelude:
        run.step(p)
    with pytest.raises(Divergence) as info:
        run.step(op)
    d = info.value
    assert d.oracle == "memory" and d.field.endswith("p2v"), str(d)
    assert d.refusal and "3" in d.refusal  # the spec's refusal is part of the case


def test_a_canary_read_as_a_page_lands_in_the_red_zone_of_the_table_it_indexes():
    zones = RedZones(16, "cpu")
    rows = 9
    v2p = zones("v2p", rows, -1)
    p2v = zones("p2v", rows, -1)
    g = zones.buffers["v2p"]
    buf, zone, canary = g.buf, g.zone, g.canary
    assert canary == index_canary(rows, 16) and canary >= rows  # larger than any valid page
    # A kernel that reads v2p[-1] (the front red zone) and scatters into p2v at that page:
    page = int(buf[zone - 1])
    p2v_buf, p2v_zone = zones.buffers["p2v"].buf, zones.buffers["p2v"].zone
    flat = p2v_buf.clone()
    flat[p2v_zone + page] = -1  # where p2v + page points
    assert p2v_zone + rows <= p2v_zone + page < p2v_buf.numel()  # inside the back red zone
    p2v_buf.copy_(flat)
    assert zones.damage() == ["p2v"]
    assert v2p.numel() == p2v.numel() == rows


def test_the_red_zones_read_with_the_tables_or_later_say_what_damage_says():
    """``damage_and`` (the zones and the raw tables in one read of the device) and
    ``damage_later`` (the zones' flag read with the next read) give ``damage()``'s names."""
    zones = RedZones(8, "cpu")
    v2p, p2v = zones("v2p", 5, -1), zones("p2v", 5, -1)
    v2p[:2] = torch.tensor([0, 3])
    assert zones.damage_and(v2p, p2v) == ([], [[0, 3, -1, -1, -1], [-1] * 5])
    assert zones.damage_later().result() == []
    zones.buffers["p2v"].buf[-1] = 7  # the back red zone of p2v
    assert zones.damage() == ["p2v"]
    assert zones.damage_and(v2p) == (["p2v"], [[0, 3, -1, -1, -1]])
    assert zones.damage_later().result() == ["p2v"]
    assert RedZones(8, "cpu").damage_and(v2p) == ([], [[0, 3, -1, -1, -1]])  # no zones: the values alone


def test_token_canaries_scale_with_the_page_size():
    assert index_canary(9, 16, 4) == (9 + 8) * 4
    t = torch.tensor([index_canary(9, 16, 4)])
    assert int(t // 4) == 17  # a token of that value lies on page 17: past 9 rows, inside a 16-row zone


# ---- the packed read table: seq_lens that disagree with indptr (SPEC §2) ---------------------------

CAPACITY = str(REPO / "tests/fuzz/fixtures/kernels/asserts_out_capacity.py")


def _packed(seq_lens, indptr, max_tokens):
    return ReadTablePacked([[1, 2, 3, 4, 5, 6]], [0, 0], seq_lens, None, indptr, max_tokens, 7)


def test_packed_seq_lens_past_a_row_span_are_probed_under_spec_and_nothing_else_is():
    config = kvref.PoolConfig(num_pages=16)
    for op, cls in ((_packed([3, 5], [0, 3, 6], 6), "read_table_packed_seq_lens"),  # row 1 says 5, owns 3
                    (_packed([3, 9], [0, 3, 6], 6), "read_table_packed_seq_lens"),  # past max_tokens too
                    (_packed([3, 5], [0, 3, 6], 5), None),  # indptr[bs] > max_tokens: no promise
                    (_packed([3, 5], [0, 3, 2], 6), None),  # indptr not ascending: no promise
                    (_packed([3, 3], [-1, 3, 6], 6), None)):  # refused for another reason
        run = PoolRun(config, make_tier("torch"), hostile="spec")
        run.step(Alloc(6))
        assert run.step(op).error is not None, op
        assert run.stats.hostile == ({cls: 1} if cls else {}), (op, run.stats.hostile)
    run = PoolRun(config, make_tier("torch"), hostile="off")
    run.step(Alloc(6))
    assert run.step(_packed([3, 5], [0, 3, 6], 6)).error is not None and not run.stats.hostile


@needs_interpreter
def test_a_packed_kernel_that_trusts_seq_lens_is_a_memory_finding_past_max_tokens():
    """trusting.py writes out[indptr[b] + col] for every col < seq_lens[b]: the last row's
    two extra tokens land past max_tokens (poison of the buffer, then its red zone)."""
    run = PoolRun(kvref.PoolConfig(num_pages=16), make_tier("interpret", TRUSTING), hostile="spec")
    run.step(Alloc(6))
    with pytest.raises(Divergence) as info:
        run.step(_packed([3, 5], [0, 3, 6], 6))
    d = info.value
    assert (d.kind, d.oracle, d.field) == ("read_table_packed", "memory", "out"), str(d)
    assert "at or past max_tokens=6" in d.message and d.refusal


@pytest.mark.parametrize("backend", ["torch", pytest.param("interpret", marks=needs_interpreter)])
def test_correct_packed_kernels_stay_inside_max_tokens_on_disagreeing_seq_lens(backend):
    for kernels in ("kvkernels", str(REPO / "tests/fixtures/kernels/foreign/indep.py"), CAPACITY):
        if backend == "torch" and kernels != "kvkernels":
            continue  # the foreign set has no torch path
        run = PoolRun(kvref.PoolConfig(num_pages=16), make_tier(backend, kernels), hostile="spec")
        run.step(Alloc(6))
        for op in (_packed([3, 5], [0, 3, 6], 6), _packed([0, 40], [0, 3, 6], 6), _packed([9, 1], [0, 3, 6], 8)):
            assert run.step(op).error is not None
        assert run.stats.hostile == {"read_table_packed_seq_lens": 3}, kernels


def test_the_generators_break_the_packed_table_at_a_low_rate():
    drawn = ops = 0
    for seed in range(400):
        config, scenario, rng = sequence_params(seed)
        gen = make_generator(rng, config, scenario, contract_rate=contract_rate("spec"))
        side = SpecSide(config)
        for _ in range(60):
            op = gen.next_op(side.spec)
            gen.observe(op, side.apply(op))
            ops += 1
        drawn += gen.violations.get("packed_seq_lens", 0)
    assert 0 < drawn < ops * 0.01, (drawn, ops)
    ch = shapes.RandomChooser(random.Random(5))
    config = kvref.PoolConfig(num_pages=16, page_size=2)
    live = [[2, 3, 4, 5, 6, 7], [8, 9, 10, 11]]
    classes = set()
    for _ in range(50):
        op = shapes.packed_disagree_op(ch, config, live)
        with pytest.raises(kvref.ContractViolation):
            op.spec(kvref.Allocator(config))
        classes.add(op.hostile_class(kvref.Allocator(config), None))
    assert "read_table_packed_seq_lens" in classes


@pytest.mark.parametrize("backend", ["torch", pytest.param("interpret", marks=needs_interpreter)])
def test_a_set_that_asserts_out_holds_max_tokens_fuzzes_clean_at_small_scale(backend):
    tier = make_tier(backend, CAPACITY)
    packed = 0
    for seed in range(6 if backend == "torch" else 3):
        seq = get_track("small").run_sequence(tier, seed, 120)
        assert seq.divergence is None, f"seed {seed}: {seq.divergence}"
        packed += seq.stats.by_kind.get("read_table_packed", 0)
    assert packed >= 2


# ---- production scale: every SPEC-promised hostile class, at production sizes ---------------------

HOSTILE_PROBES = ("p_free_unbind_any", "p_read_table_overflow", "p_read_table_packed_disagree")
INDEP = str(REPO / "tests/fixtures/kernels/foreign/indep.py")


def test_production_streams_probe_unless_hostile_is_off_and_regenerate_follows_the_mode():
    from fuzz.engine.production.generator import HOSTILE_MIX, generator, scale_info
    from fuzz.engine.tracks.production import ProductionTrack

    assert set(HOSTILE_MIX) == set(HOSTILE_PROBES)
    tier = make_tier("torch")
    info = ProductionTrack().worker_info(tier)
    drawn = {"off": set(), "spec": set()}
    for seed in range(8):
        for hostile in drawn:
            _, gen = generator(seed, scale_info(tier), hostile=hostile)
            ops = [gen.next_op() for _ in range(30)]
            drawn[hostile] |= {op.kind for op in ops}
        if seed < 2:  # the stream is a function of (seed, info, hostile); all probes what spec does
            assert ProductionTrack().regenerate(seed, 30, info, hostile="spec")[2] == ops
            assert ProductionTrack().regenerate(seed, 30, info, hostile="all")[2] == ops
    assert not drawn["off"] & set(HOSTILE_PROBES)
    assert set(HOSTILE_PROBES) <= drawn["spec"], drawn["spec"]


# Bounds of work, not of seconds (a 60 s loop and a 10 s minimizer found and shrank less on a
# slower or loaded runner). Measured: seeds 0..3 meet the three probe kinds, and the
# free's case shrinks to 1 op in 27 replays.
PROBE_SEEDS = 40
PROBE_MINIMIZE_REPLAYS = 400


def _hostile_runs(tier, *, seeds: int, stop_when_found: bool, n_ops: int = 12):
    """Production sequences of the hostile mix, seeds 0 .. seeds - 1 (a bound of work, the same
    sequences on any machine): (divergences by op kind, probes by class, seconds)."""
    import time

    from fuzz.engine.production.generator import HOSTILE_MIX

    mix = {**HOSTILE_MIX, "p_rows": 1, "p_free_unbind": 1}
    start, found, probed = time.monotonic(), {}, {}
    for seed in range(seeds):
        seq = get_track("production").run_sequence(tier, seed, n_ops, mix=mix)
        for k, v in seq.stats.hostile.items():
            probed[k] = probed.get(k, 0) + v
        assert not any("refused" in n for n in seq.run.notes), seq.run.notes
        assert seq.stats.contract_ops == 0, [op.to_json() for op in seq.ops]  # every probe is well formed
        d = seq.divergence
        if d is not None:
            found.setdefault(d.kind, (seed, time.monotonic() - start, seq, d))
            if stop_when_found and set(HOSTILE_PROBES) <= set(found):
                break
    return found, probed, time.monotonic() - start


@needs_interpreter
def test_production_probes_find_a_kernel_set_that_trusts_its_callers():
    """trusting.py (lane masks only): each probe kind is a memory finding at production
    sizes, within the first PROBE_SEEDS sequences, and the case shrinks and replays with its
    signature."""
    from fuzz.engine.dispatch import replay
    from fuzz.engine.minimize import Minimizer

    tier = make_tier("interpret", TRUSTING)
    found, probed, took = _hostile_runs(tier, seeds=PROBE_SEEDS, stop_when_found=True)
    assert set(HOSTILE_PROBES) <= set(found), (sorted(found), took)
    for kind in HOSTILE_PROBES:
        seed, at, seq, d = found[kind]
        print(f"{kind}: seed {seed} at {at:.1f} s: {d}")
        assert d.oracle == "memory" and d.refusal, str(d)
    seed, at, seq, d = found["p_free_unbind_any"]
    m = Minimizer(tier, d.signature, max_replays=PROBE_MINIMIZE_REPLAYS)
    config, ops, d2 = m.run(seq.config, seq.ops[: d.step + 1])
    assert d2.signature == d.signature and len(ops) <= d.step + 1
    d3, _ = replay(config, [op.to_json() for op in ops], tier)
    assert d3 is not None and d3.signature == d.signature
    d4, run = replay(config, [op.to_json() for op in ops], tier, hostile="off")
    assert d4 is None and run.stats.contract_ops >= 1  # the probe is refused, not run, under off


@needs_interpreter
@pytest.mark.parametrize("kernels", ["indep", "kvkernels"])
def test_production_probes_stay_clean_on_sets_that_mask_everything(kernels):
    """Seeds 0, 1, ... of the hostile mix until every class was probed: no finding."""
    from fuzz.engine.production.generator import HOSTILE_MIX

    tier = make_tier("interpret", INDEP if kernels == "indep" else "kvkernels")
    probed: dict = {}
    for seed in range(8):
        seq = get_track("production").run_sequence(tier, seed, 6, mix={**HOSTILE_MIX, "p_rows": 1, "p_free_unbind": 1})
        assert seq.divergence is None, f"seed {seed}: {seq.divergence}\n{[op.to_json() for op in seq.ops]}"
        assert seq.stats.contract_ops == 0 and not any("refused" in n for n in seq.run.notes)
        for k, v in seq.stats.hostile.items():
            probed[k] = probed.get(k, 0) + v
        if len(probed) == 3:
            break
    assert set(probed) == {"free_unbind", "read_table_seq_lens", "read_table_packed_seq_lens"}, probed


def test_production_translate_of_bad_ids_counts_as_the_translate_class():
    from fuzz.engine.production.ops import PSetup, PTranslate
    from fuzz.engine.production.run import ScaleRun

    config = kvref.PoolConfig(num_pages=300)
    for hostile, counted in (("spec", {"translate": 1}), ("off", {})):
        run = ScaleRun(config, make_tier("torch"), hostile=hostile)
        run.step(PSetup(5, (1, 299, 1, 0, 0), (1, 299, 1, 0, 0)))
        run.step(PTranslate(1, 50, (1, 299, 1, 0), 0))
        run.step(PTranslate(1, 50, (1, 299, 1, 0), 7))
        run.finish()
        assert run.stats.hostile == counted, hostile


@needs_interpreter
def test_a_negative_token_a_trusting_translate_follows_reads_a_canary_on_every_replay():
    """``translate`` of ``t < 0`` is valid input (SPEC maps it to entry 0); trusting.py reads
    ``v2p[t // page_size]`` instead. The page tables' red zones reach the most negative token
    the generator draws, so that read is a canary, the same wrong entry on every replay: with
    16 guard rows, ``t = -38`` at page size 2 read past the zone, and the case's replays passed
    1 time in 5 (whatever lay before the buffer)."""
    from fuzz.engine import runner
    from fuzz.engine.dispatch import replay
    from fuzz.engine.memory import index_canary

    assert runner.GUARD_ROWS > shapes.NEGATIVE_REACH
    config = kvref.PoolConfig(num_pages=2, page_size=1)
    tier = make_tier("interpret", TRUSTING)
    seen = set()
    for _ in range(3):
        d, _run = replay(config, [{"op": "translate", "loc": [-shapes.NEGATIVE_REACH]}], tier)
        assert d is not None and str(d.signature) == "translate/result/result", d
        seen.add(str(d.target))
    canary = index_canary(config.table_rows, runner.GUARD_ROWS)
    assert seen == {str(canary)}, seen  # v2p's front zone holds the canary: read, the same every time
