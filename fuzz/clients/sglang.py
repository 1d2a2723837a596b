"""SGLang's unified-pool kernels as a kvfuzz kernel set: ``--kernels kvfuzz-sglang``.

The kernels are SGLang's own, loaded from its installed distribution (written against
``sglang==0.5.23``; ``pip install sglang==0.5.23 --no-deps`` is enough, SGLang's runtime
dependencies are not needed): ``sglang/kernels/ops/memory/virtual_slot.py`` (bind,
alloc+bind, free+unbind, translate) and ``sglang/kernels/ops/kvcache/kv_read_table.py``
(the page-table and token-stream read tables). Only those two files are executed, under
private module names (``fuzz.clients.loader``); ``import sglang`` never happens, so
neither does its ``__init__`` (transformers, FlashInfer, the scheduler). Without an
installed SGLang, importing this module raises ``SetupError`` (exit 2) with the install
command. ``SGLANG_VERSION`` and ``SGLANG_FILES`` say what was loaded.

Where the calls go, per tier:

- ``cuda``: SGLang's wrappers themselves (``alloc_bind_inplace``, ...,
  ``build_kv_read_table``, ``translate_token_ids``), which launch its compiled kernels.
- ``interpret`` (CPU tensors, ``TRITON_INTERPRET=1``): SGLang's wrappers would send CPU
  tensors to their pure-torch fallbacks, so the adapter launches SGLang's ``@triton.jit``
  kernels itself with the wrappers' own grid arithmetic and argument lists, reading the
  block sizes from the loaded modules at call time (``ALLOC_BIND_BLOCK``,
  ``TRANSLATE_TOKEN_IDS_BLOCK``; the read tables go through SGLang's own ``_launch``,
  which reads ``_BLOCK_ITEMS``, ``_TARGET_BLOCKS`` and ``_NUM_WARPS``). The wrappers'
  shape/dtype assertions are restated before each launch, so an input the CUDA path
  refuses is refused here too (an ``AssertionError``).
- ``torch`` (CPU tensors, no interpreter): SGLang's wrappers, i.e. its torch fallbacks.

Signature differences from the kernel-set contract (docs/kernel-sets.md) and how each
is mapped:

- ``multiplier`` (both read tables): SGLang has none; its entries are physical page ids
  (the contract's ``multiplier == 1``, what its server uses). The call is passed through
  without it, and for ``multiplier != 1`` one more Triton kernel of this adapter
  (``_scale_table_kernel``, ``_scale_packed_kernel``) rescales exactly the elements
  SGLang's kernel just wrote: ``out[b, c] *= m`` over each row's live prefix, and for
  the token stream ``id = page * ps + off`` becomes ``page * m * ps + off``. It is a
  Triton launch, so it is captured in a CUDA graph (and recorded by the interpreter's
  capture emulation) like SGLang's; it never writes outside ``out``. An op with a
  multiplier other than 1 therefore tests SGLang's kernel followed by that rescale
  (``minimize`` tries ``multiplier: 1`` first, so a minimized SGLang case has 1).
- ``build_kv_read_table``: SGLang's extra ``seq_len_delta`` and ``zero_tail`` keep their
  defaults (0, False): the prefix-only refresh the contract describes.
- ``build_kv_read_table_packed``: the same keywords plus the missing ``multiplier``;
  SGLang also accepts an int64 ``out`` (kvfuzz passes int32). Its ``max_tokens`` is only
  asserted against ``out.numel()`` and used to size the grid.
- ``build_kv_read_table_legacy``: SGLang has no legacy grid; not provided, so those ops
  are skipped.
- ``translate_tokens(*, loc, v2p, page_size, out=None)`` is SGLang's
  ``translate_token_ids``; its ``dcp_size``/``dcp_rank`` (decode context parallelism)
  and ``out_width`` keep their defaults (1, 0, None).
- ``alloc_bind_inplace``, ``free_unbind_inplace``, ``bind_inplace``: the same positional
  signatures and returns. (Their wrappers cast ids with ``.to(torch.int64)``, which
  returns kvfuzz's int64 views themselves, so the kernels read the red-zoned buffers.)

Launch knobs: ``ALLOC_BIND_BLOCK``, ``TRANSLATE_TOKEN_IDS_BLOCK``, ``BLOCK_ITEMS``
(SGLang's ``_BLOCK_ITEMS``) and ``TARGET_BLOCKS`` (``_TARGET_BLOCKS``) start at the
loaded modules' values and are ``FUZZ_KNOBS``: kvfuzz picks SGLang's value or a small
power of two per sequence (so small pools take a second program and a second loop
trip), and every call first copies them into the loaded modules, where SGLang's
wrappers and ``_launch`` read them; the real ``sglang`` modules are never touched.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..engine.tiers import SetupError
from . import loader

PINNED = "0.5.23"
INSTALL = f"pip install sglang=={PINNED} --no-deps"
_VIRTUAL_SLOT = "sglang/kernels/ops/memory/virtual_slot.py"
_READ_TABLE = "sglang/kernels/ops/kvcache/kv_read_table.py"
_NEEDS = {
    _VIRTUAL_SLOT: ("alloc_bind_inplace_kernel", "free_unbind_inplace_kernel", "bind_inplace_kernel",
                    "translate_token_ids_kernel", "alloc_bind_inplace", "free_unbind_inplace", "bind_inplace",
                    "translate_token_ids", "_row_col_strides", "ALLOC_BIND_BLOCK", "TRANSLATE_TOKEN_IDS_BLOCK"),
    _READ_TABLE: ("build_kv_read_table", "build_kv_read_table_packed", "_launch", "_BLOCK_ITEMS",
                  "_TARGET_BLOCKS"),
}

_where = loader.locate("sglang", "sglang", tuple(_NEEDS), INSTALL)
_vs = loader.load_file("_kvfuzz_sglang_virtual_slot", _where.file(_VIRTUAL_SLOT), "sglang", INSTALL)
_rt = loader.load_file("_kvfuzz_sglang_kv_read_table", _where.file(_READ_TABLE), "sglang", INSTALL)
for _rel, _mod in ((_VIRTUAL_SLOT, _vs), (_READ_TABLE, _rt)):
    _missing = [name for name in _NEEDS[_rel] if not hasattr(_mod, name)]
    if _missing:
        raise SetupError(f"sglang {_where.version or '(checkout)'}: {_rel} has no {', '.join(_missing)}; "
                         f"this adapter is written against sglang {PINNED} ({INSTALL})")

SGLANG_VERSION = _where.version
SGLANG_FILES = {"virtual_slot": str(_where.file(_VIRTUAL_SLOT)), "kv_read_table": str(_where.file(_READ_TABLE))}
KVFUZZ_SOURCES = tuple(SGLANG_FILES.values())  # guided's code features: SGLang's files, not this adapter

# Launch knobs (module docstring): SGLang's values, and where each lives in its modules.
ALLOC_BIND_BLOCK = _vs.ALLOC_BIND_BLOCK
TRANSLATE_TOKEN_IDS_BLOCK = _vs.TRANSLATE_TOKEN_IDS_BLOCK
BLOCK_ITEMS = _rt._BLOCK_ITEMS
TARGET_BLOCKS = _rt._TARGET_BLOCKS
_HOMES = {"ALLOC_BIND_BLOCK": (_vs, "ALLOC_BIND_BLOCK"), "TRANSLATE_TOKEN_IDS_BLOCK": (_vs, "TRANSLATE_TOKEN_IDS_BLOCK"),
          "BLOCK_ITEMS": (_rt, "_BLOCK_ITEMS"), "TARGET_BLOCKS": (_rt, "_TARGET_BLOCKS")}
FUZZ_KNOBS = {name: tuple(sorted({2 if name == "TARGET_BLOCKS" else 4, globals()[name]})) for name in _HOMES}
_SCALE_BLOCK = 128  # the adapter's own rescale kernels (multiplier != 1)


def _push_knobs() -> None:
    """Copy this module's knob values (set by kvfuzz per sequence) into the loaded modules."""
    here = globals()
    for name, (module, attr) in _HOMES.items():
        setattr(module, attr, here[name])


