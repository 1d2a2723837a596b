"""Value features from the op and the spec, for code whose names kvfuzz does not know.

``features`` reads a read table's trips from the launch's own arguments, and so only for
kernels that name them as ours do (``seq_lens_ptr``, ``col_stride``, ``BLOCK``): a team's
kernels, with a block written as a literal and other parameter names, got none, and guided
generation was blind on them. The spec side knows what each program of a read table must
cover whatever the kernel calls things:

* **the op** (noted by the runner before the target runs it, ``note_op``): its rows' live
  pages (tokens for the packed form), ``bs``, ``max_pages`` / ``max_tokens``, the page size,
  each row's ``kv_start``;
* **the launch**: its grid (``bs`` rows of ``cdiv(P, bs)`` programs, flat or 2-D) and its int
  constexprs, among which the block is a power of two (the page size's constexpr set aside)
  under which every program of a row still starts inside the table (``block_of``).

From the two, a program's trips are those of the strided loop SPEC §2 describes (program ``j``
of a row covers ``j * B, j * B + P_row * B, ...``; a grid of one block per program is one trip
by construction), named as ``features`` names them (``trips|KERNEL|BUCKET|EDGE`` and their
``progress`` stones, with the same goals), so the corpus, its frontier and the aimed resizes
work on any kernel set as on ours. Plus, for the packed form, where a row's ``kv_start`` sits
in its page against the trips it takes (``start|...``): an offset a later block loses is a
conjunction of an unaligned start and a second trip.

And for any allocator, how the spec's flush ended (``spec|flush|...``): the grow direction,
a reader in flight or not, and why the compaction walk stopped (no holes, the frontier met,
a page the in-flight forward writes, the move limit), with the pending batches left. These
are the conjunctions a flush bug behind an in-flight reader needs, read from kvref's state,
never from the allocator under test.
"""

from __future__ import annotations

import math
from typing import NamedTuple

REACH = 16  # a stepping stone counts only this many pages (and one block) short of one more trip
ACTIVE: list = []  # the collector of the sequence running now (at most one per process)


def log_bucket(n: int) -> str:
    """0, 1, 2, 3-4, 5-8, ...: the bit length, so a size's order of magnitude."""
    return str(int(n).bit_length()) if n >= 0 else "neg"


def trip_bucket(trips: int) -> str:
    if trips <= 2:
        return str(trips)
    return "3+" if trips == 3 else "4-7" if trips < 8 else "8+"


