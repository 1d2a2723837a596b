"""A worker's palette of production sizes (fuzz/engine/production/palette.py).

On a GPU a kernel set compiles a variant per size it specializes on; a palette bounds the
sizes a worker's sequences draw, and must do it without breaking what the supervision
relies on: a sequence's ops are a pure function of its seed and ``scale_info`` (where the
palette travels), so a dead worker's ops and a finding's history rebuild from the hello;
and without a palette every stream is the one it was before palettes existed.
"""

from __future__ import annotations

import collections
import hashlib
import json
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz.cli import build_parser
from fuzz.engine import supervise, worker
from fuzz.engine.boundary import Constants
from fuzz.engine.campaign import CampaignOptions
from fuzz.engine.production import palette as pal
from fuzz.engine.production.generator import generator, regenerate, scale_info
from fuzz.engine.production.limits import ScaleLimits
from fuzz.engine.production.palette import EXPLORE, Palette, PaletteBoundaries, palette_info
from fuzz.engine.slot import sequence_seed
from fuzz.engine.tiers import make_tier
from fuzz.engine.tracks.production import ProductionTrack
from tests.fuzz.test_engine import kvfuzz, show

SIZE_FIELDS = ("bs", "max_pages", "n", "width", "max_tokens", "row_cap", "rows")
MODULE = {"source": "module", "blocks": {"BLOCK": 128, "BLOCK_COLS": 512}, "targets": {"TARGET_BLOCKS": 1024}}
SWEEP = Constants({f"2^{j}": 1 << j for j in range(15)}, {f"2^{j}": 1 << j for j in range(15)}, "sweep")


@pytest.fixture(scope="module")
def gpu_info() -> dict:
    """kvkernels' scale_info as a GPU worker would send it (production limits, far tables on)."""
    info = scale_info(make_tier("torch"))
    info["gpu"] = True
    return info


def _streams(info: dict, seeds=range(30), n_ops: int = 24) -> list:
    return [regenerate(seed, n_ops, info) for seed in seeds]


def _spread(streams) -> tuple[dict, dict]:
    """(field -> its distinct values, op kind -> its distinct specialization-class tuples): per
    int size field, 1 / a multiple of 16 / neither, as Triton specializes an int argument."""
    def cls(v: int) -> str:
        return "1" if v == 1 else "16" if v % 16 == 0 else "other"

    values, classes = collections.defaultdict(set), collections.defaultdict(set)
    for _, ops in streams:
        for op in ops:
            j = op.to_json()
            ints = {k: j[k] for k in SIZE_FIELDS if k in j}
            for k, v in ints.items():
                values[k].add(v)
            classes[op.kind].add(tuple((k, cls(v)) for k, v in ints.items()))
    return values, classes


def _digest(info: dict, seeds=range(8), **kw) -> str:
    out = []
    for seed in seeds:
        config, ops = regenerate(seed, 24, info, **kw)
        out.append([config.to_json(), [op.to_json() for op in ops]])
    return hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest()


# ---- what a palette bounds ------------------------------------------------------------------------


@pytest.mark.parametrize("palette_seed", [1, 2, 5])
def test_a_palette_bounds_the_sizes_a_worker_draws(gpu_info, palette_seed):
    """30 sequences x 24 ops at production limits: the fields drawn through the boundaries
    take far fewer distinct values with a palette (measured with seeds 1-5: bs 0.37-0.44 of
    the values without one, n 0.57-0.62, max_pages 0.72-0.81, all size fields together
    0.71-0.72). ``width`` and ``max_tokens`` add a per-op slack to a drawn size (0.82-0.99):
    the palette does not bound those. The specialization-class tuples per op kind are
    already few (a boundary draw meets every class), so the palette does not shrink them
    much; it must not add any in all (57-61 with one, 64 without)."""
    values, classes = _spread(_streams(gpu_info))
    pvalues, pclasses = _spread(_streams({**gpu_info, "palette": palette_info(palette_seed)}))
    ratio = {k: len(pvalues[k]) / len(values[k]) for k in SIZE_FIELDS}
    assert ratio["bs"] <= 0.5, ratio
    assert ratio["n"] <= 0.7, ratio
    assert ratio["max_pages"] <= 0.85, ratio
    assert sum(map(len, pvalues.values())) <= 0.8 * sum(map(len, values.values())), ratio
    assert set(pclasses) <= set(classes)
    assert sum(map(len, pclasses.values())) <= sum(map(len, classes.values())), (pclasses, classes)


def test_a_palette_is_finite_and_keeps_the_boundaries_it_was_drawn_at():
    constants = Constants(MODULE["blocks"], MODULE["targets"], "module")
    p = Palette(3, constants, ScaleLimits.production())
    sizes = dict(p.sizes)
    assert 30 <= len(sizes) <= 60 and 8 <= len(p.bss) <= 16
    for b in (128, 512):  # the small boundaries are always there, whatever the draws gave
        assert {b - 1, b, b + 1, 2 * b - 1, 2 * b, 2 * b + 1} <= set(sizes)
    assert sizes[129] == "BLOCK*1+1" and sizes[1024] == "BLOCK_COLS*2"
    assert max(sizes) >= 1 << 19  # every octave up to the production pool has values
    assert all(v <= ScaleLimits.production().max_step_bs for v, _ in p.bss)
    assert Palette.of(3, constants, ScaleLimits.production()).to_json() == p.to_json()  # rebuilt from its seed
    assert Palette(4, constants, ScaleLimits.production()).to_json() != p.to_json()


