"""A launch's compile inputs as JSON (a *recipe*), and compiling or loading one in any process.

The compile-ahead (``ahead``) learns, in one process, what a campaign's workers will launch,
compiles it in others, and has the workers load it into their own kernels; what travels
between them is a recipe per specialization: the kernel (qualname and file) and its arguments
with each tensor replaced by its dtype and 16-byte alignment, the two things Triton's key reads
of a tensor. ``decode`` turns those into Triton's ``MockTensor`` with a pointer of the same
alignment, so ``warmup`` (Triton's own binder) computes the very key the real launch computes.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ..signatures import specialization

RECIPES_ENV = "KVFUZZ_AHEAD_RECIPES"  # a campaign's children preload the recipes this file holds


class Unencodable(Exception):
    """An argument a recipe cannot carry to another process (a JITFunction, an object)."""


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
        self.launches += 1
        key = repr(specialization(launch))
        if key in self.recipes or key in self.unencodable:
            return
        try:
            self.recipes[key] = recipe(launch)
        except Unencodable as exc:
            self.unencodable[key] = f"{launch.name}: {exc}"


class StandInDriver:
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


def compile_recipe(fn, item: dict, on_device: bool = False, then=None) -> dict:
    """Compile ``item`` for ``fn`` (its JITFunction) with ``warmup``, and with ``on_device`` load
    it onto the GPU too; ``then(kernel)`` after, if given; whether Triton found it on disk
    already (``hit``, where Triton's compilation listener says)."""
    if fn is None:
        return {"ok": False, "error": f"no @triton.jit kernel {item['kernel']} ({item['file']}) in the set"}
    hits: list[bool] = []
    knobs = _knobs()
    previous = getattr(knobs, "listener", None)
    if knobs is not None:
        knobs.listener = lambda **kw: hits.append(bool(kw.get("cache_hit")))
    t0 = time.perf_counter()
    try:
        kernel = fn.warmup(*[decode(a) for a in item["args"]], grid=(1,),
                           **{k: decode(v) for k, v in item["kwargs"].items()})
        if on_device:
            _onto_device(kernel)
        if then is not None:
            then(kernel)
    except Exception as exc:  # noqa: BLE001 - a variant that does not compile: the campaign meets it as a case
        return {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[-300:]}", "seconds": time.perf_counter() - t0}
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


def gpu_here() -> bool:
    import torch

    return torch.cuda.is_available()


def preload(path: str | os.PathLike) -> dict:
    """Load the recipes ``path`` holds (``recipes_out``, all compiled ahead) into this process's
    kernels: ``warmup`` of each finds it on disk and keeps it in the JITFunction's own cache, and
    on a GPU it is loaded onto the device too, so a launch later neither compiles nor loads. For
    a worker before it fuzzes, and a benchmark before its clock, once its set is loaded."""
    from ..compile_check.child import jit_index

    index = jit_index()  # this process's JITFunctions: the set is loaded once per process
    t0, loaded, failed = time.perf_counter(), 0, 0
    gpu = gpu_here()
    for item in json.loads(Path(path).read_text()):
        if compile_recipe(index.get((item["kernel"], item["file"])), item, on_device=gpu)["ok"]:
            loaded += 1
        else:  # left to its launch, which compiles it (or fails there, a case)
            failed += 1
    return {"loaded": loaded, "failed": failed, "seconds": round(time.perf_counter() - t0, 2)}


def preload_ahead(tier) -> str | None:
    """A campaign child's preload (``RECIPES_ENV``), on a GPU tier only; a note for its hello."""
    path = os.environ.get(RECIPES_ENV)
    if not path or not str(tier.device).startswith("cuda") or not Path(path).is_file():
        return None
    try:
        done = preload(path)
    except Exception as exc:  # noqa: BLE001 - a head start only: the launches compile or load what it could not
        return f"compile-ahead: the workers could not preload what was compiled ahead ({type(exc).__name__}: {exc})"
    return f"compile-ahead: each worker preloads the {done['loaded'] + done['failed']} kernels compiled ahead" + (
        f" ({done['failed']} could not be)" if done["failed"] else "")
