"""Where a tier's time per diffed op goes: run small-scale sequences in this process for
``--seconds`` under cProfile and print the ops/s and the functions that cost most.

    PYTHONPATH=. python3 benchmarks/profile_tier.py --backend cuda --seconds 15
"""

from __future__ import annotations

import argparse

from benchmarks.profiling import profile


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--check-every", type=int, default=1)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--warmup-s", type=float, default=0.0, help="seconds of untimed sequences after the warm-up ones")
    args = ap.parse_args()
    from fuzz.engine.tiers import select_backend

    select_backend(args.backend)
    from fuzz.engine.tiers import make_tier
    from fuzz.engine.tracks import get

    tier = make_tier(args.backend)
    small = get("small")
    import time

    from fuzz.engine.generate import WARMUP_SEQUENCES, warmup_seed

    for i in range(WARMUP_SEQUENCES):  # what a GPU worker runs before it is timed
        small.run_sequence(tier, warmup_seed(i), 200)
    until = time.monotonic() + args.warmup_s
    k = 10**7
    while time.monotonic() < until:  # compile and warm up outside the profile
        small.run_sequence(tier, k, 200, check_every=args.check_every)
        k += 1
    seeds = iter(range(10**6))

    def one(deadline):
        run = small.run_sequence(tier, next(seeds), 200, deadline=deadline, check_every=args.check_every).run
        return {"ops": run.stats.ops}

    profile(one, args.seconds, args.top)


if __name__ == "__main__":
    main()
