"""The small track's kernel-level ops: bind, alloc_bind and free_unbind on a second pair of
raw tables of the pool's size, straight through the kernel set, no allocator (``ops`` has
the pool ops and the read tables, and re-exports these)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Iterator

import kvref

from .oplang import Ints, Op


class KernelOp(Op):
    """A kernel-level op on raw tables: ``spec`` on the spec's lists, ``target`` through
    the kernel set on the target's tables (``runner.TargetSide`` over raw tables). Every
    kind has a field ``v`` (the virtual pages it names). A refused kernel-level op is
    probed by running it unchecked on guarded copies of the tables."""

    def spec(self, v2p: list[int], p2v: list[int]):
        raise NotImplementedError

    def target(self, t):
        raise NotImplementedError

    calls_kernels: ClassVar[bool] = True

    def hostile_class(self, raw: dict, tier) -> str | None:
        return None

    def probe(self, t):
        return self.target(t)

    def page_ids(self):
        return iter(self.v)

    def _subsets(self) -> Iterator[tuple[int, ...]]:
        n = len(self.v)
        if n > 1:
            yield from (tuple(range(0, n // 2)), tuple(range(n // 2, n)), *((b,) for b in range(n)))


# ---- kernel-level ops on raw tables ------------------------------------------------------


@dataclass(frozen=True)
class KBind(KernelOp):
    kind = "k_bind"
    v: Ints
    p: Ints

    def page_ids(self):
        return iter(self.v + self.p)

    def spec(self, v2p, p2v):
        return kvref.kernels.bind(v2p, p2v, self.v, self.p)

    def target(self, t):
        return t.kernels.bind_inplace(t.pages("v", self.v), t.pages("p", self.p), t.v2p, t.p2v)

    def bound(self) -> list[tuple[int, int]]:
        return list(zip(self.v, self.p))

    def shrink(self):
        for keep in self._subsets():
            yield KBind(tuple(self.v[j] for j in keep), tuple(self.p[j] for j in keep))


@dataclass(frozen=True)
class KAllocBind(KernelOp):
    kind = "k_alloc_bind"
    v: Ints
    start: int

    def page_ids(self):
        return iter(self.v + (self.start, self.start + len(self.v)))

    def spec(self, v2p, p2v):
        return kvref.kernels.alloc_bind(v2p, p2v, self.v, self.start)

    def target(self, t):
        return t.kernels.alloc_bind_inplace(t.pages("v", self.v), t.v2p, t.p2v, self.start).tolist()

    def bound(self) -> list[tuple[int, int]]:
        return [(v, self.start + i) for i, v in enumerate(self.v)]

    def shrink(self):
        for keep in self._subsets():
            yield KAllocBind(tuple(self.v[j] for j in keep), self.start)


@dataclass(frozen=True)
class KFreeUnbind(KernelOp):
    kind = "k_free_unbind"
    v: Ints

    def spec(self, v2p, p2v):
        return kvref.kernels.free_unbind(v2p, p2v, self.v)

    def target(self, t):
        return t.kernels.free_unbind_inplace(t.pages("v", self.v), t.v2p, t.p2v).tolist()

    def hostile_class(self, raw, tier):
        return "free_unbind"  # SPEC §2: never write outside the tables, whatever the input

    def bound(self) -> list[tuple[int, int]]:
        return []

    def shrink(self):
        for keep in self._subsets():
            yield KFreeUnbind(tuple(self.v[j] for j in keep))
