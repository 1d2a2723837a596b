"""Tiers and kernel sets: what runs the target, and where.

The interpreter tier only works if ``TRITON_INTERPRET=1`` is in the environment when
Triton decorates a kernel (``triton.jit`` reads it then, 3.6 through 3.9), and
``triton.language``'s own ``@jit`` functions (``tl.sum``, ``tl.cdiv``, ...) are decorated
when ``triton`` is imported. So ``select_backend`` must run before anything imports
triton in the other mode or a kernel set; it refuses (SetupError) when a ``@triton.jit``
function already decorated the other way says that is no longer possible (a child
forked from ``zygote``'s server has triton imported in its own mode already: fine).

A tier that runs Triton (interpret, cuda) must actually launch Triton kernels: the
smoke test counts launches (``count_launches``), and a kernel set whose wrappers send
CPU tensors to a torch fallback is refused on the interpreter tier instead of
reporting a clean run of kernels it never ran.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from .verdict import SetupError

BACKENDS = ("torch", "interpret", "cuda")
REQUIRED = ("alloc_bind_inplace", "free_unbind_inplace", "bind_inplace", "build_kv_read_table")
OPTIONAL = ("build_kv_read_table_packed", "build_kv_read_table_legacy", "translate_tokens")


@dataclass(frozen=True)
class Tier:
    backend: str
    kernels_name: str
    kernels: ModuleType
    device: str
    allocator_cls: type | None = None  # None: kvkernels.DeviceAllocator (mutants swap it; allocators.Protocol)
    allocator_name: str | None = None  # as named by --allocator (None: the default, ours)
    allocator_skips: frozenset = frozenset()  # op kinds the allocator lacks (allocators.PARTS): skipped
    spec_rules: frozenset = frozenset()  # kvref.RULES the allocator declares it follows (KVFUZZ_SPEC_RULES)

    def has(self, fn: str) -> bool:
        return callable(getattr(self.kernels, fn, None))


def select_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise SetupError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "interpret":
        if wrong := decorated_as(interpreted=False):
            raise SetupError(f"--backend interpret must be chosen before triton is imported (set TRITON_INTERPRET=1): "
                             f"{', '.join(wrong)} already hold compiled @triton.jit functions")
        os.environ["TRITON_INTERPRET"] = "1"
    elif backend == "cuda":
        if os.environ.get("TRITON_INTERPRET") == "1":
            raise SetupError("--backend cuda with TRITON_INTERPRET=1 set: unset it to run compiled kernels")
        if wrong := decorated_as(interpreted=True):
            raise SetupError(f"--backend cuda: {', '.join(wrong)} were decorated under TRITON_INTERPRET=1 (interpreted "
                             f"@triton.jit functions); run it in a process that imports triton without it")


def decorated_as(interpreted: bool) -> list[str]:
    """The modules already imported that hold ``@triton.jit`` functions decorated as
    interpreted (or as compiled) ones: ``triton.language.standard`` as soon as triton is
    imported, a kernel set once loaded. Autotuned and heuristic wrappers are looked through."""
    if "triton.runtime.jit" not in sys.modules:
        return []
    from triton.runtime.jit import KernelInterface

    def interprets(fn) -> bool | None:
        while issubclass(type(fn), KernelInterface):  # type(), not isinstance: no object's __class__ is run
            names = {c.__name__ for c in type(fn).__mro__}
            if "GluonJITFunction" in names:  # Gluon's are compiled under TRITON_INTERPRET too (3.9 imports them)
                return None
            if names & {"InterpretedFunction", "JITFunction"}:
                return "InterpretedFunction" in names
            fn = getattr(fn, "fn", None)  # an Autotuner's or Heuristics' kernel
        return None

    found = []
    for name, module in list(sys.modules.items()):
        try:
            if any(interprets(v) is interpreted for v in list(vars(module).values())):
                found.append(name)
        except Exception:  # noqa: BLE001, S112 - a module without a plain namespace holds no kernel
            continue
    return sorted(found)


def default_kernels(backend: str) -> str:
    return "kvkernels.torch_path" if backend == "torch" else "kvkernels"


def load_kernels(name: str) -> ModuleType:
    """A kernel set from a dotted module name or a path to a .py file."""
    name = {"kvfuzz-sglang": "fuzz.clients.sglang"}.get(name, name)  # client adapters' short names (fuzz/clients/)
    if name.endswith(".py") or os.sep in name:
        path = Path(name)
        if not path.is_file():
            raise SetupError(f"--kernels {name}: no such file")
        from .sources import load_file

        module = load_file(path, "kernels", "--kernels", name)
    else:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise SetupError(f"--kernels {name}: cannot import: {exc}") from exc
    missing = [fn for fn in REQUIRED if not callable(getattr(module, fn, None))]
    if missing:
        raise SetupError(f"--kernels {name}: not a kernel set, missing {', '.join(missing)}")
    return module


def make_tier(backend: str, kernels: str | None = None) -> Tier:
    select_backend(backend)
    name = kernels or default_kernels(backend)
    module = load_kernels(name)
    device = "cpu"
    if backend == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SetupError("--backend cuda: no CUDA device is available")
        device = "cuda"
    if backend == "interpret":
        patch_language_once()  # a third of the interpreter's time, saved (its docstring says why)
    before = count_launches()
    _smoke_test(module, name, backend, device)
    if backend != "torch" and count_launches() == before:
        where = "CPU tensors" if backend == "interpret" else "CUDA tensors"
        raise SetupError(f"--kernels {name} launched no Triton kernel on the {backend} tier: its functions "
                         f"dispatched {where} elsewhere (a torch fallback?), so this tier would test nothing. "
                         f"Fuzz its fallback with --backend torch, or its Triton kernels on a GPU (--backend cuda)")
    return Tier(backend, name, module, device)


def count_launches() -> int:
    """Triton kernel launches in this process so far (``launches.count``: one hook for
    counting, recording and program order)."""
    from . import launches

    launches.install()
    return launches.count()


@dataclass(frozen=True)
class TierSpec:
    """How to build a tier, in a form a child process can be handed: a backend and a
    kernel set, or a factory (``"module:function"``, called with ``arg`` and the backend)
    for tiers that are not a plain kernel set, such as a mutant's."""

    backend: str
    kernels: str | None = None
    factory: str | None = None
    arg: str | None = None
    allocator: str | None = None  # MODULE_OR_FILE[:FACTORY] (allocators.py); None: ours

    @property
    def name(self) -> str:
        return self.arg if self.factory else (self.kernels or default_kernels(self.backend))

    def make(self) -> Tier:
        select_backend(self.backend)
        if self.factory:
            module, fn = self.factory.split(":")
            tier = getattr(importlib.import_module(module), fn)(self.arg, self.backend)
        else:
            tier = make_tier(self.backend, self.kernels)
        if self.allocator:
            from .allocators import attach

            tier = attach(tier, self.allocator)
        return tier


