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
# half the cores, and no more than this many at once per case (a campaign confirms its cases side
# by side, each with its own lanes).
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


class Lanes:
    """The confirmer's ``executor`` and up to ``width - 1`` siblings (``sibling()`` makes one;
    without it, one lane), started when first needed and stopped by ``close``."""

    def __init__(self, executor, width: int = 1, sibling: Callable | None = None):
        self.executor = executor
        self.width = max(1, width) if sibling is not None else 1
        self.sibling = sibling
        self.open_siblings: list = []
        self.siblings: list = []  # every sibling ever started: their children and jobs are the confirmation's work

    def open(self) -> None:
        """Start the siblings (each child set up now, idle until its first job, one more started
        ahead of the next): a batch's first candidates then wait for no set-up."""
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
        """Stop the siblings and their children (the confirmer's own executor stays)."""
        open_siblings, self.open_siblings = self.open_siblings, []
        for executor in open_siblings:
            executor.close()
