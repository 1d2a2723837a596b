"""SPEC.md §3, hand-worked: every expected state is written literally and derived in the
comments from the spec's rules, never by calling the code under test to compute it."""

from __future__ import annotations

import re

import pytest

from kvref import Allocator, ContractViolation, PoolConfig, check_all


def pool(num_pages, min_page=1, page_size=1, grow="up", lazy=True, max_moves=8, multiplier=1) -> Allocator:
    return Allocator(PoolConfig(num_pages=num_pages, min_page=min_page, page_size=page_size, grow=grow,
                                lazy=lazy, max_moves=max_moves, multiplier=multiplier))


def ok(a: Allocator, written=None) -> None:
    check_all(a.config, a.snapshot(), written)


# ---------------------------------------------------------------- initial state / clear


def test_initial_state_grow_up():
    a = pool(5, min_page=2, page_size=2, grow="up")
    s = a.snapshot()
    # §1: 6 rows of -1 except row 0; free list [min_page, num_pages); wm = min_page.
    assert s["v2p"] == [0, -1, -1, -1, -1, -1]
    assert s["p2v"] == [0, -1, -1, -1, -1, -1]
    assert s["free_virtual"] == [2, 3, 4]
    assert s["watermark"] == 2
    assert (s["holes"], s["pending"], s["live_pages"], s["in_flight"]) == ([], [], 0, None)
    assert len(s["kv"]) == 5 * 2


def test_initial_state_grow_down():
    a = pool(5, min_page=2, page_size=2, grow="down")
    s = a.snapshot()
    # grow down: wm = num_pages - 1 = 4, span [wm + 1, num_pages) = [5, 5) empty.
    assert s["v2p"] == [0, -1, -1, -1, -1, -1]
    assert s["free_virtual"] == [2, 3, 4]
    assert s["watermark"] == 4


@pytest.mark.parametrize("grow", ["up", "down"])
@pytest.mark.parametrize("lazy", [True, False])
def test_clear_returns_to_initial_state(grow, lazy):
    a = pool(6, min_page=2, page_size=2, grow=grow, lazy=lazy)
    initial = a.snapshot()
    t = a.alloc(6)
    a.write(t, [1, 2, 3, 4, 5, 6])
    a.free(t[2:4])
    a.forward(t[:2])
    a.flush()
    a.clear()
    assert a.snapshot() == initial


# ---------------------------------------------------------------- alloc: fast path, slow path


def test_alloc_grow_up_page_size_1_fast_then_slow_path():
    a = pool(8)  # rows 9, free_virtual [1..7], wm 1
    # alloc(3): k = 3, no holes -> fast path alloc_bind([1,2,3], start = wm = 1); wm = 4
    assert a.alloc(3) == [1, 2, 3]
    # alloc(2): vp [4, 5], start 4 -> phys [4, 5]; wm = 6
    assert a.alloc(2) == [4, 5]
    assert a.snapshot()["v2p"] == [0, 1, 2, 3, 4, 5, -1, -1, -1]
    assert a.snapshot()["p2v"] == [0, 1, 2, 3, 4, 5, -1, -1, -1]
    assert a.watermark == 6
    # lazy free([4, 2]): phys [4, 2] appended to holes in that order; pages to free_virtual
    a.free([4, 2])
    s = a.snapshot()
    assert s["free_virtual"] == [6, 7, 4, 2]
    assert s["holes"] == [4, 2]
    assert s["watermark"] == 6  # no watermark change
    assert s["live_pages"] == 3
    assert s["v2p"] == [0, 1, -1, 3, -1, 5, -1, -1, -1]
    assert s["p2v"] == [0, 1, -1, 3, -1, 5, -1, -1, -1]
    # alloc(3): capacity = room (8 - 1 - 5 = 2) + holes 2 = 4 >= 3. vp = [6, 7, 4].
    # d = min(3, 2) = 2 from the FRONT of holes: [4, 2]; then 1 new frontier page [6]; wm = 7.
    # slow path bind([6, 7, 4], [4, 2, 6]).
    assert a.alloc(3) == [6, 7, 4]
    s = a.snapshot()
    assert s["v2p"] == [0, 1, -1, 3, 6, 5, 4, 2, -1]
    assert s["p2v"] == [0, 1, 7, 3, 6, 5, 4, -1, -1]
    assert s["free_virtual"] == [2]
    assert s["holes"] == []
    assert s["watermark"] == 7
    assert s["live_pages"] == 6
    ok(a)


