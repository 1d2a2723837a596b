"""Compile before the clock: learn the specializations a GPU campaign will meet, compile them in parallel.

A kernel set that specializes its ints (``tests/fixtures/kernels/foreign/indep.py``) compiles a
new variant whenever an int argument changes class (1, a multiple of 16, neither) or a
constexpr follows a size; on a GPU a short campaign then spends most of its seconds in the
compiler, one variant at a time, in each worker. The production op stream depends only on its
seed, ``scale_info`` and the palette (``generator``), never on what the target returned, so
the variants can be learned before fuzzing, without compiling:

1. **Scout**: the workers' own streams (their warm-up seeds and first sequences, their
   palettes) run on ``ScoutRun``, a ``ScaleRun`` whose checks do nothing, while the launch hook
   is in ``launches.record_only`` mode: every launch is described (``launches.specialization``,
   and a ``recipe``: the arguments with tensors replaced by their dtype and 16-byte alignment)
   and not run. Outputs are garbage, so an op that raises ends its sequence; a check's
   divergence is ignored (the target never ran). The tier's smoke test and the boundary probe
   (``observe.observed_constants``) run the same way, so a worker's start-up compiles nothing
   either. The scout works on CPU tensors too (the hook stops the launch before Triton sees it).
2. **Compile**: one recipe per distinct specialization, spread over a pool of processes that
   each import the set without ``TRITON_INTERPRET`` and call ``fn.warmup(*args, grid=(1,),
   **kwargs)`` (Triton's own binder then computes the very key a worker's launch computes) into
   the campaign's ``TRITON_CACHE_DIR``; a worker's JIT then finds each variant on disk and only
   loads it (``launches.loads``). On a GPU each compiled kernel is also loaded once
   (``_init_handles``), so its launcher stub is built and cached as well.

Both phases run in one child process (``python -m fuzz.engine.production.ahead JOB OUT``,
``run_job``), before the budget's clock starts; its pool does the scouting too, a chunk of
seeds per task. ``job`` is JSON: the kernel set, ``streams`` (seeds plus what the generator
needs: ``palette_seed``, ``mix``, ``big``, ``limits``, ``n_ops``, ``hostile``, ``check_every``),
``processes``, ``scout_s`` (no sequence starts later), ``recipes_out`` (the recipes that
compiled, for ``preload``: a worker loads them into its own kernels before its first op) and
``target`` (None: the GPU's own; ``"cuda:90:32"`` without a GPU, for tests: a stand-in driver
reports that target, so ``warmup`` compiles for it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

MAX_PROCESSES = 16  # compile processes at most (each holds a Triton and, on a GPU, a CUDA context)
GPU_SCOUTS = 8  # of them, scouting at once on a GPU (each holds a sequence's production tables: a few GB)
CHUNK = 4  # seeds per scout task
SCOUT_S = 60.0  # scouting stops starting sequences after this long (pool start-up included; ``skipped``)
TIMEOUT_S = 300.0  # the whole compile-ahead child, scout and compiles
RECIPES_ENV = "KVFUZZ_AHEAD_RECIPES"  # a campaign's children preload the recipes this file holds
_ROOT = Path(__file__).resolve().parents[3]  # the folder holding the fuzz package


class Unencodable(Exception):
    """An argument a recipe cannot carry to another process (a JITFunction, an object)."""


# ---- recipes: a launch's compile inputs as JSON ---------------------------------------------------


def encode(value):
    """One launch argument as JSON: a tensor by dtype and 16-byte alignment (what Triton's key
    reads of it), scalars as they are, constexprs, Triton and torch dtypes, tuples."""
    if hasattr(value, "data_ptr") and hasattr(value, "dtype"):
        return {"tensor": str(value.dtype).removeprefix("torch."), "aligned": value.data_ptr() % 16 == 0}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    kind = type(value).__name__
    if kind == "constexpr":
        return {"constexpr": encode(value.value)}
    if kind == "dtype" and type(value).__module__.startswith("torch"):
        return {"torch_dtype": str(value).removeprefix("torch.")}
    if kind == "dtype" or type(value).__module__.startswith("triton.language"):
        return {"tl": str(value)}
    if isinstance(value, (tuple, list)):
        return {"tuple": [encode(v) for v in value]}
    raise Unencodable(f"{kind} argument")


def decode(obj):
    """``encode``'s inverse, with a ``_Arg`` stand-in (dtype and alignment) for each tensor."""
    if not isinstance(obj, dict):
        return obj
    import torch

    if "tensor" in obj:
        return _Arg(getattr(torch, obj["tensor"]), obj["aligned"])
    if "constexpr" in obj:
        import triton.language as tl

        return tl.constexpr(decode(obj["constexpr"]))
    if "torch_dtype" in obj:
        return getattr(torch, obj["torch_dtype"])
    if "tl" in obj:
        import triton.language as tl

        return getattr(tl, obj["tl"])
    return tuple(decode(v) for v in obj["tuple"])


