"""Shrink a failing op sequence while its signature stays the same.

One class per strategy, tried in turn by ``Minimizer.run``:
- ``DropOps``: delta debugging over ops (Zeller's ddmin: drop chunks, halving the
  chunk size);
- ``ShrinkOps``: each op's own smaller variants (``Op.shrink``: fewer tokens, smaller
  allocs, fewer rows and narrower tables);
- ``MergeOps``: two neighbours as one (``Op.merge``: consecutive allocs hand out the
  same pages as one alloc of their sum), which ddmin alone cannot do;
- ``ShrinkConfig``: a simpler, then a smaller pool.
Every candidate is replayed from scratch, unless it was tried before: the cache of
tried candidates (``Minimizer.saved`` counts the replays it spared) matters because
the strategies revisit the same sequences. The search stops at the deadline and keeps
the best sequence found so far.

Who replays a candidate is the ``judge``: in this process by default (``local_judge``),
or a supervised child process (``supervise.Executor``) when a candidate may crash or
hang, so that a fault is one more answer ("this candidate dies with SIGSEGV") rather
than the end of the minimizer.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable

import kvref

from .case import Signature
from .ops import Op
from .tiers import Tier


class NotReproducible(Exception):
    """The sequence handed to the minimizer does not fail with its signature."""


def local_judge(tier: Tier, knobs: dict | None = None, **kw) -> Callable:
    """Replay candidates in this process (fine when nothing can crash it)."""
    def judge(config, ops):
        from .runner import replay

        return replay(config, ops, tier, knobs=knobs, **kw)[0]
    return judge


class Minimizer:
    """``judge(config, ops)`` returns the candidate's failure (anything with a
    ``signature``) or None; the default replays it here on ``tier``."""

    def __init__(self, tier: Tier | None, signature: Signature, deadline: float | None = None,
                 knobs: dict | None = None, judge: Callable | None = None):
        self.judge = judge or local_judge(tier, knobs)
        self.signature = signature
        self.deadline = deadline
        self.replays = 0
        self.saved = 0
        self._tried: dict[tuple, object] = {}

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def fails(self, config: kvref.PoolConfig, ops: list[Op]):
        """The failure if this candidate fails with the signature, else None."""
        key = (config, tuple(ops))
        if key in self._tried:
            self.saved += 1
            return self._tried[key]
        self.replays += 1
        d = self.judge(config, ops)
        verdict = d if d is not None and d.signature == self.signature else None
        self._tried[key] = verdict
        return verdict

    def run(self, config, ops: list[Op]):
        """(config, ops, failure): the smallest candidate found that still fails alike."""
        d = self.fails(config, ops)
        if d is None:
            raise NotReproducible(f"the sequence does not fail with {self.signature}; nothing to minimize")
        ops = DropOps(self).apply(config, ops)
        ops = ShrinkOps(self).apply(config, ops)
        ops = MergeOps(self).apply(config, ops)
        config = ShrinkConfig(self).apply(config, ops)
        ops = DropOps(self).apply(config, ops)
        return config, ops, self.fails(config, ops) or d


class _Strategy:
    def __init__(self, m: Minimizer):
        self.m = m


class DropOps(_Strategy):
    def apply(self, config, ops: list[Op]) -> list[Op]:
        m, n = self.m, 2
        while len(ops) >= 2 and not m.out_of_time():
            chunk = -(-len(ops) // n)
            parts = [ops[i:i + chunk] for i in range(0, len(ops), chunk)]
            reduced = False
            for i in range(len(parts)):
                complement = [op for j, p in enumerate(parts) if j != i for op in p]
                if m.fails(config, complement):
                    ops, n, reduced = complement, max(n - 1, 2), True
                    break
                if m.out_of_time():
                    return ops
            if not reduced:
                if n >= len(ops):
                    break
                n = min(len(ops), 2 * n)
        return ops


class ShrinkOps(_Strategy):
    def apply(self, config, ops: list[Op]) -> list[Op]:
        m, changed = self.m, True
        while changed and not m.out_of_time():
            changed = False
            for i in range(len(ops)):
                for variant in ops[i].shrink():
                    cand = ops[:i] + [variant] + ops[i + 1:]
                    if m.fails(config, cand):
                        ops, changed = cand, True
                        break
                    if m.out_of_time():
                        return ops
        return ops


class MergeOps(_Strategy):
    def apply(self, config, ops: list[Op]) -> list[Op]:
        m, i = self.m, 0
        while i + 1 < len(ops) and not m.out_of_time():
            merged = ops[i].merge(ops[i + 1])
            if merged is not None and m.fails(config, cand := ops[:i] + [merged] + ops[i + 2:]):
                ops = cand
            else:
                i += 1
        return ops


class ShrinkConfig(_Strategy):
    def apply(self, config: kvref.PoolConfig, ops: list[Op]) -> kvref.PoolConfig:
        m = self.m
        for change in ({"max_moves": 0}, {"multiplier": 1}, {"min_page": 1}):
            if m.out_of_time():
                break
            try:
                cand = replace(config, **change)
            except kvref.ContractViolation:
                continue
            if cand != config and m.fails(cand, ops):
                config = cand
        while config.num_pages > config.min_page + 1 and not m.out_of_time():
            try:
                cand = replace(config, num_pages=config.num_pages - max(1, (config.num_pages - config.min_page) // 4))
            except kvref.ContractViolation:
                break
            if not m.fails(cand, ops):
                break
            config = cand
        return config
