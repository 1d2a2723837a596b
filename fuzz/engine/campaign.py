"""A fuzz campaign: seeds -> op sequences -> differential runs -> minimized case files.

The parent supervises; every worker is a child process (``supervise``), so a kernel
set that segfaults, hangs, raises or faults the GPU yields a case and a fresh worker,
never a dead campaign. The parent:
- starts one worker per ``--workers`` (each pinned to one GPU on a CUDA host), and a
  fresh one at the next sequence whenever one dies or stops making progress;
- turns a worker's death into a ``crash`` / ``timeout`` case: the heartbeat names the
  seed and the op, and the ops are rebuilt from the seed (the op stream depends on the
  spec alone);
- writes every case the moment it is found (atomically; a shorter case already on disk
  for the same signature is kept), then minimizes it with candidates replayed in an
  executor child, and rewrites it smaller;
- prints progress (a live line on a terminal, a plain line every ``progress_s`` seconds
  in a CI log) and FAIL lines as they come; SIGTERM / SIGINT end the run cleanly with a
  summary and every case so far.

Seeds are split deterministically: shard ``I/N`` takes sequence numbers ``k`` with
``k % N == I``, and worker ``w`` of ``W`` inside it takes every W-th of those, so a CI
matrix or a cluster array covers one campaign without overlap. The budget bounds the
whole run, minimization included (``minimize_s`` grants extra time past it).

Work limits make a campaign deterministic: ``max_sequences`` / ``max_ops`` (``--max-sequences``,
``--max-ops``, libFuzzer's ``-runs``) count a shard's work across its workers, split by worker
index (``slot.share``); the campaign ends when every worker has run its share, the budget then
only a safety cap. ``stop_on_first`` ends it once the first finding is confirmed, minimized
and written. The summary's ``stopped_by`` says which of these (or the budget, or a signal)
ended it.
"""

from __future__ import annotations

import queue as queue_mod
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import kvref

from .case import Case, write_case
from .confirm import Confirmer, set_mark
from .kinds import parse_ops
from .lanes import LanePool, default_width
from .options import CampaignOptions
from .procfs import a_core_is_free, process_age
from .slot import Slot, compile_ahead, same_boundaries, stop_reason, stopped_by
from .summary import MAX_RESTARTS_WITHOUT_PROGRESS, FeatureClock, Summary, health, steady_rate
from .supervise import (
    CTX,
    EXIT_HARNESS,
    EXIT_RESTART,
    HEARD,
    OP,
    OPS,
    PHASE,
    SEED,
    SEQ,
    SETUP,
    Cancelled,
    Child,
    Executor,
    HarnessFailed,
    SetupFailed,
    visible_gpus,
)
from .tiers import SetupError
from .verdict import Finding, Signature

REPRODUCE_S = 20.0  # a finding's reproduction rate gets at least this long, even past the budget
SETUP_GRACE_S = 10.0  # past the budget, how long a worker still setting up may take to report
OVERRUN_NOTE_S = 5.0  # past the budget, when a still-running op is said (``_say_overrun``)
MINIMIZE_FLOOR_S = 15.0  # and then at least this long to be shrunk
HISTORY_S = 60.0  # and one that may need its worker's history this much longer again
AUTO_TIMEOUT = (10.0, 60.0)  # --op-timeout auto: 10x the longest op seen, inside these bounds


