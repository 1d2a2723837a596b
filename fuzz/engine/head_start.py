"""A GPU worker's head start: the small track's first compiles, in parallel, before it fuzzes.

Why. On an empty Triton cache a small-track GPU worker compiles each kernel variant at the
moment it first launches it, one after another: the smoke test's, then what its warm-up
sequences meet: on one H200, 4.1 s of a cold first case's 11.4 s without a head start, on one
core of sixteen (benchmarks/results/guided-vs-blind-h200/).
The production track learns its variants before the clock (``production.ahead``); the small
track's stream runs on the allocator state machine, but it is drawn from the spec alone
(``generate.OpGenerator`` reads the spec's state and the spec's outcomes, never the
target's), so the same kind of scout predicts it.

How. At the worker's entry, its kernel set imported and no CUDA context made yet, it forks a
*coordinator* and goes on to make its tier at once:

1. **Scout** (``scout.py``, in the coordinator): the smoke test's calls, then the worker's warm-up sequences and
   its first two, run on CPU tensors under ``launches.record_only`` (described, not run; a
   launcher that routes CPU tensors elsewhere by a module-level ``INTERPRET`` flag, as ours
   does, is told to route them to its kernels meanwhile). The target's results are garbage,
   so its divergences are ignored and an op that raises only ends its sequence. It runs in a
   thread of its own: a set whose Python hangs on its Nth call in a process hangs the scout,
   which is left behind ``SCOUT_HUNG_S`` past its deadline (the report's ``stuck`` says where);
   the compiles it queued are told done as they end meanwhile.
2. **Compile** each new specialization the moment the scout meets it, in the order met, on
   ``MAX_CHILDREN`` compile children forked by the coordinator: ``recipes.compile_recipe`` into
   the Triton cache, for the target NVML names (``nvml_target``), through a stand-in driver, so
   that no child makes a CUDA context: eight contexts made beside the worker's held its own
   set-up back by a second (one H200, benchmarks/results/first-case-h200/). Where NVML cannot
   say, each child compiles through the real driver and loads onto the GPU (the fork came
   before any CUDA, so it can).
3. **Wait only for what is launched.** The coordinator tells the worker each specialization it
   queued and each one done (a digest of ``signatures.specialization``); a launch of one queued
   and not done waits for it (``launches.gate``), any other launch runs as it would have. The
   worker meets its variants in the order the scout queued them, so it waits for the compiles
   of eight cores, not one; never more than ``WAIT_S`` a launch nor ``WAIT_TOTAL_S`` in all
   (then its launches compile their own, as without a head start).

A marker under the Triton cache (keyed by the set's kernel sources, Triton's version, the knobs
and the seeds scouted) says a head start was made there already: a warm cache pays a hash. A
head start cut short (its worker found a bug and ended: ``--stop-on-first``) leaves the digests
it finished beside it (``KEY.done``); the next one queues the rest only, so that a launch never
waits for a child to load what it would load itself.
Without a GPU (tests), ``KVFUZZ_COMPILE_TARGET`` names the target the children compile for.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sys
import threading
import time
import warnings
from pathlib import Path

from .scout import scout, where_now

SCOUT_S = 3.0  # the scout starts no sequence after this long
# A loaded machine (several suites on two cores) can spend the whole SCOUT_S on the smoke test alone;
# whoever needs the scout to reach its sequences whatever the load (a test of what it compiles) raises it.
SCOUT_S_ENV = "KVFUZZ_HEAD_START_SCOUT_S"
# A scout still in one of the target's calls this long past its deadline is left behind (a set whose Python
# hangs on its Nth call in a process hangs its scout too): the coordinator ends the compiles it queued and
# relays them, and its report names where the scout was (``stuck``). It never holds a worker's launches:
# the compiles done are relayed while the scout runs.
SCOUT_HUNG_S = 10.0
WAIT_S = 60.0  # the longest a launch waits for its variant (then it compiles it itself)
# The longest a worker waits for its head start in all: past it (a host where other campaigns'
# compiles crowd its children out), every launch compiles or loads its own, as without a head start,
# and what the children still finish lands in the cache for the launches after.
WAIT_TOTAL_S = 90.0
MAX_CHILDREN = 8  # compile children per worker (fewer where the cores are fewer)
SCHEMA = 1  # of the marker's key

__all__ = ["Gate", "begin", "digest", "marker_key", "scout", "wanted"]


def wanted(opts) -> bool:
    """Whether a worker of this campaign makes a head start: compiled kernels (``cuda``), a track
    whose stream the spec alone draws (``Track.head_start``), a plain kernel set (a factory's tier
    is built by the factory), and compile-ahead not ``off``."""
    return (opts.backend == "cuda" and getattr(opts.track, "head_start", False) and not opts.factory
            and opts.compile_ahead != "off")


def _jit_functions(module) -> dict[str, object]:
    """The ``@triton.jit`` functions a kernel set holds (on itself, and on the modules its
    attributes name, two levels down: our launchers keep theirs in ``_k``), by qualname."""
    from triton.runtime.jit import JITFunction

    found: dict[str, object] = {}
    seen: set[int] = set()
    todo = [module]
    for depth in range(3):
        nxt = []
        for mod in todo:
            if id(mod) in seen:
                continue
            seen.add(id(mod))
            for value in list(vars(mod).values()):
                if isinstance(value, JITFunction):
                    found.setdefault(value.fn.__qualname__, value)
                elif depth < 2 and type(value).__name__ == "module" and not value.__name__.startswith(("triton", "torch")):
                    nxt.append(value)
        todo = nxt
    return found


def marker_key(module, knobs, seeds, params: dict) -> str | None:
    """The marker's name: a digest of the set's kernel sources, Triton's version, the knobs, the
    seeds and what else decides the stream; None for a set with no compiled kernel."""
    import triton

    kernels = _jit_functions(module)
    if not kernels:
        return None
    text = json.dumps([SCHEMA, triton.__version__, sorted((k, fn.src) for k, fn in kernels.items()),
                       sorted((knobs or {}).items()),
                       list(seeds), sorted(params.items())], default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _marker_dir() -> Path:
    return Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache") / "kvfuzz-head-start"


def digest(launch) -> str:
    """The short name of a launch's specialization the coordinator and the gate agree on."""
    from .signatures import specialization

    return hashlib.sha256(repr(specialization(launch)).encode()).hexdigest()[:16]


