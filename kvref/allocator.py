"""SPEC.md §3: one sub-pool of the unified KV pool, as a plain-Python state machine.

This is the oracle: every rule is written the way SPEC.md states it, favouring
obviousness over speed. Rules the spec leaves open, chosen here (the simplest that
keeps every invariant of §4):

- ``alloc`` checks ``n_tokens % page_size`` before ``n_tokens <= 0``, so ``alloc(-1)`` at
  page size 2 is a ContractViolation and ``alloc(0)`` returns ``[]``.
- ``forward(tokens)`` requires every token's page to be live (ContractViolation
  otherwise). Each forward gets a fresh event id, counted from 0 after ``clear``. A
  forward that fires stays recorded as ``in_flight`` (fired) until the next forward.
- A flush that moves pages while a reader is in flight records those sources as ONE
  pending batch for that flush, tied to the in-flight event. With no reader in flight a
  moved-out source enters ``holes`` at its sorted place, so ``holes`` stays sorted
  through the walk and the final absorb (the order the next alloc takes them in).
- A lazy free of a page the unfired in-flight forward writes is a ContractViolation
  (nothing changes). SPEC §3 keeps such pages in place until the forward fires (the
  flush walk stops at them), and a free that put them into ``holes`` would hand them
  to the next alloc while the forward still writes them. Deferring them to ``pending``
  instead is not an option a device allocator could follow: which freed pages the
  forward writes is data on the device, and splitting one free between ``holes`` and
  ``pending`` needs its count on the host, a synchronisation the lazy free path must
  never make (SPEC §5). So the caller fires (waits for) the forward first, as a server
  does before it frees a finished request's pages; checked mode refuses, unchecked
  targets may do anything memory-safe.
- Eager free ignores the in-flight forward (an eager pool is the legacy path, whose
  frees may synchronise anyway, so the rule above is for lazy pools only); eager
  ``flush`` only fires when urgent.
- ``write`` takes unique, live tokens; ``read`` takes live tokens (repeats allowed).
  Data lives per physical slot: ``kv[v2p[t // ps] * ps + t % ps]``; a freshly
  allocated page holds whatever its physical page last held (0 after ``clear``).
- ``live_pages`` is kept for eager pools too (it equals the span size there).

A pool whose config has a ``chain`` is member 0 of a ``kvref.chain.Chain`` built with it
(``self.chain``), which bounds each member's frontier by its neighbour's (``frontier_room``)
and opens and closes its move gate (``gate_open``); docs/spec.md §6. Alone, neither hook is
set and the pool is exactly SPEC §3's.
"""

from __future__ import annotations

from bisect import insort
from dataclasses import dataclass, field

from . import kernels
from .chain import Chain
from .config import PoolConfig
from .errors import ContractViolation

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@dataclass
class Event:
    id: int
    fired: bool = False


@dataclass
class InFlight:
    event: Event
    pages: frozenset = field(default_factory=frozenset)


def _as_int_list(values, what: str) -> list[int]:
    out = []
    for i, x in enumerate(values):
        if not isinstance(x, int) or isinstance(x, bool):
            raise ContractViolation(f"{what}[{i}] = {x!r} is not an int")
        out.append(x)
    return out


# Where an allocator kvfuzz drives settles a point differently from SPEC §3 on valid
# input, it declares the rule it follows (docs/allocators.md, KVFUZZ_SPEC_RULES) and the
# spec follows it too. Each is SGLang 0.5.23's MultiEndedAllocator (docs/sglang.md has
# its line); every invariant of §4 holds under each.
RULES = {
    "take_nearest_end": "an alloc that reuses some but not all holes sorts them and takes the lowest (up) or "
                        "highest (down), returned ascending; the rest stay sorted",
    "down_extend_descending": "grow down, an alloc that reuses holes and extends: the fresh pages descend",
    "walk_release_appended": "a non-urgent flush appends the sources it frees to holes after the walk, in walk "
                             "order, and does not absorb again",
    "urgent_settles_when_moving": "an urgent flush fires the forward only when it drains an unfired pending "
                                  "batch or has holes left to walk after absorbing; an eager flush does nothing",
    "move_cap_floor_1": "a non-urgent flush moves at least one page: max_moves 0 acts as 1",
    "eager_free_ids_sorted": "an eager pool of page size 1 appends the pages it frees to free_virtual ascending",
    "ladder_flushes_when_short": "in a chain, an alloc that falls short runs the relief ladder whatever the "
                                 "shortfall and before the free list is checked, and what the ladder did stays "
                                 "when the alloc still fails",
    "float_ladder_low_only": "in a chain, a float short on its own alloc flushes its low neighbour only (its "
                             "schedulable capacity credits both)",
}


