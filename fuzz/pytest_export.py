"""``kvfuzz replay --pytest``: a case as a standalone pytest test to paste into a suite."""

from __future__ import annotations

from pathlib import Path


def render(case: dict, source: str) -> str:
    sig = case["signature"]
    kernels = case.get("kernels")
    if kernels and kernels.endswith(".py") and Path(kernels).is_file():
        kernels = str(Path(kernels).resolve())  # the test may run from another directory
    name = "".join(ch if ch.isalnum() else "_" for ch in f"{sig['op']}_{sig['oracle']}_{sig['field']}")
    return f'''"""Regression test from kvfuzz case {source} ({sig['op']}/{sig['oracle']}/{sig['field']})."""
import os

BACKEND = os.environ.get("KVFUZZ_BACKEND", {case.get("tier", "torch")!r})
KERNELS = os.environ.get("KVFUZZ_KERNELS", {kernels!r})
if BACKEND == "interpret":  # Triton decides at import time whether it interprets
    os.environ.setdefault("TRITON_INTERPRET", "1")
CONFIG = {case["config"]!r}
OPS = {case["ops"]!r}
KNOBS = {case.get("knobs")!r}


def test_{name}():
    from fuzz.backends import make_tier
    from fuzz.runner import replay
    from kvref import PoolConfig

    divergence, _ = replay(PoolConfig.from_json(CONFIG), OPS, make_tier(BACKEND, KERNELS), knobs=KNOBS)
    assert divergence is None, str(divergence)
'''
