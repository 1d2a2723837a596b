"""What a run concluded, as types every part of the engine shares: a leaf module.

``Signature`` (what a failure is, without values), ``Divergence`` (a runner's first
disagreement with the spec, raised in the process that ran the op), ``Fault`` (a child
that died or hung, as its parent saw it), ``Finding`` (a failure carried across a
process boundary: a divergence's JSON or a fault), ``Outcome`` (what one op did on one
side), ``RunStats`` and ``crash_field`` (the one name a crash gets, whichever runner saw
it). Both runners, the supervisor, the minimizer and case files import these from here,
and this module imports nothing of the engine, so no import circle can pass through it.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

END = "end"  # the signature's op kind for a divergence found by the final check


class CaseError(ValueError):
    """A case file (or a piece of one) that cannot be read (CLI exit code 2)."""


class SetupError(RuntimeError):
    """The requested backend, kernel set or allocator cannot be used here (CLI exit code 2)."""


@dataclass(frozen=True, order=True)
class Signature:
    """What a failure is, without values or addresses: the op kind, the oracle that saw
    it and the field it names. Two failures with one signature are one case."""

    op: str
    oracle: str
    field: str

    def __str__(self) -> str:
        return f"{self.op}/{self.oracle}/{self.field}"

    def slug(self) -> str:
        """The form used in file names."""
        return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in f"{self.op}-{self.oracle}-{self.field}")

    def to_json(self) -> dict:
        return {"op": self.op, "oracle": self.oracle, "field": self.field}

    @classmethod
    def from_json(cls, data) -> Signature:
        if not isinstance(data, dict) or set(data) != {"op", "oracle", "field"} or not all(
                isinstance(v, str) for v in data.values()):
            raise CaseError(f"a signature is {{op, oracle, field}} strings, got {data!r}")
        return cls(data["op"], data["oracle"], data["field"])

    @classmethod
    def parse(cls, text: str) -> Signature:
        """``OP/ORACLE/FIELD`` (the field may itself contain slashes)."""
        parts = text.strip().split("/", 2)
        if len(parts) != 3 or not all(parts):
            raise CaseError(f"a signature is OP/ORACLE/FIELD, got {text!r}")
        return cls(*parts)


# ---- divergences: found in the process that ran the op ------------------------------------


@dataclass
class Divergence(Exception):
    step: int
    op: object | None  # an ops.Op; None: the final state check after the last op
    oracle: str
    field: str
    spec: object = None
    target: object = None
    message: str = ""
    refusal: str | None = None  # the spec's ContractViolation, when it refused this op

    @property
    def kind(self) -> str:
        return END if self.op is None else self.op.kind

    @property
    def signature(self) -> Signature:
        return Signature(self.kind, self.oracle, self.field)

    def __str__(self) -> str:
        return (f"step {self.step} {self.kind}: {self.oracle}/{self.field}: {self.message} "
                f"(spec {_short(self.spec)}, target {_short(self.target)})")

    def to_json(self) -> dict:
        data = {"step": self.step, "op": {"op": END} if self.op is None else self.op.to_json(),
                "oracle": self.oracle, "field": self.field, "spec": _jsonable(self.spec),
                "target": _jsonable(self.target), "message": self.message}
        if self.refusal is not None:
            data["refusal"] = self.refusal
        return data


def _short(v, limit=160) -> str:
    s = repr(v)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _jsonable(v):
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return repr(v)


@dataclass
class Outcome:
    """What one op did on one side."""

    result: object = None
    error: Exception | None = None  # the ContractViolation the side raised
    crash: BaseException | None = None


@dataclass
class RunStats:
    ops: int = 0
    contract_ops: int = 0
    by_kind: dict = field(default_factory=dict)
    hostile: dict = field(default_factory=dict)  # probes run, by hostile class

    def count(self, kind: str) -> None:
        self.ops += 1
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1

    def merge(self, other: RunStats) -> None:
        self.ops += other.ops
        self.contract_ops += other.contract_ops
        for mine, theirs in ((self.by_kind, other.by_kind), (self.hostile, other.hostile)):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0) + v


# ---- crashes: one name whoever saw them -------------------------------------------------------

CUDA_ERRORS = (  # the sticky CUDA errors by the words of their message
    ("illegal memory access", "cuda-illegal-address"),
    ("device-side assert", "cuda-device-assert"),
    ("misaligned address", "cuda-misaligned-address"),
    ("illegal instruction", "cuda-illegal-instruction"),
    ("unspecified launch failure", "cuda-launch-failure"),
    ("an illegal", "cuda-illegal"),
)


def is_cuda_error(exc: BaseException) -> bool:
    """A sticky CUDA error, however it surfaced: torch's (``CUDA error: ...``), the driver's
    name for it, or Triton's launcher (``Triton Error [CUDA]: ...``, with CUDA_LAUNCH_BLOCKING)."""
    text = str(exc)
    return (type(exc).__name__ == "AcceleratorError" or "CUDA error" in text or "cudaError" in text
            or "Error [CUDA]" in text)


COMPILE_ERRORS = ("CompilationError", "PTXASError")  # Triton's, raised when a launch compiles