def _triton_key() -> None:
    """Triton's own key (a hash of its files and libtriton, lru-cached: 0.4-0.8 s in each process,
    computed at its first compile or cache lookup), computed here so that the processes forked
    after inherit it. A daemon computes it for its children once idle (``zygote.daemon``), so a
    cold campaign's first worker, and whatever it forks, would each compute it again."""
    with contextlib.suppress(Exception):
        from triton.runtime.cache import triton_key

        triton_key()


def _die_with_parent() -> None:
    """This process ends with the one that forked it (Linux; elsewhere it ends on its own)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _fork(body) -> int:
    """Fork a child that runs ``body()`` and exits with its code (1 if it raised)."""
    with warnings.catch_warnings():  # 3.12 warns of fork() with threads: the child runs none of them
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        code = 1
        try:
            _die_with_parent()
            code = body()
        finally:
            os._exit(code or 0)
    return pid


def nvml_target() -> str | None:
    """``cuda:ARCH:32`` for this machine's NVIDIA GPUs, from NVML (which makes no CUDA context);
    None where NVML cannot say, or the GPUs are not all of one architecture."""
    import ctypes

    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    caps: set[int] = set()
    try:
        if nvml.nvmlInit_v2() != 0:
            return None
        n = ctypes.c_uint()
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(n)) != 0:
            return None
        for i in range(n.value):
            handle, major, minor = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_int()
            if (nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0 or
                    nvml.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor)) != 0):
                return None
            caps.add(major.value * 10 + minor.value)
        nvml.nvmlShutdown()
    except AttributeError:  # an NVML without these entry points
        return None
    return f"cuda:{caps.pop()}:32" if len(caps) == 1 else None


def _launcher(kernel) -> None:
    """Build the kernel's launcher where this Triton builds one per signature (and caches it on
    disk: 3.6's CUDA launcher), without a device; a Triton whose launcher needs one builds it at
    the worker's first launch, as before."""
    with contextlib.suppress(Exception):
        from triton.backends.nvidia.driver import CudaLauncher

        CudaLauncher(kernel.src, kernel.metadata)


