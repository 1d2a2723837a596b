"""SPEC.md §2 as whole-tensor torch ops: the oracle for kernel-level ops at production shapes.

Why it exists: the kernel-level ops are fuzzed on the GPU at pools of 2^20 pages and read
tables of 512 x 16k entries, where the pure-Python spec (``kvref``) takes minutes per op.
This module is a second, independent reading of SPEC §2, written from the spec's text
alone and never from ``kvkernels`` (it imports nothing from it), so one mistake shared by
a kernel and its pure-torch path cannot also hide here. It is itself diffed against
``kvref`` on small shapes (tests/fuzz/test_vector_oracle.py).

The oracle works on its own copies of the tables, on their device, and mutates what it
is given, as the kernels do. It is defined for inputs that meet SPEC §2's preconditions
(the fuzzer sends it nothing else), and outside them it keeps three promises instead of
guessing at a kernel's behaviour:

- no torch index wrapping: every index tensor is clamped into its table before use, and
  the lanes whose index was out of range are masked (a token ``< 0`` reads page 0, as
  SPEC says; a page past ``v2p`` reads as 0, translate's rule; an out-of-range batch row,
  column or table row writes nothing);
- no write outside the given tables and outside the live prefix of ``out``; a store lane
  whose row is out of range writes the row's old value back (to a clamped row, which
  for valid input no other lane writes: ids lie in ``[1, rows - 1)``);
- no host synchronisation: no ``.item()``, ``.tolist()``, ``nonzero``, boolean-mask
  indexing, ``unique`` or host scalars scattered into tables. Sizes come from shapes, so
  a GPU fuzz loop never stalls on the oracle. (``first_mismatch`` is the one place that
  reads back, once on the equal path.)

The preconditions: given a ``clauses`` list, ``read_table`` and ``read_table_packed`` check
SPEC §2's clauses under ``kvref.preconditions``' names, vectorized: those a shape decides
on the host at once (raising ContractViolation), those the values decide as one 0-dim bool
tensor each, appended as ``(clause, flag)`` for the caller's one host read
(``broken_clause``), so the oracle still never waits for the device. ``read_table``'s two entry
clauses (``token_in_table``, ``entry_fits_int32``) are marks in its lookup (``_flagged_lookup``),
found by two compares over the values it gathers anyway: on the CPU that made the clauses cost
a third of the oracle's time instead of as much again (a second int64 gather and five masks).
``read_table_packed`` gathers its entries through an int64 lookup (``_scaled_lookup``) when it
checks clauses, so both entry clauses are compares over the entries it writes.

Rules chosen where the spec is silent: ``read_table`` writes no column at or past
``max_pages`` (SPEC) and ``read_table_packed`` none at or past ``max_tokens`` (the same
rule); the packed form's work is sized by ``len(out)``, not ``bs * max_tokens``, because
its positions are found by a binary search of ``indptr`` (which the spec's CSR layout
makes non-decreasing).

Memory traffic of ``read_table``, per element of the ``bs x max_pages`` grid (the oracle
cannot skip dead columns without reading ``seq_lens`` back), for an int32
``req_to_token``: gather the page's first token 4 B read + 4 B write; token -> page in
place, floor division (ps > 1 only) and clamp, 4 + 4 B each; page -> value 4 B index
read + 4 B write, through a ``(rows + 1)``-entry int32 lookup that stays in L2; the live
mask 1 B write; the in-place select into ``out`` 1 + 4 + 4 B read, 4 B write. That is
38 B at ps = 1 and 46 B at ps > 1 (int64 tokens: 58 B and 74 B), plus 28 B per ``v2p``
row, once per call, to build the lookup. At ps >= 8 the token gather is strided by
``ps * 4`` bytes, so DRAM moves a 32 B sector per token: +28 B. ``read_table_bytes`` is
this model, used by the GPU benchmark; ``first_mismatch`` adds 8 B per element (two
int32 reads).
"""

from __future__ import annotations

from kvref import preconditions as pre

from . import lazy

torch = lazy.Torch(globals())  # imported where first used: lazy.py says why

__all__ = [
    "alloc_bind",
    "bind",
    "broken_clause",
    "first_mismatch",
    "free_unbind",
    "read_table",
    "read_table_bytes",
    "read_table_packed",
    "translate",
]


