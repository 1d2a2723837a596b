"""SPEC.md §2 in plain torch: the torch tier, and the fallback of the launchers on CPU.

This module is a kernel set on its own (``--kernels kvkernels.torch_path``). It keeps
the semantics of ``kvkernels.triton_kernels`` lane for lane, including the rules for
input that breaks a precondition (see that module's docstring), so the two tiers can be
diffed on hostile input too.

Two rules shape the code:
- No torch index wrapping: a ``-1`` must never reach the last row. Every gather goes
  through an index that was made safe with ``torch.where`` and every scatter is masked.
- No host synchronisation (SPEC.md §5): no boolean-mask indexing, no ``nonzero``, no
  ``.item()``; a masked scatter is an accumulating ``index_put_`` of
  ``where(ok, new - old, 0)``, exact whenever the written ids are unique (a
  precondition) and a no-op on masked lanes.

The argument checks here look at shapes, dtypes and devices only (never at values), so
they cost no synchronisation; the launchers share them.
"""

from __future__ import annotations

import torch

from kvref.errors import ContractViolation

__all__ = [
    "alloc_bind_inplace",
    "bind_inplace",
    "build_kv_read_table",
    "build_kv_read_table_legacy",
    "build_kv_read_table_packed",
    "free_unbind_inplace",
    "translate_tokens",
]

_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


# ---------------------------------------------------------------- argument checks


def check_ids(x, what: str, device: torch.device) -> int:
    if not isinstance(x, torch.Tensor) or x.dim() != 1 or x.dtype not in _INT_DTYPES:
        raise ContractViolation(f"{what} must be a 1-D integer tensor, got {_describe(x)}")
    if x.device != device:
        raise ContractViolation(f"{what} is on {x.device}, the tables on {device}")
    return x.numel()


def _check_table(t, what: str) -> None:
    if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype != torch.int64:
        raise ContractViolation(f"{what} must be a 1-D int64 tensor, got {_describe(t)}")
    if t.numel() > 1 and t.stride(0) != 1:
        raise ContractViolation(f"{what} must be contiguous: it is written in place")


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor(shape={tuple(x.shape)}, dtype={x.dtype}, device={x.device})"
    return repr(type(x))


def check_tables(v2p, p2v) -> None:
    _check_table(v2p, "v2p")
    _check_table(p2v, "p2v")
    if p2v.device != v2p.device:
        raise ContractViolation(f"v2p is on {v2p.device} but p2v on {p2v.device}")


def check_bind(v_pages, p_pages, v2p, p2v) -> int:
    check_tables(v2p, p2v)
    n = check_ids(v_pages, "v_pages", v2p.device)
    if check_ids(p_pages, "p_pages", v2p.device) != n:
        raise ContractViolation(f"bind got {n} virtual pages but {p_pages.numel()} physical pages")
    return n


def check_alloc_bind(v_pages, v2p, p2v, start_phys) -> int:
    check_tables(v2p, p2v)
    if not isinstance(start_phys, int) or isinstance(start_phys, bool):
        raise ContractViolation(f"start_phys must be a Python int, got {start_phys!r}")
    return check_ids(v_pages, "v_pages", v2p.device)


def check_free(v_pages, v2p, p2v) -> int:
    check_tables(v2p, p2v)
    return check_ids(v_pages, "v_pages", v2p.device)


def check_batch(req_to_token, req_pool_indices, seq_lens, v2p, multiplier: int, page_size: int) -> int:
    """Shape checks shared by both read tables; returns bs."""
    _check_table(v2p, "v2p")
    if not isinstance(req_to_token, torch.Tensor) or req_to_token.dim() != 2 or req_to_token.dtype not in _INT_DTYPES:
        raise ContractViolation(f"req_to_token must be a 2-D integer tensor, got {_describe(req_to_token)}")
    if req_to_token.device != v2p.device:
        raise ContractViolation(f"req_to_token is on {req_to_token.device}, v2p on {v2p.device}")
    bs = check_ids(req_pool_indices, "req_pool_indices", v2p.device)
    if check_ids(seq_lens, "seq_lens", v2p.device) != bs:
        raise ContractViolation(f"req_pool_indices has {bs} rows but seq_lens has {seq_lens.numel()}")
    if not isinstance(page_size, int) or page_size < 1:
        raise ContractViolation(f"page_size must be an int >= 1, got {page_size!r}")
    if not isinstance(multiplier, int) or isinstance(multiplier, bool):
        raise ContractViolation(f"multiplier must be a Python int, got {multiplier!r}")
    return bs


def check_read_table_out(out, bs: int, max_pages: int, device: torch.device) -> None:
    if not isinstance(max_pages, int) or max_pages < 0:
        raise ContractViolation(f"max_pages must be an int >= 0, got {max_pages!r}")
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.dtype != torch.int32:
        raise ContractViolation(f"out must be a 2-D int32 tensor, got {_describe(out)}")
    if out.device != device:
        raise ContractViolation(f"out is on {out.device}, v2p on {device}")
    if out.shape[0] < bs or out.shape[1] < max_pages:
        raise ContractViolation(f"out is {tuple(out.shape)}; it needs at least ({bs}, {max_pages})")
    if max_pages > 1 and out.stride(1) != 1:
        raise ContractViolation(f"out columns must be packed (stride(1) == 1), got strides {out.stride()}")
    if bs > 1 and out.stride(0) < max_pages:
        raise ContractViolation(f"out rows overlap: row stride {out.stride(0)} < max_pages={max_pages}")


