"""Hostile input: the kernels must stay inside their buffers, whatever the input.

Every table lives inside a buffer with guard rows before and after it, filled with a
canary; ``req_to_token`` sits inside a buffer of poison tokens and ``v2p``'s guards hold
a poison page, so a stray *read* shows up in the output as well as a stray write in
the guards. The expected tables come from ``_model``: the hostile-input rules written in
kvkernels.triton_kernels' docstring, as plain Python with explicit range checks.
"""

from __future__ import annotations

import pytest
import torch

CANARY32 = 0x5A5A5A5A
POISON_PHYS = 4321  # what a read of a v2p guard row returns
BIG = 2**40
PAD = 8  # poisoned rows/columns around 2-D buffers


class _model:
    """The kernels' rules for out-of-contract input, index by index."""

    @staticmethod
    def bind(v2p, p2v, vs, ps):
        for v, p in zip(vs, ps, strict=True):
            if 0 <= v < len(v2p):
                v2p[v] = p
            if 0 <= p < len(p2v):
                p2v[p] = v

    @staticmethod
    def free_unbind(v2p, p2v, vs):
        out = []
        for v in vs:
            p = v2p[v] if 0 <= v < len(v2p) else -1
            out.append(p)
            if 0 <= v < len(v2p):
                v2p[v] = -1
            if 0 <= v < len(v2p) and 0 <= p < len(p2v):
                p2v[p] = -1
        return out

    @staticmethod
    def entry(v2p, tok, ps, mult):
        page = 0 if tok < 0 else tok // ps
        return max(v2p[page] * mult, 0) if page < len(v2p) else 0

    @staticmethod
    def read_table(out, r2t, req_idx, seq_lens, v2p, mult, ps, max_pages):
        width = len(r2t[0])
        for b, (r, s) in enumerate(zip(req_idx, seq_lens, strict=True)):
            if not 0 <= r < len(r2t):
                continue
            for c in range(min(-(-s // ps), max_pages)):
                if c * ps < width:
                    out[b][c] = _model.entry(v2p, r2t[r][c * ps], ps, mult)

    @staticmethod
    def packed(out, r2t, req_idx, seq_lens, v2p, indptr, mult, ps, max_tokens, starts):
        width = len(r2t[0])
        for b, (r, s) in enumerate(zip(req_idx, seq_lens, strict=True)):
            if not 0 <= r < len(r2t):
                continue
            lo, hi = indptr[b], min(indptr[b + 1], len(out))
            start = 0 if starts is None else starts[b]
            for col in range(min(s, max_tokens)):
                pos, dst = start + col, indptr[b] + col
                if pos < 0 or (pos // ps) * ps >= width or not lo <= dst < hi or dst < 0:
                    continue
                out[dst] = _model.entry(v2p, r2t[r][(pos // ps) * ps], ps, mult) * ps + pos % ps


def _tables(tier, v2p, p2v):
    return tier.guarded(v2p), tier.guarded(p2v)


def _check(g_v2p, g_p2v, v2p, p2v):
    assert g_v2p.guards_intact(), "a write landed in a v2p guard row"
    assert g_p2v.guards_intact(), "a write landed in a p2v guard row"
    assert g_v2p.view.cpu().tolist() == v2p
    assert g_p2v.view.cpu().tolist() == p2v


def test_free_unbind_double_free_and_bad_ids(tier, monkeypatch, pages):
    tier.shrink_blocks(monkeypatch, ids=4)
    rows = 12
    v2p, p2v = pages.initial(rows)
    _model.bind(v2p, p2v, [2, 3, 4, 5], [7, 8, 9, 3])
    v2p[6] = rows + 2  # corrupt rows: a physical page past p2v, and one that torch would wrap to p2v[3]
    v2p[7] = 3 - rows
    p2v[rows - 1] = 77  # a corrupt sentinel, so a wrapped write at p2v[-1] would show
    g_v2p, g_p2v = _tables(tier, v2p, p2v)
    # 2: live; 9: never bound (double free, v2p == -1); then ids outside the table; 6/7: corrupt rows.
    vs = [2, 9, -1, rows, rows + 5, -7, BIG, -BIG, 6, 7]
    want = _model.free_unbind(v2p, p2v, vs)
    assert want[:2] == [7, -1]
    got = tier.k.free_unbind_inplace(tier.t(vs), g_v2p.view, g_p2v.view)
    assert got.cpu().tolist() == want
    _check(g_v2p, g_p2v, v2p, p2v)
    # Free the same page twice in a row: the second call reads -1 and must not touch p2v[-1].
    for _ in range(2):
        want = _model.free_unbind(v2p, p2v, [3])
        assert tier.k.free_unbind_inplace(tier.t([3]), g_v2p.view, g_p2v.view).cpu().tolist() == want
        _check(g_v2p, g_p2v, v2p, p2v)
    assert want == [-1]


def test_bind_and_alloc_bind_bad_ids(tier, monkeypatch, pages):
    tier.shrink_blocks(monkeypatch, ids=4)
    rows = 10
    v2p, p2v = pages.initial(rows)
    g_v2p, g_p2v = _tables(tier, v2p, p2v)
    vs, ps = [-1, 2, rows, 4, BIG, -BIG], [5, -1, 6, rows + 1, 1, 3]
    _model.bind(v2p, p2v, vs, ps)
    tier.k.bind_inplace(tier.t(vs), tier.t(ps), g_v2p.view, g_p2v.view)
    _check(g_v2p, g_p2v, v2p, p2v)
    for start in (rows - 2, -3, BIG):  # runs that leave the table at the top, at the bottom, far away
        vs = [1, 3, 5, 7, 8]
        want = list(range(start, start + len(vs)))
        _model.bind(v2p, p2v, vs, want)
        got = tier.k.alloc_bind_inplace(tier.t(vs), g_v2p.view, g_p2v.view, start)
        assert got.cpu().tolist() == want
        _check(g_v2p, g_p2v, v2p, p2v)


def _read_table_setup(tier, rng, *, req_rows, width, rows, ps, dtype=torch.int64):
    """req_to_token inside a buffer of poison tokens; v2p inside guards holding POISON_PHYS."""
    poison_tok = (rows - 2) * ps  # page rows - 2 holds a value no other page has
    # Page rows - 2 holds POISON_PHYS, and the sentinel is corrupt (POISON_PHYS + 2), so that a token
    # read from outside req_to_token, or a -1 page that wraps to the last row, shows in the output.
    v2p = [0] + [rng.randrange(1, 100) if rng.random() > 0.3 else -1 for _ in range(rows - 3)]
    v2p += [POISON_PHYS, POISON_PHYS + 2]
    r2t = [[rng.randrange(-1, (rows - 2) * ps) for _ in range(width)] for _ in range(req_rows)]
    for r in range(req_rows):  # -1 tokens on live pages of every row: page 0, never v2p[-1]
        r2t[r][ps * (r % 2)] = -1
    big = torch.full((req_rows + 2 * PAD, width + PAD), poison_tok, dtype=dtype, device=tier.device)
    r2t_view = big[PAD : PAD + req_rows, :width]
    r2t_view.copy_(torch.tensor(r2t))
    g_v2p = tier.guarded(v2p, canary=POISON_PHYS + 1)
    return v2p, r2t, r2t_view, g_v2p, big


def _assert_no_poison(values, mult, ps=1):
    flat = [x for row in values for x in row] if values and isinstance(values[0], list) else values
    poison = {k * mult for k in (POISON_PHYS, POISON_PHYS + 1, POISON_PHYS + 2)}
    assert all(x // ps not in poison for x in flat), "read outside a table (or a wrapped index)"


@pytest.mark.parametrize("r2t_dtype", [torch.int64, torch.int32], ids=["r2t64", "r2t32"])
def test_read_tables_hostile_batch(tier, monkeypatch, rng, r2t_dtype):
    """seq_lens past max_pages, negative seq_lens, req rows out of range, a too-narrow req_to_token
    (int64 or int32, SPEC §2)."""
    tier.shrink_blocks(monkeypatch, cols=4, target=8)
    ps, mult, rows, max_pages = 2, 3, 20, 9
    req_rows, width = 3, 11  # narrower than (max_pages - 1) * ps + 1 = 17: columns 12, 14, 16 are outside
    v2p, r2t, r2t_view, g_v2p, r2t_buf = _read_table_setup(tier, rng, req_rows=req_rows, width=width, rows=rows, ps=ps,
                                                           dtype=r2t_dtype)
    r2t_before = r2t_buf.clone()
    req_idx = [0, 1, -1, req_rows, 2, BIG, 1, 0]
    seq_lens = [5, 500, 7, 7, -3, 4, -(10**6), max_pages * ps]
    bs = len(req_idx)
    for legacy in (False, True):
        fn = tier.k.build_kv_read_table_legacy if legacy else tier.k.build_kv_read_table
        buf = torch.full((bs + 2 * PAD, max_pages + PAD), CANARY32, dtype=torch.int32, device=tier.device)
        out = buf[PAD : PAD + bs, :max_pages]
        expect = buf.cpu().tolist()
        inner = [row[:max_pages] for row in expect[PAD : PAD + bs]]
        _model.read_table(inner, r2t, req_idx, seq_lens, v2p, mult, ps, max_pages)
        for b in range(bs):
            expect[PAD + b][:max_pages] = inner[b]
        fn(req_to_token=r2t_view, req_pool_indices=tier.t(req_idx), seq_lens=tier.t(seq_lens), v2p=g_v2p.view,
           multiplier=mult, page_size=ps, max_pages=max_pages, out=out)
        got = buf.cpu().tolist()
        assert got == expect, f"legacy={legacy}"
        _assert_no_poison(got, mult)
        # Rows with a bad req index or a negative seq_len wrote nothing; row 1 (500 tokens) stopped at max_pages.
        assert all(x == CANARY32 for b in (2, 3, 4, 5, 6) for x in got[PAD + b])
        assert all(x != CANARY32 for x in got[PAD + 1][: width // ps + 1])
    assert g_v2p.guards_intact() and torch.equal(r2t_buf, r2t_before)


def test_read_table_clamps_to_max_pages(tier, monkeypatch, rng):
    """seq_lens past max_pages with a req_to_token wide enough to read on: no column >= max_pages is written."""
    tier.shrink_blocks(monkeypatch, cols=4, target=8)
    ps, mult, rows, max_pages = 2, 1, 20, 9  # 9 is not a multiple of BLOCK_COLS: the last block sticks out
    req_rows, width = 2, (max_pages + PAD) * ps
    v2p, r2t, r2t_view, g_v2p, _ = _read_table_setup(tier, rng, req_rows=req_rows, width=width, rows=rows, ps=ps)
    req_idx, seq_lens = [0, 1, 1], [(max_pages + 6) * ps, max_pages * ps + 1, 400]
    bs = len(req_idx)
    for legacy in (False, True):
        fn = tier.k.build_kv_read_table_legacy if legacy else tier.k.build_kv_read_table
        buf = torch.full((bs + PAD, max_pages + PAD), CANARY32, dtype=torch.int32, device=tier.device)
        fn(req_to_token=r2t_view, req_pool_indices=tier.t(req_idx), seq_lens=tier.t(seq_lens), v2p=g_v2p.view,
           multiplier=mult, page_size=ps, max_pages=max_pages, out=buf[:bs, :max_pages])
        got = buf.cpu().tolist()
        expect = [[_model.entry(v2p, r2t[r][c * ps], ps, mult) for c in range(max_pages)] for r in req_idx]
        assert [row[:max_pages] for row in got[:bs]] == expect, f"legacy={legacy}"
        assert all(x == CANARY32 for row in got for x in row[max_pages:]), f"legacy={legacy}: a column >= max_pages"
        assert all(x == CANARY32 for row in got[bs:] for x in row), f"legacy={legacy}: a row >= bs"


def test_read_table_packed_hostile(tier, monkeypatch, rng):
    """indptr past out or negative, overlong rows, negative and far kv_start, bad req rows."""
    tier.shrink_blocks(monkeypatch, cols=4, target=8)
    ps, mult, rows, max_tokens = 2, 2, 16, 12
    req_rows, width = 3, 10
    v2p, r2t, r2t_view, g_v2p, _ = _read_table_setup(tier, rng, req_rows=req_rows, width=width, rows=rows, ps=ps)
    size = 24
    req_idx = [0, 1, 2, -1, 1, 0, 2]
    seq_lens = [5, 50, 5, 4, 7, -5, 4]
    # Row 0 starts before out, row 1 is longer than max_tokens and its span, row 4 runs past out,
    # row 6 lies wholly past it.
    indptr = [-2, 3, 9, 14, 18, 30, 30, 40]
    starts = [0, -3, 4, 0, 8, 0, 0]  # row 1 starts at a negative position; row 4 runs past the width
    for kv_start in (None, starts):
        g_out = tier.guarded([CANARY32] * size, dtype=torch.int32, canary=CANARY32)
        expect = [CANARY32] * size
        _model.packed(expect, r2t, req_idx, seq_lens, v2p, indptr, mult, ps, max_tokens, kv_start)
        tier.k.build_kv_read_table_packed(
            req_to_token=r2t_view, req_pool_indices=tier.t(req_idx), seq_lens=tier.t(seq_lens), v2p=g_v2p.view,
            indptr=tier.t(indptr), multiplier=mult, page_size=ps, max_tokens=max_tokens, out=g_out.view,
            kv_start_idx=None if kv_start is None else tier.t(kv_start))
        assert g_out.guards_intact(), "a write landed outside out"
        got = g_out.view.cpu().tolist()
        assert got == expect
        _assert_no_poison(got, mult, ps)
        assert sum(x != CANARY32 for x in got) >= 10
    assert g_v2p.guards_intact()


def test_translate_hostile(tier, monkeypatch, rng):
    tier.shrink_blocks(monkeypatch, ids=4)
    ps, rows = 4, 9
    # v2p[0] = 2 (a corrupt sink) tells "t < 0 gives 0" apart from "t < 0 reads page 0".
    v2p = [2, 3, -1, 7, 2, 5, -1, 1, -1]
    g_v2p = tier.guarded(v2p, canary=POISON_PHYS)
    loc = [-1, -ps, -BIG, rows * ps, rows * ps + 1, BIG, (rows - 1) * ps + 3, 4, 13, 0, 3]
    got = tier.k.translate_tokens(loc=tier.t(loc), v2p=g_v2p.view, page_size=ps).cpu().tolist()
    assert got == [0, 0, 0, 0, 0, 0, 0, 12, 28 + 1, 8, 11]
    assert g_v2p.guards_intact()
