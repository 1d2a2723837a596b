"""DeviceAllocator against the spec on scripted traces, on every CPU tier (and CUDA)."""

import pytest
import torch

import kvref
from fuzz.engine.dispatch import replay
from fuzz.engine.memory import RedZones
from fuzz.engine.tiers import make_tier
from kvkernels import DeviceAllocator
from kvref import ContractViolation, PoolConfig

TIERS = [
    pytest.param(("torch", None), id="torch"),
    pytest.param(("interpret", None), id="interpret", marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="interpreter tier runs on CPU-only machines")),
    pytest.param(("cuda", None), id="cuda", marks=pytest.mark.cuda),
]


@pytest.fixture(params=TIERS)
def tier(request):
    backend, kernels = request.param
    return make_tier(backend, kernels)


TRACES = {
    # grow up, ps 1: fast path, holes, the slow path takes holes from the front, flush moves data
    "holes_then_slow_path": (
        PoolConfig(num_pages=12, min_page=2, page_size=1, grow="up", max_moves=2),
        [{"op": "alloc", "n": 6}, {"op": "write", "tokens": [2, 3, 4, 5, 6, 7], "stamps": [1, 2, 3, 4, 5, 6]},
         {"op": "free", "tokens": [5, 3]}, {"op": "alloc", "n": 3},
         {"op": "read", "tokens": [2, 4, 6, 7]}, {"op": "free", "tokens": [2]},
         {"op": "flush", "urgent": False}, {"op": "read", "tokens": [4, 6, 7]},
         {"op": "flush", "urgent": True}, {"op": "read", "tokens": [4, 6, 7]}]),
    # grow down, ps 4: runs with a partial last page, flush with an in-flight forward -> pending
    "grow_down_pending": (
        PoolConfig(num_pages=10, min_page=1, page_size=4, grow="down", max_moves=8),
        [{"op": "alloc", "n": 12}, {"op": "alloc", "n": 8},
         {"op": "write", "tokens": [20, 21, 24], "stamps": [7, 8, 9]},
         {"op": "free", "tokens": [4, 5, 6, 7, 8, 9]}, {"op": "forward", "tokens": [12, 13]},
         {"op": "flush", "urgent": False}, {"op": "alloc", "n": 4}, {"op": "fire"},
         {"op": "flush", "urgent": False}, {"op": "read", "tokens": [20, 21, 24]},
         {"op": "flush", "urgent": True}]),
    # eager pool: compaction inside free, data follows
    "eager_compaction": (
        PoolConfig(num_pages=9, min_page=1, page_size=2, grow="up", lazy=False),
        [{"op": "alloc", "n": 10}, {"op": "write", "tokens": [2, 3, 10, 11], "stamps": [1, 2, 3, 4]},
         {"op": "free", "tokens": [4, 5, 6, 7]}, {"op": "read", "tokens": [2, 3, 10, 11]},
         {"op": "alloc", "n": 4}, {"op": "free", "tokens": [2, 3]}, {"op": "read", "tokens": [10, 11]}]),
    # read tables over a pool with tombstones and -1 tokens, strided and legacy grids
    "read_tables": (
        PoolConfig(num_pages=16, min_page=1, page_size=2, multiplier=3),
        [{"op": "alloc", "n": 8}, {"op": "alloc", "n": 6}, {"op": "free", "tokens": [4, 5]},
         {"op": "read_table", "rows": [[2, 3, 4, 5, -1, 7, 8, 9], [10, 11, 12, 13, 14, 15]],
          "req_idx": [1, 0, 1], "seq_lens": [6, 8, 3], "max_pages": 4, "width": 8, "legacy": False},
         {"op": "read_table", "rows": [[2, 3, 4, 5, -1, 7, 8, 9]], "req_idx": [0], "seq_lens": [7],
          "max_pages": 5, "width": 10, "legacy": True},
         {"op": "read_table_packed", "rows": [[2, 3, 4, 5, 6, 7]], "req_idx": [0, 0], "seq_lens": [3, 2],
          "kv_start": [1, 0], "indptr": [0, 3, 6], "max_tokens": 3, "width": 6},
         {"op": "translate", "loc": [-1, 2, 4, 13, 999]}]),
}


