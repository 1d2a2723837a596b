"""How many distinct specializations a campaign worker's sequences meet, sequence by sequence.

The compile-ahead (``fuzz/engine/production/ahead.py``) scouts a worker's warm-up and its first
``--ahead-sequences`` sequences; what it misses compiles in the timed window. This prints, for
worker 0 of a campaign (its warm-up seeds, then ``sequence_seed(opts, 0, k)``, with its palette
or without), the cumulative count of distinct specializations after each sequence: where the
curve flattens is how far a scout needs to go. Launches are recorded, not run
(``launches.record_only``), so this runs on a GPU or on a CPU (the set imported without the
interpreter; kvkernels' launchers are told to take CPU tensors to Triton), and compiles nothing.

    PYTHONPATH=. python benchmarks/compile_ahead_growth.py --kernels tests/fixtures/kernels/foreign/indep.py \\
        --sequences 64 --out /tmp/growth.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", default="kvkernels")
    ap.add_argument("--sequences", type=int, default=64)
    ap.add_argument("--palette", choices=("on", "off"), default="on")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)
    import torch

    import kvkernels.launchers
    from fuzz.engine.campaign import CampaignOptions
    from fuzz.engine.launches import record_only
    from fuzz.engine.production import ahead
    from fuzz.engine.production.generator import scale_info
    from fuzz.engine.slot import ahead_job
    from fuzz.engine.tiers import Tier, load_kernels

    device = "cuda" if torch.cuda.is_available() else "cpu"
    kvkernels.launchers.INTERPRET = device == "cpu"  # CPU tensors to the (recorded, never run) Triton kernels
    opts = CampaignOptions(backend="cuda", scale="production", kernels=args.kernels, seed=args.seed,
                           palette=args.palette, ahead_sequences=args.sequences)
    stream = ahead_job(opts, opts.tier_spec(), "unused")["streams"][0]
    tier = Tier("cuda", args.kernels, load_kernels(args.kernels), device)
    with record_only(lambda launch: None):
        scale_info(tier)
    book, curve, t0 = ahead.Book(), [], time.perf_counter()
    warmups = len(stream["seeds"]) - args.sequences
    for i, seed in enumerate(stream["seeds"]):
        done = ahead.scout_seeds(tier, stream, [seed], book)
        curve.append({"sequence": i - warmups, "seed": seed, "specializations": len(book.recipes),
                      "launches": book.launches, "cut": done["cut"]})
        print(f"{'warm-up' if i < warmups else f'sequence {i - warmups:3d}'}: {len(book.recipes):4d} specializations, "
              f"{book.launches:6d} launches, {time.perf_counter() - t0:6.1f} s", flush=True)
    import platform

    import triton

    report = {"env": {"machine": platform.machine(), "cpus": os.cpu_count(), "torch": torch.__version__,
                      "triton": triton.__version__,
                      "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None},
              "kernels": args.kernels, "device": device, "palette": args.palette, "warmups": warmups,
              "curve": curve, "scout_s": round(time.perf_counter() - t0, 2),
              "by_kernel": _by_kernel(book.recipes)}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


def _by_kernel(recipes: dict) -> dict:
    counts: dict[str, int] = {}
    for item in recipes.values():
        counts[item["kernel"]] = counts.get(item["kernel"], 0) + 1
    return dict(sorted(counts.items()))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
