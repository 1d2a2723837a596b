"""Where production-scale fuzzing spends its time: read-heavy sequences of kvkernels for
``--seconds`` under cProfile; elements checked per second and the costliest functions.

    PYTHONPATH=. python3 benchmarks/profile_scale.py --seconds 20 --ops 96
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--ops", type=int, default=24, help="ops per sequence")
    ap.add_argument("--check-every", type=int, default=1)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    import torch

    from fuzz.engine import scale
    from fuzz.engine.tiers import make_tier

    tier = make_tier("cuda")
    scale.run_sequence(tier, 10**6, 8, mix=scale.READ_HEAVY_MIX)  # compile outside the profile
    prof = cProfile.Profile()
    elements = ops = seed = 0
    start = time.monotonic()
    prof.enable()
    while time.monotonic() - start < args.seconds:
        _, _, d, run = scale.run_sequence(tier, seed, args.ops, start + args.seconds, mix=scale.READ_HEAVY_MIX,
                                          check_every=args.check_every)
        elements += run.elements_checked
        ops += run.stats.ops
        seed += 1
    torch.cuda.synchronize()
    prof.disable()
    wall = time.monotonic() - start
    print(f"{ops} ops, {seed} sequences, {elements / wall:.3e} elements/s, {ops / wall:.1f} ops/s in {wall:.1f} s")
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.top)
    print(out.getvalue())


if __name__ == "__main__":
    main()
