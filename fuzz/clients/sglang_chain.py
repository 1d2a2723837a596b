"""The members of SGLang's chain under kvfuzz's allocator protocol, and the chain.

A ``Member`` is one SGLang allocator (``MultiEndedAllocator``, or ``FloatMultiEndedAllocator``
for a float) over its sub-pool, with kvfuzz's data for it and its forwards; ``SGLangChain``
is docs/allocators.md's chain interface over the members of one ``UnifiedKVPool``, wired as
SGLang wires them:

- peers bound as SGLang's composites bind them: two END pools each other's ``bind_peer``
  (``UnifiedMambaAllocator``); with a float, ``bind_high_peer`` / ``bind_low_peer`` along
  up end, float, down end (``UnifiedHybridSWAAllocator``'s three-pool chain);
- move gates as callables kvfuzz opens and closes, installed where SGLang installs gates
  (``install_move_gate``'s ``disagg_move_gate``): on every member that moves pages, the lazy
  END pools and the float (an eager END pool's free would refuse one: SGLang asserts that
  eager compaction runs ungated, and a closed gate changes nothing of an eager pool's);
- ``relieve`` is SGLang's first rung, an urgent flush of each of ``_flush_targets()``;
  ``make_room`` and ``compact`` are the float's own methods;
- ``capacity`` is SGLang's memoised ``available_size()`` and ``schedulable_available_size()``,
  and the joint free bytes summed over SGLang's own frontiers (``_byte_low_frontier``, ...)
  and hole lists, in kvfuzz's units;
- ``snapshot`` also runs SGLang's own chain accounting (``_chain_byte_accounting_violations``:
  each member's conservation and memo coherence, and the frontiers' order), and a violation
  it reports is the target's failure, raised.

Each member's KV is a buffer of its own (one int64 stamp per token slot), not the shared
byte buffer: kvref keeps each member's data apart, so what a page held when a neighbour's
frontier uncovered it is not modelled. Pages move through SGLang's ``copy_pages`` over that
buffer (``PageCopies``), as ``UnifiedMHATokenToKVPool.move_physical_pages`` moves them.
"""

from __future__ import annotations

import torch

from kvref import ContractViolation
from kvref.chain import MemberCalls


class HostStream:
    """``torch.cuda.current_stream()`` on a CPU: work is never queued behind a forward,
    so waiting for an event means the forward completes now."""

    def wait_event(self, event):
        event.wait(self)

    def wait_stream(self, _stream):
        return None

    def synchronize(self):
        return None


class ForwardEvent:
    """A forward's done event as SGLang's allocator uses one (``query``, and ``wait`` from a
    stream's ``wait_event``); fired when kvfuzz says so. On CUDA it wraps a real event."""

    def __init__(self, id: int, pages: list, real=None):
        self.id, self.pages, self.real, self.fired = id, pages, real, False

    def query(self) -> bool:
        return self.fired

    def wait(self, stream=None) -> None:
        if self.real is not None and stream is not None and not isinstance(stream, HostStream):
            self.real.wait(stream)
        self.fired = True  # what the stream runs next is ordered after the forward: settled

    def synchronize(self) -> None:
        if self.real is not None:
            self.real.synchronize()
        self.fired = True


class PageCopies:
    """The kvcache an allocator moves pages through: SGLang's ``copy_pages`` (and
    ``zero_pages``) over a member's ``kv`` buffer viewed as bytes, ``page_size`` slots of one
    int64 a page. Not one of SGLang's MHA/MLA classes, so ``_maybe_zero_pages`` leaves a
    handed-out page's data in place, as SPEC §3 (kvref) does."""

    def __init__(self, kv: torch.Tensor, page_size: int, copy_pages, zero_pages):
        self.kv, self.page_size = kv, page_size
        self.num_pages = kv.numel() // page_size
        self._copy, self._zero = copy_pages, zero_pages

    def move_physical_pages(self, tgt_pages, src_pages, page_size):
        assert page_size == self.page_size, f"pages of {page_size} slots passed to a pool of {self.page_size}"
        self._copy(self.kv.view(torch.uint8), tgt_pages, src_pages, self.num_pages, 8 * page_size)

    def zero_physical_pages(self, phys_pages):
        self._zero(self.kv.view(torch.uint8), phys_pages, self.num_pages, 8 * self.page_size)


