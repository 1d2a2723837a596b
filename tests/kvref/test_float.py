"""kvref's float pool (docs/spec.md §6, ``kvref/float_pool.py``): a chain's middle member, its
span placed and grown between its neighbours, holes first, parked and transparent when empty,
moved only on demand; and the relief ladder's second rung, which asks it to make room."""

from __future__ import annotations

import pytest

import kvref
from kvref import ContractViolation, PoolConfig
from kvref.config import ChainConfig
from kvref.invariants import check_chain


def three(total=48, epp=(2, 3, 2), lazy=(True, True), ps=1, rules=frozenset()) -> kvref.Allocator:
    """Up END, float, down END; each member's floor the sink's (3 bytes: pages from 2, 1, 2)."""
    mins = [-(-max(epp) // e) for e in epp]
    flt = PoolConfig(num_pages=total // epp[1], min_page=mins[1], page_size=ps, grow="float", lazy=False)
    down = PoolConfig(num_pages=total // epp[2], min_page=mins[2], page_size=ps, grow="down", lazy=lazy[1])
    return kvref.Allocator(PoolConfig(num_pages=total // epp[0], min_page=mins[0], page_size=ps, lazy=lazy[0],
                                      chain=ChainConfig(total, epp, (flt, down))), rules)


def test_an_empty_float_is_parked_and_transparent_and_its_first_alloc_takes_the_middle():
    ch = three().chain
    f = ch.members[1]
    assert (f.low, f.high) == (16, 16) and ch.transparent(1)
    assert ch.gap(0) == 48 - 4  # the up end sees through it to the buffer's top
    assert ch.region(1) == (2, 16)  # page 2 is the first past the up end's frontier (byte 4)
    assert ch.alloc(1, 4) == [1, 2, 3, 4]
    assert (f.low, f.high) == (7, 11)  # (16 - 2 - 4) // 2 pages of gap below, the rest above
    assert ch.frontiers(1) == (21, 33) and not ch.transparent(1)
    assert ch.gap(0) == 21 - 4 and ch.capacity(0)[0] == 8  # the up end now stops at the float
    check_chain(ch)


def test_a_float_grows_toward_its_larger_gap_and_falls_back_to_the_other():
    ch = three().chain
    f = ch.members[1]
    ch.alloc(1, 4)  # [7, 11): 5 pages of gap each side
    ch.alloc(1, 2)  # equal gaps: the high side first
    assert (f.low, f.high) == (7, 13)
    ch.alloc(1, 2)  # now the low side is larger
    assert (f.low, f.high) == (5, 13)
    ch.alloc(0, 4)  # the up end grows to byte 12: the float's low gap is 1 page
    assert ch.region(1) == (4, 16) and f.gaps() == (1, 3)
    ch.alloc(1, 3)  # 3 > the low gap: the high side takes them
    assert (f.low, f.high) == (5, 16)
    assert ch.alloc(1, 2) is None  # neither side holds 2 more
    check_chain(ch)


def test_holes_go_first_from_the_two_ends_of_the_list_in_turn():
    ch = three().chain
    f = ch.members[1]
    tokens = ch.alloc(1, 8)  # pages 5..12
    ch.free(1, [tokens[1]])
    ch.free(1, [tokens[6]])
    ch.free(1, [tokens[3]])
    assert f.holes == [6, 11, 8] and f.live_pages == 5
    before = (f.low, f.high)
    ch.alloc(1, 1)  # from the low end of the sorted holes
    assert f.holes == [8, 11]
    ch.alloc(1, 1)  # then from the high end
    assert f.holes == [8]
    ch.alloc(1, 1)  # all that is left: taken as listed
    assert f.holes == [] and (f.low, f.high) == before
    check_chain(ch)


def test_a_float_that_loses_its_last_page_is_parked_and_a_flush_absorbs_only_edges():
    ch = three().chain
    f = ch.members[1]
    tokens = ch.alloc(1, 6)  # pages 6..11
    ch.free(1, [tokens[0]])  # an edge page: a hole until a flush absorbs it
    ch.free(1, [tokens[3]])  # an interior one
    assert (f.low, f.high) == (6, 12) and sorted(f.holes) == [6, 9]
    ch.set_gate(1, False)
    ch.flush(1, False)  # absorption moves nothing, so a closed gate does not stop it
    assert (f.low, f.high) == (7, 12) and f.holes == [9]
    ch.free(1, [t for i, t in enumerate(tokens) if i not in (0, 3)])
    assert (f.low, f.high) == (16, 16) and f.holes == [] and ch.transparent(1)
    check_chain(ch)


def test_make_room_moves_the_fewest_boundary_pages_to_far_holes_then_past_the_far_edge():
    ch = three().chain
    f = ch.members[1]
    tokens = ch.alloc(1, 6)  # pages 6..11: 4 pages of gap below, 4 above
    ch.write(1, tokens, [100 + i for i in range(6)])
    ch.free(1, [tokens[1]])  # a hole at page 7
    ch.forward(1, [tokens[5]])
    opened = ch.make_room(1, "high", 6 * 3)  # 6 pages above: 2 more than the 4 there
    assert opened == 6 * 3
    assert f.in_flight.event.fired  # it settled the forward before moving
    assert (f.low, f.high) == (5, 10)  # page 11 went to the hole at 7, page 10 to fresh page 5
    assert f.holes == [] and f.live_pages == 5
    assert ch.read(1, [tokens[i] for i in (0, 2, 3, 4, 5)]) == [100, 102, 103, 104, 105]
    check_chain(ch)


def test_make_room_behind_a_closed_gate_or_past_what_the_region_holds_changes_nothing():
    ch = three().chain
    f = ch.members[1]
    tokens = ch.alloc(1, 6)
    ch.forward(1, tokens[:1])
    before = f.snapshot()
    ch.set_gate(1, False)
    assert ch.make_room(1, "low", 30) == 4 * 3
    assert f.snapshot() == before  # not even the forward settled
    ch.set_gate(1, True)
    assert ch.make_room(1, "low", (14 - 6) * 3 + 1) == 4 * 3  # more than the region can free
    assert f.snapshot()["watermark"] == before["watermark"] and f.in_flight.event.fired
    assert ch.make_room(1, "low", 13 * 3) == 4 * 3  # the leapfrog needs the whole region free below
    with pytest.raises(ContractViolation, match="END pool"):
        ch.make_room(0, "low", 3)


def test_make_room_leapfrogs_every_live_page_when_the_ask_exceeds_them():
    ch = three().chain
    f = ch.members[1]
    tokens = ch.alloc(1, 3)  # pages 7..9
    ch.write(1, tokens, [7, 8, 9])
    assert ch.make_room(1, "low", 9 * 3) >= 9 * 3
    assert (f.low, f.high) == (13, 16) and ch.read(1, tokens) == [7, 8, 9]
    check_chain(ch)


def test_compact_holes_packs_the_live_pages_away_from_the_retreating_side():
    ch = three().chain
    f = ch.members[1]
    tokens = ch.alloc(1, 6)  # pages 6..11
    ch.write(1, tokens, list(range(6)))
    ch.free(1, [tokens[2], tokens[4]])
    assert ch.compact(1, "high") == 2  # pages 9 and 11 to 8 and 9
    assert (f.low, f.high) == (6, 10) and f.holes == []
    assert ch.read(1, [tokens[i] for i in (0, 1, 3, 5)]) == [0, 1, 3, 5]
    check_chain(ch)


def test_the_ladders_second_rung_asks_the_float_to_open_the_side_facing_the_short_end():
    ch = three().chain
    ch.alloc(1, 6)  # float pages 6..11: bytes [18, 36); the up end may grow to byte 18
    assert ch.capacity(0)[0] == 7
    up = ch.alloc(0, 10)  # 3 pages past the gap: the float must move 2 of its pages up (and a slack)
    assert up is not None and "ladder|make_room" in ch.feature_log
    assert ch.frontiers(0)[1] <= ch.frontiers(1)[0]
    check_chain(ch)


def test_a_failed_alloc_leaves_every_member_as_it_was_and_the_sglang_ladder_does_not():
    def build(rules):
        ch = three(rules=rules).chain
        tokens = ch.alloc(1, 4)  # float pages 7..10
        ch.free(1, tokens[:1])  # an edge hole the next flush absorbs
        return ch

    ch = build(frozenset())
    before = ch.snapshot()
    assert ch.alloc(0, 40) is None  # hopeless: the whole buffer would not hold it
    assert ch.snapshot() == before and ch.members[1].holes == [7]
    sgl = build(frozenset({"ladder_flushes_when_short"}))
    assert sgl.alloc(0, 40) is None
    assert sgl.members[1].holes == [] and sgl.members[1].low == 8  # the ladder's flush of the float stayed


def test_a_short_float_flushes_both_neighbours_and_the_sglang_rule_only_the_low_one():
    for rules, flushed in ((frozenset(), {0, 2}), (frozenset({"float_ladder_low_only"}), {0})):
        ch = three(rules=rules).chain
        ch.relieve(1)
        assert [e for e in ch.feature_log if e.startswith("ladder|")] == \
               ["ladder|neighbour|gate=open"] * len(flushed), rules
