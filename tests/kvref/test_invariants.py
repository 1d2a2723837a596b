"""SPEC.md §4: each named check fires on a snapshot broken in exactly the way it guards,
and passes on valid states; check_unchanged; check_lazy_eager_agree."""

from __future__ import annotations

import copy

import pytest

from kvref import INVARIANTS, Allocator, InvariantViolation, PoolConfig, check_all
from kvref.invariants import check_lazy_eager_agree, check_unchanged

CFG = PoolConfig(num_pages=8, min_page=2, page_size=1, grow="up", lazy=True)


def base():
    """A valid lazy grow-up state, built by hand-known steps:
    alloc(4): v2..5 -> p2..5, wm 6; free([3]) -> holes [3]; stamps on tokens 2, 4, 5."""
    a = Allocator(CFG)
    assert a.alloc(4) == [2, 3, 4, 5]
    a.free([3])
    a.write([2, 4, 5], [20, 40, 50])
    s = a.snapshot()
    assert s["v2p"] == [0, -1, 2, -1, 4, 5, -1, -1, -1]
    assert s["p2v"] == [0, -1, 2, -1, 4, 5, -1, -1, -1]
    assert (s["holes"], s["watermark"], s["live_pages"]) == ([3], 6, 3)
    assert s["free_virtual"] == [6, 7, 3]
    return s, {2: 20, 4: 40, 5: 50}


def test_all_named_checks_are_covered():
    assert set(INVARIANTS) == {"sentinels", "bijection", "span", "partition", "free_virtual", "watermark", "data"}


def _corrupt(fn, cfg=CFG):
    s, w = base()
    s = copy.deepcopy(s)
    w = dict(w)
    fn(s, w)
    return cfg, s, w


def _set(key, idx, val):
    def f(s, w):
        s[key][idx] = val
    return f


def _move_v5_to_p6(s, w):
    # a consistent rebinding outside the span [2, 6): bijection holds, span does not
    s["v2p"][5] = 6
    s["p2v"][6] = 5
    s["p2v"][5] = -1
    s["holes"] = [3, 5]


CORRUPTIONS = {
    "sentinels": [
        _set("v2p", 0, 1),
        _set("p2v", 0, -1),
        _set("v2p", 8, 3),  # last row must stay -1
        _set("p2v", 8, 0),
        lambda s, w: s["v2p"].append(-1),  # wrong row count
    ],
    "bijection": [
        _set("p2v", 2, 4),  # p2v row pointing at the wrong v: v2p[2] = 2 but p2v[2] = 4
        _set("v2p", 2, 4),  # v2p[2] = 4 but p2v[4] = 4
        _set("p2v", 3, 6),  # p2v[3] = 6 but v2p[6] = -1
        _set("v2p", 1, 7),  # reserved row written
        _set("v2p", 6, -2),  # unbound row not exactly -1
    ],
    "span": [
        _move_v5_to_p6,
    ],
    "partition": [
        lambda s, w: s["holes"].append(3),  # a hole duplicated
        _set("holes", 0, 4),  # a hole that is also bound (and p3 missing)
        lambda s, w: s["holes"].clear(),  # a span page in none of bound/holes/pending
        lambda s, w: s["pending"].append([0, [3]]),  # p3 both hole and pending
        lambda s, w: s.update(live_pages=4),  # live_pages != bound pages
    ],
    "free_virtual": [
        lambda s, w: s["free_virtual"].append(6),  # duplicated
        lambda s, w: s["free_virtual"].remove(7),  # missing
        lambda s, w: s["free_virtual"].append(4),  # bound and free
        lambda s, w: s["free_virtual"].append(1),  # reserved page in the free list
    ],
    "data": [
        _set("kv", 4, 41),  # a stamp changed
        lambda s, w: w.update({2: 21}),  # model says 21, pool holds 20
    ],
}


@pytest.mark.parametrize("name,corrupt", [(n, c) for n, cs in CORRUPTIONS.items() for c in cs])
def test_named_check_fires(name, corrupt):
    cfg, s, w = _corrupt(corrupt)
    with pytest.raises(InvariantViolation) as e:
        INVARIANTS[name](cfg, s, w)
    assert e.value.name == name
    # each corruption breaks only its own invariant: check_all reports that name
    with pytest.raises(InvariantViolation) as e:
        check_all(cfg, s, w)
    assert e.value.name == name


@pytest.mark.parametrize("grow,wm", [("up", 1), ("up", 9), ("down", 8), ("down", 0)])
def test_watermark_check_fires(grow, wm):
    # grow up: min_page <= wm <= num_pages = [2, 8]; grow down: [min_page - 1, num_pages - 1] = [1, 7]
    cfg = PoolConfig(num_pages=8, min_page=2, grow=grow)
    s = Allocator(cfg).snapshot()
    s["watermark"] = wm
    with pytest.raises(InvariantViolation) as e:
        INVARIANTS["watermark"](cfg, s)
    assert e.value.name == "watermark"
    if (grow, wm) in (("up", 1), ("down", 8)):
        # the span is empty, so only the watermark check can tell
        with pytest.raises(InvariantViolation) as e:
            check_all(cfg, s)
        assert e.value.name == "watermark"


