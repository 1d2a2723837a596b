"""SPEC.md §2: the kernel-level operations as pure functions over Python lists.

Tables are lists of ints (``v2p``/``p2v``, ``num_pages + 1`` rows each). Every index is
checked: a negative or too-large index raises ContractViolation, because an oracle that
wraps ``table[-1]`` the way torch does would hide exactly the bugs we hunt.

Rules the spec leaves open, chosen here:
- Kernel-level writes never touch the sentinel rows: ids given to ``bind``,
  ``alloc_bind`` and ``free_unbind`` must lie in ``[1, rows - 1)``.
- Every function validates all of its input before it writes anything, so a rejected
  call leaves the tables as they were (SPEC §4.8).
- ``read_table`` rejects a negative ``seq_lens`` entry and a token whose page lies past
  the table; the kernels must still stay inside their buffers for such input.
"""

from __future__ import annotations

from collections.abc import Sequence

from .errors import ContractViolation

INT32_LIMIT = 2**31


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check_ids(ids: Sequence[int], rows: int, what: str) -> None:
    seen: set[int] = set()
    for i, x in enumerate(ids):
        if not isinstance(x, int) or isinstance(x, bool):
            raise ContractViolation(f"{what}[{i}] = {x!r} is not an int")
        if not 1 <= x < rows - 1:
            raise ContractViolation(
                f"{what}[{i}] = {x} is outside [1, {rows - 1}): it would hit a sentinel row or leave the table"
            )
        if x in seen:
            raise ContractViolation(f"{what} holds {x} twice: lanes would race on one row")
        seen.add(x)


def _check_tables(v2p: list[int], p2v: list[int]) -> int:
    if len(v2p) != len(p2v):
        raise ContractViolation(f"v2p has {len(v2p)} rows but p2v has {len(p2v)}")
    return len(v2p)


def bind(v2p: list[int], p2v: list[int], v_pages: Sequence[int], p_pages: Sequence[int]) -> None:
    rows = _check_tables(v2p, p2v)
    if len(v_pages) != len(p_pages):
        raise ContractViolation(f"bind got {len(v_pages)} virtual pages but {len(p_pages)} physical pages")
    _check_ids(v_pages, rows, "v_pages")
    _check_ids(p_pages, rows, "p_pages")
    for v, p in zip(v_pages, p_pages):
        v2p[v] = p
        p2v[p] = v


def alloc_bind(v2p: list[int], p2v: list[int], v_pages: Sequence[int], start_phys: int) -> list[int]:
    p_pages = [start_phys + i for i in range(len(v_pages))]
    bind(v2p, p2v, v_pages, p_pages)
    return p_pages


def free_unbind(v2p: list[int], p2v: list[int], v_pages: Sequence[int]) -> list[int]:
    rows = _check_tables(v2p, p2v)
    _check_ids(v_pages, rows, "v_pages")
    for i, v in enumerate(v_pages):
        if v2p[v] == -1:
            raise ContractViolation(f"double free: virtual page {v} (v_pages[{i}]) is not bound")
        if not 0 <= v2p[v] < rows:  # a table no kernel of the spec could have written: refuse, never wrap
            raise ContractViolation(f"v2p[{v}] = {v2p[v]} is not a physical page of a {rows}-row p2v")
    p_pages = [v2p[v] for v in v_pages]
    for v, p in zip(v_pages, p_pages):
        v2p[v] = -1
        p2v[p] = -1
    return p_pages


def _index(seq: Sequence, i: int, what: str):
    if not 0 <= i < len(seq):
        raise ContractViolation(f"{what} index {i} is outside [0, {len(seq)})")
    return seq[i]


def _page_entry(v2p: Sequence[int], tok: int, page_size: int, multiplier: int, where: str) -> int:
    """max(v2p[page] * multiplier, 0) for the page of ``tok``, with the tok < 0 guard."""
    page = 0 if tok < 0 else tok // page_size
    scaled = max(_index(v2p, page, f"v2p (token {tok} at {where})") * multiplier, 0)
    if scaled >= INT32_LIMIT:
        raise ContractViolation(f"v2p[{page}] * multiplier = {scaled} does not fit int32 (at {where})")
    return scaled


