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


def note_op(op, spec, error) -> None:
    """The runner, once the spec has run ``op`` (``error``: what it refused with, or None):
    note a read table for the launches that follow, and add a flush's features to the
    collector running (none running: nothing, at the cost of one test). A table the spec
    refused is noted as none: its launches are a probe judged for memory safety alone, so a trip
    it makes is not one the oracle checked, and the report must not name it reached."""
    if not ACTIVE:
        return
    kind = op.kind
    if kind in ("read_table", "read_table_packed") and error is None:
        ps = spec.config.page_size
        packed = kind == "read_table_packed"
        starts = tuple(op.kv_start) if packed and op.kv_start is not None else None
        _TABLE[0] = Table(tuple(table_lengths(op, ps)), op.max_tokens if packed else op.max_pages, ps, starts)
    else:
        _TABLE[0] = None
        if kind == "flush" and error is None:
            ACTIVE[-1].names.update(flush_features(spec))


def end_op() -> None:
    """The next op begins: a launch from now on belongs to no read table noted so far."""
    _TABLE[0] = None


def flush_features(spec) -> list[str]:
    """How kvref's flush just ended: why its walk stopped (``walk_stop``; ``no walk`` behind a
    closed move gate), with a reader in flight or not. The move cap is named with the move it
    barred: a skipped pinned check is met only before the cap, a cap off by one only where the
    next move was free, so a walk capped at a pinned page is neither bug's conjunction."""
    c = spec.config
    if not c.lazy:
        return []
    reader, stop = spec.reader_in_flight(), spec.walk_stop or "no walk"
    who = "reader in flight" if reader else "no reader"
    return [f"spec|flush|{c.grow}|{who}|{stop}", f"spec|flush|{c.grow}|{who}|pending {min(len(spec.pending), 3)}"]


def block_of(constexprs: dict, page_size: int, per_row: int, cap: int) -> int | None:
    """The launch's column block: among its int constexprs the powers of two from 2 (the page
    size's value set aside where another is there), the largest under which the last program of
    a row still starts inside the table (``(per_row - 1) * B < cap``: a grid is never sized past
    its table). The page size is set aside once, as the one constexpr it is: a block of as many
    tokens as a page stays (a page of 16 and a block of 16 beside a flag of 2 is a block of 16).
    None: no candidate."""
    vals = [v for v in constexprs.values() if v >= 2 and not v & (v - 1)]
    if len(set(vals)) > 1 and page_size in vals:
        vals.remove(page_size)
    for b in sorted(set(vals), reverse=True):
        if (per_row - 1) * b < cap:
            return b
    return None


def derived_trips(kernel: str, constexprs: dict, dims: tuple, out: set, goals: dict) -> None:
    """A launch's trips features from the read table running now (``note_op``) and the launch's
    grid and block (the module docstring): added to ``out``, their goals to ``goals`` as
    ``features._trip_features`` gives them."""
    t = _TABLE[0]
    if t is None or not t.lengths or not dims:
        return
    bs, programs = len(t.lengths), math.prod(dims)
    if len(dims) >= 2 and dims[0] == bs:
        per_row = math.prod(dims[1:])
    elif programs % bs == 0 and programs:
        per_row = programs // bs
    else:
        return
    block = block_of(constexprs, t.page_size, per_row, t.cap)
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

