"""``kvfuzz replay --pytest``: a case as a standalone pytest test to paste into a suite."""

from __future__ import annotations

import json


def render(case: dict, source: str) -> str:
    sig = case["signature"]
    name = "".join(ch if ch.isalnum() else "_" for ch in f"{sig['op']}_{sig['oracle']}_{sig['field']}")
    return f'''"""Regression test from kvfuzz case {source} ({sig['op']}/{sig['oracle']}/{sig['field']})."""
import os

import pytest

BACKEND = os.environ.get("KVFUZZ_BACKEND", {case.get("tier", "torch")!r})
KERNELS = os.environ.get("KVFUZZ_KERNELS", {case.get("kernels")!r})
CONFIG = {json.dumps(case["config"])}
OPS = {json.dumps(case["ops"])}


def test_{name}():
    from fuzz.backends import make_tier
    from fuzz.runner import replay
    from kvref import PoolConfig

    divergence, _ = replay(PoolConfig.from_json(CONFIG), OPS, make_tier(BACKEND, KERNELS))
    assert divergence is None, str(divergence)
'''
