"""Read tables (strided, legacy, packed) and translate against kvref.kernels, on every tier.

``out`` is always poisoned with a canary and lives inside a bigger buffer (extra rows
and columns), so "nothing past each row's live prefix and no row >= bs changes" is
checked over the whole buffer, not just the slice the spec looks at.
"""

from __future__ import annotations

import pytest
import torch

from kvkernels import launchers
from kvref import kernels as spec

CANARY32 = 0x5A5A5A5A
EXTRA_ROWS, EXTRA_COLS = 3, 5


def _scenario(rng, *, bs, ps, max_pages, rows=48, req_rows=None, tombstones=0.25, neg_tokens=0.15):
    """Random v2p (with -1 tombstones), req_to_token (with -1 tokens), a batch that fits max_pages."""
    v2p = [0] + [rng.randrange(1, 1000) if rng.random() > tombstones else -1 for _ in range(rows - 2)] + [-1]
    req_rows = req_rows or max(2, bs // 2)
    width = max_pages * ps
    req_to_token = [
        [rng.randrange(rows * ps) if rng.random() > neg_tokens else -1 for _ in range(width)] for _ in range(req_rows)
    ]
    req_idx = [rng.randrange(req_rows) for _ in range(bs)]
    seq_lens = [rng.choice([0, 1, ps, max_pages * ps, rng.randint(0, max_pages * ps)]) for _ in range(bs)]
    # Row 0 is full, starts with a -1 token and holds a tombstoned page: every case sees both.
    seq_lens[0] = max_pages * ps
    req_to_token[req_idx[0]][0] = -1
    if max_pages > 1:
        req_to_token[req_idx[0]][ps] = (rows - 1) * ps  # page rows - 1: the sentinel row, -1
    return v2p, req_to_token, req_idx, seq_lens


R2T_DTYPES = pytest.mark.parametrize("r2t", [torch.int64, torch.int32], ids=["r2t64", "r2t32"])  # SPEC §2: both


def _run_read_table(tier, fn, v2p, req_to_token, req_idx, seq_lens, *, bs, ps, mult, max_pages, r2t=torch.int64):
    """Run ``fn`` on a poisoned out inside a bigger buffer; diff the whole buffer with the spec."""
    buf_rows, buf_cols = bs + EXTRA_ROWS, max_pages + EXTRA_COLS
    expect = [[CANARY32] * buf_cols for _ in range(buf_rows)]
    spec.read_table(req_to_token=req_to_token, req_pool_indices=req_idx, seq_lens=seq_lens, v2p=v2p,
                    multiplier=mult, page_size=ps, max_pages=max_pages, out=expect)
    buf = torch.full((buf_rows, buf_cols), CANARY32, dtype=torch.int32, device=tier.device)
    out = buf[:, :max_pages]  # row stride > max_pages, as a CUDA-graph buffer sliced to max_pages may have
    ret = fn(req_to_token=tier.t(req_to_token, r2t), req_pool_indices=tier.t(req_idx), seq_lens=tier.t(seq_lens),
             v2p=tier.t(v2p), multiplier=mult, page_size=ps, max_pages=max_pages, out=out)
    assert ret is out
    assert buf.cpu().tolist() == expect
    return expect


CASES = [  # bs, ps, mult, max_pages
    (1, 1, 1, 9),
    (5, 1, 3, 13),
    (9, 4, 2, 21),
    (3, 16, 1, 6),
    (64, 2, 5, 7),
]


@R2T_DTYPES
@pytest.mark.parametrize("legacy", [False, True], ids=["strided", "legacy"])
@pytest.mark.parametrize("bs,ps,mult,max_pages", CASES)
def test_read_table_matches_spec(tier, rng, legacy, bs, ps, mult, max_pages, r2t):
    fn = tier.k.build_kv_read_table_legacy if legacy else tier.k.build_kv_read_table
    v2p, rows, req_idx, seq_lens = _scenario(rng, bs=bs, ps=ps, max_pages=max_pages)
    expect = _run_read_table(tier, fn, v2p, rows, req_idx, seq_lens, bs=bs, ps=ps, mult=mult, max_pages=max_pages,
                             r2t=r2t)
    # The scenario must exercise what it claims to: live entries, tombstones, untouched canaries.
    live = [x for row in expect[:bs] for x in row[:max_pages] if x != CANARY32]
    assert live and any(x == 0 for x in live) and any(x > 0 for x in live)


@R2T_DTYPES
@pytest.mark.parametrize("legacy", [False, True], ids=["strided", "legacy"])
@pytest.mark.parametrize("bs,ps,max_pages", [(1, 1, 45), (3, 2, 30), (7, 3, 19)])
def test_read_table_small_blocks_loop(tier, monkeypatch, rng, legacy, bs, ps, max_pages, r2t):
    """BLOCK_COLS=4, TARGET_BLOCKS=8: each strided program loops over several column blocks."""
    tier.shrink_blocks(monkeypatch, cols=4, target=8)
    _, col_programs = launchers.read_table_grid(bs, max_pages, block_cols=4, target_blocks=8)
    assert col_programs * 4 < max_pages  # so the loop really iterates more than once
    fn = tier.k.build_kv_read_table_legacy if legacy else tier.k.build_kv_read_table
    v2p, rows, req_idx, _ = _scenario(rng, bs=bs, ps=ps, max_pages=max_pages)
    seq_lens = [max_pages * ps] + [rng.randint(0, max_pages * ps) for _ in range(bs - 1)]
    _run_read_table(tier, fn, v2p, rows, req_idx, seq_lens, bs=bs, ps=ps, mult=2, max_pages=max_pages, r2t=r2t)


def test_read_table_refreshes_in_place(tier, rng):
    """A second build over a shorter batch rewrites only its live prefix (CUDA-graph replay)."""
    bs, ps, max_pages = 4, 2, 10
    v2p, r2t, req_idx, _ = _scenario(rng, bs=bs, ps=ps, max_pages=max_pages, tombstones=0.0, neg_tokens=0.0)
    out = torch.full((bs, max_pages), CANARY32, dtype=torch.int32, device=tier.device)
    args = dict(req_to_token=tier.t(r2t), req_pool_indices=tier.t(req_idx), v2p=tier.t(v2p),
                multiplier=1, page_size=ps, max_pages=max_pages, out=out)
    tier.k.build_kv_read_table(seq_lens=tier.t([max_pages * ps] * bs), **args)
    full = out.cpu().tolist()
    assert all(x != CANARY32 for row in full for x in row)
    args["v2p"] = tier.t([0] * len(v2p))
    tier.k.build_kv_read_table(seq_lens=tier.t([3, 0, 1, 2 * ps]), **args)
    got = out.cpu().tolist()
    for b, n_live in enumerate([2, 0, 1, 2]):
        assert got[b][:n_live] == [0] * n_live
        assert got[b][n_live:] == full[b][n_live:]


def test_read_table_accepts_int32_inputs(tier, rng):
    """req_to_token and seq_lens are int32 in an inference server; ids are read as int64."""
    bs, ps, max_pages = 6, 2, 8
    v2p, r2t, req_idx, seq_lens = _scenario(rng, bs=bs, ps=ps, max_pages=max_pages)
    expect = [[CANARY32] * max_pages for _ in range(bs)]
    spec.read_table(req_to_token=r2t, req_pool_indices=req_idx, seq_lens=seq_lens, v2p=v2p, multiplier=1,
                    page_size=ps, max_pages=max_pages, out=expect)
    out = torch.full((bs, max_pages), CANARY32, dtype=torch.int32, device=tier.device)
    tier.k.build_kv_read_table(req_to_token=tier.t(r2t, torch.int32), req_pool_indices=tier.t(req_idx),
                               seq_lens=tier.t(seq_lens, torch.int32), v2p=tier.t(v2p), multiplier=1,
                               page_size=ps, max_pages=max_pages, out=out)
    assert out.cpu().tolist() == expect


def _packed_scenario(rng, *, bs, ps, max_tokens, with_start, rows=40):
    v2p = [0] + [rng.randrange(1, 500) if rng.random() > 0.25 else -1 for _ in range(rows - 2)] + [-1]
    width = max_tokens + 3 * ps
    req_rows = max(2, bs)
    r2t = [[rng.randrange(rows * ps) if rng.random() > 0.15 else -1 for _ in range(width)] for _ in range(req_rows)]
    req_idx = [rng.randrange(req_rows) for _ in range(bs)]
    seq_lens = [rng.choice([0, 1, max_tokens, rng.randint(0, max_tokens)]) for _ in range(bs)]
    seq_lens[0] = max_tokens
    starts = [rng.randint(0, width - n) for n in seq_lens] if with_start else None
    indptr = [0]
    for n in seq_lens:
        indptr.append(indptr[-1] + n)  # SPEC §2: indptr_consistent (no gaps)
    return v2p, r2t, req_idx, seq_lens, indptr, starts


@R2T_DTYPES
@pytest.mark.parametrize("with_start", [False, True], ids=["no_kv_start", "kv_start"])
@pytest.mark.parametrize("bs,ps,mult,max_tokens,small", [(1, 1, 1, 23, True), (6, 4, 3, 30, True),
                                                          (17, 2, 2, 12, False)])
def test_read_table_packed_matches_spec(tier, monkeypatch, rng, with_start, bs, ps, mult, max_tokens, small, r2t):
    if small:
        tier.shrink_blocks(monkeypatch, cols=4, target=8)
    v2p, rows, req_idx, seq_lens, indptr, starts = _packed_scenario(
        rng, bs=bs, ps=ps, max_tokens=max_tokens, with_start=with_start)
    cap = indptr[-1] + 2  # the buffer captured at max_tokens (SPEC §2: indptr[bs] <= max_tokens <= len(out))
    size = cap + 4
    expect = [CANARY32] * size
    spec.read_table_packed(req_to_token=rows, req_pool_indices=req_idx, seq_lens=seq_lens, v2p=v2p, indptr=indptr,
                           multiplier=mult, page_size=ps, max_tokens=cap, out=expect, kv_start_idx=starts)
    out = torch.full((size,), CANARY32, dtype=torch.int32, device=tier.device)
    ret = tier.k.build_kv_read_table_packed(
        req_to_token=tier.t(rows, r2t), req_pool_indices=tier.t(req_idx), seq_lens=tier.t(seq_lens), v2p=tier.t(v2p),
        indptr=tier.t(indptr), multiplier=mult, page_size=ps, max_tokens=cap, out=out,
        kv_start_idx=None if starts is None else tier.t(starts))
    assert ret is out
    assert out.cpu().tolist() == expect
    assert sum(x != CANARY32 for x in expect) == sum(seq_lens) > 0


@pytest.mark.parametrize("ps", [1, 3, 8])
def test_translate_matches_spec(tier, monkeypatch, rng, ps):
    tier.shrink_blocks(monkeypatch, ids=8)
    rows = 30
    v2p = [0] + [rng.randrange(1, 200) if rng.random() > 0.3 else -1 for _ in range(rows - 2)] + [-1]
    loc = [rng.randrange(-3 * ps, (rows + 4) * ps) for _ in range(50)] + [-1, 0, rows * ps, (rows - 1) * ps, 2**40]
    expect = spec.translate(v2p, loc, ps)
    got = tier.k.translate_tokens(loc=tier.t(loc), v2p=tier.t(v2p), page_size=ps)
    assert got.dtype == torch.int64 and got.cpu().tolist() == expect
    out = torch.full((len(loc),), -5, dtype=torch.int64, device=tier.device)
    assert tier.k.translate_tokens(loc=tier.t(loc), v2p=tier.t(v2p), page_size=ps, out=out) is out
    assert out.cpu().tolist() == expect
    assert any(x > 0 for x in expect) and expect.count(0) >= 5


def test_empty_batches_write_nothing(tier):
    v2p = tier.t([0, 5, -1])
    r2t = tier.t([[1, 2, 3]])
    empty = tier.t([])
    out = torch.full((2, 3), CANARY32, dtype=torch.int32, device=tier.device)
    assert tier.k.build_kv_read_table(req_to_token=r2t, req_pool_indices=empty, seq_lens=empty, v2p=v2p,
                                      multiplier=1, page_size=1, max_pages=3, out=out) is out
    assert tier.k.build_kv_read_table_legacy(req_to_token=r2t, req_pool_indices=empty, seq_lens=empty, v2p=v2p,
                                             multiplier=1, page_size=1, max_pages=3, out=out) is out
    assert (out == CANARY32).all()
    flat = torch.full((4,), CANARY32, dtype=torch.int32, device=tier.device)
    assert tier.k.build_kv_read_table_packed(req_to_token=r2t, req_pool_indices=empty, seq_lens=empty, v2p=v2p,
                                             indptr=tier.t([0]), multiplier=1, page_size=1, max_tokens=3,
                                             out=flat) is flat
    assert (flat == CANARY32).all()
    got = tier.k.translate_tokens(loc=empty, v2p=v2p, page_size=1)
    assert got.shape == (0,) and got.dtype == torch.int64


def test_read_table_graph_replay(triton_tier, rng):
    """Captured once at the largest size (a CUDA graph on a GPU, eager calls in the interpreter twin),
    then replayed with shorter live lengths and a changed v2p: each replay refreshes the live prefix only."""
    bs, ps, max_pages, mult = 6, 2, 40, 2
    v2p, r2t, req_idx, _ = _scenario(rng, bs=bs, ps=ps, max_pages=max_pages)
    static = dict(req_to_token=triton_tier.t(r2t), req_pool_indices=triton_tier.t(req_idx),
                  seq_lens=triton_tier.t([max_pages * ps] * bs), v2p=triton_tier.t(v2p), multiplier=mult,
                  page_size=ps, max_pages=max_pages,
                  out=torch.full((bs, max_pages), CANARY32, dtype=torch.int32, device=triton_tier.device))

    def build():
        triton_tier.k.build_kv_read_table(**static)

    build()  # compiles (on a GPU) outside the capture
    replay = build
    if triton_tier.device.type == "cuda":
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            build()
        replay = graph.replay
    expect = [[CANARY32] * max_pages for _ in range(bs)]
    spec.read_table(req_to_token=r2t, req_pool_indices=req_idx, seq_lens=[max_pages * ps] * bs, v2p=v2p,
                    multiplier=mult, page_size=ps, max_pages=max_pages, out=expect)
    for seq_lens in ([1] * bs, [rng.randint(0, 3 * ps) for _ in range(bs)], [0] * bs, [max_pages * ps] * bs):
        v2p = [0] + [rng.randrange(1, 1000) for _ in range(len(v2p) - 2)] + [-1]
        static["seq_lens"].copy_(triton_tier.t(seq_lens))
        static["v2p"].copy_(triton_tier.t(v2p))
        replay()
        if triton_tier.device.type == "cuda":
            torch.cuda.synchronize()
        spec.read_table(req_to_token=r2t, req_pool_indices=req_idx, seq_lens=seq_lens, v2p=v2p, multiplier=mult,
                        page_size=ps, max_pages=max_pages, out=expect)
        assert static["out"].cpu().tolist() == expect, f"after replay with seq_lens={seq_lens}"
