"""SGLang's own ``MultiEndedAllocator`` under the fuzz: ``--allocator kvfuzz-sglang``.

The state machine kvfuzz drives is SGLang's, executed from the installed distribution's
``sglang/srt/mem_cache/allocator/unified_sub_pool.py`` (its base class from
``allocator/base.py``), never imported as ``sglang``: each file is compiled from its own
text under a private module name, and the imports it makes are answered by this module
(``_importer``) instead of by SGLang's package, whose ``__init__`` reaches the server
runtime. What answers each import, and why (docs/sglang.md lists the same):

- ``sglang.kernels.ops.memory.virtual_slot`` (bind, alloc+bind, free+unbind, translate):
  the tier's kernel set, which with ``--allocator kvfuzz-sglang`` is SGLang's own
  (``--kernels kvfuzz-sglang``, ``fuzz.clients.sglang``: its wrappers on torch and CUDA,
  its ``@triton.jit`` kernels under the interpreter).
- ``sglang.srt.mem_cache.allocator``: ``BaseTokenToKVPoolAllocator`` from SGLang's own
  ``base.py`` (it imports only ``abc``, ``typing`` and torch).
- ``sglang.srt.mem_cache.unified_memory_pool`` (``UnifiedKVPool`` and the MHA/MLA
  kvcache classes): stand-ins built by ``build_pool``. SGLang's module imports its whole
  memory-pool stack (attention layers, quantization, platforms), none of which a CPU CI
  machine has; the allocator calls six members of it (``spec``, ``max_slots``,
  ``min_slot_index``, ``total_bytes``, ``move_physical_pages``, ``zero_physical_pages``),
  which the stand-ins provide over kvfuzz's red-zoned ``kv`` buffer.
- ``sglang.srt.environ.envs``: the three settings the allocator reads, SGLang's defaults,
  except ``SGLANG_LAZY_COMPACTION_MAX_MOVES_PER_CALL``, which is the pool's ``max_moves``.
- ``paged``'s extend/decode kernels, ``get_num_new_pages``, ``next_power_of_2``: used
  only by ``alloc_extend``/``alloc_decode``, which the op language does not call; a call
  raises.
- ``get_parallel``: decode context parallelism off (``attn_dcp_size`` 1).
- On a CPU only, ``torch.cuda.current_stream()`` (the urgent flush's ``wait_event``, the
  urgent pending drain): a host stream whose ``wait_event(e)`` settles kvfuzz's event
  ``e``. Every other ``torch`` name is torch's own.

Forwards use SGLang's own mechanism (``set_latest_forward_done_event`` and
``set_inflight_forward``) with a ``ForwardEvent`` whose ``query()`` is kvfuzz's ``fired``
flag (as SGLang's CPU tests do), so a trace replays the same on every tier. On CUDA each
forward also records a real ``torch.cuda.Event`` on a forward stream after a kernel that
reads the forward's KV rows; ``fire()`` synchronizes it, and SGLang's stream waits
(``wait_event``) wait on it for real.

``MUTANTS`` are planted bugs: text patches applied to SGLang's file before it is compiled
(``kvfuzz-sglang`` factories ``mutant_NAME``), so kvfuzz's kill table is measured on
SGLang's code, not on a model of it.
"""

from __future__ import annotations

import builtins
import hashlib
import sys
import types

import torch

from ..engine.tiers import SetupError
from . import loader
from .sglang_files import BASE, INSTALL, PINNED, SUB_POOL

_where = loader.locate("sglang", "sglang", (SUB_POOL, BASE), INSTALL)
SGLANG_VERSION = _where.version
SGLANG_FILES = {"unified_sub_pool": str(_where.file(SUB_POOL)), "base": str(_where.file(BASE))}
_SOURCE = _where.file(SUB_POOL).read_text()
SUB_POOL_SHA256 = hashlib.sha256(_where.file(SUB_POOL).read_bytes()).hexdigest()
ENTRY_BYTES = 8  # one int64 stamp per token row of the stand-in kvcache
NAME = "kv"  # the sub-pool's name in the stand-in UnifiedKVPool


