"""From a finding to a case a user can trust: reproduced, rated, minimized, in its mode.

A worker's finding is written at once (a campaign killed a second later keeps it), then
confirmed here, in an executor child that never saw the worker's history:

1. **Reproduction rate.** The case is replayed ``tries`` times (``--reproduce``, default
   5; a crash 3 times, a hang once, since each try costs an op-timeout), **each replay in a
   fresh process** (a child that has run nothing of the kernel set but the smoke test every
   process runs alike; the next one started ahead, and for the first rate of a case that
   kills no child, shared with a ``helper`` executor once it is up: ``_replays``). A
   reproduction in a reused process may be the executor's history (a counter, a cache, a
   leak that earlier replays fed), not the case's: it never counts. The case records
   ``reproduced: {k, n, fresh}`` and ``flaky: true`` when ``0 < k < n``: a race on a GPU
   looks exactly like a kernel that fails one call in three.
2. **History.** A finding that never reproduces from its own sequence may need what its
   worker's process did before it: it is replayed after every sequence that process ran
   since it started (rebuilt from their seeds, like a dead worker's ops), and if that
   reproduces, earlier sequences are dropped while it still does. The case keeps the history
   it needs (``history``), and replays with it. If even that does not reproduce, it is
   replayed ``RARE_TRIES`` times more on its own (a rare race; a hang or crash
   ``FAULT_RARE_TRIES``: a replay that passes costs no op-timeout), and only then kept as
   found, saying so.
3. **Minimization**, with the one minimizer: the same signature, the same hostile class,
   and for a flaky case "fails at least once in ``tries`` runs"; it starts from a failing
   replay of the rate. A fault case (a crash, a hang) is shrunk **before** it is rated: one
   fresh replay says it reproduces, then each candidate runs in a fresh child (a case with
   history too), up to ``MINIMIZE_CAP`` candidates (work, not time), and the rate is the
   minimized case's. The result is checked without each single op (and history sequence):
   ``minimal: {one_minimal, candidates, fresh}``, and a note naming ``kvfuzz minimize`` when
   the cap or the campaign's deadline stopped it first. Such candidates run ``shrink_jobs`` at
   once (``lanes``), the first in the sequential order adopted and only those that order
   reached counted: the same case and cap at any width. Any other minimized case is rated
   again (a sequence with fewer calls of a racy kernel fails less often), and when it fails
   far less often on its own, the case stays as it was.
4. **The set.** Once a campaign's confirmations are over, if any case showed its kernel set
   failing other than deterministically from the case's own ops (``nondeterminism``), every
   case of the campaign says so (``nondeterministic``), and its replay takes the tries a rate
   needs (``Case.replay_tries``).

Every replay runs in the case's mode (hostile, check_every, program order).

A replay that could not run (``supervise.NotRun``: a far op with no memory for it while a
campaign holds the GPU, a history that faulted the device, a device error before its first
op) is neither a reproduction nor a pass: it is tried again after a wait (``UNKNOWN_RETRIES``)
and then counted apart, as ``reproduced: {k, n, unknown}`` (``n`` the replays that ran), and
the case's note says why. A minimizer's candidate that could not run is one that does not
fail (the smaller case is kept only if it is seen to fail).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

from .case import Case
from .lanes import Lanes, side_by_side
from .minimize import Minimizer, NotReproducible, hostile_kind
from .supervise import Executor, NotRun
from .verdict import never_again

DEFAULT_TRIES = 5
# A finding none of whose first replays reproduced (nor its worker's history) is replayed this
# many times more before it is kept as found: it was seen, so it is real, and a race that fails
# one replay in three passes 5 replays 13 % of the time but 20 only 0.03 % (one in five: 1 %).
RARE_TRIES = 15
# A hang or a crash none of whose first replays reproduced (nor its worker's history) is replayed
# this many times more, each in a fresh child: a replay that passes neither hangs nor dies, so it
# costs what the case's ops cost, and a transient stall (a loaded host) is told from a rare hang.
FAULT_RARE_TRIES = 4
UNKNOWN_RETRIES = 2  # a replay that could not run is run again this often, each after a wait, before it is unknown
UNKNOWN_WAIT_S = 2.0  # (a far op waits for memory in the child too: far.ROOM_WAIT_S)


@dataclass
class Rate:
    """A reproduction rate: ``k`` failures alike in ``n`` replays that ran, and ``unknown``
    replays that could not run (``why``: their reasons, each once)."""

    k: int = 0
    n: int = 0
    unknown: int = 0
    why: list[str] = field(default_factory=list)
    failure: object = None  # the last replay that reproduced it (the minimizer need not replay it again)

    def then(self, more: Rate) -> Rate:
        """This rate with ``more`` replays after it."""
        return Rate(k=self.k + more.k, n=self.n + more.n, unknown=self.unknown + more.unknown,
                    why=self.why + [w for w in more.why if w not in self.why], failure=more.failure or self.failure)

    def to_json(self) -> dict:
        """``reproduced`` as a case writes it: ``{k, n, fresh}`` (``fresh``: how many of the
        ``n`` ran each in a fresh process; every one does), with ``unknown`` and a ``note`` when
        some replays could not run (a reader of an older case finds ``{k, n}`` alone)."""
        if not self.unknown:
            return {"k": self.k, "n": self.n, "fresh": self.n}
        return {"k": self.k, "n": self.n, "fresh": self.n, "unknown": self.unknown,
                "note": f"{self.unknown} replay{'s' if self.unknown > 1 else ''} could not run, counted neither as "
                        f"reproduced nor as passed: {'; '.join(self.why)[:400]}"}

    @property
    def flaky(self) -> bool:
        return 0 < self.k < self.n


@dataclass
class Confirmed:
    case: Case
    problems: list[str] = field(default_factory=list)  # harness errors met on the way


class Confirmer:
    """Runs the three steps for one case in its own executor (one thread per case)."""

    def __init__(self, executor: Executor, *, tries: int = DEFAULT_TRIES, deadline: float | None = None,
                 minimize: bool = True, rate_deadline: float | None = None, helper: Executor | None = None,
                 cap: int | None = None, shrink_jobs: int = 1, sibling=None, pool=None):
        self.executor = executor
        # candidates that each need a fresh child, ``shrink_jobs`` at once (``sibling()``: another executor;
        # ``pool``: the campaign's ``lanes.LanePool``, which the siblings come out of)
        self.lanes = Lanes(executor, shrink_jobs, sibling, pool)
        self.helper = helper  # a second executor for the first rate's replays (``_replays``), closed after it
        self.tries = max(1, tries)
        self.deadline = deadline  # for minimizing
        self.rate_deadline = rate_deadline if rate_deadline is not None else deadline  # for the rate and history
        self.others: dict[str, int] = {}  # signatures replays failed with instead of the case's -> first step
        self.minimize = minimize
        self.cap = MINIMIZE_CAP if cap is None else cap  # candidates for one case's minimization
        self.wait = time.sleep  # how a retry of a replay that could not run waits (tests pass their own)
        self.mark = lambda step: None  # told each step as it ends: "rated", "minimized", "rerated"

    def _late(self, rating: bool = False) -> bool:
        deadline = self.rate_deadline if rating else self.deadline
        return deadline is not None and time.monotonic() >= deadline

    def _judge(self, case: Case, history: list | None, unrun=None, executor: Executor | None = None):
        """A judge of ``(config, ops)``; a replay that could not run answers ``unrun`` (default:
        None, as a candidate that does not fail; ``rate`` counts it apart)."""
        executor = executor or self.executor

        def judge(config, ops, fresh=False):
            end = max(d for d in (self.deadline, self.rate_deadline, 0.0) if d is not None)
            try:
                return executor.run(config, ops, case.knobs, case.run_mode, deadline=end + 5 if end else None,
                                    history=history, fresh=fresh)
            except NotRun as exc:
                return unrun(exc) if unrun is not None else None
        return judge

    def tries_for(self, case: Case) -> int:
        """A hang costs an op-timeout per try, a process death a fresh child: fewer of those."""
        if case.signature.oracle == "timeout":
            return 1
        if case.fault is not None:
            return min(self.tries, 3)
        return self.tries

    def rate(self, case: Case, history: list | None = None, tries: int | None = None, floor: int = 3) -> Rate:
        """Failures alike over up to ``tries`` replays: at least ``floor`` of them, the rest
        while the deadline allows (the first in a fresh process); those that could not run
        (after their retries) apart."""
        rate = Rate()
        for f in self._replays(case, history, tries or self.tries, floor):
            if isinstance(f, NotRun):  # neither a reproduction nor a pass
                rate.unknown += 1
                if str(f) not in rate.why:
                    rate.why.append(str(f))
                continue
            rate.n += 1
            if alike(case, f):
                rate.k += 1
                rate.failure = f
            elif f is not None:  # it failed, as something else: said in the case, never counted
                self.others.setdefault(str(f.signature), f.step)
        return rate

    def _replays(self, case: Case, history: list | None, tries: int, floor: int) -> list:
        """The rate's replays' answers, in order (a Finding, None, or NotRun after its retries),
        each in a fresh process (a child that ran nothing else of the kernel set but the tier's
        smoke test, which every process runs alike): a reproduction in a process that ran earlier
        replays may be those replays' doing (a counter, a cache), the executor's history and
        not the case's, so it never counts. A case found without history that does not kill
        its child is replayed by the ``helper`` executor too, side by side, once its child is set
        up (each takes the next replay when it is free): the rate's five replays on two cores
        cost about three replays' time. A crash case's replays each need a fresh child anyway."""
        judge = self._judge(case, history, unrun=lambda exc: exc)
        helper, self.helper = self.helper, None  # the first rate's only
        if helper is not None and not (history is None and case.fault is None and tries > 1):
            helper.release()
            helper = None
        taken, answers, lock = [0], {}, threading.Lock()

        def replays(judge, ready=lambda: True) -> None:
            while not ready():  # a helper still setting up: the other child takes the replays meanwhile
                if taken[0] >= tries or helper.child is None or not helper.child.alive():
                    return
                time.sleep(0.02)
            while True:
                with lock:
                    i, taken[0] = taken[0], taken[0] + 1
                if i >= tries or (i >= floor and self._late(rating=True)):
                    return
                answers[i] = self._replay(case, judge)

        side = None
        if helper is not None:
            helper.prestart()

            def helping() -> None:
                try:
                    replays(self._judge(case, None, unrun=lambda exc: exc, executor=helper), helper.ready)
                except Exception:  # noqa: BLE001 - it only helps: the executor's own replays stand alone
                    pass
                finally:
                    helper.release()
            side = threading.Thread(target=helping, daemon=True)
            side.start()
        try:
            replays(judge)
        except BaseException:
            if helper is not None:
                helper.shutdown()  # its replay in flight ends (Cancelled) and nobody waits for it
            raise
        finally:
            if side is not None:
                side.join()
        return [answers[i] for i in sorted(answers)]

    def _replay(self, case: Case, judge):
        """One replay of the case in a fresh process, tried again (after a wait) while it could not run."""
        f = judge(case.config, case.ops, fresh=True)
        for _ in range(UNKNOWN_RETRIES):
            if not isinstance(f, NotRun) or self._late(rating=True):
                break
            self.wait(UNKNOWN_WAIT_S)
            f = judge(case.config, case.ops, fresh=True)
        return f

    def _otherwise(self) -> str:
        """What the replays that did not reproduce the case failed as instead (a trigger that
        fires earlier in a fresh process: a time, a count), for the case's note."""
        if not self.others:
            return ""
        return "; replayed, it failed as " + ", ".join(f"{sig} at step {step}" for sig, step in self.others.items()) + (
            " instead")

    @staticmethod
    def _unrun(rate: Rate) -> str:
        """The note's start for a case with no reproduction: a replay that could not run did not
        pass either, so a case none of whose replays ran says so instead of "did not reproduce"."""
        if rate.n == 0 and rate.unknown:
            return f"no replay could run ({'; '.join(rate.why)[:300]}): unknown, not a pass"
        return "did not reproduce in a fresh process" if rate.n <= 1 else f"did not reproduce in {rate.n} fresh processes"

    def confirm(self, case: Case, history=None, publish=None) -> Case:
        """``history``: a thunk giving the worker's earlier sequences (or None); ``publish``:
        called with the case after each step that improved it (the rate, a shorter history, a
        smaller case), so a campaign that ends mid-way keeps what was learnt."""
        publish = publish or (lambda c: None)
        tries = self.tries_for(case)
        # A fault case is shrunk first and rated after: each of its replays and candidates costs a
        # fresh child, and rating the long case as found, then the short one, spent the campaign's
        # confirmation time before shrinking began. One fresh replay says whether it reproduces.
        shrink_first = case.fault is not None and self.minimize
        if case.fault is not None:  # each replay that reproduces it kills its child: the next ones are started ahead
            self.executor.standby(depth=self.depth(case))
        else:  # every replay of the rate runs in a child of its own: the next one started ahead
            self.executor.standby(fresh=tries)
        rate = self.rate(case, tries=1 if shrink_first else tries, floor=1 if shrink_first else 3)
        if shrink_first and rate.k == 0 and tries > 1:  # the probe missed: the rate's other replays
            rate = rate.then(self.rate(case, tries=tries - 1, floor=tries - 1))
        needs = None
        history = history() if callable(history) and rate.k == 0 else history
        after = ""  # the history that did not make it fail either, for the note
        if rate.k == 0 and history:
            first, rate = rate, self.rate(case, history, tries=1, floor=1)
            if rate.k:
                def needing(hist):
                    return {"sequences": hist, "reproduced": True,
                            "note": f"fails only after what its worker's process ran before it "
                                    f"({len(hist)} earlier sequences, replayed first)"}

                publish(case.with_fields(reproduced=rate.to_json(), flaky=False, history=needing(history)))
                history = self.shorter_history(case, history)
                needs = needing(history)
                again = self.rate(case.with_fields(history=needs), history, tries=1 if shrink_first else tries, floor=1)
                rate = again if again.k else rate
            else:
                rate = first if first.n or not rate.n else rate
                after = f", not even after its worker's {len(history)} earlier sequences"
        if rate.k == 0 and rate.n:  # seen once, so look longer: a rare race, or a machine's hiccup
            fault = case.fault is not None or case.signature.oracle == "timeout"
            rate = rate.then(self.rate(case, tries=FAULT_RARE_TRIES if fault else RARE_TRIES, floor=0))
        if rate.k == 0:
            needs = {"sequences": [], "reproduced": False,
                     "note": f"{self._unrun(rate)}{after}: kept as found{self._otherwise()}"}
        k, n = rate.k, rate.n
        case = case.with_fields(reproduced=rate.to_json(), flaky=rate.flaky, **({"history": needs} if needs else {}))
        self.mark("rated")
        publish(case)
        if k == 0 or not self.minimize:
            return case
        if self._late() and not shrink_first:
            return case.with_fields(minimal={"one_minimal": False, "candidates": 0, "note": _unfinished("deadline")})
        # The minimized case's rate begins in a fresh process: started now, it is up by then (a
        # crash case's candidates and replays each kill their child: children kept started ahead).
        if case.fault is None:
            self.executor.standby(fresh=1)
        smaller = self.minimized(case, rate.failure)
        self.mark("minimized")
        if shrink_first:  # (published once rated: its file never pairs the short ops with the long case's rate)
            return self._rated_after_shrinking(case, smaller, rate, tries)
        if smaller is case:
            return case
        if (smaller.config, smaller.ops) == (case.config, case.ops):  # nothing dropped: the rate stands
            return smaller
        # A shorter sequence fails less often when the bug is a race per call: rate it again,
        # and keep the longer one if the shorter never fails on its own.
        again = self.rate(smaller, (smaller.history or {}).get("sequences") or None, tries=tries,
                          floor=min(3, tries))
        self.mark("rerated")
        if again.k == 0 or again.k / again.n < k / n / 2:  # a shorter case that fails far less often is a worse case
            return case.with_fields(minimal={
                "one_minimal": False, "candidates": (smaller.minimal or {}).get("candidates", 0),
                "note": f"its {len(smaller.ops)}-op minimized version failed {again.k}/{again.n} in its own rate, far "
                        f"less often than this case: kept as found"})
        return smaller.with_fields(reproduced=again.to_json(), flaky=again.flaky)

    def _rated_after_shrinking(self, case: Case, smaller: Case, probe: Rate, tries: int) -> Case:
        """A fault case's rate, taken from the minimized case (its replays in fresh children);
        should the minimized case never fail on its own, the case as found is rated instead and
        kept, saying so."""
        self.executor.standby(fresh=tries, depth=self.depth(case))
        rate = self.rate(smaller, (smaller.history or {}).get("sequences") or None, tries=tries, floor=tries)
        self.mark("rerated")
        if rate.k:
            return smaller.with_fields(reproduced=rate.to_json(), flaky=rate.flaky)
        history = (case.history or {}).get("sequences") or None
        rate = probe.then(self.rate(case, history, tries=max(0, tries - probe.n), floor=max(0, tries - probe.n)))
        return case.with_fields(reproduced=rate.to_json(), flaky=rate.flaky, minimal={
            "one_minimal": False, "candidates": (smaller.minimal or {}).get("candidates", 0),
            "note": "the minimized case did not fail in its own rate: kept as found"})

    def shorter_history(self, case: Case, history: list) -> list:
        """Drop earlier sequences (the oldest first, then halves) while the case still fails
        after the rest, each try in a fresh child (``shrink_jobs`` of them at once, the first
        in this order adopted)."""
        def fails(hist):
            return lambda executor: alike(case, self._judge(case, hist, executor=executor)(case.config, case.ops,
                                                                                          fresh=True))

        kept = list(history)
        n = 2
        try:
            while kept and not self._late(rating=True):
                chunk = -(-len(kept) // n)
                cands = [kept[:i] + kept[i + chunk:] for i in range(0, len(kept), chunk)]
                at, reached = self.lanes.first([fails(cand) for cand in cands], lambda: self._late(rating=True))
                if at is not None:
                    kept, n = cands[at], max(2, n - 1)
                elif reached < len(cands) or chunk == 1:
                    break
                else:
                    n = min(len(kept), 2 * n)
        finally:
            self.lanes.close()
        return kept

    def depth(self, case: Case) -> int:
        """Children set up side by side for a crash case's replays: its tries, as the cores allow
        (a set-up is a core's work; on two cores one started ahead already overlaps the replays)."""
        return min(self.tries_for(case), max(1, (os.cpu_count() or 1) // 2))

    def minimized(self, case: Case, known=None) -> Case:
        """The case minimized, with ``minimal`` saying whether it is 1-minimal; ``known``: a
        replay of it that failed alike (from its rate), so the minimizer does not replay the
        whole case once more before its first candidate.

        A fault case's or a history case's candidates each run in a fresh child (kept started
        ahead): in a child that ran other candidates a process-wide counter, cache or leak fails
        candidates that fail only there, and the case would shrink to one that does not replay.
        A case with history is then checked without each of its history's sequences, in turn;
        one that still fails without it loses it, and its ops are shrunk again.

        Such candidates run ``shrink_jobs`` at once, each on a lane of its own (``lanes``), the
        first in the sequential order that fails alike adopted: the same case, 1-minimal check and
        count of candidates (the cap's) at any width. A flaky case's run one at a time."""
        history = (case.history or {}).get("sequences") or None
        fresh, flaky = case.fault is not None or bool(history), bool(case.flaky)
        if fresh:
            self.executor.standby(depth=self.depth(case))
            if not flaky:
                self.lanes.open()  # the siblings set up while the first candidates run
        try:
            return self._shrunk(case, history, known, fresh, flaky)
        finally:
            self.lanes.close()

    def _shrunk(self, case: Case, history: list | None, known, fresh: bool, flaky: bool) -> Case:
        """``minimized``'s rounds: the ops shrunk, then (a case with history) a history sequence dropped."""
        used, first = 0, case
        for _ in range(MAX_HISTORY_ROUNDS):
            judge = self._judge(case, history)
            # side by side only where each candidate needs a fresh child and runs once (a flaky case's
            # take tries, one at a time): only such a search takes siblings from the campaign's pool
            batch = self.lanes.batch(lambda e, c=case, h=history: lambda *cand: self._judge(c, h, executor=e)(
                *cand, fresh=True)) if fresh and not flaky else None
            m = Minimizer(None, case.signature, deadline=self.deadline, hostile=hostile_kind(case),
                          judge=lambda c, o, judge=judge: judge(c, o, fresh=fresh),
                          tries=self.tries if flaky else 1, max_replays=self.cap - used,
                          batch=batch, width=self.lanes.reserve() if batch else 1)
            try:
                config, ops, failure = m.run(case.config, case.ops, known=known)
            except NotReproducible:
                return case if case is first else case.with_fields(minimal=self._minimal(m, used, fresh))
            used += m.replays
            case, known = case.with_minimized(config, ops, failure, passes=_merged(case, first, m.report())), None
            check = fresh and history and m.one_minimal
            shorter, tried = self._history_without_one(case, history) if check else (None, 0)
            used += tried
            if shorter is None:
                return case.with_fields(minimal=self._minimal(m, used, fresh))
            history = shorter
            case = case.with_fields(history={**case.history, "sequences": history,
                                             "note": f"fails only after what its worker's process ran before it "
                                                     f"({len(history)} earlier sequences, replayed first)"})
        return case.with_fields(minimal=self._minimal(m, used, fresh, rounds=True))

    def _history_without_one(self, case: Case, history: list) -> tuple[list | None, int]:
        """(the history without one of its sequences after which the case still fails alike, in
        a fresh process, or None when each of them is needed; the replays the order reached)."""
        cands = [history[:i] + history[i + 1:] for i in range(len(history))]
        at, reached = self.lanes.first([
            lambda e, hist=hist: alike(case, self._judge(case, hist or None, executor=e)(case.config, case.ops,
                                                                                         fresh=True))
            for hist in cands])
        return (None if at is None else cands[at]), reached

    def _minimal(self, m: Minimizer, used: int, fresh: bool, rounds: bool = False) -> dict:
        """The case's ``minimal``: whether removing any single op (or history sequence) was seen
        to lose the signature, how many candidates that took, and, when not, why and what finishes it."""
        out = {"one_minimal": m.one_minimal and not rounds, "candidates": used, "fresh": fresh}
        if not out["one_minimal"]:
            out["note"] = _unfinished("rounds" if rounds else m.stopped or "deadline", self.cap)
        return out


MAX_HISTORY_ROUNDS = 3  # shrinking the ops, then the history, again: a case that needs more is left unfinished
MINIMIZE_CAP = 400  # candidates a campaign replays to shrink one case: work, not time, so every machine agrees


def _unfinished(why: str, cap: int = MINIMIZE_CAP) -> str:
    """A ``minimal`` note for a case left short of 1-minimal: why, and that ``kvfuzz minimize`` finishes it."""
    said = {"cap": f"stopped at the cap of {cap} candidates", "deadline": "stopped at the campaign's deadline",
            "rounds": f"its history and ops still shrank after {MAX_HISTORY_ROUNDS} rounds"}[why]
    return f"not shown 1-minimal ({said}): `kvfuzz minimize CASE` finishes it"


def _merged(case: Case, first: Case, report: dict) -> dict:
    """Per-pass "tried/kept" over the rounds of one minimization (the first round's alone if one)."""
    if case is first:
        return report
    out = dict(case.minimize or {})
    for name, tk in report.items():
        t, k = (int(x) for x in tk.split("/"))
        t0, k0 = (int(x) for x in out.get(name, "0/0").split("/"))
        out[name] = f"{t + t0}/{k + k0}"
    return out


def set_mark(cases, kernels: str) -> dict | None:
    """A campaign's ``nondeterministic`` mark for every case of its kernel set, or None: when
    any of its cases showed the set failing other than deterministically from the case's own
    ops (``nondeterminism``), a replay of any of them takes the tries a rate needs
    (``Case.replay_tries``), since a 5/5 case of such a set may pass a single replay."""
    seen = [why for c in cases if (why := nondeterminism(c))]
    if not seen:
        return None
    # by_chance: some case failed in some fresh replays of its own and not in others (not only after
    # a history it needs, with which it fails every time): a minimizer's candidates take tries too
    chance = [c.reproduced or {} for c in cases if c.flaky or never_again(c.reproduced)]
    mark = {"seen": seen, "by_chance": bool(chance),
            "note": f"this campaign saw {kernels} fail other than deterministically from a case's "
                    f"own ops: a single passing replay of any of its cases proves nothing"}
    if rated := [r for r in chance if r.get("n")]:  # the set's least reproduced case: its rate is every case's floor
        low = min(rated, key=lambda r: ((r.get("k") or 0) / r["n"], -r["n"]))
        mark["lowest"] = {"k": low.get("k") or 0, "n": low["n"]}
    return mark


def nondeterminism(case: Case) -> str | None:
    """What in a confirmed case shows its kernel set failing other than deterministically from
    the case's own ops (None: nothing): rated k < n, failing only after its worker's history,
    or not failing again in any fresh replay."""
    r, history = case.reproduced or {}, case.history or {}
    if case.flaky:
        return f"{case.signature} reproduced {r.get('k')}/{r.get('n')}"
    if history.get("reproduced"):
        return f"{case.signature} fails only after {len(history.get('sequences') or [])} sequences of its worker's history"
    if never_again(r):
        return f"{case.signature} did not fail again in {r.get('n')} fresh replays"
    return None


def needless_parts(case: Case, executor: Executor, siblings=()) -> list[str]:
    """The single ops (``"op 3"``) and history sequences (``"history 0"``) without which the
    case still fails alike, each replayed once in a fresh process: empty for a 1-minimal case
    of a deterministic fault (the check ``benchmarks/replay_matrix.py`` and the tests make).
    ``siblings``: more executors, each part run on one of them at once (``lanes.side_by_side``)."""
    history = (case.history or {}).get("sequences") or []
    parts = [(f"op {i}", case.ops[:i] + case.ops[i + 1:], history) for i in range(len(case.ops) if len(case.ops) > 1 else 0)]
    parts += [(f"history {i}", case.ops, history[:i] + history[i + 1:]) for i in range(len(history))]

    def fails(ex: Executor, ops, hist) -> bool:
        try:
            return alike(case, ex.run(case.config, ops, case.knobs, case.run_mode, history=hist or None, fresh=True))
        except NotRun:
            return False

    lanes, found = [executor, *siblings], []
    for start in range(0, len(parts), len(lanes)):
        chunk = parts[start:start + len(lanes)]
        for (name, _, _), answer in zip(chunk, side_by_side([lambda e=e, p=p: fails(e, p[1], p[2])
                                                              for e, p in zip(lanes, chunk)])):
            if isinstance(answer, BaseException):
                raise answer
            if answer:
                found.append(name)
    return found


def alike(case: Case, failure) -> bool:
    """Whether ``failure`` (a replay's answer) is the case's: its signature, and for a failure on
    hostile input the same hostile class."""
    want = hostile_kind(case)
    return failure is not None and failure.signature == case.signature and (want is None or hostile_kind(failure) == want)
