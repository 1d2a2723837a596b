"""Child processes that may die, and the parent that outlives them.

Everything that runs a kernel set runs in a child (forked from a server that has imported
torch and Triton but no kernel set, or spawned: ``zygote``; a fresh CUDA context either
way): a segfault under the interpreter, a CUDA fault that poisons the context, a kernel
that never returns, or an exception that escapes the harness ends the child, never the
campaign. The parent never imports the kernel set.

A child shares a heartbeat with its parent (a few int64 slots it writes and the parent
reads without locks): which sequence it is on, the seed, the index of the op it is
running. From that the parent knows, when a child dies or stops making progress for
``op_timeout`` seconds, which op did it, and can rebuild the ops from the seed (the op
stream depends on the spec alone). The child's stderr goes to a log file whose last
lines go into the case.

``Child`` is the process; ``Executor`` a child that replays op lists on request (for
the minimizer, ``kvfuzz replay`` and the confirmation of crash cases) and comes back as
a fresh process after a fault.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path

from . import stacks, zygote
from .ops import Op
from .procfs import exit_status, exiting, waited_for_cpu
from .verdict import EXIT_DEVICE, Fault, Finding, describe_exit

__all__ = ["EXIT_DEVICE", "Beat", "Cancelled", "Child", "Executor", "Fault", "Finding", "HarnessFailed", "NotRun",
           "SetupFailed", "describe_exit"]

CTX = zygote.SPAWN  # the shared objects (heartbeat, pipes, queues); either kind of child takes them

# Heartbeat slots. LAUNCH_MS: milliseconds spent inside compiled Triton launches (a compile, a
# load from the disk cache, a wait for the head start's compile), which an op's clock leaves out.
# HEARD: set by the parent once it has the worker's hello (the worker waits for it before its
# first sequence: a hello still in the queue's feeder thread dies with a worker that crashes at once).
SEQ, SEED, OP, OPS, SEQS, CONTRACT, PHASE, LAUNCH_MS, HEARD = range(9)
SLOTS = 9
# PHASE: importing / running ops / between jobs / running ops, inside a compiled launch
SETUP, RUNNING, IDLE, LAUNCHING = 0, 1, 2, 3

EXIT_RESTART = 75  # a child that found its CUDA context poisoned and asks to be replaced
EXIT_HARNESS = 3  # an exception of the harness itself (not of the code under test)
# A child found inside its own exit when its op timed out (a kernel set's os._exit: on a GPU shared by
# many processes the driver's teardown of its CUDA context can take seconds) is given this long to
# finish: its exit status is the case's signature, not a hang.
EXIT_WAIT_S = 30.0


class Beat:
    """The child's side of the heartbeat."""

    def __init__(self, slots):
        self.slots = slots

    def sequence(self, k: int, seed: int) -> None:
        self.slots[SEQ], self.slots[SEED], self.slots[OP] = k, seed, -1
        self.slots[SEQS] += 1
        self.slots[PHASE] = RUNNING

    def op(self, i: int) -> None:
        self.slots[OP] = i
        self.slots[OPS] += 1

    def phase(self, phase: int) -> None:
        self.slots[PHASE] = phase

    def launching(self) -> float:
        """A compiled launch begins: while it runs (it may compile for seconds) the op's clock
        waits (``Child.stalled``). Returns its start, for ``launched``."""
        if self.slots[PHASE] == RUNNING:
            self.slots[PHASE] = LAUNCHING
        return time.perf_counter()

    def launched(self, t0: float) -> None:
        self.slots[LAUNCH_MS] += int((time.perf_counter() - t0) * 1000)
        if self.slots[PHASE] == LAUNCHING:
            self.slots[PHASE] = RUNNING


