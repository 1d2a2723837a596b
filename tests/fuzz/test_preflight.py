"""The production track's closed-form precondition checks against kvref's, and its fast draws
against the row-by-row ones.

``production.preflight`` decides a read-table call from bounds (``table_ok``, ``packed_ok``)
and asks ``kvref.preconditions`` only when they fail: a second statement of SPEC §2's
clauses, so it is held to kvref's here. Hypothesis draws calls (and production op
descriptors) that meet every clause, or break one by one (an index one past, a seq_len
one over ``max_pages * ps``, indptr off by one, ``max_tokens`` one short, ...), and
asserts that the fast check raises exactly when kvref's does, with the same clause and
message; that the closed form never passes a call kvref refuses; and that it decides every
op the production generator emits without kvref (else it would not be the fast path).

``_seq_lens``, ``packed_layout`` and the req tensors are drawn with torch for large
batches now: case files replay ops from their descriptors, so the values must be the
ones the Python loops gave. The loops are kept below, verbatim, as the reference.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvref
from fuzz.engine.production import preflight
from fuzz.engine.production.arith import VECTOR_ROWS, ModIds, hash_int
from fuzz.engine.production.draws import _req_idx, _req_tensor, _seq_lens, packed_layout
from fuzz.engine.production.generator import READ_HEAVY_MIX, generator
from fuzz.engine.production.graph import GReadTable
from fuzz.engine.production.hostile import HostileOp
from fuzz.engine.production.ops import PReadTable, PReadTablePacked, PRows
from kvref import preconditions as pre


def _settings(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


@pytest.fixture(autouse=True)
def _no_sample(monkeypatch):
    """kvref only where the closed form fails (the sample would hide a closed form that lets a bad call by)."""
    monkeypatch.setattr(preflight, "FULL_EVERY", 1 << 60)


# ---- the draws, byte for byte --------------------------------------------------------------


def _seq_lens_loop(seed, bs, cap, long_len, n_long):
    out = []
    for i in range(bs):
        if (i + seed) % bs < n_long:
            out.append(long_len)
        else:
            h = hash_int(i, seed)
            out.append(0 if h % 8 == 0 else h % (cap + 1))
    return out


def _packed_layout_loop(seed, bs, max_tokens, long_len, n_long, gap, has_start, width):
    seq = _seq_lens_loop(seed, bs, max_tokens, long_len, n_long)
    indptr = [0]
    for b, n in enumerate(seq):
        indptr.append(indptr[-1] + n + (hash_int(b, seed + 3) % (gap + 1) if gap else 0))
    starts = [hash_int(b, seed + 4) % (width - n + 1) for b, n in enumerate(seq)] if has_start else None
    return seq, indptr, starts


def _outcome(fn, args):
    try:
        return fn(*args)
    except ArithmeticError as exc:
        return type(exc)


_BS = st.one_of(st.integers(1, 2 * VECTOR_ROWS), st.sampled_from([VECTOR_ROWS - 1, VECTOR_ROWS, 512, 4096]))


@_settings(400)
@given(seed=st.one_of(st.integers(0, 1 << 30), st.integers(-(1 << 40), 1 << 62)), bs=_BS,
       cap=st.integers(0, 1 << 20), long_len=st.integers(0, 1 << 21), n_long=st.integers(-2, 600))
def test_seq_lens_are_the_loops_values(seed, bs, cap, long_len, n_long):
    assert _seq_lens(seed, bs, cap, long_len, n_long) == _seq_lens_loop(seed, bs, cap, long_len, n_long)


@_settings(300)
@given(seed=st.integers(0, 1 << 30), bs=_BS, cap=st.integers(1, 1 << 18), n_long=st.integers(0, 600),
       gap=st.sampled_from([0, 0, 3]), has_start=st.booleans(), extra=st.integers(-3, 1 << 12), data=st.data())
def test_packed_layouts_are_the_loops_values(seed, bs, cap, n_long, gap, has_start, extra, data):
    long_len = data.draw(st.integers(0, cap))
    width = max(1, cap + extra)  # below cap too: rows longer than the width take the loop's path
    args = (seed, bs, cap, long_len, n_long, gap, has_start, width)
    assert _outcome(packed_layout, args) == _outcome(_packed_layout_loop, args)  # a row past the width: both raise


@_settings(200)
@given(a=st.integers(0, 1 << 21), b=st.integers(0, 1 << 20), rows=st.integers(1, 1 << 20), bs=_BS)
def test_req_tensors_and_mod_ids_are_the_lists_values(a, b, rows, bs):
    want = _req_idx((a, b, rows), bs)
    assert _req_tensor((a, b, rows), bs, "cpu").tolist() == want
    ids = ModIds((a, b, rows), bs)
    assert list(ids) == want and [ids[i] for i in range(bs)] == want and ids[-1] == want[-1]
    lo, hi = ids.bounds()
    assert lo <= min(want) and max(want) <= hi


def _graph_inputs_loop(op, step, ps):
    """``GReadTable.step_inputs`` as it was before its draws were vectorized."""
    maxlen = op.max_pages if op.packed else op.max_pages * ps
    if step < 0:
        seq = [hash_int(b, op.seed + 5) % (op.cap_len + 1) for b in range(op.bs)]
    elif step == op.steps - 1:
        seq = [maxlen] * op.bs
    else:
        s, seq = hash_int(step, op.seed), []
        for b in range(op.bs):
            h = hash_int(b, s)
            pick = h % 4
            seq.append(op.long_len if pick == 0 else h % (maxlen + 1) if pick == 1 else
                       maxlen * (step + 1) // max(1, op.steps) if pick == 2 else 0 if h % 8 < 3 else maxlen)
    if step < 0:
        req = [b % op.rows for b in range(op.bs)]
    else:
        s = hash_int(step, op.seed + 1)
        req = [(hash_int(1, s) % (op.rows + 1) * b + s) % op.rows for b in range(op.bs)]
    vals = {"req": req, "seq": seq}
    if op.packed:
        indptr = [0]
        for n in seq:
            indptr.append(indptr[-1] + n)
        s = hash_int(step + 1, op.seed + 2)
        vals["indptr"] = indptr
        vals["start"] = [0 if h % 3 == 0 else h % (op.width - n + 1)
                         for n, h in ((n, hash_int(b, s)) for b, n in enumerate(seq))]
    return vals


@_settings(150)
@given(seed=st.integers(0, 1 << 30), bs=_BS, max_pages=st.integers(1, 300), rows=st.integers(1, 5000),
       steps=st.integers(0, 5), packed=st.booleans(), ps=st.sampled_from([1, 16]), data=st.data())
def test_graph_step_inputs_are_the_loops_values(seed, bs, max_pages, rows, steps, packed, ps, data):
    maxlen = max_pages if packed else max_pages * ps
    op = GReadTable(seed=seed, bs=bs, max_pages=max_pages, rows=rows, width=maxlen + data.draw(st.integers(0, 9)),
                    src=(1, 8, 1, 0, 0, 8, 1, 0), cap_len=data.draw(st.integers(0, maxlen)),
                    long_len=data.draw(st.integers(0, maxlen)), steps=steps, tombs=0, packed=packed)
    for step in range(-1, steps):
        assert op.step_inputs(step, ps) == _graph_inputs_loop(op, step, ps), step


# ---- the checks, verdict for verdict -------------------------------------------------------


class _Ctx:
    def __init__(self, config):
        self.config = config


def _verdict(fn) -> tuple[str, str] | None:
    try:
        fn()
    except kvref.ContractViolation as exc:
        return exc.clause, str(exc)
    return None


def _kvref_table(cfg, *, r2t_rows, width, req_idx, seq_lens, max_pages, out_rows, out_cols):
    bs = pre.check_batch("read_table", r2t_rows=r2t_rows, req_pool_indices=list(req_idx), seq_lens=seq_lens)
    pre.check_read_table(bs=bs, seq_lens=seq_lens, max_pages=max_pages, page_size=cfg.page_size, width=width,
                         out_rows=out_rows, out_cols=out_cols)
    pre.check_entry_bound("read_table", max_v2p=cfg.table_rows - 1, multiplier=cfg.multiplier, page_size=cfg.page_size)


def _kvref_packed(cfg, *, r2t_rows, width, req_idx, seq_lens, indptr, kv_start, max_tokens, out_len):
    bs = pre.check_batch("read_table_packed", r2t_rows=r2t_rows, req_pool_indices=list(req_idx), seq_lens=seq_lens)
    pre.check_read_table_packed(bs=bs, seq_lens=seq_lens, indptr=indptr, max_tokens=max_tokens, out_len=out_len,
                                page_size=cfg.page_size, width=width, kv_start_idx=kv_start)
    pre.check_entry_bound("read_table_packed", max_v2p=cfg.table_rows - 1, multiplier=cfg.multiplier,
                          page_size=cfg.page_size)


TABLE_BREAKS = ("none", "req_one_past", "req_negative", "seq_one_over", "seq_negative", "width_one_short",
                "out_rows_one_short", "out_cols_one_short", "max_pages_negative", "seq_one_short_list", "multiplier")
PACKED_BREAKS = ("none", "req_one_past", "seq_negative", "indptr_off_by_one", "indptr0_negative",
                 "max_tokens_one_short", "out_one_short", "start_negative", "start_one_past_width", "indptr_length",
                 "start_length", "zero_row_far_start", "multiplier")


@st.composite
def _config(draw):
    ps = draw(st.sampled_from([1, 2, 16, 64]))
    return kvref.PoolConfig(num_pages=draw(st.integers(2, 1 << 12)), page_size=ps, multiplier=draw(st.sampled_from([1, 8])))


@st.composite
def table_calls(draw):
    """(config, the call's fields, the break applied): a valid read_table call, then at most one clause broken by one."""
    cfg = draw(_config())
    ps = cfg.page_size
    bs = draw(st.integers(0, 40))
    max_pages = draw(st.integers(0, 30))
    width = (max(max_pages, 1) - 1) * ps + 1 + draw(st.integers(0, 3 * ps))
    r2t_rows = draw(st.integers(1, 60))
    req = draw(st.lists(st.integers(0, r2t_rows - 1), min_size=bs, max_size=bs))
    seq = draw(st.lists(st.integers(0, max_pages * ps), min_size=bs, max_size=bs))
    call = dict(r2t_rows=r2t_rows, width=width, req_idx=req, seq_lens=seq, max_pages=max_pages,
                out_rows=bs + draw(st.integers(0, 2)), out_cols=max_pages + draw(st.integers(0, 2)))
    brk = draw(st.sampled_from(TABLE_BREAKS))
    b = draw(st.integers(0, max(0, bs - 1)))
    if brk in ("req_one_past", "req_negative", "seq_one_over", "seq_negative", "seq_one_short_list") and not bs:
        brk = "none"
    if brk == "req_one_past":
        req[b] = r2t_rows
    elif brk == "req_negative":
        req[b] = -1
    elif brk == "seq_one_over":
        seq[b] = max_pages * ps + 1
    elif brk == "seq_negative":
        seq[b] = -1
    elif brk == "width_one_short":
        call["width"] = (max_pages - 1) * ps
    elif brk == "out_rows_one_short":
        call["out_rows"] = bs - 1
    elif brk == "out_cols_one_short":
        call["out_cols"] = max_pages - 1
    elif brk == "max_pages_negative":
        call["max_pages"] = -1
    elif brk == "seq_one_short_list":
        seq.pop()
    elif brk == "multiplier":  # v2p's largest entry times the multiplier one past int32
        cfg = kvref.PoolConfig(num_pages=cfg.num_pages, page_size=ps, multiplier=pre.INT32_LIMIT // (cfg.table_rows - 1) + 1)
    return cfg, call, brk


@st.composite
def packed_calls(draw):
    cfg = draw(_config())
    ps = cfg.page_size
    bs = draw(st.integers(0, 40))
    width = draw(st.integers(1, 8 * ps + 5))
    r2t_rows = draw(st.integers(1, 60))
    req = draw(st.lists(st.integers(0, r2t_rows - 1), min_size=bs, max_size=bs))
    seq = draw(st.lists(st.integers(0, width), min_size=bs, max_size=bs))
    starts = None
    if draw(st.booleans()):
        starts = [draw(st.integers(0, width - n)) for n in seq]
    indptr = [draw(st.integers(0, 5))]
    for n in seq:
        indptr.append(indptr[-1] + n)
    max_tokens = indptr[-1] + draw(st.integers(0, 3))
    call = dict(r2t_rows=r2t_rows, width=width, req_idx=req, seq_lens=seq, indptr=indptr, kv_start=starts,
                max_tokens=max_tokens, out_len=max_tokens + draw(st.integers(0, 2)))
    brk = draw(st.sampled_from(PACKED_BREAKS))
    b = draw(st.integers(0, max(0, bs - 1)))
    if not bs and brk not in ("none", "indptr0_negative", "max_tokens_one_short", "out_one_short", "indptr_length",
                              "multiplier"):
        brk = "none"
    if starts is None and brk in ("start_negative", "start_one_past_width", "start_length", "zero_row_far_start"):
        brk = "none"
    if brk == "req_one_past":
        req[b] = r2t_rows
    elif brk == "seq_negative":  # indptr follows it: only the sign is wrong
        seq[b] = -1
        indptr[b + 1:] = list(_running(indptr[b], seq[b:]))
    elif brk == "indptr_off_by_one":
        indptr[b + 1] += 1
    elif brk == "indptr0_negative":
        indptr[:] = [x - indptr[0] - 1 for x in indptr]
    elif brk == "max_tokens_one_short":
        call["max_tokens"] = indptr[-1] - 1
        call["out_len"] = call["max_tokens"]
    elif brk == "out_one_short":
        call["out_len"] = call["max_tokens"] - 1
    elif brk == "start_negative":
        starts[b] = -1
    elif brk == "start_one_past_width":  # the row's last column reaches the width
        n = max(1, seq[b])
        seq[b] = n
        indptr[b + 1:] = list(_running(indptr[b], seq[b:]))
        call["max_tokens"] = max(call["max_tokens"], indptr[-1])
        call["out_len"] = max(call["out_len"], call["max_tokens"])
        starts[b] = -(-width // ps) * ps - n + 1
    elif brk == "indptr_length":
        indptr.pop()
    elif brk == "start_length":
        starts.pop()
    elif brk == "zero_row_far_start":  # valid (kvref reads no column of an empty row); the closed form may ask kvref
        seq[b] = 0
        indptr[b + 1:] = list(_running(indptr[b], seq[b:]))
        starts[b] = width + 7
    elif brk == "multiplier":
        cfg = kvref.PoolConfig(num_pages=cfg.num_pages, page_size=ps, multiplier=pre.INT32_LIMIT // (cfg.table_rows - 1) + 1)
    return cfg, call, brk


def _running(start, lens):
    for n in lens:
        start += n
        yield start


@_settings(800)
@given(case=table_calls())
def test_read_table_check_refuses_exactly_what_kvref_refuses(case):
    cfg, call, brk = case
    want = _verdict(lambda: _kvref_table(cfg, **call))
    assert _verdict(lambda: preflight.check_table_call(_Ctx(cfg), **call)) == want, brk
    fast = preflight.table_ok(page_size=cfg.page_size, **call)
    assert fast == (want is None or want[0] == "read_table.entry_fits_int32"), (brk, want)  # exact on lists
    assert (want is None) == (brk == "none"), (brk, want)  # every break is one kvref refuses


@_settings(800)
@given(case=packed_calls())
def test_packed_check_refuses_exactly_what_kvref_refuses(case):
    cfg, call, brk = case
    want = _verdict(lambda: _kvref_packed(cfg, **call))
    assert _verdict(lambda: preflight.check_packed_call(_Ctx(cfg), **call)) == want, brk
    fast = preflight.packed_ok(page_size=cfg.page_size, **call)
    layout_ok = want is None or want[0] == "read_table_packed.entry_fits_int32"
    assert not fast or layout_ok, (brk, want)  # never passes a call kvref refuses
    if brk != "zero_row_far_start":
        assert fast == layout_ok, (brk, want)  # exact but for an empty row's far start (a bound there)
    assert (want is None) == (brk in ("none", "zero_row_far_start")), (brk, want)


@st.composite
def table_ops(draw):
    """A p_read_table descriptor and the rows it reads, valid or one past in one field."""
    cfg = draw(_config())
    ps = cfg.page_size
    bs, mp = draw(st.integers(1, 600)), draw(st.integers(1, 40))
    rows = draw(st.integers(1, 50))
    width = (mp - 1) * ps + 1 + draw(st.integers(0, ps))
    req = (draw(st.integers(0, rows)), draw(st.integers(0, rows)), rows)
    long_len = draw(st.integers(0, mp * ps))
    brk = draw(st.sampled_from(("none", "req_rows_one_past", "long_len_one_over", "width_one_short")))
    if brk == "req_rows_one_past":
        req = (req[0], req[1], rows + 1)  # R rows named, one more than req_to_token has
    elif brk == "long_len_one_over":
        long_len = mp * ps + 1
    elif brk == "width_one_short":
        width = (mp - 1) * ps
    op = PReadTable(seed=draw(st.integers(0, 1 << 30)), bs=bs, max_pages=mp, req=req, long_len=long_len,
                    n_long=draw(st.integers(0, bs)), legacy=False)
    return cfg, (rows, max(width, 1)), op, brk


@_settings(300)
@given(case=table_ops())
def test_read_table_op_descriptors_are_judged_as_kvref_judges_their_lists(case):
    cfg, shape, op, brk = case
    ctx = _Ctx(cfg)
    ctx.rows_shape = shape
    want = _verdict(lambda: _kvref_table(cfg, r2t_rows=shape[0], width=shape[1], req_idx=_req_idx(op.req, op.bs),
                                         seq_lens=op.seq_lens(cfg.page_size), max_pages=op.max_pages,
                                         out_rows=op.bs, out_cols=op.max_pages))
    assert _verdict(lambda: op.preflight(ctx)) == want, brk


# ---- the fast path is the path, and kvref stays reachable -------------------------------------


def _info():
    import kvkernels
    from fuzz.engine.boundary import kernel_constants

    return {"constants": kernel_constants(kvkernels).to_json(), "gpu": True,
            "features": ["build_kv_read_table_legacy", "build_kv_read_table_packed", "translate_tokens"]}


@pytest.mark.parametrize("mix", [READ_HEAVY_MIX, None], ids=["read-heavy", "default"])
def test_the_closed_form_decides_every_generated_read_table(monkeypatch, mix):
    asked = []
    for name in ("check_batch",):
        real = getattr(pre, name)
        monkeypatch.setattr(pre, name, lambda *a, _real=real, **k: asked.append(k) or _real(*a, **k))
    info, checked = _info(), 0
    for seed in range(12):
        config, gen = generator(seed, info, mix=mix, big=0.6)
        ctx = _Ctx(config)
        ctx.rows_shape = None
        for _ in range(16):
            op = gen.next_op()
            if isinstance(op, PRows):
                ctx.rows_shape = (op.rows, op.width)
            if not isinstance(op, HostileOp):
                op.preflight(ctx)
                checked += op.kind.endswith(("read_table", "read_table_packed", "read_table_far"))
    assert checked > 50 and not asked, f"{len(asked)} of {checked} read-table checks fell back to kvref's loops"


def test_kvref_still_checks_a_sample_and_catches_a_closed_form_that_drifted(monkeypatch):
    cfg = kvref.PoolConfig(num_pages=64, page_size=1, multiplier=1)
    bad = dict(r2t_rows=4, width=8, req_idx=[0, 4], seq_lens=[1, 1], max_pages=4, out_rows=2, out_cols=4)  # row 4 of 4
    monkeypatch.setattr(preflight, "table_ok", lambda **k: True)  # a closed form that lets the bad row by
    preflight.check_table_call(_Ctx(cfg), **bad)  # unsampled: nothing sees it
    monkeypatch.setenv("KVFUZZ_PREFLIGHT", "full")  # read at the call (a daemon imported the module long before)
    for _ in range(2):
        with pytest.raises(kvref.ContractViolation) as exc:
            preflight.check_table_call(_Ctx(cfg), **bad)
        assert exc.value.clause == "read_table.req_idx_in_range"
    monkeypatch.delenv("KVFUZZ_PREFLIGHT")
    monkeypatch.setattr(preflight, "FULL_EVERY", 3)
    seen = []
    monkeypatch.setattr(pre, "check_read_table", lambda **k: seen.append(1))
    good = dict(bad, req_idx=[0, 3])
    for _ in range(9):
        preflight.check_table_call(_Ctx(cfg), **good)
    assert len(seen) == 3  # one call in FULL_EVERY


def test_a_large_packed_layout_ends_at_its_lengths_sum_and_keeps_rows_inside_the_width():
    op = PReadTablePacked(seed=3, bs=VECTOR_ROWS, max_tokens=100, req=(1, 0, 4), long_len=10, n_long=2, gap=0,
                          has_start=True, row_cap=10)
    seq, indptr, starts = op.layout(16)
    assert indptr[-1] == op.end() == sum(seq) == op.elements() > 0
    assert all(0 <= s <= 16 - n for s, n in zip(starts, seq)) and len(set(starts)) > 1
