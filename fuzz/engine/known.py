"""Known reads: a read the target already ran and passed, from the same history, is not run again.

The guided track replays each mutated plan's prefix, and a repeated read table leaves the state
where it was, so the same read from the same state comes again and again; ``runner.PoolRun``
asks ``KnownReads`` before it runs a pure op (benchmarks/results/guided-vs-blind/known-reads.md).
"""

from __future__ import annotations

import contextlib
import hashlib

from .features import Collector

KNOWN_MAX = 1 << 12  # ``KnownReads``: reads kept (then it starts again; each holds its launches' features, a few KB)


class KnownReads:
    """The pure ops (``Op.pure``: reads, read tables) that ran on the target and passed every
    check, by the history of state-changing ops before them (a hash chain from the run's
    config, knobs and hostile mode) and the op, with what their launches reached: a mutated
    plan replays its entry's ops up to its first edit, and a repeated read table leaves the
    state where it was, so the same read from the same state comes again and again (a quarter
    of a guided run's CPU seconds, guided-vs-blind/known-reads.md). The target is a function
    of its history (a case replays from its ops alone), so ``runner.PoolRun`` does not run such
    a read again, and the features its launches reached are replayed into ``collector`` as at
    that op (``Collector.take``): a run's features, and so the corpus and every later plan, are
    those of running it. Only for one tier at a time, every op checked, the interpreter's
    program order and kvfuzz's own allocator. A run whose code is traced runs every read (its
    arcs come from its own calls: running only a read's host code, its launches recorded, left
    the line tracer's arcs around the launch other than a launch that ran leaves them) and
    records them for the next (``replaying`` off: ``GuidedTrack.run_sequence``)."""

    def __init__(self):
        self.memo: dict[tuple, tuple] = {}
        self.tier = None
        self.collector: Collector | None = None
        self.replaying = True

    def begin(self, tier, start: str) -> bytes:
        """The history of a run's first op (``start``: what it runs under)."""
        if tier is not self.tier or len(self.memo) >= KNOWN_MAX:
            self.memo.clear()
            self.tier = tier
        return hashlib.sha1(start.encode()).digest()

    @staticmethod
    def after(history: bytes, op) -> bytes:
        return hashlib.sha1(history + repr(op).encode()).digest()

    def replay(self, key: tuple) -> bool:
        """Whether ``key`` (history, op) is known; if so, its launches' features are taken again."""
        launches = self.memo.get(key) if self.replaying else None
        if launches is None:
            return False
        for programs, names, goals in launches:
            self.collector.take(programs, names, goals)
        return True

    @contextlib.contextmanager
    def recording(self, key: tuple):
        """Around the op's run: its launches logged, and known once it passed (no Divergence)."""
        col = self.collector
        col.log = []
        try:
            yield
            col.flush()  # a deferred collector's launches of this op: into the log
            self.memo[key] = tuple(col.log)
        finally:
            col.log = None