def test_alloc_holes_fully_cover_request():
    a = pool(8)
    a.alloc(5)  # v1..5 -> p1..5, wm 6
    a.free([5, 1, 3])  # holes [5, 1, 3], free_virtual [6, 7, 5, 1, 3]
    # alloc(2): d = 2 -> holes [5, 1] from the front, no new page, wm stays 6; vp [6, 7]
    assert a.alloc(2) == [6, 7]
    s = a.snapshot()
    assert s["holes"] == [3]
    assert s["watermark"] == 6
    assert s["v2p"][6] == 5 and s["v2p"][7] == 1
    assert s["p2v"][5] == 6 and s["p2v"][1] == 7
    assert s["free_virtual"] == [5, 1, 3]
    ok(a)


def test_alloc_grow_down_page_size_2():
    a = pool(8, min_page=2, page_size=2, grow="down")  # rows 9, wm 7, free_virtual [2..7]
    # alloc(6): k = 3, vp [2, 3, 4]; fast path start = 7 - 3 + 1 = 5 -> phys [5, 6, 7]; wm = 4
    # tokens page-major: [2*2, 2*2+1, 3*2, 3*2+1, 4*2, 4*2+1]
    assert a.alloc(6) == [4, 5, 6, 7, 8, 9]
    assert a.watermark == 4
    # alloc(4): vp [5, 6]; start = 4 - 2 + 1 = 3 -> phys [3, 4]; wm = 2
    assert a.alloc(4) == [10, 11, 12, 13]
    s = a.snapshot()
    assert s["v2p"] == [0, -1, 5, 6, 7, 3, 4, -1, -1]
    assert s["p2v"] == [0, -1, -1, 5, 6, 2, 3, 4, -1]
    assert s["free_virtual"] == [7]
    assert s["watermark"] == 2
    # free run [8, 9, 4, 5]: pages tokens[::2] // 2 = [4, 2]; phys [v2p[4], v2p[2]] = [7, 5]
    a.free([8, 9, 4, 5])
    s = a.snapshot()
    assert s["holes"] == [7, 5]
    assert s["free_virtual"] == [7, 4, 2]
    assert s["v2p"] == [0, -1, -1, 6, -1, 3, 4, -1, -1]
    assert s["p2v"] == [0, -1, -1, 5, 6, -1, 3, -1, -1]
    assert s["watermark"] == 2
    # alloc(6): k = 3; capacity = room (6 - 5 = 1) + holes 2 = 3. vp [7, 4, 2].
    # holes [7, 5] from the front, then k - d = 1 frontier page [wm - 1 + 1, wm] = [2]; wm = 1.
    assert a.alloc(6) == [14, 15, 8, 9, 4, 5]
    s = a.snapshot()
    assert s["v2p"] == [0, -1, 2, 6, 5, 3, 4, 7, -1]
    assert s["p2v"] == [0, -1, 2, 5, 6, 4, 3, 7, -1]
    assert s["watermark"] == 1  # min_page - 1: the pool is full
    assert s["free_virtual"] == [] and s["holes"] == [] and s["live_pages"] == 6
    before = a.snapshot()
    assert a.alloc(2) is None
    assert a.snapshot() == before
    ok(a)


def test_alloc_grow_up_page_size_3_tokens_are_page_major_runs():
    a = pool(4, page_size=3)
    # vp [1, 2] -> tokens [3, 4, 5, 6, 7, 8]; phys [1, 2]
    assert a.alloc(6) == [3, 4, 5, 6, 7, 8]
    a.free([3, 4, 5])  # page 1 -> hole p1; free_virtual [3, 1]
    # alloc(6): vp [3, 1]; phys = holes [1] + frontier [3]; wm 4
    assert a.alloc(6) == [9, 10, 11, 3, 4, 5]
    assert a.snapshot()["v2p"] == [0, 3, 2, 1, -1]
    assert a.snapshot()["p2v"] == [0, 3, 2, 1, -1]
    ok(a)


