"""How many kernel variants a GPU campaign would compile, counted on the CPU.

Runs production sequences of a kernel set on the interpreter and collects every launch's
specialization key (``fuzz.engine.signatures.specialization``: what Triton compiles a variant
per: argument classes, constexprs, options). Prints, per kernel, the distinct keys, and per
argument the classes it took: the arguments whose classes vary are what make a GPU run
compile again and again.

    PYTHONPATH=. python3 benchmarks/variants.py --sequences 40
    PYTHONPATH=. python3 benchmarks/variants.py --kernels tests/fixtures/kernels/foreign/indep.py --palette
    PYTHONPATH=. python3 benchmarks/variants.py --gpu-layouts   # aligned layouts as often as on a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def count(kernels: str, sequences: int, n_ops: int, palette: bool, seed0: int = 0) -> dict:
    from fuzz.engine import launches, signatures
    from fuzz.engine.production.generator import scale_info
    from fuzz.engine.production.limits import ScaleLimits
    from fuzz.engine.production.palette import palette_info
    from fuzz.engine.tiers import make_tier
    from fuzz.engine.tracks import get

    tier = make_tier("interpret", kernels)
    keys: dict[str, set] = defaultdict(set)
    launches.observe(lambda launch: keys[launch.name].add(signatures.specialization(launch)))
    production = get("production")
    info = scale_info(tier)
    limits = ScaleLimits.small()
    for k in range(sequences):
        kw = {"palette_seed": 12345} if palette else {}
        production.run_sequence(tier, seed0 + k, n_ops, limits=limits, **kw)
    out = {}
    for name, ks in sorted(keys.items()):
        classes: dict[str, set] = defaultdict(set)
        for _, args, _ in ks:
            for arg, cls in args:
                classes[arg].add(repr(cls))
        out[name] = {"variants": len(ks), "varying": {a: sorted(c) for a, c in classes.items() if len(c) > 1}}
    return {"kernels": kernels, "palette": palette, "sequences": sequences, "info": info["constants"]["source"],
            "total": sum(v["variants"] for v in out.values()), "per_kernel": out, "palette_info": palette_info(12345)
            if palette else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", default="kvkernels")
    ap.add_argument("--sequences", type=int, default=30)
    ap.add_argument("--ops", type=int, default=24)
    ap.add_argument("--palette", action="store_true")
    ap.add_argument("--gpu-layouts", action="store_true",
                    help="aligned layouts in the share a GPU run draws (three in four), not the interpreter's half")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(ROOT))
    if args.gpu_layouts:
        from fuzz.engine.production import generator

        as_drawn = generator.sequence_aligned
        generator.sequence_aligned = lambda seed, gpu: as_drawn(seed, True)
    res = count(args.kernels, args.sequences, args.ops, args.palette)
    print(f"{args.kernels}{' (palette)' if args.palette else ''}: {res['total']} variants in {args.sequences} sequences")
    for name, v in res["per_kernel"].items():
        print(f"  {name:32s} {v['variants']:4d}  varying: " + "; ".join(f"{a}={'|'.join(c)}" for a, c in v["varying"].items()))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