def _interpreted(kernel) -> bool:
    """True when ``kernel`` was decorated under Triton's interpreter (TRITON_INTERPRET=1)."""
    return type(kernel).__name__ == "InterpretedFunction" or "interpreter" in type(kernel).__module__


_INTERPRETED = _interpreted(_vs.free_unbind_inplace_kernel)


def _launch_here(t: torch.Tensor) -> bool:
    """Launch SGLang's kernels from here (CPU tensors under the interpreter), rather than
    call its wrapper (CUDA: its kernels; CPU without the interpreter: its torch fallback)."""
    return _INTERPRETED and not t.is_cuda


# ---- virtual_slot.py -----------------------------------------------------------------------------


def alloc_bind_inplace(v_pages: torch.Tensor, v2p: torch.Tensor, p2v: torch.Tensor, start_phys: int) -> torch.Tensor:
    _push_knobs()
    if not _launch_here(v_pages):
        return _vs.alloc_bind_inplace(v_pages, v2p, p2v, start_phys)
    n = int(v_pages.numel())
    if n == 0:
        return torch.empty(0, dtype=torch.int64, device=v_pages.device)
    phys = torch.empty(n, dtype=torch.int64, device=v_pages.device)
    block = _vs.ALLOC_BIND_BLOCK
    _vs.alloc_bind_inplace_kernel[(triton.cdiv(n, block),)](v_pages, v2p, p2v, phys, n, start_phys, BLOCK=block)
    return phys


