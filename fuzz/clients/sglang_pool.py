"""SGLang's ``UnifiedKVPool``, the byte buffer a chain of its allocators shares, built for a
kvfuzz chain config from SGLang's own file.

``sglang/srt/mem_cache/unified_memory_pool.py`` imports SGLang's whole memory-pool stack
(attention layers, quantization, platforms), none of which a CPU machine has, for the
kvcache classes it also defines. The buffer itself needs none of it, so the adapter compiles
from that file only the statements the buffer needs (``loader.definitions``: its imports,
its module-level assignments, and the definitions in ``POOL_NAMES``, with the file's own line
numbers) and answers its imports:

- ``layout/token_major.py`` and ``layout/fused_draft.py`` (the entry layouts and the views):
  SGLang's files, executed; their ``msgspec`` is msgspec where it is installed, else
  ``_Struct``, a frozen keyword-only dataclass base (all they ask of ``msgspec.Struct``).
- ``kernels/ops/kvcache/copy_pages.py`` and ``zero_pages.py``: SGLang's files, executed (the
  page copies a flush makes run through ``copy_pages``: ``sglang_chain.PageCopies``).
- ``constants.py``: SGLang's file. ``environ.envs``: the allocator adapter's SGLang defaults.
- ``memory_pool`` and ``swa_memory_pool`` (base classes of the kvcache classes, which are not
  compiled), ``kv_vmm_backing`` (post-capture backing, off) and the memory saver (off): named
  placeholders; using one raises.

``build`` maps a chain config onto the buffer's geometry exactly: each member a sub-pool
spec whose entry makes its bytes per page (all scaled by one factor, ``scale``, so every
entry is a multiple of the 32-byte entry alignment), a KV member an ``MHASubPoolSpec`` of the
chain's KV page size and a member of one-slot pages a ``MambaSubPoolSpec`` (SGLang's state
pool), so SGLang's own arithmetic gives every member's page count and reserved floor. A
config it cannot give (two KV page sizes) is a ContractViolation naming why.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
from dataclasses import dataclass

import torch

from kvref import ContractViolation

from . import loader

POOL_FILE = "sglang/srt/mem_cache/unified_memory_pool.py"
LAYOUT = "sglang/srt/mem_cache/layout/token_major.py"
FUSED = "sglang/srt/mem_cache/layout/fused_draft.py"
COPY = "sglang/kernels/ops/kvcache/copy_pages.py"
ZERO = "sglang/kernels/ops/kvcache/zero_pages.py"
CONSTANTS = "sglang/srt/constants.py"
FILES = (POOL_FILE, LAYOUT, FUSED, COPY, ZERO, CONSTANTS)
POOL_NAMES = ("_prod", "_check_row_alignment", "_store_dtype_for", "SubPoolSpec", "MHASubPoolSpec",
              "MLASubPoolSpec", "MambaSubPoolSpec", "_assert_physical_id_bound", "_reserved_floor_bytes",
              "UnifiedKVPool")
ALIGN = 32  # token_major.ENTRY_ALIGN_BYTES: an entry's bytes are a multiple of it


class _Struct:
    """``msgspec.Struct`` as SGLang's layout files use it: ``class X(Struct, frozen=True,
    kw_only=True)`` declares a frozen dataclass of keyword-only fields; a subclass keeps its
    base's options unless it names its own, and a mutable default is copied for each
    instance, as msgspec does."""

    _struct_options = {"frozen": False, "kw_only": False}

    def __init_subclass__(cls, frozen: bool | None = None, kw_only: bool | None = None, **kwargs):
        super().__init_subclass__(**kwargs)
        options = dict(cls._struct_options)
        options.update({k: v for k, v in (("frozen", frozen), ("kw_only", kw_only)) if v is not None})
        cls._struct_options = options
        for name in cls.__dict__.get("__annotations__", {}):
            value = cls.__dict__.get(name)
            if isinstance(value, (dict, list, set)):
                setattr(cls, name, dataclasses.field(default_factory=lambda v=value: copy.copy(v)))
        dataclasses.dataclass(**options)(cls)


def _msgspec():
    try:
        import msgspec
    except ImportError:
        return loader.stand_in_module("msgspec", Struct=_Struct)
    return msgspec


class _Off:
    """A placeholder for what the adapter leaves off (the kvcache classes' bases, post-capture
    backing, the memory saver): naming it is fine, using it is an error."""

    def __init__(self, *_a, **_k):
        raise NotImplementedError(f"{type(self).__name__}: not available under kvfuzz's SGLang adapter")


def _placeholders(name: str, *classes: str, **functions) -> object:
    return loader.stand_in_module(name, **{c: type(c, (_Off,), {}) for c in classes}, **functions)


class _MemorySaver:
    """``TorchMemorySaverAdapter``: the memory saver off, as a server without it runs."""

    @staticmethod
    def create(enable: bool):
        if enable:
            raise NotImplementedError("the memory saver is off under kvfuzz's SGLang adapter")
        return _MemorySaver()

    def region(self, _tag):
        return contextlib.nullcontext()


_LOADED: dict = {}


def load(where, envs, note: str):
    """SGLang's pool module (the ``POOL_NAMES`` of its file) and its page copies, once per
    process: ``(pool module, copy_pages, zero_pages)``."""
    if "pool" in _LOADED:
        return _LOADED["pool"]

    def run(private, rel, answers, source=None):
        path = where.file(rel)
        return loader.execute(private, source if source is not None else path.read_text(), str(path), answers,
                              "sglang", note)

    msgspec = _msgspec()
    token_major = run("_kvfuzz_sglang_token_major", LAYOUT, {"msgspec": msgspec})
    fused = run("_kvfuzz_sglang_fused_draft", FUSED, {
        "msgspec": msgspec, "sglang.srt.mem_cache.layout.token_major": token_major})
    copy_pages = run("_kvfuzz_sglang_copy_pages", COPY, {})
    zero_pages = run("_kvfuzz_sglang_zero_pages", ZERO, {})
    answers = {
        "sglang.kernels.ops.kvcache.copy_pages": copy_pages,
        "sglang.kernels.ops.kvcache.zero_pages": zero_pages,
        "sglang.srt.constants": run("_kvfuzz_sglang_constants", CONSTANTS, {}),
        "sglang.srt.environ": loader.stand_in_module("environ", envs=envs),
        "sglang.srt.mem_cache.kv_vmm_backing": _placeholders("kv_vmm_backing", "KvVmmBufferOwner"),
        "sglang.srt.mem_cache.layout.fused_draft": fused,
        "sglang.srt.mem_cache.layout.token_major": token_major,
        "sglang.srt.mem_cache.memory_pool": _placeholders(
            "memory_pool", "HybridLinearKVPool", "HybridReqToTokenPool", "KvBufferDesc", "KVWriteLoc", "MambaPool",
            "MHATokenToKVPool", "MLATokenToKVPool", unwrap_write_loc=None, write_loc_is_physical=None),
        "sglang.srt.mem_cache.swa_memory_pool": _placeholders("swa_memory_pool", "SWAKVPool"),
        "sglang.srt.utils.torch_memory_saver_adapter": loader.stand_in_module(
            "torch_memory_saver_adapter", TorchMemorySaverAdapter=_MemorySaver),
    }
    pool = run("_kvfuzz_sglang_unified_memory_pool", POOL_FILE, answers,
               source=loader.definitions(where.file(POOL_FILE), POOL_NAMES))
    _LOADED["pool"] = (pool, copy_pages.copy_pages, zero_pages.zero_pages)
    return _LOADED["pool"]


@dataclass(frozen=True)
class Layout:
    """A chain config on SGLang's buffer: ``names[i]`` is member i's sub-pool, ``scale`` the
    factor from kvfuzz's bytes to SGLang's (``entry_bytes[i] * page_size[i] == scale *
    bytes_per_page[i]``)."""

    names: tuple[str, ...]
    scale: int
    page_size: int
    entry_bytes: tuple[int, ...]


def layout_of(config) -> Layout:
    members = config.members
    cc = config.chain
    kv_page = max(m.page_size for m in members)
    odd = sorted({m.page_size for m in members} - {kv_page, 1})
    if odd:
        raise ContractViolation(f"SGLang's UnifiedKVPool has one page size for its KV sub-pools ({kv_page}) and "
                                f"state pools of one slot a page; this chain also has pages of {odd[0]} slots")
    scale = ALIGN * math.lcm(*(m.page_size for m in members))
    entry = tuple(scale * cc.bytes_per_page[i] // m.page_size for i, m in enumerate(members))
    return Layout(tuple(f"pool{i}" for i in range(len(members))), scale, kv_page, entry)


def build(module, config, device) -> tuple[object, Layout]:
    """SGLang's ``UnifiedKVPool`` for a chain config (its sub-pools in chain order)."""
    lay = layout_of(config)
    specs = []
    for i, m in enumerate(config.members):
        common = dict(name=lay.names[i], layer_num=1, grow_direction=m.grow)
        words = lay.entry_bytes[i] // 16  # two rows of 8-byte words (K and V; conv and temporal state)
        if m.page_size == lay.page_size:
            specs.append(module.MHASubPoolSpec(**common, head_num=1, head_dim=words, store_dtype=torch.int64))
        else:
            specs.append(module.MambaSubPoolSpec(**common, conv_state_shapes=((words,),), conv_dtype=torch.int64,
                                                 temporal_state_shape=(words,), temporal_dtype=torch.int64))
    pool = module.UnifiedKVPool(total_bytes=lay.scale * config.chain.total_bytes, sub_pool_specs=specs,
                                device=str(device), enable_memory_saver=False, page_size=lay.page_size)
    return pool, lay