def test_alloc_zero_and_negative_return_empty():
    a = pool(5, page_size=2)
    before = a.snapshot()
    assert a.alloc(0) == []
    assert a.alloc(-2) == []
    assert a.snapshot() == before


@pytest.mark.parametrize("n", [1, 3, 5, -1])
def test_alloc_not_a_multiple_of_page_size_raises(n):
    a = pool(5, page_size=2)
    a.alloc(2)
    before = a.snapshot()
    with pytest.raises(ContractViolation):
        a.alloc(n)
    assert a.snapshot() == before


def test_failed_alloc_capacity_leaves_state_identical():
    a = pool(6, page_size=2)  # capacity 5 pages
    a.alloc(8)  # v1..4 -> p1..4, wm 5
    a.free([6, 7, 2, 3])  # pages [3, 1]: holes [3, 1], free_virtual [5, 3, 1]
    a.write([4, 5], [40, 50])
    before = a.snapshot()
    # capacity = room (5 - 4 = 1) + holes 2 = 3 pages; ask for 4 pages = 8 tokens
    assert a.alloc(8) is None
    after = a.snapshot()
    assert after == before
    assert after["free_virtual"] == [5, 3, 1]  # the free list keeps its order
    # exactly capacity still works: vp [5, 3, 1], phys holes [3, 1] + frontier [5]
    assert a.alloc(6) == [10, 11, 6, 7, 2, 3]
    ok(a)


def test_failed_alloc_free_virtual_leaves_state_identical():
    # From a valid state len(free_virtual) = capacity_pages - live >= capacity, so this branch
    # of §3 alloc step 2 is reached only on a hand-shortened free list.
    a = pool(6)
    a.free_virtual = [3, 1]
    before = a.snapshot()
    assert a.alloc(3) is None  # capacity 5 but only 2 free virtual pages
    assert a.snapshot() == before
    assert a.alloc(2) == [3, 1]


# ---------------------------------------------------------------- free: lazy


def test_lazy_free_appends_in_given_order_page_size_2():
    a = pool(6, page_size=2, grow="down")  # wm 5
    # alloc(8): vp [1, 2, 3, 4] -> phys [5-4+1 .. 5] = [2, 3, 4, 5]; wm = 1
    a.alloc(8)
    # free run [8, 9, 2, 3, 6]: pages [4, 1, 3] (last page partial); phys [5, 2, 4]
    a.free([8, 9, 2, 3, 6])
    s = a.snapshot()
    assert s["free_virtual"] == [5, 4, 1, 3]
    assert s["holes"] == [5, 2, 4]
    assert s["watermark"] == 1
    assert s["live_pages"] == 1
    assert s["v2p"] == [0, -1, 3, -1, -1, -1, -1]
    assert s["p2v"] == [0, -1, -1, 2, -1, -1, -1]
    ok(a)


def test_free_empty_is_noop():
    a = pool(5)
    a.alloc(2)
    before = a.snapshot()
    a.free([])
    assert a.snapshot() == before


# ---------------------------------------------------------------- free: contract

CONTRACT_CASES_PS1 = [
    # (tokens, the page the message must name)
    ([3], 3),  # double free (3 was freed in setup)
    ([4, 3], 3),  # double free after a valid page: nothing may be freed
    ([2, 2], 2),  # duplicate page
    ([4, 2, 4], 4),
    ([6], 6),  # never allocated (in [min_page, num_pages) but not bound)
    ([1], 1),  # reserved (min_page = 2)
    ([0], 0),  # reserved: the padding sink
    ([8], 8),  # out of range (= num_pages, the sentinel row)
    ([50], 50),  # out of range
    ([-1], -1),  # out of range
]


@pytest.mark.parametrize("lazy", [True, False])
@pytest.mark.parametrize("tokens,page", CONTRACT_CASES_PS1)
def test_free_contract_page_size_1(lazy, tokens, page):
    a = pool(8, min_page=2, lazy=lazy)
    a.alloc(4)  # v2..5
    a.free([3])
    a.write([2, 4], [20, 40])
    before = a.snapshot()
    with pytest.raises(ContractViolation, match=rf"page {re.escape(str(page))}\b"):
        a.free(tokens)
    assert a.snapshot() == before