def _compiler(tasks, results, lookup, target: str | None, launcher: bool) -> int:
    """A compile child: recipes from ``tasks`` until None, each compiled (for ``target`` through a
    stand-in driver, with its launcher where ``launcher``: no CUDA context; without a target,
    through the real driver and loaded onto the GPU, a context of its own), its outcome to
    ``results``."""
    from .production.recipes import StandInDriver, compile_recipe

    if target:
        from triton.runtime import driver

        driver.set_active(StandInDriver(target))
    while (item := tasks.get()) is not None:
        name, recipe = item
        try:
            got = compile_recipe(lookup(recipe), recipe, on_device=not target, then=_launcher if launcher else None)
            status = "failed" if not got["ok"] else "cached" if got.get("hit") else "compiled"
        except Exception:  # noqa: BLE001 - the launch compiles it again and says why
            status = "failed"
        results.put((name, status))
    return 0


def _coordinate(module, name: str, seeds, knobs, params: dict, children: int, tell, marker: Path,
                target: str | None) -> int:
    """The coordinator: fork the compile children, scout, queue each new specialization (and tell
    the worker, ``tell((what, digest))``), relay each one done; the marker once all are, cleanly."""
    import multiprocessing

    from .compile_check.child import jit_index
    from .production.recipes import Book

    t0 = time.monotonic()
    near = _jit_functions(module)  # the set's own, found at once; any other JITFunction by a scan of the heap
    ctx = multiprocessing.get_context("fork")
    tasks, results = ctx.SimpleQueue(), ctx.SimpleQueue()

    def lookup(recipe):
        fn = near.get(recipe["kernel"])
        code = getattr(getattr(fn, "fn", None), "__code__", None)
        if code is not None and Path(code.co_filename).name == recipe["file"]:
            return fn
        index = jit_index()
        return index.get((recipe["kernel"], recipe["file"])) or index.get((recipe["kernel"], ""))

    launcher = False
    if not target:  # the GPU's target from NVML: the children then make no CUDA context (none to contend with the worker's)
        target = nvml_target()
        launcher = target is not None
    _triton_key()  # once here, not in each child at its first compile (eight at once: 1.5-1.9 s on an H200)
    pids = [_fork(lambda: _compiler(tasks, results, lookup, target, launcher)) for _ in range(children)]
    book, queued = Book(), []
    progress = marker.with_name(marker.name + ".done")  # the digests an earlier head start of it finished
    try:
        finished = set(progress.read_text().split())
    except OSError:
        finished = set()
    earlier: set[str] = set()
    left: set[str] = set()
    # The scout's thread and this one both tell the worker (a lock keeps their messages whole); once
    # the scouting is over, a scout left behind that comes back queues nothing more.
    lock, scouting = threading.Lock(), threading.Event()
    scouting.set()

    def say(msg) -> None:
        with lock:
            tell(msg)

    def on_launch(launch) -> None:
        before = len(book.recipes)
        book(launch)
        if len(book.recipes) > before:
            key = digest(launch)
            if key in finished:  # on disk since a head start its campaign ended before it did
                earlier.add(key)
                return
            with lock:
                if not scouting.is_set():
                    return
                queued.append(key)
                left.add(key)
                tell(("queued", key))
            tasks.put((key, next(reversed(book.recipes.values()))))

    counts = {"compiled": 0, "cached": 0, "failed": 0}
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        log = os.open(progress, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError:  # a cache it cannot write: nothing is kept for the next head start
        log = None

    def take() -> None:
        key, status = results.get()
        left.discard(key)
        counts[status] += 1
        say(("done", key))
        if status != "failed" and log is not None:
            os.write(log, f"{key}\n".encode())

    deadline = t0 + float(os.environ.get(SCOUT_S_ENV) or SCOUT_S)
    box: dict = {}
    thread = threading.Thread(target=lambda: box.update(scout(
        module, name, seeds, knobs, n_ops=params["n_ops"], hostile=params["hostile"],
        check_every=params["check_every"], on_launch=on_launch, deadline=deadline)), name="kvfuzz-scout", daemon=True)
    thread.start()
    hung = deadline + max(SCOUT_HUNG_S, deadline - t0)
    while thread.is_alive() and time.monotonic() < hung:
        while not results.empty():  # relayed as they come: a launch waits for its compile, never for the scout
            take()
        thread.join(0.005)
    with lock:
        stuck = thread.is_alive()
        scouting.clear()
    done = dict(box) or {"sequences": 0, "ops": 0, "cut": 0, "skipped": 0}
    if stuck:
        done["stuck"] = where_now(thread)
    scouted = time.monotonic() - t0
    for _ in pids:
        tasks.put(None)
    alive = set(pids)
    while left and alive:
        while left and not results.empty():
            take()
        for pid in list(alive):
            if os.waitpid(pid, os.WNOHANG)[0]:
                alive.discard(pid)
        time.sleep(0.005)
    while not results.empty():  # the last children's last words
        take()
    for pid in alive:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    if log is not None:
        os.close(log)
    report = {**counts, "earlier": len(earlier), "lost": len(left), "specializations": len(queued) + len(earlier),
              "sequences": done["sequences"],
              "skipped": done["skipped"], "launches": book.launches, "scout_s": round(scouted, 2),
              "seconds": round(time.monotonic() - t0, 2), "processes": children,
              **({"stuck": done["stuck"]} if "stuck" in done else {})}
    if not (counts["failed"] or left or done["skipped"] or "stuck" in done):
        with contextlib.suppress(OSError):
            tmp = marker.with_name(marker.name + f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(report))
            os.replace(tmp, marker)
    say(("end", report))
    return 0


class Gate:
    """The worker's side (``launches.gate``): a launch whose specialization the coordinator queued
    and has not done waits for it (``WAIT_S`` at most); told the coordinator ended (or gone), it
    lets every launch through and takes itself off."""

    def __init__(self, conn, pid: int | None = None):
        self.conn, self.pid = conn, pid
        self.pending: set[str] = set()
        self.report: dict | None = None
        self.waits, self.waited_s, self.gated = 0, 0.0, 0
        self.open = True

    def _drain(self, timeout: float = 0.0) -> None:
        try:
            while self.conn.poll(timeout):
                what, value = self.conn.recv()
                timeout = 0.0
                if what == "queued":
                    self.pending.add(value)
                elif what == "done":
                    self.pending.discard(value)
                else:
                    self.report = value
        except (EOFError, OSError):  # the coordinator is gone: nothing more will be compiled for us
            self.report = self.report or {"error": "the coordinator ended early"}
        if self.report is not None:
            self.pending.clear()

    def __call__(self, launch) -> None:
        self._drain()
        if self.report is not None:
            self.close()
            return
        self.gated += 1
        if self.gave_up:  # (still read: a coordinator whose pipe filled up would stop its compiles)
            return
        key = digest(launch)
        if key not in self.pending:
            return
        t0, wait = time.monotonic(), min(WAIT_S, WAIT_TOTAL_S - self.waited_s)
        while key in self.pending and time.monotonic() - t0 < wait:
            self._drain(0.01)
        self.waits += 1
        self.waited_s += time.monotonic() - t0

    @property
    def gave_up(self) -> bool:
        """Waited ``WAIT_TOTAL_S`` in all: no launch waits any more."""
        return self.waited_s >= WAIT_TOTAL_S

    def close(self) -> None:
        from .launches import ungate

        if not self.open:
            return
        self.open = False
        ungate(self)
        with contextlib.suppress(OSError):
            self.conn.close()
        if self.pid is not None:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, os.WNOHANG)

    def summary(self) -> dict:
        return {"waits": self.waits, "waited_s": round(self.waited_s, 2), "gated": self.gated,
                **({"gave_up": True} if self.gave_up else {}),
                **{k: v for k, v in (self.report or {}).items()}}