def tail(path: Path, lines: int = 40, end: int | None = None) -> list[str]:
    """The last ``lines`` non-blank lines of a log (of its first ``end`` bytes, when given)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            end = f.tell() if end is None else min(end, f.tell())
            f.seek(max(0, end - 16384))
            text = f.read(end - max(0, end - 16384)).decode(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-lines:]


class Child:
    """One supervised process running ``entry`` (``"module:function"``) with ``args``;
    the function gets a ``Beat`` first. ``gpu``: the one GPU it may see."""

    def __init__(self, entry: str, args: tuple, *, log_dir: Path, gpu: str | None = None, env: dict | None = None):
        self.slots = CTX.Array("q", SLOTS, lock=False)
        fd, log = tempfile.mkstemp(prefix="child-", suffix=".log", dir=log_dir)
        os.close(fd)
        self.log = Path(log)
        extra = {**({"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else {}), **(env or {})}
        self.proc = zygote.start(_child_entry, (entry, args, self.slots, str(self.log)), extra_env=extra,
                                 interpret=_interprets(args, {**os.environ, **extra}))
        self._seen = None
        self._waited = 0.0  # seconds the child sat runnable without a core, as last read (_clock)
        self._since = self._clock()
        self._launched = 0  # LAUNCH_MS when the current op was first seen
        self.longest = 0.0  # the longest an op ran (between two heartbeats while running ops)
        self.stack: list[str] = []  # a hung child's main-thread frames, innermost first (kill_hung)
        self.exited = False  # it timed out while exiting on its own, and ended (kill_hung): a crash
        self._dumped_at: int | None = None  # its log's size before the dump

    def alive(self) -> bool:
        return self.proc.is_alive()

    def progress(self) -> tuple:
        """What changes when the child gets on: its sequence, op, op count and phase (a launch
        within an op is not progress)."""
        phase = self.slots[PHASE]
        return tuple(self.slots[i] for i in (SEQ, OP, OPS)) + (RUNNING if phase == LAUNCHING else phase,)

    def _clock(self) -> float:
        """Seconds of wall time the child could have used: a machine so loaded that the child
        sat runnable, waiting for a core, does not make a slow op look like a hang."""
        self._waited = max(self._waited, waited_for_cpu(self.proc.pid))  # a child gone: the last read stands
        return time.monotonic() - self._waited

    def _op_seconds(self, now: float) -> float:
        """Seconds since the current op was first seen, less those it spent inside compiled
        launches (a compile is not the op's work: an op-timeout of a second must not call a
        cold compile a hang)."""
        return now - self._since - (self.slots[LAUNCH_MS] - self._launched) / 1000

    def stalled(self, timeout: float) -> bool:
        """No op started or finished for ``timeout`` seconds while running ops (setting up:
        importing the kernel set and its smoke test, which may compile: 4x as long, at least
        120 s, its compiled launches left out; a sequence begun and its op 0 not yet, its
        runner being built: as long as setting up, so that an import on a loaded host is no
        op of the case's; inside a compiled launch, which may compile or wait for one: as long
        as setting up). The
        seconds are the child's own clock (``_clock``): a child that sleeps or blocks (a
        hang) is timed as before; one starved of CPU by other processes is not charged for
        the time it waited, nor an op for its launches' compiles."""
        now, seen = self._clock(), self.progress()
        if seen != self._seen:
            if self._seen is not None and self._seen[3] == RUNNING:
                self.longest = max(self.longest, self._op_seconds(now))
            self._seen, self._since, self._launched = seen, now, self.slots[LAUNCH_MS]
            return False
        phase, setting_up = self.slots[PHASE], max(4 * timeout, 120.0)
        # setting up: the worker's (its launches, the smoke test's compiles and a head start's waits, left
        # out as an op's are), or a sequence's own before its op 0 (its runner, pools, buffers)
        if phase == SETUP or phase == RUNNING and self.slots[OP] < 0:
            return self._op_seconds(now) > setting_up
        if phase == RUNNING:
            return self._op_seconds(now) > timeout
        return phase == LAUNCHING and now - self._since > setting_up

    def running_for(self) -> float:
        """Seconds the current op has run (0 when the child is not running ops), on its own clock."""
        running = self.slots[PHASE] in (RUNNING, LAUNCHING) and self.alive()
        return self._op_seconds(self._clock()) if running else 0.0

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=10)

    def kill_hung(self) -> None:
        """Kill a child that made no progress, its Python stacks asked for first (``stacks``);
        a child inside its own exit (``exiting``) is waited for instead (``EXIT_WAIT_S``): it
        ended as a crash would, its exit status the fault's (read from the kernel where its
        teardown outlasts the wait: ``exit_status``)."""
        if self.proc.is_alive() and exiting(self.proc.pid):
            self.proc.join(timeout=EXIT_WAIT_S)
            if not self.proc.is_alive() or exit_status(self.proc.pid) is not None:
                self.exited = True
                return
        if self.proc.is_alive():
            self.stack, self._dumped_at = stacks.dump(self.proc.pid, self.log)
        self.kill()

    def stop(self, grace: float = 2.0) -> None:
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout=grace)
        self.kill()

    def fault(self, timed_out: bool = False, timeout: float = 0.0) -> Fault:
        if timed_out and not self.exited:
            place = stacks.where(self.stack)
            return Fault("timeout", "no-progress", f"no progress for {timeout:g} s (op-timeout): killed"
                         + (f" in {place}" if place else ""), None, tail(self.log, end=self._dumped_at),
                         list(self.stack))
        self.proc.join(timeout=5)
        code = self.proc.exitcode
        if code is None:  # ended but not yet reaped (its teardown slow): the status its kernel holds
            code = exit_status(self.proc.pid)
        reason, message = describe_exit(code)
        return Fault("crash", reason, message, code, tail(self.log))

    def close(self) -> None:
        self.stop()
        try:
            self.log.unlink()
        except OSError:
            pass