class Allocator:
    def __init__(self, config: PoolConfig, rules=frozenset()):
        if not isinstance(config, PoolConfig):
            raise ContractViolation(f"Allocator needs a PoolConfig, got {type(config).__name__}")
        unknown = set(rules) - set(RULES)
        if unknown:
            raise ContractViolation(f"unknown spec rules {sorted(unknown)}; there are {sorted(RULES)}")
        self.config = config
        self.rules = frozenset(rules)
        self.frontier_room = None  # () -> pages the chain's bytes leave this frontier (None: index room only)
        self.gate_open = None  # () -> whether pages may move (None: always)
        self.pool = 0  # this pool's index in its chain
        if config.is_float and type(self) is Allocator:
            raise ContractViolation("a float pool is a chain's middle member, built by its chain (docs/spec.md §6)")
        self.clear()
        self.chain = Chain(self) if config.chain is not None else None

    def peer(self, config: PoolConfig) -> Allocator:
        """Another member of this pool's chain, under the same rules: a float for a float
        config, else a pool of this one's type."""
        from .float_pool import FloatPool  # its module builds on this one

        return FloatPool(config, self.rules) if config.is_float else type(self)(config, self.rules)

    # ---- geometry -------------------------------------------------------------
    @property
    def up(self) -> bool:
        return self.config.grow == "up"

    def span(self) -> range:
        c = self.config
        return range(c.min_page, self.watermark) if self.up else range(self.watermark + 1, c.num_pages)

    def index_room(self) -> int:
        return self.config.capacity_pages - len(self.span())

    def room(self) -> int:
        """Pages the frontier can still take: the index room, and in a chain no more than the
        bytes up to the neighbour's frontier hold (docs/spec.md §6)."""
        room = self.index_room()
        return room if self.frontier_room is None else min(room, self.frontier_room())

    def reader_in_flight(self) -> bool:
        return self.in_flight is not None and not self.in_flight.event.fired

    # ---- lifecycle ------------------------------------------------------------
    def clear(self) -> None:
        c = self.config
        self.v2p = [-1] * c.table_rows
        self.p2v = [-1] * c.table_rows
        self.v2p[0] = self.p2v[0] = 0
        self.free_virtual = list(range(c.min_page, c.num_pages))
        self.watermark = c.min_page if self.up else c.num_pages - 1
        self.holes: list[int] = []
        self.pending: list[tuple[Event, list[int]]] = []
        self.live_pages = 0
        self.kv = [0] * (c.num_pages * c.page_size)
        self.in_flight: InFlight | None = None
        self.written: dict[int, int] = {}
        self._events = 0
        self.walk_stop: str | None = None  # why the last flush's walk stopped (None: it walked none)

    # ---- token <-> page -------------------------------------------------------
    def _live_page(self, page: int, why: str) -> None:
        c = self.config
        if not c.min_page <= page < c.num_pages:
            kind = "reserved" if 0 <= page < c.min_page else "out of range"
            raise ContractViolation(f"{why}: page {page} is {kind} (allocatable pages are [{c.min_page}, {c.num_pages}))")
        if self.v2p[page] == -1:
            raise ContractViolation(f"{why}: page {page} is not allocated")

    def _slot(self, token: int) -> int:
        ps = self.config.page_size
        return self.v2p[token // ps] * ps + token % ps

    def _check_live_tokens(self, tokens: list[int], why: str) -> None:
        for t in tokens:
            if t < 0:
                raise ContractViolation(f"{why}: token {t} is negative")
            self._live_page(t // self.config.page_size, f"{why} (token {t})")

    def pages_of_run(self, tokens: list[int]) -> list[int]:
        """The pages of a free run (SPEC §3 free, step 1), checking its shape."""
        ps = self.config.page_size
        if ps == 1:
            return list(tokens)
        for i, t in enumerate(tokens):
            head = tokens[i - i % ps]
            if head % ps != 0:
                raise ContractViolation(f"free run: page {head // ps}: token {head} at index {i - i % ps} does not start a page (page_size={ps})")
            if t != head + i % ps:
                raise ContractViolation(f"free run: page {head // ps}: tokens[{i}] = {t}, expected {head + i % ps} (a page's tokens must be consecutive)")
        return [t // ps for t in tokens[::ps]]

    # ---- alloc ----------------------------------------------------------------
    def _pages_asked(self, n_tokens: int) -> int:
        """alloc step 1: the pages ``n_tokens`` asks for (0: the empty result), or a refusal."""
        c = self.config
        if not isinstance(n_tokens, int) or isinstance(n_tokens, bool):
            raise ContractViolation(f"alloc: n_tokens must be an int, got {n_tokens!r}")
        if n_tokens % c.page_size:
            raise ContractViolation(f"alloc: n_tokens={n_tokens} is not a multiple of page_size={c.page_size}")
        return max(0, n_tokens) // c.page_size

    def alloc(self, n_tokens: int) -> list[int] | None:
        c = self.config
        k = self._pages_asked(n_tokens)
        if k == 0:
            return []
        if k > self.room() + len(self.holes) or k > len(self.free_virtual):
            return None
        vp = self.free_virtual[:k]
        del self.free_virtual[:k]
        d = min(k, len(self.holes))
        if "take_nearest_end" in self.rules and 0 < d < len(self.holes):
            self.holes.sort()
            if not self.up:
                self.holes = self.holes[-d:] + self.holes[:-d]
        phys = self.holes[:d]
        del self.holes[:d]
        new = k - d
        if self.up:
            start = self.watermark
            self.watermark += new
        else:
            start = self.watermark - new + 1
            self.watermark -= new
        fresh = list(range(start, start + new))
        if "down_extend_descending" in self.rules and not self.up and d:
            fresh.reverse()
        if d == 0:
            kernels.alloc_bind(self.v2p, self.p2v, vp, start)
        else:
            kernels.bind(self.v2p, self.p2v, vp, phys + fresh)
        self.live_pages += k
        return [v * c.page_size + o for v in vp for o in range(c.page_size)]

    # ---- free -----------------------------------------------------------------
    def _pages_freed(self, tokens) -> list[int]:
        """free steps 1-2: the pages of a free run, each unique and live, or a refusal."""
        pages = self.pages_of_run(_as_int_list(tokens, "free tokens"))
        seen: set[int] = set()
        for p in pages:
            if p in seen:
                raise ContractViolation(f"free: page {p} appears twice")
            seen.add(p)
            self._live_page(p, "free (double free or never allocated)")
        return pages

    def _forget(self, pages: list[int]) -> None:
        """Written stamps of freed pages no longer count (invariant 7)."""
        gone, ps = set(pages), self.config.page_size
        self.written = {t: s for t, s in self.written.items() if t // ps not in gone}

    def free(self, tokens) -> None:
        pages = self._pages_freed(tokens)
        if not pages:
            return
        if self.config.lazy and self.reader_in_flight():
            for p in pages:
                if p in self.in_flight.pages:
                    raise ContractViolation(
                        f"free: page {p} is written by the in-flight forward (event {self.in_flight.event.id}), "
                        "which has not fired: a lazy pool cannot free it until the forward completes")
        phys = kernels.free_unbind(self.v2p, self.p2v, pages)
        sort_ids = "eager_free_ids_sorted" in self.rules and not self.config.lazy and self.config.page_size == 1
        self.free_virtual.extend(sorted(pages) if sort_ids else pages)
        self.live_pages -= len(pages)
        self._forget(pages)
        if self.config.lazy:
            self.holes.extend(phys)
        else:
            self._compact_eager(phys)

    def _compact_eager(self, freed: list[int]) -> None:
        k = len(freed)
        if self.up:
            new_wm = self.watermark - k
            vacated = range(new_wm, self.watermark)
            kept_freed = sorted(p for p in freed if p < new_wm)
        else:
            new_wm = self.watermark + k
            vacated = range(self.watermark + 1, new_wm + 1)
            kept_freed = sorted(p for p in freed if p > new_wm)
        survivors = [p for p in vacated if self.p2v[p] != -1]
        assert len(survivors) == len(kept_freed), "eager compaction: band sizes disagree"
        for src, dst in zip(survivors, kept_freed):
            self._move(src, dst)
        for p in vacated:
            self.p2v[p] = -1
        self.watermark = new_wm

    def _move(self, src: int, dst: int) -> None:
        ps = self.config.page_size
        self.kv[dst * ps:(dst + 1) * ps] = self.kv[src * ps:(src + 1) * ps]
        v = self.p2v[src]
        self.v2p[v] = dst
        self.p2v[dst] = v
        self.p2v[src] = -1

    # ---- flush ----------------------------------------------------------------
    def flush(self, urgent: bool = False) -> None:
        self.walk_stop = None
        settles_late = "urgent_settles_when_moving" in self.rules
        gated = self.gate_open is not None and not self.gate_open()
        if urgent and not settles_late and not gated:
            self.fire()
        if not self.config.lazy:
            return
        still = []
        for event, pages in self.pending:
            if urgent and settles_late and not gated:  # behind a closed gate nothing waits (§6)
                event.fired = True
            if event.fired:
                self.holes.extend(pages)
            else:
                still.append((event, pages))
        self.pending = still
        if gated:
            return  # a closed move gate: no page moves, no absorb; fired sources rejoin the holes (§6)
        self.holes.sort()
        self._absorb()
        if urgent and settles_late and self.holes:
            self.fire()
        released = self._walk(urgent)
        if released is not None:
            self.holes.extend(released)
        else:
            self._absorb()

    def _absorb(self) -> None:
        if self.up:
            while self.holes and self.holes[-1] == self.watermark - 1:
                self.holes.pop()
                self.watermark -= 1
        else:
            while self.holes and self.holes[0] == self.watermark + 1:
                self.holes.pop(0)
                self.watermark += 1

    def _source(self) -> int | None:
        span = self.span()
        for p in (reversed(span) if self.up else span):
            if self.p2v[p] != -1:
                return p
        return None

    def _walk(self, urgent: bool) -> list[int] | None:
        """The walk; the sources it freed when they join ``holes`` after it (rule
        ``walk_release_appended``, not urgent), else None (they joined in sorted place). Why it
        stopped is kept in ``walk_stop`` (the move cap names the next move it barred: free or pinned)."""
        moves = 0
        batch: list[int] = []
        appended = [] if "walk_release_appended" in self.rules and not urgent else None
        cap = max(1, self.config.max_moves) if "move_cap_floor_1" in self.rules else self.config.max_moves
        self.walk_stop = "no holes"
        while self.holes:
            dst = self.holes[0] if self.up else self.holes[-1]
            src = self._source()
            if src is None or (src <= dst if self.up else src >= dst):
                self.walk_stop = "frontier met"
                break
            pinned = self.reader_in_flight() and self.p2v[src] in self.in_flight.pages
            if not urgent and moves >= cap:
                self.walk_stop = "move limit at a pinned page" if pinned else "move limit"
                break
            if pinned:
                self.walk_stop = "pinned page"
                break
            self._move(src, dst)
            self.holes.remove(dst)
            if self.reader_in_flight():
                batch.append(src)
            elif appended is not None:
                appended.append(src)
            else:
                insort(self.holes, src)
            moves += 1
        if batch:
            self.pending.append((self.in_flight.event, batch))
        return appended

    # ---- forward / data -------------------------------------------------------
    def forward(self, tokens) -> None:
        tokens = _as_int_list(tokens, "forward tokens")
        self._check_live_tokens(tokens, "forward")
        self.fire()
        event = Event(self._events)
        self._events += 1
        self.in_flight = InFlight(event, frozenset(t // self.config.page_size for t in tokens))

    def fire(self) -> None:
        if self.in_flight is not None:
            self.in_flight.event.fired = True

    def write(self, tokens, stamps) -> None:
        tokens = _as_int_list(tokens, "write tokens")
        stamps = _as_int_list(stamps, "write stamps")
        if len(tokens) != len(stamps):
            raise ContractViolation(f"write: {len(tokens)} tokens but {len(stamps)} stamps")
        if len(set(tokens)) != len(tokens):
            raise ContractViolation("write: a token appears twice (lanes would race on one slot)")
        for s in stamps:
            if not INT64_MIN <= s <= INT64_MAX:
                raise ContractViolation(f"write: stamp {s} does not fit int64")
        self._check_live_tokens(tokens, "write")
        for t, s in zip(tokens, stamps):
            self.kv[self._slot(t)] = s
            self.written[t] = s

    def read(self, tokens) -> list[int]:
        tokens = _as_int_list(tokens, "read tokens")
        self._check_live_tokens(tokens, "read")
        return [self.kv[self._slot(t)] for t in tokens]

    # ---- kernel-level views over this pool's v2p --------------------------------
    def read_table(self, **kwargs) -> list[list[int]]:
        c = self.config
        return kernels.read_table(v2p=self.v2p, multiplier=c.multiplier, page_size=c.page_size, **kwargs)

    def read_table_packed(self, **kwargs) -> list[int]:
        c = self.config
        return kernels.read_table_packed(v2p=self.v2p, multiplier=c.multiplier, page_size=c.page_size, **kwargs)

    def translate(self, loc) -> list[int]:
        return kernels.translate(self.v2p, _as_int_list(loc, "translate loc"), self.config.page_size)

    # ---- state ----------------------------------------------------------------
    def snapshot(self) -> dict:
        """The whole state as plain data; DeviceAllocator.snapshot() has the same shape."""
        f = self.in_flight
        return {
            "v2p": list(self.v2p),
            "p2v": list(self.p2v),
            "free_virtual": list(self.free_virtual),
            "holes": list(self.holes),
            "pending": [[e.id, list(pages)] for e, pages in self.pending],
            "watermark": self.watermark,
            "live_pages": self.live_pages,
            "in_flight": None if f is None else {"id": f.event.id, "fired": f.event.fired, "pages": sorted(f.pages)},
            "kv": list(self.kv),
        }
