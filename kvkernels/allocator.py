"""DeviceAllocator: the allocator state machine of SPEC.md §3 over torch tensors.

It drives a *kernel set* (DESIGN.md) given to its constructor, so the same state
machine runs the torch tier (``kvkernels.torch_path``), the interpreter tier and the
CUDA tier (``kvkernels``), or a team's own kernels.

Why it is shaped this way:
- The lazy free path and the read-table build never synchronise (SPEC §5): the free
  list and the holes are device tensors grown with ``torch.cat``; every size the host
  needs comes from ``numel``/``shape``, never from reading device memory.
- ``flush`` and eager ``free`` may synchronise, so they compute the walk on the host
  from one copy of the tables and apply all moves as batched device ops. The moves of
  one walk are disjoint (no destination is ever a later source), so batching them
  equals doing them one by one.
- ``checked=True`` validates every precondition first (``kvkernels.checks``: it reads
  device memory, so it synchronises) and raises ContractViolation with nothing
  changed. Unchecked, bad input must still stay inside the buffers: token data goes
  through ``translate``, which sends an invalid token to the padding sink, page 0.
  A lazy free of pages the unfired forward writes is such a contract break (kvref):
  only checked mode looks, since the forward's pages live on the device.
- Its tables come from a ``buffers`` factory (default: plain ``torch.full``), so a
  harness can put them between red zones without the allocator knowing.
- Forward events are simulated (``fire()`` marks one fired): the fuzzer, not a stream,
  decides when a forward completes, so traces replay identically on every tier.
- A config with a ``chain`` makes this pool member 0 of a ``chain_class`` (default
  ``kvkernels.chain.DeviceChain``, docs/spec.md §6) built with it as ``self.chain``; the
  chain bounds the frontier (``frontier_room``) and opens and closes the move gate
  (``gate_open``). A class attribute, so a planted bug in the chain swaps it (mutants). A
  chain's float member is a ``kvkernels.float_pool.DeviceFloat``.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch

from kvref.errors import ContractViolation

from . import checks


@dataclass
class _Event:
    id: int
    fired: bool = False


@dataclass
class _InFlight:
    event: _Event
    pages: torch.Tensor  # virtual pages it writes, on the device


def plain_buffers(device):
    """The default table factory: ``(name, rows, fill, row_len=1) -> tensor``."""
    def make(name: str, rows: int, fill: int, row_len: int = 1) -> torch.Tensor:
        return torch.full((rows * row_len,), fill, dtype=torch.int64, device=device)
    return make


class DeviceAllocator:
    chain_class = None  # None: kvkernels.chain.DeviceChain
    KVFUZZ_CHAINS = True  # kvfuzz's allocator protocol: it builds every chain layout (docs/allocators.md)

    def __init__(self, config, kernels: ModuleType | None = None, device="cpu", checked: bool = False,
                 buffers=None):
        if kernels is None:
            import kvkernels as kernels
        self.config = config
        self.kernels = kernels
        self.device = torch.device(device)
        self.checked = checked
        self.buffers = buffers or plain_buffers(self.device)
        c = config
        self.v2p = self.buffers("v2p", c.table_rows, -1)
        self.p2v = self.buffers("p2v", c.table_rows, -1)
        self.kv = self.buffers("kv", c.num_pages, 0, c.page_size)
        self.frontier_room = None  # () -> pages the chain's bytes leave this frontier (None: index room only)
        self.gate_open = None  # () -> whether pages may move (None: always)
        self.pool = 0
        self.clear()
        self.chain = None
        if c.chain is not None:
            chain_class = self.chain_class
            if chain_class is None:
                from .chain import DeviceChain as chain_class
            self.chain = chain_class(self)

    # ---- geometry -------------------------------------------------------------
    @property
    def up(self) -> bool:
        return self.config.grow == "up"

    def _span(self, wm: int | None = None) -> range:
        wm = self.watermark if wm is None else wm
        c = self.config
        return range(c.min_page, wm) if self.up else range(wm + 1, c.num_pages)

    def _long(self, values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=self.device)

    def _reader_in_flight(self) -> bool:
        return self.in_flight is not None and not self.in_flight.event.fired

    # ---- lifecycle ------------------------------------------------------------
    def clear(self) -> None:
        c = self.config
        for t in (self.v2p, self.p2v):
            t.fill_(-1)
            t[:1].fill_(0)
        self.kv.fill_(0)
        self.free_virtual = torch.arange(c.min_page, c.num_pages, dtype=torch.int64, device=self.device)
        self.holes = torch.empty(0, dtype=torch.int64, device=self.device)
        self.pending: list[tuple[_Event, torch.Tensor]] = []
        self.watermark = c.min_page if self.up else c.num_pages - 1
        self.live_pages = 0
        self.in_flight: _InFlight | None = None
        self._events = 0

    # ---- alloc ----------------------------------------------------------------
    def _pages_asked(self, n_tokens: int) -> int:
        """The pages ``n_tokens`` asks for (0: the empty result), or a refusal."""
        c = self.config
        if not isinstance(n_tokens, int) or isinstance(n_tokens, bool):
            raise ContractViolation(f"alloc: n_tokens must be an int, got {n_tokens!r}")
        if n_tokens % c.page_size:
            raise ContractViolation(f"alloc: n_tokens={n_tokens} is not a multiple of page_size={c.page_size}")
        return max(0, n_tokens) // c.page_size

    def _tokens_of(self, vp: torch.Tensor) -> torch.Tensor:
        ps = self.config.page_size
        return (vp[:, None] * ps + torch.arange(ps, dtype=torch.int64, device=self.device)).reshape(-1)

    def alloc(self, n_tokens: int) -> torch.Tensor | None:
        c = self.config
        k = self._pages_asked(n_tokens)
        if k == 0:
            return torch.empty(0, dtype=torch.int64, device=self.device)
        n_holes = self.holes.numel()
        room = c.capacity_pages - len(self._span())
        if self.frontier_room is not None:
            room = min(room, self.frontier_room())
        if k > room + n_holes or k > self.free_virtual.numel():
            return None
        vp = self.free_virtual[:k]
        self.free_virtual = self.free_virtual[k:]
        d = min(k, n_holes)
        new = k - d
        start = self.watermark if self.up else self.watermark - new + 1
        self.watermark += new if self.up else -new
        if d == 0:
            self.kernels.alloc_bind_inplace(vp, self.v2p, self.p2v, start)
        else:
            fresh = torch.arange(start, start + new, dtype=torch.int64, device=self.device)
            phys = torch.cat((self.holes[:d], fresh))
            self.holes = self.holes[d:]
            self.kernels.bind_inplace(vp, phys, self.v2p, self.p2v)
        self.live_pages += k
        return self._tokens_of(vp)

    # ---- free -----------------------------------------------------------------
    def _pages_of_run(self, tokens: torch.Tensor) -> torch.Tensor:
        ps = self.config.page_size
        return tokens if ps == 1 else torch.div(tokens[::ps], ps, rounding_mode="floor")

    def free(self, tokens: torch.Tensor) -> None:
        if tokens.numel() == 0:
            return
        if self.checked:
            checks.check_free(self.config, self.v2p, tokens)
            if self.config.lazy and self._reader_in_flight():
                checks.check_free_in_flight(self.config, tokens, self.in_flight.pages, self.in_flight.event.id)
        if self.config.lazy:
            self._free_lazy(tokens)
        else:
            self._free_eager(tokens)

    def _free_lazy(self, tokens: torch.Tensor) -> None:
        pages = self._pages_of_run(tokens)
        phys = self.kernels.free_unbind_inplace(pages, self.v2p, self.p2v)
        self.free_virtual = torch.cat((self.free_virtual, pages))
        self.holes = torch.cat((self.holes, phys))
        self.live_pages -= pages.numel()

    def _free_eager(self, tokens: torch.Tensor) -> None:
        pages = self._pages_of_run(tokens)
        freed = self.kernels.free_unbind_inplace(pages, self.v2p, self.p2v).tolist()
        self.free_virtual = torch.cat((self.free_virtual, pages))
        self.live_pages -= len(freed)
        k = len(freed)
        if self.up:
            new_wm = self.watermark - k
            vacated = range(new_wm, self.watermark)
            kept = sorted(p for p in freed if p < new_wm)
        else:
            new_wm = self.watermark + k
            vacated = range(self.watermark + 1, new_wm + 1)
            kept = sorted(p for p in freed if p > new_wm)
        band = self.p2v[vacated.start:vacated.stop].tolist()
        survivors = [p for p, v in zip(vacated, band) if v != -1]
        self._move_pages(survivors, kept)
        self.p2v[vacated.start:vacated.stop].fill_(-1)
        self.watermark = new_wm

    def _move_pages(self, src: list[int], dst: list[int]) -> None:
        """Batched page moves src[i] -> dst[i] (disjoint), carrying data."""
        if not src:
            return
        if len(src) != len(dst):
            raise RuntimeError(f"page moves: {len(src)} sources for {len(dst)} destinations")
        s, d = self._long(src), self._long(dst)
        pages = self.kv.view(self.config.num_pages, self.config.page_size)
        pages[d] = pages[s]
        v = self.p2v[s]
        self.kernels.bind_inplace(v, d, self.v2p, self.p2v)
        self.p2v.index_fill_(0, s, -1)

    # ---- flush ----------------------------------------------------------------
    def flush(self, urgent: bool = False) -> None:
        gated = self.gate_open is not None and not self.gate_open()
        if urgent and not gated:
            self.fire()
        if not self.config.lazy:
            return
        holes = self.holes.tolist()
        still = []
        for event, pages in self.pending:
            if event.fired:
                holes.extend(pages.tolist())
            else:
                still.append((event, pages))
        self.pending = still
        if gated:  # a closed move gate: nothing moves or is absorbed; fired sources rejoin the holes
            self.holes = self._long(holes)
            return
        holes.sort()
        p2v = self.p2v.tolist()
        pinned = set(self.in_flight.pages.tolist()) if self._reader_in_flight() else set()
        wm = self._absorb(holes, self.watermark)
        src_list, dst_list, batch = [], [], []
        live = sorted(p for p in self._span(wm) if p2v[p] != -1)
        while holes and (urgent or len(src_list) < self.config.max_moves) and live:
            dst = holes[0] if self.up else holes[-1]
            src = live[-1] if self.up else live[0]
            if (src <= dst if self.up else src >= dst) or p2v[src] in pinned:
                break
            holes.remove(dst)
            live.remove(src)
            live.append(dst)
            live.sort()
            src_list.append(src)
            dst_list.append(dst)
            if self._reader_in_flight():
                batch.append(src)
            else:
                holes.append(src)
                holes.sort()
        self._move_pages(src_list, dst_list)
        if batch:
            self.pending.append((self.in_flight.event, self._long(batch)))
        self.watermark = self._absorb(holes, wm)
        self.holes = self._long(holes)

    def _absorb(self, holes: list[int], wm: int) -> int:
        if self.up:
            while holes and holes[-1] == wm - 1:
                holes.pop()
                wm -= 1
        else:
            while holes and holes[0] == wm + 1:
                holes.pop(0)
                wm += 1
        return wm

    # ---- forward / data -------------------------------------------------------
    def forward(self, tokens: torch.Tensor) -> None:
        if self.checked:
            checks.check_live_tokens(self.config, self.v2p, tokens, "forward")
        self.fire()
        event = _Event(self._events)
        self._events += 1
        pages = torch.div(tokens, self.config.page_size, rounding_mode="floor")
        self.in_flight = _InFlight(event, pages)

    def fire(self) -> None:
        if self.in_flight is not None:
            self.in_flight.event.fired = True

    def _slots(self, tokens: torch.Tensor) -> torch.Tensor:
        translate = getattr(self.kernels, "translate_tokens", None)
        if translate is None:
            from . import torch_path

            translate = torch_path.translate_tokens
        return translate(loc=tokens, v2p=self.v2p, page_size=self.config.page_size)

    def write(self, tokens: torch.Tensor, stamps: torch.Tensor) -> None:
        if self.checked:
            checks.check_write(self.config, self.v2p, tokens, stamps)
        if tokens.numel():
            self.kv[self._slots(tokens)] = stamps.to(torch.int64)

    def read(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.checked:
            checks.check_live_tokens(self.config, self.v2p, tokens, "read")
        if tokens.numel() == 0:
            return torch.empty(0, dtype=torch.int64, device=self.device)
        return self.kv[self._slots(tokens)]

    # ---- kernel-level views over this pool's v2p --------------------------------
    def build_read_table(self, *, legacy: bool = False, **kwargs) -> torch.Tensor:
        c = self.config
        if self.checked:
            checks.check_read_table(c, self.v2p, kwargs["req_to_token"], kwargs["req_pool_indices"], kwargs["seq_lens"],
                                   out=kwargs["out"], max_pages=kwargs["max_pages"])
        fn = self.kernels.build_kv_read_table_legacy if legacy else self.kernels.build_kv_read_table
        return fn(v2p=self.v2p, multiplier=c.multiplier, page_size=c.page_size, **kwargs)

    def build_read_table_packed(self, **kwargs) -> torch.Tensor:
        c = self.config
        if self.checked:
            checks.check_read_table(c, self.v2p, kwargs["req_to_token"], kwargs["req_pool_indices"], kwargs["seq_lens"],
                                   out=kwargs["out"], indptr=kwargs["indptr"], max_tokens=kwargs["max_tokens"],
                                   kv_start=kwargs.get("kv_start_idx"))
        return self.kernels.build_kv_read_table_packed(
            v2p=self.v2p, multiplier=c.multiplier, page_size=c.page_size, **kwargs)

    def translate(self, loc: torch.Tensor) -> torch.Tensor:
        return self._slots(loc)

    # ---- state ----------------------------------------------------------------
    def snapshot(self) -> dict:
        """The state as SPEC's plain values, read from the device in one transfer (a GPU
        round trip per field would cost more than the op it follows)."""
        f = self.in_flight
        parts = [self.v2p, self.p2v, self.free_virtual, self.holes, self.kv, *(pages for _, pages in self.pending)]
        if f is not None:
            parts.append(f.pages)
        flat = torch.cat([t.reshape(-1).to(torch.int64) for t in parts]).tolist()
        values, at = [], 0
        for t in parts:
            values.append(flat[at:at + t.numel()])
            at += t.numel()
        v2p, p2v, free_virtual, holes, kv, *rest = values
        return {
            "v2p": v2p,
            "p2v": p2v,
            "free_virtual": free_virtual,
            "holes": holes,
            "pending": [[e.id, pages] for (e, _), pages in zip(self.pending, rest)],
            "watermark": self.watermark,
            "live_pages": self.live_pages,
            "in_flight": None if f is None else {"id": f.event.id, "fired": f.event.fired, "pages": sorted(set(rest[-1]))},
            "kv": kv,
        }

    def clone(self, checked: bool | None = None, buffers=None) -> "DeviceAllocator":
        """An independent copy in fresh buffers (from ``buffers``, default plain ones),
        e.g. for an unchecked probe."""
        twin = type(self)(self.config, self.kernels, self.device, self.checked if checked is None else checked,
                          buffers)
        twin.v2p.copy_(self.v2p)
        twin.p2v.copy_(self.p2v)
        twin.kv.copy_(self.kv)
        twin.free_virtual = self.free_virtual.clone()
        twin.holes = self.holes.clone()
        events = {}
        for event, _ in self.pending:
            events.setdefault(id(event), _Event(event.id, event.fired))
        if self.in_flight is not None:
            e = self.in_flight.event
            events.setdefault(id(e), _Event(e.id, e.fired))
            twin.in_flight = _InFlight(events[id(e)], self.in_flight.pages.clone())
        twin.pending = [(events[id(e)], pages.clone()) for e, pages in self.pending]
        twin.watermark, twin.live_pages, twin._events = self.watermark, self.live_pages, self._events
        return twin
