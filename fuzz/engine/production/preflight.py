"""The read tables' SPEC §2 preconditions from a production op's parameters (``ScaleOp.preflight``).

One call's clauses, checked with ``kvref.preconditions`` from the lists and bounds an op
knows on the host (the entries' clause from the bound a pool's ``v2p`` keeps: every value is
below its row count), so the gate costs host arithmetic, never a device read.
"""

from __future__ import annotations

from kvref import preconditions as pre


def check_table_call(ctx, *, r2t_rows: int, width: int, req_idx, seq_lens, max_pages: int, out_rows: int,
                     out_cols: int) -> None:
    """Every clause of one read_table call (the entries' from the bound a pool's v2p keeps)."""
    cfg = ctx.config
    bs = pre.check_batch("read_table", r2t_rows=r2t_rows, req_pool_indices=req_idx, seq_lens=seq_lens)
    pre.check_read_table(bs=bs, seq_lens=seq_lens, max_pages=max_pages, page_size=cfg.page_size, width=width,
                         out_rows=out_rows, out_cols=out_cols)
    pre.check_entry_bound("read_table", max_v2p=cfg.table_rows - 1, multiplier=cfg.multiplier,
                          page_size=cfg.page_size)


def check_packed_call(ctx, *, r2t_rows: int, width: int, req_idx, seq_lens, indptr, kv_start, max_tokens: int,
                      out_len: int) -> None:
    """Every clause of one read_table_packed call."""
    cfg = ctx.config
    bs = pre.check_batch("read_table_packed", r2t_rows=r2t_rows, req_pool_indices=req_idx, seq_lens=seq_lens)
    pre.check_read_table_packed(bs=bs, seq_lens=seq_lens, indptr=indptr, max_tokens=max_tokens, out_len=out_len,
                                page_size=cfg.page_size, width=width, kv_start_idx=kv_start)
    pre.check_entry_bound("read_table_packed", max_v2p=cfg.table_rows - 1, multiplier=cfg.multiplier,
                          page_size=cfg.page_size)