_GATE: list[Gate] = []  # this worker's gate, for its final report (``state``)


def state() -> dict | None:
    """What this worker's head start did (the coordinator's report once it ended, the waits)."""
    if not _GATE:
        return None
    _GATE[0]._drain()
    return _GATE[0].summary()


def begin(opts, worker: int, start_k: int, warm: bool) -> str | None:
    """Start worker ``worker``'s head start (``wanted(opts)``), before its tier is made: a note for
    its hello, or None where none was started (a marker says it was made already). Never
    raises: a failure leaves the compiles to the launches, as without it."""
    try:
        return _begin(opts, worker, start_k, warm)
    except Exception as exc:  # noqa: BLE001 - a head start only
        return f"head start: not made ({type(exc).__name__}: {str(exc)[:200]})"


def _begin(opts, worker: int, start_k: int, warm: bool) -> str | None:
    import multiprocessing

    from .generate import warmup_seed
    from .knobs import choose
    from .launches import gate
    from .slot import sequence_seed
    from .tiers import load_kernels, select_backend

    spec = opts.tier_spec()
    select_backend("cuda")
    module = load_kernels(spec.name)  # the worker's own import of it, next, finds it loaded
    knobs = choose(module, opts.seed * 7919 + worker)  # the GPU worker's knobs (worker.fuzz_main)
    seeds = [warmup_seed(i) for i in range(opts.track.gpu_warmup if warm else 0)]
    seeds += [sequence_seed(opts, worker, k) for k in range(start_k, start_k + 2)]
    params = {"n_ops": opts.n_ops(), "hostile": opts.hostile, "check_every": opts.check_every}
    key = marker_key(module, knobs, seeds, params)
    if key is None:
        return None
    marker = _marker_dir() / key
    if marker.is_file():
        return None
    if _cuda_touched():
        return "head start: not made (this process has a CUDA context already: its children could not use CUDA)"
    target = os.environ.get("KVFUZZ_COMPILE_TARGET")
    cores = max(1, (os.cpu_count() or 1) - opts.workers)
    children = max(1, min(MAX_CHILDREN, cores // max(1, opts.workers)))
    reader, writer = multiprocessing.get_context("fork").Pipe(duplex=False)

    def coordinator() -> int:
        reader.close()
        return _coordinate(module, spec.name, seeds, knobs, params, children, writer.send, marker, target)

    pid = _fork(coordinator)
    writer.close()

    # The worker's own first launch needs Triton's key too (to look on disk): computed meanwhile,
    # mostly outside the GIL (file reads, hashing), while the worker makes its CUDA context.
    threading.Thread(target=_triton_key, name="kvfuzz-triton-key", daemon=True).start()
    g = Gate(reader, pid)
    _GATE[:] = [g]
    gate(g)
    return (f"head start: the smoke test and {len(seeds)} sequences scouted, their specializations compiled on "
            f"{children} processes beside this worker, each launch waiting for its own (head_start.py)")


def _cuda_touched() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and getattr(torch.cuda, "is_initialized", lambda: False)())
