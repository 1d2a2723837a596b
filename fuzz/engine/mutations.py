"""The mutations that edit a corpus entry's choice stream (``streams.py``) into a guided plan.

Mutations at op marks are op-level edits: **delete** an op's draws, **insert** fresh ones,
**repeat** an op as nudged copies, **splice** two entries at op marks, **swap** an op's kind (its
second draw is the kind's), **nudge** one draw a small step, re-draw a **knob** or a **config**
draw. Because the stream is replayed op-aligned, an edit to one op leaves the later ops' draws
where they were.

The mutations that **reach the cause**: a feature is reached by an op reading state that
earlier ops built (a read table reads the rows allocs made), and editing the op that reached it
varies the read but not the state. ``resize`` grows or shrinks one of the allocs that fed it
(``streams.data_flow``) to a size next to a block boundary (the launch knobs' blocks and their
multiples), or to the row length a trip feature needs (``aim_row``), checked on a **shadow run**
(the generator against the spec alone, no kernel, ~5 ms per 100 ops) that it got that size;
``clone`` repeats such an alloc, so the read table has two such rows; ``room`` gives the pool
its most pages (a third trip needs a longer row than most pools hold); ``realign`` moves a packed
row's ``kv_start`` inside its page.
"""

from __future__ import annotations

import random

from .knobs import knob_module
from .ops import Alloc, ReadTable
from .shapes import TABLE_OPS
from .spec_features import table_lengths
from .streams import flat, marks_of, segments

MUTATIONS = ("delete", "insert", "repeat", "splice", "swap", "nudge", "knob", "config", "resize", "clone", "room")
REALIGN_TRIES = 8  # shadow runs per realign: kv_start draws of the packed table tried
# a config draw changes every op after it: seldom; a knob changes launches, not ops (the state is kept);
# resize/clone only where data flow is known
WEIGHTS = (1, 1, 3, 1, 1, 3, 2, 0.5, 4, 1, 1.5)
FED_RESIZE = 3  # resize's weight times this where the focus is a table op whose rows' allocs are known
ROOM_DRAWS = ((1, 5), (2, 9))  # random_config's num_pages: a choice of five, plus randint(0, 8)
RESIZE_TRIES = 8  # shadow runs per resize (~5 ms each): a branch taken, its range read back, the size set


def _set(draw: list, value: int) -> None:
    n = draw[1]
    draw[0] = (min(max(value, 0), n - 1) + 0.5) / n


def nudge(seg: list[list], rng: random.Random) -> None:
    """Move one draw of ``seg`` a small step: an integer draw by 1 to 3 units (a size or an
    index one to three over, across a block boundary when it sat next to one), a float by a
    small fraction (a chance near its threshold flips)."""
    if not seg:
        return
    draw = seg[rng.randrange(len(seg))]
    u, n = draw
    if n > 1:
        _set(draw, int(u * n) + rng.choice((-3, -2, -1, -1, 1, 1, 2, 3)))
    else:
        draw[0] = min(max(u + rng.choice((-1, 1)) * rng.choice((1 / 1024, 1 / 256, 1 / 64, 1 / 16)), 0.0), 0.999999)


def room(segs) -> bool:
    """Give the pool the most pages its config draws allow (``ROOM_DRAWS`` set to their largest):
    a row long enough for a third trip of a small block needs more pages than most pools have,
    and an alloc's size is drawn relative to the room it has, so the op-aligned draws after it
    keep their ops, longer. False where there is nothing to raise."""
    cfg = segs[0] if segs else []
    if len(cfg) <= max(i for i, _ in ROOM_DRAWS) or any(cfg[i][1] != n for i, n in ROOM_DRAWS):
        return False
    if all(int(cfg[i][0] * n) == n - 1 for i, n in ROOM_DRAWS):
        return False
    for i, n in ROOM_DRAWS:
        _set(cfg[i], n - 1)
    return True


def boundary_target(pages: int, knobs: dict | None, rng: random.Random) -> int:
    """A size next to ``pages`` at a block boundary: k x each small knob value or product of two
    (the blocks a launch strides by at fuzzing scale, and a column stride: a block times the
    programs per row) minus one, exactly, plus one; or a page or two over. Mostly larger (rows
    long enough for another trip are what blind draws seldom make): one of the three nearest
    above, or (half the time) any up to three times the size: the next trip of a strided loop
    is a whole stride away, more than the nearest boundaries reach."""
    small = sorted({v for v in (knobs or {}).values() if isinstance(v, int) and 1 < v <= 64})
    blocks = sorted({*small, *(a * b for a in small for b in small if a * b <= 64)}) or [4, 8, 16]
    near = {k * b + d for b in blocks for k in range(1, 6) for d in (-1, 0, 1)} | {pages + d for d in (-2, -1, 1, 2)}
    near = {m for m in near if m >= 1 and m != pages}
    above = sorted(m for m in near if m > pages)
    ups = above[:3] if rng.random() < 0.5 else [m for m in above if m <= 3 * pages + 8] or above[:3]
    downs = sorted((m for m in near if m < pages), reverse=True)[:3]
    return rng.choice(ups if ups and (not downs or rng.random() < 0.75) else downs)


