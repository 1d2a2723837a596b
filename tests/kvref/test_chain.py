"""kvref's chains (docs/spec.md §6): the geometry, the ladder, the gates, the memo, and
property runs of the chain generator holding invariant 4.10 and "a failed alloc changes no
pool" through thousands of sequences."""

from __future__ import annotations

import random

import pytest

import kvref
from fuzz.engine.chain_gen import ChainGenerator, is_chain_seed, random_chain_config
from fuzz.engine.chain_ops import ChainAlloc
from fuzz.engine.generate import OpGenerator, sequence_params
from fuzz.engine.spec_side import SpecSide
from kvref import ContractViolation, InvariantViolation, PoolConfig
from kvref.config import ChainConfig
from kvref.invariants import check_chain


def chain_config(total=48, epp=(2, 3), ps=(1, 1), lazy=(True, True), min_page=None) -> PoolConfig:
    """Two END pools; each member's reserved floor the sink's unless ``min_page`` says."""
    min_page = min_page or tuple(-(-max(epp) // e) for e in epp)
    peer = PoolConfig(num_pages=total // epp[1], min_page=min_page[1], page_size=ps[1], grow="down", lazy=lazy[1])
    return PoolConfig(num_pages=total // epp[0], min_page=min_page[0], page_size=ps[0], lazy=lazy[0],
                      chain=ChainConfig(total, epp, (peer,)))


# ---- configuration ---------------------------------------------------------------------


def test_a_chain_config_round_trips_and_a_plain_one_keeps_its_old_json():
    c = chain_config()
    assert PoolConfig.from_json(c.to_json()) == c
    plain = PoolConfig(num_pages=8)
    assert "chain" not in plain.to_json() and PoolConfig.from_json(plain.to_json()) == plain
    assert c.members[1].grow == "down" and plain.members == (plain,)


_FLOAT = PoolConfig(num_pages=16, grow="float", lazy=False)


@pytest.mark.parametrize("bad, why", [
    (dict(peers=(PoolConfig(num_pages=15, grow="down"),)), "num_pages=15"),
    (dict(peers=(PoolConfig(num_pages=16, grow="up"),)), "must grow down"),
    (dict(bytes_per_page=(2,)), "1 entries for 2 members"),
    (dict(peers=(_FLOAT,) * 2 + (PoolConfig(num_pages=16, grow="down"),), bytes_per_page=(2, 3, 3, 3)),
     "at most 3 members"),
    (dict(peers=(PoolConfig(num_pages=16, grow="down"), _FLOAT), bytes_per_page=(2, 3, 3)), "must grow float"),
    (dict(peers=(_FLOAT,)), "must grow down"),
    (dict(bytes_per_page=(2, 6), peers=(PoolConfig(num_pages=8, grow="down"),)), "padding sink"),
    (dict(total_bytes=0), "positive int"),
])
def test_a_chain_that_cannot_be_is_refused_naming_why(bad, why):
    fields = dict(total_bytes=48, bytes_per_page=(2, 3), peers=(PoolConfig(num_pages=16, grow="down"),))
    fields.update(bad)
    with pytest.raises(ContractViolation, match=why):
        PoolConfig(num_pages=fields["total_bytes"] // 2 if fields["total_bytes"] else 4, min_page=2,
                   chain=ChainConfig(**fields))


def test_a_float_frees_eagerly_and_never_stands_alone():
    with pytest.raises(ContractViolation, match="never lazily"):
        PoolConfig(num_pages=8, grow="float", lazy=True)
    with pytest.raises(ContractViolation, match="middle member"):
        kvref.Allocator(PoolConfig(num_pages=8, grow="float", lazy=False))


# ---- frontiers, capacity, ladder, gates, memo --------------------------------------------


def test_frontiers_meet_exactly_where_the_bytes_run_out():
    a = kvref.Allocator(chain_config(total=48, epp=(2, 3)))
    ch = a.chain
    assert ch.alloc(1, 10) is not None  # pool 1: pages 6..15, bytes [18, 48)
    assert ch.frontiers(1) == (18, 48)
    room = ch.fresh(0)[0]  # pool 0 (pages from 2, past the 3-byte sink): bytes [4, 18) free, 7 pages of 2
    assert room == 7 and a.index_room() > room
    assert ch.alloc(0, room + 1) is None
    assert ch.alloc(0, room) is not None
    assert ch.frontiers(0)[1] == ch.frontiers(1)[0] and ch.gap(0) == 0
    check_chain(ch)


def test_the_ladder_flushes_the_neighbour_never_the_short_pool():
    a = kvref.Allocator(chain_config())
    ch = a.chain
    up = ch.alloc(0, 9)  # pages 2..10: bytes [4, 22)
    down = ch.alloc(1, 8)  # pages 8..15: bytes [24, 48)
    assert up and down and ch.fresh(0)[0] == 1  # a gap of 2 bytes: one page of pool 0
    ch.free(1, down[-4:])  # pool 1's top pages become holes; an urgent flush moves its frontier pages there
    ch.free(0, up[:2])  # pool 0's own holes, which its available already counts
    available, schedulable, _ = ch.capacity(0)
    assert schedulable > available
    before0 = ch.members[0].snapshot()
    assert ch.alloc(0, schedulable) is not None
    assert ch.members[1].holes == [] and ch.members[1].pending == []  # the neighbour was flushed urgently
    assert "ladder|neighbour|gate=open" in ch.feature_log
    assert before0["holes"] and ch.members[0].holes == []  # its own holes went to the alloc, not to a flush


def test_a_closed_gate_takes_the_neighbours_holes_out_of_the_credit_and_keeps_its_pages_still():
    ch = kvref.Allocator(chain_config()).chain
    ch.alloc(0, 10)
    down = ch.alloc(1, 8)
    ch.free(1, down[-3:])
    open_caps = ch.capacity(0)
    ch.set_gate(1, False)
    closed_caps = ch.capacity(0)
    assert closed_caps[1] == closed_caps[0] < open_caps[1]  # memo keyed on the gate: no stale credit
    before = ch.members[1].snapshot()
    ch.flush(1, True)
    assert ch.members[1].snapshot() == before  # nothing moved, nothing absorbed, nothing fired
    assert ch.alloc(0, open_caps[1]) is None  # no ladder through a closed gate
    check_chain(ch)


def test_joint_capacity_counts_the_shared_band_once():
    ch = kvref.Allocator(chain_config(total=48, epp=(2, 3))).chain
    ch.alloc(0, 4)
    ch.alloc(1, 4)
    assert ch.gap(0) == ch.gap(1) == 48 - 12 - 12  # pool 0 up to byte 12, pool 1 from byte 36
    assert ch.joint() == ch.gap(0)


def test_a_stale_memo_breaks_invariant_10():
    ch = kvref.Allocator(chain_config()).chain
    ch.capacity(0)
    key = ch.memo_key(0)
    ch._memo[key] = (999, 999, 999)
    with pytest.raises(InvariantViolation) as info:
        check_chain(ch)
    assert info.value.name == "chain_memo"


def test_overlapping_frontiers_break_invariant_10():
    ch = kvref.Allocator(chain_config(total=48, epp=(2, 3))).chain
    ch.members[0].watermark = 20  # bytes [2, 40): past pool 1's low frontier once it has pages
    ch.alloc(1, 6)
    with pytest.raises(InvariantViolation) as info:
        check_chain(ch)
    assert info.value.name in ("chain_frontiers", "partition", "span")


def test_a_pool_the_chain_lacks_is_a_contract_violation():
    ch = kvref.Allocator(chain_config()).chain
    for pool in (2, -1, True):
        with pytest.raises(ContractViolation, match="member"):
            ch.alloc(pool, 1)


# ---- one member: exactly the single pool ---------------------------------------------------


def test_a_chain_of_one_member_is_the_single_pool():
    """Plain sequences on a pool alone and on the same pool as the only member of a chain:
    the same state after every op (its room never binds: its pages span the buffer)."""
    for seed in range(60):
        config, scenario, rng = sequence_params(seed)
        if config.chain is not None:
            continue
        one = PoolConfig(**{**config.to_json(), "chain": ChainConfig(config.num_pages * 3, (3,))})
        alone, member = SpecSide(config), SpecSide(one)
        gen = OpGenerator(rng, config, scenario)
        for _ in range(80):
            op = gen.next_op(alone.spec)
            out = alone.apply(op)
            got = member.apply(op)
            assert (out.result, type(out.error)) == (got.result, type(got.error)), (seed, op)
            assert alone.spec.snapshot() == member.spec.snapshot(), (seed, op)
            gen.observe(op, out)
        check_chain(member.spec.chain)


# ---- properties ------------------------------------------------------------------------------


def _drive(seeds, n_ops: int) -> dict:
    """The chain generator's sequences on kvref: invariant 4.10 after every op, and every failed
    or refused op leaving every pool of the chain unchanged. Returns what the ops did."""
    seen = {"failed_allocs": 0, "refused": 0, "ops": 0, "features": set()}
    for seed in seeds:
        rng = random.Random(seed)
        config = random_chain_config(rng)
        side = SpecSide(config)
        chain = side.spec.chain
        gen = ChainGenerator(rng, config, rng.choice(("chain-meet", "chain-gates", "chain-holes")), contract_rate=0.05)
        for _ in range(n_ops):
            op = gen.next_op(side.spec)
            before = chain.snapshot()
            out = side.apply(op)
            if out.error is not None or (isinstance(op, ChainAlloc) and out.result is None):
                assert chain.snapshot() == before, (seed, op)
                seen["refused" if out.error is not None else "failed_allocs"] += 1
            check_chain(chain)
            gen.observe(op, out)
            seen["ops"] += 1
        seen["features"] |= set(chain.feature_log)
    return seen


def test_chains_hold_every_invariant_through_many_sequences():
    seen = _drive(range(150), 60)
    assert seen["failed_allocs"] > 50 and seen["refused"] > 25, seen  # the frontiers met, contracts broke
    assert {"alloc|relieved", "alloc|short", "ladder|neighbour|gate=closed", "frontier|0"} <= seen["features"]


@pytest.mark.slow
def test_chains_hold_every_invariant_through_thousands_of_sequences():
    seen = _drive(range(150, 2150), 25)
    assert seen["ops"] == 2000 * 25


def test_chain_seeds_are_a_fifth_of_the_seeds():
    share = sum(is_chain_seed(s) for s in range(5000)) / 5000
    assert 0.17 < share < 0.23



def test_behind_a_closed_gate_an_urgent_flush_waits_for_nothing_under_every_rule():
    """SGLang's urgent flush settles the forward only when it moves (rule
    ``urgent_settles_when_moving``); behind a closed gate it moves nothing, so an unfired
    pending batch stays pending (SGLang drains only fired ones there). kvref once settled it."""
    for rules in (frozenset(), frozenset({"urgent_settles_when_moving"})):
        ch = kvref.Allocator(chain_config(epp=(2, 2)), rules).chain
        down = ch.members[1]
        ch.alloc(1, 4)
        ch.forward(1, [])  # a reader in flight that writes nothing
        ch.free(1, [4])  # page 23, furthest from the frontier (20): the walk moves page 20 into it
        ch.flush(1, False)
        assert [pages for _, pages in down.pending] == [[20]], rules
        ch.set_gate(1, False)
        ch.flush(1, True)
        assert [pages for _, pages in down.pending] == [[20]] and not down.in_flight.event.fired, rules
