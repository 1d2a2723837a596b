"""SPEC.md §2: the kernel-level operations as pure functions over Python lists.

Tables are lists of ints (``v2p``/``p2v``, ``num_pages + 1`` rows each). Every index is
checked: a negative or too-large index raises ContractViolation, because an oracle that
wraps ``table[-1]`` the way torch does would hide exactly the bugs we hunt.

Every precondition is a named check of ``preconditions`` (one source of truth: the
generators and the vector oracle run the same ones), called before anything is written.

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

from . import preconditions as pre

INT32_LIMIT = pre.INT32_LIMIT


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def bind(v2p: list[int], p2v: list[int], v_pages: Sequence[int], p_pages: Sequence[int]) -> None:
    rows = pre.tables_match("bind", len(v2p), len(p2v))
    pre.check_bind(rows=rows, v_pages=v_pages, p_pages=p_pages)
    for v, p in zip(v_pages, p_pages):
        v2p[v] = p
        p2v[p] = v


def alloc_bind(v2p: list[int], p2v: list[int], v_pages: Sequence[int], start_phys: int) -> list[int]:
    rows = pre.tables_match("alloc_bind", len(v2p), len(p2v))
    pre.check_alloc_bind(rows=rows, v_pages=v_pages, start_phys=start_phys)
    p_pages = [start_phys + i for i in range(len(v_pages))]
    bind(v2p, p2v, v_pages, p_pages)
    return p_pages


def free_unbind(v2p: list[int], p2v: list[int], v_pages: Sequence[int]) -> list[int]:
    rows = pre.tables_match("free_unbind", len(v2p), len(p2v))
    pre.check_free_unbind(rows=rows, v_pages=v_pages, v2p=v2p)
    p_pages = [v2p[v] for v in v_pages]
    for v, p in zip(v_pages, p_pages):
        v2p[v] = -1
        p2v[p] = -1
    return p_pages


def _entry(fn: str, v2p: Sequence[int], tok: int, page_size: int, multiplier: int, pos: int | None, where: str) -> int:
    """The entry for ``tok`` (SPEC's ``tok < 0`` guard included), its clauses checked."""
    return pre.check_entry(fn, tok=tok, v2p_rows=len(v2p), v2p_value=v2p.__getitem__, multiplier=multiplier,
                           page_size=page_size, pos=pos, where=where)


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
    bs = pre.check_batch("read_table", r2t_rows=len(req_to_token), req_pool_indices=req_pool_indices,
                         seq_lens=seq_lens)
    width = len(req_to_token[0]) if req_to_token else 0
    pre.check_read_table(bs=bs, seq_lens=seq_lens, max_pages=max_pages, page_size=page_size, width=width,
                         out_rows=len(out), out_cols=min((len(r) for r in out[:bs]), default=max_pages))
    staged: list[tuple[int, int, int]] = []
    for b in range(bs):
        row = req_to_token[req_pool_indices[b]]
        for c in range(cdiv(seq_lens[b], page_size)):
            value = _entry("read_table", v2p, row[c * page_size], page_size, multiplier, None, f"row {b}, column {c}")
            staged.append((b, c, value))
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
    bs = pre.check_batch("read_table_packed", r2t_rows=len(req_to_token), req_pool_indices=req_pool_indices,
                         seq_lens=seq_lens)
    width = len(req_to_token[0]) if req_to_token else 0
    pre.check_read_table_packed(bs=bs, seq_lens=seq_lens, indptr=indptr, max_tokens=max_tokens, out_len=len(out),
                                page_size=page_size, width=width, kv_start_idx=kv_start_idx)
    staged: list[tuple[int, int]] = []
    for b in range(bs):
        start = 0 if kv_start_idx is None else kv_start_idx[b]
        row = req_to_token[req_pool_indices[b]]
        for col in range(seq_lens[b]):
            pos = start + col
            value = _entry("read_table_packed", v2p, row[(pos // page_size) * page_size], page_size, multiplier, pos,
                           f"row {b}, col {col}")
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