@settings(max_examples=300, deadline=None)
@given(lo=st.integers(0, 1 << 21), span=st.integers(0, 1 << 21), seed=st.integers(0, 1 << 30),
       palette_seed=st.integers(0, 1 << 30), explore=st.sampled_from([0.0, EXPLORE, 1.0]),
       module=st.booleans(), beyond=st.booleans())
def test_every_palette_draw_lies_inside_the_range_asked_for(lo, span, seed, palette_seed, explore, module, beyond):
    constants = Constants(MODULE["blocks"], MODULE["targets"], "module") if module else SWEEP
    palette = Palette.of(palette_seed, constants, ScaleLimits.production())
    b = PaletteBoundaries(constants, random.Random(seed), palette, explore=explore)
    hi = lo + span
    v, tag = b.size(lo, hi)
    assert lo <= v <= hi, (v, tag)
    if explore == 0.0 and palette.sizes_in(lo, hi):
        assert tag.startswith("palette:") and v in dict(palette.sizes)
    bs_hi = max(1, hi % 4097)
    v, tag = b.bs(bs_hi, beyond=beyond)
    top = max([bs_hi, *constants.targets.values()]) if beyond else bs_hi
    assert 1 <= v <= top, (v, tag)
    for bs in (1, bs_hi):
        v, tag = b.trip_pages(bs, hi + 1)
        assert 1 <= v <= hi + 1, (v, tag)
    with pytest.raises(ValueError):
        b.size(hi + 1, hi)


# ---- a pure function of (seed, info) -------------------------------------------------------------


def test_a_stream_with_a_palette_is_a_pure_function_of_its_seed_and_info(gpu_info):
    info = {**gpu_info, "palette": palette_info(11)}
    first = [[op.to_json() for op in ops] for _, ops in _streams(info, range(6))]
    pal._PALETTES.clear()  # a fresh process: the palette is rebuilt, not remembered
    for seed in (5, 3, 0):  # other sequences (and palettes) first change nothing
        regenerate(seed + 100, 24, {**gpu_info, "palette": palette_info(12)})
        assert [op.to_json() for op in regenerate(seed, 24, info)[1]] == first[seed]
    assert [[op.to_json() for op in ops] for _, ops in _streams(info, range(6))] == first
    other = [[op.to_json() for op in ops] for _, ops in _streams({**gpu_info, "palette": palette_info(12)}, range(6))]
    assert other != first
    _, gen = generator(0, info)
    for _ in range(24):
        gen.next_op()
    assert any(str(t).startswith("palette:") for s in gen.shapes for t in s.values())  # the tags say where from


def test_without_a_palette_every_stream_is_the_one_it_was(gpu_info, monkeypatch):
    """Digests of the first 24 ops of seeds 0-7, computed from the generator before palettes
    existed: kvkernels' info on the interpreter and on a GPU, hostile off, and the
    constants of a foreign set (tests/fixtures/kernels/foreign/indep.py). Aligned layouts
    (``sequence_aligned``, added later) change widths and out strides by design: off here.
    Recomputed once since, by design too: packed read tables lost their indptr gaps (SPEC §2's
    ``indptr_consistent``), which moves every later draw of a sequence that has one."""
    from fuzz.engine.production import generator as gen_mod

    monkeypatch.setattr(gen_mod, "sequence_aligned", lambda seed, gpu: False)
    cpu_info = {**gpu_info, "gpu": False}
    assert _digest(cpu_info) == "3b5d6caabc446c20d18e9bb551d3384f1cac7fb2182197dad770427cf7c8169a"
    assert _digest(gpu_info) == "f78d2ca340ad2901fcedcedce5a325b50c234e82c48b61748b262bca10aa187d"
    assert _digest({**gpu_info, "palette": None}) == _digest(gpu_info)
    assert _digest(gpu_info, hostile="off") == "b77ba79a6b42bc7611ccc40f27f999e01b3480bcf9e9708feb38ec8f2a1b35af"
    module = {**gpu_info, "constants": MODULE}
    assert _digest(module) == "dd3a0b8ba5df7baed16522060ac949ea36e8733ba798f51505bdfbdfc37be1e1"
    assert _digest({**module, "gpu": False}) == "2102ff68f8ae8797e39a4a55ad1878ddf009e78139d2a1ccabfebcd1f2a5b724"


# ---- the worker, its hello and what the parent rebuilds -------------------------------------------


