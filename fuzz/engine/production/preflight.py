"""The read tables' SPEC §2 preconditions from a production op's parameters (``ScaleOp.preflight``).

One call's clauses, from the lists and bounds an op knows on the host (the entries' clause
from the bound a pool's ``v2p`` keeps: every value is below its row count), so the gate
costs host arithmetic, never a device read.

``kvref.preconditions`` states the clauses, one row at a time in Python; at production
batches (512 rows, 33 replays of a graph op) that loop was a third of a GPU worker's host
time. So each call is first decided here in closed form (``table_ok``, ``packed_ok``):
every per-row clause is a bound (the smallest and largest ``req_pool_indices`` and
``seq_lens``, the largest ``kv_start + seq_len``), at C speed (``min``/``max``/
``accumulate`` over the lists) or from what the sequence knows of itself (``bounds()``:
``arith.ModIds``, an affine row slice, in O(1)). A call they pass is valid; one they cannot pass
goes through kvref's checks, which raise the clause (or pass: the closed form is only ever
stricter, ``tests/fuzz/test_preflight.py`` holds both to the same verdicts). So a
refusal is always kvref's, with kvref's clause and message. ``FULL_EVERY``: every so many
calls also run kvref's checks on a call the closed form passed (and every call with
``KVFUZZ_PREFLIGHT=full``), so the two statements cannot drift apart unseen: a drift is
kvref's refusal, the gate's exit 3.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from itertools import accumulate
from operator import add

from kvref import preconditions as pre

# Every FULL_EVERY-th call is checked by kvref too; KVFUZZ_PREFLIGHT=full: every call (read at
# each call, not at import: a fork daemon imports this module once for many commands).
FULL_EVERY = 64
_calls = [0]  # calls so far in this process (the sample's clock)


def bounds(xs: Sequence[int]) -> tuple[int, int] | None:
    """(smallest, largest) of ``xs`` (either may be loose where ``xs.bounds()`` gives them), or
    None: empty, or not known without listing it."""
    own = getattr(xs, "bounds", None)
    if own is not None:
        return own()
    return (min(xs), max(xs)) if len(xs) else None


def _batch_ok(r2t_rows: int, req_idx, seq_lens) -> tuple[int, int] | None:
    """``check_batch``'s clauses in closed form: (bs, the largest seq_len, 0 when bs is 0), or None."""
    bs = len(req_idx)
    if len(seq_lens) != bs:
        return None
    if bs == 0:
        return 0, 0
    r, s = bounds(req_idx), bounds(seq_lens)
    if r is None or s is None or r[0] < 0 or r[1] >= r2t_rows or s[0] < 0:
        return None
    return bs, s[1]


def table_ok(*, r2t_rows: int, width: int, req_idx, seq_lens, max_pages: int, page_size: int, out_rows: int,
             out_cols: int) -> bool:
    """True only if ``check_batch`` and ``check_read_table`` pass (False: ask them)."""
    batch = _batch_ok(r2t_rows, req_idx, seq_lens)
    if batch is None:
        return False
    bs, longest = batch
    return (max_pages >= 0 and (max_pages - 1) * page_size < width and out_rows >= bs and out_cols >= max_pages
            and -(-longest // page_size) <= max_pages)


def packed_ok(*, r2t_rows: int, width: int, req_idx, seq_lens, indptr, kv_start, max_tokens: int, out_len: int,
              page_size: int) -> bool:
    """True only if ``check_batch`` and ``check_read_table_packed`` pass (False: ask them)."""
    batch = _batch_ok(r2t_rows, req_idx, seq_lens)
    if batch is None:
        return False
    bs, longest = batch
    if len(indptr) != bs + 1 or (kv_start is not None and len(kv_start) != bs) or indptr[0] < 0:
        return False
    # indptr[b + 1] - indptr[b] == seq_lens[b] for every b, i.e. indptr is seq_lens' running sum from indptr[0].
    if list(accumulate(seq_lens, initial=indptr[0])) != list(indptr):
        return False
    if indptr[bs] > max_tokens or out_len < max_tokens:
        return False
    if bs == 0 or longest == 0:
        return kv_start is None or bs == 0 or min(kv_start) >= 0
    if kv_start is None:
        last = longest  # the widest row's last token, + 1
    else:
        if min(kv_start) < 0:
            return False
        last = max(map(add, kv_start, seq_lens))  # rows of length 0 included: a bound, never below the true one
    return (last - 1) // page_size * page_size < width


def _sampled() -> bool:
    _calls[0] += 1
    return os.environ.get("KVFUZZ_PREFLIGHT") == "full" or _calls[0] % FULL_EVERY == 0


def check_table_call(ctx, *, r2t_rows: int, width: int, req_idx, seq_lens, max_pages: int, out_rows: int,
                     out_cols: int) -> None:
    """Every clause of one read_table call (the entries' from the bound a pool's v2p keeps)."""
    cfg = ctx.config
    fast = table_ok(r2t_rows=r2t_rows, width=width, req_idx=req_idx, seq_lens=seq_lens, max_pages=max_pages,
                    page_size=cfg.page_size, out_rows=out_rows, out_cols=out_cols)
    if not fast or _sampled():
        bs = pre.check_batch("read_table", r2t_rows=r2t_rows, req_pool_indices=req_idx, seq_lens=seq_lens)
        pre.check_read_table(bs=bs, seq_lens=seq_lens, max_pages=max_pages, page_size=cfg.page_size, width=width,
                             out_rows=out_rows, out_cols=out_cols)
    pre.check_entry_bound("read_table", max_v2p=cfg.table_rows - 1, multiplier=cfg.multiplier,
                          page_size=cfg.page_size)


def check_packed_call(ctx, *, r2t_rows: int, width: int, req_idx, seq_lens, indptr, kv_start, max_tokens: int,
                      out_len: int) -> None:
    """Every clause of one read_table_packed call."""
    cfg = ctx.config
    fast = packed_ok(r2t_rows=r2t_rows, width=width, req_idx=req_idx, seq_lens=seq_lens, indptr=indptr,
                     kv_start=kv_start, max_tokens=max_tokens, out_len=out_len, page_size=cfg.page_size)
    if not fast or _sampled():
        bs = pre.check_batch("read_table_packed", r2t_rows=r2t_rows, req_pool_indices=req_idx, seq_lens=seq_lens)
        pre.check_read_table_packed(bs=bs, seq_lens=seq_lens, indptr=indptr, max_tokens=max_tokens, out_len=out_len,
                                    page_size=cfg.page_size, width=width, kv_start_idx=kv_start)
    pre.check_entry_bound("read_table_packed", max_v2p=cfg.table_rows - 1, multiplier=cfg.multiplier,
                          page_size=cfg.page_size)
