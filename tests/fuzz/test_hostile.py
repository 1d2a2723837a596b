"""Hostile inputs: only where SPEC promises memory safety (``--hostile spec``), none
(``off``) or all (``all``); probes run the op's kernels alone on guarded tables whose
canaries cannot be mistaken for ids in either direction."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import kvref
from fuzz.engine.kinds import parse_ops
from fuzz.engine.memory import RedZones, index_canary
from fuzz.engine.ops import Alloc, Free, KFreeUnbind, ReadTable
from fuzz.engine.runner import PoolRun
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


def test_token_canaries_scale_with_the_page_size():
    assert index_canary(9, 16, 4) == (9 + 8) * 4
    t = torch.tensor([index_canary(9, 16, 4)])
    assert int(t // 4) == 17  # a token of that value lies on page 17: past 9 rows, inside a 16-row zone