@pytest.mark.parametrize("name", sorted(TRACES))
def test_trace_matches_spec(tier, name):
    config, ops = TRACES[name]
    divergence, run = replay(config, ops, tier)
    assert divergence is None, str(divergence)
    assert run.stats.ops == len(ops)


def test_checked_mode_raises_like_the_spec_and_changes_nothing(tier):
    config = PoolConfig(num_pages=8, min_page=1, page_size=2)
    zones = RedZones(4, tier.device)
    target = DeviceAllocator(config, tier.kernels, tier.device, checked=True, buffers=zones)
    spec = kvref.Allocator(config)
    toks = target.alloc(4)
    spec.alloc(4)
    target.free(toks[:2])
    spec.free(toks[:2].tolist())
    before = target.snapshot()
    for bad in ([2, 3], [4, 5, 4, 5], [0, 1], [5, 6], [40, 41]):
        with pytest.raises(ContractViolation):
            spec.free(bad)
        with pytest.raises(ContractViolation):
            target.free(torch.tensor(bad, device=tier.device))
        assert target.snapshot() == before
    with pytest.raises(ContractViolation, match="multiple of page_size"):
        target.alloc(3)
    assert zones.damage() == []


def test_checked_lazy_free_of_pages_the_unfired_forward_writes_is_refused(tier):
    # kvref: a lazy pool cannot free what the unfired forward writes; after fire() it can
    config = PoolConfig(num_pages=8, min_page=1, page_size=2)
    target = DeviceAllocator(config, tier.kernels, tier.device, checked=True, buffers=RedZones(4, tier.device))
    toks = target.alloc(6)
    target.forward(toks[2:3])  # writes page 2
    before = target.snapshot()
    for bad in ([4, 5], [2, 3, 4, 5]):
        with pytest.raises(ContractViolation, match="page 2 is written by the in-flight forward"):
            target.free(torch.tensor(bad, device=tier.device))
        assert target.snapshot() == before
    target.free(toks[:2])  # page 1: not written by the forward
    target.fire()
    target.free(toks[2:4])
    assert target.snapshot()["holes"] == [1, 2]


def test_unchecked_double_free_stays_inside_its_tables(tier):
    config = PoolConfig(num_pages=8, min_page=1, page_size=1)
    zones = RedZones(4, tier.device)
    target = DeviceAllocator(config, tier.kernels, tier.device, checked=False, buffers=zones)
    toks = target.alloc(3)
    target.free(toks)
    target.free(toks)  # double free: v2p is -1 for every lane
    assert zones.damage() == []
    assert target.p2v[-1].item() == -1 and target.v2p[-1].item() == -1


def test_red_zone_damage_is_reported(tier):
    zones = RedZones(4, tier.device)
    target = DeviceAllocator(PoolConfig(num_pages=8), tier.kernels, tier.device, buffers=zones)
    assert zones.damage() == []
    g = zones.buffers["p2v"]
    buf, zone, canary = g.buf, g.zone, g.canary
    assert zone == 4 and canary == 9 + 4 // 2  # an index that lands in the back zone of a 9-row table
    buf[-1] = 7
    assert zones.damage() == ["p2v"]
    assert target.p2v.data_ptr() == buf.data_ptr() + zone * buf.element_size()  # the table sits inside its zones


def test_lazy_and_eager_agree_after_urgent_flush(tier):
    ops = [(4,), (6,), ("free", 0), (2,), ("free", 1), (8,)]
    pools = {}
    for lazy in (True, False):
        cfg = PoolConfig(num_pages=20, min_page=1, page_size=2, lazy=lazy)
        a = DeviceAllocator(cfg, tier.kernels, tier.device)
        runs, written = [], {}
        for step in ops:
            if step[0] == "free":
                a.free(runs[step[1]])
                for t in runs[step[1]].tolist():
                    written.pop(t, None)
            else:
                runs.append(a.alloc(step[0]))
                a.write(runs[-1], runs[-1] * 10)
                written.update({t: t * 10 for t in runs[-1].tolist()})
        a.flush(urgent=True)
        pools[lazy] = (cfg, a.snapshot(), written)
    (cl, sl, wl), (ce, se, _) = pools[True], pools[False]
    kvref.invariants.check_lazy_eager_agree(cl, sl, ce, se, wl)


