"""SPEC.md §2, hand-worked: every expected table below is derived in the comments from
the spec's formulas, never computed by calling kvref."""

from __future__ import annotations

import copy

import pytest

from kvref import ContractViolation
from kvref import kernels as K

P = -7  # poison: what `out` holds before a read_table call


def empty_tables(num_pages: int = 6) -> tuple[list[int], list[int]]:
    # §1: num_pages + 1 rows, all -1 except row 0 (= 0); the last row is the sentinel.
    v2p = [0] + [-1] * num_pages
    p2v = [0] + [-1] * num_pages
    return v2p, p2v


# ---------------------------------------------------------------- bind / alloc_bind / free_unbind


def test_bind_writes_both_tables():
    v2p, p2v = empty_tables()
    K.bind(v2p, p2v, [2, 5], [4, 1])
    # v2p[2] = 4, v2p[5] = 1; p2v[4] = 2, p2v[1] = 5.
    assert v2p == [0, -1, 4, -1, -1, 1, -1]
    assert p2v == [0, 5, -1, -1, 2, -1, -1]


def test_alloc_bind_ascending_from_start():
    v2p, p2v = empty_tables()
    p = K.alloc_bind(v2p, p2v, [3, 1, 4], 2)
    # p[i] = start + i = [2, 3, 4]; v3->2, v1->3, v4->4.
    assert p == [2, 3, 4]
    assert v2p == [0, 3, -1, 2, 4, -1, -1]
    assert p2v == [0, -1, 3, 1, 4, -1, -1]


def test_free_unbind_returns_pages_and_tombstones():
    v2p = [0, 3, -1, 2, 4, -1, -1]
    p2v = [0, -1, 3, 1, 4, -1, -1]
    p = K.free_unbind(v2p, p2v, [4, 3])
    # p = [v2p[4], v2p[3]] = [4, 2]; then v2p[4] = v2p[3] = -1 and p2v[4] = p2v[2] = -1.
    assert p == [4, 2]
    assert v2p == [0, 3, -1, -1, -1, -1, -1]
    assert p2v == [0, -1, -1, 1, -1, -1, -1]


def test_empty_inputs_are_noops():
    v2p, p2v = [0, 3, -1, 2, 4, -1, -1], [0, -1, 3, 1, 4, -1, -1]
    before = (list(v2p), list(p2v))
    K.bind(v2p, p2v, [], [])
    assert K.alloc_bind(v2p, p2v, [], 3) == []
    assert K.free_unbind(v2p, p2v, []) == []
    assert (v2p, p2v) == before


def _bound_tables():
    # v1->3, v3->2, v4->4 (a consistent bijection); v2, v5 unbound.
    return [0, 3, -1, 2, 4, -1, -1], [0, -1, 3, 1, 4, -1, -1]


@pytest.mark.parametrize(
    "call",
    [
        # double free: v2 is tombstoned; it comes second so a kernel that wrote lane 0
        # before checking would leave v1 unbound.
        lambda v, p: K.free_unbind(v, p, [1, 2]),
        lambda v, p: K.free_unbind(v, p, [2]),
        # duplicate ids
        lambda v, p: K.free_unbind(v, p, [1, 1]),
        lambda v, p: K.free_unbind(v, p, [3, 4, 3]),
        lambda v, p: K.bind(v, p, [2, 2], [1, 5]),
        lambda v, p: K.bind(v, p, [2, 5], [1, 1]),
        lambda v, p: K.alloc_bind(v, p, [5, 5], 1),
        # length mismatch
        lambda v, p: K.bind(v, p, [2, 5], [1]),
    ],
)
def test_contract_violations_leave_tables_identical(call):
    v2p, p2v = _bound_tables()
    before = (list(v2p), list(p2v))
    with pytest.raises(ContractViolation):
        call(v2p, p2v)
    assert (v2p, p2v) == before


@pytest.mark.parametrize(
    "call",
    [
        # row 0 (padding sink) and row 6 (= num_pages, the last-row sentinel) are never written
        lambda v, p: K.bind(v, p, [0], [5]),
        lambda v, p: K.bind(v, p, [5], [0]),
        lambda v, p: K.bind(v, p, [6], [5]),
        lambda v, p: K.bind(v, p, [5], [6]),
        lambda v, p: K.bind(v, p, [2, 5], [1, 6]),
        lambda v, p: K.alloc_bind(v, p, [2], 0),
        lambda v, p: K.alloc_bind(v, p, [2, 5], 5),  # p = [5, 6]: lane 1 hits the sentinel
        lambda v, p: K.free_unbind(v, p, [0]),
        lambda v, p: K.free_unbind(v, p, [6]),
        lambda v, p: K.free_unbind(v, p, [1, 6]),
        # and nothing outside the table either way
        lambda v, p: K.bind(v, p, [7], [5]),
        lambda v, p: K.bind(v, p, [-1], [5]),
        lambda v, p: K.bind(v, p, [5], [-1]),
        lambda v, p: K.free_unbind(v, p, [-1]),
        lambda v, p: K.free_unbind(v, p, [99]),
    ],
)
def test_sentinel_and_out_of_table_ids_raise(call):
    v2p, p2v = _bound_tables()
    before = (list(v2p), list(p2v))
    with pytest.raises(ContractViolation):
        call(v2p, p2v)
    assert (v2p, p2v) == before


