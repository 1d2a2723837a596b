"""The grammar both generators share: op builders over a ``Chooser``.

A builder takes a chooser and what it may draw from (the pool config, live requests,
dead runs, the raw tables' bindings) and returns an op record. The seeded generator
(``generate``) backs the chooser with ``random.Random``; the Hypothesis state machine
(``strategies``) backs it with ``data.draw``, so Hypothesis shrinks the very same
choices. A fix to a read-table shape or a new contract violation is made here once,
and both generators agree on it.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Callable, Sequence

import kvref

from .ops import (
    TABLE_OPS,
    Alloc,
    Flush,
    Forward,
    Free,
    KAllocBind,
    KBind,
    KFreeUnbind,
    Op,
    Read,
    ReadTable,
    ReadTablePacked,
    Translate,
    Write,
)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
EXTREME_STAMPS = (INT64_MIN, INT64_MAX, -1, 0, 2**31, -(2**31) - 1)


class Chooser:
    """The choices a builder makes. Subclasses decide how (random or Hypothesis)."""

    def integer(self, lo: int, hi: int) -> int:  # inclusive
        raise NotImplementedError

    def pick(self, seq: Sequence):
        raise NotImplementedError

    def chance(self, p: float) -> bool:
        raise NotImplementedError

    def weighted(self, items: Sequence, weights: Sequence[float]):
        raise NotImplementedError

    def subset(self, seq: Sequence, k: int) -> list:
        """``k`` distinct elements, in the order drawn."""
        raise NotImplementedError

    def permutation(self, seq: Sequence) -> list:
        return self.subset(seq, len(seq))


class RandomChooser(Chooser):
    def __init__(self, rng: random.Random):
        self.rng = rng

    def integer(self, lo, hi):
        return self.rng.randint(lo, hi)

    def pick(self, seq):
        return self.rng.choice(seq)

    def chance(self, p):
        return self.rng.random() < p

    def weighted(self, items, weights):
        return self.rng.choices(items, weights)[0]

    def subset(self, seq, k):
        return self.rng.sample(list(seq), k)


class HypothesisChooser(Chooser):
    """Every choice is a Hypothesis draw, so failing examples shrink choice by choice:
    integers towards ``lo``, picks towards the first element, chances towards True."""

    def __init__(self, draw):
        """``draw``: a composite strategy's ``draw``, or ``data.draw`` of ``st.data()``."""
        from hypothesis import strategies as st

        self._draw, self.st = draw, st

    def integer(self, lo, hi):
        return self._draw(self.st.integers(lo, hi))

    def pick(self, seq):
        return self._draw(self.st.sampled_from(list(seq)))

    def chance(self, p):
        return p > 0 and (p >= 1 or self._draw(self.st.integers(0, 999)) < p * 1000)

    def weighted(self, items, weights):
        return self.pick([x for x, w in zip(items, weights) if w > 0])

    def subset(self, seq, k):
        return self._draw(self.st.permutations(list(seq)))[:k]


# ---- pool ops ------------------------------------------------------------------------------


def pages_of(tokens: Sequence[int], page_size: int) -> list[list[int]]:
    return [list(tokens[i:i + page_size]) for i in range(0, len(tokens), page_size)]


