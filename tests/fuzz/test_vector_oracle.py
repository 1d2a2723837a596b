"""The vectorized oracle (fuzz/engine/vector_oracle.py) against kvref.kernels, on small valid inputs.

Every property test builds a valid input, runs kvref on Python lists and the oracle on
tensors (inside the CPU host-sync detector), and diffs tables, return values and whole
``out`` buffers, poison included, with ``first_mismatch``.
"""

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import kvref
from fuzz.engine import vector_oracle as vo
from fuzz.sync.runtime import no_host_sync, record_host_syncs
from kvref import kernels as ref

POISON = 0x7A7A7A7A
INT32_MAX = 2**31 - 1
SETTINGS = settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

page_sizes = st.sampled_from([1, 2, 3, 4, 8])
multipliers = st.sampled_from([1, 2, 3, 64])
index_dtypes = st.sampled_from([torch.int32, torch.int64])


def _assert_same(expected, actual: torch.Tensor, what: str) -> None:
    expected = torch.tensor(expected, dtype=actual.dtype).reshape(actual.shape)
    assert vo.first_mismatch(expected, actual) is None, f"{what}: (index, kvref, oracle) = {vo.first_mismatch(expected, actual)}"


@st.composite
def v2p_tables(draw, rows: int, largest: int) -> list[int]:
    """``rows`` entries, each a tombstone (-1) or a page id up to ``largest``."""
    entry = st.one_of(st.just(-1), st.integers(0, min(largest, rows)), st.integers(0, largest))
    return draw(st.lists(entry, min_size=rows, max_size=rows))


@st.composite
def token_rows(draw, n_req: int, width: int, rows: int, page_size: int) -> list[list[int]]:
    """req_to_token rows: padding (-1), other negatives, or tokens whose page lies inside v2p."""
    token = st.one_of(st.just(-1), st.integers(-3 * page_size, -1), st.integers(0, rows * page_size - 1))
    return draw(st.lists(st.lists(token, min_size=width, max_size=width), min_size=n_req, max_size=n_req))


# --------------------------------------------------------------------------- read_table


