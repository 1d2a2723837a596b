"""The seeded per-row inputs of the production read tables: ``seq_lens``, ``req_pool_indices``,
the packed layout's ``indptr`` and ``kv_start``, from an op's few ints (``ops``).

Case files replay ops from these descriptors, so each value is fixed by the row-by-row
Python definition (``hash_int`` per row); large batches compute the same values with torch
on the CPU (``arith.vectorizable``), a tenth of the host time at 512 rows, and an op's
check, inputs and size share one computation (``functools.lru_cache``).
``tests/fuzz/test_preflight.py`` compares them with the loops over many seeds.
"""

from __future__ import annotations

import functools
from array import array
from itertools import accumulate

from .. import lazy
from ..ops import Ints
from .arith import hash_rows, row_hashes, vectorizable

torch = lazy.Torch(globals())  # imported where first used: lazy.py says why


def _seq_lens(seed: int, bs: int, cap: int, long_len: int, n_long: int) -> list[int]:
    """``long_len`` for the ``n_long`` rows ``(i + seed) mod bs < n_long``; a seeded length in [0, cap] elsewhere."""
    return list(_seq_lens_of(seed, bs, cap, long_len, n_long))


@functools.lru_cache(maxsize=256)
def _seq_lens_of(seed: int, bs: int, cap: int, long_len: int, n_long: int) -> tuple[int, ...]:
    """``_seq_lens``, once per op (its check, its inputs, its size all ask), with torch on the
    CPU for large batches: the same values (``tests/fuzz/test_preflight.py`` compares them with
    the row-by-row loop over many seeds), a tenth of the time at 512 rows."""
    if cap >= 0 and vectorizable(bs, seed, cap, long_len, n_long):
        i = torch.arange(bs, dtype=torch.int64)
        h = hash_rows(bs, seed)
        zero = h.remainder(8) == 0
        lens = torch.where(zero, 0, h.remainder_(cap + 1))
        return tuple(torch.where(i.add_(seed % bs).remainder_(bs) < n_long, long_len, lens).tolist())
    out = []
    for i, h in enumerate(row_hashes(bs, seed)):
        if (i + seed) % bs < n_long:
            out.append(long_len)
        else:
            out.append(0 if h % 8 == 0 else h % (cap + 1))
    return tuple(out)


def device_ints(values, device) -> torch.Tensor:
    """``values`` (host ints) as an int64 tensor on ``device``, without waiting for the device.

    ``torch.tensor(values, device="cuda")`` copies with a stream synchronize: every op's
    inputs would wait for every kernel queued before them, and the host could never run
    ahead of the device (``ScaleRun.defer`` would queue checks for nothing). A copy from
    pageable memory with ``non_blocking`` is staged by the driver at once and needs no sync
    (CUDA's "API synchronization behavior"), so the host list may go right away.

    ``values`` is a sequence. Its ints are packed by ``array`` (2.5x faster than
    ``torch.tensor`` on a list of 512 ints); an empty one, or one ``array`` refuses (a value
    past int64, a float), goes through ``torch.tensor`` as before: the same values, the same
    errors (``tests/fuzz/test_host_ops.py``)."""
    try:
        packed = array("q", values)
    except (OverflowError, TypeError):
        packed = None
    if not packed:
        t = torch.tensor(values, dtype=torch.int64)
        return t if str(device) == "cpu" else t.to(device, non_blocking=True)
    t = torch.frombuffer(packed, dtype=torch.int64)  # a view of ``packed``: copied, so the tensor owns its storage
    return t.clone() if str(device) == "cpu" else t.to(device, non_blocking=True)


def _req_idx(req: Ints, bs: int) -> list[int]:
    a, b, rows = req
    return [(a * i + b) % rows for i in range(bs)]


def _req_tensor(req: Ints, bs: int, device) -> torch.Tensor:
    """``_req_idx`` as an int64 tensor on ``device``."""
    a, b, rows = req
    if rows >= 1 and vectorizable(bs, a * bs, b, rows):
        return torch.arange(bs, dtype=torch.int64, device=device).mul_(a).add_(b).remainder_(rows)
    return device_ints(_req_idx(req, bs), device)


def packed_layout(seed: int, bs: int, max_tokens: int, long_len: int, n_long: int, gap: int, has_start: bool,
                  width: int) -> tuple[list[int], list[int], list[int] | None]:
    """(seq_lens, indptr, kv_start or None) of a packed read table."""
    seq, indptr, starts = _packed_layout_of(seed, bs, max_tokens, long_len, n_long, gap, has_start, width)
    return list(seq), list(indptr), None if starts is None else list(starts)


@functools.lru_cache(maxsize=256)
def _packed_layout_of(seed: int, bs: int, max_tokens: int, long_len: int, n_long: int, gap: int, has_start: bool,
                      width: int) -> tuple[tuple, tuple, tuple | None]:
    """``packed_layout``, once per op, large batches' starts with torch on the CPU (the same values)."""
    seq = _seq_lens_of(seed, bs, max_tokens, long_len, n_long)
    if gap:
        indptr = [0]
        for n, h in zip(seq, row_hashes(len(seq), seed + 3)):
            indptr.append(indptr[-1] + n + h % (gap + 1))
    else:
        indptr = list(accumulate(seq, initial=0))
    starts = None
    if has_start and seq and max(seq) <= width and vectorizable(bs, seed + 4, width, min(seq)):
        room = torch.tensor(seq, dtype=torch.int64).neg_().add_(width + 1)  # >= 1 on every row
        starts = tuple(hash_rows(bs, seed + 4).remainder_(room).tolist())
    elif has_start:
        starts = tuple(h % (width - n + 1) for n, h in zip(seq, row_hashes(len(seq), seed + 4)))
    return seq, tuple(indptr), starts