def is_compile_error(exc: BaseException) -> bool:
    """A Triton kernel that did not compile at this launch's specialization: the frontend's
    CompilationError (and its subclasses), ptxas, or an MLIR pass failure. Matched by class
    name and module, so this leaf imports no Triton."""
    if any(c.__name__ in COMPILE_ERRORS and c.__module__.startswith("triton") for c in type(exc).__mro__):
        return True
    return isinstance(exc, RuntimeError) and "PassManager::run failed" in str(exc)


def crash_field(exc: BaseException) -> str:
    """The signature field of a crash: the CUDA error's name, ``compile-error`` for a kernel
    that did not compile at that input (``is_compile_error``), else the exception type."""
    if is_cuda_error(exc):
        text = str(exc).lower()
        return next((name for words, name in CUDA_ERRORS if words in text), "cuda-error")
    if is_compile_error(exc):
        return "compile-error"
    return type(exc).__name__


def crash(step: int, op, exc: BaseException, message: str, spec=None) -> Divergence:
    """The divergence of an op whose target raised ``exc`` (or whose device faulted)."""
    return Divergence(step, op, "crash", crash_field(exc), spec, repr(exc), message)


def surfaced(step: int, op, exc: BaseException) -> Divergence | None:
    """The crash of an op at which a sticky CUDA error surfaced in the harness's own code (the
    next touch of device memory after a kernel faulted raises it), or None for any other error."""
    if not is_cuda_error(exc):
        return None
    return crash(step, op, exc, f"a CUDA error surfaced at this op (launches are asynchronous: the fault may be "
                                f"an earlier op's): {exc}")


def poisoned(failure) -> bool:
    """Whether a failure (divergence or finding) left its process's CUDA context unusable."""
    return failure is not None and failure.signature.oracle == "crash" and failure.signature.field.startswith("cuda")


def unrun_notes(run) -> list[str]:
    """A runner's notes of ops that could not run (``unrun_kind``): a run that passed with any is
    no verdict (a far table with no room on a shared GPU passed, and a replay said PASS)."""
    return [n for n in getattr(run, "notes", ()) if unrun_kind(n) is not None]


def unrun_kind(note: str) -> str | None:
    """The op kind of a runner's note ``step I KIND: not applicable: WHY`` (an op counted as
    run that could not run), None for any other note."""
    head, sep, rest = note.partition(": ")
    words = head.split(" ")
    if not sep or len(words) != 3 or words[0] != "step" or not rest.startswith("not applicable"):
        return None
    return words[2]


# ---- faults and findings: across a process boundary ------------------------------------------------


@dataclass
class Fault:
    """A child that died or hung: what the parent saw."""

    kind: str  # "crash" or "timeout"
    reason: str  # SIGSEGV, exit-1, cuda-illegal-address, no-progress, ...
    message: str
    exitcode: int | None = None
    stderr: list = field(default_factory=list)
    stack: list = field(default_factory=list)  # a hang's main-thread frames, innermost first (stacks.py)

    def to_json(self) -> dict:
        return {"kind": self.kind, "reason": self.reason, "message": self.message, "exitcode": self.exitcode,
                "stderr_tail": list(self.stderr), **({"stack": list(self.stack)} if self.stack else {})}


def never_again(reproduced: dict | None) -> bool:
    """A rate (``{"k", "n"}``, a case's ``reproduced``) of replays none of which failed again: the case
    is kept as found, evidence only (a rare race, or a loaded host's stall)."""
    r = reproduced or {}
    return bool(r.get("n")) and not r.get("k")


EXIT_DEVICE = 76  # a child whose device error surfaced outside any op (it prints the traceback first)


def describe_exit(exitcode: int | None) -> tuple[str, str]:
    """(reason, message) for a child's exit code."""
    if exitcode == EXIT_DEVICE:
        return "cuda-error", "a CUDA error surfaced outside any op (the device faulted asynchronously): the child left"
    if exitcode is not None and exitcode < 0:
        try:
            sig = signal.Signals(-exitcode)
            return sig.name, f"killed by signal {sig.name} ({signal.strsignal(sig) or sig.name})"
        except ValueError:
            return f"signal-{-exitcode}", f"killed by signal {-exitcode}"
    return f"exit-{exitcode}", f"exited with status {exitcode} without reporting"


@dataclass
class Finding:
    """A failure reported across a process boundary: a divergence (its JSON) or a fault.
    Quacks like ``Divergence`` where the minimizer and case files need it."""

    signature: Signature
    step: int
    divergence: dict
    fault: Fault | None = None

    def to_json(self) -> dict:
        return self.divergence

    @classmethod
    def of_fault(cls, fault: Fault, ops: list, step: int) -> Finding:
        """The finding of a child that died while running ``ops[step]`` (``step`` -1: before
        any op, e.g. while setting up)."""
        op = ops[step] if 0 <= step < len(ops) else None
        kind = op.kind if op is not None else "setup"
        divergence = {"step": step, "op": op.to_json() if op is not None else {"op": kind}, "oracle": fault.kind,
                      "field": fault.reason, "spec": None, "target": None, "message": fault.message}
        return cls(Signature(kind, fault.kind, fault.reason), step, divergence, fault)

    @classmethod
    def of_divergence(cls, data: dict) -> Finding:
        return cls(Signature(data["op"]["op"], data["oracle"], data["field"]), data["step"], data)

    def __str__(self) -> str:
        return f"step {self.step} {self.signature}: {self.divergence.get('message', '')}"