def _interprets(args: tuple, environ: dict) -> bool:
    """Whether the child runs Triton's interpreter: its environment says so, or it builds an
    interpret tier (a ``TierSpec`` or campaign options among its arguments), whose
    ``select_backend`` sets ``TRITON_INTERPRET=1`` in the child."""
    return environ.get("TRITON_INTERPRET") == "1" or any(getattr(a, "backend", None) == "interpret" for a in args)


def _child_entry(entry: str, args: tuple, slots, log: str) -> None:
    # Runs first in the child, its environment already the parent's (zygote), before a
    # kernel set is imported.
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when a campaign ends
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    # Both streams to the log: a child reports through its queue or pipe only, so whatever a
    # kernel set prints (progress, debug dumps, partial lines) can neither garble the
    # parent's output nor pass for it; its last lines go into a fault's case.
    os.dup2(fd, 2)
    os.dup2(fd, 1)
    import faulthandler
    import importlib
    import sys

    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115 - lives as long as the process
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    faulthandler.enable(sys.stderr)
    stacks.arm(sys.stderr)  # a hang's stacks, when the parent asks before it kills the child
    module, name = entry.split(":")
    try:
        getattr(importlib.import_module(module), name)(Beat(slots), *args)
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - the engine's own bug: say where, exit 3 (never taken for a fault)
        import traceback

        from .verdict import is_cuda_error

        traceback.print_exc()
        sys.stderr.flush()
        sys.exit(EXIT_DEVICE if is_cuda_error(exc) else EXIT_HARNESS)  # a device error is a fault, never exit 3