@pytest.mark.parametrize("grow,wm", [("up", 2), ("up", 8), ("down", 1), ("down", 7)])
def test_watermark_bounds_are_inclusive(grow, wm):
    cfg = PoolConfig(num_pages=8, min_page=2, grow=grow)
    s = Allocator(cfg).snapshot()
    s["watermark"] = wm
    INVARIANTS["watermark"](cfg, s)


def test_eager_pool_with_holes_breaks_partition():
    cfg = PoolConfig(num_pages=8, min_page=2, lazy=False)
    a = Allocator(cfg)
    a.alloc(3)  # p2..4, wm 5
    s = a.snapshot()
    check_all(cfg, s)
    s["holes"] = [4]
    s["p2v"][4] = -1
    s["v2p"][4] = -1
    s["free_virtual"].append(4)
    s["live_pages"] = 2
    with pytest.raises(InvariantViolation) as e:
        check_all(cfg, s)
    assert e.value.name == "partition"


def test_checks_pass_on_valid_states():
    s, w = base()
    check_all(CFG, s, w)
    for grow in ("up", "down"):
        for lazy in (True, False):
            for ps in (1, 3):
                cfg = PoolConfig(num_pages=9, min_page=2, page_size=ps, grow=grow, lazy=lazy, max_moves=1)
                a = Allocator(cfg)
                check_all(cfg, a.snapshot())
                t = a.alloc(5 * ps)
                a.write(t, list(range(100, 100 + len(t))))
                written = dict(zip(t, range(100, 100 + len(t)), strict=True))
                a.free(t[ps:2 * ps] + t[3 * ps:4 * ps])
                for page in (1, 3):
                    for o in range(ps):
                        written.pop(t[page * ps + o])
                check_all(cfg, a.snapshot(), written)
                a.forward(t[:ps])
                a.flush()
                check_all(cfg, a.snapshot(), written)
                a.flush(urgent=True)
                check_all(cfg, a.snapshot(), written)


def test_check_unchanged():
    s, _ = base()
    check_unchanged(s, copy.deepcopy(s))
    for key, mutate in [
        ("free_virtual", lambda x: x["free_virtual"].reverse()),  # order matters
        ("holes", lambda x: x["holes"].append(6)),
        ("watermark", lambda x: x.update(watermark=7)),
        ("kv", lambda x: x["kv"].__setitem__(0, 9)),
        ("in_flight", lambda x: x.update(in_flight={"id": 0, "fired": False, "pages": []})),
    ]:
        t = copy.deepcopy(s)
        mutate(t)
        with pytest.raises(InvariantViolation) as e:
            check_unchanged(s, t)
        assert e.value.name == "unchanged"
        assert key in str(e.value)


def _same_trace(grow, ps):
    pools = []
    for lazy in (True, False):
        cfg = PoolConfig(num_pages=10, page_size=ps, grow=grow, lazy=lazy, max_moves=1)
        a = Allocator(cfg)
        t = a.alloc(8 * ps)
        a.write(t, [1000 + i for i in range(len(t))])
        pages = [t[i * ps:(i + 1) * ps] for i in range(8)]
        a.free(pages[1] + pages[7] + pages[4] + pages[2])  # virtual pages 2, 8, 5, 3
        a.flush()
        u = a.alloc(2 * ps)  # both get virtual pages 9, 2 (free list front)
        a.write(u, [2000 + i for i in range(len(u))])
        a.free(pages[0])
        a.flush(urgent=True)
        pools.append((cfg, a))
    written = {t[i]: 1000 + i for i in range(len(t)) if t[i] // ps in (4, 6, 7)}
    written.update({u[i]: 2000 + i for i in range(len(u))})
    return pools, written


@pytest.mark.parametrize("grow", ["up", "down"])
@pytest.mark.parametrize("ps", [1, 2])
def test_lazy_eager_agree(grow, ps):
    ((cl, lazy), (ce, eager)), written = _same_trace(grow, ps)
    sl, se = lazy.snapshot(), eager.snapshot()
    # live virtual pages in both: 4, 6, 7 (first alloc) and 9, 2 (second)
    assert {v for v in range(1, 10) if sl["v2p"][v] != -1} == {2, 4, 6, 7, 9}
    assert {v for v in range(1, 10) if se["v2p"][v] != -1} == {2, 4, 6, 7, 9}
    check_all(cl, sl, written)
    check_all(ce, se, written)
    check_lazy_eager_agree(cl, sl, ce, se, written)
    # after the urgent flush the lazy pool is as compact as the eager one
    assert (sl["holes"], sl["pending"]) == ([], [])
    assert sl["watermark"] == se["watermark"]


def test_lazy_eager_disagree_is_detected():
    ((cl, lazy), (ce, eager)), written = _same_trace("up", 1)
    sl, se = lazy.snapshot(), eager.snapshot()
    bad = copy.deepcopy(se)
    bad["kv"][bad["v2p"][4]] += 1  # eager holds different data for token 4
    with pytest.raises(InvariantViolation) as e:
        check_lazy_eager_agree(cl, sl, ce, bad, written)
    assert e.value.name == "lazy_eager"
    eager.free([4])
    with pytest.raises(InvariantViolation) as e:
        check_lazy_eager_agree(cl, sl, ce, eager.snapshot(), written)
    assert e.value.name == "lazy_eager"