def _Arg(dtype, aligned: bool):
    """Triton's ``MockTensor`` with a pointer that is 16-byte aligned or not, as the real one was."""
    from triton.runtime.jit import MockTensor

    class Arg(MockTensor):
        def data_ptr(self):
            return 0 if aligned else 8

    return Arg(dtype)


def recipe(launch) -> dict:
    """What a compile of ``launch``'s specialization needs: the kernel (qualname and file), its
    arguments and keyword arguments (Unencodable when one cannot travel)."""
    pyfn = getattr(launch.fn, "fn", launch.fn)
    code = getattr(pyfn, "__code__", None)
    return {"kernel": pyfn.__qualname__, "file": Path(code.co_filename).name if code else "",
            "args": [encode(a) for a in launch.args], "kwargs": {k: encode(v) for k, v in launch.kwargs.items()}}


class Book:
    """The ``record_only`` callback: the first recipe of each distinct specialization."""

    def __init__(self):
        self.recipes: dict[str, dict] = {}
        self.launches = 0
        self.unencodable: dict[str, str] = {}  # kernel -> why its launches cannot be compiled ahead

    def __call__(self, launch) -> None:
        from ..launches import specialization

        self.launches += 1
        key = repr(specialization(launch))
        if key in self.recipes or key in self.unencodable:
            return
        try:
            self.recipes[key] = recipe(launch)
        except Unencodable as exc:
            self.unencodable[key] = f"{launch.name}: {exc}"


# ---- the scout ------------------------------------------------------------------------------------


def _scout_run_class():
    from .run import ScaleRun

    class ScoutRun(ScaleRun):
        """A ScaleRun whose checks do nothing: the target's launches are recorded, not run, so
        there is nothing to compare (and no host read of the garbage)."""

        def check(self, *args, **kwargs) -> None:
            self.clauses = []

    return ScoutRun


def _limits(spec):
    """A stream's limits: None (the generator's default for the device, as a worker's), a
    ``ScaleLimits`` classmethod name, or its fields."""
    from .limits import ScaleLimits

    if spec is None:
        return None
    if isinstance(spec, str):
        return getattr(ScaleLimits, spec)()
    return ScaleLimits(**{k: tuple(v) if isinstance(v, list) else v for k, v in spec.items()})


def scout_seeds(tier, stream: dict, seeds: list[int], book: Book, deadline: float | None = None) -> dict:
    """Run ``seeds`` of ``stream`` on ``tier`` with launches recorded into ``book``, not run, until
    ``deadline`` (``time.time()``; the rest are ``skipped``); counts of what ran, and the
    ``scale_info`` constants the streams were drawn from."""
    from ..launches import record_only
    from ..verdict import Divergence
    from .generator import generator, scale_info
    from .palette import palette_info

    ScoutRun = _scout_run_class()
    done = {"sequences": 0, "ops": 0, "cut": 0, "skipped": 0}
    with record_only(book):
        info = scale_info(tier)
        if stream.get("palette_seed") is not None:
            info["palette"] = palette_info(stream["palette_seed"])
        limits = _limits(stream.get("limits"))
        for seed in seeds:
            if deadline is not None and time.time() > deadline:
                done["skipped"] += 1
                continue
            config, gen = generator(seed, info, limits=limits, mix=stream.get("mix"), big=stream.get("big"),
                                    hostile=stream.get("hostile", "spec"))
            try:
                run = ScoutRun(config, tier, check_every=stream.get("check_every", 1),
                               hostile=stream.get("hostile", "spec"))
                for _ in range(stream.get("n_ops", 24)):
                    op = gen.next_op()
                    done["ops"] += 1
                    try:
                        run.step(op)
                    except Divergence:  # a check of results the target never wrote: meaningless here
                        continue
            except Exception:  # noqa: BLE001 - garbage outputs broke an op: this sequence ends here
                done["cut"] += 1
            done["sequences"] += 1
    done["constants"] = info["constants"]
    return done