def _ids(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Id lanes as int64 on the tables' device (a copy only when the dtype differs)."""
    return x.to(device=device, dtype=torch.int64)


def _clamp_rows(idx: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(index clamped into [0, rows), lane-is-in-range mask): torch never wraps it."""
    ok = (idx >= 0) & (idx < rows)
    return idx.clamp(0, rows - 1), ok


def _batch_rows(req_pool_indices: torch.Tensor, req_rows: int, lengths: torch.Tensor, limit: int):
    """(each batch row's req_to_token row, clamped; its length clamped to [0, limit], 0 when the row is out of range)."""
    req_safe, req_ok = _clamp_rows(_ids(req_pool_indices, lengths.device), req_rows)
    return req_safe, torch.where(req_ok, lengths.clamp(0, limit), 0)


def _store(table: torch.Tensor, idx: torch.Tensor, values: torch.Tensor, ok: torch.Tensor) -> None:
    """``table[idx[i]] = values[i]`` for the lanes ``ok``; the other lanes rewrite a clamped row's old value.

    Lanes that store one value to one row (free's ``-1`` to a shared physical page) agree,
    so their order does not matter.
    """
    rows = table.shape[0]
    safe = idx.clamp(0, rows - 1)
    table.index_put_((safe,), torch.where(ok, values.to(table.dtype), table.index_select(0, safe)))


# --------------------------------------------------------------------------- bind / free


def bind(v2p: torch.Tensor, p2v: torch.Tensor, v: torch.Tensor, p: torch.Tensor) -> None:
    """SPEC §2 bind: ``v2p[v[i]] = p[i]``, ``p2v[p[i]] = v[i]`` (v unique, p unique)."""
    if v.numel() == 0:
        return
    v = _ids(v, v2p.device)
    p = _ids(p, v2p.device)
    v_ok = (v >= 0) & (v < v2p.shape[0])
    p_ok = (p >= 0) & (p < p2v.shape[0])
    lane_ok = v_ok & p_ok  # a lane with either id out of range writes neither table
    _store(v2p, v, p, lane_ok)
    _store(p2v, p, v, lane_ok)


def alloc_bind(v2p: torch.Tensor, p2v: torch.Tensor, v: torch.Tensor, start) -> torch.Tensor:
    """SPEC §2 alloc_bind: ``p[i] = start + i`` ascending, then bind; returns ``p`` (int64).

    ``start`` is a Python int or a 0-dim device tensor (no host read either way).
    """
    n = v.numel()
    p = torch.arange(n, dtype=torch.int64, device=v2p.device)
    if n == 0:
        return p
    p += start
    bind(v2p, p2v, v, p)
    return p


def free_unbind(v2p: torch.Tensor, p2v: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """SPEC §2 free_unbind: ``p = v2p[v]``, then ``v2p[v] = -1``, ``p2v[p] = -1``; returns ``p`` (int64).

    A lane whose ``v2p[v]`` is ``-1`` (a double free) or lies outside ``p2v`` writes no
    ``p2v`` row; a lane whose ``v`` is out of range returns ``-1`` and writes nothing.
    """
    device = v2p.device
    if v.numel() == 0:
        return torch.empty(0, dtype=torch.int64, device=device)
    v = _ids(v, device)
    v_safe, v_ok = _clamp_rows(v, v2p.shape[0])
    p = torch.where(v_ok, v2p.index_select(0, v_safe).to(torch.int64), -1)  # every read before any write
    tomb = torch.full_like(p, -1)
    _store(v2p, v, tomb, v_ok)
    p_ok = (p >= 0) & (p < p2v.shape[0])
    _store(p2v, p, tomb, p_ok)
    return p


# --------------------------------------------------------------------------- read tables


def _scaled_lookup(v2p: torch.Tensor, multiplier: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``max(v2p[page] * multiplier, 0)`` for page in [0, rows), and 0 at index rows (a page past the table).

    Computed in int32 by default: the precondition ``v2p[page] * multiplier < 2^31`` makes that
    exact, and it is SPEC's ``int32(...)`` cast. In int64 (``read_table_packed`` checking its
    clauses) nothing wraps, so an entry past 2^31 shows as one. ``read_table_packed`` passes
    ``multiplier`` times the page size (its entries are ``max(v2p * multiplier, 0) * ps + pos % ps``).
    """
    rows = v2p.shape[0]
    lookup = torch.empty(rows + 1, dtype=dtype or torch.int32, device=v2p.device)  # (None: torch stays lazy at import)
    lookup[:rows].copy_(v2p)
    lookup[:rows].mul_(multiplier).clamp_(min=0)
    lookup[rows:].fill_(0)
    return lookup


PAST_TABLE, TOO_BIG = -2, -1  # ``_flagged_lookup``'s marks (a real entry is >= 0)


def _flagged_lookup(v2p: torch.Tensor, multiplier: int) -> torch.Tensor:
    """``_scaled_lookup`` with SPEC §2's two entry clauses marked in it: ``TOO_BIG`` where
    ``v2p[page] * multiplier >= 2^31`` (in int64, so nothing wraps), ``PAST_TABLE`` at index
    ``rows``. The entries a read table gathers through it then carry their own clause flags,
    and one pass over the gathered values finds them (``read_table``), where a second int64
    gather and five masks over the whole table did (about as much device traffic as the
    oracle itself). Valid entries are the same as ``_scaled_lookup``'s."""
    rows = v2p.shape[0]
    scaled = v2p.to(torch.int64).mul(multiplier).clamp_(min=0)
    lookup = torch.empty(rows + 1, dtype=torch.int32, device=v2p.device)
    lookup[:rows].copy_(scaled.masked_fill_(scaled >= pre.INT32_LIMIT, TOO_BIG))
    lookup[rows:].fill_(PAST_TABLE)
    return lookup


def _pages_of_tokens(tok: torch.Tensor, page_size: int, rows: int) -> torch.Tensor:
    """``0 if tok < 0 else tok // ps``, then pages past ``v2p`` -> ``rows`` (the lookup's zero slot).

    In place on ``tok`` (the caller's own gathered copy). Floor division maps every
    negative token to a negative page, which the clamp sends to page 0.
    """
    if page_size != 1:
        tok.floor_divide_(page_size)
    return tok.clamp_(0, rows)


def _live_columns(n_cols: torch.Tensor, width: int) -> torch.Tensor:
    """bool ``[len(n_cols), width]``: column c of row b is live iff ``c < n_cols[b]``."""
    cols = torch.arange(width, dtype=torch.int32, device=n_cols.device)
    return cols.unsqueeze(0) < n_cols.unsqueeze(1)


def read_table(
    *,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    v2p: torch.Tensor,
    multiplier: int,
    page_size: int,
    max_pages: int,
    out: torch.Tensor,
    clauses: list | None = None,
) -> torch.Tensor:
    """SPEC §2 read_table, written into ``out[:bs, :max_pages]`` at the live prefix only; returns ``out``.
    ``clauses``: where the preconditions' flags go (module docstring)."""
    bs, ps = req_pool_indices.shape[0], page_size
    n_req = req_to_token.shape[0]
    if clauses is not None:
        _shape_clauses("read_table", req_pool_indices, seq_lens)
        pre.check_read_table_shape(bs=bs, max_pages=max_pages, page_size=ps, width=req_to_token.shape[1],
                                   out_rows=out.shape[0], out_cols=out.shape[1], out_int32=out.dtype == torch.int32)
    if bs == 0 or max_pages <= 0 or n_req == 0:
        return out

    # n_b = ceil(seq_lens / ps), in int64 so seq_lens near 2^31 cannot wrap.
    n_b = torch.div(_ids(seq_lens, out.device) + (ps - 1), ps, rounding_mode="floor")
    req_safe, n_cols = _batch_rows(req_pool_indices, n_req, n_b, max_pages)
    n_cols = n_cols.to(torch.int32)

    # Column c reads token column c * ps: a strided view, so only those tokens are gathered.
    # Preconditions put (max_pages - 1) * ps inside the row; a shorter row leaves the columns
    # past it unwritten.
    first_tokens = req_to_token[:, 0 : max_pages * ps : ps]
    n_tok_cols = first_tokens.shape[1]
    tok = first_tokens.index_select(0, req_safe)  # [bs, n_tok_cols], req_to_token's dtype

    page = _pages_of_tokens(tok, ps, v2p.shape[0])
    lookup = _scaled_lookup(v2p, multiplier) if clauses is None else _flagged_lookup(v2p, multiplier)
    value = lookup.index_select(0, page.view(-1)).view(bs, n_tok_cols)

    live = _live_columns(n_cols, n_tok_cols)
    if clauses is not None:
        lens = _ids(seq_lens, out.device)
        clauses += [("read_table.req_idx_in_range", _out_of(req_pool_indices, n_req).any()),
                    ("read_table.seq_lens_nonnegative", (lens < 0).any()),
                    ("read_table.max_pages_covers_rows", (n_b > max_pages).any()),
                    ("read_table.token_in_table", (value.eq(PAST_TABLE) & live).any()),
                    ("read_table.entry_fits_int32", (value.eq(TOO_BIG) & live).any())]
        value.clamp_(min=0)  # the marks read as 0: a page past the table, as without clauses
    dst = out[:bs, :n_tok_cols]
    torch.where(live, value, dst, out=dst)
    return out


def read_table_packed(
    *,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    v2p: torch.Tensor,
    indptr: torch.Tensor,
    multiplier: int,
    page_size: int,
    max_tokens: int,
    out: torch.Tensor,
    kv_start_idx: torch.Tensor | None = None,
    clauses: list | None = None,
) -> torch.Tensor:
    """SPEC §2 read_table_packed (CSR): ``out[indptr[b] + col]`` for ``col < seq_lens[b]``; returns ``out``.

    Each position ``i`` of ``out`` finds its row by a binary search of ``indptr``
    (``k = #{indptr <= i}``, row ``k - 1``); per-row facts are looked up through ``k`` in
    tables padded with a dead row on each side, so positions before ``indptr[0]`` or past
    ``indptr[bs]`` and the gaps between rows are dead without extra masks.
    """
    bs, n_out, ps = req_pool_indices.shape[0], out.shape[0], page_size
    n_req, width = req_to_token.shape
    if clauses is not None:
        _shape_clauses("read_table_packed", req_pool_indices, seq_lens)
        fn = "read_table_packed"
        pre.require(indptr.shape[0] == bs + 1, f"{fn}.indptr_length", f"indptr has {indptr.shape[0]} entries, not {bs + 1}")
        pre.require(kv_start_idx is None or kv_start_idx.shape[0] == bs, f"{fn}.kv_start_length",
                    f"kv_start_idx must have {bs} entries")
        pre.require(n_out >= max_tokens, f"{fn}.out_holds_max_tokens",
                    f"out holds {n_out} elements, fewer than max_tokens = {max_tokens}")
        pre.require(out.dtype == torch.int32, f"{fn}.out_int32", "out must be int32")
    if bs == 0 or n_out == 0 or n_req == 0 or width == 0:
        return out
    device = out.device

    # Per-row tables (bs + 2 entries, index k = row + 1), all int64 and tiny.
    req_safe, lens = _batch_rows(req_pool_indices, n_req, _ids(seq_lens, device), max(max_tokens, 0))
    starts = indptr[:bs].to(torch.int64)
    kv_start = torch.zeros_like(starts) if kv_start_idx is None else kv_start_idx.to(device=device, dtype=torch.int64)
    pad = torch.zeros(1, dtype=torch.int64, device=device)
    row_end = torch.cat([pad, starts + lens, pad])  # i < row_end[k] <=> live (k = 0 and bs + 1: never)
    row_shift = torch.cat([pad, kv_start - starts, pad])  # pos = i + row_shift[k]
    row_req = torch.cat([pad, req_safe, pad])

    bounds = indptr[: bs + 1].contiguous()
    i = torch.arange(n_out, dtype=bounds.dtype, device=device)
    k = torch.searchsorted(bounds, i, right=True)  # in [0, bs + 1]
    i = i.to(torch.int64)
    live = i < row_end.index_select(0, k)
    pos = i.add_(row_shift.index_select(0, k))
    tok_col = torch.div(pos, ps, rounding_mode="floor").mul_(ps)
    col_safe, col_ok = _clamp_rows(tok_col, width)
    if clauses is not None:
        fn, ptr, lens_in = "read_table_packed", indptr.to(torch.int64), _ids(seq_lens, device)
        clauses += [(f"{fn}.req_idx_in_range", _out_of(req_pool_indices, n_req).any()),
                    (f"{fn}.seq_lens_nonnegative", (lens_in < 0).any()),
                    (f"{fn}.indptr_nonnegative", ptr[0] < 0),
                    (f"{fn}.indptr_consistent", (ptr[1:] - ptr[:-1]).ne(lens_in).any()),
                    (f"{fn}.indptr_within_max_tokens", ptr[bs] > max_tokens),
                    (f"{fn}.kv_start_nonnegative", (kv_start < 0).any()),
                    (f"{fn}.columns_in_width", (live & (tok_col >= width)).any())]
    live &= col_ok  # pos < 0 gives a negative token column: masked here
    tok = req_to_token[row_req.index_select(0, k), col_safe]

    rows = v2p.shape[0]
    page = _pages_of_tokens(tok, ps, rows)
    # int32 fits every valid entry (precondition); checking clauses, int64, so that the entry
    # clauses are compares over the entries themselves (one gather).
    dtype = torch.int32 if clauses is None else torch.int64
    value = _scaled_lookup(v2p, multiplier * ps, dtype).index_select(0, page)
    if ps != 1:
        value += pos.remainder_(ps)
    if clauses is not None:
        clauses += [(f"{fn}.token_in_table", (page.eq(rows) & live).any()),
                    (f"{fn}.entry_fits_int32", (value.ge(pre.INT32_LIMIT) & live).any())]
        value = value.to(torch.int32)  # exact where every live entry fits (else the op is refused)
    torch.where(live, value, out, out=out)
    return out


def _shape_clauses(fn: str, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor) -> None:
    pre.require(seq_lens.shape[0] == req_pool_indices.shape[0], f"{fn}.batch_lengths",
                f"req_pool_indices has {req_pool_indices.shape[0]} rows but seq_lens has {seq_lens.shape[0]}")


def _out_of(idx: torch.Tensor, rows: int) -> torch.Tensor:
    return (idx < 0) | (idx >= rows)


def broken_clause(clauses: list) -> str | None:
    """The first clause whose flag is set (one host read), or None; empties ``clauses``."""
    if not clauses:
        return None
    names, flags = zip(*clauses)
    clauses.clear()
    hits = torch.stack([f.reshape(()) for f in flags]).tolist()
    return next((n for n, hit in zip(names, hits) if hit), None)


# --------------------------------------------------------------------------- translate


def translate(*, loc: torch.Tensor, v2p: torch.Tensor, page_size: int) -> torch.Tensor:
    """SPEC §2 translate: ``max(v2p[t // ps] * ps + t % ps, 0)``; 0 for ``t < 0`` or a page past ``v2p``. int64."""
    device = v2p.device
    if loc.numel() == 0 or v2p.shape[0] == 0:
        return torch.zeros(loc.shape, dtype=torch.int64, device=device)
    t = _ids(loc, device)
    ps = page_size
    page = torch.div(t, ps, rounding_mode="floor")
    page_safe, page_ok = _clamp_rows(page, v2p.shape[0])  # t < 0 gives page < 0: masked here too
    slot = v2p.index_select(0, page_safe).to(torch.int64).mul_(ps).add_(t.remainder(ps)).clamp_(min=0)
    return torch.where(page_ok, slot, 0)


# --------------------------------------------------------------------------- comparison


def first_mismatch(expected: torch.Tensor, actual: torch.Tensor):
    """None when equal; else ``(index, expected_value, actual_value)`` of the first divergent element.

    ``index`` is an int for 1-D tensors and a tuple otherwise (row-major order). The equal
    path reads back one bool; a mismatch costs one more small read (the index and the
    two values), never the tensors.
    """
    if expected.shape != actual.shape or expected.dtype != actual.dtype or expected.device != actual.device:
        raise ValueError(
            f"cannot compare {tuple(expected.shape)} {expected.dtype} on {expected.device} "
            f"with {tuple(actual.shape)} {actual.dtype} on {actual.device}"
        )
    if torch.equal(expected, actual):  # one host read
        return None
    exp_flat = expected.reshape(-1)
    act_flat = actual.reshape(-1)
    at = torch.ne(exp_flat, act_flat).to(torch.uint8).argmax().view(1)  # argmax returns the first maximum
    wide = torch.float64 if expected.is_floating_point() else torch.int64
    flat, exp_value, act_value = torch.cat(
        [at.to(wide), exp_flat.index_select(0, at).to(wide), act_flat.index_select(0, at).to(wide)]
    ).tolist()  # the second and last host read
    flat = int(flat)
    if expected.dim() == 1:
        index = flat
    else:
        coords = []
        for size in reversed(expected.shape):
            flat, c = divmod(flat, size)
            coords.append(c)
        index = tuple(reversed(coords))
    if expected.dtype == torch.bool:
        exp_value, act_value = bool(exp_value), bool(act_value)
    elif wide == torch.int64:
        exp_value, act_value = int(exp_value), int(act_value)
    return index, exp_value, act_value


# --------------------------------------------------------------------------- cost model


def read_table_bytes(*, bs: int, max_pages: int, page_size: int, token_itemsize: int = 4, v2p_rows: int = 0) -> int:
    """Bytes ``read_table`` moves through memory (the module docstring's model)."""
    t = token_itemsize
    per_elem = 2 * t  # gather the first token of each page
    per_elem += (2 * t if page_size != 1 else 0) + 2 * t  # floor division (ps > 1), clamp: in place
    per_elem += t + 4  # page -> value through the L2-resident int32 lookup
    per_elem += 1  # live mask
    per_elem += 1 + 4 + 4 + 4  # select into out, in place
    if page_size * t >= 32:
        per_elem += 32 - t  # one DRAM sector per strided token
    return bs * max_pages * per_elem + v2p_rows * 28
