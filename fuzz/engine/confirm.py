"""From a finding to a case a user can trust: reproduced, rated, minimized, in its mode.

A worker's finding is written at once (a campaign killed a second later keeps it), then
confirmed here, in an executor child that never saw the worker's history:

1. **Reproduction rate.** The case is replayed ``tries`` times (``--reproduce``, default
   5; a hang once, since each try costs an op-timeout). The first try runs in a fresh
   process; the rest in that same child (fresh again after any fault). The case records
   ``reproduced: {k, n}`` and ``flaky: true`` when ``0 < k < n``: a race on a GPU looks
   exactly like a kernel that fails one call in three.
2. **History.** A finding that never reproduces from its own sequence may need what its
   worker's process did before it (a counter, a cache, a leak that breaks after N calls):
   it is replayed after every sequence that process ran since it started (rebuilt from
   their seeds, like a dead worker's ops), and if that reproduces, earlier sequences are
   dropped while it still does. The case keeps the history it needs (``history``), and
   replays with it. If even that does not reproduce, the case is kept as found and says so.
3. **Minimization**, with the one minimizer: the same signature, the same hostile class,
   and for a flaky case "fails at least once in ``tries`` runs". The minimized case is rated
   again (a sequence with fewer calls of a racy kernel fails less often), and when it never
   fails on its own, the case stays as it was.

Every replay runs in the case's mode (hostile, check_every, program order).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .case import Case
from .minimize import Minimizer, NotReproducible, hostile_kind
from .supervise import Executor

DEFAULT_TRIES = 5


@dataclass
class Confirmed:
    case: Case
    problems: list[str] = field(default_factory=list)  # harness errors met on the way


class Confirmer:
    """Runs the three steps for one case in its own executor (one thread per case)."""

    def __init__(self, executor: Executor, *, tries: int = DEFAULT_TRIES, deadline: float | None = None,
                 minimize: bool = True, rate_deadline: float | None = None):
        self.executor = executor
        self.tries = max(1, tries)
        self.deadline = deadline  # for minimizing
        self.rate_deadline = rate_deadline if rate_deadline is not None else deadline  # for the rate and history
        self.others: dict[str, int] = {}  # signatures replays failed with instead of the case's -> first step
        self.minimize = minimize

    def _late(self, rating: bool = False) -> bool:
        deadline = self.rate_deadline if rating else self.deadline
        return deadline is not None and time.monotonic() >= deadline

    def _judge(self, case: Case, history: list | None):
        def judge(config, ops, fresh=False):
            end = max(d for d in (self.deadline, self.rate_deadline, 0.0) if d is not None)
            return self.executor.run(config, ops, case.knobs, case.run_mode, deadline=end + 5 if end else None,
                                     history=history, fresh=fresh)
        return judge

    def tries_for(self, case: Case) -> int:
        """A hang costs an op-timeout per try, a process death a fresh child: fewer of those."""
        if case.signature.oracle == "timeout":
            return 1
        if case.fault is not None:
            return min(self.tries, 3)
        return self.tries

    def rate(self, case: Case, history: list | None = None, tries: int | None = None,
             floor: int = 3) -> tuple[int, int]:
        """(failures alike, runs) over up to ``tries`` replays: at least ``floor`` of them, the
        rest while the deadline allows (the first in a fresh process)."""
        judge, want = self._judge(case, history), hostile_kind(case)
        k = n = 0
        for i in range(tries or self.tries):
            if i >= floor and self._late(rating=True):
                break
            n += 1
            f = judge(case.config, case.ops, fresh=i == 0)
            if f is not None and f.signature == case.signature and (want is None or hostile_kind(f) == want):
                k += 1
            elif f is not None:  # it failed, as something else: said in the case, never counted
                self.others.setdefault(str(f.signature), f.step)
        return k, n

    def _otherwise(self) -> str:
        """What the replays that did not reproduce the case failed as instead (a trigger that
        fires earlier in a fresh process: a time, a count), for the case's note."""
        if not self.others:
            return ""
        return "; replayed, it failed as " + ", ".join(f"{sig} at step {step}" for sig, step in self.others.items()) + (
            " instead")

    def confirm(self, case: Case, history=None, publish=None) -> Case:
        """``history``: a thunk giving the worker's earlier sequences (or None); ``publish``:
        called with the case after each step that improved it (the rate, a shorter history, a
        smaller case), so a campaign that ends mid-way keeps what was learnt."""
        publish = publish or (lambda c: None)
        tries = self.tries_for(case)
        k, n = self.rate(case, tries=tries)
        needs = None
        history = history() if callable(history) and k == 0 else history
        if k == 0 and history:
            k, n = self.rate(case, history, tries=1, floor=1)
            if k:
                def needing(hist):
                    return {"sequences": hist, "reproduced": True,
                            "note": f"fails only after what its worker's process ran before it "
                                    f"({len(hist)} earlier sequences, replayed first)"}

                publish(case.with_fields(reproduced={"k": k, "n": n}, flaky=False, history=needing(history)))
                history = self.shorter_history(case, history)
                needs = needing(history)
                k2, n2 = self.rate(case.with_fields(history=needs), history, tries=tries, floor=1)
                k, n = (k2, n2) if k2 else (k, n)
            else:
                needs = {"sequences": [], "reproduced": False,
                         "note": f"did not reproduce in a fresh process, not even after its worker's "
                                 f"{len(history)} earlier sequences: kept as found{self._otherwise()}"}
        elif k == 0:
            needs = {"sequences": [], "reproduced": False,
                     "note": f"did not reproduce in a fresh process: kept as found{self._otherwise()}"}
        case = case.with_fields(reproduced={"k": k, "n": n}, flaky=0 < k < n, **({"history": needs} if needs else {}))
        publish(case)
        if k == 0 or not self.minimize or self._late():
            return case
        smaller = self.minimized(case)
        if smaller is case:
            return case
        # A shorter sequence fails less often when the bug is a race per call: rate it again,
        # and keep the longer one if the shorter never fails on its own.
        k2, n2 = self.rate(smaller, (smaller.history or {}).get("sequences") or None, tries=tries,
                           floor=min(3, tries))
        if k2 == 0 or k2 / n2 < k / n / 2:  # a shorter case that fails far less often is a worse case
            return case
        return smaller.with_fields(reproduced={"k": k2, "n": n2}, flaky=0 < k2 < n2)

    def shorter_history(self, case: Case, history: list) -> list:
        """Drop earlier sequences (the oldest first, then halves) while the case still fails after the rest."""
        want = hostile_kind(case)

        def fails(hist):
            f = self._judge(case, hist)(case.config, case.ops, fresh=True)
            return f is not None and f.signature == case.signature and (want is None or hostile_kind(f) == want)

        kept = list(history)
        n = 2
        while kept and not self._late(rating=True):
            chunk = -(-len(kept) // n)
            for i in range(0, len(kept), chunk):
                if self._late(rating=True):
                    return kept
                cand = kept[:i] + kept[i + chunk:]
                if fails(cand):
                    kept, n = cand, max(2, n - 1)
                    break
            else:
                if chunk == 1:
                    break
                n = min(len(kept), 2 * n)
        return kept

    def minimized(self, case: Case) -> Case:
        history = (case.history or {}).get("sequences") or None
        judge = self._judge(case, history)
        flaky = bool(case.flaky)
        m = Minimizer(None, case.signature, deadline=self.deadline, judge=lambda c, o: judge(c, o),
                      hostile=hostile_kind(case), tries=self.tries if flaky else 1)
        try:
            config, ops, failure = m.run(case.config, case.ops)
        except NotReproducible:
            return case
        return case.with_minimized(config, ops, failure, passes=m.report())
