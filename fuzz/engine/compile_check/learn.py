"""What the launcher specializes, learned from real launches; the ``c_compile`` ops of a set.

``LaunchBook`` is a ``launches.observe`` callback: each launch of a ``@triton.jit`` kernel
(interpreted or compiled) is bound to the kernel's parameters and digested into a *shape*:
per parameter its kind (``ptr`` with Triton's pointer type, ``int``, ``fixed`` for a bool
or float argument, ``const`` for a constexpr or a ``None``), whether the launcher may turn
it into a constexpr 1 (``one``: an unannotated int that is not ``do_not_specialize``) or
mark it divisible by 16 (``div``), and the int types and pointer alignments seen; plus the
launch options. Shapes differ by their constexprs, kinds and options; int types and
alignments are merged. Only JSON is kept, so the book is what a worker hands its parent
(``worker_info``), and the ops rebuild from it alone (``candidates``).

``candidates`` orders the ops so that a short run finds the most: first every kernel's
first shape with every specializable int equal to 1, then divisible by 16, then at base;
then the other shapes (up to ``MAX_SHAPES`` per kernel) and the int64 variants, in an order
drawn from the sequence's seed.
"""

from __future__ import annotations

import contextlib
import inspect
import random
from pathlib import Path

from .ops import CompileOp, encode_value, make_spec

MAX_SHAPES = 6  # launch shapes per kernel that are compiled (the first at every class)
MAX_BOOK_SHAPES = 16  # shapes per kernel kept in the book
FORMS = ("one", "div16", "base")  # the classes every shape is compiled at: ints == 1, % 16, neither
_TYPE_NAMES = {"int1": "i1", "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8",
               "uint16": "u16", "uint32": "u32", "uint64": "u64", "float16": "fp16", "bfloat16": "bf16",
               "float32": "fp32", "float64": "fp64", "bool": "u1"}
_INTS = ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64")
_INT_ORDER = {"i32": 0, "i64": 1, "u64": 2}


def _annotation(param: inspect.Parameter) -> str:
    a = param.annotation
    if a is inspect.Parameter.empty:
        return ""
    return a if isinstance(a, str) else getattr(a, "__name__", None) or str(a)


def _annotated_type(text: str) -> str:
    """Triton's type string of an annotation (``tl.int32``, ``"i32"``), or '' for none."""
    name = text.rsplit(".", 1)[-1]
    t = _TYPE_NAMES.get(name, name)
    return t if t in _INTS or t in ("u1", "i1", "fp16", "bf16", "fp32", "fp64") else ""


def _flags(fn, names: list[str]) -> dict[str, tuple[bool, bool]]:
    """Per parameter (do_not_specialize, do_not_specialize_on_alignment), from a JITFunction's
    params or an InterpretedFunction's decorator keywords."""
    params = getattr(fn, "params", None)
    if params:
        return {p.name: (bool(getattr(p, "do_not_specialize", False)),
                         bool(getattr(p, "do_not_specialize_on_alignment", False))) for p in params}
    kw = getattr(fn, "kwargs", None) or {}
    dns, dnsa = set(kw.get("do_not_specialize") or ()), set(kw.get("do_not_specialize_on_alignment") or ())
    return {n: (i in dns or n in dns, i in dnsa or n in dnsa) for i, n in enumerate(names)}


def pointer_type(tensor) -> str | None:
    """Triton's pointer type of a tensor argument (``*i64``): Triton's own specializer where
    it has one, else by the dtype's name."""
    with contextlib.suppress(Exception):
        from triton.backends.compiler import BaseBackend
        from triton.runtime.jit import native_specialize_impl

        t = native_specialize_impl(BaseBackend, tensor, False, True, True)[0]
        if isinstance(t, str) and t.startswith("*"):
            return t
    name = str(getattr(tensor, "dtype", "")).rsplit(".", 1)[-1]
    t = _TYPE_NAMES.get(name)
    return None if t is None else "*" + t


def _int_type(v: int) -> str:
    return "i32" if -(2**31) <= v < 2**31 else "u64" if v >= 2**63 else "i64"


def digest(launch) -> tuple[str, str, dict] | tuple[str, str, str] | None:
    """(kernel qualname, file name, shape) of a launch, or (qualname, file, why it cannot be
    compiled here); None for what is not a @triton.jit launch."""
    pyfn = getattr(launch.fn, "fn", None)
    code = getattr(pyfn, "__code__", None)
    if code is None:
        return None
    kernel, file = pyfn.__qualname__, Path(code.co_filename).name
    try:
        sig = inspect.signature(pyfn)
        bound = sig.bind(*launch.args, **{k: v for k, v in launch.kwargs.items() if k in sig.parameters})
        bound.apply_defaults()
    except (TypeError, ValueError) as exc:
        return kernel, file, f"its launch does not bind to its parameters: {exc}"
    names = list(sig.parameters)
    flags = _flags(launch.fn, names)
    params = []
    for name, p in sig.parameters.items():
        v, ann = bound.arguments[name], _annotation(p)
        no_spec, no_align = flags.get(name, (False, False))
        if "constexpr" in ann or v is None:
            v = getattr(v, "value", v) if type(v).__name__ == "constexpr" else v
            text = encode_value(v)
            if text is None:
                return kernel, file, f"constexpr {name}={v!r} has no op form"
            params.append({"name": name, "kind": "const", "value": text})
        elif hasattr(v, "data_ptr") and hasattr(v, "dtype"):
            t = pointer_type(v)
            if t is None:
                return kernel, file, f"argument {name}: no Triton type for dtype {v.dtype}"
            params.append({"name": name, "kind": "ptr", "type": t, "div": not (no_spec or no_align),
                           "aligned": [v.data_ptr() % 16 == 0]})
        elif isinstance(v, bool):
            params.append({"name": name, "kind": "fixed", "type": "u1"})
        elif isinstance(v, int):
            t = _annotated_type(ann)
            if t and t not in _INTS:
                params.append({"name": name, "kind": "fixed", "type": t})
            else:  # an annotated int keeps its type at 1 (never a constexpr), but is still marked at % 16
                params.append({"name": name, "kind": "int", "types": [t or _int_type(v)],
                               "one": not t and not no_spec, "div": not (no_spec or no_align)})
        elif isinstance(v, float):
            params.append({"name": name, "kind": "fixed", "type": _annotated_type(ann) or "fp32"})
        else:
            return kernel, file, f"argument {name} of type {type(v).__name__} (not a tensor, int, float or None)"
    options = {}
    for k, v in sorted(launch.kwargs.items()):
        if k not in sig.parameters and v is not None and (text := encode_value(v)) is not None:
            options[k] = text
    return kernel, file, {"params": params, "options": options}


