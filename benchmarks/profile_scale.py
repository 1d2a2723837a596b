"""Where production-scale fuzzing spends its time: sequences of kvkernels (read-heavy or the default mix) for
``--seconds`` under cProfile; elements checked per second and the costliest functions.

    PYTHONPATH=. python3 benchmarks/profile_scale.py --seconds 20 --ops 96
    PYTHONPATH=. python3 benchmarks/profile_scale.py --mix default --warmup 12 --seconds 20
"""

from __future__ import annotations

import argparse

from benchmarks.profiling import profile, warm_up


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--ops", type=int, default=24, help="ops per sequence")
    ap.add_argument("--check-every", type=int, default=1)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--mix", choices=("default", "read-heavy"), default="read-heavy")
    ap.add_argument("--warmup", type=int, default=1, help="untimed sequences first (they compile)")
    args = ap.parse_args()
    import torch

    from fuzz.engine.production.generator import READ_HEAVY_MIX
    from fuzz.engine.tiers import make_tier
    from fuzz.engine.tracks import get

    tier = make_tier("cuda")
    production = get("production")
    mix = READ_HEAVY_MIX if args.mix == "read-heavy" else None
    warm_up(tier, 10**6, args.warmup, 8 if args.warmup == 1 else args.ops, mix=mix)  # compile outside the profile
    seeds = iter(range(10**6))

    def one(deadline):
        run = production.run_sequence(tier, next(seeds), args.ops, deadline=deadline, mix=mix,
                                      check_every=args.check_every).run
        return {"ops": run.stats.ops, "elements": run.elements_checked, "sequences": 1}

    profile(one, args.seconds, args.top, sync=torch.cuda.synchronize)


if __name__ == "__main__":
    main()
