"""GPU ground truth for host syncs (SPEC.md §5, oracle 5, third of three).

On a CUDA device a callable is run three times, each on fresh inputs:

1. warm-up on a side stream, no checks (Triton compiles, the caching allocator fills);
2. eager, under ``torch.cuda.set_sync_debug_mode("error")``: torch raises on every
   operation it instruments as synchronising (``memcpy_and_sync``: ``.item()``,
   ``.cpu()``, nonzero, blocking host→device copies; stream synchronisation);
3. captured into a CUDA graph (``torch.cuda.graph``): any synchronisation, including
   the ones the debug mode does not instrument (``torch.cuda.synchronize()`` is a
   ``cudaDeviceSynchronize``), is illegal while a stream captures, and fails capture.

Either failing is a finding: ``GpuVerdict.syncs`` is their OR, and both are recorded
so the calibration shows what each alone would have missed. A callable that fails for
another reason gets ``error`` and no verdict.

Everything imports without CUDA; the probes raise ``CudaUnavailable``. Kernels must be
compiled, not interpreted: ``run_truth`` runs the probes in worker processes with
``TRITON_INTERPRET`` removed from their environment, and restarts a worker whose CUDA
context a probe broke.

Entry points: ``probe`` (any callable and input factory), ``probe_snippet`` (a corpus
entry), ``probe_allocator`` (``DeviceAllocator``'s lazy free, eager free and read-table
builds on a kernel set), ``run_truth`` (the whole corpus plus the allocator, as JSON).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ..environment import environment

__all__ = [
    "ALLOCATOR_PROBES",
    "CudaUnavailable",
    "GpuVerdict",
    "cuda_available",
    "environment",
    "probe",
    "probe_allocator",
    "probe_snippet",
    "run_truth",
]

SCHEMA = 1


class CudaUnavailable(RuntimeError):
    pass


class ContextBroken(RuntimeError):
    """A probe left the CUDA context unusable; the worker must be replaced."""


@dataclass
class GpuVerdict:
    syncs: bool | None  # None when the callable could not be judged (see error)
    eager: str | None = None  # the sync-debug-mode error, if any
    capture: str | None = None  # the graph-capture error, if any
    error: str | None = None  # an unrelated failure (warm-up or eager raised something else)
    runtime_cuda: list[str] | None = None  # fuzz.sync.runtime events on CUDA tensors (informative)

    def to_json(self) -> dict:
        return asdict(self)


def cuda_available() -> bool:
    return torch.cuda.is_available()


def _require_cuda() -> None:
    if not cuda_available():
        raise CudaUnavailable("no CUDA device: the GPU ground truth needs one")


def _short(e: BaseException, limit: int = 300) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    first = " ".join(line.strip() for line in text[:3])
    return first if len(first) <= limit else first[: limit - 1] + "…"


def _is_sync_debug_error(e: BaseException) -> bool:
    return "synchroniz" in str(e).lower()


def _check_context() -> None:
    try:
        torch.cuda.synchronize()
    except Exception as e:  # a sticky error: nothing more can run in this process
        raise ContextBroken(_short(e)) from e


_STATE = {"dirty": False}  # set when this process can no longer be trusted to capture


def _capture(fn: Callable[[Any], Any], args: Any) -> str | None:
    """Capture fn(args) into a throw-away CUDA graph; the error text if capture failed.

    Done by hand rather than with ``torch.cuda.graph`` so that the current stream is
    restored and ``capture_end`` is attempted even when ``fn`` raised mid-capture.
    """
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    error = None
    with torch.cuda.stream(stream):
        graph.capture_begin()
        try:
            fn(args)
        except Exception as e:
            error = _short(e)
        try:
            graph.capture_end()
        except Exception as e:
            error = error or _short(e)
    torch.cuda.current_stream().wait_stream(stream)
    del graph
    return error


def _capture_still_works() -> bool:
    try:
        x = torch.zeros(8, device="cuda")
        torch.cuda.synchronize()
        return _capture(lambda t: t.add_(1), x) is None
    except Exception:
        return False


def probe(fn: Callable[[dict], Any], make: Callable[[], dict], *, runtime: bool = False) -> GpuVerdict:
    """Judge ``fn(make())`` on the current CUDA device: eager under sync debug mode, then captured."""
    _require_cuda()
    # 1. warm-up (compile kernels, prime allocator pools) on a side stream, as torch.cuda.graph advises
    try:
        args = make()
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn(args)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
    except Exception as e:
        _check_context()
        return GpuVerdict(None, error=f"warm-up failed: {_short(e)}")

    # 2. eager under set_sync_debug_mode("error")
    eager = None
    args = make()
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn(args)
    except Exception as e:
        if not _is_sync_debug_error(e):
            torch.cuda.set_sync_debug_mode(previous)
            _check_context()
            return GpuVerdict(None, error=f"eager run failed: {_short(e)}")
        eager = _short(e)
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    _check_context()

    # 3. graph capture: a sync is illegal while the stream captures
    args = make()
    torch.cuda.synchronize()
    capture = _capture(fn, args)
    _check_context()
    if capture is not None and not _capture_still_works():
        # a failed capture can leave the allocator routing to a dead graph pool; later
        # captures in this process would fail for that reason alone
        _STATE["dirty"] = True

    events = None
    if runtime:
        from .runtime import record_host_syncs

        args = make()
        torch.cuda.synchronize()
        with record_host_syncs(device="cuda") as recorded:
            try:
                fn(args)
            except Exception:
                pass
        events = [e.op for e in recorded]
        _check_context()
    return GpuVerdict(eager is not None or capture is not None, eager, capture, None, events)


def probe_snippet(snippet, *, runtime: bool = True) -> GpuVerdict:
    from .corpus import make_args

    fn = snippet.function()
    params = snippet.params()
    return probe(lambda a: fn(**{p: a[p] for p in params}), lambda: make_args("cuda"), runtime=runtime)


# ------------------------------------------------------------------ DeviceAllocator

ALLOCATOR_PROBES = (
    # (name, must_not_sync): SPEC.md §5 forbids a sync on the lazy free and the read-table builds;
    # the eager free may synchronise (SPEC.md §3) and is probed for information only.
    ("free_lazy_ps1", True),
    ("free_lazy_ps4", True),
    ("free_lazy_with_holes", True),
    ("read_table", True),
    ("read_table_legacy", True),
    ("read_table_packed", True),
    ("free_eager", False),
)


def _kernel_set(tier: str):
    import kvkernels

    if tier == "torch":
        from kvkernels import torch_path

        return torch_path
    if tier == "triton":
        return kvkernels
    raise ValueError(f"unknown tier {tier!r} (torch or triton)")


def allocator_case(name: str, kernels, device: str) -> tuple[Callable[[dict], Any], Callable[[], dict]]:
    """(fn, make) for one allocator probe; shared by the GPU probe and the CPU tests."""
    from kvkernels import DeviceAllocator
    from kvref import PoolConfig

    ps = 4 if name == "free_lazy_ps4" else 2 if name.startswith("read_table") else 1
    lazy = name != "free_eager"

    def pool():
        a = DeviceAllocator(PoolConfig(num_pages=64, page_size=ps, lazy=lazy), kernels=kernels, device=device)
        runs = [a.alloc(ps * k) for k in (3, 5, 2, 4)]
        return a, runs

    if name.startswith("free"):
        def make():
            a, runs = pool()
            if name == "free_lazy_with_holes":
                a.free(runs[0])  # earlier frees leave holes; the probed free appends to them
            return {"alloc": a, "tokens": runs[1]}

        return (lambda x: x["alloc"].free(x["tokens"])), make

    def make_rt():
        a, runs = pool()
        bs, width = len(runs), 16 * ps
        req_to_token = torch.full((bs + 1, width), -1, dtype=torch.int64, device=device)
        for b, run in enumerate(runs):
            req_to_token[b, : run.numel()] = run
        lens = torch.tensor([r.numel() for r in runs], dtype=torch.int64).to(device)
        args = {"alloc": a, "req_to_token": req_to_token,
                "req_pool_indices": torch.arange(bs, dtype=torch.int64, device=device), "seq_lens": lens,
                "max_pages": 8}
        if name == "read_table_packed":
            indptr = torch.zeros(bs + 1, dtype=torch.int64)
            indptr[1:] = torch.cumsum(torch.tensor([r.numel() for r in runs]), 0)
            args["indptr"] = indptr.to(device)
            args["out"] = torch.full((int(indptr[-1]) + 4,), -7, dtype=torch.int32, device=device)
            args["max_tokens"] = 8 * ps
        else:
            args["out"] = torch.full((bs + 1, 8), -7, dtype=torch.int32, device=device)
        return args

    def run_rt(x):
        common = dict(req_to_token=x["req_to_token"], req_pool_indices=x["req_pool_indices"],
                      seq_lens=x["seq_lens"], out=x["out"])
        if name == "read_table_packed":
            return x["alloc"].build_read_table_packed(indptr=x["indptr"], max_tokens=x["max_tokens"], **common)
        return x["alloc"].build_read_table(max_pages=x["max_pages"], legacy=name == "read_table_legacy", **common)

    return run_rt, make_rt


def probe_allocator(tier: str = "triton", names: Sequence[str] | None = None) -> dict[str, GpuVerdict]:
    """GPU verdicts for DeviceAllocator's free paths and read-table builds on one kernel set."""
    _require_cuda()
    kernels = _kernel_set(tier)
    out = {}
    for name, _must in ALLOCATOR_PROBES:
        if names is not None and name not in names:
            continue
        if name == "read_table_packed" and not hasattr(kernels, "build_kv_read_table_packed"):
            continue
        if name == "read_table_legacy" and not hasattr(kernels, "build_kv_read_table_legacy"):
            continue
        fn, make = allocator_case(name, kernels, "cuda")
        out[name] = probe(fn, make, runtime=True)
    return out


