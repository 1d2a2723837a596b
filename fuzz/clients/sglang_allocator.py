"""SGLang's own allocator under the fuzz: ``--allocator kvfuzz-sglang``.

The state machine kvfuzz drives is SGLang's, executed from the installed distribution's
``sglang/srt/mem_cache/allocator/unified_sub_pool.py`` (its base class from
``allocator/base.py``), never imported as ``sglang``: each file is compiled from its own
text under a private module name, and the imports it makes are answered by this module
(``loader.execute``) instead of by SGLang's package, whose ``__init__`` reaches the server
runtime. A single pool is one ``MultiEndedAllocator``; a chain config (docs/spec.md §6) is
one allocator per member (``FloatMultiEndedAllocator`` for a float) over SGLang's own
``UnifiedKVPool`` (``sglang_pool``), wired as SGLang wires them (``sglang_chain``). What
answers each import of the allocator file, and why (docs/sglang.md lists the same):

- ``sglang.kernels.ops.memory.virtual_slot`` (bind, alloc+bind, free+unbind, translate):
  the tier's kernel set, which with ``--allocator kvfuzz-sglang`` is SGLang's own
  (``--kernels kvfuzz-sglang``, ``fuzz.clients.sglang``: its wrappers on torch and CUDA,
  its ``@triton.jit`` kernels under the interpreter).
- ``sglang.srt.mem_cache.allocator``: ``BaseTokenToKVPoolAllocator`` from SGLang's own
  ``base.py`` (it imports only ``abc``, ``typing`` and torch).
- ``sglang.srt.mem_cache.unified_memory_pool``: the names it imports (``UnifiedKVPool``, the
  MHA/MLA kvcache classes) are stand-ins, used only for a type hint and an ``isinstance``. A
  chain's buffer is SGLang's own ``UnifiedKVPool`` (``sglang_pool``); a single pool's is
  ``UnifiedKVPool`` here, one sub-pool with its own reserved floor, which SGLang's class
  (two END sub-pools at least, each floor derived from the sink) cannot be. The kvcache is
  ``sglang_chain.PageCopies``: pages move through SGLang's ``copy_pages`` over kvfuzz's
  red-zoned ``kv`` buffer.
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

import hashlib
import types

import torch

from kvref import ContractViolation

from . import loader
from .loader import stand_in_module
from .sglang_chain import HostStream, Member, PageCopies
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
        self.SGLANG_DEBUG_POISON_POOL = _Env(False)  # read by the UnifiedKVPool of a chain


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
    """A single pool's stand-in for SGLang's ``UnifiedKVPool``, whose own class needs two END
    sub-pools and derives each one's reserved floor (a chain runs the real one,
    ``sglang_pool``): the members the allocator reads, for one sub-pool with its own floor."""

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
    """Named by the allocator file for its zero-on-hand-out check; kvfuzz's kvcache is not one."""


class UnifiedMLATokenToKVPool(UnifiedMHATokenToKVPool):
    pass


class _TorchOnHost(types.ModuleType):
    """``torch`` as the allocator file sees it on a CPU: torch's own names, except
    ``torch.cuda.current_stream``."""

    def __init__(self):
        super().__init__("torch")
        self.cuda = types.SimpleNamespace(current_stream=lambda device=None: HostStream(),
                                          Event=torch.cuda.Event, Stream=torch.cuda.Stream)

    def __getattr__(self, name):
        return getattr(torch, name)


def _kernel_module(kernels) -> types.ModuleType:
    """``virtual_slot`` as the tier's kernel set provides it."""

    def translate_token_ids(*, loc, v2p, page_size, dcp_size=1, dcp_rank=0, out=None, out_width=None):
        assert dcp_size == 1 and out_width is None, "decode context parallelism is off here"
        return kernels.translate_tokens(loc=loc, v2p=v2p, page_size=page_size, out=out)

    return stand_in_module("virtual_slot", alloc_bind_inplace=kernels.alloc_bind_inplace,
                           bind_inplace=kernels.bind_inplace, free_unbind_inplace=kernels.free_unbind_inplace,
                           translate_token_ids=translate_token_ids)