def row_target(goal, rng: random.Random, trips: int | None = None, edge: str | None = None) -> int:
    """The row length (pages) at which the program that left trip feature ``goal`` ([row length,
    short of one more trip, BLOCK, trips, stride]: ``features._trip_features``) makes ``trips``
    trips (one more than it did by default) with its last block ``edge``: "full" (the block ends
    at the row's last page), "partial" (1 to BLOCK - 1 pages into it), None (either, as drawn).
    The kill of a third-trip bug is such a conjunction (3+ trips AND a partial last block): one
    more trip alone is a partial edge three times in four at BLOCK 4, a full one once."""
    n, short, block, have = goal[:4]
    base = n + short - 1  # where trip ``have + 1`` begins: the comparison's other operand
    if trips is not None and trips != have + 1 and len(goal) > 4 and trips >= 1:
        base += (trips - have - 1) * goal[4]
    if edge == "full":
        return base + block
    if edge == "partial" and block > 1:
        return base + 1 + rng.randrange(block - 1)
    return base + 1 + rng.randrange(max(1, block))


def smallest(mod) -> dict:
    """Every launch knob at its smallest value (``FUZZ_KNOBS``): a strided loop makes more trips
    as its block and its programs per row shrink, and a stone whose stride spans its row (the
    grid covers it whatever its length: one trip by construction) needs them (``shrink``)."""
    return {name: min(choices) for name, choices in sorted(mod.FUZZ_KNOBS.items())}


def _size_alloc(segs, a: int, cur: int, target: int, retry: bool, rng: random.Random) -> bool:
    """Set alloc op ``a``'s size draw towards ``target`` pages (it is ``cur`` now): its widest
    integer draw; a size outside that draw's range needs another branch of the op's chances
    (``alloc_op``'s "usually what fits"), so the floats before it are re-drawn (also on a
    ``retry`` that moved nothing), and more room is given when it should grow. False: no size draw."""
    seg = segs[a + 1]
    ints = [i for i in range(2, len(seg)) if seg[i][1] > 1]  # past the contract and kind draws
    if not ints:
        return False
    i = max(ints, key=lambda i: seg[i][1])
    want = target - (cur - int(seg[i][0] * seg[i][1]))
    if retry or not 0 <= want < seg[i][1]:
        for j in range(2, len(seg)):  # another branch: near either end, a chance's threshold (0.85, 0.3)
            if j != i:  # is then crossed either way
                seg[j][0] = rng.choice((0.0, 0.9)) + 0.1 * rng.random()
    if 0 <= want < seg[i][1]:
        _set(seg[i], want)
    if retry and cur < target:  # not reached by the draw alone: more room, then the same draws
        room(segs)
    return True


def resize(segs, entry: dict, rng: random.Random, shadow, focus: int | None, goal=None):
    """Segments with one alloc that fed the op at ``focus`` (any alloc of the entry without one)
    set to ``boundary_target`` pages, or None where it cannot be; three times in four with a
    ``goal`` ([row length, the length aimed at]: ``row_target``), ``aim_row`` instead. Each try
    is checked on the shadow run (``shadow(stream, marks)``: (ops, config, the stream as drawn)),
    which also says the draw's new range."""
    pages = {int(k): v for k, v in (entry.get("pages") or {}).items()}
    fed = (entry.get("feeds") or {}).get(str(focus)) if focus is not None else None
    if not pages or shadow is None:
        return None
    if goal and fed and rng.random() < 0.75:
        return aim_row(segs, pages, [a for a in fed if a in pages], rng, shadow, focus, goal)
    a = rng.choice(fed or sorted(pages))
    cur = pages.get(a)
    if cur is None or a + 1 >= len(segs):
        return None
    start = cur
    target = boundary_target(cur, entry.get("knobs"), rng)
    for attempt in range(RESIZE_TRIES):
        if not _size_alloc(segs, a, cur, target, attempt > 0 and (cur == start or attempt == 1), rng):
            return None
        ops, config, drawn = shadow(flat(segs), marks_of(segs))
        segs = segments(drawn)
        if a >= len(ops) or not isinstance(ops[a], Alloc):
            return None
        cur = ops[a].n // config.page_size
        if cur == target:
            return segs
    return segs if abs(target - cur) < abs(target - start) else None