# ------------------------------------------------------------------ the batch run

CONTROLS = {"control:item": True, "control:synchronize": True, "control:add": False}  # task -> expected syncs


def _task_names() -> list[str]:
    from .corpus import ALL_SNIPPETS

    names = list(CONTROLS) + [f"snippet:{s.name}" for s in ALL_SNIPPETS]
    for tier in ("torch", "triton"):
        names += [f"allocator:{tier}:{name}" for name, _ in ALLOCATOR_PROBES]
    return names


def _run_task(task: str) -> dict:
    kind, _, rest = task.partition(":")
    if kind == "selftest":  # exercises the worker protocol without a GPU (tests/sync)
        if rest == "crash":
            os._exit(9)
        if rest == "broken":
            raise ContextBroken("selftest")
        return {"syncs": False}
    if kind == "control":  # known answers, so a broken harness shows up in the results
        x_make = lambda: {"x": torch.arange(8, device="cuda")}  # noqa: E731
        if rest == "item":
            return probe(lambda a: a["x"].sum().item(), x_make, runtime=True).to_json()
        if rest == "synchronize":
            return probe(lambda a: torch.cuda.synchronize(), x_make, runtime=True).to_json()
        if rest == "add":
            return probe(lambda a: a["x"].add_(1), x_make, runtime=True).to_json()
        raise ValueError(f"unknown control {rest!r}")
    if kind == "snippet":
        from .corpus import BY_NAME

        return probe_snippet(BY_NAME[rest]).to_json()
    if kind == "allocator":
        tier, _, name = rest.partition(":")
        verdicts = probe_allocator(tier, [name])
        if name not in verdicts:
            return {"syncs": None, "error": "skipped: the kernel set lacks this function"}
        return verdicts[name].to_json()
    raise ValueError(f"unknown task {task!r}")