def test_what_a_worker_with_a_palette_ran_regenerates_from_its_hello(monkeypatch):
    """The worker passes its palette seed to the track twice (hello and sequences); the
    parent rebuilds a dead worker's ops (``Campaign._fault``) and a finding's history
    (``Slot.history``) from the hello alone, and gets the ops the worker ran."""
    ran = []
    real = ProductionTrack.run_sequence

    def recording(self, tier, seed, n_ops, **kw):
        seq = real(self, tier, seed, n_ops, **kw)
        ran.append((seed, seq))
        return seq

    monkeypatch.setattr(ProductionTrack, "run_sequence", recording)
    sent = []

    class Queue:
        def put(self, msg):
            sent.append(msg)

    opts = CampaignOptions(backend="torch", scale="production", palette="on", seed=3, workers=2,
                           max_sequences=6, ops_per_sequence=10)  # the shard's 6: worker 1 runs 3
    beat = supervise.Beat([0] * supervise.SLOTS)
    beat.slots[supervise.HEARD] = 1  # as the parent says once it has the hello
    worker.fuzz_main(beat, opts, 1, 0, time.time() + 3600, Queue())  # bounded by its share of the work
    hello = next(m[2] for m in sent if m[0] == "hello")
    assert hello["scale"]["palette"] == {"seed": 3 * 1_000_003 + 1, "explore": EXPLORE}
    assert any("palette" in note for note in hello["notes"])
    assert [seed for seed, _ in ran] == [sequence_seed(opts, 1, k) for k in range(3)]
    track = opts.track
    for seed, seq in ran:
        assert seq.extra["palette"] == hello["scale"]["palette"]  # a finding's case records it
        config, _, ops = track.regenerate(seed, len(seq.ops), hello)
        assert config == seq.config and ops == seq.ops
    assert track.case_extra_of(hello) == {"scale": "production", "palette": hello["scale"]["palette"]}  # a fault's case
    plain = [regenerate(seed, len(seq.ops), {k: v for k, v in hello["scale"].items() if k != "palette"})[1]
             for seed, seq in ran]
    assert plain != [seq.ops for _, seq in ran]  # the palette was used, not just carried


def test_the_palette_is_on_where_sizes_cost_compiles():
    def on(**kw) -> bool:
        return CampaignOptions(**kw).palette_on()

    assert on(backend="cuda", scale="production")
    assert not on(backend="interpret", scale="production") and not on(backend="torch", scale="production")
    assert not on(backend="cuda", scale="small") and not on(backend="cuda", scale="compile")
    assert on(backend="torch", scale="production", palette="on")
    assert not on(backend="cuda", scale="production", palette="off")
    assert CampaignOptions(backend="cuda", scale="production", seed=2).palette_seed(3) == 2 * 1_000_003 + 3
    assert CampaignOptions(backend="torch", scale="production").palette_seed(0) is None
    # Worker 3 of each shard of a matrix has a palette of its own.
    shards = {CampaignOptions(backend="cuda", scale="production", seed=2, shard=(i, 4)).palette_seed(3) for i in range(4)}
    assert len(shards) == 4
    small = make_tier("torch")
    from fuzz.engine import tracks

    for name in ("small", "production"):  # every track takes the keyword; only production uses it
        assert "palette" not in json.dumps(tracks.get(name).worker_info(small))


# ---- the command line ---------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["auto", "on", "off"])
def test_the_cli_takes_a_palette_mode(value):
    assert build_parser().parse_args(["run", "--palette", value]).palette == value
    assert build_parser().parse_args(["run"]).palette == "auto"


def test_the_cli_refuses_another_palette_mode():
    r = kvfuzz("run", "--palette", "sometimes", "--budget-s", "1")
    assert r.returncode == 2 and "--palette" in r.stderr and "Traceback" not in r.stderr, show(r)


# ---- aligned layouts ----------------------------------------------------------------------------------


def test_an_aligned_sequence_lays_out_every_table_at_one_specialization(gpu_info):
    """In an aligned sequence (three in four on a GPU) every req_to_token width and every out
    row stride is a multiple of 16, so a compiled kernel meets one alignment class of those
    buffers instead of four; the other sequences keep the widths as drawn."""
    from fuzz.engine.production.arith import out_cols
    from fuzz.engine.production.generator import sequence_aligned

    seeds = range(40)
    aligned = [s for s in seeds if sequence_aligned(s, True)]
    assert 20 <= len(aligned) <= 38  # about three in four
    ragged_widths = set()
    for seed in seeds:
        _, ops = regenerate(seed, 24, gpu_info)
        for op in ops:
            width = getattr(op, "width", None) if op.kind in ("p_rows", "g_read_table") else None
            if seed in aligned:
                if width is not None and not getattr(op, "packed", False):
                    assert width % 16 == 0, (seed, op)
                if op.kind in ("p_read_table", "p_read_table_overflow"):
                    assert op.aligned and out_cols(op.max_pages, op.aligned) % 16 == 0, (seed, op)
            else:
                assert not getattr(op, "aligned", False), (seed, op)
                if width is not None:
                    ragged_widths.add(width % 16)
    assert len(ragged_widths) > 4  # the other sequences still meet unaligned widths
