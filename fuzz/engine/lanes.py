"""Fresh children side by side: a batch of replays, each on an executor of its own, at once.

Shrinking a case whose every candidate must run in a process that ran nothing else of the
kernel set (a crash, a hang, a case with history) is a chain of child set-ups (on a GPU a CUDA
context and kernel loads: seconds each) and, for a hang, of op-timeouts. ``Lanes`` is the
confirmer's executor and ``width - 1`` siblings of it (each a ``supervise.Executor`` like it,
keeping a fresh child started ahead), so a batch of ``width`` candidates runs in ``width``
fresh children at once: no second kind of process pool, and every rule of a fresh child holds
(each job ``fresh=True``). What a batch holds, and that the answer is the one a single
executor gives, is the minimizer's (``minimize.Minimizer.upcoming``) and ``first``'s: both
adopt the first candidate in the sequential order, whatever the others answered.
"""

from __future__ import annotations

import os
import threading
from typing import Callable

# A fresh child per candidate is a core's work while it sets up (and a CUDA context on a GPU):
# half the cores, and no more than this many at once (a campaign's cases, confirmed side by side,
# share them: ``LanePool``).
SHRINK_JOBS_CAP = 4


def default_width(cpus: int | None = None) -> int:
    """``--shrink-jobs``'s default: half the cores, 1 to ``SHRINK_JOBS_CAP`` (1 on two cores: a
    second child there takes its core from the first; ``benchmarks/results/shrink-width-interpret/``)."""
    cpus = cpus or os.cpu_count() or 1
    return max(1, min(SHRINK_JOBS_CAP, cpus // 2 if cpus > 2 else 1))


def side_by_side(calls: list[Callable[[], object]]) -> list:
    """Each call's answer, in order, the first run in this thread and the others each in one of
    its own, all at once; a call that raised answers with its exception (a candidate's caller
    raises it only if the sequential order reaches that candidate)."""
    answers: list = [None] * len(calls)

    def one(i: int) -> None:
        try:
            answers[i] = calls[i]()
        except BaseException as exc:  # noqa: BLE001 - handed back as this call's answer
            answers[i] = exc

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(1, len(calls))]
    for t in threads:
        t.start()
    try:
        one(0)
    finally:
        for t in threads:
            t.join()
    return answers


class LanePool:
    """The siblings a campaign's confirmations may hold at once, in all: a campaign that finds ten
    faults at once confirms ten cases side by side, and ``--shrink-jobs`` lanes for each would be
    ten times the fresh children (each a CUDA context, twice that many with the ones started ahead)
    on a GPU other workers share. Each case keeps its own executor; the siblings beyond it come
    from here, first come first served, and go back when its search ends (``Lanes.close``)."""

    def __init__(self, siblings: int):
        self.free = max(0, siblings)
        self._lock = threading.Lock()

    def take(self, want: int) -> int:
        with self._lock:
            got = min(max(0, want), self.free)
            self.free -= got
            return got

    def give(self, n: int) -> None:
        with self._lock:
            self.free += n


class Lanes:
    """The confirmer's ``executor`` and up to ``width - 1`` siblings (``sibling()`` makes one;
    without it, one lane), started when first needed and stopped by ``close``. With a ``pool``
    the siblings are those it grants when a search begins (``reserve``), kept until ``close``: a
    search's width is fixed from its first batch to its end, and the answer is the same at any."""

    def __init__(self, executor, width: int = 1, sibling: Callable | None = None, pool: LanePool | None = None):
        self.executor = executor
        self.wanted = max(1, width) if sibling is not None else 1
        self.sibling = sibling
        self.pool = pool
        self._granted: int | None = None  # the siblings the pool granted this search (None: none asked yet)
        self.open_siblings: list = []
        self.siblings: list = []  # every sibling ever started: their children and jobs are the confirmation's work

    @property
    def width(self) -> int:
        """Lanes at once: 1 + the siblings the pool granted this search, or as many as wanted."""
        return self.wanted if self._granted is None else 1 + self._granted

    def reserve(self) -> int:
        """The width of the search beginning now: with a pool, 1 + the siblings it grants (asked
        once per search, until ``close``)."""
        if self.pool is not None and self._granted is None:
            self._granted = self.pool.take(self.wanted - 1)
        return self.width

    def open(self) -> None:
        """Start the siblings (each child set up now, idle until its first job, one more started
        ahead of the next): a batch's first candidates then wait for no set-up."""
        self.reserve()
        while 1 + len(self.open_siblings) < self.width:
            executor = self.sibling()
            executor.prestart()
            executor.standby()
            self.open_siblings.append(executor)
            self.siblings.append(executor)

    @property
    def executors(self) -> list:
        return [self.executor, *self.open_siblings]

    def batch(self, judge_on: Callable) -> Callable[[list], list]:
        """A minimizer's ``batch``: ``judge_on(executor)`` is a judge ``(config, ops)`` of that
        executor; candidate ``i`` of a batch runs on lane ``i``."""
        def run(cands: list) -> list:
            self.open()
            return side_by_side([lambda e=e, c=c: judge_on(e)(*c) for e, c in zip(self.executors, cands)])
        return run

    def first(self, tests: list[Callable], late: Callable[[], bool] = lambda: False) -> tuple[int | None, int]:
        """(the index of the first of ``tests`` that holds, each ``test(executor)`` run on a lane
        of its own, a batch of ``width`` at once; how many of them the order reached). A test
        after the first that holds counts for nothing, its exception included; ``late()``
        before a batch ends the search (None)."""
        self.reserve()
        for start in range(0, len(tests), self.width):
            if late():
                return None, start
            if self.width > 1:
                self.open()
            chunk = tests[start:start + self.width]
            answers = side_by_side([lambda e=e, t=t: t(e) for e, t in zip(self.executors, chunk)])
            for i, answer in enumerate(answers):
                if isinstance(answer, BaseException):
                    raise answer
                if answer:
                    return start + i, start + i + 1
        return None, len(tests)

    def close(self) -> None:
        """Stop the siblings and their children (the confirmer's own executor stays); the pool's
        grant goes back."""
        open_siblings, self.open_siblings = self.open_siblings, []
        for executor in open_siblings:
            executor.close()
        if self._granted is not None:
            self.pool.give(self._granted)
            self._granted = None