CONTRACT_CASES_PS2 = [
    ([6, 7], 3),  # double free of page 3
    ([4, 5, 6, 7], 3),  # page 2 valid, page 3 double free
    ([4, 5, 4, 5], 2),  # duplicate page
    ([8, 9, 8], 4),  # duplicate page, the repeat is a partial last page
    ([10, 11], 5),  # never allocated
    ([2, 3], 1),  # reserved
    ([0, 1], 0),  # reserved
    ([12, 13], 6),  # out of range (sentinel row)
    ([-2, -1], -1),  # out of range
]


@pytest.mark.parametrize("lazy", [True, False])
@pytest.mark.parametrize("tokens,page", CONTRACT_CASES_PS2)
def test_free_contract_page_size_2(lazy, tokens, page):
    a = pool(6, min_page=2, page_size=2, lazy=lazy)
    a.alloc(6)  # vp [2, 3, 4] -> tokens 4..9
    a.free([6, 7])
    before = a.snapshot()
    with pytest.raises(ContractViolation, match=rf"page {re.escape(str(page))}\b"):
        a.free(tokens)
    assert a.snapshot() == before


WRONG_SHAPE = [
    # (run, the page whose run is broken)
    ([5], 2),  # starts mid-page
    ([5, 6], 2),
    ([4, 6], 2),  # page 2's tokens not consecutive
    ([4, 5, 9], 4),  # second page starts mid-page
    ([8, 9, 4, 4], 2),  # page 2's run repeats a token
]


@pytest.mark.parametrize("tokens,page", WRONG_SHAPE)
def test_free_wrong_run_shape_raises_and_changes_nothing(tokens, page):
    a = pool(6, min_page=2, page_size=2)
    a.alloc(6)  # pages 2, 3, 4 live
    before = a.snapshot()
    with pytest.raises(ContractViolation):
        a.free(tokens)
    assert a.snapshot() == before


@pytest.mark.parametrize("tokens,page", WRONG_SHAPE)
def test_free_wrong_run_shape_names_the_page(tokens, page):
    a = pool(6, min_page=2, page_size=2)
    a.alloc(6)
    with pytest.raises(ContractViolation, match=rf"page {page}\b"):
        a.free(tokens)


def test_free_partial_last_page_frees_whole_page():
    a = pool(6, min_page=2, page_size=2)
    a.alloc(6)  # pages 2, 3, 4 -> phys 2, 3, 4
    # [8, 9, 4]: pages [4, 2]; the last page is partial
    a.free([8, 9, 4])
    s = a.snapshot()
    assert s["holes"] == [4, 2]
    assert s["free_virtual"] == [5, 4, 2]
    assert s["v2p"] == [0, -1, -1, 3, -1, -1, -1]


# ---------------------------------------------------------------- flush (lazy)


def _flush_setup(grow="up", max_moves=8):
    """num_pages 10, ps 1: alloc(8) then free [2, 8, 5, 3]; stamps on the survivors 1, 4, 6, 7."""
    a = pool(10, grow=grow, max_moves=max_moves)
    assert a.alloc(8) == [1, 2, 3, 4, 5, 6, 7, 8]
    a.write([1, 4, 6, 7], [101, 104, 106, 107])
    a.free([2, 8, 5, 3])
    return a


WRITTEN = {1: 101, 4: 104, 6: 106, 7: 107}

# grow up, after a full flush:
#  alloc(8): v_i -> p_i for i in 1..8, wm 9.  free -> holes [2, 8, 5, 3].
#  flush: sort -> [2, 3, 5, 8]; absorb 8 (= wm - 1): wm 8, holes [2, 3, 5].
#  walk: dst 2, src 7 (highest live) -> move 7->2, holes [3, 5] + 7 = [3, 5, 7]
#        dst 3, src 6 -> move 6->3, holes [5, 6, 7]
#        dst 5, src 4 <= 5: stop.
#  absorb: 7, 6, 5 touch the frontier in turn -> wm 5, holes [].
UP_FLUSHED_V2P = [0, 1, -1, -1, 4, -1, 3, 2, -1, -1, -1]
UP_FLUSHED_P2V = [0, 1, 7, 6, 4, -1, -1, -1, -1, -1, -1]