def _check_batch(req_to_token, req_pool_indices, seq_lens) -> int:
    bs = len(req_pool_indices)
    if len(seq_lens) != bs:
        raise ContractViolation(f"req_pool_indices has {bs} rows but seq_lens has {len(seq_lens)}")
    for b in range(bs):
        _index(req_to_token, req_pool_indices[b], f"req_to_token row (req_pool_indices[{b}])")
        if seq_lens[b] < 0:
            raise ContractViolation(f"seq_lens[{b}] = {seq_lens[b]} is negative")
    return bs


def read_table(
    *,
    req_to_token: Sequence[Sequence[int]],
    req_pool_indices: Sequence[int],
    seq_lens: Sequence[int],
    v2p: Sequence[int],
    multiplier: int,
    page_size: int,
    max_pages: int,
    out: list[list[int]],
) -> list[list[int]]:
    bs = _check_batch(req_to_token, req_pool_indices, seq_lens)
    width = len(req_to_token[0]) if req_to_token else 0
    if max_pages < 0:
        raise ContractViolation(f"max_pages must be >= 0, got {max_pages}")
    if (max_pages - 1) * page_size >= width:
        raise ContractViolation(
            f"req_to_token is {width} tokens wide; max_pages={max_pages} at page_size={page_size} needs more than {(max_pages - 1) * page_size}"
        )
    if len(out) < bs or any(len(out[b]) < max_pages for b in range(bs)):
        raise ContractViolation(f"out must have >= {bs} rows of >= {max_pages} columns")
    staged: list[tuple[int, int, int]] = []
    for b in range(bs):
        n_b = cdiv(seq_lens[b], page_size)
        if n_b > max_pages:
            raise ContractViolation(f"seq_lens[{b}] = {seq_lens[b]} needs {n_b} pages > max_pages={max_pages}")
        row = req_to_token[req_pool_indices[b]]
        for c in range(n_b):
            tok = row[c * page_size]
            staged.append((b, c, _page_entry(v2p, tok, page_size, multiplier, f"row {b}, column {c}")))
    for b, c, value in staged:
        out[b][c] = value
    return out


def read_table_packed(
    *,
    req_to_token: Sequence[Sequence[int]],
    req_pool_indices: Sequence[int],
    seq_lens: Sequence[int],
    v2p: Sequence[int],
    indptr: Sequence[int],
    multiplier: int,
    page_size: int,
    max_tokens: int,
    out: list[int],
    kv_start_idx: Sequence[int] | None = None,
) -> list[int]:
    bs = _check_batch(req_to_token, req_pool_indices, seq_lens)
    width = len(req_to_token[0]) if req_to_token else 0
    if len(indptr) != bs + 1:
        raise ContractViolation(f"indptr must have bs + 1 = {bs + 1} entries, got {len(indptr)}")
    if kv_start_idx is not None and len(kv_start_idx) != bs:
        raise ContractViolation(f"kv_start_idx must have {bs} entries, got {len(kv_start_idx)}")
    staged: list[tuple[int, int]] = []
    for b in range(bs):
        n = seq_lens[b]
        start = 0 if kv_start_idx is None else kv_start_idx[b]
        if n > max_tokens:
            raise ContractViolation(f"seq_lens[{b}] = {n} exceeds max_tokens={max_tokens}")
        if start < 0:
            raise ContractViolation(f"kv_start_idx[{b}] = {start} is negative")
        if indptr[b] < 0 or indptr[b] + n > min(indptr[b + 1], len(out)):
            raise ContractViolation(f"row {b} writes out[{indptr[b]}:{indptr[b] + n}], outside its indptr span or out")
        row = req_to_token[req_pool_indices[b]]
        for col in range(n):
            pos = start + col
            tok = _index(row, (pos // page_size) * page_size, f"req_to_token column (row {b}, pos {pos}, width {width})")
            scaled = _page_entry(v2p, tok, page_size, multiplier, f"row {b}, col {col}")
            value = scaled * page_size + pos % page_size
            if value >= INT32_LIMIT:
                raise ContractViolation(f"packed entry {value} at row {b}, col {col} does not fit int32")
            staged.append((indptr[b] + col, value))
    for i, value in staged:
        out[i] = value
    return out


def translate(v2p: Sequence[int], loc: Sequence[int], page_size: int) -> list[int]:
    """Token id -> physical slot; 0 (the padding sink) for t < 0 or a page past the table."""
    out = []
    for t in loc:
        page = t // page_size
        if t < 0 or page >= len(v2p):
            out.append(0)
        else:
            out.append(max(v2p[page] * page_size + t % page_size, 0))
    return out
