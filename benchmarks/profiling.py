"""The loop both profile scripts share: run ``one(deadline)`` (one sequence; it returns
counts to add up) under cProfile until ``seconds`` pass, then print the totals per second
and the costliest functions."""

from __future__ import annotations

import cProfile
import io
import pstats
import time


def profile(one, seconds: float, top: int, sync=None) -> None:
    prof = cProfile.Profile()
    totals: dict[str, float] = {}
    start = time.monotonic()
    deadline = start + seconds
    prof.enable()
    while time.monotonic() < deadline:
        for key, value in one(deadline).items():
            totals[key] = totals.get(key, 0) + value
    if sync is not None:
        sync()
    prof.disable()
    wall = time.monotonic() - start
    print(", ".join(f"{v:.4g} {k} ({v / wall:.4g}/s)" for k, v in totals.items()) + f" in {wall:.1f} s (profiled)")
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    print(out.getvalue())


def warm_up(tier, seed0: int, count: int, n_ops: int, **kw) -> None:
    """``count`` untimed production sequences, seeds ``seed0 - 1`` downwards (never a timed one):
    they compile (or load) the kernel variants the timed sequences meet first."""
    from fuzz.engine.tracks import get

    production = get("production")
    for k in range(count):
        production.run_sequence(tier, seed0 - 1 - k, n_ops, **kw)
