"""Runtime host-sync detector that works on the CPU (SPEC.md §5, oracle 5, second of three).

Why it exists: on a GPU, ``torch.cuda.set_sync_debug_mode("error")`` tells us when the
host waits for the device, but CI has no GPU. On the CPU every tensor already lives on
the host, so nothing *actually* synchronises; this detector instead reasons about what
*would* synchronise if the page tables lived on a device. It watches two layers:

- a ``TorchDispatchMode`` sees every ATen op with its real arguments (after Python
  indexing has been lowered: ``t[idx] = -1`` arrives as ``lift_fresh`` + ``index_put_``);
- a ``TorchFunctionMode`` sees the Python-level calls that never reach the dispatcher
  on the CPU (``Tensor.tolist``, ``Tensor.numpy``, ``Tensor.cpu``), the factories (to
  learn which tensors a GPU program would have created on the host), and ``.to``.
  The ``*.synchronize()`` entry points are not torch functions, so they are patched for
  the duration of the context.

The device model ("emulation"): with ``device="cpu"`` (the CPU tiers), every tensor is
a *device* tensor unless the detector saw it being created on the host: the 0-dim
tensor a Python scalar becomes in ``t[...] = -1`` (``aten.lift_fresh``), a factory called
without ``device=`` (``torch.tensor([..])``, ``torch.arange(n)``), the result of
``.cpu()``/``.numpy()``, and anything computed only from host tensors. With a real
accelerator device (``device="cuda"``), host means ``tensor.device.type == "cpu"``.

What is flagged (each is a host wait on a GPU):

- ``aten._local_scalar_dense`` on a device tensor: ``.item()``, ``int()``, ``float()``,
  ``bool()``, ``if t:``, ``__index__`` (a tensor used as a size, slice bound or range);
- ops whose output size depends on device data: ``nonzero``, ``unique*``,
  ``masked_select``, ``repeat_interleave`` without ``output_size``, ``index.Tensor``
  with a boolean mask, ``index_put_`` with a boolean mask (except the masked_fill fast
  path ATen takes when the value is a one-element host tensor), and ops returning a
  Python bool (``equal``, ``allclose``, ``is_nonzero``);
- host↔device copies that block: ``index_put_`` of a host 0-dim value (a Python
  scalar scattered into a device table), ``copy_`` from a host tensor into a device
  tensor or back, ``.to(device)`` of a host tensor without ``non_blocking=True`` from
  pinned memory, ``torch.tensor(data, device=…)``; a host tensor of more than one
  element fed to an op with device tensors (an implicit copy or a device error);
- Python-level reads: ``.tolist()``, ``.numpy()``, ``.cpu()``, ``__array__``,
  ``__repr__``/``__format__`` of a device tensor; any ``synchronize()``.

Not flagged, on purpose: integer-tensor indexing (``t[idx]``, ``t[idx] = vals``),
``index_fill_``/``fill_``/``masked_fill_``/``scatter_`` with a scalar (the scalar is a
kernel argument), slice assignment of a scalar (a ``fill_`` on a view), ``numel``,
``shape``, ``len``, and everything inside a Triton interpreter launch (the interpreter
moves tensors through numpy on the CPU; a compiled launch would not touch the host).

Known limits: ``.to("cpu")`` of a device tensor is invisible on the CPU tier (the call
returns its input, and ``"cpu"`` is also the emulated device's name); tensors created
before the context are all taken to be device tensors; a host tensor passed through
``.to(self.device)`` on the CPU tier becomes a device tensor *object-wide*; the patched
``synchronize`` functions are process-global while a context is open. Calibration on
the corpus (``fuzz.sync.calibrate``) measures what these limits cost.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import sys
import threading
import weakref
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .sync_ops import (
    _DATA_DEPENDENT_SHAPE,
    _FACTORIES,
    _FROM_HOST_DATA,
    _SCALAR_READ_METHODS,
    _func_name,
    _op_base_name,
    _op_label,
)

__all__ = [
    "HostSyncDetector",
    "HostSyncError",
    "SyncEvent",
    "no_host_sync",
    "record_host_syncs",
]


class HostSyncError(RuntimeError):
    """A host synchronisation happened where SPEC.md §5 forbids one."""

    def __init__(self, events: list[SyncEvent]):
        self.events = list(events)
        lines = "\n".join(f"  - {e.describe()}" for e in self.events)
        super().__init__(f"{len(self.events)} host synchronisation(s) on a no-sync path:\n{lines}")


@dataclass(frozen=True)
class SyncEvent:
    op: str  # the torch op or Python method, e.g. "aten.nonzero" or "Tensor.tolist"
    reason: str  # why it makes the host wait on a device
    filename: str  # the innermost frame outside torch and this module
    lineno: int
    function: str
    line: str  # that frame's source line, stripped

    def describe(self) -> str:
        return f"{self.op}: {self.reason} at {self.filename}:{self.lineno} in {self.function}: {self.line}"

    def to_json(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------- frames

_THIS_FILE = os.path.abspath(__file__)
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_SKIP_PREFIXES = (_TORCH_DIR, os.path.dirname(os.path.abspath(contextlib.__file__)) + os.sep + "contextlib.py")


def _triton_interpreter_files() -> tuple[str, ...]:
    try:
        import triton.runtime.interpreter as interp
    except Exception:  # triton missing or broken: nothing to exempt
        return ()
    return (os.path.abspath(interp.__file__),)


_INTERPRETER_FILES = _triton_interpreter_files()


def _inside_interpreter() -> bool:
    """True while a Triton interpreter launch is running: its numpy round trips are not ours."""
    if not _INTERPRETER_FILES:
        return False
    f = sys._getframe(2)
    while f is not None:
        if f.f_code.co_filename in _INTERPRETER_FILES or os.path.abspath(f.f_code.co_filename) in _INTERPRETER_FILES:
            return True
        f = f.f_back
    return False


def _user_frame() -> tuple[str, int, str, str]:
    f = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_filename
        absname = os.path.abspath(name) if not name.startswith("<") else name
        if absname != _THIS_FILE and not absname.startswith(_SKIP_PREFIXES) and not name.startswith("<frozen"):
            line = linecache.getline(name, f.f_lineno, f.f_globals).strip()
            return name, f.f_lineno, f.f_code.co_name, line
        f = f.f_back
    return "<unknown>", 0, "<unknown>", ""


# --------------------------------------------------------------------------- the detector


class _Tracked:
    """Identity-keyed weak set of tensors (Tensor.__eq__ is elementwise, so no WeakSet)."""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref] = {}

    def add(self, t: torch.Tensor) -> None:
        key = id(t)

        def _gone(_ref, key=key, refs=self._refs):
            refs.pop(key, None)

        try:
            self._refs[key] = weakref.ref(t, _gone)
        except TypeError:  # not weak-referenceable: skip
            pass

    def discard(self, t: torch.Tensor) -> None:
        ref = self._refs.get(id(t))
        if ref is not None and ref() is t:
            del self._refs[id(t)]

    def __contains__(self, t: object) -> bool:
        ref = self._refs.get(id(t))
        return ref is not None and ref() is t


class _FunctionLayer(TorchFunctionMode):
    def __init__(self, det: HostSyncDetector):
        super().__init__()
        self.det = det

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        det = self.det
        if det._suppressed():
            return func(*args, **kwargs)
        name = _func_name(func)
        self_t = args[0] if args and isinstance(args[0], torch.Tensor) else None

        if name in _SCALAR_READ_METHODS and self_t is not None and det.is_device(self_t):
            det._emit(f"Tensor.{name}", _SCALAR_READ_METHODS[name])
            with det._quiet():
                out = func(*args, **kwargs)
            if isinstance(out, torch.Tensor) and out is not self_t:
                det.host.add(out)
            return out

        if name in ("to", "cuda") and self_t is not None:
            return self._to(func, name, self_t, args, kwargs)

        if name == "pin_memory" and self_t is not None:
            out = func(*args, **kwargs)
            det.host.add(out)
            det.pinned.add(out)
            return out

        det._frames.append(name)
        try:
            out = func(*args, **kwargs)
        finally:
            det._frames.pop()

        if name in _FACTORIES and self_t is None and getattr(func, "__module__", "") in ("torch", None, ""):
            has_device = kwargs.get("device") is not None
            if name in _FROM_HOST_DATA and has_device and not (args and isinstance(args[0], torch.Tensor)):
                if det._target_is_device(kwargs.get("device")):
                    det._emit(
                        f"torch.{name}(data, device=...)",
                        "builds the tensor in pageable host memory, then copies it to the device and waits",
                    )
            if isinstance(out, torch.Tensor):
                if has_device and det._target_is_device(kwargs.get("device")):
                    det.host.discard(out)
                elif not has_device and torch.get_default_device().type == "cpu":
                    det.host.add(out)
                    if kwargs.get("pin_memory"):
                        det.pinned.add(out)
        return out

    def _to(self, func, name, t, args, kwargs):
        det = self.det
        target = _to_target(name, args, kwargs)
        non_blocking = bool(kwargs.get("non_blocking", False)) or (
            name == "to" and len(args) > 2 and isinstance(args[2], bool) and args[2]
        )
        if target is not None and t in det.host and det._target_is_device(target):
            if not (non_blocking and t in det.pinned):
                det._emit(
                    f"Tensor.{name}(device)",
                    "copies a host tensor to the device from pageable memory (or blocking): the host waits",
                )
            with det._quiet():
                out = func(*args, **kwargs)
            if isinstance(out, torch.Tensor):
                det.host.discard(out)
            return out
        if target is not None and det.is_device(t) and det._target_is_host(target):
            det._emit(f"Tensor.{name}(cpu)", "copies a device tensor to host memory")
            with det._quiet():
                out = func(*args, **kwargs)
            if isinstance(out, torch.Tensor) and out is not t:
                det.host.add(out)
            return out
        return func(*args, **kwargs)


def _to_target(name: str, args, kwargs):
    """The device argument of Tensor.to / Tensor.cuda, or None when only dtype changes."""
    if name == "cuda":
        return torch.device("cuda")
    if "device" in kwargs and kwargs["device"] is not None:
        return kwargs["device"]
    for a in args[1:2]:
        if isinstance(a, (str, torch.device, int)) and not isinstance(a, bool):
            return a
        if isinstance(a, torch.Tensor):
            return a.device
    return None


class _DispatchLayer(TorchDispatchMode):
    def __init__(self, det: HostSyncDetector):
        super().__init__()
        self.det = det

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        det = self.det
        if det._suppressed():
            return func(*args, **kwargs)
        base = _op_base_name(func)
        flat, _ = tree_flatten((args, kwargs))
        tensors = [x for x in flat if isinstance(x, torch.Tensor)]
        self._check(func, base, args, kwargs, tensors)
        out = func(*args, **kwargs)
        if base == "lift_fresh" or (tensors and all(det.is_host(t) for t in tensors)):
            for o in tree_flatten(out)[0]:
                if isinstance(o, torch.Tensor):
                    det.host.add(o)
        return out

    def _check(self, func, base, args, kwargs, tensors):
        det = self.det
        label = _op_label(func)
        via = f" (from {det._frames[-1]})" if det._frames else ""

        if base == "_local_scalar_dense":
            if det.is_device(args[0]):
                det._emit(f"{label}{via}", "reads a device value into a Python number: the host waits for the GPU")
            return
        if base in _DATA_DEPENDENT_SHAPE:
            if any(det.is_device(t) for t in tensors):
                det._emit(f"{label}{via}", _DATA_DEPENDENT_SHAPE[base])
            return
        if base == "repeat_interleave" and isinstance(args[0] if args else None, torch.Tensor):
            if kwargs.get("output_size") is None and any(det.is_device(t) for t in tensors):
                det._emit(f"{label}{via}", "without output_size the output length is summed on the device and read back")
            return
        if base == "index" and len(args) > 1:
            if any(_is_mask(i) for i in args[1] if i is not None) and det.is_device(args[0]):
                det._emit(f"{label}{via} with a boolean mask", "a mask index is lowered to nonzero(): the host reads the count")
                return
        if base in ("index_put_", "index_put", "_index_put_impl_", "_unsafe_index_put"):
            self._check_index_put(label + via, args, kwargs)
            return
        if base == "copy_" and len(args) >= 2:
            dst, src = args[0], args[1]
            non_blocking = bool(kwargs.get("non_blocking", args[2] if len(args) > 2 else False))
            if det.is_device(dst) and det.is_host(src) and not (non_blocking and src in det.pinned):
                det._emit(f"{label}{via}", "copies host memory into a device tensor: a blocking host→device copy")
            elif det.is_host(dst) and det.is_device(src) and not non_blocking:
                det._emit(f"{label}{via}", "copies a device tensor into host memory: the host waits for it")
            return
        if base in ("lift_fresh", "lift_fresh_copy", "_to_copy", "detach", "alias", "fill_", "masked_fill_",
                    "masked_fill", "index_fill_", "index_fill", "where", "clone", "_pin_memory"):
            return
        # Mixed host/device operands: a host tensor of more than one element next to a device one.
        if any(det.is_device(t) for t in tensors):
            for t in tensors:
                if det.is_host(t) and t.numel() > 1:
                    det._emit(
                        f"{label}{via}",
                        "a host tensor meets device tensors: it is copied host→device (blocking) or the op fails",
                    )
                    return

    def _check_index_put(self, label, args, kwargs):
        det = self.det
        self_t = args[0]
        indices = list(args[1]) if len(args) > 1 else list(kwargs.get("indices", []))
        value = args[2] if len(args) > 2 else kwargs.get("values")
        if not det.is_device(self_t):
            return
        masks = [i for i in indices if i is not None and _is_mask(i)]
        host_value = isinstance(value, torch.Tensor) and det.is_host(value)
        if masks:
            fast = host_value and value.numel() == 1 and len(masks) == 1 and all(
                i is None or _is_mask(i) for i in indices
            )
            if not fast:
                det._emit(f"{label} with a boolean mask", "a mask index is lowered to nonzero(): the host reads the count")
            return
        for i in indices:
            if isinstance(i, torch.Tensor) and det.is_host(i) and i.numel() > 1:
                det._emit(label, "a host index tensor is copied to the device before the scatter (blocking)")
                return
        if host_value and value.dim() == 0:
            det._emit(
                label,
                "scatters a Python scalar: it becomes a 0-dim host tensor copied from pageable memory, and the host waits",
            )
        elif host_value:
            det._emit(label, "scatters a host tensor into a device tensor: a blocking host→device copy")


def _is_mask(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8)


_SYNC_PATCHES = (
    ("torch.cuda", "synchronize"),
    ("torch.cpu", "synchronize"),
    ("torch.accelerator", "synchronize"),
    ("torch.mps", "synchronize"),
    ("torch.xpu", "synchronize"),
)
_SYNC_METHOD_PATCHES = (
    ("torch.cuda", "Stream"),
    ("torch.cuda", "Event"),
    ("torch", "Stream"),
    ("torch", "Event"),
    ("torch.cpu", "Stream"),
)
_patch_lock = threading.RLock()


class HostSyncDetector:
    """Context manager: records (or raises on) every op that would make the host wait.

    ``device``: where the page tables live. ``"cpu"`` (default) emulates a device on the
    CPU tiers; ``"cuda"`` checks real CUDA tensors. ``raise_on_sync``: raise
    ``HostSyncError`` at the first event (and again on exit if one was swallowed).
    """

    def __init__(self, *, device: str | torch.device = "cpu", raise_on_sync: bool = False):
        self.device = torch.device(device)
        self.raise_on_sync = raise_on_sync
        self.events: list[SyncEvent] = []
        self.host = _Tracked()
        self.pinned = _Tracked()
        self._frames: list[str] = []
        self._quiet_depth = 0
        self._patched: list[tuple[object, str, object]] = []
        self._stack: contextlib.ExitStack | None = None

    # device model ---------------------------------------------------------
    def is_host(self, t: object) -> bool:
        if not isinstance(t, torch.Tensor):
            return False
        if t.device.type != "cpu":
            return False
        if self.device.type != "cpu":
            return True  # a real accelerator: every CPU tensor is host memory
        return t in self.host

    def is_device(self, t: object) -> bool:
        return isinstance(t, torch.Tensor) and not self.is_host(t) and t.device.type != "meta"

    def _target_is_device(self, target) -> bool:
        try:
            dev = torch.device(target) if not isinstance(target, int) else torch.device(self.device.type, target)
        except (TypeError, RuntimeError):
            return False
        if self.device.type == "cpu":
            return dev.type == "cpu"  # the emulated device is called "cpu" too
        return dev.type == self.device.type

    def _target_is_host(self, target) -> bool:
        try:
            dev = torch.device(target) if not isinstance(target, int) else torch.device(self.device.type, target)
        except (TypeError, RuntimeError):
            return False
        return dev.type == "cpu" and self.device.type != "cpu"

    # events ---------------------------------------------------------------
    def _suppressed(self) -> bool:
        return self._quiet_depth > 0 or _inside_interpreter()

    @contextlib.contextmanager
    def _quiet(self) -> Iterator[None]:
        self._quiet_depth += 1
        try:
            yield
        finally:
            self._quiet_depth -= 1

    def _emit(self, op: str, reason: str) -> None:
        filename, lineno, function, line = _user_frame()
        event = SyncEvent(op, reason, filename, lineno, function, line)
        self.events.append(event)
        if self.raise_on_sync:
            raise HostSyncError([event])

    # synchronize() entry points --------------------------------------------
    def _patch_sync_functions(self) -> None:
        import importlib

        def wrap(original, label):
            def synchronize(*args, **kwargs):
                if not self._suppressed():
                    self._emit(label, "blocks the host until the device has finished all queued work")
                return original(*args, **kwargs)

            synchronize.__wrapped__ = original
            return synchronize

        with _patch_lock:
            for modname, attr in _SYNC_PATCHES:
                try:
                    mod = importlib.import_module(modname)
                except Exception:
                    continue
                original = getattr(mod, attr, None)
                if original is None:
                    continue
                self._patched.append((mod, attr, original))
                setattr(mod, attr, wrap(original, f"{modname}.{attr}()"))
            for modname, clsname in _SYNC_METHOD_PATCHES:
                try:
                    cls = getattr(importlib.import_module(modname), clsname)
                except Exception:
                    continue
                original = cls.__dict__.get("synchronize")
                if original is None:
                    continue
                try:
                    cls.synchronize = wrap(original, f"{modname}.{clsname}.synchronize()")
                except TypeError:  # a C type that refuses new attributes
                    continue
                self._patched.append((cls, "synchronize", original))

    def _unpatch(self) -> None:
        with _patch_lock:
            for owner, attr, original in reversed(self._patched):
                setattr(owner, attr, original)
            self._patched.clear()

    # context manager ---------------------------------------------------------
    def __enter__(self) -> HostSyncDetector:
        self._patch_sync_functions()
        stack = contextlib.ExitStack()
        try:
            stack.enter_context(_FunctionLayer(self))
            stack.enter_context(_DispatchLayer(self))
        except BaseException:
            stack.close()
            self._unpatch()
            raise
        self._stack = stack
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        assert self._stack is not None
        try:
            self._stack.close()
        finally:
            self._stack = None
            self._unpatch()
        if exc_type is None and self.raise_on_sync and self.events:
            raise HostSyncError(self.events)  # an event whose exception was swallowed inside the block
        return False


def no_host_sync(*, device: str | torch.device = "cpu") -> HostSyncDetector:
    """``with no_host_sync(): allocator.free(tokens)`` raises HostSyncError naming op and line."""
    return HostSyncDetector(device=device, raise_on_sync=True)


@contextlib.contextmanager
def record_host_syncs(*, device: str | torch.device = "cpu") -> Iterator[list[SyncEvent]]:
    """Non-raising variant for calibration: yields the list that collects the events."""
    det = HostSyncDetector(device=device, raise_on_sync=False)
    with det:
        yield det.events