def free_unbind_inplace(v_pages: torch.Tensor, v2p: torch.Tensor, p2v: torch.Tensor) -> torch.Tensor:
    _push_knobs()
    if not _launch_here(v_pages):
        return _vs.free_unbind_inplace(v_pages, v2p, p2v)
    n = int(v_pages.numel())
    if n == 0:
        return torch.empty(0, dtype=torch.int64, device=v_pages.device)
    v = v_pages.to(torch.int64)
    phys = torch.empty(n, dtype=torch.int64, device=v_pages.device)
    block = _vs.ALLOC_BIND_BLOCK
    _vs.free_unbind_inplace_kernel[(triton.cdiv(n, block),)](v, v2p, p2v, phys, n, BLOCK=block)
    return phys


def bind_inplace(v_pages: torch.Tensor, p_pages: torch.Tensor, v2p: torch.Tensor, p2v: torch.Tensor) -> None:
    _push_knobs()
    if not _launch_here(v_pages):
        return _vs.bind_inplace(v_pages, p_pages, v2p, p2v)
    n = int(v_pages.numel())
    if n == 0:
        return None
    v, p = v_pages.to(torch.int64), p_pages.to(torch.int64)
    block = _vs.ALLOC_BIND_BLOCK
    _vs.bind_inplace_kernel[(triton.cdiv(n, block),)](v, p, v2p, p2v, n, BLOCK=block)
    return None