def test_flush_grow_up_walk_and_absorb():
    a = _flush_setup()
    assert a.snapshot()["holes"] == [2, 8, 5, 3]
    a.flush()
    s = a.snapshot()
    assert s["v2p"] == UP_FLUSHED_V2P
    assert s["p2v"] == UP_FLUSHED_P2V
    assert (s["watermark"], s["holes"], s["pending"], s["live_pages"]) == (5, [], [], 4)
    assert s["free_virtual"] == [9, 2, 8, 5, 3]  # flush never touches the free list
    # data follows the moved pages: v7 now lives in p2, v6 in p3
    assert a.read([1, 4, 6, 7]) == [101, 104, 106, 107]
    assert s["kv"][1:5] == [101, 107, 106, 104]
    ok(a, WRITTEN)


def test_flush_max_moves_cap():
    a = _flush_setup(max_moves=1)
    a.flush()
    # walk stops after 1 move (7 -> 2): holes [3, 5, 7]; absorb 7 (= wm 8 - 1) -> wm 7;
    # 5 != 6 stops the absorb.
    s = a.snapshot()
    assert s["v2p"] == [0, 1, -1, -1, 4, -1, 6, 2, -1, -1, -1]
    assert s["p2v"] == [0, 1, 7, -1, 4, -1, 6, -1, -1, -1, -1]
    assert (s["watermark"], s["holes"]) == (7, [3, 5])
    assert a.read([1, 4, 6, 7]) == [101, 104, 106, 107]
    ok(a, WRITTEN)
    # second flush: dst 3, src 6 -> move; holes [5, 6]; cap; absorb 6, 5 -> wm 5
    a.flush()
    s = a.snapshot()
    assert s["v2p"] == UP_FLUSHED_V2P
    assert (s["watermark"], s["holes"]) == (5, [])
    assert a.read([1, 4, 6, 7]) == [101, 104, 106, 107]


def test_flush_max_moves_zero_only_sorts_and_absorbs():
    a = _flush_setup(max_moves=0)
    a.flush()
    s = a.snapshot()
    # sort [2, 3, 5, 8], absorb 8 -> wm 8, no moves
    assert (s["watermark"], s["holes"]) == (8, [2, 3, 5])
    assert s["v2p"] == [0, 1, -1, -1, 4, -1, 6, 7, -1, -1, -1]


def test_urgent_flush_ignores_max_moves():
    a = _flush_setup(max_moves=1)
    a.flush(urgent=True)
    s = a.snapshot()
    assert s["v2p"] == UP_FLUSHED_V2P
    assert s["p2v"] == UP_FLUSHED_P2V
    assert (s["watermark"], s["holes"], s["pending"]) == (5, [], [])
    assert s["watermark"] - 1 == s["live_pages"]  # span [1, 5) has live_pages pages


def test_flush_grow_down():
    a = _flush_setup(grow="down")
    # alloc(8): vp [1..8] -> phys [9 - 8 + 1 .. 9] = [2..9] (v_i -> p_{i+1}); wm 1.
    # free [2, 8, 5, 3] -> phys [3, 9, 6, 4] into holes in that order.
    assert a.snapshot()["holes"] == [3, 9, 6, 4]
    a.flush()
    # sort [3, 4, 6, 9]; absorb: frontier page is wm + 1 = 2, live -> nothing.
    # walk (dst = highest hole, src = lowest live):
    #   dst 9, src 2 (v1) -> move 2->9; holes [3, 4, 6] + 2 -> [2, 3, 4, 6]
    #   dst 6, src 5 (v4) -> move 5->6; holes [2, 3, 4, 5]
    #   dst 5, src 6 (v4, moved) >= 5: stop.
    # absorb: 2, 3, 4, 5 touch wm + 1 in turn -> wm 5, holes [].
    s = a.snapshot()
    assert s["v2p"] == [0, 9, -1, -1, 6, -1, 7, 8, -1, -1, -1]
    assert s["p2v"] == [0, -1, -1, -1, -1, -1, 4, 6, 7, 1, -1]
    assert (s["watermark"], s["holes"], s["pending"], s["live_pages"]) == (5, [], [], 4)
    assert a.read([1, 4, 6, 7]) == [101, 104, 106, 107]
    ok(a, WRITTEN)


