"""SPEC.md §4 as named checks over a state snapshot (``Allocator.snapshot()`` form).

Checks take the snapshot, not an allocator, so the same code judges the spec and any
target that can produce a snapshot. Invariants 8 (rejected calls change nothing) and 9
(lazy and eager agree) compare two states and live in ``check_unchanged`` and
``check_lazy_eager_agree``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping

from .config import PoolConfig
from .errors import InvariantViolation


def _span(cfg: PoolConfig, wm) -> range:
    if cfg.is_float:  # a float's watermark is the pair [low, high] (docs/spec.md §6)
        return range(wm[0], wm[1])
    return range(cfg.min_page, wm) if cfg.grow == "up" else range(wm + 1, cfg.num_pages)


def _bound(cfg: PoolConfig, snap: Mapping) -> dict[int, int]:
    v2p = snap["v2p"]
    return {v: v2p[v] for v in range(cfg.min_page, cfg.num_pages) if v2p[v] != -1}


def _twice(items: list[int]) -> list[int]:
    """The values that occur more than once, sorted (the common case, none, costs one set)."""
    if len(set(items)) == len(items):
        return []
    return sorted(v for v, n in Counter(items).items() if n > 1)


def check_sentinels(cfg: PoolConfig, snap: Mapping, written=None) -> None:
    for name in ("v2p", "p2v"):
        t = snap[name]
        if len(t) != cfg.table_rows:
            raise InvariantViolation("sentinels", f"{name} has {len(t)} rows, expected {cfg.table_rows}")
        if t[0] != 0:
            raise InvariantViolation("sentinels", f"{name}[0] = {t[0]}, expected 0")
        if t[-1] != -1:
            raise InvariantViolation("sentinels", f"{name}[{len(t) - 1}] (sentinel) = {t[-1]}, expected -1")


def check_bijection(cfg: PoolConfig, snap: Mapping, written=None) -> None:
    v2p, p2v = snap["v2p"], snap["p2v"]
    lo, hi = cfg.min_page, cfg.num_pages
    for name, t in (("v2p", v2p), ("p2v", p2v)):
        for i in range(1, lo):
            if t[i] != -1:
                raise InvariantViolation("bijection", f"reserved row {name}[{i}] = {t[i]}, expected -1")
        for i in range(lo, hi):
            if t[i] != -1 and not lo <= t[i] < hi:
                raise InvariantViolation("bijection", f"{name}[{i}] = {t[i]} is neither -1 nor a page in [{lo}, {hi})")
    for v in range(lo, hi):
        p = v2p[v]
        if p != -1 and p2v[p] != v:
            raise InvariantViolation("bijection", f"v2p[{v}] = {p} but p2v[{p}] = {p2v[p]}")
    for p in range(lo, hi):
        v = p2v[p]
        if v != -1 and v2p[v] != p:
            raise InvariantViolation("bijection", f"p2v[{p}] = {v} but v2p[{v}] = {v2p[v]}")


def check_span(cfg: PoolConfig, snap: Mapping, written=None) -> None:
    span = _span(cfg, snap["watermark"])
    for v, p in _bound(cfg, snap).items():
        if p not in span:
            raise InvariantViolation("span", f"virtual page {v} is bound to physical {p}, outside the span {span}")
    p2v = snap["p2v"]
    for p in range(cfg.min_page, cfg.num_pages):
        if p not in span and p2v[p] != -1:
            raise InvariantViolation("span", f"p2v[{p}] = {p2v[p]} outside the span {span}")


def check_partition(cfg: PoolConfig, snap: Mapping, written=None) -> None:
    span = _span(cfg, snap["watermark"])
    bound = sorted(_bound(cfg, snap).values())
    pending = [p for _, pages in snap["pending"] for p in pages]
    if cfg.is_float:
        if pending:
            raise InvariantViolation("partition", f"a float has pending pages {pending}: it never moves lazily")
        if not bound and (snap["holes"] or list(span)):
            raise InvariantViolation("partition", f"a float with no live page is parked empty, but its span is "
                                                  f"{span} with holes {snap['holes']}")
    elif not cfg.lazy and (snap["holes"] or pending):
        raise InvariantViolation("partition", f"eager pool has holes {snap['holes']} / pending {pending}")
    everything = bound + list(snap["holes"]) + pending
    dups = _twice(everything)
    if dups:
        raise InvariantViolation("partition", f"pages counted twice among bound/holes/pending: {dups}")
    if set(everything) != set(span):
        missing = sorted(set(span) - set(everything))
        extra = sorted(set(everything) - set(span))
        raise InvariantViolation("partition", f"span {span} != bound+holes+pending (missing {missing}, outside {extra})")
    if snap["live_pages"] != len(bound):
        raise InvariantViolation("partition", f"live_pages = {snap['live_pages']} but {len(bound)} pages are bound")


def check_free_virtual(cfg: PoolConfig, snap: Mapping, written=None) -> None:
    counts = list(snap["free_virtual"]) + list(_bound(cfg, snap))
    dups = _twice(counts)
    if dups:
        raise InvariantViolation("free_virtual", f"virtual pages both free and bound, or listed twice: {dups}")
    if set(counts) != set(range(cfg.min_page, cfg.num_pages)):
        missing = sorted(set(range(cfg.min_page, cfg.num_pages)) - set(counts))
        extra = sorted(set(counts) - set(range(cfg.min_page, cfg.num_pages)))
        raise InvariantViolation("free_virtual", f"free + bound virtual pages miss {missing} / hold foreign {extra}")


def check_watermark(cfg: PoolConfig, snap: Mapping, written=None) -> None:
    wm = snap["watermark"]
    if cfg.is_float:
        low, high = wm
        parked = low == high == cfg.num_pages
        if not parked and not cfg.min_page <= low < high <= cfg.num_pages:
            raise InvariantViolation("watermark", f"float span [{low}, {high}) is neither parked at {cfg.num_pages} "
                                                  f"nor inside [{cfg.min_page}, {cfg.num_pages})")
        return
    lo, hi = (cfg.min_page, cfg.num_pages) if cfg.grow == "up" else (cfg.min_page - 1, cfg.num_pages - 1)
    if not lo <= wm <= hi:
        raise InvariantViolation("watermark", f"watermark {wm} outside [{lo}, {hi}] (grow {cfg.grow})")


def check_data(cfg: PoolConfig, snap: Mapping, written: Mapping[int, int] | None = None) -> None:
    if not written:
        return
    ps, v2p, kv = cfg.page_size, snap["v2p"], snap["kv"]
    for t, stamp in written.items():
        p = v2p[t // ps]
        if p == -1:
            continue
        got = kv[p * ps + t % ps]
        if got != stamp:
            raise InvariantViolation("data", f"token {t} (physical page {p}) holds {got}, last written {stamp}")


INVARIANTS: dict[str, Callable] = {
    "sentinels": check_sentinels,
    "bijection": check_bijection,
    "span": check_span,
    "partition": check_partition,
    "free_virtual": check_free_virtual,
    "watermark": check_watermark,
    "data": check_data,
}


def check_all(cfg: PoolConfig, snap: Mapping, written: Mapping[int, int] | None = None) -> None:
    """Raise InvariantViolation for the first invariant the snapshot breaks."""
    for check in INVARIANTS.values():
        check(cfg, snap, written)


def check_unchanged(before: Mapping, after: Mapping) -> None:
    """Invariant 8: a failed alloc or a rejected call leaves the state identical."""
    for key in before:
        if before[key] != after[key]:
            raise InvariantViolation("unchanged", f"a rejected call changed {key!r}")


def live_data(cfg: PoolConfig, snap: Mapping, written: Mapping[int, int]) -> dict[int, int]:
    """{token: stamp} for written tokens whose page is still bound, read through the tables."""
    ps, v2p, kv = cfg.page_size, snap["v2p"], snap["kv"]
    return {t: kv[v2p[t // ps] * ps + t % ps] for t in written if v2p[t // ps] != -1}


def check_lazy_eager_agree(cfg_lazy: PoolConfig, lazy: Mapping, cfg_eager: PoolConfig, eager: Mapping,
                           written: Mapping[int, int]) -> None:
    """Invariant 9, after an urgent flush of the lazy pool: same live pages, same data."""
    bl, be = set(_bound(cfg_lazy, lazy)), set(_bound(cfg_eager, eager))
    if bl != be:
        raise InvariantViolation("lazy_eager", f"live virtual pages differ: lazy-only {sorted(bl - be)}, eager-only {sorted(be - bl)}")
    dl, de = live_data(cfg_lazy, lazy, written), live_data(cfg_eager, eager, written)
    if dl != de:
        t = next(t for t in dl if dl[t] != de.get(t))
        raise InvariantViolation("lazy_eager", f"token {t}: lazy holds {dl[t]}, eager holds {de.get(t)}")


CHAIN_INVARIANTS = ("chain_frontiers", "chain_memo")  # docs/spec.md §6, beside each member's §4


def check_chain(chain) -> None:
    """Invariant 10, of a chain (docs/spec.md §6): every member's §4 invariants; the byte frontiers
    inside the buffer (``0 <= low <= high <= total`` per member that is not an empty float) and
    in chain order (each such member's low frontier at or above the high frontier of the one
    below it); every memoised capacity equal to a fresh recompute at the state it was memoised
    for."""
    spans = []
    for i, m in enumerate(chain.members):
        check_all(m.config, m.snapshot(), m.written)
        if chain.transparent(i):
            continue  # an empty float holds no bytes
        low, high = chain.frontiers(i)
        if not 0 <= low <= high <= chain.total_bytes:
            raise InvariantViolation("chain_frontiers", f"pool {i}'s bytes [{low}, {high}) leave the buffer "
                                                        f"[0, {chain.total_bytes})")
        spans.append((i, low, high))
    for (a, _, high), (b, low, _) in zip(spans, spans[1:]):
        if low < high:
            raise InvariantViolation("chain_frontiers", f"pool {b}'s low frontier {low} lies below pool "
                                                        f"{a}'s high frontier {high}: their bytes overlap")
    key = chain.state_key()
    for (pool, state, gates), value in chain.memo().items():
        if state == key and chain.memo_key(pool)[2] == gates and tuple(value) != chain.fresh(pool):
            raise InvariantViolation("chain_memo", f"pool {pool}: memoised capacity {list(value)}, "
                                                   f"recomputed {list(chain.fresh(pool))}")