class Campaign:
    def __init__(self, opts: CampaignOptions, progress=None, out=None):
        self.opts = opts
        self.progress = progress  # a stream for progress lines, or None
        self.out = out or sys.stdout  # FAIL lines
        self.spec = opts.tier_spec()
        self.summary = Summary()
        self.cases: dict[Signature, Case] = {}
        self.paths: dict[Signature, Path] = {}
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.executors: list[Executor] = []
        self.stop: str | None = None
        self._gpu_turn = 0
        self.env = opts.child_env()  # every child's extra environment
        self._spare: Executor | None = None
        # the siblings every case's shrink shares: --shrink-jobs fresh children at once for the first case
        # found, not for each of the cases confirmed side by side (``lanes.LanePool``)
        self.lane_pool = LanePool((opts.shrink_jobs or default_width()) - 1)
        self._ahead = None  # a compile-ahead child that follows the workers (--compile-ahead follow)
        self._overrun_said = False
        self.clock = FeatureClock(opts.track.root) if opts.guided else None  # features over time

    # ---- set-up --------------------------------------------------------------------
    def _gpu(self, turn: int) -> str | None:
        return self.gpus[turn % len(self.gpus)]

    def _spawn(self, slot: Slot, start_k: int) -> None:
        slot.start_k, slot.warm, slot.found_steps = start_k, slot.restarts == 0, {}
        slot.child = Child("fuzz.engine.worker:fuzz_main",
                           (self.opts, slot.index, start_k, self.deadline_wall, self.queue, slot.restarts == 0,
                            slot.counted["ops"]),
                           log_dir=self.log_dir, gpu=self._gpu(slot.index), env=self.env)
        slot.knobs = None

    def _executor(self, turn: int, timeout: float) -> Executor:
        executor = Executor(self.spec, op_timeout=timeout, log_dir=self.log_dir, gpu=self._gpu(turn), env=self.env)
        self.executors.append(executor)
        return executor

    # ---- the run -----------------------------------------------------------------------
    def run(self) -> Summary:
        opts = self.opts
        out = Path(opts.out)
        if out.exists() and not out.is_dir():
            raise SetupError(f"--out {opts.out}: exists and is not a directory")
        self.log_dir = Path(tempfile.mkdtemp(prefix="kvfuzz-logs-"))
        if opts.compile_ahead_on():  # before the clock; each child then preloads what it compiled
            self.summary.compile_ahead, self._ahead = compile_ahead(opts, self.spec, self.log_dir, self.env,
                                                                    self.progress)
        self.start = time.monotonic()
        if (age := process_age()) is not None:  # the interpreter, the command line, compile-ahead
            self.summary.timeline["process_start"] = -age
        self.deadline = self.start + opts.budget_s
        self.deadline_wall = time.time() + opts.budget_s
        self.queue = CTX.Queue()
        self.gpus = visible_gpus() if opts.backend == "cuda" else [None]
        self.slots = [Slot(w) for w in range(opts.workers)]
        for slot in self.slots:
            self._spawn(slot, 0)
        self.summary.timeline["workers_started"] = time.monotonic() - self.start  # (a fork server: up by now)
        if opts.backend == "cuda":  # the first confirmation's executor, loaded while the workers fuzz, with the
            self._spare = self._executor(1, self.op_timeout())  # fresh child its minimized case's rate starts in
            self._spare.prestart(), self._spare.standby()
        previous = self._install_signals()
        try:
            self._loop()
        finally:
            self._restore_signals(previous)
            self._shutdown()
            self._mark_nondeterministic()
        return self._summarize()

    def op_timeout(self) -> float:
        """``--op-timeout``, or auto: 10x the longest op any worker ran so far, 10 s to 60 s."""
        if self.opts.op_timeout is not None:
            return self.opts.op_timeout
        longest = max([s.longest for s in self.slots] + [s.child.longest for s in self.slots if s.child is not None])
        lo, hi = AUTO_TIMEOUT
        return min(hi, max(lo, 10 * longest))

    def _loop(self) -> None:
        """Until the budget ends, and past it while a worker is still inside an op: an op
        that hangs when the budget ends is waited for up to the op timeout and reported, so a
        late hang is a case, never a clean exit."""
        last_line = time.monotonic()
        while True:
            self._drain(0.1)
            for slot in self.slots:
                self._watch(slot)
            now = time.monotonic()
            self._note_first_op(now)
            if self.clock is not None:
                self.clock.tick(now - self.start)
            if self.progress is not None and now - last_line >= self._line_every():
                self._progress_line()
                last_line = now
            if now > self.deadline + SETUP_GRACE_S:
                self._past_deadline()
            if now > self.deadline + OVERRUN_NOTE_S:
                self._say_overrun()
            if self.stop or all(s.done for s in self.slots) or now > self.deadline + self.op_timeout() + 30:
                break
        self._drain(0.0)

    def _past_deadline(self) -> None:
        """Workers stop at their next op once the budget is over; one still setting up (a
        restarted worker importing) has no op to finish and is let go, after a grace that
        lets a first worker report why it could not set up (a setup error is exit 2)."""
        for slot in self.slots:
            child = slot.child
            if not slot.done and child is not None and child.alive() and child.slots[PHASE] == SETUP:
                slot.retire()
                slot.done, slot.stopped_by = True, "budget"

    def _say_overrun(self) -> None:
        """Past the budget, say once which worker's op is still running and how long it may yet
        take (the op timeout): a run that ends well past its budget says why while it waits."""
        if self._overrun_said:
            return
        running = [(slot.index, slot.child.slots[OP], slot.child.running_for()) for slot in self.slots
                   if not slot.done and slot.child is not None and slot.child.running_for() > 0]
        if not running:
            return
        self._overrun_said = True
        w, step, took = max(running, key=lambda r: r[2])
        self._say(f"budget over: waiting for worker {w}'s op {step}, running for {took:.0f} s, up to the op timeout "
                  f"({self.op_timeout():g} s{'' if self.opts.op_timeout is not None else ', auto'}): a hang is a case")

    def _say_confirming(self) -> None:
        """Past the budget with confirmations still running, say why the run goes on: a finding
        made late is still rated and shrunk (``_confirm_deadlines``' floors), up to when."""
        alive = [until for t, until in self.threads if t.is_alive()]
        if not alive or time.monotonic() < self.deadline:
            return
        self._say(f"budget over: confirming {len(alive)} finding(s) made late (each gets {REPRODUCE_S:g} s to rate and "
                  f"{MINIMIZE_FLOOR_S:g} s more to shrink), for up to {max(alive) - time.monotonic():.0f} s more")

    def _say(self, note: str) -> None:
        """A note for the summary and, as it happens, the progress stream."""
        self.summary.notes.append(note)
        if self.progress is not None:
            self.progress.write(f"[kvfuzz] {note}\n")
            self.progress.flush()

    def _line_every(self) -> float:
        return 0.5 if self.progress is not None and self.progress.isatty() else self.opts.progress_s

    # ---- messages from workers -----------------------------------------------------------
    def _drain(self, wait: float) -> None:
        while True:
            try:
                msg = self.queue.get(timeout=wait) if wait else self.queue.get_nowait()
            except queue_mod.Empty:
                return
            except (EOFError, OSError):
                return
            wait = 0.0
            self._handle(msg)

    def _handle(self, msg) -> None:
        kind, w = msg[0], msg[1]
        slot = self.slots[w]
        if kind == "hello":
            slot.hello = msg[2]
            if slot.child is not None:
                slot.child.slots[HEARD] = 1  # the worker waits for this before its first sequence
            first = self.opts.stop_on_first and self._spare is None and not self.cases
            if first and (self.opts.reproduce or self.opts.minimize) and a_core_is_free():
                # the first case is all it waits for: its first replay's child set up beside the worker
                # (on a CPU, once the worker is up, and on a core nobody uses: else it slows the worker)
                self._spare = self._executor(1, self.op_timeout())
                self._spare.prestart()
            self.summary.worker_ready(time.monotonic() - self.start, slot.hello)
            for note in slot.hello.get("notes", ()):
                if note not in self.summary.notes:
                    self.summary.notes.append(note)
                    if self.progress is not None:
                        self.progress.write(f"[kvfuzz] {note}\n")
                        self.progress.flush()
        elif kind == "knobs":
            slot.knobs = msg[2]
        elif kind == "stats":
            slot.stats = msg[2]
        elif kind == "finding":
            p = msg[2]
            slot.found_steps[p["seed"]] = p["divergence"]["step"]
            self._record(Finding.of_divergence(p["divergence"]), kvref.PoolConfig.from_json(p["config"]),
                         parse_ops(p["ops"]), p["seed"], p["scenario"], p["knobs"], p.get("extra"),
                         history=slot.history(self.opts, p["k"], p["seed"]) if "k" in p else None)
        elif kind == "setup":
            if slot.hello is None and slot.restarts == 0:
                raise SetupError(msg[2])
            slot.done = True  # a restarted worker that can no longer set up
        elif kind == "harness":
            self.summary.harness_errors.append(msg[2])
            slot.reported_harness = True
        elif kind == "done":
            slot.done = True
            slot.stopped_by = msg[3] if len(msg) > 3 else None

    # ---- deaths and hangs -------------------------------------------------------------------
    def _watch(self, slot: Slot) -> None:
        child = slot.child
        if slot.done or child is None:
            return
        if child.alive():
            timeout = self.op_timeout()
            if child.stalled(timeout):
                step, setting_up = child.slots[OP], child.slots[PHASE] == SETUP
                slot.last_op_s = child.running_for()
                child.kill_hung()
                self._drain(0.2)
                if setting_up:  # no sequence begun: no op of any seed hung, the set-up did
                    self._setup_failed(slot, child.fault(True, timeout), "made no progress")
                else:
                    self._fault(slot, child.fault(True, timeout), step)
            return
        self._drain(0.2)  # what it said before it went
        if slot.done:
            return
        code = child.proc.exitcode
        if code == EXIT_HARNESS and not slot.reported_harness:
            self.summary.harness_errors.append("\n".join(child.fault().stderr))
        if code in (EXIT_RESTART, EXIT_HARNESS):
            self._restart(slot)
        elif slot.hello is None:
            self._setup_failed(slot, child.fault(), "died")
        else:
            self._fault(slot, child.fault(), child.slots[OP])

    def _setup_failed(self, slot: Slot, fault, what: str) -> None:
        """A worker that died or hung before its first sequence: the first one is a setup error
        (exit 2); a restarted one's position ends."""
        if slot.restarts == 0:
            where = fault.stack[:8] if fault.stack else fault.stderr[-8:]
            raise SetupError(f"--kernels {self.spec.name}: the worker {what} while loading the kernel set or "
                             f"running its smoke test ({fault.message}); "
                             f"{'where it was' if fault.stack else 'last stderr lines'}:\n" + "\n".join(where))
        slot.done = True

    def _fault(self, slot: Slot, fault, step: int) -> None:
        """A worker died (or hung) running op ``step`` of its current sequence."""
        child = slot.child
        self.summary.faults += 1
        seed = child.slots[SEED]
        track = self.opts.track
        config, scenario, ops = track.regenerate(seed, step + 1, slot.hello or {}, hostile=self.opts.hostile)
        extra = track.case_extra_of(slot.hello or {}) or None
        finding = Finding.of_fault(fault, ops, step)
        self._record(finding, config, ops[: step + 1], seed, scenario, slot.knobs, extra,
                     history=slot.history(self.opts, child.slots[SEQ], seed))
        self._restart(slot)

    def _halt_workers(self) -> None:
        """Stop every worker now (``--stop-on-first``): what they ran so far is counted."""
        for slot in self.slots:
            if slot.child is not None:
                slot.retire()
            slot.done = True

    def _restart(self, slot: Slot) -> None:
        child = slot.child
        if child is None:  # halted (``_halt_workers``)
            return
        next_k = child.slots[SEQ] + 1  # past the sequence it died in (a warm-up one says k - 1)
        ran = slot.retire()
        slot.reported_harness = False
        slot.stuck = 0 if ran else slot.stuck + 1
        why = stop_reason(self.opts, slot.index, next_k, slot.counted["ops"], self.deadline, lambda: False)
        if self.stop or why or slot.stuck >= MAX_RESTARTS_WITHOUT_PROGRESS:
            slot.done, slot.stopped_by = True, why  # its share of the work done: no fresh worker to start
            return
        slot.restarts += 1
        self.summary.restarts += 1
        self._spawn(slot, next_k)

    # ---- cases ---------------------------------------------------------------------------------
    def _record(self, finding, config, ops, seed, scenario, knobs, extra=None, history=None) -> None:
        sig = finding.signature
        halt = self.opts.stop_on_first and not self.cases  # the first: fuzz no further, confirm and minimize it
        if halt:
            self.stop = self.stop or "first-finding"
        with self.lock:
            self.summary.occurrences[sig] = self.summary.occurrences.get(sig, 0) + 1
            if sig in self.cases:
                return
            case = Case.found(config=config, ops=ops, divergence=finding, original_len=len(ops), seed=seed,
                              scenario=scenario, tier=self.opts.backend, kernels=self.spec.name, knobs=knobs,
                              extra=extra, mode=self.opts.mode(seed), allocator=self.opts.allocator)
            self.cases[sig] = case
            self.paths[sig] = write_case(case, Path(self.opts.out), keep_shorter=True)
            self.summary.found_after[sig] = time.monotonic() - self.start
            self.summary.timeline.setdefault("first_op", self.summary.found_after[sig])
        message = next(iter((finding.divergence.get("message") or "").splitlines()), "")  # a CUDA error runs on
        print(f"FAIL {sig}: {message} (seed {seed}, {len(ops)} ops) "
              f"-> {self.paths[sig]}", file=self.out, flush=True)
        if self.opts.stop_after is not None and len(self.cases) >= self.opts.stop_after:
            self.stop = self.stop or "enough failures"
        if self.opts.reproduce or self.opts.minimize:
            t = threading.Thread(target=self._confirm, args=(case, history), daemon=True)
            _, minimize_by = self._confirm_deadlines(history)
            self.threads.append((t, minimize_by + self.op_timeout() + 10))
            t.start()
        if halt:  # once its confirmation has begun: a worker's end (a CUDA context torn down) is not waited for first
            self._halt_workers()

    def _confirm_deadlines(self, history) -> tuple[float, float]:
        """(rate by, minimize by) for a finding made now: the budget's end (plus --minimize-s
        for shrinking), but never less than REPRODUCE_S to rate it (HISTORY_S more when it may
        need its worker's history) and MINIMIZE_FLOOR_S more to shrink it, so a finding made in
        the budget's last seconds is still confirmed and minimized."""
        now = time.monotonic()
        rate_by = max(self.deadline, now + REPRODUCE_S + (HISTORY_S if history is not None else 0))
        minimize_by = max(self.deadline + self.opts.minimize_s, now + REPRODUCE_S + MINIMIZE_FLOOR_S)
        return rate_by, minimize_by if self.opts.minimize else rate_by

    def _confirm(self, case: Case, history: list | None) -> None:
        """Reproduction rate, history and minimization (``confirm``), then the case rewritten."""
        rate_by, deadline = self._confirm_deadlines(history)
        # A hang hangs for good: candidates need not wait a whole op-timeout to show it.
        timeout = min(self.op_timeout(), 10.0) if case.signature.oracle == "timeout" else self.op_timeout()
        with self.lock:
            self._gpu_turn += 1
            turn = self._gpu_turn  # its siblings (candidates side by side) share its GPU
            executor, self._spare = self._spare or self._executor(turn, timeout), None
            executor.op_timeout = timeout
        # --stop-on-first on a CPU: the halted worker's core is free for a second child taking half the
        # rate's replays (on a GPU its set-up would outlast them), unless other processes hold the cores
        helps = self.opts.stop_on_first and self.opts.backend != "cuda" and self.opts.reproduce > 1 and a_core_is_free()
        helper = self._executor(self._gpu_turn, timeout) if helps and case.fault is None else None
        confirmer = Confirmer(executor, tries=max(1, self.opts.reproduce), deadline=deadline,
                              minimize=self.opts.minimize, rate_deadline=rate_by, helper=helper,
                              shrink_jobs=self.opts.shrink_jobs or default_width(),
                              sibling=lambda: self._executor(turn, timeout), pool=self.lane_pool)
        confirmer.mark = self.summary.marker(case.signature, self.start, executor, helper, confirmer.lanes.siblings)
        def publish(better: Case) -> None:
            with self.lock:
                self.cases[case.signature] = better
                self.paths[case.signature] = write_case(better, Path(self.opts.out), keep_shorter=True,
                                                        same_length=True)

        try:
            publish(confirmer.confirm(case, history, publish))  # then its children stopped: not before
            confirmer.mark("written")
        except (SetupFailed, HarnessFailed, TimeoutError, Cancelled) as exc:
            if isinstance(exc, HarnessFailed) and not self.stop:
                self.summary.harness_errors.append(str(exc))
        finally:
            executor.close()

    def _mark_nondeterministic(self) -> None:
        """Once every confirmation is over, every case says whether the campaign saw its kernel
        set fail non-deterministically (``confirm.set_mark``)."""
        with self.lock:
            mark = set_mark(self.cases.values(), self.spec.name)
            for sig, c in list(self.cases.items()) if mark else ():
                self.cases[sig] = c.with_fields(nondeterministic=mark)
                self.paths[sig] = write_case(self.cases[sig], Path(self.opts.out), keep_shorter=True, same_length=True)

    # ---- progress, signals, shutdown -------------------------------------------------------------
    def _note_first_op(self, now: float) -> None:
        """The timeline's first op (or a finding's time: ``_record``), seen in the workers' op
        counts, but only once a worker's hello has come (its "ready"): the counts are shared
        memory and the hello a queue's message, which a worker's feeder thread may still hold
        while its first ops are counted, so the first op would come before the ready it follows."""
        timeline = self.summary.timeline
        if "first_op" not in timeline and "ready" in timeline and self.ops_so_far():
            timeline["first_op"] = now - self.start

    def ops_so_far(self) -> int:
        return sum(s.counted["ops"] + (s.child.slots[OPS] if s.child else 0) for s in self.slots)

    def _progress_line(self) -> None:
        elapsed = time.monotonic() - self.start
        ops = self.ops_so_far()
        rate = ops / elapsed if elapsed > 0 else 0.0
        line = (f"[kvfuzz] {elapsed:6.1f}/{self.opts.budget_s:.0f}s  ops {ops:>9,}  {rate:8.0f} ops/s  "
                f"failures {len(self.cases)}  restarts {self.summary.restarts}")
        if self.progress.isatty():
            self.progress.write("\r" + line)
        else:
            self.progress.write(line + "\n")
        self.progress.flush()

    def _install_signals(self):
        if threading.current_thread() is not threading.main_thread():
            return None

        def stop(signum, frame):
            self.stop = signal.Signals(signum).name

        return {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}

    @staticmethod
    def _restore_signals(previous) -> None:
        for sig, handler in (previous or {}).items():
            signal.signal(sig, handler)

    def _shutdown(self) -> None:
        for slot in self.slots:
            if slot.child is not None:
                slot.last_op_s = max(slot.last_op_s, slot.child.running_for())
                slot.retire()
        if self.stop in ("SIGTERM", "SIGINT"):
            for executor in list(self.executors):
                executor.shutdown()
        self._say_confirming()
        for t, until in self.threads:
            t.join(timeout=max(1.0, until - time.monotonic()))
        for executor in list(self.executors):  # a confirmation still running past its time: stop its child
            executor.shutdown()
        if self.progress is not None and self.progress.isatty():
            self.progress.write("\n")
        if self._ahead is not None:
            self.summary.compile_ahead["follow"] = self._ahead.stop()
        shutil.rmtree(self.log_dir, ignore_errors=True)

    def _summarize(self) -> Summary:
        s = self.summary
        s.elapsed_s = time.monotonic() - self.start
        s.interrupted = self.stop if self.stop in ("SIGTERM", "SIGINT") else None
        s.stopped_by = stopped_by(self.stop, self.slots)
        for slot in self.slots:
            s.ops += slot.counted["ops"]
            s.sequences += slot.counted["sequences"]
            s.contract_ops += slot.counted["contract_ops"]
            for stats in slot.kept:
                s.launches += stats.get("launches", 0)
                for key in ("compile_s", "compiles", "loads", "load_s"):
                    setattr(s, key, getattr(s, key) + stats.get(key, 0))
                for why, n in stats.get("not_applicable", {}).items():
                    s.not_applicable[why] = s.not_applicable.get(why, 0) + n
                s.elements += stats.get("elements", 0)
                for kind, n in stats.get("unrun_by_kind", {}).items():
                    s.unrun_by_kind[kind] = s.unrun_by_kind.get(kind, 0) + n
                for key in ("by_kind", "by_scenario", "hostile"):
                    mine = getattr(s, key)
                    for k, v in stats.get(key, {}).items():
                        mine[k] = mine.get(k, 0) + v
        if s.compile_ahead:
            s.compile_ahead["same_boundaries"] = same_boundaries(s.compile_ahead, self.slots)
        s.op_timeout_s = round(self.op_timeout(), 2)
        s.workers = [{"worker": slot.index, "last_op_s": round(slot.last_op_s, 2), "restarts": slot.restarts,
                      "longest_op_s": round(slot.longest, 3),
                      **({"head_start": hs} if (hs := (slot.stats or (slot.kept or [{}])[-1]).get("head_start")) else {})}
                     for slot in self.slots]
        s.cases = list(self.cases.values())
        s.paths = [self.paths[c.signature] for c in s.cases]
        s.health = health(s, self.slots, self.opts)
        s.steady_ops_per_s = steady_rate(self.slots)
        if self.clock is not None:
            self.clock.tick(s.elapsed_s, force=True)
            s.feature_timeline = self.clock.points
        return s


def run_campaign(opts: CampaignOptions, progress=None, out=None) -> Summary:
    """Run a supervised campaign. ``progress``: where progress lines go (default: stderr)."""
    return Campaign(opts, progress=sys.stderr if progress is None else progress or None, out=out).run()