def check_packed(indptr, kv_start_idx, out, bs: int, max_tokens: int, device: torch.device) -> None:
    if not isinstance(max_tokens, int) or max_tokens < 0:
        raise ContractViolation(f"max_tokens must be an int >= 0, got {max_tokens!r}")
    if check_ids(indptr, "indptr", device) < bs + 1:
        raise ContractViolation(f"indptr needs bs + 1 = {bs + 1} entries, got {indptr.numel()}")
    if kv_start_idx is not None and check_ids(kv_start_idx, "kv_start_idx", device) != bs:
        raise ContractViolation(f"kv_start_idx needs {bs} entries, got {kv_start_idx.numel()}")
    if not isinstance(out, torch.Tensor) or out.dim() != 1 or out.dtype != torch.int32:
        raise ContractViolation(f"out must be a 1-D int32 tensor, got {_describe(out)}")
    if out.device != device:
        raise ContractViolation(f"out is on {out.device}, v2p on {device}")
    if out.numel() > 1 and out.stride(0) != 1:
        raise ContractViolation("out must be contiguous")


def check_translate(loc, v2p, page_size: int, out) -> int:
    _check_table(v2p, "v2p")
    n = check_ids(loc, "loc", v2p.device)
    if not isinstance(page_size, int) or page_size < 1:
        raise ContractViolation(f"page_size must be an int >= 1, got {page_size!r}")
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.dim() != 1 or out.dtype != torch.int64 or out.numel() != n:
            raise ContractViolation(f"out must be a 1-D int64 tensor of {n} entries, got {_describe(out)}")
        if out.device != v2p.device:
            raise ContractViolation(f"out is on {out.device}, v2p on {v2p.device}")
        if n > 1 and out.stride(0) != 1:
            raise ContractViolation("out must be contiguous")
    return n


# ---------------------------------------------------------------- safe gather / scatter


def _in_range(idx: torch.Tensor, rows: int) -> torch.Tensor:
    return (idx >= 0) & (idx < rows)


def _gather(table: torch.Tensor, idx: torch.Tensor, ok: torch.Tensor, other: int) -> torch.Tensor:
    """table[idx] where ok, else other; idx is never used where not ok (no wrapping)."""
    if table.numel() == 0:
        return torch.full(idx.shape, other, dtype=table.dtype, device=idx.device)
    return torch.where(ok, table[torch.where(ok, idx, 0)], other)


def _scatter(table: torch.Tensor, idx: torch.Tensor, values: torch.Tensor, ok: torch.Tensor) -> None:
    """table[idx] = values on lanes where ok; other lanes write nothing."""
    if table.numel() == 0:
        return
    safe = torch.where(ok, idx, 0)
    delta = torch.where(ok, values - table[safe], 0)
    table.index_put_((safe,), delta, accumulate=True)


# ---------------------------------------------------------------- table kernels


def bind_inplace(v_pages, p_pages, v2p, p2v) -> None:
    if check_bind(v_pages, p_pages, v2p, p2v) == 0:
        return None
    v = v_pages.to(torch.int64)
    p = p_pages.to(torch.int64)
    _scatter(v2p, v, p, _in_range(v, v2p.numel()))
    _scatter(p2v, p, v, _in_range(p, p2v.numel()))
    return None


def alloc_bind_inplace(v_pages, v2p, p2v, start_phys):
    n = check_alloc_bind(v_pages, v2p, p2v, start_phys)
    p_pages = torch.arange(start_phys, start_phys + n, dtype=torch.int64, device=v2p.device)
    if n:
        bind_inplace(v_pages, p_pages, v2p, p2v)
    return p_pages


def free_unbind_inplace(v_pages, v2p, p2v):
    if check_free(v_pages, v2p, p2v) == 0:
        return torch.empty(0, dtype=torch.int64, device=v2p.device)
    v = v_pages.to(torch.int64)
    v_ok = _in_range(v, v2p.numel())
    p = _gather(v2p, v, v_ok, -1)
    tombstone = torch.full_like(v, -1)
    _scatter(v2p, v, tombstone, v_ok)
    # A double free reads p == -1: that lane must write no p2v row.
    _scatter(p2v, p, tombstone, v_ok & _in_range(p, p2v.numel()))
    return p


def translate_tokens(*, loc, v2p, page_size, out=None):
    n = check_translate(loc, v2p, page_size, out)
    if out is None:
        out = torch.empty(n, dtype=torch.int64, device=v2p.device)
    if n == 0:
        return out
    t = loc.to(torch.int64)
    nonneg = t >= 0
    t = torch.where(nonneg, t, 0)
    page = t // page_size
    ok = nonneg & (page < v2p.numel())
    phys = _gather(v2p, page, ok, 0)
    slot = torch.clamp(phys * page_size + t % page_size, min=0)
    out.copy_(torch.where(ok, slot, 0))
    return out


