"""Where a production-scale campaign's time goes, op kind by op kind, after a warm-up.

Runs ``--warmup`` sequences untimed (they compile what the timed part meets), then
sequences for ``--seconds`` with the device synchronized around every op, so each op's
wall time (launches, oracle, compare, host reads, allocations) is charged to its kind; the
generator, the runner's set-up and its final check are charged to their own rows. Prints
and writes (``--out``) per kind: ops, seconds, ms/op, result elements checked and
elements/s; and the seconds spent compiling inside the timed part.

    PYTHONPATH=. python3 benchmarks/profile_kinds.py --seconds 20 --out kinds.json
    PYTHONPATH=. python3 benchmarks/profile_kinds.py --kernels tests/fixtures/kernels/foreign/indep.py
    PYTHONPATH=. python3 benchmarks/profile_kinds.py --device cpu --small --seconds 5   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class KindClock:
    """Wall seconds, ops and elements per row (an op kind, or a part of the runner)."""

    def __init__(self, sync):
        self.sync = sync
        self.rows: dict[str, list] = {}

    def timed(self, row: str, fn, *args, elements=None, **kwargs):
        self.sync()
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.sync()
            r = self.rows.setdefault(row, [0, 0.0, 0])
            r[0] += 1
            r[1] += time.perf_counter() - t0
            if elements is not None:
                r[2] += elements()

    def table(self) -> dict:
        total = sum(r[1] for r in self.rows.values()) or 1.0
        return {row: {"ops": n, "s": round(s, 3), "share": round(s / total, 3), "ms_per_op": round(1e3 * s / n, 3),
                      "elements": e, "elements_per_s": e / s if s else 0.0}
                for row, (n, s, e) in sorted(self.rows.items(), key=lambda kv: -kv[1][1])}


def run(tier, seconds: float, warmup: int, n_ops: int, mix, big, check_every: int, seed0: int, limits) -> dict:
    import torch

    from benchmarks.profiling import warm_up
    from fuzz.engine.launches import compile_seconds
    from fuzz.engine.production import generator as gen_mod
    from fuzz.engine.production.run import ScaleRun
    from fuzz.engine.verdict import Divergence

    cuda = str(tier.device).startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    t0 = time.monotonic()
    warm_up(tier, seed0, warmup, n_ops, limits=limits, mix=mix, big=big, check_every=check_every)
    sync()
    warm_s = time.monotonic() - t0
    clock = KindClock(sync)
    compile0 = compile_seconds()
    start = time.monotonic()
    deadline = start + seconds
    seed, sequences, divergences = seed0, 0, []
    while time.monotonic() < deadline:
        config, gen = clock.timed("(generator set-up)", gen_mod.generator, seed, gen_mod.scale_info(tier), limits=limits,
                                  mix=mix, big=big)
        run_ = clock.timed("(runner set-up)", ScaleRun, config, tier, check_every=check_every)
        try:
            for _ in range(n_ops):
                if time.monotonic() >= deadline:
                    break
                op = clock.timed("(generator)", gen.next_op)
                before = run_.elements_checked
                clock.timed(op.kind, run_.step, op,
                            elements=lambda r=run_, b=before: r.elements_checked - b)
            clock.timed("(final check)", run_.finish)
        except Divergence as d:
            divergences.append({"seed": seed, "signature": str(d.signature), "divergence": str(d)[:300]})
        sequences += 1
        seed += 1
    wall = time.monotonic() - start
    rows = clock.table()
    elements = sum(r["elements"] for r in rows.values())
    return {"warmup_sequences": warmup, "warmup_s": round(warm_s, 2), "wall_s": round(wall, 2),
            "sequences": sequences, "elements": elements, "elements_per_s": elements / wall if wall else 0.0,
            "compile_s_timed": round(compile_seconds() - compile0, 2), "divergences": divergences[:5],
            "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None, "kinds": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--kernels", default="kvkernels")
    ap.add_argument("--small", action="store_true", help="small limits (a smoke run)")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--warmup", type=int, default=12, help="untimed sequences first")
    ap.add_argument("--ops", type=int, default=24, help="ops per sequence")
    ap.add_argument("--mix", choices=("default", "read-heavy"), default="default")
    ap.add_argument("--check-every", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(ROOT))
    import torch
    import triton

    from fuzz.engine.production.generator import READ_HEAVY_MIX
    from fuzz.engine.production.limits import ScaleLimits
    from fuzz.engine.tiers import make_tier

    tier = make_tier("cuda" if args.device == "cuda" else "interpret", args.kernels)
    limits = ScaleLimits.small() if args.small else ScaleLimits.for_tier(tier)
    mix, big = (READ_HEAVY_MIX, 0.6) if args.mix == "read-heavy" else (None, None)
    res = run(tier, args.seconds, args.warmup, args.ops, mix, big, args.check_every, 10_000, limits)
    res["env"] = {"device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
                  "torch": torch.__version__, "triton": triton.__version__, "kernels": args.kernels, "mix": args.mix,
                  "check_every": args.check_every}
    print(f"{args.kernels} {args.mix}: {res['elements_per_s']:.3e} elements/s over {res['wall_s']} s "
          f"({res['sequences']} sequences, compile {res['compile_s_timed']} s timed, warm-up {res['warmup_s']} s)")
    for row, r in res["kinds"].items():
        print(f"  {row:32s} {r['ops']:6d} ops {r['s']:8.3f} s ({100 * r['share']:4.1f}%) {r['ms_per_op']:9.3f} ms/op"
              f"  {r['elements_per_s']:.2e} el/s")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