class Executor:
    """A child that replays op lists on request (``run``), answering each with the
    failure it saw (a ``Finding``) or None. A fault or a hang is an answer too; the next
    request then starts a fresh child."""

    def __init__(self, tier_spec, *, op_timeout: float, log_dir: Path, gpu: str | None = None,
                 launch_blocking: bool = True, env: dict | None = None):
        self.tier_spec, self.op_timeout, self.log_dir, self.gpu = tier_spec, op_timeout, log_dir, gpu
        self.env = {**(env or {}), **({"CUDA_LAUNCH_BLOCKING": "1"} if launch_blocking else {})}
        self.child: Child | None = None
        self.conn = None
        self.closed = False  # for good (shutdown): a job in flight ends with Cancelled
        self.notes: dict = {}  # what the child said besides the verdict (e.g. knobs it dropped)
        self.used = False  # the current child has been sent a job (a child that ran none is fresh)
        self._standby: list[tuple] = []  # (child, conn): fresh children started ahead of the jobs that need one
        self._depth = 0  # how many to keep started (standby()); 0: none
        self._ahead: int | None = None  # how many more may be started ahead (None: no end)
        self._retiring: list[tuple] = []  # children told to stop, not yet waited for (close() does)
        self.children = 0  # children started (standbys included): what a confirmation cost, counted
        self.jobs = 0  # replays sent

    def _new_child(self) -> tuple:
        parent_end, child_end = CTX.Pipe()
        self.children += 1
        child = Child("fuzz.engine.worker:executor_main", (self.tier_spec, child_end), log_dir=self.log_dir,
                      gpu=self.gpu, env=self.env)
        child_end.close()
        return child, parent_end

    def _start(self) -> None:
        standby = None
        while self._standby and standby is None:
            standby = self._standby.pop(0)
            if not standby[0].alive():  # it died waiting (its set-up failed): the next, or start again
                _close_child(*standby)
                standby = None
        self.child, self.conn = standby or self._new_child()
        self.used = False
        self._replenish()

    def prestart(self) -> None:
        """Start the child now, to wait idle with its kernel set loaded: the first job it gets
        (a campaign's first confirmation) skips the start-up, and still runs in a fresh process."""
        if self.child is None:
            self._start()

    def ready(self) -> bool:
        """Its child is set up and has run no job (a fresh process, waiting): a job sent now starts at once."""
        child = self.child
        return child is not None and not self.used and child.alive() and child.slots[PHASE] == IDLE

    def standby(self, fresh: int | None = None, depth: int = 1) -> None:
        """From now on, keep ``depth`` fresh children started beside the current one, for the
        next ``fresh`` jobs that must run in a fresh process (None: every one): the first replay
        of a minimized case's rate, and every replay after a fault (a crash case's replays each
        kill their child). On a GPU a child's set-up (CUDA context, kernel set, smoke test) takes
        about a second, which the replays before it then hide, and ``depth`` children set up side
        by side, not one after the other; the price is idle children, closed with the executor.
        Children already started beyond ``fresh`` are closed (nothing would use them)."""
        self._depth = max(1, depth)
        if fresh is not None:
            while len(self._standby) > fresh:
                _close_child(*self._standby.pop())
        self._ahead = None if fresh is None else fresh - len(self._standby)
        self._replenish()

    def _replenish(self) -> None:
        while len(self._standby) < self._depth and self._ahead != 0 and not self.closed:
            self._standby.append(self._new_child())
            if self._ahead is not None:
                self._ahead -= 1

    def run(self, config, ops: list[Op], knobs: dict | None = None, mode: dict | None = None,
            deadline: float | None = None, strict_knobs: bool = True, history: list | None = None,
            fresh: bool = False) -> Finding | None:
        """The failure of ``ops`` from a fresh pool, or None. ``mode``: the run options a case
        records (hostile, check_every, program_order, order_seed); ``history``: sequences
        (``{"config", "ops", "knobs", "seed"}`` JSON) the same process runs first, their
        failures ignored, for a fault that needs what came before it; ``fresh``: in a new
        process (no history of earlier jobs). Raises ``SetupFailed`` when the child cannot
        build its tier, ``TimeoutError`` past ``deadline`` (monotonic), ``NotRun`` when the
        replay could not run (neither a pass nor a failure). A job that met a device error
        outside its ops in a process that ran earlier jobs (their poison, not its own) is run
        again once, in a fresh process."""
        job = {"config": config.to_json(), "ops": [op.to_json() for op in ops], "knobs": knobs,
               "mode": dict(mode or {}), "strict_knobs": strict_knobs, "history": list(history or [])}
        for attempt in range(2):
            try:
                return self._run(job, ops, deadline, fresh or attempt > 0)
            except _Poisoned as exc:
                text, reused = exc.args
                if not reused or attempt:
                    raise NotRun(f"the device faulted outside the replay's ops in a fresh process: {text}") from None
        raise AssertionError("unreachable")

    def _run(self, job: dict, ops: list[Op], deadline: float | None, fresh: bool) -> Finding | None:
        if self.closed:
            raise Cancelled("the executor was closed")
        if fresh and self.used:
            self._retire()
        if self.child is None or not self.child.alive():
            self._start()
        conn = self.conn  # shutdown() from another thread may close it under this one
        try:
            if conn is None or self.closed:
                raise Cancelled("the executor was closed")
            conn.send(job)
        except (OSError, ValueError):
            if self.closed:
                raise Cancelled("the executor was closed while a job was sent") from None
            raise
        self.jobs += 1
        self.used = True
        while True:
            conn, child = self.conn, self.child
            if conn is None or child is None:
                raise Cancelled("the executor was closed while it ran a job")
            if conn.poll(0.05):
                try:
                    kind, payload = conn.recv()
                except (EOFError, OSError):
                    if self.closed:
                        raise Cancelled("the executor was closed while it ran a job") from None
                    return self._fault(child, ops, False)
                if kind == "setup":
                    self._retire()
                    raise SetupFailed(payload)
                if kind == "harness":
                    self._retire()
                    raise HarnessFailed(payload)
                if kind == "poisoned":
                    self._retire()
                    raise _Poisoned(*payload)
                if kind == "unknown":
                    why, exiting = payload
                    if exiting:  # its device faulted: it is leaving
                        self._retire()
                    raise NotRun(why)
                verdict, self.notes = payload
                if self.notes.get("exiting"):  # its device faulted: it is leaving, the next job starts a fresh one
                    self._retire()
                return None if verdict is None else Finding.of_divergence(verdict)
            if not child.alive():
                if self.closed:
                    raise Cancelled("the executor was closed while it ran a job")
                return self._fault(child, ops, False)
            if child.stalled(self.op_timeout):
                return self._fault(child, ops, True)
            if deadline is not None and time.monotonic() > deadline:
                self._retire()
                raise TimeoutError("the replay outlived its deadline")

    def _fault(self, child: Child, ops: list[Op], timed_out: bool) -> Finding:
        step = child.slots[OP] if child.slots[SEQ] >= 0 else -1  # SEQ < 0: in the history, not the case
        if timed_out:
            child.kill_hung()
        fault = child.fault(timed_out, self.op_timeout)
        if fault.exitcode == EXIT_HARNESS:
            self._retire()
            raise HarnessFailed("\n".join(fault.stderr))
        self._retire()
        return Finding.of_fault(fault, ops, step)

    def _retire(self) -> None:
        """Stop the current child (the next job starts a fresh one: the standby, if started).
        It is told to stop and waited for later (``close``): the next job does not wait for a
        process to end (on a GPU, its CUDA context torn down: a tenth of a second or more)."""
        child, conn = self.child, self.conn
        self.child = self.conn = None
        if conn is not None:
            conn.close()
        if child is not None:
            if child.alive():
                child.proc.terminate()
            self._retiring.append((child, None))
        still = []
        for retired in self._retiring:  # those already ended are reaped now
            if retired[0].alive():
                still.append(retired)
            else:
                _close_child(*retired)
        self._retiring = still

    def release(self) -> None:
        """Stop its children without waiting for them (``close`` does): it is not needed any more."""
        self._retire()
        standby, self._standby = self._standby, []
        for child, conn in standby:
            conn.close()
            child.proc.terminate()
            self._retiring.append((child, None))

    def close(self) -> None:
        """Stop the current child and the standbys; wait for every child it stopped."""
        self._retire()
        standby, self._standby = self._standby, []
        for child, conn in standby + self._retiring:
            _close_child(child, conn)
        self._retiring = []

    def shutdown(self) -> None:
        """Close for good, from another thread too: a job in flight raises Cancelled."""
        self.closed = True
        self.close()