# ---- the pool's processes ------------------------------------------------------------------------

_PROC: dict = {}  # per pool process: the tier, its JITFunctions by (qualname, file), set-up done


class _StandInDriver:
    """A driver for a machine without a GPU: it names a target, so ``warmup`` compiles for it."""

    def __init__(self, target: str):
        from triton.backends.compiler import GPUTarget

        backend, arch, warp = target.split(":")
        self.target = GPUTarget(backend, int(arch), int(warp))

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


def _init(kernels: str, target: str | None, scouts) -> None:
    """A pool process: the set imported as compiled JITFunctions (never interpreted). Without a
    GPU, ``target`` (or ``KVFUZZ_COMPILE_TARGET``, as the compile track reads it) names what
    ``warmup`` compiles for; ``scouts``: a semaphore bounding the scout tasks running at once."""
    os.environ.pop("TRITON_INTERPRET", None)
    import torch
    from triton.runtime import driver

    from ..compile_check.child import Server
    from ..tiers import Tier

    gpu = target is None and torch.cuda.is_available()
    target = target or (None if gpu else os.environ.get("KVFUZZ_COMPILE_TARGET"))
    if target:
        driver.set_active(_StandInDriver(target))
    server = Server()
    server.load(kernels)
    _PROC.update(server=server, kernels=kernels, device="cuda" if gpu else "cpu", set_up=False, scouts=scouts,
                 tier=Tier("cuda", kernels, server.sets[kernels], "cuda" if gpu else "cpu"), no_target=not (gpu or target))


def _scout_task(stream: dict, seeds: list[int], deadline: float) -> dict:
    with _PROC["scouts"]:
        return _scout(stream, seeds, deadline)


def _scout(stream: dict, seeds: list[int], deadline: float) -> dict:
    from ..launches import record_only
    from ..tiers import _smoke_test

    book, tier = Book(), _PROC["tier"]
    if not _PROC["set_up"]:  # a worker's start-up launches: the smoke test (the probe runs in scale_info)
        _PROC["set_up"] = True
        with record_only(book):
            try:
                _smoke_test(tier.kernels, tier.kernels_name, "cuda", tier.device)
            except Exception:  # noqa: BLE001 - the workers' own tier says why, as a setup error
                pass
    t0 = time.perf_counter()
    done = scout_seeds(tier, stream, seeds, book, deadline)
    return {**done, "recipes": book.recipes, "unencodable": book.unencodable, "launches": book.launches,
            "seconds": time.perf_counter() - t0}


def _compile_task(item: dict) -> dict:
    """Compile one recipe with ``warmup``; whether Triton found it on disk already (``hit``)."""
    if _PROC["no_target"]:
        return {"ok": False, "error": "no GPU here, and no KVFUZZ_COMPILE_TARGET (e.g. cuda:90:32) to compile for"}
    fn = _PROC["server"].find(_PROC["kernels"], item["kernel"], item["file"])
    if fn is None:
        return {"ok": False, "error": f"no @triton.jit kernel {item['kernel']} ({item['file']}) in the set"}
    hits: list[bool] = []
    knobs = _knobs()
    previous = getattr(knobs, "listener", None)
    if knobs is not None:
        knobs.listener = lambda **kw: hits.append(bool(kw.get("cache_hit")))
    t0 = time.perf_counter()
    try:
        args = [decode(a) for a in item["args"]]
        kwargs = {k: decode(v) for k, v in item["kwargs"].items()}
        kernel = fn.warmup(*args, grid=(1,), **kwargs)
        if _PROC["device"] == "cuda":
            _onto_device(kernel)
    except Exception as exc:  # noqa: BLE001 - a variant that does not compile: the campaign meets it as a case
        return {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[-300:]}",
                "seconds": time.perf_counter() - t0}
    finally:
        if knobs is not None:
            knobs.listener = previous
    return {"ok": True, "seconds": time.perf_counter() - t0, "hit": bool(hits) and all(hits)}


