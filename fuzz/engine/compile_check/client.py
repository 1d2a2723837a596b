"""The worker's side of the compile child, and ``CompileRun``: the compile track's runner.

One child per kernel set and process (a worker, an executor), started on first use with
``TRITON_INTERPRET`` removed from its environment, so under the interpreter tier the set is
imported a second time as real ``JITFunction`` s. A request that outlives
``KVFUZZ_COMPILE_TIMEOUT`` seconds (default 100) kills the child; a child that dies is
restarted for the next request. While the worker waits for the compiler its heartbeat says
"setting up" (``supervise.SETUP``), so a compile is timed by that limit, not by the op
timeout meant for kernels that hang.

``CompileRun.step(op)`` compiles one ``c_compile`` op and raises a ``Divergence`` when it
does not compile (oracle ``compile``), when the compiler dies (``compile`` too: the message
says by which signal) or hangs (``timeout``). A failed screen (several names in its spec)
is narrowed first: to the base if that fails too (a kernel that never compiles), else to
the first of its names that fails alone, and that is the op of the divergence, so the case
reads "kernel K does not compile when n == 1".
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..supervise import RUNNING, SETUP
from ..tiers import SetupError
from ..verdict import Divergence, RunStats
from .ops import CompileOp


def timeout_s() -> float:
    """``KVFUZZ_COMPILE_TIMEOUT`` (default 100 s, under the 120 s a setting-up child gets), read
    when used: this module may be imported by a fork server long before the child that uses it."""
    return float(os.environ.get("KVFUZZ_COMPILE_TIMEOUT", "100"))
_ROOT = Path(__file__).resolve().parents[3]  # the folder holding the fuzz package


class Died(Exception):
    """The compile child died (or was killed after a timeout) while answering."""

    def __init__(self, reason: str, message: str, timed_out: bool = False):
        super().__init__(message)
        self.reason, self.timed_out = reason, timed_out


def kernels_ref(tier) -> str:
    """The tier's kernel set as the child should load it: a file by its absolute path."""
    return resolve_kernels(tier.kernels_name)


def resolve_kernels(name: str) -> str:
    """A kernel set's name as another process (another working directory) loads it."""
    if name.endswith(".py") or os.sep in name:
        return str(Path(name).resolve())
    return name


