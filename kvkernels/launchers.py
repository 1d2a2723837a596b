"""The default kernel set: launch the Triton kernels, or fall back to the torch path.

Dispatch, per call, on the device of ``v2p``:
- CUDA tensors: the compiled Triton kernels;
- CPU tensors with Triton's interpreter on: the same kernels, interpreted. Triton
  decides interpretation when it decorates a kernel (``TRITON_INTERPRET=1`` set before
  ``kvkernels`` is imported), so this module asks the decorated kernel what it became
  rather than re-reading the environment;
- otherwise (CPU tensors, no interpreter, or no Triton at all): ``kvkernels.torch_path``.

Grids follow SPEC.md §2. ``TARGET_BLOCKS``, ``BLOCK_COLS`` and ``BLOCK_IDS`` are read at
call time, so a test can shrink them (``monkeypatch.setattr(launchers, "BLOCK_COLS", 4)``)
to make the strided loop iterate; each must stay a power of two. The ``_launch_*``
functions take them as arguments for callers that want a one-off size.

Empty input (``N == 0``, ``bs == 0``) returns before any launch. Argument checks look at
shapes, dtypes and devices only, never at values: the free path and the read table must
not synchronise with the host (SPEC.md §5).
"""

from __future__ import annotations

import torch

from . import torch_path
from .torch_path import (
    check_alloc_bind,
    check_batch,
    check_bind,
    check_free,
    check_packed,
    check_read_table_out,
    check_translate,
)

try:
    from . import triton_kernels as _k
except ImportError:  # no Triton: the torch path serves every call
    _k = None

INTERPRET = bool(_k is not None and _k.INTERPRETED)

TARGET_BLOCKS = 1024  # programs the strided read-table grid aims for, whatever bs is
BLOCK_COLS = 512  # columns (pages, or tokens for the packed form) per read-table block
BLOCK_IDS = 1024  # ids per program for bind / alloc_bind / free_unbind / translate

# Launch shapes the fuzzer may pick per sequence (fuzz/knobs.py): with production block
# sizes a small fuzzing pool never takes a second loop iteration or a second program.
FUZZ_KNOBS = {"BLOCK_COLS": (4, 512), "TARGET_BLOCKS": (2, 1024), "BLOCK_IDS": (4, 1024)}
_BLOCK_COLS_DEFAULT = BLOCK_COLS
READ_TABLE_UNROLL: int | None = None  # column blocks per trip of the strided loop (1, 2; None: by shape)
READ_TABLE_WARPS = 4  # Triton's default: what every read-table launch used before the tuned choice

# The tuned read-table launch, per shape: (bs at most, max_pages at most, legacy, BLOCK_COLS,
# num_warps), first match wins; shapes no rule covers keep (BLOCK_COLS, READ_TABLE_WARPS).
# Filled from one GPU run of benchmarks/sweep_read_table.py (it prints rules in this form).
# Each BLOCK_COLS must be a power of two.
READ_TABLE_RULES: tuple[tuple[int, int, bool, int, int], ...] = (
    # (max bs, max max_pages, legacy, BLOCK_COLS, num_warps): from one H200 sweep of the
    # strided grid, graph-replayed at live lengths 1k/8k/128k tokens, the config with the best
    # geometric mean per (bs, max_pages) (benchmarks/sweep_read_table.py,
    # benchmarks/results/read-table-h200/sweep-read-table.json). The legacy grid keeps its
    # historical (512, 4): it is the reference the strided grid is measured against.
    (1, 8192, False, 128, 8),
    (16, 8192, False, 512, 4),
    (64, 8192, False, 128, 2),
    (256, 8192, False, 128, 4),
    (512, 8192, False, 128, 4),
    (1, 131072, False, 128, 4),
    (16, 131072, False, 512, 8),
    (64, 131072, False, 512, 8),
    (256, 131072, False, 512, 8),
    (512, 131072, False, 512, 8),
)

__all__ = [
    "alloc_bind_inplace",
    "bind_inplace",
    "build_kv_read_table",
    "build_kv_read_table_legacy",
    "build_kv_read_table_packed",
    "free_unbind_inplace",
    "translate_tokens",
    "uses_triton",
]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def uses_triton(t: torch.Tensor) -> bool:
    """Whether a call whose tables live where ``t`` does runs the Triton kernels."""
    device = getattr(t, "device", None)
    if _k is None or device is None:
        return False
    return device.type == "cuda" or (INTERPRET and device.type == "cpu")


def read_table_grid(bs: int, max_pages: int, *, block_cols: int, target_blocks: int) -> tuple[int, int]:
    """The bs-sized strided grid: (bs, min(cdiv(TARGET_BLOCKS, bs), cdiv(max_pages, BLOCK_COLS)))."""
    return bs, min(cdiv(target_blocks, bs), cdiv(max_pages, block_cols))


