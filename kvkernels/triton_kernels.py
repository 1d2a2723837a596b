"""The Triton kernels of SPEC.md §2, one per kernel-level operation.

They run compiled on CUDA and, with ``TRITON_INTERPRET=1`` set before this module is
imported, under Triton's interpreter on CPU tensors. Only long-standing ``tl`` APIs are
used so that the same source runs on Triton 3.6 and 3.9.

Scalar arguments that vary with the data (sizes, counts, the multiplier) are not
specialized (``do_not_specialize``): Triton would otherwise compile a variant per value
class (== 1, divisible by 16) of each, which a fuzzer drawing pools and batches of every
size pays for in compile time on every new combination. Strides stay specialized: a unit
or 16-aligned stride is what lets Triton vectorize the loads.

Memory safety is the first rule here: "a kernel must never write outside the tables,
whatever the input". Every kernel receives the row count of each table it touches and
masks every gather and every scatter to ``[0, rows)``; the read-table kernels also
mask the ``req_to_token`` row and column they read and clamp the live length to the
width of ``out``. Lanes that fall outside are *skipped*, never redirected, so a hostile
input leaves every byte outside its buffers as it was. The launchers in
``kvkernels.launchers`` choose the grids; ``kvkernels.torch_path`` is the same
semantics in plain torch, lane for lane, including on hostile input.

Rules for input that breaks a precondition (ContractViolation in ``kvref``), shared
with ``torch_path``:
- ids outside ``[0, rows)`` are not written; ``free_unbind`` returns ``-1`` for a
  virtual page outside ``v2p`` and writes no ``p2v`` row for a ``p`` outside ``p2v``
  (notably ``-1``, a double free);
- read tables: a row whose ``req_pool_indices`` entry is not a row of
  ``req_to_token`` writes nothing, a lane whose token column lies outside
  ``req_to_token`` (or whose position is negative) writes nothing, a token whose page
  lies past ``v2p`` reads as entry 0, a negative ``seq_lens`` writes nothing, and the
  live length is clamped to ``max_pages`` (``max_tokens`` for the packed form);
- packed: row ``b`` writes only inside ``[indptr[b], min(indptr[b + 1], out.numel()))``.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["start_phys", "N", "v2p_rows", "p2v_rows"])
def alloc_bind_kernel(
    v_pages_ptr,  # in: [N] int64, virtual pages to bind
    v2p_ptr,  # in/out: [v2p_rows] int64, virtual -> physical page
    p2v_ptr,  # in/out: [p2v_rows] int64, physical -> virtual page
    p_pages_ptr,  # out: [N] int64, start_phys + i
    start_phys,
    N,
    v2p_rows,
    p2v_rows,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    lane = offs < N
    v = tl.load(v_pages_ptr + offs, mask=lane, other=-1).to(tl.int64)
    p = offs + start_phys
    tl.store(p_pages_ptr + offs, p, mask=lane)
    tl.store(v2p_ptr + v, p, mask=lane & (v >= 0) & (v < v2p_rows))
    tl.store(p2v_ptr + p, v, mask=lane & (p >= 0) & (p < p2v_rows))


@triton.jit(do_not_specialize=["N", "v2p_rows", "p2v_rows"])
def bind_kernel(
    v_pages_ptr,  # in: [N] int64, virtual pages to bind
    p_pages_ptr,  # in: [N] int64, physical page of each virtual page
    v2p_ptr,  # in/out: [v2p_rows] int64, virtual -> physical page
    p2v_ptr,  # in/out: [p2v_rows] int64, physical -> virtual page
    N,
    v2p_rows,
    p2v_rows,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    lane = offs < N
    v = tl.load(v_pages_ptr + offs, mask=lane, other=-1).to(tl.int64)
    p = tl.load(p_pages_ptr + offs, mask=lane, other=-1).to(tl.int64)
    tl.store(v2p_ptr + v, p, mask=lane & (v >= 0) & (v < v2p_rows))
    tl.store(p2v_ptr + p, v, mask=lane & (p >= 0) & (p < p2v_rows))


@triton.jit(do_not_specialize=["N", "v2p_rows", "p2v_rows"])
def free_unbind_kernel(
    v_pages_ptr,  # in: [N] int64, virtual pages to free
    v2p_ptr,  # in/out: [v2p_rows] int64, virtual -> physical page; freed rows become -1
    p2v_ptr,  # in/out: [p2v_rows] int64, physical -> virtual page; freed rows become -1
    p_pages_ptr,  # out: [N] int64, the physical page each virtual page held (-1 if none)
    N,
    v2p_rows,
    p2v_rows,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    lane = offs < N
    v = tl.load(v_pages_ptr + offs, mask=lane, other=-1).to(tl.int64)
    v_ok = lane & (v >= 0) & (v < v2p_rows)
    p = tl.load(v2p_ptr + v, mask=v_ok, other=-1).to(tl.int64)
    tombstone = tl.full((BLOCK,), -1, tl.int64)
    tl.store(p_pages_ptr + offs, p, mask=lane)
    tl.store(v2p_ptr + v, tombstone, mask=v_ok)
    # A double free reads p == -1: that lane must write no p2v row.
    tl.store(p2v_ptr + p, tombstone, mask=v_ok & (p >= 0) & (p < p2v_rows))


@triton.jit(do_not_specialize=["N", "v2p_rows"])
def translate_kernel(
    loc_ptr,  # in: [N] int64, token ids
    v2p_ptr,  # in: [v2p_rows] int64, virtual -> physical page
    out_ptr,  # out: [N] int64, physical token slot (0 = padding sink)
    N,
    v2p_rows,
    PAGE_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    lane = offs < N
    t = tl.load(loc_ptr + offs, mask=lane, other=-1).to(tl.int64)
    # Triton's // and % truncate toward zero: only non-negative tokens reach them.
    nonneg = t >= 0
    t = tl.where(nonneg, t, 0)
    page = t // PAGE_SIZE
    ok = lane & nonneg & (page < v2p_rows)
    phys = tl.load(v2p_ptr + page, mask=ok, other=0).to(tl.int64)
    slot = tl.maximum(phys * PAGE_SIZE + t % PAGE_SIZE, 0)
    tl.store(out_ptr + offs, tl.where(ok, slot, 0), mask=lane)


@triton.jit
def _scaled_page(
    tok,
    v2p_ptr,  # in: [v2p_rows] int64, virtual -> physical page
    v2p_rows,
    multiplier,
    mask,
    PAGE_SIZE: tl.constexpr,
):
    """max(v2p[page] * multiplier, 0), page = 0 if tok < 0 else tok // ps; past the table: 0."""
    page = tl.where(tok < 0, 0, tok) // PAGE_SIZE
    phys = tl.load(v2p_ptr + page, mask=mask & (page < v2p_rows), other=0).to(tl.int64)
    return tl.maximum(phys * multiplier, 0)