def translate_tokens(*, loc: torch.Tensor, v2p: torch.Tensor, page_size: int,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    _push_knobs()
    if not _launch_here(loc):
        return _vs.translate_token_ids(loc=loc, v2p=v2p, page_size=page_size, out=out)
    n = int(loc.numel())
    if out is None:
        out = torch.empty(loc.shape, dtype=torch.int64, device=loc.device)
    # translate_token_ids' assertions (out_width=None: out mirrors loc).
    assert out.dtype == torch.int64, f"translate_token_ids: out dtype must be int64, got {out.dtype}"
    assert out.shape == loc.shape, f"translate_token_ids: out shape {tuple(out.shape)} != loc {tuple(loc.shape)}"
    if n == 0:
        return out
    flat = loc.is_contiguous() and out.is_contiguous()
    if flat:
        cols, (loc_rs, loc_cs), (out_rs, out_cs) = 1, (1, 1), (1, 1)
    else:
        assert loc.dim() <= 2 and out.dim() <= 2, "translate_token_ids: a strided loc/out is walked as 2-D"
        cols = loc.shape[-1] if loc.dim() == 2 else n
        (loc_rs, loc_cs), (out_rs, out_cs) = _vs._row_col_strides(loc), _vs._row_col_strides(out)
    block = _vs.TRANSLATE_TOKEN_IDS_BLOCK
    _vs.translate_token_ids_kernel[(triton.cdiv(n, block),)](
        loc, v2p, out, n, n, int(v2p.numel()), cols, loc_rs, loc_cs, out_rs, out_cs,
        PAGE_SIZE=page_size, DCP_SIZE=1, DCP_RANK=0, STRIDED=not flat, BLOCK=block)
    return out


# ---- kv_read_table.py ----------------------------------------------------------------------------


def build_kv_read_table(*, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                        v2p: torch.Tensor, multiplier: int, page_size: int, max_pages: int,
                        out: torch.Tensor) -> torch.Tensor:
    _push_knobs()
    bs = int(req_pool_indices.numel())
    if not _launch_here(req_to_token):
        _rt.build_kv_read_table(req_to_token=req_to_token, req_pool_indices=req_pool_indices, seq_lens=seq_lens,
                                v2p=v2p, page_size=page_size, max_pages=max_pages, out=out)
    else:
        # build_kv_read_table's assertions, then its launch.
        assert out.dtype == torch.int32, f"build_kv_read_table: out must be int32, got {out.dtype}"
        assert out.dim() == 2 and out.shape[0] >= bs and out.shape[1] >= max_pages, (
            f"build_kv_read_table: out {tuple(out.shape)} cannot hold (bs={bs}, max_pages={max_pages})")
        assert out.stride(1) == 1, "build_kv_read_table: out rows must be packed"
        assert (max_pages - 1) * page_size < req_to_token.shape[1], (
            f"build_kv_read_table: max_pages={max_pages} x ps={page_size} exceeds req_to_token width "
            f"{req_to_token.shape[1]}")
        if bs and max_pages:
            _rt._launch(req_to_token=req_to_token, req_pool_indices=req_pool_indices, seq_lens=seq_lens, v2p=v2p,
                        page_size=page_size, max_items=max_pages, out=out, out_stride=out.stride(0),
                        row_starts=None, kv_start_idx=None, emit_per_token=False)
    if multiplier != 1 and bs and max_pages:
        _scale_table(out, seq_lens, bs, page_size, max_pages, multiplier)
    return out


def build_kv_read_table_packed(*, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                               seq_lens: torch.Tensor, v2p: torch.Tensor, indptr: torch.Tensor, multiplier: int,
                               page_size: int, max_tokens: int, out: torch.Tensor,
                               kv_start_idx: torch.Tensor | None = None) -> torch.Tensor:
    _push_knobs()
    bs = int(req_pool_indices.numel())
    if not _launch_here(req_to_token):
        _rt.build_kv_read_table_packed(req_to_token=req_to_token, req_pool_indices=req_pool_indices,
                                       seq_lens=seq_lens, v2p=v2p, indptr=indptr, page_size=page_size,
                                       max_tokens=max_tokens, out=out, kv_start_idx=kv_start_idx)
    else:
        # build_kv_read_table_packed's assertions, then its launch.
        assert out.dtype in (torch.int32, torch.int64), f"build_kv_read_table_packed: out dtype {out.dtype}"
        assert out.dim() == 1 and out.numel() >= max_tokens, (
            f"build_kv_read_table_packed: out {tuple(out.shape)} cannot hold max_tokens={max_tokens}")
        assert indptr.numel() > bs, f"build_kv_read_table_packed: indptr holds {indptr.numel()}, need {bs + 1}"
        if bs and max_tokens:
            _rt._launch(req_to_token=req_to_token, req_pool_indices=req_pool_indices, seq_lens=seq_lens, v2p=v2p,
                        page_size=page_size, max_items=max_tokens, out=out, out_stride=0, row_starts=indptr,
                        kv_start_idx=kv_start_idx, emit_per_token=True)
    if multiplier != 1 and bs and max_tokens:
        _scale_packed(out, seq_lens, indptr, bs, page_size, out.numel(), multiplier)
    return out


# ---- the multiplier SGLang does not have (module docstring) --------------------------------------


@triton.jit
def _scale_table_kernel(seq_lens_ptr, out_ptr, out_stride, max_pages, multiplier,
                        PAGE_SIZE: tl.constexpr, BLOCK: tl.constexpr):
    """``out[b, c] *= multiplier`` for ``c < min(cdiv(seq_lens[b], ps), max_pages)``: the
    columns SGLang's page-table kernel stores (its ``n_items``, with Triton's ``//``)."""
    b = tl.program_id(0)
    n = tl.minimum((tl.load(seq_lens_ptr + b) + PAGE_SIZE - 1) // PAGE_SIZE, max_pages)
    row = out_ptr + b.to(tl.int64) * out_stride
    start = tl.program_id(0).to(tl.int64) * 0
    while start < n:  # a while loop: a loaded range bound broke Triton 3.6's interpreter
        cols = start + tl.arange(0, BLOCK)
        live = cols < n
        x = tl.load(row + cols, mask=live, other=0)
        tl.store(row + cols, x * multiplier, mask=live)
        start += BLOCK


@triton.jit
def _scale_packed_kernel(seq_lens_ptr, indptr_ptr, out_ptr, limit, multiplier,
                         PAGE_SIZE: tl.constexpr, BLOCK: tl.constexpr):
    """``page * ps + off`` -> ``page * multiplier * ps + off`` over ``out[indptr[b] + i]``,
    ``i < seq_lens[b]`` (the items SGLang's token-stream kernel stores), inside ``out``
    (``[0, limit)``, ``limit = out.numel()``: kvref bounds a row by ``max_tokens``, not
    ``indptr``, so a valid stream may end past ``max_tokens``)."""
    b = tl.program_id(0)
    n = tl.load(seq_lens_ptr + b)
    base = tl.load(indptr_ptr + b).to(tl.int64)
    start = tl.program_id(0).to(tl.int64) * 0
    while start < n:
        items = start + tl.arange(0, BLOCK)
        at = base + items
        live = (items < n) & (at >= 0) & (at < limit)
        x = tl.load(out_ptr + at, mask=live, other=0)
        tl.store(out_ptr + at, (x // PAGE_SIZE) * (PAGE_SIZE * multiplier) + x % PAGE_SIZE, mask=live)
        start += BLOCK


def _scale_table(out, seq_lens, bs, page_size, max_pages, multiplier) -> None:
    if not out.is_cuda and not _INTERPRETED:  # the torch tier: the rows SGLang's fallback wrote, sliced as it does
        for b in range(bs):
            live = min((int(seq_lens[b]) + page_size - 1) // page_size, max_pages)
            out[b, :live] *= multiplier
        return
    _scale_table_kernel[(bs,)](seq_lens, out, out.stride(0), max_pages, multiplier,
                               PAGE_SIZE=page_size, BLOCK=_SCALE_BLOCK)


def _scale_packed(out, seq_lens, indptr, bs, page_size, limit, multiplier) -> None:
    if not out.is_cuda and not _INTERPRETED:  # the torch tier
        for b in range(bs):
            start, n = int(indptr[b]), int(seq_lens[b])
            seg = out[max(start, 0):min(start + n, limit)]
            seg.copy_(seg // page_size * (page_size * multiplier) + seg % page_size)
        return
    _scale_packed_kernel[(bs,)](seq_lens, indptr, out, limit, multiplier, PAGE_SIZE=page_size, BLOCK=_SCALE_BLOCK)