def test_flush_grow_down_page_size_2_data_follows():
    a = pool(5, page_size=2, grow="down")  # wm 4
    # alloc(8): vp [1, 2, 3, 4] -> phys [1, 2, 3, 4]; tokens 2..9
    t = a.alloc(8)
    assert t == [2, 3, 4, 5, 6, 7, 8, 9]
    a.write(t, [20, 30, 40, 50, 60, 70, 80, 90])
    a.free([8, 9])  # page 4 -> hole p4
    a.flush()
    # sort [4]; absorb: wm + 1 = 1 is live. walk: dst 4, src 1 (v1) -> move 1->4; holes [1];
    # dst 1, src 2 >= 1 stop. absorb 1 -> wm 1.
    s = a.snapshot()
    assert s["v2p"] == [0, 4, 2, 3, -1, -1]
    assert s["p2v"] == [0, -1, 2, 3, 1, -1]
    assert s["watermark"] == 1
    # v1's tokens 2, 3 now live in physical slots 4*2 + 0, 4*2 + 1
    assert s["kv"][8:10] == [20, 30]
    assert a.read([2, 3, 4, 5, 6, 7]) == [20, 30, 40, 50, 60, 70]


# ---------------------------------------------------------------- flush with a forward in flight


def test_flush_with_unfired_forward_makes_pending_and_forward_stops_walk():
    a = _flush_setup()
    a.forward([1, 6])  # event 0 writes v1 and v6
    a.flush()
    # sort [2, 3, 5, 8]; absorb 8 -> wm 8, holes [2, 3, 5]
    # walk: dst 2, src 7 (v7 not written by the forward) -> move 7->2; the reader is in
    #       flight -> p7 goes to pending (event 0), not holes. holes [3, 5].
    #       dst 3, src = highest live = 6 (v6): written by the forward -> stop.
    # absorb: holes[-1] = 5 != 7 -> nothing.
    s = a.snapshot()
    assert s["pending"] == [[0, [7]]]
    assert s["holes"] == [3, 5]
    assert s["watermark"] == 8
    assert s["v2p"] == [0, 1, -1, -1, 4, -1, 6, 2, -1, -1, -1]
    assert s["p2v"] == [0, 1, 7, -1, 4, -1, 6, -1, -1, -1, -1]
    assert s["in_flight"] == {"id": 0, "fired": False, "pages": [1, 6]}
    assert a.read([1, 4, 6, 7]) == [101, 104, 106, 107]
    ok(a, WRITTEN)
    # a second flush while still unfired: pending stays, the walk stops at v6 again
    a.flush()
    assert a.snapshot() == s
    # fire, then flush: pending -> holes [3, 5, 7]; absorb 7 -> wm 7; walk dst 3, src 6 -> move,
    # holes [5, 6]; dst 5, src 4 stop; absorb 6, 5 -> wm 5.
    a.fire()
    a.flush()
    s = a.snapshot()
    assert s["pending"] == [] and s["holes"] == []
    assert s["v2p"] == UP_FLUSHED_V2P
    assert s["p2v"] == UP_FLUSHED_P2V
    assert s["watermark"] == 5
    assert a.read([1, 4, 6, 7]) == [101, 104, 106, 107]
    ok(a, WRITTEN)


def test_pending_pages_are_not_reusable_by_alloc():
    a = _flush_setup()
    a.forward([1, 6])
    a.flush()  # holes [3, 5], pending [(e0, [7])], wm 8 (see the test above)
    # capacity = room (9 - 7 = 2) + holes 2 = 4: alloc(4): vp [9, 2, 8, 5] (free list front),
    # phys holes [3, 5] + frontier [8, 9]; wm 10. p7 is not handed out.
    assert a.alloc(4) == [9, 2, 8, 5]
    s = a.snapshot()
    assert s["v2p"][9] == 3 and s["v2p"][2] == 5 and s["v2p"][8] == 8 and s["v2p"][5] == 9
    assert s["watermark"] == 10
    assert s["pending"] == [[0, [7]]]
    before = a.snapshot()
    assert a.alloc(1) is None  # room 0, holes 0: pending p7 does not count
    assert a.snapshot() == before
    ok(a)
    # a new forward completes event 0; the next flush returns p7 to holes and fills it
    a.forward([1])
    a.flush()
    s = a.snapshot()
    # pending -> holes [7]; absorb: 7 != 9; walk: dst 7, src 9 (v5, not written by event 1)
    # -> move 9->7; event 1 unfired -> p9 into pending for event 1; dst none -> stop.
    assert s["pending"] == [[1, [9]]]
    assert s["holes"] == []
    assert s["v2p"][5] == 7
    ok(a)


