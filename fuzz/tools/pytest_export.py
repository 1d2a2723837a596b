"""``kvfuzz replay --pytest``: a case as a standalone pytest test to paste into a suite.

The test carries the case itself (config, ops, knobs) and the kernel set as the case names
it; a kernel-set file given relative to where the campaign ran is looked for from the
current directory and from the test file's own folder upwards, so the test runs wherever
it is put inside the repository (``KVFUZZ_KERNELS`` / ``KVFUZZ_BACKEND`` override both); so is the
allocator when the case names one (``KVFUZZ_ALLOCATOR``).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..engine.case import Case


def render(case: Case, source: str) -> str:
    sig = case.signature
    name = "".join(ch if ch.isalnum() else "_" for ch in f"{sig.op}_{sig.oracle}_{sig.field}")
    ops = json.dumps([op.to_json() for op in case.ops])
    return f'''"""Regression test from kvfuzz case {Path(source).name} ({sig})."""
import json
import os

BACKEND = os.environ.get("KVFUZZ_BACKEND", {case.tier or "torch"!r})
KERNELS = os.environ.get("KVFUZZ_KERNELS", {case.kernels!r})
ALLOCATOR = os.environ.get("KVFUZZ_ALLOCATOR", {case.allocator!r})  # None: ours
if BACKEND == "interpret":  # Triton decides at import time whether it interprets
    os.environ.setdefault("TRITON_INTERPRET", "1")
CONFIG = {case.config.to_json()!r}
OPS = json.loads({ops!r})
KNOBS = {case.knobs!r}


def test_{name}():
    from fuzz.engine import PoolConfig, make_tier, parse_ops, replay
    from fuzz.engine import allocators
    from fuzz.engine.case import resolve_kernels

    kernels = resolve_kernels(KERNELS, __file__)
    tier = allocators.attach(make_tier(BACKEND, kernels), allocators.resolve(ALLOCATOR, __file__))
    divergence, _ = replay(PoolConfig.from_json(CONFIG), parse_ops(OPS), tier, knobs=KNOBS)
    assert divergence is None, str(divergence)
'''