def realign(segs, rng: random.Random, shadow, focus: int | None, goal):
    """Segments in which the packed table at ``focus``, whose row of ``goal[0]`` tokens made 2+ trips
    from a page's first token, has a row as long starting inside its page: one of its ``kv_start``
    draws set to 1 .. page_size - 1, its rows and requests kept, checked on the shadow run (None:
    no try does). An offset a later trip loses needs both, which a corpus reaches apart."""
    if shadow is None or focus is None or not goal or focus + 1 >= len(segs):
        return None
    def packed(ops):  # the table at focus, where it is a packed one with kv_start
        op = ops[focus] if focus < len(ops) else None
        return op if op is not None and op.kind == "read_table_packed" and op.kv_start is not None else None

    ops, config, _ = shadow(flat(segs), marks_of(segs))
    ps, was = config.page_size, packed(ops)
    if ps < 2 or was is None:
        return None
    draws = [i for i, d in enumerate(segs[focus + 1]) if i >= 2 and d[1] == ps + 1]
    for i in rng.sample(draws, min(len(draws), REALIGN_TRIES)):
        trial = [[list(d) for d in seg] for seg in segs]
        _set(trial[focus + 1][i], rng.randrange(1, ps))
        ops, config, drawn = shadow(flat(trial), marks_of(trial))
        if (op := packed(ops)) is not None and (op.rows, op.req_idx) == (was.rows, was.req_idx) and any(
                s % ps and n >= goal[0] for s, n in zip(op.kv_start, table_lengths(op, ps))):
            return segments(drawn)
    return None