_TORCH_ON_HOST = _TorchOnHost()
_NOTE = f"SGLang {SGLANG_VERSION}; written against {PINNED}"
_LOADED: dict = {}
ENVS = _Envs()


def _execute(private: str, text: str, path: str, answers: dict, on_host: bool) -> types.ModuleType:
    return loader.execute(private, text, path, {**answers, **({"torch": _TORCH_ON_HOST} if on_host else {})},
                          "sglang", _NOTE)


def load(kernels, on_host: bool, mutant: str | None = None) -> types.ModuleType:
    """SGLang's ``unified_sub_pool`` module over ``kernels`` (once per kernel set, host or
    device, and mutant), with ``MUTANTS[mutant]`` applied to its text."""
    key = (id(kernels), on_host, mutant)
    if key in _LOADED:
        return _LOADED[key]
    tag = f"{len(_LOADED)}"
    base = _execute(f"_kvfuzz_sglang_alloc_base_{tag}", _where.file(BASE).read_text(), SGLANG_FILES["base"], {},
                    on_host)
    answers = {
        "sglang.kernels.ops.memory.virtual_slot": _kernel_module(kernels),
        "sglang.srt.environ": stand_in_module("environ", envs=ENVS),
        "sglang.srt.mem_cache.allocator": stand_in_module(
            "allocator", BaseTokenToKVPoolAllocator=base.BaseTokenToKVPoolAllocator),
        "sglang.srt.mem_cache.allocator.paged": stand_in_module("paged", alloc_decode_kernel=None,
                                                                alloc_extend_kernel=None),
        "sglang.srt.mem_cache.unified_memory_pool": stand_in_module(
            "unified_memory_pool", UnifiedKVPool=UnifiedKVPool, UnifiedMHATokenToKVPool=UnifiedMHATokenToKVPool,
            UnifiedMLATokenToKVPool=UnifiedMLATokenToKVPool),
        "sglang.srt.runtime_context": stand_in_module(
            "runtime_context", get_parallel=lambda: types.SimpleNamespace(attn_dcp_size=1, attn_dcp_rank=0)),
        "sglang.srt.utils.common": stand_in_module("common", get_num_new_pages=_not_driven("get_num_new_pages"),
                                                   next_power_of_2=_not_driven("next_power_of_2")),
    }
    from .sglang_mutants import apply

    text = apply(_SOURCE, mutant)
    module = _execute(f"_kvfuzz_sglang_unified_sub_pool_{tag}", text, SGLANG_FILES["unified_sub_pool"], answers,
                      on_host)
    _LOADED[key] = module
    return module


# ---- the allocator ----------------------------------------------------------------------------------


def _plain_buffers(device):
    def make(name, rows, fill, row_len=1):
        return torch.full((rows * row_len,), fill, dtype=torch.int64, device=device)

    return make


def _prefixed(buffers, prefix: str):
    def make(name, rows, fill, row_len=1):
        return buffers(prefix + name, rows, fill, row_len)

    return make