def table_lengths(op, page_size: int) -> list[int]:
    """What a read-table kernel's loop runs to per row: a row's live pages, or tokens for the
    packed form, capped as the launch caps them."""
    if op.kind == "read_table_packed":
        return [min(max(n, 0), op.max_tokens) for n in op.seq_lens]
    return [min(-(-max(n, 0) // page_size), op.max_pages) for n in op.seq_lens]


class Table(NamedTuple):
    """The read-table op running now, as a launch's derived features need it."""

    lengths: tuple  # per row, what its programs cover (pages; tokens for the packed form)
    cap: int  # max_pages / max_tokens
    page_size: int
    starts: tuple | None  # kv_start per row (packed), None without


_TABLE: list[Table | None] = [None]
_KEY: list[tuple | None] = [None]  # the shape key (``shape_key``) of the read table running now
GRIDS: dict[tuple, dict] = {}  # (kind, bs, page size) -> {cap: the launches (kernel, constexprs, dims) its tables made}
GRIDS_MAX = 1 << 12  # caps kept per shape (then that shape starts again)


def shape_key(op, page_size: int) -> tuple[tuple, int]:
    """((kind, bs, page size), cap) of a read-table op: what a launcher sizes its grid from."""
    packed = op.kind == "read_table_packed"
    return (op.kind, len(op.seq_lens), page_size), (op.max_tokens if packed else op.max_pages)


def table_of(op, page_size: int) -> Table:
    """The ``Table`` a read-table op's launches cover."""
    packed = op.kind == "read_table_packed"
    starts = tuple(op.kv_start) if packed and op.kv_start is not None else None
    return Table(tuple(table_lengths(op, page_size)), op.max_tokens if packed else op.max_pages, page_size, starts)


def note_op(op, spec, error) -> None:
    """The runner, once the spec has run ``op`` (``error``: what it refused with, or None):
    note a read table for the launches that follow, and add a flush's features to the
    collector running (none running: nothing, at the cost of one test). A table the spec
    refused (a hostile probe: its results are not compared, seq_lens past the rows) is not
    noted: the trips its lengths claim are no conjunction a result could show."""
    if not ACTIVE:
        return
    kind = op.kind
    if kind in ("read_table", "read_table_packed") and error is None:
        ps = spec.config.page_size
        _TABLE[0], _KEY[0] = table_of(op, ps), shape_key(op, ps)
    else:
        _TABLE[0] = _KEY[0] = None
    if (got := _BATCHES.flushed(op, spec)) and error is None:
        ACTIVE[-1].take(0, set(got), {})  # where: this op


def end_op() -> None:
    """The next op begins: a launch from now on belongs to no read table noted so far."""
    _TABLE[0] = _KEY[0] = None


def flush_features(spec, moved: int | None = None, urgent: bool = False) -> list[str]:
    """How kvref's flush just ended (the state after it says where its walk stopped: the next
    move it would make, and why it did not). ``moved``: the pages this flush's walk moved behind
    a reader in flight (``Batches``), so a walk that used up its moves before a pinned page is
    named by its move limit (at ``max_moves`` 0 it never meets a pinned page)."""
    c = spec.config
    if not c.lazy:
        return []
    up, reader = c.grow == "up", spec.reader_in_flight()
    holes = spec.holes
    cap = max(1, c.max_moves) if "move_cap_floor_1" in getattr(spec, "rules", ()) else c.max_moves
    if not holes:
        stop = "no holes"
    else:
        dst = holes[0] if up else holes[-1]
        src = spec._source()
        if src is None or (src <= dst if up else src >= dst):
            stop = "frontier met"
        elif reader and spec.p2v[src] in spec.in_flight.pages and (urgent or moved is None or moved < cap):
            stop = "pinned page"
        else:
            stop = "move limit"
    who = "reader in flight" if reader else "no reader"
    return [f"spec|flush|{c.grow}|{who}|{stop}", f"spec|flush|{c.grow}|{who}|pending {min(len(spec.pending), 3)}"]


class Batches:
    """The spec's last pending batch after each op: a flush that leaves another one last moved its
    pages behind a reader (kvref appends one batch a flush), so its walk's moves are that batch's size."""

    def __init__(self):
        self.last = None

    def flushed(self, op, spec) -> list[str]:
        """A flush's features (``flush_features``) with the moves its walk made; every op: note the last batch."""
        pending = getattr(spec, "pending", None)
        last = pending[-1] if pending else None
        out = []
        if op.kind == "flush":
            out = flush_features(spec, len(last[1]) if last is not None and last is not self.last else 0, op.urgent)
        self.last = last
        return out


def _powers(constexprs: dict) -> list[int]:
    return sorted({v for v in constexprs.values() if v >= 2 and not v & (v - 1)}, reverse=True)


def block_of(constexprs: dict, page_size: int, per_row: int, cap: int, votes: dict | None = None) -> int | None:
    """The launch's column block: among its int constexprs the powers of two from 2, the one its
    kernel's launches revealed most (``votes``: a grid of ``cdiv(cap, B)`` programs per row names
    its block, ``reveal``), else (the page size's value set aside where another is there) the
    largest under which the last program of a row still starts inside the table (``(per_row - 1)
    * B < cap``: a grid is never sized past its table). None: no candidate."""
    cands = _powers(constexprs)
    if votes:
        name = max((n for n, v in constexprs.items() if v in cands), key=lambda n: (votes.get(n, 0), constexprs[n]),
                   default=None)
        if name is not None and votes.get(name, 0) and (per_row - 1) * constexprs[name] < cap:
            return constexprs[name]
    if len(cands) > 1 and page_size in cands:
        cands.remove(page_size)
    for b in cands:
        if (per_row - 1) * b < cap:
            return b
    return None


SPANS: dict[str, list] = {}  # kernel -> [launches whose stride fell short of their table, launches it spanned]
SPANNED = 8  # launches all spanning their table before a kernel is ``one_trip``


def forget() -> None:
    """Forget what the launches taught (``GRIDS``, ``VOTES``, ``SPANS``): a process that fuzzes another
    kernel set next (a benchmark's runs, a test) starts as a new worker does."""
    GRIDS.clear()
    VOTES.clear()
    SPANS.clear()


def one_trip(kernel: str) -> bool:
    """Whether every launch of ``kernel`` seen (``SPANNED`` at least, of tables wider than its block)
    strode its whole table in one trip: a grid of one block per program (the legacy table's), where
    no row length makes a second trip."""
    short, spanned = SPANS.get(kernel, (0, 0))
    return not short and spanned >= SPANNED


VOTES: dict[str, dict] = {}  # kernel -> {constexpr name: launches whose grid its value explains}


def reveal(kernel: str, constexprs: dict, per_row: int, cap: int) -> None:
    """A launch of ``per_row`` programs per row over ``cap`` columns votes for each power-of-two
    constexpr B with ``cdiv(cap, B) == per_row``: a launcher that sizes its grid by its block says
    which parameter that is, by name, whatever the page size (where the page size and the block
    are equal, or a flag is a power of two too, the largest-candidate rule alone took the wrong
    one). One program per row says nothing."""
    if per_row >= 2:
        got = VOTES.setdefault(kernel, {})
        for name, b in constexprs.items():
            if b >= 2 and not b & (b - 1) and -(-cap // b) == per_row:
                got[name] = got.get(name, 0) + 1


def derived_trips(kernel: str, constexprs: dict, dims: tuple, out: set, goals: dict) -> None:
    """A launch's trips features from the read table running now (``note_op``) and the launch's
    grid and block (the module docstring): added to ``out``, their goals to ``goals`` as
    ``features._trip_features`` gives them."""
    t = _TABLE[0]
    if t is None or not t.lengths or not dims:
        return
    if (per_row := _per_row(len(t.lengths), dims)) is not None:
        reveal(kernel, constexprs, per_row, t.cap)
        block = block_of(constexprs, t.page_size, per_row, t.cap, VOTES.get(kernel))
        if block is not None and t.cap > block:  # one program a row says nothing of the grid
            SPANS.setdefault(kernel, [0, 0])[per_row * block >= t.cap] += 1
    if _KEY[0] is not None:  # the launcher's grid for this shape, for ``predicted``
        (shape, cap), launch = _KEY[0], (kernel, tuple(sorted(constexprs.items())), tuple(dims))
        caps = GRIDS.setdefault(shape, {})
        if len(caps) >= GRIDS_MAX:
            caps.clear()
        if launch not in caps.setdefault(cap, ()):
            caps[cap] = (*caps[cap], launch)
    derive(t, kernel, constexprs, dims, out, goals)


def _per_row(bs: int, dims: tuple) -> int | None:
    """A read table's programs per row in grid ``dims``: 2-D (``bs`` rows first) or one flat axis."""
    programs = math.prod(dims)
    if len(dims) >= 2 and dims[0] == bs:
        return math.prod(dims[1:])
    return programs // bs if programs and programs % bs == 0 else None


def derive(t: Table, kernel: str, constexprs: dict, dims: tuple, out: set, goals: dict) -> None:
    """``derived_trips`` for table ``t`` and one launch of it."""
    per_row = _per_row(len(t.lengths), dims)
    if per_row is None:
        return
    block = block_of(constexprs, t.page_size, per_row, t.cap, VOTES.get(kernel))
    if block is None:
        return
    stride = per_row * block
    for n in sorted(set(t.lengths)):
        if n > 0:
            out.add(f"mask|{kernel}|row/{block}|{'full' if n % block == 0 else 'partial'}")
        for j in range(per_row):
            program_trips(kernel, n, j * block, block, stride, out, goals)
            if j * block >= n:
                break  # the programs past the row's end make no trip: the first of them says so
    if t.starts is not None:
        start_features(kernel, t, block, stride, out, goals)


def predicted(op, page_size: int) -> set[str]:
    """The trips, mask and start features a read-table op would reach, from the spec alone: its
    ``Table`` under the launches a table of its shape (kind, bs, page size) made at its cap
    (``GRIDS``: a launcher's grid is a function of its op's sizes), or at a cap or a batch not
    seen, the grid ``grid_at`` fits to the launches of its kind and page size. Empty where none
    fits. A guess: what the guided track screens its plans by (``screen``), never what it keeps."""
    shape, cap = shape_key(op, page_size)
    t = table_of(op, page_size)
    launches = GRIDS.get(shape, {}).get(cap)
    if not t.lengths:
        return set()
    if launches is None:
        seen = [(s[1], c, k, x, d) for s, caps in GRIDS.items() if s[0] == shape[0] and s[2] == page_size
                for c, ls in caps.items() for k, x, d in ls]
        launches = [(kernel, got[0], got[1]) for kernel in dict.fromkeys(k for _, _, k, _, _ in seen)
                    if (got := grid_at(kernel, [(r, c, d, x) for r, c, k, x, d in seen if k == kernel],
                                       len(t.lengths), page_size, cap)) is not None]
    out: set[str] = set()
    for kernel, constexprs, dims in launches:
        derive(t, kernel, dict(constexprs), dims, out, {})
    return out


def grid_at(kernel: str, seen: list, bs: int, page_size: int, cap: int) -> tuple[tuple, tuple] | None:
    """(constexprs, dims) of a kernel's launch for a table of ``bs`` rows and cap ``cap``, from its
    launches ``seen`` for other tables ((rows, cap, dims, constexprs)): a launcher gives a row the
    programs its block covers, ``cdiv(cap, B)``, up to a share of the programs it aims at in all,
    ``cdiv(T, rows)`` (``min``; T bounded by the launches that gave a row fewer programs than its
    blocks; none did: no bound). None where that holds of no T for every launch seen, or a grid
    is neither flat nor (rows, programs)."""
    fits = []
    for rows, c, dims, constexprs in seen:
        p = _per_row(rows, dims)
        b = None if p is None else block_of(dict(constexprs), page_size, p, c, VOTES.get(kernel))
        if b is None or len(dims) > 2:
            return None
        fits.append((rows, c, p, b, dims, constexprs))
    if not fits or len({f[3] for f in fits}) != 1:
        return None
    block, lo, hi = fits[0][3], 0, None
    for rows, c, p, _, _, _ in fits:
        lo = max(lo, (p - 1) * rows)  # p <= cdiv(T, rows)
        if p < -(-c // block):  # short of its blocks: p == cdiv(T, rows)
            hi = p * rows if hi is None else min(hi, p * rows)
    if hi is not None and lo >= hi:
        return None

    def per_row(rows: int, c: int) -> int:
        return -(-c // block) if hi is None else min(-(-hi // rows), -(-c // block))

    if any(per_row(rows, c) != p for rows, c, p, _, _, _ in fits):
        return None
    *_, dims, constexprs = min(fits, key=lambda f: (f[0] != bs, abs(f[1] - cap)))
    p = per_row(bs, cap)
    return constexprs, ((bs, p) if len(dims) == 2 else (bs * p,))


def program_trips(kernel: str, n: int, start: int, block: int, step: int, out: set, goals: dict) -> None:
    """The trips of one program of a strided loop (``start``, then ``+= step`` while ``< n``), its
    last block's edge and its stepping stones (within ``REACH``), with their goals
    ``[n, short of one more trip, block, trips, step]``."""
    trips = 0 if start >= n else -(-(n - start) // step)
    last = start + (trips - 1) * step if trips else None
    edge = "none" if last is None else "partial" if last + block > n else "full"
    short = start + trips * step + 1 - n  # pages short of one more trip
    names = [f"trips|{kernel}|{trip_bucket(trips)}|{edge}"]
    if trips < 8 and short <= min(block, REACH):
        names += [f"progress|{kernel}|trips {trips}|short {log_bucket(short)}",
                  f"progress|{kernel}|row {min(2 * n // step, 16)}/2 strides|{edge}"]
    for name in names:
        out.add(name)
        goals.setdefault(name, [n, short, block, trips, step])


def start_features(kernel: str, t: Table, block: int, stride: int, out: set, goals: dict) -> None:
    """Per packed row: its ``kv_start`` aligned to the page or not (page size > 1), against the
    trips its first program takes (the offset within the page must survive every block); the goal
    of each is its row's, as a trip feature's (so a pick of it can aim the row one trip longer)."""
    ps = t.page_size
    for s, n in zip(t.starts, t.lengths):
        where = "page size 1" if ps == 1 else "aligned" if s % ps == 0 else "unaligned"
        trips = -(-n // stride) if n > 0 else 0
        name = f"start|{kernel}|{where}|trips {trip_bucket(trips)}"
        out.add(name)
        goals.setdefault(name, [n, trips * stride + 1 - n, block, trips, stride])


_BATCHES = Batches()