def test_urgent_flush_fires_forward_first():
    a = _flush_setup()
    a.forward([1, 6])
    a.flush(urgent=True)
    # fire first: no reader in flight, no forward stop -> same result as a plain full flush
    s = a.snapshot()
    assert s["in_flight"] == {"id": 0, "fired": True, "pages": [1, 6]}
    assert s["v2p"] == UP_FLUSHED_V2P
    assert s["p2v"] == UP_FLUSHED_P2V
    assert (s["holes"], s["pending"], s["watermark"]) == ([], [], 5)
    assert s["watermark"] - 1 == s["live_pages"]


def test_urgent_flush_returns_pending():
    a = _flush_setup()
    a.forward([1, 6])
    a.flush()
    assert a.snapshot()["pending"] == [[0, [7]]]
    a.flush(urgent=True)
    s = a.snapshot()
    assert (s["holes"], s["pending"], s["watermark"]) == ([], [], 5)
    assert s["v2p"] == UP_FLUSHED_V2P


# ---------------------------------------------------------------- lazy free of pages a forward writes


def _inflight_pool(lazy=True):
    # ps 2: alloc(8) -> pages v1..v4 at p1..p4 (tokens 2..9); forward writes v2 and v3 (tokens 4..7).
    a = pool(8, page_size=2, lazy=lazy)
    t = a.alloc(8)
    assert t == [2, 3, 4, 5, 6, 7, 8, 9]
    a.write(t, list(range(100, 108)))
    a.forward([4, 5, 6])
    return a


@pytest.mark.parametrize("tokens, page", [([4, 5], 2), ([6, 7], 3), ([2, 3, 6, 7], 3), ([8, 9, 4, 5], 2)])
def test_lazy_free_of_a_page_the_unfired_forward_writes_is_refused(tokens, page):
    # kvref rule: a lazy pool cannot free a page the unfired in-flight forward writes (it
    # would join holes, and the next alloc would hand it out while the forward writes it).
    a = _inflight_pool()
    before = a.snapshot()
    with pytest.raises(ContractViolation, match=rf"page {page} is written by the in-flight forward \(event 0\)"):
        a.free(tokens)
    assert a.snapshot() == before  # a run with a freeable page first changes nothing either


def test_lazy_free_of_pages_the_forward_does_not_write_joins_holes():
    a = _inflight_pool()
    a.free([8, 9, 2, 3])  # v4 (p4), v1 (p1): not written by event 0
    s = a.snapshot()
    assert s["holes"] == [4, 1] and s["pending"] == []
    assert s["free_virtual"] == [5, 6, 7, 4, 1]
    ok(a)


@pytest.mark.parametrize("complete", ["fire", "next_forward", "urgent_flush"])
def test_lazy_free_of_written_pages_once_the_forward_completed(complete):
    a = _inflight_pool()
    if complete == "fire":
        a.fire()
    elif complete == "next_forward":
        a.forward([2])  # fires event 0 first; event 1 writes v1 only
    else:
        a.flush(urgent=True)
    a.free([4, 5, 6, 7])
    s = a.snapshot()
    assert s["v2p"][2] == s["v2p"][3] == -1
    assert s["free_virtual"][-2:] == [2, 3]
    ok(a)


def test_eager_free_of_written_pages_is_not_refused():
    # eager pools keep ignoring the in-flight forward (their free may synchronise)
    a = _inflight_pool(lazy=False)
    a.free([4, 5])
    s = a.snapshot()
    # K = 1: vacated band [4, 5): survivor p4 (v4) moves into freed p2; wm 4
    assert s["v2p"][:6] == [0, 1, -1, 3, 2, -1] and s["watermark"] == 4
    assert a.read([8, 9]) == [106, 107]
    ok(a)


# ---------------------------------------------------------------- eager free