@pytest.mark.parametrize("r2t_dtype", [torch.int64, torch.int32], ids=["int64", "int32"])
@pytest.mark.parametrize("seq_len,req,max_pages,needle", [
    (7, 0, 3, "max_pages"),          # needs 4 pages at ps 2
    (2, 5, 3, "row index 5"),        # req_pool_indices past req_to_token
    (-1, 0, 3, "negative"),
])
def test_checked_read_table_refuses_like_the_spec(tier, seq_len, req, max_pages, needle, r2t_dtype):
    config = PoolConfig(num_pages=8, min_page=1, page_size=2)
    target = DeviceAllocator(config, tier.kernels, tier.device, checked=True)
    toks = target.alloc(6)
    dev = tier.device
    r2t = torch.full((1, 8), -1, dtype=r2t_dtype, device=dev)
    r2t[0, :6] = toks
    out = torch.full((1, 4), 77, dtype=torch.int32, device=dev)
    kw = dict(req_to_token=r2t, req_pool_indices=torch.tensor([req], device=dev),
              seq_lens=torch.tensor([seq_len], device=dev), max_pages=max_pages, out=out[:, :max_pages])
    with pytest.raises(ContractViolation, match=needle):
        target.build_read_table(**kw)
    with pytest.raises(ContractViolation):
        kvref.kernels.read_table(req_to_token=r2t.tolist(), req_pool_indices=[req], seq_lens=[seq_len],
                                 v2p=target.v2p.tolist(), multiplier=1, page_size=2, max_pages=max_pages,
                                 out=[[77] * 4])
    assert out.tolist() == [[77] * 4]


@pytest.mark.parametrize("r2t_dtype", [torch.int64, torch.int32], ids=["int64", "int32"])
def test_checked_read_tables_accept_int32_and_int64_rows(tier, r2t_dtype):
    """SPEC §2: req_to_token may be int32 (SGLang) or int64; checked mode reads back only the
    rows the batch names (a server's table is max requests x max context)."""
    config = PoolConfig(num_pages=16, min_page=1, page_size=2, multiplier=3)
    target = DeviceAllocator(config, tier.kernels, tier.device, checked=True)
    spec = kvref.Allocator(config)
    toks = target.alloc(8)
    spec.alloc(8)
    dev = tier.device
    r2t = torch.full((64, 10), -1, dtype=r2t_dtype, device=dev)
    r2t[37, :8] = toks
    rows = r2t.tolist()
    out = torch.full((2, 6), 77, dtype=torch.int32, device=dev)
    want = [[77] * 6 for _ in range(2)]
    spec.read_table(req_to_token=rows, req_pool_indices=[37, 37], seq_lens=[8, 3], max_pages=5, out=want)
    target.build_read_table(req_to_token=r2t, req_pool_indices=torch.tensor([37, 37], device=dev),
                            seq_lens=torch.tensor([8, 3], device=dev), max_pages=5, out=out[:, :5])
    assert out.tolist() == want
    flat = torch.full((8,), 77, dtype=torch.int32, device=dev)
    want_flat = [77] * 8
    spec.read_table_packed(req_to_token=rows, req_pool_indices=[37], seq_lens=[5], indptr=[0, 5], max_tokens=5,
                           out=want_flat, kv_start_idx=[2])
    target.build_read_table_packed(req_to_token=r2t, req_pool_indices=torch.tensor([37], device=dev),
                                   seq_lens=torch.tensor([5], device=dev), indptr=torch.tensor([0, 5], device=dev),
                                   max_tokens=5, out=flat, kv_start_idx=torch.tensor([2], device=dev))
    assert flat.tolist() == want_flat