def _worker(tasks: Sequence[str]) -> int:
    """Runs tasks in order, one JSON line each; exits 3 when a probe broke the CUDA context."""
    for task in tasks:
        t0 = time.perf_counter()
        try:
            result = _run_task(task)
        except ContextBroken as e:
            print(json.dumps({"task": task, "result": {"syncs": None, "error": f"context broken: {e}"}}), flush=True)
            return 3
        except Exception as e:
            result = {"syncs": None, "error": f"probe failed: {_short(e)}"}
        result["seconds"] = round(time.perf_counter() - t0, 3)
        print(json.dumps({"task": task, "result": result}), flush=True)
        if _STATE["dirty"]:
            return 3  # the parent starts a fresh process for the remaining tasks
    return 0


def run_truth(tasks: Sequence[str] | None = None, *, timeout_s: float = 480.0, log=print,
              require_cuda: bool = True) -> dict:
    """The GPU ground truth for the corpus and DeviceAllocator, in worker processes.

    Workers run with ``TRITON_INTERPRET`` unset (compiled kernels); a worker that dies
    or breaks its context is replaced and the remaining tasks continue.
    """
    if require_cuda:
        _require_cuda()
    remaining = list(tasks if tasks is not None else _task_names())
    results: dict[str, dict] = {}
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    repo_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = repo_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    deadline = time.monotonic() + timeout_s
    restarts = 0
    while remaining and time.monotonic() < deadline:
        cmd = [sys.executable, "-m", "fuzz.sync.gpu", "--worker", *remaining]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                cwd=repo_root)
        try:
            stdout, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        for line in stdout.splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            results[record["task"]] = record["result"]
            if record["task"] in remaining:
                remaining.remove(record["task"])
        if remaining and proc.returncode not in (0, 3):
            # the worker died inside remaining[0]: record it and go on without it
            crashed = remaining.pop(0)
            tail = " ".join(stderr.strip().splitlines()[-3:])[:300]
            results[crashed] = {"syncs": None, "error": f"worker exited {proc.returncode}: {tail}"}
        restarts += 1
        log(f"gpu truth: {len(results)} done, {len(remaining)} left (worker runs: {restarts})")
    for task in remaining:
        results[task] = {"syncs": None, "error": "not run: time budget exhausted"}
    return {"schema": SCHEMA, "environment": environment(), "results": results}


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        sys.exit(_worker(sys.argv[2:]))
    print("usage: python -m fuzz.sync.gpu --worker TASK... (run by fuzz.sync.calibrate --gpu)", file=sys.stderr)
    sys.exit(2)