def _onto_device(kernel) -> None:
    """Load a compiled kernel onto the GPU as its first launch would (``_init_handles``: the module,
    and the launcher, which a Triton that builds one per signature compiles and caches on disk).
    Only a head start: a failure here leaves it to the launch."""
    try:
        kernel._init_handles()
    except Exception:  # noqa: BLE001 - another Triton's CompiledKernel, or a device that refused: launch-time
        pass


def _knobs():
    """Triton's compilation knobs (their ``listener`` says whether a compile hit the disk cache), or None."""
    try:
        from triton import knobs

        return knobs.compilation
    except (ImportError, AttributeError):
        return None


def _chunks(streams: list[dict]) -> list[tuple[dict, list[int]]]:
    """Scout tasks, the streams' first seeds first (round robin over the streams), so that when
    ``scout_s`` runs out every worker's early sequences have been scouted, not one worker's all."""
    per = [[(st, st["seeds"][i:i + CHUNK]) for i in range(0, len(st["seeds"]), CHUNK)] for st in streams]
    out = [chunks[i] for i in range(max(map(len, per), default=0)) for chunks in per if i < len(chunks)]
    return out or [(streams[0] if streams else {}, [])]


def _gpu_here() -> bool:
    import torch

    return torch.cuda.is_available()


def run_here(job: dict) -> dict:
    """Both phases, in this process and its pool (the child's body): a summary as JSON."""
    import multiprocessing

    t0 = time.perf_counter()
    if not (job.get("target") or os.environ.get("KVFUZZ_COMPILE_TARGET") or _gpu_here()):
        return {"error": "no GPU here to compile for (and no KVFUZZ_COMPILE_TARGET, e.g. cuda:90:32)", "seconds": 0.0}
    processes = max(1, min(int(job.get("processes") or os.cpu_count() or 1), MAX_PROCESSES))
    streams = [{**s, "seeds": list(s.get("seeds", ()))} for s in job.get("streams", ())]
    ctx = multiprocessing.get_context("spawn")
    scouts = ctx.BoundedSemaphore(int(job.get("scouts") or (min(processes, GPU_SCOUTS) if _gpu_here() else processes)))
    recipes: dict[str, dict] = {}
    report = {"processes": processes, "sequences": 0, "ops": 0, "cut": 0, "skipped": 0, "launches": 0,
              "constants": None,
              "unencodable": {}, "failed": [], "compiled": 0, "cached": 0}
    with ProcessPoolExecutor(processes, mp_context=ctx, initializer=_init,
                             initargs=(job["kernels"], job.get("target"), scouts)) as pool:
        chunks = _chunks(streams)
        deadline = time.time() + float(job.get("scout_s") or SCOUT_S)
        for done in pool.map(_scout_task, *zip(*chunks), [deadline] * len(chunks)):
            for key in ("sequences", "ops", "cut", "skipped", "launches"):
                report[key] += done[key]
            for key, item in done["recipes"].items():
                recipes.setdefault(key, item)
            report["unencodable"].update(done["unencodable"])
            report["constants"] = report["constants"] or done.get("constants")
        report["scout_s"] = round(time.perf_counter() - t0, 2)
        t1 = time.perf_counter()
        items, compiled = list(recipes.values()), []
        for item, got in zip(items, pool.map(_compile_task, items)):
            if not got["ok"]:
                report["failed"].append({"kernel": item["kernel"], "error": got["error"]})
                continue
            compiled.append(item)
            report["cached" if got.get("hit") else "compiled"] += 1
        report["compile_s"] = round(time.perf_counter() - t1, 2)
    if job.get("recipes_out"):  # what a worker preloads (``preload``): the ones that compiled
        Path(job["recipes_out"]).write_text(json.dumps(compiled))
    report["specializations"] = len(recipes)
    report["unencodable"] = sorted(set(report["unencodable"].values()))
    report["seconds"] = round(time.perf_counter() - t0, 2)
    return report


