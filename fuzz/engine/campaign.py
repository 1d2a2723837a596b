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
"""

from __future__ import annotations

import os
import queue as queue_mod
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import kvref

from .case import Case, Signature, write_case
from .generate import OpGenerator, contract_rate, regenerate, sequence_params
from .minimize import Minimizer, NotReproducible
from .ops import parse_ops
from .supervise import (
    CONTRACT,
    CTX,
    EXIT_HARNESS,
    EXIT_RESTART,
    OP,
    OPS,
    SEED,
    SEQ,
    SEQS,
    Cancelled,
    Child,
    Executor,
    Finding,
    HarnessFailed,
    SetupFailed,
)
from .tiers import SetupError, TierSpec

OPS_PER_SEQUENCE = 200
PRODUCTION_OPS = 24  # production ops are big: a sequence of a few dozen fills seconds of GPU time
MAX_RESTARTS_WITHOUT_PROGRESS = 5
HEALTHY_OPS = 2000  # a run this long that never ran a kind the kernel set provides is not clean


@dataclass
class CampaignOptions:
    backend: str = "torch"
    kernels: str | None = None
    seed: int = 0
    budget_s: float = 60.0
    out: str = "kvfuzz-out"
    workers: int = 1
    shard: tuple[int, int] = (0, 1)
    ops_per_sequence: int | None = None  # default: 200 at small scale, 24 at production scale
    max_sequences: int | None = None
    scale: str = "small"  # or "production": kernel-level ops at production shapes (scale.py)
    check_every: int = 1  # full state checks every N ops (results are still diffed every op)
    hostile: str = "spec"
    op_timeout: float = 60.0
    progress_s: float = 30.0
    minimize: bool = True
    minimize_s: float = 0.0  # extra seconds past the budget for minimizing what was found
    stop_after: int | None = None  # stop fuzzing after this many distinct failures (mutant hunts)
    factory: str | None = None  # a tier factory instead of a kernel set (TierSpec)
    factory_arg: str | None = None
    allocator: str | None = None  # MODULE_OR_FILE[:FACTORY] (allocators.py); None: ours

    def n_ops(self) -> int:
        return self.ops_per_sequence or (PRODUCTION_OPS if self.scale == "production" else OPS_PER_SEQUENCE)

    def tier_spec(self) -> TierSpec:
        return TierSpec(self.backend, self.kernels, self.factory, self.factory_arg, self.allocator)


def sequence_seed(opts: CampaignOptions, worker: int, k: int) -> int:
    shard_i, shard_n = opts.shard
    index = (k * opts.workers + worker) * shard_n + shard_i
    return opts.seed * 1_000_003 + index


def run_sequence(tier, seed: int, n_ops: int, deadline: float | None = None, *, hostile: str = "spec", beat=None,
                 knobs=None, full_every: int = 1):
    """Generate and diff one sequence in this process; (config, scenario, ops, divergence
    or None, run). ``knobs``: the launch knobs (default: the seed's choice)."""
    from .knobs import choose
    from .runner import Divergence, PoolRun

    config, scenario, rng = sequence_params(seed)
    gen = OpGenerator(rng, config, scenario, contract_rate=contract_rate(hostile))
    run = PoolRun(config, tier, knobs=choose(tier.kernels, seed) if knobs is None else knobs, hostile=hostile,
                  beat=beat, full_every=full_every)
    ops = []
    try:
        for _ in range(n_ops):
            if deadline is not None and time.monotonic() >= deadline:
                break
            op = gen.next_op(run.spec)
            ops.append(op)
            gen.observe(op, run.step(op))
        run.finish()
    except Divergence as d:
        return config, scenario, ops, d, run
    return config, scenario, ops, None, run


@dataclass
class Summary:
    ops: int = 0
    contract_ops: int = 0
    sequences: int = 0
    elapsed_s: float = 0.0
    cases: list = field(default_factory=list)
    paths: list = field(default_factory=list)
    by_kind: dict = field(default_factory=dict)
    by_scenario: dict = field(default_factory=dict)
    hostile: dict = field(default_factory=dict)
    launches: int = 0
    elements: int = 0  # production scale: result elements diffed against the vectorized oracle
    faults: int = 0  # worker deaths and hangs (crash and timeout cases included)
    restarts: int = 0
    occurrences: dict = field(default_factory=dict)  # signature -> times seen
    harness_errors: list = field(default_factory=list)
    interrupted: str | None = None
    health: list = field(default_factory=list)  # why a run without failures is still not clean
    steady_ops_per_s: float | None = None  # after the workers' warm-up (GPU: no Triton compile in it)
    found_after: dict = field(default_factory=dict)  # signature -> seconds into the run

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def exit_code(self) -> int:
        """3: the harness failed; 1: failures found; 2: not clean for another reason (the
        health checks); 0: clean."""
        return 3 if self.harness_errors else 1 if self.cases else 2 if self.health else 0


def visible_gpus() -> list[str | None]:
    """The GPUs this host lets us use, as CUDA_VISIBLE_DEVICES entries."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [x.strip() for x in listed.split(",") if x.strip()] or [None]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())] or [None]


class _Slot:
    """One worker position: its current child and what the parent knows of it."""

    def __init__(self, index: int):
        self.index = index
        self.child: Child | None = None
        self.hello: dict | None = None
        self.knobs: dict | None = None  # the current child's launch knobs (it says when they change)
        self.done = False
        self.restarts = 0
        self.stuck = 0  # restarts in a row that ran no op
        self.reported_harness = False  # the current child sent its harness error itself
        self.counted = {"ops": 0, "sequences": 0, "contract_ops": 0}  # exact, from earlier children's heartbeats
        self.stats: dict = {}  # the current child's last stats report
        self.kept: list[dict] = []  # the last stats reports of earlier children

    def retire(self) -> int:
        """Count the current child's work (its heartbeat is exact, its last report may be a
        little behind) and close it; the ops it ran."""
        child = self.child
        ran = child.slots[OPS]
        for key, slot in (("ops", OPS), ("sequences", SEQS), ("contract_ops", CONTRACT)):
            self.counted[key] += child.slots[slot]
        if self.stats:
            self.kept.append(self.stats)
        self.stats = {}
        child.close()
        self.child = None
        return ran


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

    # ---- set-up --------------------------------------------------------------------
    def _gpu(self, turn: int) -> str | None:
        return self.gpus[turn % len(self.gpus)]

    def _spawn(self, slot: _Slot, start_k: int) -> None:
        slot.child = Child("fuzz.engine.worker:fuzz_main",
                           (self.opts, slot.index, start_k, self.deadline_wall, self.queue, slot.restarts == 0),
                           log_dir=self.log_dir, gpu=self._gpu(slot.index))
        slot.knobs = None

    # ---- the run -----------------------------------------------------------------------
    def run(self) -> Summary:
        opts = self.opts
        out = Path(opts.out)
        if out.exists() and not out.is_dir():
            raise SetupError(f"--out {opts.out}: exists and is not a directory")
        self.start = time.monotonic()
        self.deadline = self.start + opts.budget_s
        self.deadline_wall = time.time() + opts.budget_s
        self.log_dir = Path(tempfile.mkdtemp(prefix="kvfuzz-logs-"))
        self.queue = CTX.Queue()
        self.gpus = visible_gpus() if opts.backend == "cuda" else [None]
        self.slots = [_Slot(w) for w in range(opts.workers)]
        for slot in self.slots:
            self._spawn(slot, 0)
        previous = self._install_signals()
        try:
            self._loop()
        finally:
            self._restore_signals(previous)
            self._shutdown()
        return self._summarize()

    def _loop(self) -> None:
        last_line = time.monotonic()
        grace = min(self.opts.op_timeout, 10.0)
        while True:
            self._drain(0.1)
            for slot in self.slots:
                self._watch(slot)
            now = time.monotonic()
            if self.progress is not None and now - last_line >= self._line_every():
                self._progress_line()
                last_line = now
            if self.stop or all(s.done for s in self.slots) or now > self.deadline + grace:
                break
        self._drain(0.0)

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
        elif kind == "knobs":
            slot.knobs = msg[2]
        elif kind == "stats":
            slot.stats = msg[2]
        elif kind == "finding":
            p = msg[2]
            self._record(Finding.of_divergence(p["divergence"]), kvref.PoolConfig.from_json(p["config"]),
                         parse_ops(p["ops"]), p["seed"], p["scenario"], p["knobs"], p.get("extra"))
        elif kind == "setup":
            if slot.hello is None and slot.restarts == 0:
                raise SetupError(msg[2])
            slot.done = True  # a restarted worker that can no longer set up
        elif kind == "harness":
            self.summary.harness_errors.append(msg[2])
            slot.reported_harness = True
        elif kind == "done":
            slot.done = True

    # ---- deaths and hangs -------------------------------------------------------------------
    def _watch(self, slot: _Slot) -> None:
        child = slot.child
        if slot.done or child is None:
            return
        if child.alive():
            if child.stalled(self.opts.op_timeout):
                step = child.slots[OP]
                child.kill()
                self._drain(0.2)
                self._fault(slot, child.fault(True, self.opts.op_timeout), step)
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
            fault = child.fault()
            if slot.restarts == 0:
                raise SetupError(f"--kernels {self.spec.name}: the worker died while loading the kernel set or "
                                 f"running its smoke test ({fault.message}); last stderr lines:\n"
                                 + "\n".join(fault.stderr[-8:]))
            slot.done = True
        else:
            self._fault(slot, child.fault(), child.slots[OP])

    def _fault(self, slot: _Slot, fault, step: int) -> None:
        """A worker died (or hung) running op ``step`` of its current sequence."""
        child = slot.child
        self.summary.faults += 1
        seed = child.slots[SEED]
        hello = slot.hello or {}
        extra = None
        if self.opts.scale == "production":
            from . import scale

            config, ops = scale.regenerate(seed, step + 1, hello["scale"])
            scenario, extra = "production", {"scale": "production"}
        else:
            config, scenario, ops = regenerate(seed, step + 1, has=hello.get("has", ()), hostile=self.opts.hostile,
                                               skips=hello.get("skips", ()))
        finding = Finding.of_fault(fault, ops, step)
        self._record(finding, config, ops[: step + 1], seed, scenario, slot.knobs, extra)
        self._restart(slot)

    def _restart(self, slot: _Slot) -> None:
        child = slot.child
        next_k = child.slots[SEQ] + 1  # past the sequence it died in (a warm-up one says k - 1)
        ran = slot.retire()
        slot.reported_harness = False
        slot.stuck = 0 if ran else slot.stuck + 1
        if self.stop or time.monotonic() >= self.deadline or slot.stuck >= MAX_RESTARTS_WITHOUT_PROGRESS:
            slot.done = True
            return
        slot.restarts += 1
        self.summary.restarts += 1
        self._spawn(slot, next_k)

    # ---- cases ---------------------------------------------------------------------------------
    def _record(self, finding, config, ops, seed, scenario, knobs, extra=None) -> None:
        sig = finding.signature
        with self.lock:
            self.summary.occurrences[sig] = self.summary.occurrences.get(sig, 0) + 1
            if sig in self.cases:
                return
            case = Case.found(config=config, ops=ops, divergence=finding, original_len=len(ops), seed=seed,
                              scenario=scenario, tier=self.opts.backend, kernels=self.spec.name, knobs=knobs,
                              extra=extra, allocator=self.opts.allocator)
            self.cases[sig] = case
            self.paths[sig] = write_case(case, Path(self.opts.out), keep_shorter=True)
            self.summary.found_after[sig] = time.monotonic() - self.start
        message = next(iter((finding.divergence.get("message") or "").splitlines()), "")  # a CUDA error runs on
        print(f"FAIL {sig}: {message} (seed {seed}, {len(ops)} ops) "
              f"-> {self.paths[sig]}", file=self.out, flush=True)
        if self.opts.stop_after is not None and len(self.cases) >= self.opts.stop_after:
            self.stop = self.stop or "enough failures"
        if self.opts.minimize:
            t = threading.Thread(target=self._minimize, args=(case,), daemon=True)
            self.threads.append(t)
            t.start()

    def _minimize(self, case: Case) -> None:
        deadline = max(self.deadline, time.monotonic()) + self.opts.minimize_s
        # A hang hangs for good: candidates need not wait a whole op-timeout to show it.
        timeout = min(self.opts.op_timeout, 10.0) if case.signature.oracle == "timeout" else self.opts.op_timeout
        with self.lock:
            self._gpu_turn += 1
            executor = Executor(self.spec, op_timeout=timeout, log_dir=self.log_dir, gpu=self._gpu(self._gpu_turn))
            self.executors.append(executor)

        def judge(config, ops):
            return executor.run(config, ops, case.knobs, self.opts.hostile, deadline=deadline + 5,
                                full_every=self.opts.check_every)

        m = Minimizer(None, case.signature, deadline=deadline, judge=judge)
        try:
            config, ops, failure = m.run(case.config, case.ops)
        except NotReproducible:
            return  # flaky, or the fault needs the worker's history: keep the case as found
        except (SetupFailed, HarnessFailed, TimeoutError, Cancelled) as exc:
            if isinstance(exc, HarnessFailed) and not self.stop:
                self.summary.harness_errors.append(str(exc))
            return
        finally:
            executor.close()
        smaller = case.with_minimized(config, ops, failure)
        with self.lock:
            self.cases[case.signature] = smaller
            self.paths[case.signature] = write_case(smaller, Path(self.opts.out), keep_shorter=True)

    # ---- progress, signals, shutdown -------------------------------------------------------------
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
                slot.retire()
        if self.stop and self.stop not in ("enough failures",):
            for executor in list(self.executors):
                executor.shutdown()
        for t in self.threads:
            t.join(timeout=max(1.0, self.deadline + self.opts.minimize_s + 10 - time.monotonic()))
        if self.progress is not None and self.progress.isatty():
            self.progress.write("\n")
        shutil.rmtree(self.log_dir, ignore_errors=True)

    def _summarize(self) -> Summary:
        s = self.summary
        s.elapsed_s = time.monotonic() - self.start
        s.interrupted = self.stop if self.stop in ("SIGTERM", "SIGINT") else None
        for slot in self.slots:
            s.ops += slot.counted["ops"]
            s.sequences += slot.counted["sequences"]
            s.contract_ops += slot.counted["contract_ops"]
            for stats in slot.kept:
                s.launches += stats.get("launches", 0)
                s.elements += stats.get("elements", 0)
                for key in ("by_kind", "by_scenario", "hostile"):
                    mine = getattr(s, key)
                    for k, v in stats.get(key, {}).items():
                        mine[k] = mine.get(k, 0) + v
        s.cases = list(self.cases.values())
        s.paths = [self.paths[c.signature] for c in s.cases]
        s.health = self._health()
        s.steady_ops_per_s = self._steady_rate()
        return s

    def _steady_rate(self) -> float | None:
        """Ops per second of the workers' timed part: from each worker's end of warm-up to
        its last report (None when no worker got that far)."""
        spans = [(st["steady"], st["now"]) for slot in self.slots for st in slot.kept if st.get("steady")]
        if not spans:
            return None
        start = min(t for (t, _), _ in spans)
        end = max(t for _, (t, _) in spans)
        ops = sum(now_ops - ops0 for (_, ops0), (_, now_ops) in spans)
        return ops / (end - start) if end > start else None

    def _health(self) -> list[str]:
        """A run without failures is clean only if it exercised what the kernel set has."""
        s = self.summary
        if s.ops == 0:
            return ["the campaign ran no ops (a budget too short to finish one?)"]
        if s.faults or s.cases or s.interrupted or self.opts.max_sequences is not None:
            return []  # cut short on purpose, or the counts of a dead worker are partial
        if s.ops < HEALTHY_OPS or s.sequences < 10:
            return []  # too short a run for a missing kind to mean anything (each is >= 1% of ops)
        has = {fn for slot in self.slots if slot.hello for fn in slot.hello.get("has", ())}
        if self.opts.scale == "production":
            expected = {"p_read_table", "p_alloc_bind", "p_free_unbind"}
        else:
            expected = {"alloc", "free", "read_table", "k_bind", "k_alloc_bind", "k_free_unbind"}
            if "build_kv_read_table_packed" in has:
                expected.add("read_table_packed")
        missing = sorted(expected - set(s.by_kind))
        if missing:
            return [f"no {', '.join(missing)} op ran although the kernel set provides it (a longer budget?)"]
        return []


def run_campaign(opts: CampaignOptions, progress=None, out=None) -> Summary:
    """Run a supervised campaign. ``progress``: where progress lines go (default: stderr)."""
    return Campaign(opts, progress=sys.stderr if progress is None else progress or None, out=out).run()