def whole_pages(tokens: Sequence[int], page_size: int) -> list[int]:
    """Every token of the pages ``tokens`` touch, pages ascending (a freed run as a later
    double free would name it)."""
    return [p * page_size + o for p in sorted({t // page_size for t in tokens}) for o in range(page_size)]


def _flat(pages) -> list[int]:
    return [t for p in pages for t in p]


ALLOC_MODES = ("usual", "long", "short", "full")


def alloc_op(ch: Chooser, config: kvref.PoolConfig, room: int, mode: str = "usual") -> Alloc:
    """alloc{n}: usually what fits; ``long`` up to all of it, ``short`` one or two pages,
    ``full`` exactly all of it or one page too many (alloc returns None)."""
    room = max(1, room)
    if mode == "long":
        pages = ch.integer(1, room)
    elif mode == "short":
        pages = ch.integer(1, 2)
    elif mode == "full":
        pages = ch.pick((room, room + 1, ch.integer(1, room)))
    else:
        pages = ch.integer(1, min(room, 6)) if ch.chance(0.85) else ch.integer(0, room + 1)
    return Alloc(pages * config.page_size)


def free_op(ch: Chooser, config: kvref.PoolConfig, tokens: Sequence[int]) -> tuple[Free, list[int]]:
    """free{tokens} of a live request, or of part of it (a prefix or a suffix of its
    pages, or any subset), shaped like a req_to_token row: pages in any order, the last
    page possibly partial. Returns the op and the tokens still live."""
    ps = config.page_size
    pages = pages_of(tokens, ps)
    gone, keep = pages, []
    if len(pages) > 1 and ch.chance(0.3):
        how = ch.pick(("prefix", "suffix", "subset"))
        if how == "subset":
            k = ch.integer(1, len(pages) - 1)
            idx = set(ch.subset(range(len(pages)), k))
        else:
            cut = ch.integer(1, len(pages) - 1)
            idx = set(range(cut)) if how == "prefix" else set(range(cut, len(pages)))
        gone = [p for i, p in enumerate(pages) if i in idx]
        keep = [p for i, p in enumerate(pages) if i not in idx]
    if ps == 1 or ch.chance(0.5):
        gone = ch.permutation(gone)
    run = _flat(gone)
    if ps > 1 and ch.chance(0.2):
        run = run[: len(run) - ch.integer(0, ps - 1)]
    return Free(run), _flat(keep)


def freeable(spec: kvref.Allocator, live: Sequence[Sequence[int]]) -> list:
    """The live requests a valid free may name: in a lazy pool, none with a page the
    unfired in-flight forward writes (kvref: freeing one is a contract violation)."""
    if not (spec.config.lazy and spec.reader_in_flight()):
        return list(live)
    ps, pinned = spec.config.page_size, spec.in_flight.pages
    return [r for r in live if not any(t // ps in pinned for t in r)]


URGENT = 0.3  # a flush's chance of being urgent (it fires the in-flight forward first)


def flush_op(ch: Chooser) -> Flush:
    return Flush(ch.chance(URGENT))


def forward_op(ch: Chooser, tokens: Sequence[int]) -> Forward:
    """forward{tokens}: the live tokens a forward pass writes (maybe none)."""
    tokens = sorted(set(tokens))
    return Forward(tuple(sorted(ch.subset(tokens, ch.integer(0, len(tokens)))))) if tokens else Forward(())


def write_op(ch: Chooser, tokens: Sequence[int], first_stamp: int = 1) -> Write:
    """write{tokens, stamps}: unique live tokens; stamps count up, or sit at int64's ends."""
    tokens = sorted(set(tokens))
    toks = ch.subset(tokens, ch.integer(0, min(16, len(tokens)))) if tokens else []
    if ch.chance(0.12):
        stamps = [ch.pick(EXTREME_STAMPS) for _ in toks]
    else:
        stamps = list(range(first_stamp, first_stamp + len(toks)))
    return Write(toks, stamps)


def read_op(ch: Chooser, tokens: Sequence[int]) -> Read:
    """read{tokens}: live tokens, repeats allowed."""
    tokens = sorted(set(tokens))
    return Read([ch.pick(tokens) for _ in range(ch.integer(0, 16))] if tokens else [])


NEGATIVE_REACH = 50  # the most negative token junk_id draws; a page table's red zones cover it (runner)


def junk_id(ch: Chooser, config: kvref.PoolConfig) -> int:
    """An id a forward pass may hand translate: padding (-1), negatives, past the pool."""
    return ch.pick((-1, -ch.integer(2, NEGATIVE_REACH), ch.integer(0, (config.num_pages + 3) * config.page_size),
                    ch.pick((INT64_MIN, INT64_MAX))))


def translate_op(ch: Chooser, config: kvref.PoolConfig, live: Sequence[int], dead: Sequence[int] = ()) -> Translate:
    """translate{loc}: live tokens mixed with padding, negatives, dead and far ids."""
    sources = [s for s in (sorted(set(live)), sorted(set(dead))) if s]
    loc = []
    for _ in range(ch.integer(0, 12)):
        if sources and ch.chance(0.7):
            loc.append(ch.pick(ch.pick(sources)))
        else:
            loc.append(junk_id(ch, config))
    return Translate(loc)


# ---- read tables -------------------------------------------------------------------------

BATCH_SIZES = (0, 1, 1, 2, 3, 5, 8, 17, 64)


def table_rows(ch: Chooser, live: Sequence[Sequence[int]], dead: Sequence[Sequence[int]], n: int) -> list[list[int]]:
    """``n`` req_to_token rows: live requests, dead runs (tombstoned pages read as entry
    0), empty rows; some tokens replaced by -1 (padding)."""
    rows = []
    for _ in range(max(n, 1)):
        source = ch.weighted(("live", "dead", "empty"), (75 if live else 0, 15 if dead else 0, 10))
        row = list(ch.pick(live if source == "live" else dead)) if source != "empty" else []
        if row and ch.chance(0.15):
            row[ch.integer(0, len(row) - 1)] = -1
        rows.append(row)
    return rows


def read_table_op(ch: Chooser, config: kvref.PoolConfig, live, dead=(), broken: bool = False) -> ReadTable:
    """read_table: live, dead and padded rows, short live prefixes, slack in max_pages and
    width; ``broken`` puts a seq_len past max_pages (a contract violation)."""
    ps = config.page_size
    bs = ch.pick(BATCH_SIZES)
    if broken:
        bs = max(bs, 1)
    rows = table_rows(ch, live, dead, ch.integer(1, max(1, min(bs, 6))))
    req_idx = [ch.integer(0, len(rows) - 1) for _ in range(bs)]
    lens = [len(rows[j]) if ch.chance(0.6) else ch.integer(0, len(rows[j])) for j in req_idx]
    max_pages = max([-(-n // ps) for n in lens] + [1]) + ch.pick((0, 0, 1, 5))
    width = max([max_pages * ps] + [len(r) for r in rows]) + ch.pick((0, 0, 3))
    if broken:
        b = ch.integer(0, bs - 1)
        lens[b] = max_pages * ps + ch.integer(1, ps + 8)
    return ReadTable(rows, req_idx, lens, max_pages, width, ch.chance(0.3))


def with_r2t_dtype(op: Op, dtype: str) -> Op:
    """``op`` with its ``req_to_token`` in ``dtype`` when it is a read table (one choice per
    sequence, made by the generator that owns it); any other op as it is."""
    if isinstance(op, TABLE_OPS) and op.r2t_dtype != dtype:
        return dataclasses.replace(op, r2t_dtype=dtype)
    return op


def read_table_packed_op(ch: Chooser, config: kvref.PoolConfig, live, dead=()) -> ReadTablePacked:
    """read_table_packed: the CSR form, with and without kv_start; indptr the running sum of
    seq_lens (SPEC §2: ``indptr[b + 1] - indptr[b] = seq_lens[b]``, no gaps)."""
    ps = config.page_size
    bs = ch.integer(1, 6)
    rows = table_rows(ch, live, dead, bs)
    req_idx = [ch.integer(0, len(rows) - 1) for _ in range(bs)]
    kv_start = None if ch.chance(0.5) else [ch.integer(0, ps) for _ in range(bs)]
    lens, indptr = [], [0]
    for b, j in enumerate(req_idx):
        start = 0 if kv_start is None else kv_start[b]
        n = ch.integer(0, max(0, len(rows[j]) - start))
        lens.append(n)
        indptr.append(indptr[-1] + n)
    width = max([len(r) for r in rows] + [1]) + ps
    # SPEC §2: indptr[bs] <= max_tokens, the capacity of the captured out (a little more, at times).
    max_tokens = max(indptr[-1], 1) + ch.pick((0, 0, 1, 5))
    return ReadTablePacked(rows, req_idx, lens, kv_start, indptr, max_tokens, width)


def packed_disagree_op(ch: Chooser, config: kvref.PoolConfig, live, dead=()) -> ReadTablePacked:
    """A read_table_packed whose seq_lens outgrow a row's indptr span (the last row's at
    times, so a kernel that trusts seq_lens writes past max_tokens): a contract violation
    SPEC §2 promises memory safety for."""
    op = read_table_packed_op(ch, config, live, dead)
    bs = len(op.seq_lens)
    b = ch.pick((bs - 1, ch.integer(0, bs - 1)))
    lens = list(op.seq_lens)
    lens[b] = op.indptr[b + 1] - op.indptr[b] + ch.integer(1, config.page_size + 8)
    return dataclasses.replace(op, seq_lens=tuple(lens))


# ---- kernel-level ops on raw tables ----------------------------------------------------------


def raw_op(ch: Chooser, config: kvref.PoolConfig, bound: dict[int, int]) -> Op:
    """A valid kernel-level op on the raw tables (``bound``: v -> p as the spec left them;
    ids unique, in [1, rows - 1))."""
    rows = config.table_rows
    ids = range(1, rows - 1)
    used_p = set(bound.values())
    free_v = [v for v in ids if v not in bound]
    free_p = [p for p in ids if p not in used_p]
    kinds = (["k_free_unbind"] if bound else []) + (["k_bind", "k_alloc_bind"] if free_v and free_p else [])
    kind = ch.weighted(kinds, [35 if k == "k_free_unbind" else 30 for k in kinds]) if kinds else "k_free_unbind"
    if kind == "k_free_unbind":
        keys = sorted(bound)
        return KFreeUnbind(ch.subset(keys, ch.integer(1, len(keys))) if keys else [])
    n = ch.integer(1, min(len(free_v), len(free_p), 9))
    v = ch.subset(free_v, n)
    if kind == "k_alloc_bind":
        free = set(free_p)
        runs = [p for p in free_p if all(p + i in free for i in range(n))]
        if runs:
            return KAllocBind(v, ch.pick(runs))
    return KBind(v, ch.subset(free_p, n))


def observe_raw(op: Op, bound: dict[int, int]) -> None:
    """Update a generator's view of the raw tables (v -> p) after the spec ran ``op``."""
    if isinstance(op, KFreeUnbind):
        for v in op.v:
            bound.pop(v, None)
        return
    for v, p in op.bound():
        for w in [w for w, q in bound.items() if q == p]:
            del bound[w]
        bound[v] = p


# ---- contract violations ---------------------------------------------------------------------


def _unaligned(ch, c, live, dead, bound):
    if c.page_size == 1:
        return None
    return Alloc(ch.integer(0, 4) * c.page_size + ch.integer(1, c.page_size - 1))


def _page_run(c: kvref.PoolConfig, page: int) -> Free:
    return Free(list(range(page * c.page_size, page * c.page_size + c.page_size)))


def _first_page_tokens(req: Sequence[int], ps: int) -> list[int]:
    return list(req[:ps])


VIOLATIONS: dict[str, Callable] = {
    "unaligned": _unaligned,
    "reserved": lambda ch, c, live, dead, bound: _page_run(c, ch.integer(0, c.min_page - 1)),
    "out_of_range": lambda ch, c, live, dead, bound: _page_run(c, ch.integer(c.num_pages, c.num_pages + 4)),
    "duplicate": lambda ch, c, live, dead, bound: live and Free(2 * _first_page_tokens(ch.pick(live), c.page_size)),
    "double_free": lambda ch, c, live, dead, bound: dead and Free(ch.pick(dead)),
    "write_dead": lambda ch, c, live, dead, bound: dead and Write(ch.pick(dead)[:1], [7]),
    "read_dead": lambda ch, c, live, dead, bound: dead and Read(ch.pick(dead)[:2]),
    "forward_dead": lambda ch, c, live, dead, bound: dead and Forward(ch.pick(dead)[:1]),
    "write_twice": lambda ch, c, live, dead, bound: live and Write(2 * [ch.pick(live)[0]], [1, 2]),
    "read_table_short": lambda ch, c, live, dead, bound: read_table_op(ch, c, live or [[]], dead, broken=True),
    "packed_seq_lens": lambda ch, c, live, dead, bound: packed_disagree_op(ch, c, live or [[]], dead),
    "raw_out_of_range": lambda ch, c, live, dead, bound: KBind(
        [ch.pick((0, c.table_rows - 1, c.table_rows + ch.integer(0, 8), -ch.integer(1, 8)))],
        [ch.integer(1, c.table_rows - 2)]),
    "raw_duplicate": lambda ch, c, live, dead, bound: _raw_duplicate(ch, c),
    "raw_double_free": lambda ch, c, live, dead, bound: bound and KFreeUnbind(2 * [ch.pick(sorted(bound))]),
}


def _raw_duplicate(ch, c):
    v = ch.integer(1, c.table_rows - 2)
    return KBind([v, v], [1, min(2, c.table_rows - 2)])


def violation_op(ch: Chooser, config: kvref.PoolConfig, live, dead, bound: dict[int, int]) -> tuple[str, Op]:
    """(kind, op): an op the spec must refuse (ContractViolation). ``dead`` holds only
    runs of pages that are not live now; kinds whose material is missing are not drawn."""
    live, dead = [list(r) for r in live if r], [list(r) for r in dead if r]
    kinds = list(VIOLATIONS)
    while kinds:
        kind = ch.pick(kinds)
        op = VIOLATIONS[kind](ch, config, live, dead, bound)
        if op:
            return kind, op
        kinds.remove(kind)
    raise AssertionError("shapes: the 'reserved' violation always applies")