# ---- the stand-ins for imports the allocator file makes ----------------------------------------


class _Env:
    def __init__(self, value):
        self.value = value

    def get(self):
        return self.value


class _Envs:
    """``sglang.srt.environ.envs``: SGLang's defaults (environ.py), the move cap settable."""

    def __init__(self):
        self.SGLANG_LOG_LAZY_COMPACTION_STATS = _Env(False)
        self.SGLANG_LOG_LAZY_COMPACTION_STATS_INTERVAL_SEC = _Env(30)
        self.SGLANG_LAZY_COMPACTION_MAX_MOVES_PER_CALL = _Env(4096)
        self.SGLANG_COMPACTION_MAX_PAGES_PER_MOVE = _Env(4096)


def _not_driven(name: str):
    def call(*_a, **_k):
        raise NotImplementedError(f"{name}: used by alloc_extend/alloc_decode, which kvfuzz does not drive")

    return call


class _Spec:
    """``MHASubPoolSpec`` as the allocator reads it."""

    def __init__(self, grow: str):
        self.grow_direction = grow

    def get_dtype(self):
        return torch.int64

    def entry_bytes(self) -> int:
        return ENTRY_BYTES


class UnifiedKVPool:
    """The members of SGLang's ``UnifiedKVPool`` the allocator reads, for sub-pools laid
    out as SGLang lays them: each its own spec, slot count and reserved floor, the byte
    budget their sum."""

    def __init__(self, subs: dict):
        self._subs = subs  # name -> (grow, max_slots, min_slot_index)
        self.total_bytes = sum(slots * ENTRY_BYTES for _, slots, _ in subs.values())

    def spec(self, name):
        return _Spec(self._subs[name][0])

    def max_slots(self, name):
        return self._subs[name][1]

    def min_slot_index(self, name):
        return self._subs[name][2]


class UnifiedMHATokenToKVPool:
    """The kvcache: whole-page copies and zeroing over kvfuzz's ``kv`` buffer (one int64
    per token row, ``page_size`` rows a page)."""

    def __init__(self, kv: torch.Tensor, page_size: int):
        self.kv, self.page_size = kv, page_size

    def _rows(self, pages: torch.Tensor) -> torch.Tensor:
        ps = self.page_size
        return (pages.to(torch.int64)[:, None] * ps + torch.arange(ps, device=pages.device)).reshape(-1)

    def move_physical_pages(self, tgt_pages, src_pages, page_size):
        assert page_size == self.page_size, f"pages of {page_size} slots passed to a pool of {self.page_size}"
        self.kv[self._rows(tgt_pages)] = self.kv[self._rows(src_pages)]

    def zero_physical_pages(self, phys_pages):
        self.kv[self._rows(phys_pages)] = 0


class UnifiedMLATokenToKVPool(UnifiedMHATokenToKVPool):
    pass


class _KeepsData:
    """The kvcache kvfuzz hands the allocator: not one of the MHA/MLA classes, so
    ``_maybe_zero_pages`` leaves a page's data in place on hand-out, as SPEC §3 (kvref)
    does; the zeroing is the kvcache's, outside the allocator's state machine."""

    def __init__(self, kv, page_size):
        self._pool = UnifiedMHATokenToKVPool(kv, page_size)
        self.move_physical_pages = self._pool.move_physical_pages
        self.zero_physical_pages = self._pool.zero_physical_pages


class _HostStream:
    """``torch.cuda.current_stream()`` on a CPU: work is never queued behind a forward,
    so waiting for an event means the forward completes now."""

    def wait_event(self, event):
        event.wait(self)

    def wait_stream(self, _stream):
        return None

    def synchronize(self):
        return None