def _shape_key(shape: dict) -> str:
    """What tells two shapes apart: everything but the int types and pointer alignments seen."""
    parts = [f"{p['name']}:{p['kind']}:{p.get('type', p.get('value', ''))}:{p.get('one')}:{p.get('div')}"
             for p in shape["params"]]
    return "|".join(parts) + "|" + ",".join(f"{k}={v}" for k, v in shape["options"].items())


class LaunchBook:
    """An observer (``launches.observe``) keeping, per kernel, the distinct shapes launched."""

    def __init__(self):
        self.kernels: dict[tuple[str, str], dict] = {}
        self.notes: dict[tuple[str, str], str] = {}
        self.launches = 0

    def __call__(self, launch) -> None:
        got = digest(launch)
        if got is None:
            return
        self.launches += 1
        kernel, file, shape = got
        if isinstance(shape, str):
            self.notes.setdefault((kernel, file), shape)
            return
        entry = self.kernels.setdefault((kernel, file), {"kernel": kernel, "file": file, "shapes": [], "keys": []})
        key = _shape_key(shape)
        if key in entry["keys"]:
            old = entry["shapes"][entry["keys"].index(key)]
            for mine, new in zip(old["params"], shape["params"]):
                for field in ("types", "aligned"):
                    if field in new:
                        mine[field] = sorted(set(mine[field]) | set(new[field]), key=lambda t: _INT_ORDER.get(t, 9))
        elif len(entry["shapes"]) < MAX_BOOK_SHAPES:
            entry["keys"].append(key)
            entry["shapes"].append(shape)

    def to_json(self, target: str) -> dict:
        kernels = [{k: v for k, v in e.items() if k != "keys"} for _, e in sorted(self.kernels.items())]
        notes = [f"{k} ({f}): {why}" for (k, f), why in sorted(self.notes.items()) if (k, f) not in self.kernels]
        return {"target": target, "kernels": kernels, "notes": notes, "launches": self.launches}


def shape_op(kernel: dict, shape: dict, target: str, form: str) -> CompileOp | None:
    """The op compiling ``shape`` of ``kernel`` at one class (None: the class changes nothing)."""
    sig, consts, attrs, named = [], [], [], {"one": [], "div16": [], "wide": []}
    for p in shape["params"]:
        n = p["name"]
        if p["kind"] == "const":
            sig.append(f"{n}:constexpr")
            consts.append(f"{n}={p['value']}")
        elif p["kind"] == "ptr":
            sig.append(f"{n}:{p['type']}")
            if p["div"] and all(p["aligned"]):
                attrs.append(n)
            elif p["div"]:
                named["div16"].append(n)
        elif p["kind"] == "fixed":
            sig.append(f"{n}:{p['type']}")
        else:
            base = p["types"][0]
            sig.append(f"{n}:{base}")
            if p["one"]:
                named["one"].append(n)
            if p["div"]:
                named["div16"].append(n)
            if base == "i32" and "i64" in p["types"]:
                named["wide"].append(n)
    names = named.get(form, ())
    if form != "base" and not names:
        return None
    return CompileOp(kernel=kernel["kernel"], spec=make_spec(form, names), signature=",".join(sig),
                     constexprs=",".join(consts), attrs=",".join(attrs),
                     options=",".join(f"{k}={v}" for k, v in shape["options"].items()), target=target,
                     file=kernel["file"])


def candidates(info: dict, seed: int) -> list[CompileOp]:
    """Every op of a learned set (``LaunchBook.to_json``): the first shapes at every class
    first, in a fixed order; the rest in an order drawn from ``seed``."""
    target, kernels = info["target"], info["kernels"]
    first = [shape_op(k, k["shapes"][0], target, form) for form in FORMS for k in kernels if k["shapes"]]
    rest = [shape_op(k, s, target, form) for k in kernels for s in k["shapes"][1:MAX_SHAPES] for form in FORMS]
    rest += [shape_op(k, s, target, "wide") for k in kernels for s in k["shapes"][:MAX_SHAPES]]
    random.Random(f"kvfuzz-compile:{seed}").shuffle(rest)
    out, seen = [], set()
    for op in first + rest:
        if op is not None and op not in seen:
            seen.add(op)
            out.append(op)
    return out
