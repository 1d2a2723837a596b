"""The compile track's op: ``c_compile``, one kernel compiled at one specialization.

The op holds the kernel's *base* signature as the launcher would build it for ints that are
neither 1 nor a multiple of 16 (Triton's own type strings, ``vs:*i64,n:i32,SIZE:constexpr``),
its constexpr values, the parameters marked divisible by 16 at base, the launch options,
the target, and ``spec``: the specialization to apply on top of the base, in one of four
forms, each naming its parameters:

* ``base``: as it is;
* ``n,v2p_len==1``: those int arguments equal to 1 (the launcher turns them into constexprs);
* ``n,vs%16``: those int or pointer arguments divisible by 16 (``tt.divisibility``);
* ``n:i64``: those int arguments at int64 (values past 2^31).

So a case reads on its own ("kernel ``_k_free_wide`` does not compile when n == 1"), a
screen that sets every int to 1 narrows to one argument by rewriting ``spec`` alone, and
the signature of a failure is ``c_compile/compile/<kernel>@<spec>``.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from dataclasses import dataclass
from typing import ClassVar

from ..oplang import Op, OpError

DEFAULT_TARGET = "cuda:90:32"  # an H100/H200 (sm_90), 32-thread warps: what the CPU CI compiles for
SPEC_FORMS = {"==1": "one", "%16": "div16", ":i64": "wide"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")
_INT_TYPES = ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64")


def parse_pairs(text: str, sep: str, what: str) -> dict[str, str]:
    """``a<sep>x,b<sep>y`` in order; an empty text is no pairs."""
    out: dict[str, str] = {}
    for item in filter(None, text.split(",")):
        name, found, value = item.partition(sep)
        name = name.strip()
        if not found or not _NAME.match(name) or not value.strip() or name in out:
            raise OpError(f"c_compile op: {what} must be NAME{sep}VALUE items separated by commas, got {text!r}")
        out[name] = value.strip()
    return out


def encode_value(value) -> str | None:
    """A constexpr or option value as op text (None: not representable, e.g. a string with a comma)."""
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, str):
        return None if any(c in value for c in ",=") else repr(value)
    name = getattr(value, "name", None)  # a triton.language dtype
    if type(value).__name__ == "dtype" and isinstance(name, str) and _NAME.match(name):
        return f"tl.{name}"
    return None


def decode_value(text: str):
    """The Python value of an encoded constexpr; ``tl.NAME`` comes back as that text (the
    compile child resolves it in triton.language)."""
    if text.startswith("tl.") and _NAME.match(text[3:]):
        return text
    return ast.literal_eval(text)


def parse_target(text: str) -> tuple[str, int | str, int]:
    """``backend:arch:warp_size`` (``cuda:90:32``, ``hip:gfx942:64``)."""
    parts = text.split(":")
    if len(parts) != 3 or not parts[0] or not parts[1] or not parts[2].isdigit():
        raise OpError(f"c_compile op: target must be BACKEND:ARCH:WARP_SIZE (e.g. {DEFAULT_TARGET}), got {text!r}")
    return parts[0], int(parts[1]) if parts[1].isdigit() else parts[1], int(parts[2])


def parse_spec(spec: str) -> tuple[str, tuple[str, ...]]:
    """(form, names): ``("base", ())``, ``("one", ("n",))``, ``("div16", ...)``, ``("wide", ...)``."""
    if spec == "base":
        return "base", ()
    for suffix, form in SPEC_FORMS.items():
        if spec.endswith(suffix):
            names = tuple(spec[: -len(suffix)].split(","))
            if names and all(_NAME.match(n) for n in names) and len(set(names)) == len(names):
                return form, names
    raise OpError(f"c_compile op: spec must be 'base', 'A,B==1', 'A,B%16' or 'A,B:i64', got {spec!r}")


def make_spec(form: str, names) -> str:
    if form == "base":
        return "base"
    suffix = next(s for s, f in SPEC_FORMS.items() if f == form)
    return ",".join(names) + suffix


@dataclass(frozen=True)
class CompileOp(Op):
    """Compile ``kernel`` (its ``__qualname__``, defined in a file named ``file``) for
    ``target`` at ``spec`` applied to the base signature."""

    kind: ClassVar[str] = "c_compile"
    track: ClassVar[str] = "compile"
    example: ClassVar[dict] = {"kernel": "k", "spec": "n==1", "signature": "x:*i64,n:i32,BLOCK:constexpr",
                               "constexprs": "BLOCK=128", "attrs": "x", "options": "num_warps=4",
                               "target": DEFAULT_TARGET, "file": "k.py"}  # a valid instance, for the tests

    kernel: str
    spec: str
    signature: str  # the base: NAME:TYPE in parameter order, Triton's type strings
    constexprs: str = ""  # NAME=VALUE (Python literals, tl.DTYPE) of the constexpr parameters
    attrs: str = ""  # parameters divisible by 16 at base (pointers the launches saw aligned)
    options: str = ""  # launch options (num_warps=4, ...)
    target: str = DEFAULT_TARGET
    file: str = ""  # the name of the file the kernel is defined in ("": any)

    def __post_init__(self):
        super().__post_init__()
        self.concrete()  # a malformed op (a hand-edited case) fails here, naming the field

    # ---- reading the fields ---------------------------------------------------------------
    def base_signature(self) -> dict[str, str]:
        return parse_pairs(self.signature, ":", "signature")

    def option_values(self) -> dict:
        try:
            return {k: decode_value(v) for k, v in parse_pairs(self.options, "=", "options").items()}
        except (ValueError, SyntaxError) as exc:
            raise OpError(f"c_compile op: options {self.options!r}: not Python literals ({exc})") from None

    def target_tuple(self) -> tuple[str, int | str, int]:
        return parse_target(self.target)

    def names(self) -> tuple[str, ...]:
        return parse_spec(self.spec)[1]

    def concrete(self) -> tuple[dict[str, str], dict[str, str], list[str]]:
        """What the launcher would hand ``triton.compile`` at this spec: (signature, constexpr
        texts by name, the names marked divisible by 16)."""
        sig = self.base_signature()
        consts = parse_pairs(self.constexprs, "=", "constexprs")
        try:
            for text in consts.values():
                decode_value(text)
        except (ValueError, SyntaxError) as exc:
            raise OpError(f"c_compile op: constexprs {self.constexprs!r}: not Python literals ({exc})") from None
        attrs = [n for n in self.attrs.split(",") if n]
        if not sig:
            raise OpError("c_compile op: an empty signature")
        if set(consts) != {n for n, t in sig.items() if t == "constexpr"}:
            raise OpError(f"c_compile op: constexprs {sorted(consts)} must name exactly the signature's constexpr "
                          f"parameters {sorted(n for n, t in sig.items() if t == 'constexpr')}")
        if any(a not in sig or sig[a] == "constexpr" for a in attrs):
            raise OpError(f"c_compile op: attrs {self.attrs!r} must name non-constexpr parameters of the signature")
        self.option_values()
        self.target_tuple()
        form, names = parse_spec(self.spec)
        for name in names:
            t = sig.get(name)
            ok = t in _INT_TYPES if form in ("one", "wide") else (t in _INT_TYPES or (t or "").startswith("*"))
            if not ok:
                raise OpError(f"c_compile op: spec {self.spec!r} names {name!r}, which is "
                              + ("not a parameter" if t is None else f"{t}, not {'an int' if form != 'div16' else 'an int or a pointer'}"))
        if form == "one":
            for name in names:
                sig[name], consts[name] = "constexpr", "1"
            attrs = [a for a in attrs if a not in names]
        elif form == "div16":
            attrs = [n for n in sig if n in attrs or n in names]
        elif form == "wide":
            for name in names:
                sig[name] = "i64"
        return sig, {n: consts[n] for n in sig if n in consts}, attrs

    # ---- what a failure says ----------------------------------------------------------------
    @property
    def label(self) -> str:
        """``kernel@spec``: the signature field of a failure of this op."""
        return f"{self.kernel}@{self.spec}"

    def condition(self) -> str:
        form, names = parse_spec(self.spec)
        listed = ", ".join(names)
        return {"base": "at its base specialization (no int argument 1 or a multiple of 16)",
                "one": f"when {listed} == 1", "div16": f"when {listed} % 16 == 0",
                "wide": f"when {listed} {'is' if len(names) == 1 else 'are'} int64"}[form]

    def single(self, name: str) -> CompileOp:
        """This op with its spec narrowed to one of its names."""
        form, _ = parse_spec(self.spec)
        return dataclasses.replace(self, spec=make_spec(form, (name,)))