@triton.jit
def _read_table_entries(
    cols,
    n_pages,
    req_row_ptr,  # in: one row of req_to_token (stride req_stride1), int32/int64 token ids
    req_width,
    req_stride1,
    v2p_ptr,  # in: [v2p_rows] int64, virtual -> physical page
    v2p_rows,
    multiplier,
    PAGE_SIZE: tl.constexpr,
):
    """(entries as int32, lanes to store) for the columns ``cols`` of one row."""
    tok_col = cols * PAGE_SIZE
    ok = (cols < n_pages) & (tok_col < req_width)
    tok = tl.load(req_row_ptr + tok_col * req_stride1, mask=ok, other=-1).to(tl.int64)
    entry = _scaled_page(tok, v2p_ptr, v2p_rows, multiplier, ok, PAGE_SIZE)
    return entry.to(tl.int32), ok


@triton.jit
def _read_table_cols(
    cols,
    n_pages,
    req_row_ptr,  # in: one row of req_to_token (stride req_stride1), int32/int64 token ids
    req_width,
    req_stride1,
    v2p_ptr,  # in: [v2p_rows] int64, virtual -> physical page
    v2p_rows,
    out_row_ptr,  # out: one row of out, int32, columns [0, n_pages) only
    multiplier,
    PAGE_SIZE: tl.constexpr,
):
    entry, ok = _read_table_entries(cols, n_pages, req_row_ptr, req_width, req_stride1, v2p_ptr, v2p_rows,
                                    multiplier, PAGE_SIZE)
    tl.store(out_row_ptr + cols, entry, mask=ok)


