"""Compile before the clock: learn the specializations a GPU campaign will meet, compile them in parallel.

A kernel set that specializes its ints (``tests/fixtures/kernels/foreign/indep.py``) compiles a
new variant whenever an int argument changes class (1, a multiple of 16, neither) or a
constexpr follows a size; on a GPU a short campaign then spends most of its seconds in the
compiler, one variant at a time, in each worker. The production op stream depends only on its
seed, ``scale_info`` and the palette (``generator``), never on what the target returned, so
the variants can be learned before fuzzing, without compiling:

1. **Scout**: the workers' own streams (their warm-up seeds and first sequences, their
   palettes) run on ``ScoutRun``, a ``ScaleRun`` whose checks do nothing, while the launch hook
   is in ``launches.record_only`` mode: every launch is described (``signatures.specialization``,
   and a ``recipes.recipe``: the arguments with tensors replaced by their dtype and 16-byte
   alignment) and not run. Outputs are garbage, so an op that raises ends its sequence; a check's
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

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from .recipes import RECIPES_ENV, Book, StandInDriver, compile_recipe, gpu_here, preload, preload_ahead

__all__ = ["RECIPES_ENV", "preload", "preload_ahead", "run_job", "scout_seeds", "stream", "describe"]

MAX_PROCESSES = 16  # compile processes at most (each holds a Triton and, on a GPU, a CUDA context)
GPU_SCOUTS = 8  # of them, scouting at once on a GPU (each holds a sequence's production tables: a few GB)
CHUNK = 4  # seeds per scout task
FOLLOW_SCOUTS = 2  # scout tasks at once while following a running campaign (its workers have the GPU)
SCOUT_S = 60.0  # scouting stops starting sequences after this long (pool start-up included; ``skipped``)
TIMEOUT_S = 300.0  # the whole compile-ahead child, scout and compiles
_ROOT = Path(__file__).resolve().parents[3]  # the folder holding the fuzz package


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
        driver.set_active(StandInDriver(target))
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
    """Compile one recipe in this pool process (``recipes.compile_recipe``)."""
    if _PROC["no_target"]:
        return {"ok": False, "error": "no GPU here, and no KVFUZZ_COMPILE_TARGET (e.g. cuda:90:32) to compile for"}
    return compile_recipe(_PROC["server"].find(_PROC["kernels"], item["kernel"], item["file"]), item,
                          on_device=_PROC["device"] == "cuda")


def _chunks(streams: list[dict]) -> list[tuple[dict, list[int]]]:
    """Scout tasks, the streams' first seeds first (round robin over the streams), so that when
    ``scout_s`` runs out every worker's early sequences have been scouted, not one worker's all."""
    per = [[(st, st["seeds"][i:i + CHUNK]) for i in range(0, len(st["seeds"]), CHUNK)] for st in streams]
    out = [chunks[i] for i in range(max(map(len, per), default=0)) for chunks in per if i < len(chunks)]
    return out or [(streams[0] if streams else {}, [])]


def _write(path: Path, data: dict) -> None:
    """Atomically: the parent polls for the file, and must never read half of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def run_here(job: dict, out: Path) -> None:
    """The child's body: both phases in this process and its pool, the report written to ``out``;
    then, with ``follow_s``, the follow phase (``_follow``) until that many seconds have passed."""
    import multiprocessing

    t0 = time.perf_counter()
    if not (job.get("target") or os.environ.get("KVFUZZ_COMPILE_TARGET") or gpu_here()):
        _write(out, {"error": "no GPU here to compile for (and no KVFUZZ_COMPILE_TARGET, e.g. cuda:90:32)"})
        return
    processes = max(1, min(int(job.get("processes") or os.cpu_count() or 1), MAX_PROCESSES))
    streams = [{**s, "seeds": list(s.get("seeds", ()))} for s in job.get("streams", ())]
    ctx = multiprocessing.get_context("spawn")
    scouts = ctx.BoundedSemaphore(int(job.get("scouts") or (min(processes, GPU_SCOUTS) if gpu_here() else processes)))
    recipes: dict[str, dict] = {}
    report = {"processes": processes, "sequences": 0, "ops": 0, "cut": 0, "skipped": 0, "launches": 0,
              "constants": None, "unencodable": {}, "failed": [], "compiled": 0, "cached": 0}
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
            _write(Path(job["recipes_out"]), compiled)
        report["specializations"] = len(recipes)
        report["unencodable"] = sorted(set(report["unencodable"].values()))
        report["seconds"] = round(time.perf_counter() - t0, 2)
        _write(out, report)
        if job.get("follow_s"):
            _follow(pool, job, streams, recipes, out.with_name(out.name + ".follow"))


