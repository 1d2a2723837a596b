"""Where a tier's time per diffed op goes: run small-scale sequences in this process for
``--seconds`` under cProfile and print the ops/s and the functions that cost most.

    PYTHONPATH=. python3 benchmarks/profile_tier.py --backend cuda --seconds 15
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--check-every", type=int, default=1)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    from fuzz.engine.tiers import select_backend

    select_backend(args.backend)
    from fuzz.engine.campaign import run_sequence
    from fuzz.engine.tiers import make_tier

    tier = make_tier(args.backend)
    run_sequence(tier, 10**6, 50)  # compile and warm up outside the profile
    prof = cProfile.Profile()
    ops, seed, start = 0, 0, time.monotonic()
    deadline = start + args.seconds
    prof.enable()
    while time.monotonic() < deadline:
        _, _, _, d, run = run_sequence(tier, seed, 200, deadline, full_every=args.check_every)
        ops += run.stats.ops
        seed += 1
    prof.disable()
    elapsed = time.monotonic() - start
    print(f"{args.backend}: {ops} ops in {elapsed:.1f} s = {ops / elapsed:.0f} ops/s (under the profiler)")
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.top)
    print(out.getvalue())


if __name__ == "__main__":
    main()