def read_table_launch(bs: int, max_pages: int, *, legacy: bool = False) -> tuple[int, int]:
    """(BLOCK_COLS, num_warps) for a read table of ``bs`` rows and ``max_pages`` columns.

    Host ints from shapes only, never tensor values: the choice is the same at capture and at
    every replay of a CUDA graph, and costs no synchronisation. A ``BLOCK_COLS`` changed from
    its default (a test's monkeypatch, the fuzzer's knobs) wins over the rules.
    """
    if BLOCK_COLS != _BLOCK_COLS_DEFAULT:
        return BLOCK_COLS, READ_TABLE_WARPS
    for max_bs, most_pages, rule_legacy, block_cols, num_warps in READ_TABLE_RULES:
        if bs <= max_bs and max_pages <= most_pages and legacy == rule_legacy:
            return block_cols, num_warps
    return BLOCK_COLS, READ_TABLE_WARPS


def read_table_unroll(bs: int, max_pages: int) -> int:
    """Column blocks per trip of the strided loop: two where rows are long and many (each
    program makes many trips, and two blocks' loads in flight together hide latency: on an
    H200, bs 64/256/512 at 128k pages ran 1-4% faster, benchmarks/results/read-table-h200/
    ab-unroll.json), one elsewhere (where it measured no better). Host ints only."""
    if READ_TABLE_UNROLL is not None:
        return READ_TABLE_UNROLL
    return 2 if bs >= 64 and max_pages > 8192 else 1


def legacy_read_table_grid(bs: int, max_pages: int, *, block_cols: int) -> tuple[int, int]:
    """The legacy grid: one program per column block, whatever the live length."""
    return bs, cdiv(max_pages, block_cols)


def _ids(x: torch.Tensor) -> torch.Tensor:
    return x if x.is_contiguous() else x.contiguous()


# ---------------------------------------------------------------- table kernels


def bind_inplace(v_pages, p_pages, v2p, p2v) -> None:
    if not uses_triton(v2p):
        return torch_path.bind_inplace(v_pages, p_pages, v2p, p2v)
    return _launch_bind(v_pages, p_pages, v2p, p2v, block=BLOCK_IDS)


def _launch_bind(v_pages, p_pages, v2p, p2v, *, block: int) -> None:
    n = check_bind(v_pages, p_pages, v2p, p2v)
    if n == 0:
        return None
    _k.bind_kernel[(cdiv(n, block),)](
        _ids(v_pages), _ids(p_pages), v2p, p2v, n, v2p.numel(), p2v.numel(), BLOCK=block
    )
    return None


def alloc_bind_inplace(v_pages, v2p, p2v, start_phys):
    if not uses_triton(v2p):
        return torch_path.alloc_bind_inplace(v_pages, v2p, p2v, start_phys)
    return _launch_alloc_bind(v_pages, v2p, p2v, start_phys, block=BLOCK_IDS)


def _launch_alloc_bind(v_pages, v2p, p2v, start_phys, *, block: int):
    n = check_alloc_bind(v_pages, v2p, p2v, start_phys)
    p_pages = torch.empty(n, dtype=torch.int64, device=v2p.device)
    if n == 0:
        return p_pages
    _k.alloc_bind_kernel[(cdiv(n, block),)](
        _ids(v_pages), v2p, p2v, p_pages, start_phys, n, v2p.numel(), p2v.numel(), BLOCK=block
    )
    return p_pages


def free_unbind_inplace(v_pages, v2p, p2v):
    if not uses_triton(v2p):
        return torch_path.free_unbind_inplace(v_pages, v2p, p2v)
    return _launch_free_unbind(v_pages, v2p, p2v, block=BLOCK_IDS)


def _launch_free_unbind(v_pages, v2p, p2v, *, block: int):
    n = check_free(v_pages, v2p, p2v)
    p_pages = torch.empty(n, dtype=torch.int64, device=v2p.device)
    if n == 0:
        return p_pages
    _k.free_unbind_kernel[(cdiv(n, block),)](
        _ids(v_pages), v2p, p2v, p_pages, n, v2p.numel(), p2v.numel(), BLOCK=block
    )
    return p_pages


def translate_tokens(*, loc, v2p, page_size, out=None):
    if not uses_triton(v2p):
        return torch_path.translate_tokens(loc=loc, v2p=v2p, page_size=page_size, out=out)
    return _launch_translate(loc, v2p, page_size, out, block=BLOCK_IDS)


def _launch_translate(loc, v2p, page_size, out, *, block: int):
    n = check_translate(loc, v2p, page_size, out)
    if out is None:
        out = torch.empty(n, dtype=torch.int64, device=v2p.device)
    if n == 0:
        return out
    _k.translate_kernel[(cdiv(n, block),)](_ids(loc), v2p, out, n, v2p.numel(), PAGE_SIZE=page_size, BLOCK=block)
    return out


