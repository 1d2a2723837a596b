"""Launch-shape knobs: block sizes a kernel set lets the fuzzer vary per sequence.

Fuzzing pools are small, so with production block sizes (512 columns) a strided loop
never takes a second iteration and a grid bug hides. A kernel set that exposes
``FUZZ_KNOBS = {NAME: (choices...)}`` (on itself or on its ``launchers`` module, read
at call time) gets one choice per sequence; the choice is part of the case file so a
replay launches the same grids.
"""

from __future__ import annotations

import random
from types import ModuleType


def knob_module(kernels: ModuleType) -> ModuleType | None:
    for mod in (kernels, getattr(kernels, "launchers", None)):
        if mod is not None and isinstance(getattr(mod, "FUZZ_KNOBS", None), dict):
            return mod
    return None


def choose(kernels: ModuleType, seed: int) -> dict | None:
    mod = knob_module(kernels)
    if mod is None:
        return None
    rng = random.Random(seed * 7919 + 17)
    return {name: rng.choice(tuple(choices)) for name, choices in sorted(mod.FUZZ_KNOBS.items())}


def apply(kernels: ModuleType, knobs: dict | None, strict: bool = True) -> list[str]:
    """Set the knobs (or restore the defaults when ``knobs`` is None). A knob this kernel
    set does not have is a SetupError, or, with ``strict=False`` (a case replayed on
    another kernel set), dropped; the names dropped are returned."""
    mod = knob_module(kernels)
    defaults = {} if mod is None else mod.__dict__.setdefault("_KVFUZZ_DEFAULTS",
                                                               {k: getattr(mod, k) for k in mod.FUZZ_KNOBS})
    unknown = sorted(set(knobs or {}) - set(defaults))
    if unknown and strict:
        from .tiers import SetupError

        raise SetupError(f"unknown launch knob {unknown[0]!r} (this kernel set has {sorted(defaults) or 'none'})")
    for name, value in {**defaults, **{k: v for k, v in (knobs or {}).items() if k in defaults}}.items():
        setattr(mod, name, value)
    return unknown