def run_job(job: dict, env: dict | None = None, timeout: float = TIMEOUT_S) -> dict:
    """Run ``job`` in a child process (``env`` on top of this one's, without TRITON_INTERPRET)
    and return its report; a child that fails or outlives ``timeout`` gives ``{"error": ...}``
    (the campaign then fuzzes as it would have without it)."""
    full = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    full.update(env or {})
    full["PYTHONPATH"] = os.pathsep.join([str(_ROOT)] + [p for p in full.get("PYTHONPATH", "").split(os.pathsep) if p])
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kvfuzz-ahead-") as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "report.json"
        job_path.write_text(json.dumps(job))
        try:
            proc = subprocess.run([sys.executable, "-m", "fuzz.engine.production.ahead", str(job_path), str(out_path)],
                                  env=full, timeout=timeout, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True)
        except subprocess.TimeoutExpired:
            return {"error": f"did not finish in {timeout:g} s", "seconds": round(time.perf_counter() - t0, 2)}
        if proc.returncode != 0 or not out_path.is_file():
            tail = (proc.stderr or "").strip().splitlines()[-6:]
            return {"error": f"exit {proc.returncode}: " + " | ".join(tail), "seconds": round(time.perf_counter() - t0, 2)}
        report = json.loads(out_path.read_text())
    report["seconds"] = round(time.perf_counter() - t0, 2)  # the child's start-up included: what the user waits
    return report


def stream(seeds, *, palette_seed=None, mix=None, big=None, limits=None, n_ops=24, hostile="spec",
           check_every=1) -> dict:
    """One stream of a job: ``limits`` a ScaleLimits, a classmethod name or None (the tier's)."""
    if limits is not None and not isinstance(limits, str):
        limits = dataclasses.asdict(limits)
    return {"seeds": [int(s) for s in seeds], "palette_seed": palette_seed, "mix": mix, "big": big, "limits": limits,
            "n_ops": n_ops, "hostile": hostile, "check_every": check_every}


def preload(path: str | os.PathLike) -> dict:
    """Load the recipes ``path`` holds (``recipes_out``, all compiled ahead) into this process's
    kernels: ``warmup`` of each finds it on disk and keeps it in the JITFunction's own cache, and
    on a GPU it is loaded onto the device too, so a launch later neither compiles nor loads. For
    a worker before it fuzzes, and a benchmark before its clock, once its set is loaded."""
    from ..compile_check.child import jit_index

    index = jit_index()  # this process's JITFunctions: the set is loaded once per process
    t0, loaded, failed = time.perf_counter(), 0, 0
    gpu = _gpu_here()
    for item in json.loads(Path(path).read_text()):
        fn = index.get((item["kernel"], item["file"]))
        try:
            kernel = fn.warmup(*[decode(a) for a in item["args"]], grid=(1,),
                               **{k: decode(v) for k, v in item["kwargs"].items()})
            if gpu:
                _onto_device(kernel)
            loaded += 1
        except Exception:  # noqa: BLE001 - a kernel that cannot be preloaded is compiled (or fails) at its launch
            failed += 1
    return {"loaded": loaded, "failed": failed, "seconds": round(time.perf_counter() - t0, 2)}


def preload_ahead(tier) -> str | None:
    """A campaign child's preload (``RECIPES_ENV``), on a GPU tier only; a note for its hello."""
    path = os.environ.get(RECIPES_ENV)
    if not path or not str(tier.device).startswith("cuda") or not Path(path).is_file():
        return None
    done = preload(path)
    return f"compile-ahead: each worker preloads the {done['loaded'] + done['failed']} kernels compiled ahead" + (
        f" ({done['failed']} could not be)" if done["failed"] else "")


def describe(report: dict) -> str:
    """One line for a campaign's log."""
    if "error" in report:
        return f"failed ({report['error']}), fuzzing without it"
    failed = f", {len(report['failed'])} did not compile" if report.get("failed") else ""
    skipped = f" ({report['skipped']} more not reached in time)" if report.get("skipped") else ""
    return (f"{report['specializations']} specializations from {report['sequences']} scouted sequences{skipped} "
            f"({report['launches']} launches), {report['compiled']} compiled and {report['cached']} already cached"
            f"{failed}, in {report['seconds']:.1f} s on {report['processes']} processes (scout "
            f"{report['scout_s']:.1f} s, compile {report['compile_s']:.1f} s), before the clock")


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m fuzz.engine.production.ahead JOB.json REPORT.json", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[1]).read_text())
    Path(argv[2]).write_text(json.dumps(run_here(job)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
