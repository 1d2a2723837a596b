"""``kvfuzz replay --pytest``: a case as a standalone pytest test to paste into a suite."""

from __future__ import annotations

import json
from pathlib import Path

from ..engine.case import Case


def render(case: Case, source: str) -> str:
    sig = case.signature
    kernels = case.kernels
    if kernels and kernels.endswith(".py") and Path(kernels).is_file():
        kernels = str(Path(kernels).resolve())  # the test may run from another directory
    name = "".join(ch if ch.isalnum() else "_" for ch in f"{sig.op}_{sig.oracle}_{sig.field}")
    ops = json.dumps([op.to_json() for op in case.ops])
    return f'''"""Regression test from kvfuzz case {source} ({sig})."""
import json
import os

BACKEND = os.environ.get("KVFUZZ_BACKEND", {case.tier or "torch"!r})
KERNELS = os.environ.get("KVFUZZ_KERNELS", {kernels!r})
if BACKEND == "interpret":  # Triton decides at import time whether it interprets
    os.environ.setdefault("TRITON_INTERPRET", "1")
CONFIG = {case.config.to_json()!r}
OPS = json.loads({ops!r})
KNOBS = {case.knobs!r}


def test_{name}():
    from fuzz.engine import PoolConfig, make_tier, parse_ops, replay

    divergence, _ = replay(PoolConfig.from_json(CONFIG), parse_ops(OPS), make_tier(BACKEND, KERNELS), knobs=KNOBS)
    assert divergence is None, str(divergence)
'''