# ---------------------------------------------------------------- read tables


def _rows(req_to_token, req_pool_indices):
    """(req row made safe, row ok) for each batch row."""
    req = req_pool_indices.to(torch.int64)
    ok = _in_range(req, req_to_token.shape[0])
    return torch.where(ok, req, 0), ok


def _scaled_pages(tok: torch.Tensor, v2p, multiplier: int, page_size: int, ok: torch.Tensor) -> torch.Tensor:
    """max(v2p[page] * multiplier, 0), page = 0 if tok < 0 else tok // ps; past the table: 0."""
    page = torch.where(tok < 0, 0, tok) // page_size
    phys = _gather(v2p, page, ok & (page < v2p.numel()), 0)
    return torch.clamp(phys * multiplier, min=0)


def _gather_tokens(req_to_token, req, col, ok) -> torch.Tensor:
    """req_to_token[req, col] (broadcast) as int64 where ok, -1 elsewhere."""
    req_b, col_b = torch.broadcast_tensors(req, col)
    tok = req_to_token[torch.where(ok, req_b, 0), torch.where(ok, col_b, 0)]
    return torch.where(ok, tok.to(torch.int64), -1)


def build_kv_read_table(*, req_to_token, req_pool_indices, seq_lens, v2p, multiplier, page_size, max_pages, out):
    bs = check_batch(req_to_token, req_pool_indices, seq_lens, v2p, multiplier, page_size)
    check_read_table_out(out, bs, max_pages, v2p.device)
    if bs == 0 or max_pages == 0 or req_to_token.numel() == 0:
        return out
    req, row_ok = _rows(req_to_token, req_pool_indices)
    seq = seq_lens.to(torch.int64)
    n_pages = torch.where(row_ok, torch.clamp((seq + page_size - 1) // page_size, max=max_pages), 0)
    cols = torch.arange(max_pages, dtype=torch.int64, device=v2p.device)
    tok_col = cols * page_size
    ok = (cols[None, :] < n_pages[:, None]) & (tok_col < req_to_token.shape[1])[None, :]
    tok = _gather_tokens(req_to_token, req[:, None], tok_col[None, :], ok)
    entry = _scaled_pages(tok, v2p, multiplier, page_size, ok).to(torch.int32)
    live = out[:bs, :max_pages]
    live.copy_(torch.where(ok, entry, live))
    return out


def build_kv_read_table_legacy(*, req_to_token, req_pool_indices, seq_lens, v2p, multiplier, page_size, max_pages, out):
    """The grid is a Triton concern; in torch both forms are the same computation."""
    return build_kv_read_table(
        req_to_token=req_to_token,
        req_pool_indices=req_pool_indices,
        seq_lens=seq_lens,
        v2p=v2p,
        multiplier=multiplier,
        page_size=page_size,
        max_pages=max_pages,
        out=out,
    )


def build_kv_read_table_packed(
    *, req_to_token, req_pool_indices, seq_lens, v2p, indptr, multiplier, page_size, max_tokens, out, kv_start_idx=None
):
    bs = check_batch(req_to_token, req_pool_indices, seq_lens, v2p, multiplier, page_size)
    check_packed(indptr, kv_start_idx, out, bs, max_tokens, v2p.device)
    if bs == 0 or max_tokens == 0 or req_to_token.numel() == 0 or out.numel() == 0:
        return out
    dev = v2p.device
    req, row_ok = _rows(req_to_token, req_pool_indices)
    n = torch.where(row_ok, torch.clamp(seq_lens.to(torch.int64), max=max_tokens), 0)
    ip = indptr.to(torch.int64)
    lo = ip[:bs]
    hi = torch.clamp(ip[1 : bs + 1], max=out.numel())
    start = torch.zeros(bs, dtype=torch.int64, device=dev) if kv_start_idx is None else kv_start_idx.to(torch.int64)
    cols = torch.arange(max_tokens, dtype=torch.int64, device=dev)[None, :]
    pos = start[:, None] + cols
    dst = lo[:, None] + cols
    nonneg = pos >= 0
    safe_pos = torch.where(nonneg, pos, 0)
    tok_col = (safe_pos // page_size) * page_size
    ok = (cols < n[:, None]) & nonneg & (tok_col < req_to_token.shape[1]) & (dst >= 0) & (dst < hi[:, None])
    tok = _gather_tokens(req_to_token, req[:, None], tok_col, ok)
    scaled = _scaled_pages(tok, v2p, multiplier, page_size, ok)
    value = (scaled * page_size + safe_pos % page_size).to(torch.int32)
    # Live lanes have distinct destinations unless the indptr spans overlap (a contract
    # violation, where the accumulating scatter stays inside out all the same).
    _scatter(out, dst.reshape(-1), value.reshape(-1), ok.reshape(-1))
    return out
