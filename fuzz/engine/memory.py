"""Red zones: the memory oracle's buffers, owned by the harness, not by the code it judges.

The interpreter has no bounds checks, and a compiled kernel's stray access lands in
whatever memory follows its buffer, so every buffer a kernel reads or writes (the page
tables, the token data, and each input of an op: ids, ``req_to_token``, ``seq_lens``,
``indptr``, ...) sits between guard elements holding a canary; after each op the guards
are compared with their canaries and a changed one is a ``memory`` finding naming the
buffer. ``DeviceAllocator`` takes its tables from a factory (``RedZones``), so the
allocator under test never decides what its red zones look like.

The canary of a buffer is chosen by what its values index, so that a kernel that reads
one can neither hide it nor turn it into a wild access:
- read as a value it is larger than any valid one (``rows + guard // 2`` for a page
  table of ``rows`` rows): a gather from a red zone (``v2p[-1]``, say) shows up as a
  wrong entry instead of a value that ``max(., 0)`` clamps away;
- used as an index into the table it points at, it lands in that table's back red zone,
  ``guard // 2`` rows past the end: a gather-then-scatter (``p2v[v2p[v]]`` for a ``v``
  past the table) is a reported store into a canary, not a write far outside every
  buffer (a fixed large canary like 0x0BADC0DE did exactly that). Token buffers scale it
  by the page size, since a token indexes a page table through ``t // page_size``.
"""

from __future__ import annotations

import math

from . import lazy

torch = lazy.Torch(globals())  # imported where first used: lazy.py says why

MIN_GUARD = 4  # rows; a canary must land strictly inside the back zone: rows + guard // 2 < rows + guard


def index_canary(rows: int, guard: int, scale: int = 1) -> int:
    """The canary of a buffer whose values index a table of ``rows`` rows guarded by
    ``guard`` rows on each side (times ``scale`` for token ids of pages of that size)."""
    return (rows + guard // 2) * scale


class Guarded:
    """One buffer: ``view`` (of ``shape``) between ``zone`` canary elements on each side."""

    def __init__(self, shape: tuple[int, ...], dtype, device, zone: int, canary: int, fill: int | None = None):
        n = math.prod(shape)
        self.zone, self.canary = zone, canary
        self.buf = torch.full((n + 2 * zone,), canary, dtype=dtype, device=device)
        self.view = self.buf[zone:zone + n].view(shape)
        if fill is not None:
            self.view.fill_(fill)
        self.ends = (self.buf[:zone], self.buf[n + zone:])
        self.expect = torch.full((2 * zone,), canary, dtype=torch.int64, device=device)

    def zones(self) -> torch.Tensor:
        """Both guard zones as one int64 tensor (compare with ``expect``)."""
        return torch.cat([z.long() for z in self.ends])

    def damaged(self) -> torch.Tensor:
        """0-dim bool on the device: a guard element changed (no host read)."""
        return self.zones().ne(self.expect).any()


class RedZones:
    """A factory of guarded buffers on one device, each remembered by name.

    ``zones(name, rows, fill, row_len=1)`` returns a view of ``rows * row_len`` int64
    elements holding ``fill``, inside a buffer with ``guard * row_len`` canary elements on
    each side (the canary: ``index_canary(rows, guard, row_len)``). ``guarded(name,
    values, canary)`` does the same for an op's input. ``damage()`` names every buffer
    whose canary changed (one read of the device for all of them)."""

    def __init__(self, guard: int, device):
        self.guard = max(guard, MIN_GUARD)
        self.device = torch.device(device)
        self.buffers: dict[str, Guarded] = {}

    def __call__(self, name: str, rows: int, fill: int, row_len: int = 1) -> torch.Tensor:
        g = Guarded((rows * row_len,), torch.int64, self.device, self.guard * row_len,
                    index_canary(rows, self.guard, row_len), fill)
        self.buffers[name] = g
        return g.view

    def guarded(self, name: str, values: torch.Tensor, canary: int, zone: int | None = None) -> torch.Tensor:
        """A copy of ``values`` (any shape, its dtype) between ``zone`` canary elements (rows
        of its last dimension for a 2-D tensor) on each side."""
        rows = self.guard if zone is None else zone
        g = Guarded(tuple(values.shape), values.dtype, self.device,
                    rows * (values.shape[1] if values.dim() == 2 else 1), canary)
        g.view.copy_(values, non_blocking=values.is_pinned())
        self.buffers[name] = g
        return g.view

    def rename(self, old: str, new: str) -> None:
        self.buffers[new] = self.buffers.pop(old)

    def forget(self, name: str) -> None:
        del self.buffers[name]

    def damage(self) -> list[str]:
        return self.damage_later().result()

    def _intact(self):
        """(the guarded buffers, a 0-dim bool on the device: every guard zone holds its canary)."""
        named = [(name, g) for name, g in self.buffers.items() if g.zone]
        if not named:
            return named, None
        got = torch.cat([end for _, g in named for end in g.ends])  # one launch for every guard zone
        return named, (got == torch.cat([g.expect for _, g in named])).all()

    def damage_later(self) -> PendingDamage:
        """``damage()``, read when asked (``result``): on a GPU the flag is copied to pinned host
        memory without waiting, so the next read of the device (the state's snapshot) carries
        it, and each op syncs once where it synced twice."""
        named, intact = self._intact()
        return PendingDamage(named, intact)

    def damage_and(self, *tensors: torch.Tensor) -> tuple[list[str], list[list[int]]]:
        """``damage()`` and the values of ``tensors`` (int64-able), in one read of the device."""
        named, intact = self._intact()
        parts = [t.reshape(-1).to(torch.int64) for t in tensors]
        head = [] if intact is None else [intact.to(torch.int64).reshape(1)]
        flat = torch.cat(head + parts).tolist()
        at, values = len(head), []
        for t in parts:
            values.append(flat[at:at + t.numel()])
            at += t.numel()
        damaged = [] if intact is None or flat[0] else [name for name, g in named if bool(g.damaged())]
        return damaged, values


class PendingDamage:
    """A red-zone check whose one flag is on its way to the host (``RedZones.damage_later``)."""

    def __init__(self, named, intact):
        self.named, self.event = named, None
        if intact is None:
            self.flag = None
        elif intact.device.type == "cuda":
            self.flag = torch.empty((), dtype=torch.bool, pin_memory=True)
            self.flag.copy_(intact, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.flag = intact

    def result(self) -> list[str]:
        """The damaged buffers' names (none: the common case, no further read)."""
        if self.flag is None:
            return []
        if self.event is not None:
            self.event.synchronize()  # done already when a read of the device came after it
        if bool(self.flag):
            return []
        return [name for name, g in self.named if bool(g.damaged())]


class RawTables:
    """v2p/p2v for kernel-level ops, between red zones, with only the sentinels set."""

    def __init__(self, rows: int, guard: int, device):
        self.rows = rows
        self.zones = RedZones(guard, device)
        self.v2p = self.zones("v2p", rows, -1)
        self.p2v = self.zones("p2v", rows, -1)
        self.v2p[:1].fill_(0)
        self.p2v[:1].fill_(0)

    @property
    def guard(self) -> int:
        return self.zones.guard

    @classmethod
    def copy_of(cls, v2p: torch.Tensor, p2v: torch.Tensor, guard: int) -> RawTables:
        """Guarded copies of two tables (for a probe that may write anywhere)."""
        twin = cls(v2p.numel(), guard, v2p.device)
        twin.v2p.copy_(v2p)
        twin.p2v.copy_(p2v)
        return twin

    def damage(self) -> list[str]:
        return self.zones.damage()
