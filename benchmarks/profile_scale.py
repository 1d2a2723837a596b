"""Where production-scale fuzzing spends its time: read-heavy sequences of kvkernels for
``--seconds`` under cProfile; elements checked per second and the costliest functions.

    PYTHONPATH=. python3 benchmarks/profile_scale.py --seconds 20 --ops 96
"""

from __future__ import annotations

import argparse

from benchmarks.profiling import profile


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--ops", type=int, default=24, help="ops per sequence")
    ap.add_argument("--check-every", type=int, default=1)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    import torch

    from fuzz.engine.production.generator import READ_HEAVY_MIX
    from fuzz.engine.tiers import make_tier
    from fuzz.engine.tracks import get

    tier = make_tier("cuda")
    production = get("production")
    production.run_sequence(tier, 10**6, 8, mix=READ_HEAVY_MIX)  # compile outside the profile
    seeds = iter(range(10**6))

    def one(deadline):
        run = production.run_sequence(tier, next(seeds), args.ops, deadline=deadline, mix=READ_HEAVY_MIX,
                                      check_every=args.check_every).run
        return {"ops": run.stats.ops, "elements": run.elements_checked, "sequences": 1}

    profile(one, args.seconds, args.top, sync=torch.cuda.synchronize)


if __name__ == "__main__":
    main()