def aim_row(segs, pages: dict, fed: list, rng: random.Random, shadow, focus: int, goal):
    """Segments in which the table op at ``focus`` reads a row of exactly ``goal[1]`` (pages, or
    tokens for the packed form), from one that read ``goal[0]``, or None: the fed alloc nearest
    that row's length is grown or shrunk by the difference, and the shadow run's table op says
    how far its rows still are, so the next try corrects by that error (a row may be a prefix
    of its alloc, or a packed one count tokens); after ``RESIZE_TRIES // 2`` tries that leave
    the row where it was, the next alloc. libFuzzer's CMP tracing, closed in a loop."""
    if not fed or focus + 1 >= len(segs):
        return None
    ops, config, drawn = shadow(flat(segs), marks_of(segs))
    if focus >= len(ops) or not isinstance(ops[focus], TABLE_OPS):
        return None
    unit = 1 if isinstance(ops[focus], ReadTable) else config.page_size  # tokens per length unit, per page
    n, target = goal
    order = sorted(fed, key=lambda a: (abs(pages[a] * unit - n), rng.random()))
    row, a, stuck = n, order.pop(0), 0
    cur = base = ops[a].n // config.page_size if isinstance(ops[a], Alloc) else pages[a]
    want = cur + -(-(target - row) // unit)
    for attempt in range(RESIZE_TRIES):
        if a + 1 >= len(segs) or not _size_alloc(segs, a, cur, want, attempt > 0 and stuck > 0, rng):
            return None
        ops, config, drawn = shadow(flat(segs), marks_of(segs))
        segs = segments(drawn)
        if max(a, focus) >= len(ops) or not isinstance(ops[a], Alloc) or not isinstance(ops[focus], TABLE_OPS):
            return None
        lens = table_lengths(ops[focus], config.page_size)
        if target in lens:
            return segs
        moved = ops[a].n // config.page_size - base
        now = min(lens, key=lambda m: abs(m - (n + moved * unit)), default=n)  # the row, where its alloc took it
        stuck = stuck + 1 if now == row or ops[a].n // config.page_size == cur else 0
        row, cur = now, ops[a].n // config.page_size
        if stuck >= RESIZE_TRIES // 2 and order:
            a, stuck, row = order.pop(0), 0, n
            cur = base = ops[a].n // config.page_size if isinstance(ops[a], Alloc) else pages[a]
        want = cur + -(-(target - row) // unit)
    return None


def mutate(entry: dict, other: dict, rng: random.Random, kernels, focus: int | None = None,
           shadow=None, rare_knobs: dict | None = None, goal=None,
           only: str | None = None) -> tuple[list[float], list[int], dict | None, list[str]]:
    """(stream, its op marks, knobs, the mutations applied): one to three of ``MUTATIONS``. ``focus``: the op
    that first reached the feature the entry was picked for (its ``where``): most edits then
    land on that op or the few before it, since an edit anywhere in a 200-op stream rarely
    touches it; ``repeat`` inserts nudged copies of it right after it, each another try at a
    neighbouring shape from nearly the same state; ``resize`` and ``clone`` edit the allocs
    that made the rows it read (``data_flow``), which is what changes the state it saw.
    ``knob`` changes one launch knob, or (half the time) takes ``rare_knobs``, the combination
    the corpus holds fewest of: the same ops under the launch shapes least tried. ``goal``: the
    length of the row that reached the picked trip feature and the length aimed at (``resize``).
    ``shrink`` (only asked for, never drawn): the knobs at their ``smallest``.
    ``only``: that one mutation alone (a frontier plan's aimed resize: another edit in the same
    plan, a delete before the focus, undoes what it aimed at), drawn ones where it cannot apply."""
    segs = segments(entry)
    knobs = dict(entry.get("knobs") or {}) or None
    done = []

    def op_index() -> int:  # a segment index of an op (1..): near the focus most of the time
        if focus is not None and focus + 1 < len(segs) and rng.random() < 0.75:
            return max(1, focus + 1 - rng.choice((0, 0, 0, 1, 2, 4)))
        return rng.randrange(1, len(segs))

    weights = list(WEIGHTS)
    if (entry.get("feeds") or {}).get(str(focus)):  # the focus read rows whose allocs are known: edit them
        weights[MUTATIONS.index("resize")] *= FED_RESIZE

    def apply(kind: str) -> bool:  # one mutation in place; False where it cannot apply
        nonlocal segs, knobs
        ops = len(segs) - 1
        if kind == "delete" and ops > 1:
            del segs[op_index()]
        elif kind == "insert":
            length = len(segs[rng.randrange(1, len(segs))]) if ops else 4
            segs.insert(op_index() if ops else 1, [[rng.random(), 0] for _ in range(length)])
        elif kind == "repeat" and ops:
            i = op_index()
            for j in range(rng.choice((2, 4, 8))):
                copy = [list(d) for d in segs[i]]
                nudge(copy, rng)
                segs.insert(i + 1 + j, copy)
        elif kind == "splice":
            theirs = segments(other)
            segs = segs[: rng.randrange(1, len(segs) + 1)] + theirs[rng.randrange(1, len(theirs) + 1):] \
                if len(theirs) > 1 else segs
        elif kind == "swap" and ops:
            seg = segs[op_index()]
            if len(seg) >= 2:
                seg[1] = [rng.random(), 0]
        elif kind == "nudge":
            nudge(segs[op_index() if ops and rng.random() < 0.9 else rng.randrange(len(segs))], rng)
        elif kind == "knob" and rare_knobs and rare_knobs != knobs and rng.random() < 0.5:
            knobs = dict(rare_knobs)
        elif kind == "knob" and (mod := knob_module(kernels)) is not None:
            name = rng.choice(sorted(mod.FUZZ_KNOBS))
            knobs = {**(knobs or {}), name: rng.choice(tuple(mod.FUZZ_KNOBS[name]))}
        elif kind == "shrink" and (mod := knob_module(kernels)) is not None and knobs != (least := smallest(mod)):
            knobs = least
        elif kind == "config" and segs[0]:
            segs[0][rng.randrange(len(segs[0]))] = [rng.random(), 0]
        elif kind == "room" and room(segs):
            pass
        elif kind == "resize" and not done and (resized := resize(segs, entry, rng, shadow, focus, goal)) is not None:
            segs = resized  # first of a round: the entry's op indices still hold
        elif kind == "realign" and not done and (moved := realign(segs, rng, shadow, focus, goal)) is not None:
            segs = moved
        elif kind == "clone" and not done and (fed := (entry.get("feeds") or {}).get(str(focus))):
            a = rng.choice(fed) + 1
            if a < len(segs):
                segs.insert(a + 1, [list(d) for d in segs[a]])
            else:
                return False
        else:
            return False
        return True

    if only and apply(only):
        done.append(only)
    else:
        for _ in range(rng.choice((1, 1, 2, 3))):
            kind = rng.choices(MUTATIONS, weights)[0]
            if apply(kind):
                done.append(kind)
    if not done and len(segs) > 1:  # every draw above fell through: a plan is never its entry again
        nudge(segs[op_index()], rng)
        done.append("nudge")
    return flat(segs), marks_of(segs), knobs, done
