"""Checked mode of ``DeviceAllocator``: SPEC preconditions, read from host copies.

``DeviceAllocator(checked=True)`` calls these before it changes anything, and each
raises the ContractViolation the spec would (naming the page, row or column), so a
refused call leaves the pool byte-identical. They read device memory (``tolist``), so
they synchronise: checked mode is for the fuzzer and for debugging, never the free
path of a server.
"""

from __future__ import annotations

import torch

from kvref.config import PoolConfig
from kvref.errors import ContractViolation


def check_write(c: PoolConfig, v2p: torch.Tensor, tokens: torch.Tensor, stamps: torch.Tensor) -> None:
    if tokens.shape != stamps.shape:
        raise ContractViolation(f"write: {tokens.numel()} tokens but {stamps.numel()} stamps")
    if torch.unique(tokens).numel() != tokens.numel():
        raise ContractViolation("write: a token appears twice (lanes would race on one slot)")
    check_live_tokens(c, v2p, tokens, "write")


def check_live_pages(c: PoolConfig, pages: list[int], why: str, v2p: list[int]) -> None:
    for p in pages:
        if not c.min_page <= p < c.num_pages:
            kind = "reserved" if 0 <= p < c.min_page else "out of range"
            raise ContractViolation(f"{why}: page {p} is {kind} (allocatable pages are [{c.min_page}, {c.num_pages}))")
        if v2p[p] == -1:
            raise ContractViolation(f"{why}: page {p} is not allocated")


def check_live_tokens(c: PoolConfig, v2p: torch.Tensor, tokens: torch.Tensor, why: str) -> None:
    ps = c.page_size
    toks = tokens.tolist()
    for t in toks:
        if t < 0:
            raise ContractViolation(f"{why}: token {t} is negative")
    check_live_pages(c, [t // ps for t in toks], why, v2p.tolist())


def check_read_table(c: PoolConfig, v2p_t: torch.Tensor, req_to_token, req_idx, seq_lens, *, out, max_pages=None, indptr=None,
                      max_tokens=None, kv_start=None) -> None:
    """SPEC §2 read-table preconditions, checked on host copies (checked mode only).

    ``req_to_token`` may be int32 or int64 (SPEC §2); only the rows the batch names are
    read back, so a server-sized table (max requests x max context) costs what its batch
    reads, not its size."""
    ps, v2p = c.page_size, v2p_t.tolist()
    rows, lens = req_idx.tolist(), seq_lens.tolist()
    n_rows = req_to_token.shape[0] if req_to_token.dim() == 2 else 0
    width = req_to_token.shape[1] if req_to_token.dim() == 2 else 0
    named = sorted({r for r in rows if 0 <= r < n_rows})
    r2t = dict(zip(named, req_to_token[torch.tensor(named, dtype=torch.int64, device=req_to_token.device)].tolist())) \
        if named else {}
    starts = [0] * len(rows) if kv_start is None else kv_start.tolist()
    if len(lens) != len(rows):
        raise ContractViolation(f"req_pool_indices has {len(rows)} rows but seq_lens has {len(lens)}")
    if max_pages is not None:
        if max_pages < 0 or (max_pages - 1) * ps >= width:
            raise ContractViolation(f"req_to_token is {width} tokens wide: too narrow for max_pages={max_pages}")
        if out.dim() != 2 or out.shape[0] < len(rows) or out.shape[1] < max_pages:
            raise ContractViolation(f"out must have >= {len(rows)} rows of >= {max_pages} columns")
    else:
        ptr = indptr.tolist()
        if len(ptr) != len(rows) + 1 or len(starts) != len(rows):
            raise ContractViolation(f"indptr needs {len(rows) + 1} entries and kv_start_idx {len(rows)}")
        # SPEC §2 (kvref.preconditions: indptr_within_max_tokens, out_holds_max_tokens)
        if ptr[-1] > max_tokens or out.numel() < max_tokens:
            raise ContractViolation(f"indptr[bs] = {ptr[-1]} and out of {out.numel()} elements: SPEC §2 asks "
                                    f"indptr[bs] <= max_tokens = {max_tokens} <= len(out)")
    for b, (r, n, start) in enumerate(zip(rows, lens, starts)):
        if r not in r2t:
            raise ContractViolation(f"req_to_token row index {r} (req_pool_indices[{b}]) is outside [0, {n_rows})")
        if n < 0 or start < 0:
            raise ContractViolation(f"seq_lens[{b}] = {n} / kv_start {start}: negative")
        if max_pages is not None:
            cols = [(col * ps, None) for col in range(-(-n // ps))]
            if len(cols) > max_pages:
                raise ContractViolation(f"seq_lens[{b}] = {n} needs {len(cols)} pages > max_pages={max_pages}")
        else:
            if n > max_tokens or ptr[b] < 0 or ptr[b] + n != ptr[b + 1]:  # SPEC §2: indptr_consistent
                raise ContractViolation(f"row {b} writes out[{ptr[b]}:{ptr[b] + n}], outside its indptr span or out")
            cols = [(((start + col) // ps) * ps, start + col) for col in range(n)]
        for col, pos in cols:
            if col >= width:
                raise ContractViolation(f"row {b} reads req_to_token column {col} past its width {width}")
            tok = r2t[r][col]
            page = 0 if tok < 0 else tok // ps
            if page >= len(v2p):
                raise ContractViolation(f"token {tok} at row {b} lies on page {page}, past the table")
            scaled = max(v2p[page] * c.multiplier, 0)
            if (scaled if pos is None else scaled * ps + pos % ps) >= 2**31:
                raise ContractViolation(f"the entry for v2p[{page}] does not fit int32 (row {b})")


def check_free(c: PoolConfig, v2p: torch.Tensor, tokens: torch.Tensor) -> None:
    ps = c.page_size
    toks = tokens.tolist()
    if ps > 1:
        for i, t in enumerate(toks):
            head = toks[i - i % ps]
            if head % ps != 0:
                raise ContractViolation(f"free run: page {head // ps}: token {head} at index {i - i % ps} does not start a page (page_size={ps})")
            if t != head + i % ps:
                raise ContractViolation(f"free run: page {head // ps}: tokens[{i}] = {t}, expected {head + i % ps} (a page's tokens must be consecutive)")
    pages = toks[::ps]
    pages = [t // ps for t in pages]
    seen: set[int] = set()
    for p in pages:
        if p in seen:
            raise ContractViolation(f"free: page {p} appears twice")
        seen.add(p)
    check_live_pages(c, pages, "free (double free or never allocated)", v2p.tolist())


def check_free_in_flight(c: PoolConfig, tokens: torch.Tensor, in_flight_pages: torch.Tensor, event_id: int) -> None:
    """A lazy pool may not free a page the unfired in-flight forward writes (kvref)."""
    ps = c.page_size
    pinned = set(in_flight_pages.tolist())
    for p in [t // ps for t in tokens.tolist()[::ps]]:
        if p in pinned:
            raise ContractViolation(f"free: page {p} is written by the in-flight forward (event {event_id}), "
                                    "which has not fired: a lazy pool cannot free it until the forward completes")