class _TorchOnHost(types.ModuleType):
    """``torch`` as the allocator file sees it on a CPU: torch's own names, except
    ``torch.cuda.current_stream``."""

    def __init__(self):
        super().__init__("torch")
        self.cuda = types.SimpleNamespace(current_stream=lambda device=None: _HostStream(),
                                          Event=torch.cuda.Event, Stream=torch.cuda.Stream)

    def __getattr__(self, name):
        return getattr(torch, name)


def _module(name: str, **members) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__dict__.update(members)
    return m


def _kernel_module(kernels) -> types.ModuleType:
    """``virtual_slot`` as the tier's kernel set provides it."""

    def translate_token_ids(*, loc, v2p, page_size, dcp_size=1, dcp_rank=0, out=None, out_width=None):
        assert dcp_size == 1 and out_width is None, "decode context parallelism is off here"
        return kernels.translate_tokens(loc=loc, v2p=v2p, page_size=page_size, out=out)

    return _module("virtual_slot", alloc_bind_inplace=kernels.alloc_bind_inplace, bind_inplace=kernels.bind_inplace,
                   free_unbind_inplace=kernels.free_unbind_inplace, translate_token_ids=translate_token_ids)


def _importer(answers: dict, on_host: bool):
    real = builtins.__import__

    def imp(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and name in answers:
            return answers[name]
        if level == 0 and name == "torch" and on_host:
            return _TORCH_ON_HOST
        if level == 0 and (name == "sglang" or name.startswith("sglang.")):
            raise ImportError(f"{name}: the kvfuzz-sglang adapter answers the allocator's imports itself and has "
                              f"no stand-in for this one (SGLang {SGLANG_VERSION}; written against {PINNED})")
        return real(name, globals, locals, fromlist, level)

    return imp


_TORCH_ON_HOST = _TorchOnHost()


def _execute(private: str, text: str, path: str, answers: dict, on_host: bool) -> types.ModuleType:
    module = types.ModuleType(private)
    module.__file__ = path
    module.__dict__["__builtins__"] = dict(builtins.__dict__, __import__=_importer(answers, on_host))
    sys.modules[private] = module  # dataclasses and typing look a module up by name
    try:
        exec(compile(text, path, "exec"), module.__dict__)  # noqa: S102 - SGLang's file, as shipped or mutated
    except Exception as exc:
        del sys.modules[private]
        raise SetupError(f"executing {path} failed: {type(exc).__name__}: {exc}") from exc
    return module


_LOADED: dict = {}


def load(kernels, on_host: bool, mutant: str | None = None) -> types.ModuleType:
    """SGLang's ``unified_sub_pool`` module over ``kernels`` (once per kernel set, host or
    device, and mutant), with ``MUTANTS[mutant]`` applied to its text."""
    key = (id(kernels), on_host, mutant)
    if key in _LOADED:
        return _LOADED[key]
    tag = f"{len(_LOADED)}"
    envs = _Envs()
    base = _execute(f"_kvfuzz_sglang_alloc_base_{tag}", _where.file(BASE).read_text(), SGLANG_FILES["base"], {},
                    on_host)
    answers = {
        "sglang.kernels.ops.memory.virtual_slot": _kernel_module(kernels),
        "sglang.srt.environ": _module("environ", envs=envs),
        "sglang.srt.mem_cache.allocator": _module("allocator", BaseTokenToKVPoolAllocator=base.BaseTokenToKVPoolAllocator),
        "sglang.srt.mem_cache.allocator.paged": _module("paged", alloc_decode_kernel=None, alloc_extend_kernel=None),
        "sglang.srt.mem_cache.unified_memory_pool": _module(
            "unified_memory_pool", UnifiedKVPool=UnifiedKVPool, UnifiedMHATokenToKVPool=UnifiedMHATokenToKVPool,
            UnifiedMLATokenToKVPool=UnifiedMLATokenToKVPool),
        "sglang.srt.runtime_context": _module(
            "runtime_context", get_parallel=lambda: types.SimpleNamespace(attn_dcp_size=1, attn_dcp_rank=0)),
        "sglang.srt.utils.common": _module("common", get_num_new_pages=_not_driven("get_num_new_pages"),
                                           next_power_of_2=_not_driven("next_power_of_2")),
    }
    from .sglang_mutants import apply

    text = apply(_SOURCE, mutant)
    module = _execute(f"_kvfuzz_sglang_unified_sub_pool_{tag}", text, SGLANG_FILES["unified_sub_pool"], answers,
                      on_host)
    module._kvfuzz_envs = envs
    _LOADED[key] = module
    return module


# ---- the pool and its forwards -------------------------------------------------------------------


def build_pool(config, device, buffers):
    """The unified pool one ``MultiEndedAllocator`` runs over, sized to ``config``: one
    sub-pool ``NAME`` of ``num_pages`` pages, ``min_page`` of them the reserved floor, and
    its kvcache over kvfuzz's ``kv`` buffer. (Chains of sub-pools sharing one buffer would
    be built here too: one ``UnifiedKVPool`` entry per member.)"""
    ps = config.page_size
    pool = UnifiedKVPool({NAME: (config.grow, config.num_pages * ps, config.min_page * ps)})
    kv = buffers("kv", config.num_pages, 0, ps)
    return pool, _KeepsData(kv, ps), kv


class ForwardEvent:
    """A forward's done event as SGLang's allocator uses one (``query``, and ``wait`` from a
    stream's ``wait_event``); fired when kvfuzz says so. On CUDA it wraps a real event."""

    def __init__(self, id: int, pages: list, real=None):
        self.id, self.pages, self.real, self.fired = id, pages, real, False

    def query(self) -> bool:
        return self.fired

    def wait(self, stream=None) -> None:
        if self.real is not None and stream is not None and not isinstance(stream, _HostStream):
            self.real.wait(stream)
        self.fired = True  # what the stream runs next is ordered after the forward: settled

    def synchronize(self) -> None:
        if self.real is not None:
            self.real.synchronize()
        self.fired = True


def _plain_buffers(device):
    def make(name, rows, fill, row_len=1):
        return torch.full((rows * row_len,), fill, dtype=torch.int64, device=device)

    return make


class SGLangAllocator:
    """One ``MultiEndedAllocator`` (an id owner over its own sub-pool) behind kvfuzz's
    allocator protocol (docs/allocators.md). It translates calls, never behaviour."""

    # SGLang has no checked mode: its callers promise valid input (no double-free or
    # duplicate checks), so kvfuzz sends only what the spec accepts.
    KVFUZZ_LACKS = frozenset({"checked"})
    # One pending entry per event, its batches accumulated (unified_sub_pool.py `_commit_move_batch`'s
    # `setdefault`); the next flush sorts what drains, so only the pages matter.
    KVFUZZ_SNAPSHOT = {"pending": "unordered"}
    KVFUZZ_SPEC_RULES = frozenset({"take_nearest_end", "down_extend_descending", "walk_release_appended",
                                   "urgent_settles_when_moving", "move_cap_floor_1", "eager_free_ids_sorted"})
    MUTANT: str | None = None

    def __init__(self, config, kernels, device, *, buffers=None):
        self.config = config
        self.device = torch.device(device)
        on_host = self.device.type != "cuda"
        sgl = load(kernels, on_host, self.MUTANT)
        sgl._kvfuzz_envs.SGLANG_LAZY_COMPACTION_MAX_MOVES_PER_CALL.value = config.max_moves
        buffers = buffers or _plain_buffers(self.device)
        self.pool, kvcache, self.kv = build_pool(config, self.device, buffers)
        self.forward_stream = None if on_host else torch.cuda.Stream(device=self.device)
        self.sgl = sgl.MultiEndedAllocator(
            kvcache=kvcache, unified_buffer=self.pool, sub_pool_name=NAME, device=str(self.device), is_id_owner=True,
            page_size=config.page_size, forward_stream=self.forward_stream, lazy_compaction=config.lazy)
        # kvfuzz's red-zoned tables in place of the ones it made, before any op (clear() rewrites them)
        self.sgl.virtual_to_physical = buffers("v2p", config.table_rows, -1)
        self.sgl.physical_to_virtual = buffers("p2v", config.table_rows, -1)
        self.clear()

    v2p = property(lambda self: self.sgl.virtual_to_physical)
    p2v = property(lambda self: self.sgl.physical_to_virtual)

    def clear(self) -> None:
        self.sgl.clear()
        self.kv.zero_()  # the stand-in kvcache's reset: SGLang's allocator leaves KV bytes to its pool
        self._events = 0
        self._latest: ForwardEvent | None = None

    def alloc(self, n_tokens: int):
        return self.sgl.alloc(n_tokens)

    def free(self, tokens) -> None:
        # SPEC's free takes a req_to_token-shaped run and derives its pages by stride, in
        # run order: SGLang's free_segment (page-aligned, start 0); at page size 1 it is free().
        self.sgl.free_segment(tokens, start_pos=0)

    def flush(self, urgent: bool) -> None:
        if urgent:
            self.sgl.flush_for_allocation()
        else:
            self.sgl.flush_opportunistic()

    def forward(self, tokens) -> None:
        self.fire()  # one forward in flight: the next step implies the previous one finished
        pages = sorted({int(t) // self.config.page_size for t in tokens.tolist()})
        real = None
        if self.forward_stream is not None:
            # a forward on its own stream, ordered after what the scheduling stream queued (as
            # SGLang's overlap scheduling orders it): it reads its rows' KV through SGLang's
            # translate, then records its done event. It only reads, so whatever the harness
            # queues meanwhile on the scheduling stream cannot be clobbered by it.
            real = torch.cuda.Event()
            self.forward_stream.wait_stream(torch.cuda.current_stream(self.device))
            tokens.record_stream(self.forward_stream)
            with torch.cuda.stream(self.forward_stream):
                self._forward_sum = self.kv[self.sgl.translate_kv_loc(tokens)].sum()
                real.record(self.forward_stream)
        event = ForwardEvent(self._events, pages, real)
        self._events += 1
        self._latest = event
        self.sgl.set_latest_forward_done_event(event)
        self.sgl.set_inflight_forward(event, tokens)

    def fire(self) -> None:
        if self._latest is not None:
            self._latest.synchronize()

    def write(self, tokens, stamps) -> None:
        if tokens.numel():
            self.kv[self.sgl.translate_kv_loc(tokens)] = stamps.to(torch.int64)

    def read(self, tokens):
        if tokens.numel() == 0:
            return torch.empty(0, dtype=torch.int64, device=self.device)
        return self.kv[self.sgl.translate_kv_loc(tokens)]

    def translate(self, loc):
        return self.sgl.translate_kv_loc(loc)

    def snapshot(self) -> dict:
        s, e = self.sgl, self._latest
        pending = [[0 if ev is None else ev.id, pages] for ev, (pages, _) in s._pending_reuse.items()]
        return {
            "v2p": s.virtual_to_physical, "p2v": s.physical_to_virtual, "free_virtual": s.free_virtual_ids,
            "holes": s._free_phys_pages, "pending": pending, "watermark": s.watermark_physical,
            "live_pages": s.allocated_count() // s.page_size,
            "in_flight": None if e is None else {"id": e.id, "fired": e.query(), "pages": e.pages},
            "kv": self.kv,
        }


def _mutant_factory(name: str):
    cls = type(f"mutant_{name}", (SGLangAllocator,), {"MUTANT": name})
    cls.__module__ = __name__
    return cls


from .sglang_mutants import MUTANTS  # noqa: E402 - after the adapter it patches

for _name in MUTANTS:
    globals()[f"mutant_{_name}"] = _mutant_factory(_name)

KVFUZZ_FACTORY = SGLangAllocator