# ---------------------------------------------------------------- read_table

# Shared fixture: num_pages = 6 (7 rows). v1->4, v2->2, v3 tombstoned, v4->1, v5->5.
V2P = [0, 4, 2, -1, 1, 5, -1]


def test_read_table_page_size_1():
    r2t = [
        [1, 2, 3, 4, 5],
        [4, -1, 1, 0, 0],
        [5, 5, 5, 5, 5],
    ]
    out = [[P] * 5 for _ in range(3)]
    K.read_table(req_to_token=r2t, req_pool_indices=[1, 0], seq_lens=[3, 4], v2p=V2P,
                 multiplier=1, page_size=1, max_pages=5, out=out)
    # b=0 reads row 1, n_b = 3: tok 4 -> v2p[4]=1; tok -1 -> page 0 -> v2p[0]=0; tok 1 -> 4.
    # b=1 reads row 0, n_b = 4: tok 1 -> 4; tok 2 -> 2; tok 3 -> -1 -> max(.,0)=0; tok 4 -> 1.
    # Columns past n_b and row 2 (>= bs) keep their poison.
    assert out == [
        [1, 0, 4, P, P],
        [4, 2, 0, 1, P],
        [P, P, P, P, P],
    ]


def test_read_table_page_size_1_multiplier():
    r2t = [[1, 2, 3, 4, 5], [4, -1, 1, 0, 0]]
    out = [[P] * 5 for _ in range(2)]
    K.read_table(req_to_token=r2t, req_pool_indices=[1, 0], seq_lens=[3, 4], v2p=V2P,
                 multiplier=3, page_size=1, max_pages=5, out=out)
    # Same pages as above, times 3; max(v2p * m, 0) keeps tombstones and padding at 0.
    assert out == [
        [3, 0, 12, P, P],
        [12, 6, 0, 3, P],
    ]


# ps = 2: page p holds tokens 2p, 2p + 1. Width 8.
R2T_PS2 = [
    [8, 9, 2, 3, -1, -1, 6, 7],  # pages 4, 1, padding, 3 (tombstoned)
    [10, 11, 4, 5, 0, 0, 0, 0],  # pages 5, 2, 0, 0
]


def test_read_table_page_size_2():
    out = [[P] * 4 for _ in range(2)]
    K.read_table(req_to_token=R2T_PS2, req_pool_indices=[0, 1], seq_lens=[7, 3], v2p=V2P,
                 multiplier=1, page_size=2, max_pages=4, out=out)
    # b=0: n_b = ceil(7/2) = 4, tokens at columns c*2 = 0,2,4,6 -> 8, 2, -1, 6
    #   8 -> page 4 -> 1; 2 -> page 1 -> 4; -1 -> page 0 -> 0; 6 -> page 3 -> -1 -> 0.
    # b=1: n_b = ceil(3/2) = 2: 10 -> page 5 -> 5; 4 -> page 2 -> 2; columns 2, 3 untouched.
    assert out == [
        [1, 4, 0, 0],
        [5, 2, P, P],
    ]


def test_read_table_page_size_2_multiplier_and_negative_tokens():
    # A -3 token: Python's -3 // 2 = -2 and Triton's = -1; the tok < 0 guard makes it page 0.
    r2t = [[-3, -3, 8, 9, 2, 3]]
    out = [[P] * 3]
    K.read_table(req_to_token=r2t, req_pool_indices=[0], seq_lens=[6], v2p=V2P,
                 multiplier=2, page_size=2, max_pages=3, out=out)
    # -3 -> page 0 -> 0; 8 -> page 4 -> 1*2 = 2; 2 -> page 1 -> 4*2 = 8.
    assert out == [[0, 2, 8]]


def test_read_table_zero_length_rows_write_nothing():
    out = [[P] * 4 for _ in range(2)]
    K.read_table(req_to_token=R2T_PS2, req_pool_indices=[0, 1], seq_lens=[0, 0], v2p=V2P,
                 multiplier=1, page_size=2, max_pages=4, out=out)
    assert out == [[P] * 4, [P] * 4]