class SGLangAllocator:
    """SGLang's allocator behind kvfuzz's allocator protocol (docs/allocators.md): one
    ``MultiEndedAllocator`` (an id owner over its own sub-pool), or for a config with a chain
    one allocator per member over SGLang's ``UnifiedKVPool``, this object being member 0 and
    ``.chain`` the chain (``sglang_chain``). It translates calls, never behaviour."""

    # SGLang has no checked mode: its callers promise valid input (no double-free or
    # duplicate checks), so kvfuzz sends only what the spec accepts.
    KVFUZZ_LACKS = frozenset({"checked"})
    KVFUZZ_SOURCES = tuple(SGLANG_FILES.values())  # guided's code features: SGLang's allocator, not this adapter
    # One pending entry per event, its batches accumulated (unified_sub_pool.py `_commit_move_batch`'s
    # `setdefault`); the next flush sorts what drains, so only the pages matter.
    KVFUZZ_SNAPSHOT = {"pending": "unordered"}
    KVFUZZ_SPEC_RULES = frozenset({"take_nearest_end", "down_extend_descending", "walk_release_appended",
                                   "urgent_settles_when_moving", "move_cap_floor_1", "eager_free_ids_sorted",
                                   "ladder_flushes_when_short", "float_ladder_low_only"})
    KVFUZZ_CHAINS = True  # two END pools, and the two with a float between them
    MUTANT: str | None = None

    def __init__(self, config, kernels, device, *, buffers=None):
        self.config = config
        self.device = torch.device(device)
        on_host = self.device.type != "cuda"
        self.sgl_module = sgl = load(kernels, on_host, self.MUTANT)
        buffers = buffers or _plain_buffers(self.device)
        self.forward_stream = None if on_host else torch.cuda.Stream(device=self.device)
        if config.chain is None:
            ps = config.page_size
            pool = UnifiedKVPool({NAME: (config.grow, config.num_pages * ps, config.min_page * ps)})
            members = [self._member(sgl, config, pool, NAME, buffers)]
            self.chain = None
        else:
            from . import sglang_pool
            from .sglang_chain import SGLangChain

            pool_module, _, _ = sglang_pool.load(_where, ENVS, _NOTE)
            pool, lay = sglang_pool.build(pool_module, config, self.device)
            members = [self._member(sgl, cfg, pool, lay.names[i], _prefixed(buffers, f"pool{i}.") if i else buffers)
                       for i, cfg in enumerate(config.members)]
            self.chain = SGLangChain(sgl, members, lay.scale)
        self.member = members[0]
        self.clear()

    def _member(self, sgl, config, pool, name: str, buffers) -> Member:
        from . import sglang_pool

        ENVS.SGLANG_LAZY_COMPACTION_MAX_MOVES_PER_CALL.value = config.max_moves  # read by the constructor
        _, copy_pages, zero_pages = sglang_pool.load(_where, ENVS, _NOTE)
        ps = config.page_size
        kv = buffers("kv", config.num_pages, 0, ps)
        cls = sgl.FloatMultiEndedAllocator if config.is_float else sgl.MultiEndedAllocator
        a = cls(kvcache=PageCopies(kv, ps, copy_pages, zero_pages), unified_buffer=pool, sub_pool_name=name,
                device=str(self.device), is_id_owner=True, page_size=ps, forward_stream=self.forward_stream,
                lazy_compaction=config.lazy)
        if (a.num_pages, a.min_page_index) != (config.num_pages, config.min_page):
            raise ContractViolation(f"SGLang's pool gives sub-pool {name} pages [{a.min_page_index}, {a.num_pages}), "
                                    f"the config [{config.min_page}, {config.num_pages})")
        # kvfuzz's red-zoned tables in place of the ones it made, before any op (clear() rewrites them)
        a.virtual_to_physical = buffers("v2p", config.table_rows, -1)
        a.physical_to_virtual = buffers("p2v", config.table_rows, -1)
        return Member(a, kv, self.device, self.forward_stream)

    sgl = property(lambda self: self.member.sgl)
    kv = property(lambda self: self.member.kv)
    v2p = property(lambda self: self.member.sgl.virtual_to_physical)
    p2v = property(lambda self: self.member.sgl.physical_to_virtual)

    def clear(self) -> None:
        for m in self.chain.members if self.chain is not None else [self.member]:
            m.clear()

    def alloc(self, n_tokens: int):
        return self.member.alloc(n_tokens)

    def free(self, tokens) -> None:
        self.member.free(tokens)

    def flush(self, urgent: bool) -> None:
        self.member.flush(urgent)

    def forward(self, tokens) -> None:
        self.member.forward(tokens)

    def fire(self) -> None:
        self.member.fire()

    def write(self, tokens, stamps) -> None:
        self.member.write(tokens, stamps)

    def read(self, tokens):
        return self.member.read(tokens)

    def translate(self, loc):
        return self.member.translate(loc)

    def snapshot(self) -> dict:
        return self.member.snapshot()


def _mutant_factory(name: str):
    cls = type(f"mutant_{name}", (SGLangAllocator,), {"MUTANT": name})
    cls.__module__ = __name__
    return cls


from .sglang_mutants import MUTANTS  # noqa: E402 - after the adapter it patches

for _name in MUTANTS:
    globals()[f"mutant_{_name}"] = _mutant_factory(_name)

KVFUZZ_FACTORY = SGLangAllocator