@st.composite
def read_table_cases(draw):
    ps = draw(page_sizes)
    multiplier = draw(multipliers)
    rows = draw(st.integers(2, 24))
    v2p = draw(v2p_tables(rows, INT32_MAX // multiplier))
    max_pages = draw(st.integers(0, 6))
    width = max(1, (max_pages - 1) * ps + 1) + draw(st.integers(0, ps + 2))
    n_req = draw(st.integers(1, 4))
    bs = draw(st.integers(0, 5))
    return dict(
        ps=ps, multiplier=multiplier, v2p=v2p, max_pages=max_pages,
        req_to_token=draw(token_rows(n_req, width, rows, ps)),
        req_idx=draw(st.lists(st.integers(0, n_req - 1), min_size=bs, max_size=bs)),
        seq_lens=draw(st.lists(st.integers(0, max_pages * ps), min_size=bs, max_size=bs)),
        extra_rows=draw(st.integers(0, 2)), extra_cols=draw(st.integers(0, 3)), col_offset=draw(st.integers(0, 2)),
        token_dtype=draw(index_dtypes), idx_dtype=draw(index_dtypes), len_dtype=draw(index_dtypes),
    )


def check_read_table(case) -> None:
    bs, max_pages = len(case["req_idx"]), case["max_pages"]
    n_cols = max_pages + case["extra_cols"]
    off = case["col_offset"]
    buf = torch.full((bs + case["extra_rows"], off + n_cols + 1), POISON, dtype=torch.int32)
    out = buf[:, off : off + n_cols]  # a column slice: a write past it lands in the poison around it

    expected_out = out.tolist()
    ref.read_table(req_to_token=case["req_to_token"], req_pool_indices=case["req_idx"], seq_lens=case["seq_lens"],
                   v2p=case["v2p"], multiplier=case["multiplier"], page_size=case["ps"], max_pages=max_pages,
                   out=expected_out)
    expected = buf.clone()
    expected[:, off : off + n_cols] = torch.tensor(expected_out, dtype=torch.int32).reshape(out.shape)

    v2p = torch.tensor(case["v2p"])
    args = dict(req_to_token=torch.tensor(case["req_to_token"], dtype=case["token_dtype"]),
                req_pool_indices=torch.tensor(case["req_idx"], dtype=case["idx_dtype"]),
                seq_lens=torch.tensor(case["seq_lens"], dtype=case["len_dtype"]))
    with no_host_sync():
        returned = vo.read_table(**args, v2p=v2p, multiplier=case["multiplier"], page_size=case["ps"],
                                 max_pages=max_pages, out=out)
    assert returned is out
    assert vo.first_mismatch(expected, buf) is None, f"(index, kvref, oracle) = {vo.first_mismatch(expected, buf)}"
    _assert_same(case["v2p"], v2p, "v2p")


@SETTINGS
@given(read_table_cases())
def test_read_table_matches_kvref(case):
    check_read_table(case)


@st.composite
def entry_clause_cases(draw):
    """A read_table case, maybe with a token past v2p and / or an entry that does not fit int32."""
    case = draw(read_table_cases())
    rows, ps = len(case["v2p"]), case["ps"]
    if draw(st.booleans()) and case["req_to_token"][0]:  # a token on a page past the table
        row = case["req_to_token"][draw(st.integers(0, len(case["req_to_token"]) - 1))]
        row[draw(st.integers(0, len(row) - 1)) // ps * ps] = rows * ps + draw(st.integers(0, 2 * ps))
    if draw(st.booleans()):  # v2p[page] * multiplier >= 2^31
        case["v2p"][draw(st.integers(0, rows - 1))] = INT32_MAX // case["multiplier"] + 1 + draw(st.integers(0, 3))
    return case


def _entry_clauses_broken(case) -> set[str]:
    """kvref's entry clauses over every live entry: the clauses some entry breaks."""
    ps = case["ps"]
    return _kvref_entry_clauses("read_table", case, ((b, col, r, col * ps, None)
                                                      for b, (r, n) in enumerate(zip(case["req_idx"], case["seq_lens"]))
                                                      for col in range(min(-(-n // ps), case["max_pages"]))))


def _kvref_entry_clauses(fn: str, case, entries) -> set[str]:
    """The clauses kvref's per-entry check finds broken over ``entries``: (row, column, request
    row, token column, packed position or None)."""
    from kvref import preconditions as pre

    v2p, broken = case["v2p"], set()
    for b, col, r, tok_col, pos in entries:
        try:
            pre.check_entry(fn, tok=case["req_to_token"][r][tok_col], v2p_rows=len(v2p), v2p_value=lambda page: v2p[page],
                            multiplier=case["multiplier"], page_size=case["ps"], pos=pos, where=f"[{b}][{col}]")
        except kvref.ContractViolation as exc:
            broken.add(exc.clause)
    return broken


@settings(SETTINGS, max_examples=100)  # each example runs the oracle twice and kvref once
@given(entry_clause_cases())
def test_read_tables_entry_flags_are_kvrefs_and_leave_the_valid_entries_alone(case):
    """The oracle's token_in_table and entry_fits_int32 flags (marks in its lookup, one pass over
    the gathered values) say what kvref's per-entry check says, and the entries it writes are the
    ones it writes without clauses, a page past the table included (it reads 0)."""
    bs, max_pages = len(case["req_idx"]), case["max_pages"]
    args = dict(req_to_token=torch.tensor(case["req_to_token"], dtype=case["token_dtype"]),
                req_pool_indices=torch.tensor(case["req_idx"], dtype=case["idx_dtype"]),
                seq_lens=torch.tensor(case["seq_lens"], dtype=case["len_dtype"]), v2p=torch.tensor(case["v2p"]),
                multiplier=case["multiplier"], page_size=case["ps"], max_pages=max_pages)
    plain, flagged = (torch.full((bs, max_pages + 1), POISON, dtype=torch.int32) for _ in range(2))
    vo.read_table(**args, out=plain[:, :max_pages])
    flags = []
    with no_host_sync():
        vo.read_table(**args, out=flagged[:, :max_pages], clauses=flags)
    named = {name: bool(f) for name, f in flags}
    broken = _entry_clauses_broken(case)
    assert {n for n in ("read_table.token_in_table", "read_table.entry_fits_int32") if named.get(n)} == broken
    if "read_table.entry_fits_int32" not in broken:  # (past int32, an entry has no right value: kvfuzz refuses it)
        assert vo.first_mismatch(plain, flagged) is None  # a page past the table reads 0 either way


# --------------------------------------------------------------------------- read_table_packed


@st.composite
def packed_cases(draw):
    ps = draw(page_sizes)
    multiplier = draw(multipliers)
    rows = draw(st.integers(2, 24))
    # max(v2p * multiplier, 0) * ps + (ps - 1) must fit int32.
    v2p = draw(v2p_tables(rows, (2**31 // ps - 1) // multiplier))
    width = draw(st.integers(1, 14))
    n_req = draw(st.integers(1, 4))
    bs = draw(st.integers(0, 4))
    with_start = draw(st.booleans())
    starts = [draw(st.integers(0, width - 1)) if with_start else 0 for _ in range(bs)]
    lens = [draw(st.integers(0, width - s)) for s in starts]
    indptr = [draw(st.integers(0, 2))]
    for n in lens:
        indptr.append(indptr[-1] + n)  # SPEC §2: indptr_consistent (no gaps)
    max_tokens = indptr[-1] + draw(st.integers(0, 2))  # indptr_within_max_tokens
    return dict(
        ps=ps, multiplier=multiplier, v2p=v2p, req_to_token=draw(token_rows(n_req, width, rows, ps)),
        req_idx=draw(st.lists(st.integers(0, n_req - 1), min_size=bs, max_size=bs)), seq_lens=lens,
        kv_start=starts if with_start else None, indptr=indptr,
        max_tokens=max_tokens,
        out_len=max_tokens + draw(st.integers(0, 3)), out_offset=draw(st.integers(0, 2)),  # out_holds_max_tokens
        token_dtype=draw(index_dtypes), idx_dtype=draw(index_dtypes), indptr_dtype=draw(index_dtypes),
    )


def check_packed(case) -> None:
    off, n = case["out_offset"], case["out_len"]
    buf = torch.full((off + n + 1,), POISON, dtype=torch.int32)
    out = buf[off : off + n]
    expected_out = out.tolist()
    ref.read_table_packed(req_to_token=case["req_to_token"], req_pool_indices=case["req_idx"],
                          seq_lens=case["seq_lens"], v2p=case["v2p"], indptr=case["indptr"],
                          multiplier=case["multiplier"], page_size=case["ps"], max_tokens=case["max_tokens"],
                          out=expected_out, kv_start_idx=case["kv_start"])
    expected = buf.clone()
    expected[off : off + n] = torch.tensor(expected_out, dtype=torch.int32)

    idx_dtype = case["idx_dtype"]
    args = dict(req_to_token=torch.tensor(case["req_to_token"], dtype=case["token_dtype"]),
                req_pool_indices=torch.tensor(case["req_idx"], dtype=idx_dtype),
                seq_lens=torch.tensor(case["seq_lens"], dtype=idx_dtype),
                indptr=torch.tensor(case["indptr"], dtype=case["indptr_dtype"]),
                kv_start_idx=None if case["kv_start"] is None else torch.tensor(case["kv_start"], dtype=idx_dtype),
                v2p=torch.tensor(case["v2p"]))
    with no_host_sync():
        returned = vo.read_table_packed(**args, multiplier=case["multiplier"],
                                        page_size=case["ps"], max_tokens=case["max_tokens"], out=out)
    assert returned is out
    assert vo.first_mismatch(expected, buf) is None, f"(index, kvref, oracle) = {vo.first_mismatch(expected, buf)}"


@SETTINGS
@given(packed_cases())
def test_read_table_packed_matches_kvref(case):
    check_packed(case)


@st.composite
def packed_entry_clause_cases(draw):
    """A packed case, maybe with a token past v2p and / or an entry past int32 (at the page's
    last slot: ``v2p * multiplier * ps + pos % ps`` crosses 2^31 by a few)."""
    case = draw(packed_cases())
    rows, ps = len(case["v2p"]), case["ps"]
    if draw(st.booleans()):
        row = case["req_to_token"][draw(st.integers(0, len(case["req_to_token"]) - 1))]
        row[draw(st.integers(0, len(row) - 1)) // ps * ps] = rows * ps + draw(st.integers(0, 2 * ps))
    if draw(st.booleans()):  # pages at the int32 edge: whether an entry crosses depends on its pos % ps
        edge = (INT32_MAX - draw(st.integers(0, ps))) // ps // case["multiplier"] + draw(st.integers(0, 1))
        case["v2p"] = [edge if draw(st.booleans()) else v for v in case["v2p"]]
    return case


def _packed_entry_clauses_broken(case) -> set[str]:
    ps, starts = case["ps"], case["kv_start"] or [0] * len(case["req_idx"])

    def entries():
        for b, (r, n) in enumerate(zip(case["req_idx"], case["seq_lens"])):
            for col in range(min(n, case["max_tokens"] - case["indptr"][b])):
                pos = starts[b] + col
                yield b, col, r, pos // ps * ps, pos
    return _kvref_entry_clauses("read_table_packed", case, entries())


@settings(SETTINGS, max_examples=100)  # each example runs the oracle twice and kvref once
@given(packed_entry_clause_cases())
def test_packed_entry_flags_are_kvrefs_and_leave_the_valid_entries_alone(case):
    """read_table_packed's entry flags (compares over its int64 entries) say what kvref's
    per-entry check says, the last slot of a page that crosses 2^31 included, and the
    entries it writes are the ones it writes without clauses."""
    args = dict(req_to_token=torch.tensor(case["req_to_token"], dtype=case["token_dtype"]),
                req_pool_indices=torch.tensor(case["req_idx"], dtype=case["idx_dtype"]),
                seq_lens=torch.tensor(case["seq_lens"], dtype=case["idx_dtype"]),
                indptr=torch.tensor(case["indptr"], dtype=case["indptr_dtype"]),
                kv_start_idx=None if case["kv_start"] is None else torch.tensor(case["kv_start"], dtype=case["idx_dtype"]),
                v2p=torch.tensor(case["v2p"]), multiplier=case["multiplier"], page_size=case["ps"],
                max_tokens=case["max_tokens"])
    plain, flagged = (torch.full((case["out_len"],), POISON, dtype=torch.int32) for _ in range(2))
    vo.read_table_packed(**args, out=plain)
    flags = []
    with no_host_sync():
        vo.read_table_packed(**args, out=flagged, clauses=flags)
    named = {name: bool(f) for name, f in flags}
    broken = _packed_entry_clauses_broken(case)
    entry = ("read_table_packed.token_in_table", "read_table_packed.entry_fits_int32")
    assert {n for n in entry if named.get(n)} == broken
    if "read_table_packed.entry_fits_int32" not in broken:
        assert vo.first_mismatch(plain, flagged) is None


def test_a_packed_entry_past_int32_by_its_slot_alone_is_flagged():
    """v2p[1] * 3 = 2^31 - 2 fits; its page's slots 0 and 1 fit, slot 2 (2^31) does not."""
    v2p = torch.tensor([0, (INT32_MAX - 1) // 3, 1])
    args = dict(req_to_token=torch.tensor([[3, 4, 5, 6, 7, 8]], dtype=torch.int32), req_pool_indices=torch.tensor([0]),
                v2p=v2p, multiplier=1, page_size=3, max_tokens=6, out=torch.zeros(6, dtype=torch.int32))
    for n, past in ((2, False), (3, True)):
        flags = []
        vo.read_table_packed(**args, seq_lens=torch.tensor([n]), indptr=torch.tensor([0, n]), clauses=flags)
        assert dict(flags)["read_table_packed.entry_fits_int32"].item() is past


# --------------------------------------------------------------------------- translate


@st.composite
def translate_cases(draw):
    ps = draw(page_sizes)
    rows = draw(st.integers(1, 20))
    return dict(ps=ps, v2p=draw(v2p_tables(rows, 2**40)), dtype=draw(index_dtypes),
                loc=draw(st.lists(st.integers(-2 * ps - 3, (rows + 2) * ps), max_size=12)))  # negatives, past v2p


def check_translate(case) -> None:
    v2p_t = torch.tensor(case["v2p"])
    loc_t = torch.tensor(case["loc"], dtype=case["dtype"]) if case["loc"] else torch.empty(0, dtype=torch.int64)
    with no_host_sync():
        slots = vo.translate(loc=loc_t, v2p=v2p_t, page_size=case["ps"])
    assert slots.dtype == torch.int64
    _assert_same(ref.translate(case["v2p"], case["loc"], case["ps"]), slots, "slots")
    _assert_same(case["v2p"], v2p_t, "v2p")


@SETTINGS
@given(translate_cases())
def test_translate_matches_kvref(case):
    check_translate(case)


# --------------------------------------------------------------------------- bind / alloc_bind / free_unbind


@st.composite
def table_pairs(draw):
    rows = draw(st.integers(3, 20))
    entry = st.one_of(st.just(-1), st.integers(0, rows - 2))
    return rows, draw(st.lists(entry, min_size=rows, max_size=rows)), draw(st.lists(entry, min_size=rows, max_size=rows))


def _distinct_ids(draw, rows: int, n: int) -> list[int]:
    return draw(st.permutations(range(1, rows - 1)))[:n]  # kvref's rule: ids in [1, rows - 1)


def _diff_tables(v2p: list[int], p2v: list[int], oracle, spec) -> None:
    """``oracle(v2p_t, p2v_t)`` on tensors (no host sync) vs ``spec(v2p, p2v)`` on lists: tables and result."""
    v2p_t, p2v_t = torch.tensor(v2p), torch.tensor(p2v)
    with no_host_sync():
        got = oracle(v2p_t, p2v_t)
    expected = spec(v2p, p2v)
    if expected is not None:
        _assert_same(expected, got, "p")
    _assert_same(v2p, v2p_t, "v2p")
    _assert_same(p2v, p2v_t, "p2v")


@SETTINGS
@given(table_pairs(), st.data())
def test_bind_matches_kvref(tables, data):
    rows, v2p, p2v = tables
    n = data.draw(st.integers(0, rows - 2))
    v, p = _distinct_ids(data.draw, rows, n), _distinct_ids(data.draw, rows, n)
    dtype = data.draw(index_dtypes)
    v_t, p_t = torch.tensor(v, dtype=dtype), torch.tensor(p, dtype=dtype)
    _diff_tables(v2p, p2v, lambda a, b: vo.bind(a, b, v_t, p_t), lambda a, b: ref.bind(a, b, v, p))


@SETTINGS
@given(table_pairs(), st.data())
def test_alloc_bind_matches_kvref(tables, data):
    rows, v2p, p2v = tables
    n = data.draw(st.integers(0, rows - 2))
    v = _distinct_ids(data.draw, rows, n)
    start = data.draw(st.integers(1, rows - 1 - n))
    v_t = torch.tensor(v, dtype=data.draw(index_dtypes))
    start_arg = torch.tensor(start) if data.draw(st.booleans()) else start  # a device scalar or a host int
    _diff_tables(v2p, p2v, lambda a, b: vo.alloc_bind(a, b, v_t, start_arg),
                 lambda a, b: ref.alloc_bind(a, b, v, start))


@SETTINGS
@given(table_pairs(), st.data())
def test_free_unbind_matches_kvref(tables, data):
    rows, v2p, p2v = tables
    v = _distinct_ids(data.draw, rows, data.draw(st.integers(0, rows - 2)))
    for x in v:  # every freed page is bound; two may share a physical page (no uniqueness on p)
        v2p[x] = data.draw(st.integers(1, rows - 2))
    v_t = torch.tensor(v, dtype=data.draw(index_dtypes))
    _diff_tables(v2p, p2v, lambda a, b: vo.free_unbind(a, b, v_t), lambda a, b: ref.free_unbind(a, b, v))


# --------------------------------------------------------------------------- hand-worked cases from SPEC's text


def _read_table(r2t, req, seq, v2p, *, ps, multiplier=1, max_pages, out_shape):
    out = torch.full(out_shape, POISON, dtype=torch.int32)
    vo.read_table(req_to_token=torch.tensor(r2t), req_pool_indices=torch.tensor(req), seq_lens=torch.tensor(seq),
                  v2p=torch.tensor(v2p), multiplier=multiplier, page_size=ps, max_pages=max_pages, out=out)
    return out.tolist()


def test_padding_token_reads_page_zero_never_the_last_row():
    # tok = -1 at ps = 1: Triton's -1 // 1 == -1 would read v2p[-1] (9 here, a non-sentinel on purpose).
    assert _read_table([[3, -1, 1, -1]], [0], [3], [0, 4, 2, 9], ps=1, max_pages=4, out_shape=(1, 4)) == [
        [9, 0, 4, POISON]
    ]


def test_tombstones_read_as_zero_and_only_the_live_prefix_is_written():
    # ps = 4, seq_len 10 -> n_b = 3; columns read tokens 8, 4, -1 -> pages 2 (tombstone), 1, 0.
    r2t = [[8, 9, 10, 11, 4, 5, 6, 7, -1, -1, -1, -1]]
    got = _read_table(r2t, [0], [10], [0, 7, -1, 3, 5], ps=4, multiplier=2, max_pages=3, out_shape=(2, 5))
    assert got == [[0, 14, 0, POISON, POISON], [POISON] * 5]


def test_no_column_at_or_past_max_pages_even_when_seq_lens_is_too_long():
    got = _read_table([[1, 2, 3, 1, 2, 3]], [0], [100], [0, 5, 6, 7], ps=1, max_pages=2, out_shape=(1, 4))
    assert got == [[5, 6, POISON, POISON]]


def test_int32_boundary_of_the_multiplier():
    got = _read_table([[1, 2]], [0], [2], [0, (2**31 - 1) // 64, 1], ps=1, multiplier=64, max_pages=2,
                      out_shape=(1, 2))
    assert got == [[(2**31 - 1) // 64 * 64, 64]]


def test_packed_with_kv_start_and_a_gap():
    r2t = torch.tensor([[8, 9, 10, 11, 4, 5, 6, 7, -1, -1, -1, -1]])
    out = torch.full((12,), 7, dtype=torch.int32)
    # pos 2..6: tokens at columns 0, 0, 4, 4, 4 -> pages 2 (tombstone), 1 (v2p 7 * 2 = 14).
    vo.read_table_packed(req_to_token=r2t, req_pool_indices=torch.tensor([0]), seq_lens=torch.tensor([5]),
                         v2p=torch.tensor([0, 7, -1, 3, 5]), indptr=torch.tensor([2, 9]), multiplier=2, page_size=4,
                         max_tokens=6, out=out, kv_start_idx=torch.tensor([2]))
    assert out.tolist() == [7, 7, 0 * 4 + 2, 0 * 4 + 3, 14 * 4 + 0, 14 * 4 + 1, 14 * 4 + 2, 7, 7, 7, 7, 7]


def test_translate_sinks_negative_tokens_tombstones_and_pages_past_the_table():
    got = vo.translate(loc=torch.tensor([-1, 0, 5, 9, 13, 20, 100]), v2p=torch.tensor([0, 7, -1, 3, 5]), page_size=4)
    #            t<0  page0  7*4+1  tomb  3*4+1  past   past
    assert got.tolist() == [0, 0, 29, 0, 13, 0, 0]


def test_double_free_lane_writes_no_p2v_row():
    v2p = torch.tensor([0, 3, -1, -1, -1])
    p2v = torch.tensor([0, -1, -1, 1, -1])
    p = vo.free_unbind(v2p, p2v, torch.tensor([2, 1]))  # page 2 is not bound
    assert p.tolist() == [-1, 3]
    assert v2p.tolist() == [0, -1, -1, -1, -1]
    assert p2v.tolist() == [0, -1, -1, -1, -1]  # the sentinel row (4) and row 0 untouched


def test_empty_batches_touch_nothing():
    v2p, p2v = torch.tensor([0, 2, -1, -1]), torch.tensor([0, -1, 1, -1])
    empty = torch.empty(0, dtype=torch.int64)
    assert vo.free_unbind(v2p, p2v, empty).numel() == 0
    assert vo.alloc_bind(v2p, p2v, empty, 1).numel() == 0
    vo.bind(v2p, p2v, empty, empty)
    assert v2p.tolist() == [0, 2, -1, -1] and p2v.tolist() == [0, -1, 1, -1]


# --------------------------------------------------------------------------- first_mismatch


def test_first_mismatch_none_on_equal_and_one_host_read():
    a = torch.arange(12, dtype=torch.int32).view(3, 4)
    with record_host_syncs() as events:
        assert vo.first_mismatch(a, a.clone()) is None
    assert len(events) == 1


def test_first_mismatch_1d():
    a = torch.arange(10)
    b = a.clone()
    b[7], b[3] = -5, 99
    assert vo.first_mismatch(a, b) == (3, 3, 99)


def test_first_mismatch_2d_on_a_column_slice_with_two_host_reads():
    big = torch.zeros(4, 8, dtype=torch.int32)
    other = big.clone()
    other[2, 5], other[3, 1], other[0, 0] = 11, 12, 13  # (0, 0) lies outside the slice
    with record_host_syncs() as events:
        found = vo.first_mismatch(big[:, 1:6], other[:, 1:6])
    assert found == ((2, 4), 0, 11)
    assert len(events) == 2


def test_first_mismatch_refuses_other_shapes_and_dtypes():
    with pytest.raises(ValueError):
        vo.first_mismatch(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError):
        vo.first_mismatch(torch.zeros(3, dtype=torch.int32), torch.zeros(3, dtype=torch.int64))


# --------------------------------------------------------------------------- the diff is not vacuous


def _wrapping_pages(tok, page_size, rows):
    """Triton's truncating ``//`` without the tok < 0 guard, then torch's wrap: -1 reads v2p[-1]."""
    page = torch.div(tok, page_size, rounding_mode="trunc")
    return torch.where(page < 0, page + rows, page).clamp_(0, rows)


def _one_column_too_many(n_cols, width):
    cols = torch.arange(width, dtype=torch.int32, device=n_cols.device)
    return cols.unsqueeze(0) <= n_cols.unsqueeze(1)


def _everything_in_range(idx, rows):
    return idx.clamp(0, rows - 1), torch.ones_like(idx, dtype=torch.bool)


def _no_tombstone_clamp(v2p, multiplier, dtype=None):
    dtype = dtype or torch.int32
    return torch.cat([(v2p * multiplier).to(dtype), torch.zeros(1, dtype=dtype)])


@pytest.mark.parametrize(
    "name, mutant, check, strategy",
    [
        ("_pages_of_tokens", _wrapping_pages, check_read_table, read_table_cases()),
        ("_live_columns", _one_column_too_many, check_read_table, read_table_cases()),
        ("_scaled_lookup", _no_tombstone_clamp, check_packed, packed_cases()),
        ("_clamp_rows", _everything_in_range, check_translate, translate_cases()),
    ],
)
def test_a_wrong_oracle_is_caught(monkeypatch, name, mutant, check, strategy):
    monkeypatch.setattr(vo, name, mutant)

    @settings(max_examples=400, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=[HealthCheck.too_slow])
    @given(strategy)
    def diff(case):
        check(case)

    with pytest.raises(AssertionError):
        diff()