def _read_table_call(**over):
    kw = dict(req_to_token=R2T_PS2, req_pool_indices=[0, 1], seq_lens=[7, 3], v2p=V2P,
              multiplier=1, page_size=2, max_pages=4, out=[[P] * 5 for _ in range(2)])
    kw.update(over)
    return kw


@pytest.mark.parametrize(
    "over",
    [
        # n_b > max_pages: row 1 needs ceil(7/2) = 4 pages but max_pages = 3; row 0 is valid and
        # must not be written either.
        dict(req_pool_indices=[1, 0], seq_lens=[3, 7], max_pages=3),
        # (max_pages - 1) * ps >= width: (5 - 1) * 2 = 8 >= 8
        dict(max_pages=5, seq_lens=[1, 1]),
        # negative seq_lens
        dict(seq_lens=[3, -1]),
        # int32 overflow: v2p[4] * 2 = 2**31
        dict(v2p=[0, 4, 2, -1, 2**30, 5, -1], multiplier=2),
        dict(v2p=[0, 4, 2, -1, 2**31, 5, -1], multiplier=1),
        # out too small: fewer than bs rows, fewer than max_pages columns
        dict(out=[[P] * 4]),
        dict(out=[[P] * 3, [P] * 3]),
    ],
)
def test_read_table_preconditions_raise_and_write_nothing(over):
    kw = _read_table_call(**over)
    before = copy.deepcopy(kw["out"])
    with pytest.raises(ContractViolation):
        K.read_table(**kw)
    assert kw["out"] == before


def test_read_table_boundaries_that_are_allowed():
    # (max_pages - 1) * ps = (4 - 1) * 2 = 6 < 8: allowed; v2p * m = 2**31 - 1 fits int32.
    out = [[P] * 4]
    K.read_table(req_to_token=R2T_PS2, req_pool_indices=[0], seq_lens=[2], v2p=[0, 4, 2, -1, 2**31 - 1, 5, -1],
                 multiplier=1, page_size=2, max_pages=4, out=out)
    # token 8 -> page 4 -> 2**31 - 1
    assert out == [[2**31 - 1, P, P, P]]


def test_read_table_max_pages_zero_with_empty_rows_is_a_noop():
    out = [[], []]
    K.read_table(req_to_token=R2T_PS2, req_pool_indices=[0, 1], seq_lens=[0, 0], v2p=V2P,
                 multiplier=1, page_size=2, max_pages=0, out=out)
    assert out == [[], []]


# ---------------------------------------------------------------- read_table_packed


def test_read_table_packed_without_kv_start():
    out = [P] * 9
    K.read_table_packed(req_to_token=R2T_PS2, req_pool_indices=[0, 1], seq_lens=[5, 3], v2p=V2P,
                        indptr=[0, 5, 8], multiplier=1, page_size=2, max_tokens=8, out=out)
    # value = max(v2p[page] * m, 0) * ps + pos % ps, tok = row[(pos // 2) * 2]
    # b=0 (row 0), pos 0..4: tok 8 (page 4 -> 1): 2, 3; tok 2 (page 1 -> 4): 8, 9; tok -1: 0*2+0 = 0
    # b=1 (row 1), pos 0..2 at out[5..7]: tok 10 (page 5 -> 5): 10, 11; tok 4 (page 2 -> 2): 4
    # out[8] is past indptr[-1]: poison stays.
    assert out == [2, 3, 8, 9, 0, 10, 11, 4, P]


def test_read_table_packed_multiplier():
    out = [P] * 8
    K.read_table_packed(req_to_token=R2T_PS2, req_pool_indices=[0, 1], seq_lens=[5, 3], v2p=V2P,
                        indptr=[0, 5, 8], multiplier=3, page_size=2, max_tokens=8, out=out)
    # scaled pages: page 4 -> 3, page 1 -> 12, pad -> 0, page 5 -> 15, page 2 -> 6
    # b=0: 6, 7, 24, 25, 0;  b=1: 30, 31, 12
    assert out == [6, 7, 24, 25, 0, 30, 31, 12]


