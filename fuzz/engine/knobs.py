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


def apply(kernels: ModuleType, knobs: dict | None) -> None:
    """Set the knobs (or restore the defaults when ``knobs`` is None)."""
    mod = knob_module(kernels)
    if mod is None:
        return
    defaults = mod.__dict__.setdefault("_KVFUZZ_DEFAULTS", {k: getattr(mod, k) for k in mod.FUZZ_KNOBS})
    for name, value in {**defaults, **(knobs or {})}.items():
        if name not in defaults:
            from .tiers import SetupError

            raise SetupError(f"unknown launch knob {name!r} (this kernel set has {sorted(defaults)})")
        setattr(mod, name, value)