@triton.jit
def _live_pages(
    req_pool_indices_ptr,  # in: [bs] int, row of req_to_token per batch row
    seq_lens_ptr,  # in: [bs] int, tokens per batch row
    b,
    req_rows,
    max_pages,
    PAGE_SIZE: tl.constexpr,
):
    """(req row, n_pages): n_pages = min(ceil(seq_len / ps), max_pages), 0 for a bad req row."""
    req = tl.load(req_pool_indices_ptr + b).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int64)
    row_ok = (req >= 0) & (req < req_rows)
    # A negative seq_len gives n_pages <= 0 under truncating and flooring division alike.
    n_pages = tl.minimum((seq_len + PAGE_SIZE - 1) // PAGE_SIZE, max_pages)
    return tl.where(row_ok, req, 0), tl.where(row_ok, n_pages, 0)


@triton.jit(do_not_specialize=["req_rows", "req_width", "v2p_rows", "multiplier", "max_pages", "col_stride"])
def read_table_kernel(
    req_to_token_ptr,  # in: [req_rows, req_width] int32/int64 (strides req_stride0, req_stride1), token ids
    req_pool_indices_ptr,  # in: [bs] int, row of req_to_token per batch row
    seq_lens_ptr,  # in: [bs] int, tokens per batch row
    v2p_ptr,  # in: [v2p_rows] int64, virtual -> physical page
    out_ptr,  # out: [>= bs, >= max_pages] int32 (row stride out_stride), live prefix of each row only
    req_rows,
    req_width,
    req_stride0,
    req_stride1,
    v2p_rows,
    out_stride,
    multiplier,
    max_pages,
    col_stride,
    PAGE_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,
    UNROLL: tl.constexpr = 1,
):
    """bs-sized grid (bs, col_programs): each program strides over its row's live columns."""
    b = tl.program_id(0).to(tl.int64)
    req, n_pages = _live_pages(req_pool_indices_ptr, seq_lens_ptr, b, req_rows, max_pages, PAGE_SIZE)
    req_row_ptr = req_to_token_ptr + req * req_stride0
    out_row_ptr = out_ptr + b * out_stride
    # A while loop, not range(start, n_pages, col_stride): Triton 3.6's interpreter turns a
    # tensor-valued range bound into int(ndarray of shape (1,)), which numpy 2 refuses.
    start = tl.program_id(1).to(tl.int64) * BLOCK
    while start < n_pages:
        cols = start + tl.arange(0, BLOCK)
        if UNROLL == 2:
            # Two column blocks per trip, both gathered before either is stored: their loads
            # are in flight together (a store between them would order the next loads after
            # it, since out might alias the inputs as far as the compiler knows).
            e0, ok0 = _read_table_entries(cols, n_pages, req_row_ptr, req_width, req_stride1, v2p_ptr, v2p_rows,
                                          multiplier, PAGE_SIZE)
            e1, ok1 = _read_table_entries(cols + col_stride, n_pages, req_row_ptr, req_width, req_stride1, v2p_ptr,
                                          v2p_rows, multiplier, PAGE_SIZE)
            tl.store(out_row_ptr + cols, e0, mask=ok0)
            tl.store(out_row_ptr + cols + col_stride, e1, mask=ok1)
        else:
            _read_table_cols(cols, n_pages, req_row_ptr, req_width, req_stride1, v2p_ptr, v2p_rows,
                             out_row_ptr, multiplier, PAGE_SIZE)
        start += col_stride * UNROLL


@triton.jit(do_not_specialize=["req_rows", "req_width", "v2p_rows", "multiplier", "max_pages"])
def read_table_legacy_kernel(
    req_to_token_ptr,  # in: [req_rows, req_width] int32/int64 (strides req_stride0, req_stride1), token ids
    req_pool_indices_ptr,  # in: [bs] int, row of req_to_token per batch row
    seq_lens_ptr,  # in: [bs] int, tokens per batch row
    v2p_ptr,  # in: [v2p_rows] int64, virtual -> physical page
    out_ptr,  # out: [>= bs, >= max_pages] int32 (row stride out_stride), live prefix of each row only
    req_rows,
    req_width,
    req_stride0,
    req_stride1,
    v2p_rows,
    out_stride,
    multiplier,
    max_pages,
    PAGE_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Legacy grid (bs, cdiv(max_pages, BLOCK)): one program per column block, live or not."""
    b = tl.program_id(0).to(tl.int64)
    req, n_pages = _live_pages(req_pool_indices_ptr, seq_lens_ptr, b, req_rows, max_pages, PAGE_SIZE)
    cols = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    _read_table_cols(cols, n_pages, req_to_token_ptr + req * req_stride0, req_width, req_stride1,
                     v2p_ptr, v2p_rows, out_ptr + b * out_stride, multiplier, PAGE_SIZE)


@triton.jit(do_not_specialize=["req_rows", "req_width", "v2p_rows", "out_numel", "multiplier", "max_tokens", "col_stride"])
def read_table_packed_kernel(
    req_to_token_ptr,  # in: [req_rows, req_width] int32/int64 (strides req_stride0, req_stride1), token ids
    req_pool_indices_ptr,  # in: [bs] int, row of req_to_token per batch row
    seq_lens_ptr,  # in: [bs] int, tokens per batch row
    v2p_ptr,  # in: [v2p_rows] int64, virtual -> physical page
    indptr_ptr,  # in: [bs + 1] int, row b owns out[indptr[b]:indptr[b + 1]]
    kv_start_ptr,  # in: [bs] int, first position of each row (read only when HAS_KV_START)
    out_ptr,  # out: [out_numel] int32, physical token slots in CSR layout
    req_rows,
    req_width,
    req_stride0,
    req_stride1,
    v2p_rows,
    out_numel,
    multiplier,
    max_tokens,
    col_stride,
    PAGE_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_KV_START: tl.constexpr,
):
    """CSR read table on the bs-sized strided grid (bs, col_programs)."""
    b = tl.program_id(0).to(tl.int64)
    req = tl.load(req_pool_indices_ptr + b).to(tl.int64)
    row_ok = (req >= 0) & (req < req_rows)
    req = tl.where(row_ok, req, 0)
    n = tl.minimum(tl.load(seq_lens_ptr + b).to(tl.int64), max_tokens)
    n = tl.where(row_ok, n, 0)
    lo = tl.load(indptr_ptr + b).to(tl.int64)
    hi = tl.minimum(tl.load(indptr_ptr + b + 1).to(tl.int64), out_numel)
    kv_start = 0
    if HAS_KV_START:
        kv_start = tl.load(kv_start_ptr + b).to(tl.int64)
    req_row_ptr = req_to_token_ptr + req * req_stride0
    start = tl.program_id(1).to(tl.int64) * BLOCK
    while start < n:  # a while loop for Triton 3.6's interpreter (see read_table_kernel)
        cols = start + tl.arange(0, BLOCK)
        pos = kv_start + cols
        dst = lo + cols
        # pos >= 0 is part of the mask, so // and % below never see a negative position.
        tok_col = (pos // PAGE_SIZE) * PAGE_SIZE
        ok = (cols < n) & (pos >= 0) & (tok_col < req_width) & (dst >= 0) & (dst < hi)
        tok = tl.load(req_row_ptr + tok_col * req_stride1, mask=ok, other=-1).to(tl.int64)
        scaled = _scaled_page(tok, v2p_ptr, v2p_rows, multiplier, ok, PAGE_SIZE)
        value = scaled * PAGE_SIZE + pos % PAGE_SIZE
        tl.store(out_ptr + dst, value.to(tl.int32), mask=ok)
        start += col_stride


def _interpreted(kernel) -> bool:
    """True when ``kernel`` was decorated under Triton's interpreter (TRITON_INTERPRET=1)."""
    return type(kernel).__name__ == "InterpretedFunction" or "interpreter" in type(kernel).__module__


# Decided at decoration time, exactly as Triton decided it: the truth across versions.
INTERPRETED = _interpreted(free_unbind_kernel)
