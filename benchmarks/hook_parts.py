"""The launch hook's host cost per launch, in parts, on recorded launches: what a guided campaign
pays per launch for value features on a GPU (no code traced), measured warm (each loop runs the
same recorded launches again, the feature memo filled) so a part's steady cost shows apart from
the campaign's cold caches (``profile_collect.py --attribute`` times the hook inside real sequences).

Parts: ``full`` (``launches._describe`` then ``Collector.__call__``: the hook with any observer
that takes a ``Launch``), ``light`` (``Collector.light``: the hook when collectors alone observe,
``launches._run_light``), ``describe``, ``features`` (``features.launch_features`` alone).

    TRITON_INTERPRET=1 python benchmarks/hook_parts.py --tier interpret   # tensors as meta ones
    python benchmarks/hook_parts.py --tier cuda
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tier", default="interpret", help="interpret (tensors replaced by meta ones, as on a GPU) or cuda")
    ap.add_argument("--seqs", type=int, default=3)
    ap.add_argument("--ops", type=int, default=100)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import torch

    from fuzz.engine import features, launches, tracks
    from fuzz.engine.tiers import make_tier

    tier, track = make_tier(args.tier), tracks.get("small")
    with launches.Recorder() as rec:
        for seed in range(args.seqs):
            track.run_sequence(tier, seed, args.ops)

    def conv(v):
        meta = isinstance(v, torch.Tensor) and args.tier == "interpret"
        return torch.empty(v.shape, dtype=v.dtype, device="meta") if meta else v

    raw = [(ln.fn, tuple(map(conv, ln.args)), {**{k: conv(v) for k, v in ln.kwargs.items()}, "grid": ln.grid, "warmup": False},
            ln.grid_dims, ln.run) for ln in rec.launches]
    described = []
    for fn, a, kw, dims, run in raw:
        described.append(launches._describe(fn, a, kw, run))
        described[-1].grid_dims = dims
    col = features.Collector()

    def full(i):
        fn, a, kw, dims, run = raw[i]
        launch = launches._describe(fn, a, kw, run)
        launch.grid_dims = dims
        col(launch)

    parts = {"full": full, "light": lambda i: col.light(*raw[i][:4], raw[i][4]),
             "describe": lambda i: launches._describe(raw[i][0], raw[i][1], raw[i][2], raw[i][4]),
             "features": lambda i: features.launch_features(described[i], set(), {})}
    for i in range(len(raw)):  # the memo filled, the per-kernel caches too
        full(i)
    n, reps = len(raw), 20
    result = {"tier": args.tier, "launches": n, "us_per_launch": {}}
    for name, part in parts.items():
        best = min(timeit.repeat(lambda part=part: [part(i) for i in range(n)], number=reps, repeat=5))
        result["us_per_launch"][name] = round(1e6 * best / reps / n, 2)
    print(json.dumps(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
