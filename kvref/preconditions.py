"""SPEC.md §2's preconditions, one named, executable check per clause.

What counts as valid input is the spec's to say, never a generator's: the kernel-level
functions of ``kvref.kernels`` call these checks before they read anything, kvfuzz's
generators run every op they emit as valid through the same checks before the target
sees it (an op that fails one is kvfuzz's own bug), and the vector oracle used at
production sizes runs the same clauses, vectorized, under the same names. A failed check
raises ``ContractViolation`` whose ``clause`` is the clause's name (``FUNCTION.RULE``,
e.g. ``read_table_packed.indptr_within_max_tokens``), so a refusal says which rule it
broke and a hostile op can be labelled with the rule it breaks on purpose.

The checks take plain values (ints and sequences of ints), and where a caller only
knows a bound (the widest column a batch reads, the largest physical page a table can
hold) they take the bound: a production op of 2^31 ``req_to_token`` elements is checked
from its parameters without building it. ``CLAUSES`` lists every clause with SPEC's
wording; ``docs/spec.md`` names each (``tests/test_docs_spec.py`` checks it).
``translate`` has none: every id is a valid input.

Clauses marked *(kvref)* are rules kvref chose where SPEC is silent (docs/spec.md says why).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .errors import ContractViolation

INT32_LIMIT = 2**31


@dataclass(frozen=True)
class Clause:
    """One precondition: ``name`` (``FUNCTION.RULE``, stable: cases and hostile classes
    record it) and ``wording``, what SPEC §2 (or kvref's choice) says."""

    name: str
    wording: str

    @property
    def function(self) -> str:
        return self.name.split(".", 1)[0]


CLAUSES: dict[str, Clause] = {}


def _clause(name: str, wording: str) -> str:
    CLAUSES[name] = Clause(name, wording)
    return name


def _ids_clauses(fn: str, ids: str) -> None:
    _clause(f"{fn}.tables_match", "v2p and p2v have the same number of rows (kvref)")
    _clause(f"{fn}.ids_are_ints", f"{ids} are ints (kvref)")
    _clause(f"{fn}.ids_in_range", f"every id of {ids} lies in [1, rows - 1): no sentinel row is written (kvref)")


for _fn, _ids in (("bind", "v and p"), ("alloc_bind", "v and p = start + i"), ("free_unbind", "v")):
    _ids_clauses(_fn, _ids)
_clause("bind.lengths_match", "v and p have the same length")
_clause("bind.v_unique", "v unique")
_clause("bind.p_unique", "p unique")
_clause("alloc_bind.v_unique", "v unique (bind's precondition)")
_clause("free_unbind.v_unique", "v unique (duplicates would race on p2v[p] on a GPU)")
_clause("free_unbind.bound", "every v2p[v[i]] != -1 (else a double free)")
_clause("free_unbind.v2p_in_table", "every v2p[v[i]] is a row of p2v (kvref)")
for _fn in ("read_table", "read_table_packed"):
    _clause(f"{_fn}.batch_lengths", "req_pool_indices and seq_lens both have bs entries")
    _clause(f"{_fn}.req_idx_in_range", "each req_pool_indices[b] is a row of req_to_token (kvref)")
    _clause(f"{_fn}.seq_lens_nonnegative", "seq_lens[b] >= 0 (kvref)")
    _clause(f"{_fn}.token_in_table", "every page read lies inside v2p (kvref)")
_clause("read_table.max_pages_nonnegative", "max_pages >= 0")
_clause("read_table.max_pages_covers_rows", "max_pages >= n_b = ceil(seq_lens[b] / ps) for every row")
_clause("read_table.width", "(max_pages - 1) * ps < the width of req_to_token")
_clause("read_table.out_rows", "out has at least bs rows")
_clause("read_table.out_cols", "out has at least max_pages packed columns")
_clause("read_table.out_int32", "out is int32")
_clause("read_table.entry_fits_int32", "v2p[page] * multiplier < 2^31")
_clause("read_table_packed.indptr_length", "indptr has bs + 1 entries (kvref)")
_clause("read_table_packed.indptr_nonnegative", "indptr[0] >= 0 (kvref)")
_clause("read_table_packed.indptr_consistent", "indptr[b + 1] - indptr[b] = seq_lens[b]")
_clause("read_table_packed.indptr_within_max_tokens", "indptr[bs] <= max_tokens")
_clause("read_table_packed.out_holds_max_tokens",
        "out holds at least max_tokens elements (every real caller passes the buffer captured at max_tokens)")
_clause("read_table_packed.out_int32", "out is int32")
_clause("read_table_packed.kv_start_length", "kv_start_idx has bs entries (kvref)")
_clause("read_table_packed.kv_start_nonnegative", "kv_start_idx[b] >= 0 (kvref)")
_clause("read_table_packed.columns_in_width", "every column read, ((kv_start[b] + col) // ps) * ps, lies inside "
        "req_to_token's width (kvref)")
_clause("read_table_packed.entry_fits_int32", "max(v2p[page] * multiplier, 0) * ps + pos % ps < 2^31")


def violation(clause: str, message: str) -> ContractViolation:
    """The error for a broken ``clause`` (a registered name)."""
    if clause not in CLAUSES:
        raise KeyError(f"{clause!r} is not a precondition of kvref.preconditions")
    return ContractViolation(message, clause=clause)


def require(ok: bool, clause: str, message: str) -> None:
    if not ok:
        raise violation(clause, message)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---- bind, alloc_bind, free_unbind --------------------------------------------------------------


def tables_match(fn: str, v2p_rows: int, p2v_rows: int) -> int:
    require(v2p_rows == p2v_rows, f"{fn}.tables_match", f"v2p has {v2p_rows} rows but p2v has {p2v_rows}")
    return v2p_rows


def ids(fn: str, values: Sequence[int], rows: int, what: str, *, unique: str | None) -> None:
    """``values`` are ints in ``[1, rows - 1)``, and distinct when ``unique`` names the clause.
    (A fast pass first, at C speed, for production batches of 64k ids; the slow one names
    the first offender.) ``values`` may summarise itself: ``values.summary()`` -> (a lower and an
    upper bound of its ids, whether they are known distinct), e.g. an affine id slice of a
    production op, checked without listing it; a summary that does not prove the clauses falls
    back to the ids themselves."""
    summary = getattr(values, "summary", None)
    if summary is not None:
        lo, hi, distinct = summary()
        if len(values) == 0 or (1 <= lo and hi < rows - 1 and (unique is None or distinct)):
            return
        values = list(values)
    if (values and all(type(x) is int for x in values) and 1 <= min(values) and max(values) < rows - 1
            and (unique is None or len(set(values)) == len(values))):
        return
    seen: set[int] = set()
    for i, x in enumerate(values):
        require(isinstance(x, int) and not isinstance(x, bool), f"{fn}.ids_are_ints", f"{what}[{i}] = {x!r} is not an int")
        require(1 <= x < rows - 1, f"{fn}.ids_in_range",
                f"{what}[{i}] = {x} is outside [1, {rows - 1}): it would hit a sentinel row or leave the table")
        if unique is not None:
            require(x not in seen, unique, f"{what} holds {x} twice: lanes would race on one row")
            seen.add(x)


def check_bind(*, rows: int, v_pages: Sequence[int], p_pages: Sequence[int]) -> None:
    require(len(v_pages) == len(p_pages), "bind.lengths_match",
            f"bind got {len(v_pages)} virtual pages but {len(p_pages)} physical pages")
    ids("bind", v_pages, rows, "v_pages", unique="bind.v_unique")
    ids("bind", p_pages, rows, "p_pages", unique="bind.p_unique")


def check_alloc_bind(*, rows: int, v_pages: Sequence[int], start_phys: int) -> None:
    """p = start + i is unique by construction; only its range can break."""
    ids("alloc_bind", v_pages, rows, "v_pages", unique="alloc_bind.v_unique")
    if v_pages:
        ids("alloc_bind", (start_phys, start_phys + len(v_pages) - 1), rows, "p_pages (start + i)", unique=None)


def check_free_unbind(*, rows: int, v_pages: Sequence[int], v2p) -> None:
    """``v2p``: the table, or any mapping from the pages named to their rows."""
    ids("free_unbind", v_pages, rows, "v_pages", unique="free_unbind.v_unique")
    for i, v in enumerate(v_pages):
        require(v2p[v] != -1, "free_unbind.bound", f"double free: virtual page {v} (v_pages[{i}]) is not bound")
        require(0 <= v2p[v] < rows, "free_unbind.v2p_in_table",
                f"v2p[{v}] = {v2p[v]} is not a physical page of a {rows}-row p2v")


# ---- the read tables ------------------------------------------------------------------------------


def check_batch(fn: str, *, r2t_rows: int, req_pool_indices: Sequence[int], seq_lens: Sequence[int]) -> int:
    bs = len(req_pool_indices)
    require(len(seq_lens) == bs, f"{fn}.batch_lengths", f"req_pool_indices has {bs} rows but seq_lens has {len(seq_lens)}")
    for b in range(bs):
        r = req_pool_indices[b]
        require(0 <= r < r2t_rows, f"{fn}.req_idx_in_range",
                f"req_to_token row index {r} (req_pool_indices[{b}]) is outside [0, {r2t_rows})")
        require(seq_lens[b] >= 0, f"{fn}.seq_lens_nonnegative", f"seq_lens[{b}] = {seq_lens[b]} is negative")
    return bs


def check_read_table(*, bs: int, seq_lens: Sequence[int], max_pages: int, page_size: int, width: int,
                     out_rows: int, out_cols: int, out_int32: bool = True) -> None:
    """The shape clauses of read_table (the batch's own ones: ``check_batch``; each entry's:
    ``check_entry``)."""
    check_read_table_shape(bs=bs, max_pages=max_pages, page_size=page_size, width=width, out_rows=out_rows,
                           out_cols=out_cols, out_int32=out_int32)
    for b in range(bs):
        n_b = _cdiv(seq_lens[b], page_size)
        require(n_b <= max_pages, "read_table.max_pages_covers_rows",
                f"seq_lens[{b}] = {seq_lens[b]} needs {n_b} pages > max_pages={max_pages}")


def check_read_table_shape(*, bs: int, max_pages: int, page_size: int, width: int, out_rows: int, out_cols: int,
                           out_int32: bool = True) -> None:
    """``check_read_table``'s clauses that the shapes decide, without ``seq_lens`` (a caller that
    checks the rows' lengths elsewhere: the vector oracle, on the device)."""
    require(max_pages >= 0, "read_table.max_pages_nonnegative", f"max_pages must be >= 0, got {max_pages}")
    require((max_pages - 1) * page_size < width, "read_table.width",
            f"req_to_token is {width} tokens wide; max_pages={max_pages} at page_size={page_size} needs more than "
            f"{(max_pages - 1) * page_size}")
    require(out_rows >= bs, "read_table.out_rows", f"out has {out_rows} rows, fewer than bs = {bs}")
    require(out_cols >= max_pages, "read_table.out_cols", f"out has {out_cols} columns, fewer than max_pages = {max_pages}")
    require(out_int32, "read_table.out_int32", "out must be int32")


def check_read_table_packed(*, bs: int, seq_lens: Sequence[int], indptr: Sequence[int], max_tokens: int,
                            out_len: int, page_size: int, width: int, kv_start_idx: Sequence[int] | None = None,
                            out_int32: bool = True) -> None:
    """The layout clauses of read_table_packed (the batch's own: ``check_batch``; each
    entry's: ``check_entry``)."""
    fn = "read_table_packed"
    require(len(indptr) == bs + 1, f"{fn}.indptr_length", f"indptr must have bs + 1 = {bs + 1} entries, got {len(indptr)}")
    require(kv_start_idx is None or len(kv_start_idx) == bs, f"{fn}.kv_start_length",
            f"kv_start_idx must have {bs} entries, got {len(kv_start_idx or ())}")
    require(indptr[0] >= 0, f"{fn}.indptr_nonnegative", f"indptr[0] = {indptr[0]} is negative")
    for b in range(bs):
        require(indptr[b + 1] - indptr[b] == seq_lens[b], f"{fn}.indptr_consistent",
                f"indptr[{b + 1}] - indptr[{b}] = {indptr[b + 1] - indptr[b]} but seq_lens[{b}] = {seq_lens[b]}")
    require(indptr[bs] <= max_tokens, f"{fn}.indptr_within_max_tokens",
            f"indptr[bs] = {indptr[bs]} > max_tokens = {max_tokens}")
    require(out_len >= max_tokens, f"{fn}.out_holds_max_tokens",
            f"out holds {out_len} elements, fewer than max_tokens = {max_tokens}")
    require(out_int32, f"{fn}.out_int32", "out must be int32")
    for b in range(bs):
        start = 0 if kv_start_idx is None else kv_start_idx[b]
        require(start >= 0, f"{fn}.kv_start_nonnegative", f"kv_start_idx[{b}] = {start} is negative")
        if seq_lens[b] > 0:
            last = ((start + seq_lens[b] - 1) // page_size) * page_size
            require(last < width, f"{fn}.columns_in_width",
                    f"row {b} reads req_to_token column {last}, past its width {width}")


def check_entry(fn: str, *, tok: int, v2p_rows: int, v2p_value, multiplier: int, page_size: int,
                pos: int | None, where: str) -> int:
    """One entry's clauses (``pos`` None: read_table's page entry; else the packed slot's
    position). ``v2p_value(page)`` reads the table. Returns the entry."""
    page = 0 if tok < 0 else tok // page_size
    require(0 <= page < v2p_rows, f"{fn}.token_in_table",
            f"token {tok} at {where} lies on page {page}, outside v2p's {v2p_rows} rows")
    scaled = max(v2p_value(page) * multiplier, 0)
    value = scaled if pos is None else scaled * page_size + pos % page_size
    require(value < INT32_LIMIT, f"{fn}.entry_fits_int32", f"the entry {value} for v2p[{page}] at {where} does not fit int32")
    return value


def check_entry_bound(fn: str, *, max_v2p: int, multiplier: int, page_size: int) -> None:
    """The entry clause from a bound: every value of v2p is at most ``max_v2p`` (a table of
    physical pages holds ids below its row count), so no entry can pass 2^31."""
    worst = max(max_v2p, 0) * multiplier
    if fn == "read_table_packed":
        worst = worst * page_size + page_size - 1
    require(worst < INT32_LIMIT, f"{fn}.entry_fits_int32",
            f"v2p may hold {max_v2p}: its entry {worst} at multiplier {multiplier} does not fit int32")