def _follow(pool, job: dict, streams: list[dict], recipes: dict, path: Path) -> None:
    """While the campaign runs: scout each stream's later seeds (``more``), a few tasks at a time
    (the GPU is the workers' now), and compile each new specialization as soon as a scout task
    returns it, on the cores the workers leave; the counts go to ``path`` after each task. A
    worker that reaches a sequence compiled here loads its kernels from disk."""
    from concurrent.futures import FIRST_COMPLETED, wait

    end = time.time() + float(job["follow_s"])
    scouts_at_once = FOLLOW_SCOUTS
    compiles_at_once = max(1, (os.cpu_count() or 1) - int(job.get("workers", 1)) - scouts_at_once)
    todo = _chunks([{**s, "seeds": list(s.get("more", ()))} for s in streams])
    stats = {"sequences": 0, "specializations": 0, "compiled": 0, "failed": 0, "cut": 0}
    scouting, compiling, queued = set(), set(), []
    while time.time() < end and (todo or scouting or compiling or queued):
        while todo and len(scouting) < scouts_at_once:
            stream_, seeds = todo.pop(0)
            if seeds:
                scouting.add(pool.submit(_scout_task, stream_, seeds, end))
        while queued and len(compiling) < compiles_at_once:
            compiling.add(pool.submit(_compile_task, queued.pop(0)))
        if not (scouting or compiling):
            continue
        finished, _ = wait(scouting | compiling, timeout=max(0.1, end - time.time()), return_when=FIRST_COMPLETED)
        for fut in finished:
            got = fut.result()
            if fut in scouting:
                scouting.discard(fut)
                stats["sequences"] += got["sequences"]
                stats["cut"] += got["cut"]
                fresh = [item for key, item in got["recipes"].items() if key not in recipes]
                recipes.update({key: item for key, item in got["recipes"].items() if key not in recipes})
                stats["specializations"] += len(fresh)
                queued += fresh
            else:
                compiling.discard(fut)
                stats["compiled" if got["ok"] else "failed"] += 1
        _write(path, {**stats, "queued": len(queued)})


class Job:
    """The compile-ahead child (``python -m fuzz.engine.production.ahead JOB OUT``, in a session
    of its own so that it and its pool end together): ``first`` waits for its report; with
    ``follow_s`` it runs on after that until ``stop`` (or its own end), which returns the follow
    counts."""

    def __init__(self, job: dict, env: dict | None = None):
        full = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        full.update(env or {})
        full["PYTHONPATH"] = os.pathsep.join([str(_ROOT)] + [p for p in full.get("PYTHONPATH", "").split(os.pathsep)
                                                             if p])
        self.t0 = time.perf_counter()
        self.tmp = Path(tempfile.mkdtemp(prefix="kvfuzz-ahead-"))
        self.out = self.tmp / "report.json"
        (self.tmp / "job.json").write_text(json.dumps(job))
        self.log = open(self.tmp / "stderr.log", "wb")  # noqa: SIM115 - closed by stop()
        self.proc = subprocess.Popen([sys.executable, "-m", "fuzz.engine.production.ahead", str(self.tmp / "job.json"),
                                      str(self.out)], env=full, stdout=subprocess.DEVNULL, stderr=self.log,
                                     start_new_session=True)

    def first(self, timeout: float = TIMEOUT_S) -> dict:
        """The report (``{"error": ...}`` when the child failed or outlived ``timeout``)."""
        end = time.monotonic() + timeout
        while not self.out.is_file():
            if self.proc.poll() is not None and not self.out.is_file():
                tail = (self.tmp / "stderr.log").read_bytes().decode(errors="replace").strip().splitlines()[-6:]
                return self._took({"error": f"exit {self.proc.returncode}: " + " | ".join(tail)})
            if time.monotonic() > end:
                self.stop()
                return self._took({"error": f"did not finish in {timeout:g} s"})
            time.sleep(0.1)
        return self._took(json.loads(self.out.read_text()))

    def _took(self, report: dict) -> dict:
        report["seconds"] = round(time.perf_counter() - self.t0, 2)  # the child's start-up included: what one waits
        return report

    def stop(self) -> dict | None:
        """End the child (and its pool) if it still runs; the follow counts, if it followed."""
        follow = self.tmp / "report.json.follow"
        counts = json.loads(follow.read_text()) if follow.is_file() else None
        if self.proc.poll() is None:
            for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=wait_s)
                    break
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
        return counts


def run_job(job: dict, env: dict | None = None, timeout: float = TIMEOUT_S) -> dict:
    """Run ``job`` (without ``follow_s``) in a child process (``env`` on top of this one's,
    without TRITON_INTERPRET) and return its report; a child that fails or outlives ``timeout``
    gives ``{"error": ...}`` (the campaign then fuzzes as it would have without it)."""
    child = Job(job, env)
    try:
        report = child.first(timeout)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.proc.wait(timeout=30)  # the pool shutting down
    finally:
        child.stop()
    return report


def stream(seeds, *, palette_seed=None, mix=None, big=None, limits=None, n_ops=24, hostile="spec",
           check_every=1) -> dict:
    """One stream of a job: ``limits`` a ScaleLimits, a classmethod name or None (the tier's)."""
    if limits is not None and not isinstance(limits, str):
        limits = dataclasses.asdict(limits)
    return {"seeds": [int(s) for s in seeds], "palette_seed": palette_seed, "mix": mix, "big": big, "limits": limits,
            "n_ops": n_ops, "hostile": hostile, "check_every": check_every}


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
    run_here(json.loads(Path(argv[1]).read_text()), Path(argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