def _close_child(child, conn) -> None:
    if child is not None:
        child.close()
    if conn is not None:
        conn.close()


class Cancelled(RuntimeError):
    """The executor was shut down while a job ran (the campaign is ending)."""


class NotRun(RuntimeError):
    """A replay that could not run (an op not applicable here: memory, no GPU; a history that
    faulted the device; a device error before its first op): neither a pass nor a failure."""


class _Poisoned(RuntimeError):
    """The child met a device error outside any op: (text, whether it had run earlier jobs)."""


class SetupFailed(RuntimeError):
    """A child could not build its tier (a setup error: exit 2)."""


class HarnessFailed(RuntimeError):
    """An exception of the harness itself in a child (exit 3)."""


def visible_gpus() -> list[str | None]:
    """The GPUs this host lets us use, as CUDA_VISIBLE_DEVICES entries. Counted by the CUDA
    driver itself (``cuDeviceGetCount``: milliseconds, no context), not by importing torch in
    the parent: that import was 3-4 s of a GPU campaign's start before its first worker (H200,
    torch 2.11), most of the time to a first case on a warm cache. torch only where the driver
    library cannot be loaded."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [x.strip() for x in listed.split(",") if x.strip()] or [None]
    count = _driver_device_count()
    if count is None:
        import torch

        count = torch.cuda.device_count()
    return [str(i) for i in range(count)] or [None]


def _driver_device_count() -> int | None:
    """CUDA's device count from ``libcuda`` (the order and the count CUDA_VISIBLE_DEVICES
    indices refer to), or None where the library or its answer is not to be had."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    n = ctypes.c_int(0)
    status = cuda.cuInit(0)
    if status != 0:
        return 0 if status == 100 else None  # CUDA_ERROR_NO_DEVICE: a driver and no GPU
    if cuda.cuDeviceGetCount(ctypes.byref(n)) != 0:
        return None
    return n.value
