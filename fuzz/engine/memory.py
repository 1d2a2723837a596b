"""Red zones: the memory oracle's buffers, owned by the harness, not by the code it judges.

The interpreter has no bounds checks and a compiled kernel's stray store lands in
whatever memory follows its table, so every table the target writes sits between
guard rows holding a canary; after each op the guard rows are compared with the canary
and a changed one is a ``memory`` finding naming the buffer. ``DeviceAllocator`` takes
its buffers from a factory (``RedZones``), so the allocator under test never decides
what its red zones look like.
"""

from __future__ import annotations

import torch

# Positive and far from any id: a kernel that gathers from a red zone (v2p[-1], say)
# turns it into a visible wrong entry instead of a value that max(., 0) hides.
CANARY = 0x0BADC0DE


class RedZones:
    """A factory of guarded int64 buffers on one device, each remembered by name.

    ``zones(name, rows, fill, row_len=1)`` returns a view of ``rows * row_len`` elements
    holding ``fill``, inside a buffer with ``guard * row_len`` canary elements on each
    side. ``damage()`` names every buffer whose canary changed (it reads the device)."""

    def __init__(self, guard: int, device):
        self.guard = guard
        self.device = torch.device(device)
        self.buffers: dict[str, tuple[torch.Tensor, int]] = {}

    def __call__(self, name: str, rows: int, fill: int, row_len: int = 1) -> torch.Tensor:
        zone = self.guard * row_len
        buf = torch.full((rows * row_len + 2 * zone,), CANARY, dtype=torch.int64, device=self.device)
        view = buf[zone:zone + rows * row_len]
        view.fill_(fill)
        self.buffers[name] = (buf, zone)
        return view

    def damage(self) -> list[str]:
        return [name for name, (buf, zone) in self.buffers.items() if not canary_intact(buf, zone)]


def canary_intact(buf: torch.Tensor, zone: int) -> bool:
    """Whether both ends of ``buf`` still hold the canary over ``zone`` elements."""
    if not zone:
        return True
    ends = torch.cat((buf[:zone], buf[buf.numel() - zone:]))
    return bool((ends == CANARY).all())


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

    def clone(self, guard: int) -> RawTables:
        twin = RawTables(self.rows, guard, self.zones.device)
        twin.v2p.copy_(self.v2p)
        twin.p2v.copy_(self.p2v)
        return twin

    def damage(self) -> list[str]:
        return self.zones.damage()
