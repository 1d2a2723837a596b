"""The one place kvfuzz hooks Triton's launch path, and the interpreter's program order.

Every launch, ``kernel[grid](...)`` and autotuned ones alike, passes ``JITFunction.run``
(compiled) or ``InterpretedFunction.run`` (interpreter), ``run(self, *args, grid, warmup,
**kwargs)`` in Triton 3.6 through 3.9. ``install()`` wraps those (where a class defines
``run`` itself) once, and feeds every subscriber from that one wrapper:

* ``count()``: non-warmup launches in this process (a warm-up compiles, launches nothing).
* ``Recorder``: the outermost non-warmup launches made in its thread while it is entered
  (other threads, e.g. a campaign's minimizers, are not mixed in), as ``Launch`` objects
  whose ``replay()`` re-issues the launch with the same objects: the CUDA-graph emulation.
  ``Recorder.inside`` says whether the thread is inside a launch, so graph.py keeps its
  ``_AllocWatch`` (a TorchDispatchMode) and ``stale_args`` in a subclass that enters the
  mode after ``super().__enter__()``; torch dispatch stays out of this module.
* ``observe(callback)`` / ``Seen``: every outermost launch in any thread, after it ran, with
  its int constexprs and the grid Triton resolved, so boundaries can come from what the
  launchers actually pass (a literal ``BLOCK=256``), not only from declared knobs.
* ``record_only(callback)``: while entered, an outermost launch is described (its callable
  grid resolved here, as Triton would), handed to ``callback``, recorders and observers, and
  *not* run: nothing compiles, nothing touches a driver, so the launchers' op streams can be
  walked on a CPU to learn which specializations a GPU campaign will compile
  (``production.ahead``, the compile-ahead scout).

Compiles and loads: a compiled launch that adds a variant to its kernel's cache either
compiled it or loaded it from the on-disk cache (``TRITON_CACHE_DIR``). Where Triton has a
compilation listener (``knobs.compilation.listener``, called with ``cache_hit``), ``install``
chains one in, and a variant that only hit the disk cache counts as a load (``loads()``),
not a compile; elsewhere every new variant counts as a compile.

``program_order(mode, seed)`` runs the programs of each interpreted launch in a seeded order
other than the interpreter's x/y/z loops (``set_program_order`` for a worker process; the
per-launch counter restarts with it, so a case replayed from its start with the same mode
and seed gets the same order at every launch). It wraps only ``GridExecutor.__call__``,
which compiled launches never reach: on a GPU it changes nothing. It can show a kernel
whose result depends on which program runs first: programs claiming work or output slots
with atomics, a "last program finishes the reduction" ticket, a program reading what an
"earlier" one wrote, racing plain stores to one address (the last writer differs). It
cannot show interleavings inside programs: each program still runs to completion, all its
lanes together, before the next starts, so lost updates between concurrent programs, a
missing fence or a weak memory order stay invisible, and a program that spin-waits on a
later one hangs in any order.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import random
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

from .budget import _BUDGETS, OverBudget
from .budget import charge as _charge
from .compile_tally import (  # noqa: F401 - the launch hook's counts
    _HITS,
    _listen_compiles,
    _note_compile,
    _variants,
    compile_seconds,
    compiles,
    load_seconds,
    loads,
)
from .signatures import _params, int_constexprs, kernel_name

MODES = ("launch", "reversed", "shuffled", "interleaved", "random")
_COUNT = [0]
_LOCAL = threading.local()  # .depth: launches this thread is inside; .recorders: Recorders entered here
_OBSERVERS: list = []
_ORDER = {"mode": "launch", "seed": 0, "launches": 0}
_UNTRACED = [0]  # > 0: outermost launches run with this thread's trace function off (features.CodeCoverage)
_LIGHT = [False]  # every observer takes a launch light (``_run_light``): no Launch built for it
_RECORD_ONLY: list = []  # callbacks of record_only(): while any, launches are recorded and not run
_GATES: list = []  # callbacks of gate(): each handed an outermost launch before it runs (and may wait)
_CLOCKS: list = []  # (enter, leave) of clock(): around each outermost compiled launch


@dataclass
class Launch:
    """One launch as the launcher made it, to replay it (graph emulation) or learn from it."""

    fn: object  # the JITFunction / InterpretedFunction
    grid: object  # as passed: a tuple or a callable of the meta args
    args: tuple
    kwargs: dict  # without grid and warmup
    run: object  # the unwrapped run method
    constexprs: dict = field(default_factory=dict)  # int constexpr name -> value (bools left out)
    grid_dims: tuple | None = None  # the grid as Triton resolved it (not padded to 3); None: unreadable

    @property
    def name(self) -> str:
        return kernel_name(self.fn)

    def replay(self) -> None:
        """Re-issue this launch: counted, not recorded or observed again (nor run under
        ``record_only``, like the launch itself)."""
        _COUNT[0] += 1
        if _RECORD_ONLY:
            return
        with _inside():
            self.run(self.fn, *self.args, grid=self.grid, warmup=False, **self.kwargs)


@contextlib.contextmanager
def _inside():
    depth = getattr(_LOCAL, "depth", 0)
    _LOCAL.depth = depth + 1
    tracer = sys.gettrace() if _UNTRACED[0] and not depth else None
    if tracer is not None:
        sys.settrace(None)
    try:
        yield
    finally:
        _LOCAL.depth = depth
        if tracer is not None:
            sys.settrace(tracer)


@contextlib.contextmanager
def untraced_launches():
    """Launches inside run with the thread's trace function off: a line tracer measuring the
    host code (``features.CodeCoverage``) would otherwise trace the interpreter's own Python
    for every program of every launch, which costs more than the launch."""
    _UNTRACED[0] += 1
    try:
        yield
    finally:
        _UNTRACED[0] -= 1


def clock(enter, leave) -> None:
    """Call ``enter()`` as each outermost compiled launch begins and ``leave(enter's value)``
    once it returns (its head-start wait, any compile or load, the launch): a worker's heartbeat
    leaves that time out of its op's clock (``supervise.Beat.launching``). Not for interpreted
    launches, which run the kernel itself, where a hang must stay a hang."""
    install()
    _CLOCKS[:] = [(enter, leave)]


def _wrap(original):
    def run(self, *args, **kwargs):
        if kwargs.get("warmup", False):
            return original(self, *args, **kwargs)
        if not _CLOCKS or getattr(_LOCAL, "depth", 0) or _RECORD_ONLY or type(self).__name__ == "InterpretedFunction":
            return _run(self, args, kwargs)
        enter, leave = _CLOCKS[0]
        token = enter()
        try:
            return _run(self, args, kwargs)
        finally:
            leave(token)

    def _run(self, args, kwargs):
        _COUNT[0] += 1
        recorders = getattr(_LOCAL, "recorders", ())
        nested = getattr(_LOCAL, "depth", 0) > 0
        if _RECORD_ONLY and not nested:
            return _record_only(self, args, kwargs, original, recorders)
        launch = _describe(self, args, kwargs, original) if _GATES and not nested else None  # once, gated or not
        for callback in list(_GATES) if launch is not None else ():
            callback(launch)
        if nested or not (recorders or _OBSERVERS or _BUDGETS):
            return _timed(self, args, kwargs, original, nested)
        if _LIGHT[0] and not recorders and not _BUDGETS:
            return _run_light(self, args, kwargs, original)
        launch = launch or _describe(self, args, kwargs, original)
        for rec in recorders:
            rec.launches.append(launch)
        if callable(grid := kwargs.get("grid")):  # noted when Triton resolves it: never called twice

            def resolve(meta, grid=grid):
                dims = grid(meta)
                with contextlib.suppress(Exception):
                    launch.grid_dims = tuple(int(d) for d in dims)
                _charge(launch)
                return dims

            kwargs["grid"] = resolve
        over = False
        try:
            if not callable(grid):
                _charge(launch)
            return _timed(self, args, kwargs, original)
        except OverBudget:
            over = True
            for rec in recorders:
                rec.launches.pop()
            raise
        finally:
            for callback in [] if over else list(_OBSERVERS):
                callback(launch)

    run._kvfuzz_original = original
    return functools.update_wrapper(run, original, assigned=("__name__", "__qualname__", "__doc__"))


def _timed(fn, args, kwargs, original, nested: bool = False):
    """Run the launch inside the hook (``_inside``); an outermost one's seconds are noted, and
    whether it compiled or loaded a variant (``_note_compile``)."""
    t0, variants, hits = time.perf_counter(), None if nested else _variants(fn), tuple(_HITS)
    try:
        with _inside():
            return original(fn, *args, **kwargs)
    finally:
        if not nested:
            _note_compile(fn, time.perf_counter() - t0, variants, hits)


def _run_light(fn, args, kwargs, original):
    """A launch whose every observer takes it light (``light(fn, args, kwargs, dims)``, as
    ``features.Collector`` does): no ``Launch`` is built for it, only its grid's dims kept where
    Triton resolves them. On a GPU, describing each launch cost more than collecting its features
    (benchmarks/guided_vs_blind.py --parts hook)."""
    grid, dims = kwargs.get("grid"), [kwargs.get("grid")]
    if callable(grid):

        def resolve(meta):
            dims[0] = got = grid(meta)
            return got

        kwargs["grid"] = resolve
    try:
        return _timed(fn, args, kwargs, original)
    finally:
        kwargs["grid"] = grid
        for callback in list(_OBSERVERS):
            callback.light(fn, args, kwargs, None if callable(dims[0]) else dims[0])


def _record_only(fn, args, kwargs, original, recorders) -> None:
    """A launch under ``record_only``: described, its callable grid resolved with the bound
    arguments Triton would pass it, handed to every callback, and not run."""
    launch = _describe(fn, args, kwargs, original)
    grid = kwargs.get("grid")
    if callable(grid):
        with contextlib.suppress(Exception):  # a grid that needs more than the arguments: left unresolved
            launch.grid_dims = tuple(int(d) for d in grid(bound_arguments(launch)))
    for rec in recorders:
        rec.launches.append(launch)
    for callback in (*_RECORD_ONLY, *_OBSERVERS):
        callback(launch)
    return None


@contextlib.contextmanager
def record_only(callback):
    """While entered, every outermost launch in this process is handed to ``callback`` (and
    to recorders and observers) instead of running: no compile, no driver call. What the
    launchers compute from a kernel's results is garbage then; the caller knows."""
    install()
    _RECORD_ONLY.append(callback)
    try:
        yield
    finally:
        _RECORD_ONLY.remove(callback)


def gate(callback) -> None:
    """Hand each outermost launch to ``callback`` before it runs, until ``ungate(callback)``
    (``head_start``: it waits while a child compiles the launch's variant)."""
    install()
    _GATES.append(callback)


def ungate(callback) -> None:
    with contextlib.suppress(ValueError):
        _GATES.remove(callback)


def bound_arguments(launch: Launch) -> dict:
    """The launch's arguments by parameter name, defaults applied: what Triton hands a callable
    grid (``meta``) and what a compile of the same specialization needs."""
    sig, _ = _params(getattr(launch.fn, "fn", launch.fn))
    if sig is None:
        return {}
    bound = sig.bind(*launch.args, **{k: v for k, v in launch.kwargs.items() if k in sig.parameters})
    bound.apply_defaults()
    return dict(bound.arguments)


def install() -> bool:
    """Wrap the launch methods once. Safe to call again: not stacked on our own wrapper, kept
    when something else wrapped on top of it, redone when someone restored the original,
    and replaced (not stacked) when this module was reloaded. It imports Triton, so call it
    (or count(), Recorder, observe) after tiers.select_backend. False without Triton."""
    classes = []
    for mod, name in (("triton.runtime.jit", "JITFunction"), ("triton.runtime.interpreter", "InterpretedFunction")):
        with contextlib.suppress(ImportError, AttributeError):
            classes.append(getattr(__import__(mod, fromlist=[name]), name))
    for cls in classes:
        run, hook = vars(cls).get("run"), vars(cls).get("_kvfuzz_hook")
        if run is None or getattr(run, "_kvfuzz_wrap", None) is _wrap:
            continue
        if hasattr(run, "_kvfuzz_original"):  # ours, from before a reload
            run = run._kvfuzz_original
        elif hook is not None and run is not hook:  # wrapped above ours: we are still in the chain
            continue
        cls.run = _wrap(run)
        cls.run._kvfuzz_wrap = _wrap
        cls._kvfuzz_hook = run
    if classes:
        _listen_compiles()
    return bool(classes)


def count() -> int:
    """Non-warmup Triton launches in this process so far (replays included)."""
    install()
    return _COUNT[0]


def _describe(fn, args, kwargs, original) -> Launch:
    grid = kwargs.get("grid")
    rest = {k: v for k, v in kwargs.items() if k not in ("grid", "warmup")}
    launch = Launch(fn, grid, args, rest, original, int_constexprs(getattr(fn, "fn", fn), args, rest))
    if grid is not None and not callable(grid):
        with contextlib.suppress(Exception):
            launch.grid_dims = tuple(int(d) for d in grid)
    return launch


class Recorder:
    """Context manager: the outermost non-warmup launches made in this thread inside it."""

    def __init__(self):
        self.launches: list[Launch] = []

    @property
    def inside(self) -> bool:
        """Whether this thread is inside a launch (the interpreter's own torch ops run there)."""
        return getattr(_LOCAL, "depth", 0) > 0

    def __enter__(self):
        install()
        _LOCAL.recorders = (*getattr(_LOCAL, "recorders", ()), self)
        return self

    def __exit__(self, *exc):
        _LOCAL.recorders = tuple(r for r in getattr(_LOCAL, "recorders", ()) if r is not self)


def observe(callback):
    """Call ``callback(launch)`` after every outermost non-warmup launch in this process, until
    the returned function is called."""
    install()
    _OBSERVERS.append(callback)
    _relight()

    def stop():
        if callback in _OBSERVERS:
            _OBSERVERS.remove(callback)
            _relight()

    return stop


def _relight() -> None:
    _LIGHT[0] = bool(_OBSERVERS) and all(callable(getattr(cb, "light", None)) for cb in _OBSERVERS)


class Seen:
    """An observer accumulating, per kernel name, the int constexpr values and the grids seen:
    ``constexprs[name][param] -> {values}``, ``grids[name] -> {dims}`` (None: unresolved)."""

    def __init__(self):
        self.constexprs: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
        self.grids: dict[str, set] = defaultdict(set)

    def __call__(self, launch: Launch) -> None:
        for k, v in launch.constexprs.items():
            self.constexprs[launch.name][k].add(v)
        self.grids[launch.name].add(launch.grid_dims)

    def __enter__(self):
        self._stop = observe(self)
        return self

    def __exit__(self, *exc):
        self._stop()


# ---- program order on the interpreter -------------------------------------------------------------


def order_for(mode: str, seed: int, launch, n: int) -> list[int]:
    """The order, as positions in launch order, of the ``n`` programs of an interpreted
    launch of kernel ``launch`` (its name: the draw depends on the seed and the kernel, never
    on how many launches came before, so a minimized case, which launches less before the
    failing op, draws the same order for it): ``reversed``; ``shuffled`` (a permutation);
    ``interleaved`` (the residue classes of a drawn stride 2..4, from a drawn class on: even
    ids then odd, or by three or four); ``random`` (one of those three, drawn per launch)."""
    rng = random.Random(f"kvfuzz-order:{seed}:{launch}")
    if mode == "random":
        mode = rng.choice(MODES[1:4])
    if mode == "reversed":
        return list(range(n - 1, -1, -1))
    if mode == "shuffled":
        order = list(range(n))
        rng.shuffle(order)
        return order
    if mode == "interleaved":
        stride = min(max(n, 1), rng.choice((2, 3, 4)))
        first = rng.randrange(stride)
        return [i for r in range(stride) for i in range((first + r) % stride, n, stride)]
    return list(range(n))


def set_program_order(mode: str = "launch", seed: int = 0) -> None:
    """Set the order process-wide (a worker process: once per sequence, with its seed)."""
    if mode not in MODES:
        raise ValueError(f"program order {mode!r}: choose one of {', '.join(MODES)}")
    _ORDER.update(mode=mode, seed=int(seed), launches=0)
    if mode != "launch":
        _install_order()


def program_order_mode() -> str:
    """The order interpreted launches run their programs in now (``MODES``; "launch": the interpreter's own)."""
    return _ORDER["mode"]


@contextlib.contextmanager
def program_order(mode: str, seed: int = 0):
    """``set_program_order`` for a block; the previous order (and its counter) comes back."""
    saved = dict(_ORDER)
    set_program_order(mode, seed)
    try:
        yield
    finally:
        _ORDER.update(saved)


class _Deferred:
    """``GridExecutor.fn`` for one launch. The interpreter's loop calls it once per program
    after ``set_grid_idx``: it notes the index, and at the last one runs the real program for
    every index in the drawn order, one after the other, ``program_id`` set as the loop would.
    Other attributes (``__globals__``, read to patch triton.language) are the real
    function's; ``__signature__`` keeps ``inspect.getcallargs`` working."""

    def __init__(self, fn, builder, launch):
        self._fn, self._builder, self._launch, self._idx = fn, builder, launch, []
        self.__signature__ = inspect.signature(fn)

    def __getattr__(self, name):
        return getattr(self._fn, name)

    def __call__(self, *args, **kwargs):
        b = self._builder
        self._idx.append(tuple(b.grid_idx))
        if len(self._idx) == math.prod(b.grid_dim):
            for i in order_for(_ORDER["mode"], _ORDER["seed"], self._launch, len(self._idx)):
                b.set_grid_idx(*self._idx[i])
                self._fn(*args, **kwargs)
            self._idx = None  # all ran


def _install_order() -> None:
    try:
        from triton.runtime import interpreter
        executor = interpreter.GridExecutor
    except (ImportError, AttributeError):
        return
    call = vars(executor)["__call__"]
    if getattr(call, "_kvfuzz_order", None) is _ORDER:
        return
    call = getattr(call, "_kvfuzz_call", call)  # ours from before a reload: replaced, not stacked
    builder = getattr(interpreter, "interpreter_builder", None)

    def ordered(self, *args, **kwargs):
        if _ORDER["mode"] == "launch" or not hasattr(builder, "set_grid_idx") or not callable(getattr(self, "fn", 0)):
            return call(self, *args, **kwargs)
        _ORDER["launches"] += 1
        key = getattr(self.fn, "__name__", "?")
        fn, self.fn = self.fn, (deferred := _Deferred(self.fn, builder, key))
        try:
            out = call(self, *args, **kwargs)
        finally:
            self.fn = fn
        if deferred._idx:  # never silently drop programs under a grid loop this was not written for
            raise RuntimeError(f"program order {_ORDER['mode']!r}: the interpreter's grid loop did not call "
                               f"every program once ({len(deferred._idx)} of {math.prod(builder.grid_dim)})")
        return out

    ordered._kvfuzz_order, ordered._kvfuzz_call = _ORDER, call
    executor.__call__ = ordered


@contextlib.contextmanager
def budget(check):
    """While entered, ``check(programs)`` is asked before each outermost launch runs; true
    raises ``budget.OverBudget`` there, and the launch does not run."""
    install()
    _BUDGETS.append(check)
    try:
        yield
    finally:
        _BUDGETS.remove(check)