class Member:
    """One SGLang allocator behind the single pool's protocol (docs/allocators.md)."""

    def __init__(self, sgl, kv: torch.Tensor, device: torch.device, forward_stream):
        self.sgl, self.kv, self.device, self.forward_stream = sgl, kv, device, forward_stream
        self.is_float = sgl.grow_direction == "float"
        self._events = 0
        self._latest: ForwardEvent | None = None

    def clear(self) -> None:
        self.sgl.clear()
        self.kv.zero_()  # the kvcache's reset: SGLang's allocator leaves KV bytes to its pool
        self._events = 0
        self._latest = None

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
        pages = sorted({int(t) // self.sgl.page_size for t in tokens.tolist()})
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
        if self.is_float:
            watermark, live, pending = [s.low_wm_page, s.high_wm_page], s._live_pages(), []
        else:
            watermark, live = s.watermark_physical, s.allocated_count() // s.page_size
            pending = [[0 if ev is None else ev.id, pages] for ev, (pages, _) in s._pending_reuse.items()]
        return {
            "v2p": s.virtual_to_physical, "p2v": s.physical_to_virtual, "free_virtual": s.free_virtual_ids,
            "holes": s._free_phys_pages, "pending": pending, "watermark": watermark, "live_pages": live,
            "in_flight": None if e is None else {"id": e.id, "fired": e.query(), "pages": e.pages},
            "kv": self.kv,
        }


class SGLangChain(MemberCalls):  # free, flush, forward, ... passed on to the member as they are
    """docs/allocators.md's chain interface over the members of one SGLang ``UnifiedKVPool``."""

    def __init__(self, module, members: list[Member], scale: int):
        self.module, self.members, self.scale = module, members, scale
        self.gates = [True] * len(members)
        sgl = [m.sgl for m in members]
        if len(sgl) == 2:
            sgl[0].bind_peer(sgl[1])
            sgl[1].bind_peer(sgl[0])
        elif len(sgl) == 3:
            sgl[0].bind_high_peer(sgl[1])
            sgl[1].bind_low_peer(sgl[0])
            sgl[1].bind_high_peer(sgl[2])
            sgl[2].bind_low_peer(sgl[1])
        for i, a in enumerate(sgl):
            if a.lazy_compaction or members[i].is_float:
                module.install_move_gate([a], slot="disagg_move_gate", gate=(lambda i=i: self.gates[i]),
                                         feature="kvfuzz's move gate", lazy_compaction=True)

    def member(self, pool: int) -> Member:
        if not isinstance(pool, int) or isinstance(pool, bool) or not 0 <= pool < len(self.members):
            raise ContractViolation(f"pool {pool!r}: the chain has {len(self.members)} member(s), 0..{len(self.members) - 1}")
        return self.members[pool]

    def alloc(self, pool: int, n_tokens: int):
        return self.member(pool).alloc(n_tokens)

    def relieve(self, pool: int) -> None:
        for target in self.member(pool).sgl._flush_targets():
            target.flush_for_allocation()

    def _float(self, pool: int, what: str):
        m = self.member(pool)
        if not m.is_float:
            raise ContractViolation(f"{what}: pool {pool} is an END pool; only a float moves on demand")
        return m.sgl

    def make_room(self, pool: int, side: str, min_bytes: int) -> int:
        opened = self._float(pool, "make_room").make_room(side=side, min_bytes=min_bytes * self.scale)
        return opened // self.scale

    def compact(self, pool: int, retreat_side: str) -> int:
        return self._float(pool, "compact_holes").compact_holes(retreat_side=retreat_side)

    def joint(self) -> int:
        """The free bytes between facing frontiers and in every member's holes, from SGLang's
        frontiers, in kvfuzz's units."""
        shown = [m.sgl for m in self.members if not m.sgl._is_frontier_transparent()]
        if len(shown) == 1:
            bands = shown[0].unified_buffer.total_bytes - shown[0]._byte_high_frontier()
        else:
            bands = sum(max(0, b._byte_low_frontier() - a._byte_high_frontier()) for a, b in zip(shown, shown[1:]))
        holes = sum(len(m.sgl._free_phys_pages) * m.sgl.entry_bytes_per_page for m in self.members)
        return (bands + holes) // self.scale

    def capacity(self, pool: int) -> list[int]:
        s = self.member(pool).sgl
        return [s.available_size(), s.schedulable_available_size(), self.joint()]

    def snapshot(self) -> dict:
        violations = self.module._chain_byte_accounting_violations([m.sgl for m in self.members])
        if violations:
            raise AssertionError("SGLang's own chain accounting: " + "; ".join(violations))
        return {"pools": [m.snapshot() for m in self.members], "gates": list(self.gates)}