# ---------------------------------------------------------------- read tables


def build_kv_read_table(*, req_to_token, req_pool_indices, seq_lens, v2p, multiplier, page_size, max_pages, out):
    args = dict(req_to_token=req_to_token, req_pool_indices=req_pool_indices, seq_lens=seq_lens, v2p=v2p,
                multiplier=multiplier, page_size=page_size, max_pages=max_pages, out=out)
    if not uses_triton(v2p):
        return torch_path.build_kv_read_table(**args)
    return _launch_read_table(**args, legacy=False, block_cols=None, target_blocks=TARGET_BLOCKS)


def build_kv_read_table_legacy(*, req_to_token, req_pool_indices, seq_lens, v2p, multiplier, page_size, max_pages,
                               out):
    args = dict(req_to_token=req_to_token, req_pool_indices=req_pool_indices, seq_lens=seq_lens, v2p=v2p,
                multiplier=multiplier, page_size=page_size, max_pages=max_pages, out=out)
    if not uses_triton(v2p):
        return torch_path.build_kv_read_table_legacy(**args)
    return _launch_read_table(**args, legacy=True, block_cols=None, target_blocks=TARGET_BLOCKS)


def _launch_read_table(*, req_to_token, req_pool_indices, seq_lens, v2p, multiplier, page_size, max_pages, out,
                       legacy: bool, block_cols: int | None, target_blocks: int, num_warps: int | None = None,
                       unroll: int | None = None):
    """``block_cols`` None: the tuned choice for this shape (``read_table_launch``)."""
    bs = check_batch(req_to_token, req_pool_indices, seq_lens, v2p, multiplier, page_size)
    if block_cols is None:
        block_cols, chosen_warps = read_table_launch(bs, max_pages, legacy=legacy)
        num_warps = num_warps or chosen_warps
    num_warps = num_warps or READ_TABLE_WARPS
    check_read_table_out(out, bs, max_pages, v2p.device)
    if bs == 0 or max_pages == 0 or req_to_token.numel() == 0:
        return out
    common = (
        req_to_token, _ids(req_pool_indices), _ids(seq_lens), v2p, out,
        req_to_token.shape[0], req_to_token.shape[1], req_to_token.stride(0), req_to_token.stride(1),
        v2p.numel(), out.stride(0), multiplier, max_pages,
    )
    if legacy:
        grid = legacy_read_table_grid(bs, max_pages, block_cols=block_cols)
        _k.read_table_legacy_kernel[grid](*common, PAGE_SIZE=page_size, BLOCK=block_cols, num_warps=num_warps)
    else:
        grid = read_table_grid(bs, max_pages, block_cols=block_cols, target_blocks=target_blocks)
        _k.read_table_kernel[grid](*common, grid[1] * block_cols, PAGE_SIZE=page_size, BLOCK=block_cols,
                                   UNROLL=unroll or read_table_unroll(bs, max_pages), num_warps=num_warps)
    return out


def build_kv_read_table_packed(*, req_to_token, req_pool_indices, seq_lens, v2p, indptr, multiplier, page_size,
                               max_tokens, out, kv_start_idx=None):
    args = dict(req_to_token=req_to_token, req_pool_indices=req_pool_indices, seq_lens=seq_lens, v2p=v2p,
                indptr=indptr, multiplier=multiplier, page_size=page_size, max_tokens=max_tokens, out=out,
                kv_start_idx=kv_start_idx)
    if not uses_triton(v2p):
        return torch_path.build_kv_read_table_packed(**args)
    return _launch_read_table_packed(**args, block_cols=BLOCK_COLS, target_blocks=TARGET_BLOCKS)


def _launch_read_table_packed(*, req_to_token, req_pool_indices, seq_lens, v2p, indptr, multiplier, page_size,
                              max_tokens, out, kv_start_idx, block_cols: int, target_blocks: int):
    bs = check_batch(req_to_token, req_pool_indices, seq_lens, v2p, multiplier, page_size)
    check_packed(indptr, kv_start_idx, out, bs, max_tokens, v2p.device)
    if bs == 0 or max_tokens == 0 or req_to_token.numel() == 0 or out.numel() == 0:
        return out
    grid = read_table_grid(bs, max_tokens, block_cols=block_cols, target_blocks=target_blocks)
    has_start = kv_start_idx is not None
    _k.read_table_packed_kernel[grid](
        req_to_token, _ids(req_pool_indices), _ids(seq_lens), v2p, _ids(indptr),
        _ids(kv_start_idx) if has_start else seq_lens, out,
        req_to_token.shape[0], req_to_token.shape[1], req_to_token.stride(0), req_to_token.stride(1),
        v2p.numel(), out.numel(), multiplier, max_tokens, grid[1] * block_cols,
        PAGE_SIZE=page_size, BLOCK=block_cols, HAS_KV_START=has_start,
    )
    return out