def test_read_table_packed_with_kv_start():
    out = [P] * 8  # SPEC §2: out holds at least max_tokens elements
    K.read_table_packed(req_to_token=R2T_PS2, req_pool_indices=[0, 1], seq_lens=[4, 2], v2p=V2P,
                        indptr=[0, 4, 6], multiplier=1, page_size=2, max_tokens=8, out=out,
                        kv_start_idx=[3, 1])
    # b=0, pos = 3 + col for col < 4 -> pos 3, 4, 5, 6:
    #   pos 3: tok row0[2] = 2 -> page 1 -> 4 -> 4*2 + 1 = 9
    #   pos 4: tok row0[4] = -1 -> page 0 -> 0*2 + 0 = 0
    #   pos 5: tok row0[4] = -1 -> 0*2 + 1 = 1   (the pad page keeps the in-page offset)
    #   pos 6: tok row0[6] = 6 -> page 3 tombstoned -> max(-1, 0) = 0 -> 0*2 + 0 = 0
    # b=1, pos 1, 2 at out[4], out[5]:
    #   pos 1: tok row1[0] = 10 -> page 5 -> 5 -> 10 + 1 = 11
    #   pos 2: tok row1[2] = 4 -> page 2 -> 2 -> 4 + 0 = 4
    assert out == [9, 0, 1, 0, 11, 4, P, P]


def test_read_table_packed_page_size_1():
    r2t = [[1, 2, 3, 4, 5], [4, -1, 1, 0, 0]]
    out = [P] * 6
    K.read_table_packed(req_to_token=r2t, req_pool_indices=[1, 0], seq_lens=[3, 2], v2p=V2P,
                        indptr=[0, 3, 5], multiplier=1, page_size=1, max_tokens=5, out=out,
                        kv_start_idx=[0, 2])
    # b=0 row 1, pos 0..2: tok 4 -> 1; tok -1 -> 0; tok 1 -> 4   (pos % 1 = 0)
    # b=1 row 0, pos 2, 3: tok 3 -> tombstone -> 0; tok 4 -> 1
    assert out == [1, 0, 4, 0, 1, P]


@pytest.mark.parametrize(
    "over",
    [
        dict(seq_lens=[3, -1]),
        dict(seq_lens=[9, 3], indptr=[0, 9, 12], out=[P] * 12),  # > max_tokens
        dict(kv_start_idx=[-1, 0]),
        dict(indptr=[0, 5]),  # wrong length
        dict(indptr=[0, 2, 8]),  # row 0 would spill into row 1's span
        dict(out=[P] * 7),  # row 1 would write out[7]
        dict(v2p=[0, 4, 2, -1, 2**30, 5, -1]),  # 2**30 * 2 + 0 = 2**31 does not fit int32
    ],
)
def test_read_table_packed_preconditions(over):
    kw = dict(req_to_token=R2T_PS2, req_pool_indices=[0, 1], seq_lens=[5, 3], v2p=V2P,
              indptr=[0, 5, 8], multiplier=1, page_size=2, max_tokens=8, out=[P] * 8)
    kw.update(over)
    before = list(kw["out"])
    with pytest.raises(ContractViolation):
        K.read_table_packed(**kw)
    assert kw["out"] == before


# ---------------------------------------------------------------- translate


def test_translate_page_size_1():
    # translate(t) = max(v2p[t] * 1 + 0, 0); 0 for t < 0 or t >= 7 rows.
    # 1 -> 4, 2 -> 2, 3 -> tombstone -> 0, 4 -> 1, 5 -> 5, 6 -> sentinel row -1 -> 0,
    # 7 -> past the table -> 0, -1 -> 0, 0 -> v2p[0] = 0.
    assert K.translate(V2P, [1, 2, 3, 4, 5, 6, 7, -1, 0], 1) == [4, 2, 0, 1, 5, 0, 0, 0, 0]


def test_translate_page_size_2():
    loc = [8, 9, 3, 6, 7, -1, -2, 12, 13, 14, 100, 0, 1]
    # 8, 9 -> page 4 -> 1: 2, 3.  3 -> page 1 -> 4: 9.
    # 6, 7 -> page 3 tombstoned: max(-2 + o, 0) = 0, 0.   -1, -2 -> 0, 0.
    # 12, 13 -> page 6 (sentinel row, -1) -> 0, 0.  14, 100 -> page 7, 50: past the table -> 0.
    # 0, 1 -> page 0 -> v2p[0] = 0: 0*2 + 0 = 0 and 0*2 + 1 = 1.
    assert K.translate(V2P, loc, 2) == [2, 3, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]


def test_translate_empty():
    assert K.translate(V2P, [], 2) == []


@pytest.mark.parametrize("corrupt", [-2, 11, 99])
def test_free_unbind_refuses_a_corrupt_entry_before_writing_anything(corrupt):
    """A v2p entry that is neither -1 nor a row of p2v: refused with the tables untouched
    (a negative entry must not wrap to p2v[-2], a large one not fail half-way)."""
    v2p, p2v = [0] + [-1] * 10, [0] + [-1] * 10
    K.bind(v2p, p2v, [1], [4])
    v2p[2] = corrupt
    before = (list(v2p), list(p2v))
    with pytest.raises(ContractViolation, match="not a physical page"):
        K.free_unbind(v2p, p2v, [1, 2])
    assert (v2p, p2v) == before