def smoke_calls(module: ModuleType, device: str) -> list[tuple[str, object]]:
    """The smoke test's calls, by name, in order: one tiny bind, free, bind and read table on
    scratch tables (``benchmarks/profile_ready.py`` times each)."""
    import torch

    def ids(*xs):
        return torch.tensor(xs, dtype=torch.int64, device=device)

    # Tables inside wide margins: a kernel that stores out of bounds is the fuzzer's finding
    # to report, not a reason to refuse the kernel set here.
    v2p = torch.full((132,), -1, dtype=torch.int64, device=device)[64:68]
    p2v = torch.full((132,), -1, dtype=torch.int64, device=device)[64:68]
    return [("alloc_bind", lambda: module.alloc_bind_inplace(ids(1), v2p, p2v, 2)),
            ("free_unbind", lambda: module.free_unbind_inplace(ids(1), v2p, p2v)),
            ("bind", lambda: module.bind_inplace(ids(1), ids(2), v2p, p2v)),
            ("read_table", lambda: module.build_kv_read_table(
                req_to_token=ids(1, 1).reshape(1, 2), req_pool_indices=ids(0), seq_lens=ids(1), v2p=v2p,
                multiplier=1, page_size=1, max_pages=1, out=torch.zeros(1, 1, dtype=torch.int32, device=device)))]


def _smoke_test(module: ModuleType, name: str, backend: str, device: str) -> None:
    """One tiny bind on scratch tables (``smoke_calls``), so a kernel set that cannot run on
    this tier is a setup error up front (exit 2), not a 'crash' finding on every op."""
    from .verdict import is_compile_error

    for _, call in smoke_calls(module, device):
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - any failure here means the tier is unusable
            if is_compile_error(exc):
                # A kernel that does not compile at this input (an int argument of 1 is a
                # constexpr on a GPU) is a finding: the campaign meets the input again and
                # reports OP/crash/compile-error; --scale compile names the specialization.
                continue
            hint = " (a Triton kernel set runs on the CPU only with --backend interpret)" if backend == "torch" else ""
            raise SetupError(f"--kernels {name} cannot run on the {backend} tier: {type(exc).__name__}: "
                             f"{exc}{hint}") from exc


def patch_language_once() -> bool:
    """Make Triton's interpreter patch ``triton.language`` once per launch, not once per call
    of a nested ``@triton.jit`` function. Whether it took (False: a Triton without these
    internals, which then runs as it is).

    Why. The interpreter (``triton.runtime.interpreter``, 3.6 through 3.9) patches the
    language modules for a launch (``GridExecutor.__call__``: ``_patch_lang``, then the scope's
    ``restore``), and patches them again at *every* call of a device function inside it
    (``InterpretedFunction.__call__``), scanning ``tl``, ``tl.core``, ``tl.tensor`` and
    ``tl.math`` with ``inspect.getmembers`` and never restoring that scope. Inside a launch
    those scans find nothing left to patch: the launch replaced every builtin already, and the
    attributes the rest sets get the same values. Measured on kvkernels' read tables (Triton
    3.9, this project's CPU): a third of the interpreter's time went to those scans.

    What changes. A call whose language modules a launch in progress has patched (its own scope,
    or a device function's inside it) gets an empty scope; any other call runs Triton's own
    ``_patch_lang``. A launch's restore ends its claim and those of the device functions inside
    it (Triton's restore undoes theirs too: they patched over what it had recorded). Nothing else of the interpreter is touched; the kernels' results are the same
    (the interpreter-tier suite runs with it)."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    patch, scope_cls = getattr(interpreter, "_patch_lang", None), getattr(interpreter, "_LangPatchScope", None)
    if getattr(patch, "_kvfuzz_once", False):
        return True
    if patch is None or scope_cls is None or not callable(getattr(scope_cls, "restore", None)):
        return False
    # The language modules patched by each scope not restored yet, outermost first. A device
    # function's scope is never restored: the launch's restore undoes it, and so drops it here too.
    patched: list[frozenset] = []

    def once(fn):
        # Read at each call, not cached per function: a module's globals may gain triton.language
        # later (triton.language.standard's do), and a claim from a stale set would leave it unpatched.
        langs = frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))
        if any(langs <= held for held in patched):
            return scope_cls()
        scope = patch(fn)
        depth = len(patched)
        patched.append(langs)
        restore = scope.restore

        def restored():
            try:
                restore()
            finally:
                del patched[depth:]

        scope.restore = restored
        return scope

    once._kvfuzz_once = True
    interpreter._patch_lang = once
    return True