def test_eager_free_grow_up():
    a = _flush_setup_eager("up")
    # alloc(8): v_i -> p_i, wm 9. free [2, 8, 5, 3] (phys [2, 8, 5, 3]): K = 4, new wm 5.
    # vacated band [5, 9): survivors p6 (v6), p7 (v7). Freed pages in the kept band [1, 5): [2, 3].
    # lowest freed <- lowest survivor: 6 -> 2, 7 -> 3. p2v[5..8] = -1.
    s = a.snapshot()
    assert s["v2p"] == [0, 1, -1, -1, 4, -1, 2, 3, -1, -1, -1]
    assert s["p2v"] == [0, 1, 6, 7, 4, -1, -1, -1, -1, -1, -1]
    assert (s["watermark"], s["holes"], s["pending"]) == (5, [], [])
    assert s["free_virtual"] == [9, 2, 8, 5, 3]
    assert a.read([1, 4, 6, 7]) == [101, 104, 106, 107]
    assert s["kv"][1:5] == [101, 106, 107, 104]
    ok(a, WRITTEN)


def test_eager_free_grow_down():
    a = _flush_setup_eager("down")
    # alloc(8): v_i -> p_{i+1}, wm 1. free [2, 8, 5, 3] -> phys [3, 9, 6, 4]; K = 4, new wm 5.
    # vacated band [2, 6): survivors p2 (v1), p5 (v4). Freed in the kept band [6, 10): [6, 9].
    # 2 -> 6, 5 -> 9.
    s = a.snapshot()
    assert s["v2p"] == [0, 6, -1, -1, 9, -1, 7, 8, -1, -1, -1]
    assert s["p2v"] == [0, -1, -1, -1, -1, -1, 1, 6, 7, 4, -1]
    assert s["watermark"] == 5
    assert a.read([1, 4, 6, 7]) == [101, 104, 106, 107]
    ok(a, WRITTEN)


def _flush_setup_eager(grow):
    a = pool(10, grow=grow, lazy=False)
    a.alloc(8)
    a.write([1, 4, 6, 7], [101, 104, 106, 107])
    a.free([2, 8, 5, 3])
    return a


def test_eager_free_page_size_2_carries_data():
    a = pool(5, page_size=2, lazy=False)
    t = a.alloc(8)  # v1..4 -> p1..4, wm 5
    a.write(t, [20, 30, 40, 50, 60, 70, 80, 90])
    a.free([4, 5])  # page 2 (phys 2). K = 1, new wm 4, vacated [4, 5): survivor p4 (v4) -> 2
    s = a.snapshot()
    assert s["v2p"] == [0, 1, -1, 3, 2, -1]
    assert s["p2v"] == [0, 1, 4, 3, -1, -1]
    assert s["watermark"] == 4
    assert s["kv"][4:6] == [80, 90]  # v4's tokens 8, 9 in slots 2*2, 2*2 + 1
    assert a.read([2, 3, 6, 7, 8, 9]) == [20, 30, 60, 70, 80, 90]


def test_eager_free_without_survivors_only_moves_watermark():
    a = pool(6, lazy=False)
    a.alloc(4)  # wm 5
    a.free([4, 3])  # K = 2, vacated [3, 5) holds only freed pages
    s = a.snapshot()
    assert s["v2p"] == [0, 1, 2, -1, -1, -1, -1]
    assert s["p2v"] == [0, 1, 2, -1, -1, -1, -1]
    assert s["watermark"] == 3
    assert s["free_virtual"] == [5, 4, 3]


# ---------------------------------------------------------------- forward / read / translate views


def test_pool_read_table_and_translate_use_pool_tables():
    a = pool(6, page_size=2, grow="down", multiplier=4)
    a.alloc(4)  # vp [1, 2] -> phys [4, 5]; tokens 2..5
    out = [[-7] * 3]
    a.read_table(req_to_token=[[4, 5, 2, 3, -1, -1]], req_pool_indices=[0], seq_lens=[5], max_pages=3, out=out)
    # columns 0, 2, 4: tok 4 -> page 2 -> 5*4 = 20; tok 2 -> page 1 -> 4*4 = 16; -1 -> 0
    assert out == [[20, 16, 0]]
    # translate ignores the multiplier: t -> v2p[t//2]*2 + t%2
    assert a.translate([2, 3, 4, 5, 6, -1]) == [8, 9, 10, 11, 0, 0]