class CompileChild:
    def __init__(self, kernels: str):
        self.kernels = kernels
        self.proc: subprocess.Popen | None = None
        self.fd: int | None = None
        self.buffer = b""

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["PYTHONPATH"] = os.pathsep.join([str(_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        read, write = os.pipe()
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "fuzz.engine.compile_check.child", str(write)],
                                         stdin=subprocess.PIPE, stdout=2, pass_fds=(write,),
                                         env=env)
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        self.fd, self.buffer = read, b""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def request(self, payload: dict, timeout: float | None = None) -> dict:
        """The child's answer to ``payload``; ``Died`` when it dies or outlives ``timeout``
        (default ``timeout_s()``), after which the next request starts a fresh child."""
        timeout = timeout_s() if timeout is None else timeout
        if not self.alive():
            self.close()
            self.start()
        try:
            self.proc.stdin.write((json.dumps(payload) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return self._died(False)
        end = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = end - time.monotonic()
            if left <= 0:
                return self._died(True, timeout)
            ready, _, _ = select.select([self.fd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(self.fd, 1 << 16)
                if not chunk:
                    return self._died(False)
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        answer = json.loads(line)
        if "harness" in answer:
            raise RuntimeError(f"the compile child failed: {answer['harness']}")
        return answer

    def _died(self, timed_out: bool, timeout: float = 0.0):
        proc = self.proc
        if timed_out:
            proc.kill()
        try:
            code = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        self.close()
        if timed_out:
            raise Died("timeout", f"the compiler did not finish in {timeout:g} s (KVFUZZ_COMPILE_TIMEOUT): killed", True)
        if code is not None and code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
            raise Died(name, f"the compiler process was killed by {name}")
        raise Died(f"exit-{code}", f"the compiler process exited with status {code} without answering")

    def close(self) -> None:
        proc, fd = self.proc, self.fd
        self.proc = self.fd = None
        if fd is not None:
            os.close(fd)
        if proc is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


_CHILDREN: dict[str, CompileChild] = {}


def child_for(kernels: str) -> CompileChild:
    if kernels not in _CHILDREN:
        if not _CHILDREN:
            atexit.register(close_all)
        _CHILDREN[kernels] = CompileChild(kernels)
    return _CHILDREN[kernels]


def close_all() -> None:
    for child in list(_CHILDREN.values()):
        child.close()
    _CHILDREN.clear()


class _Compiling:
    """The heartbeat says "setting up" while the worker waits for the compiler."""

    def __init__(self, beat):
        self.beat = beat

    def __enter__(self):
        if self.beat is not None:
            self.beat.phase(SETUP)

    def __exit__(self, *exc):
        if self.beat is not None:
            self.beat.phase(RUNNING)


def probe(tier, target: str, find=(), beat=None) -> list[str]:
    """Start the child, check this machine compiles for ``target`` (SetupError if not) and
    return which of the kernels in ``find`` ((qualname, file) pairs) it cannot find."""
    from .ops import parse_target

    with _Compiling(beat):
        try:
            answer = child_for(kernels_ref(tier)).request(
                {"op": "probe", "kernels": kernels_ref(tier), "target": list(parse_target(target)),
                 "find": [list(k) for k in find]})
        except Died as exc:
            raise SetupError(f"--scale compile: the compile child could not start: {exc}") from None
    if "setup" in answer:
        raise SetupError(f"--scale compile: {answer['setup']}")
    return answer.get("missing", [])


def compile_op(tier, op: CompileOp, beat=None) -> dict:
    """The child's answer for ``op`` (``ok``, or ``error`` and ``message``); a death or a hang
    as ``{"ok": False, "died": reason, ...}``."""
    signature, constexprs, attrs = op.concrete()
    payload = {"op": "compile", "kernels": kernels_ref(tier), "kernel": op.kernel, "file": op.file,
               "signature": signature, "constexprs": constexprs, "attrs": attrs,
               "options": op.option_values(), "target": list(op.target_tuple())}
    with _Compiling(beat):
        try:
            answer = child_for(kernels_ref(tier)).request(payload)
        except Died as exc:
            return {"ok": False, "died": exc.reason, "timed_out": exc.timed_out, "error": exc.reason,
                    "message": str(exc), "last": str(exc)}
    if "setup" in answer or "missing" in answer:
        raise SetupError(answer.get("setup") or answer["missing"])
    return answer


class CompileRun:
    """The runner of ``c_compile`` ops (``tracks.compile``): no pool, no state between ops."""

    def __init__(self, config, tier, *, beat=None, **_):
        self.config, self.tier, self.beat = config, tier, beat
        self.stats = RunStats()
        self.dropped_knobs: list[str] = []  # the compile track has no launch knobs
        self.i = 0
        self.compiled = 0  # ops the compiler ran (not cached)
        self.compile_s = 0.0

    def _compile(self, op: CompileOp) -> dict:
        answer = compile_op(self.tier, op, self.beat)
        if not answer.get("cached", True):
            self.compiled += 1
            self.compile_s += answer.get("seconds", 0.0)
        return answer

    def step(self, op: CompileOp) -> dict:
        i, self.i = self.i, self.i + 1
        if self.beat is not None:
            self.beat.op(i)
        self.stats.count(op.kind)
        answer = self._compile(op)
        if answer["ok"]:
            return answer
        for narrower in self._narrower(op):
            got = self._compile(narrower)
            if not got["ok"]:
                op, answer = narrower, got
                break
        if answer.get("timed_out"):
            raise Divergence(i, op, "timeout", op.label, f"compiles for {op.target}", answer["message"],
                             f"kernel {op.kernel} did not finish compiling for {op.target} {op.condition()}: "
                             f"{answer['message']}")
        what = f"the compiler died ({answer['died']})" if answer.get("died") else answer["error"]
        raise Divergence(i, op, "compile", op.label, f"compiles for {op.target}", f"{answer['error']}: {answer['last']}",
                         f"kernel {op.kernel} does not compile for {op.target} {op.condition()}: {what}: "
                         f"{answer['message']}")

    @staticmethod
    def _narrower(op: CompileOp):
        """What a failure is narrowed to, in order: the base (a kernel that does not compile
        at all fails there, not at ``n == 1``), then each name of a screen alone."""
        if op.spec == "base":
            return
        yield dataclasses.replace(op, spec="base")
        if len(op.names()) > 1:
            yield from (op.single(name) for name in op.names())

    def finish(self) -> None:
        pass
