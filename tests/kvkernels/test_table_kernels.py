"""bind / alloc_bind / free_unbind against kvref.kernels, on every tier."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvref import kernels as spec

FIXTURE_OK = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _lists(t: torch.Tensor) -> list[int]:
    return t.cpu().tolist()


def _assert_tables(tier, v2p_t, p2v_t, v2p, p2v, where=""):
    assert _lists(v2p_t) == v2p, f"v2p diverges from the spec {where}"
    assert _lists(p2v_t) == p2v, f"p2v diverges from the spec {where}"


@FIXTURE_OK
@given(data=st.data())
def test_op_sequence_matches_spec(tier, monkeypatch, data):
    """Random alloc_bind / bind / free_unbind sequences, tables diffed whole after each op."""
    tier.shrink_blocks(monkeypatch, ids=4)  # N > 4 spans several programs
    rows = data.draw(st.integers(4, 40), label="rows")
    v2p, p2v = [-1] * rows, [-1] * rows
    v2p[0] = p2v[0] = 0
    v2p_t, p2v_t = tier.t(v2p), tier.t(p2v)
    ids = list(range(1, rows - 1))
    for step in range(data.draw(st.integers(1, 5), label="ops")):
        bound_v = [v for v in ids if v2p[v] != -1]
        free_v = [v for v in ids if v2p[v] == -1]
        free_p = [p for p in ids if p2v[p] == -1]
        kinds = ["alloc_bind", "bind"] if free_v and free_p else []
        kinds += ["free_unbind"] if bound_v else []
        if not kinds:
            break
        kind = data.draw(st.sampled_from(kinds), label=f"op{step}")
        if kind == "free_unbind":
            vs = data.draw(st.lists(st.sampled_from(bound_v), min_size=1, unique=True), label="v")
            want = spec.free_unbind(v2p, p2v, vs)
            got = tier.k.free_unbind_inplace(tier.t(vs), v2p_t, p2v_t)
            assert got.dtype == torch.int64 and _lists(got) == want
        elif kind == "bind":
            k = data.draw(st.integers(1, min(len(free_v), len(free_p))), label="k")
            vs = data.draw(st.permutations(free_v), label="v")[:k]
            ps = data.draw(st.permutations(free_p), label="p")[:k]
            spec.bind(v2p, p2v, vs, ps)
            assert tier.k.bind_inplace(tier.t(vs), tier.t(ps), v2p_t, p2v_t) is None
        else:
            # alloc_bind takes an ascending run of free physical pages, as the allocator's fast path does.
            k = data.draw(st.integers(1, len(free_v)), label="k")
            starts = [s for s in ids if all(s + i in free_p for i in range(k))]
            if not starts:
                continue
            start = data.draw(st.sampled_from(starts), label="start")
            vs = data.draw(st.permutations(free_v), label="v")[:k]
            want = spec.alloc_bind(v2p, p2v, vs, start)
            got = tier.k.alloc_bind_inplace(tier.t(vs), v2p_t, p2v_t, start)
            assert got.dtype == torch.int64 and _lists(got) == want
        _assert_tables(tier, v2p_t, p2v_t, v2p, p2v, f"after {kind} at step {step}")


@pytest.mark.parametrize("n", [1, 5, 37])
def test_alloc_bind_many_programs(tier, monkeypatch, pages, n):
    tier.shrink_blocks(monkeypatch, ids=4)
    rows = 2 * n + 4
    v2p, p2v = pages.initial(rows)
    vs = pages.rng.sample(range(1, rows - 1), n)
    start = pages.rng.randint(1, rows - 1 - n)
    v2p_t, p2v_t = tier.t(v2p), tier.t(p2v)
    want = spec.alloc_bind(v2p, p2v, vs, start)
    got = tier.k.alloc_bind_inplace(tier.t(vs), v2p_t, p2v_t, start)
    assert _lists(got) == want == list(range(start, start + n))
    _assert_tables(tier, v2p_t, p2v_t, v2p, p2v)


@pytest.mark.parametrize("n", [1, 6, 41])
def test_free_unbind_many_programs(tier, monkeypatch, pages, n):
    tier.shrink_blocks(monkeypatch, ids=4)
    rows = n + 10
    v2p, p2v = pages.bound(rows, fill=0.95)
    bound = [v for v in range(1, rows - 1) if v2p[v] != -1]
    vs = pages.rng.sample(bound, n)
    v2p_t, p2v_t = tier.t(v2p), tier.t(p2v)
    want = spec.free_unbind(v2p, p2v, vs)
    got = tier.k.free_unbind_inplace(tier.t(vs), v2p_t, p2v_t)
    assert _lists(got) == want
    assert all(p != -1 for p in want)
    _assert_tables(tier, v2p_t, p2v_t, v2p, p2v)


@pytest.mark.parametrize("n", [1, 7, 29])
def test_bind_many_programs(tier, monkeypatch, pages, n):
    tier.shrink_blocks(monkeypatch, ids=4)
    rows = n + 6
    v2p, p2v = pages.initial(rows)
    vs = pages.rng.sample(range(1, rows - 1), n)
    ps = pages.rng.sample(range(1, rows - 1), n)
    v2p_t, p2v_t = tier.t(v2p), tier.t(p2v)
    spec.bind(v2p, p2v, vs, ps)
    tier.k.bind_inplace(tier.t(vs), tier.t(ps), v2p_t, p2v_t)
    _assert_tables(tier, v2p_t, p2v_t, v2p, p2v)


def test_ids_need_not_be_int64_or_contiguous(tier, pages):
    """Ids are read through .to(int64) in both tiers; a strided view is made contiguous."""
    rows = 20
    v2p, p2v = pages.initial(rows)
    vs = [3, 9, 4, 12]
    v2p_t, p2v_t = tier.t(v2p), tier.t(p2v)
    strided = tier.t([x for v in vs for x in (v, 0)], dtype=torch.int32)[::2]
    want = spec.alloc_bind(v2p, p2v, vs, 5)
    got = tier.k.alloc_bind_inplace(strided, v2p_t, p2v_t, 5)
    assert _lists(got) == want
    _assert_tables(tier, v2p_t, p2v_t, v2p, p2v)


def test_empty_input_is_a_no_op(tier, pages):
    v2p, p2v = pages.bound(12)
    v2p_t, p2v_t = tier.t(v2p), tier.t(p2v)
    empty = tier.t([])
    got = tier.k.alloc_bind_inplace(empty, v2p_t, p2v_t, 3)
    assert got.shape == (0,) and got.dtype == torch.int64 and got.device.type == tier.device.type
    got = tier.k.free_unbind_inplace(empty, v2p_t, p2v_t)
    assert got.shape == (0,) and got.dtype == torch.int64 and got.device.type == tier.device.type
    assert tier.k.bind_inplace(empty, empty, v2p_t, p2v_t) is None
    _assert_tables(tier, v2p_t, p2v_t, v2p, p2v)
