"""Host CPU microseconds per production op, by kind: the draw, the precondition check, the rest.

On one H200 the read-heavy production track is host-bound (the GPU idles a third of the
time), and a profile put most of its host time in work the CPU does the same with or
without a GPU: drawing the op (``ScaleGenerator.next_op``), checking SPEC §2's
preconditions (``ScaleOp.preflight``, the gate) and building the op's host-side inputs
(``inputs``: seq_lens, req_pool_indices and their tensors, on the CPU here). This script
times those three per op kind, in CPU seconds (``time.process_time``, torch on one
thread), for the op stream a GPU worker draws (production limits, kvkernels' constants
as its module declares them, every optional function), without running a kernel.

    PYTHONPATH=. .venv/bin/python benchmarks/profile_host_ops.py                 # read-heavy, 60 sequences
    PYTHONPATH=. .venv/bin/python benchmarks/profile_host_ops.py --mix default --out host-ops.json
    PYTHONPATH=. .venv/bin/python benchmarks/profile_host_ops.py --constants none   # a set without constants

Hostile ops are drawn but not checked (they break a clause on purpose; the runner skips
their check too).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("draw", "check", "rest")


class _Ctx:
    """What an op's preflight and ``inputs`` read of a run: ``config``, ``rows_shape``, ``device``."""

    def __init__(self, config):
        self.config, self.rows_shape, self.device = config, None, "cpu"


def stream_info(constants: str = "kvkernels") -> dict:
    """``scale_info`` of kvkernels on a GPU, from its module's constants (no launch observed);
    ``constants="none"``: of a set that declares none (the generator sweeps powers of two)."""
    import types

    import kvkernels
    from fuzz.engine.boundary import kernel_constants

    mod = kvkernels if constants == "kvkernels" else types.ModuleType("no_constants")
    return {"constants": kernel_constants(mod).to_json(), "gpu": True,
            "features": ["build_kv_read_table_legacy", "build_kv_read_table_packed", "translate_tokens"]}


def measure(sequences: int, n_ops: int, mix: dict | None, big: float, seed0: int = 0, constants: str = "kvkernels") -> dict:
    """{kind: [ops, draw s, check s, rest s]} over ``sequences`` sequences of ``n_ops`` ops."""
    from fuzz.engine.production.generator import generator
    from fuzz.engine.production.hostile import HostileOp
    from fuzz.engine.production.ops import PRows

    clock = time.process_time
    info = stream_info(constants)
    rows: dict[str, list] = {}
    for seed in range(seed0, seed0 + sequences):
        config, gen = generator(seed, info, mix=mix, big=big)
        ctx = _Ctx(config)
        for _ in range(n_ops):
            t0 = clock()
            op = gen.next_op()
            t1 = clock()
            if isinstance(op, PRows):
                ctx.rows_shape = (op.rows, op.width)
            if not isinstance(op, HostileOp):
                op.preflight(ctx)
            t2 = clock()
            inputs = getattr(op, "inputs", None)
            if inputs is not None:
                inputs(ctx)
            t3 = clock()
            r = rows.setdefault(op.kind, [0, 0.0, 0.0, 0.0])
            r[0] += 1
            r[1] += t1 - t0
            r[2] += t2 - t1
            r[3] += t3 - t2
    return rows


def table(rows: dict) -> dict:
    out = {}
    for kind, (n, *secs) in sorted(rows.items(), key=lambda kv: -sum(kv[1][1:])):
        us = {part: round(1e6 * s / n, 1) for part, s in zip(PARTS, secs)}
        out[kind] = {"ops": n, **{f"{p}_us": v for p, v in us.items()}, "total_us": round(sum(us.values()), 1)}
    n = sum(r[0] for r in rows.values())
    tot = {p: round(1e6 * sum(r[1 + k] for r in rows.values()) / max(n, 1), 1) for k, p in enumerate(PARTS)}
    out["all"] = {"ops": n, **{f"{p}_us": v for p, v in tot.items()}, "total_us": round(sum(tot.values()), 1)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sequences", type=int, default=60)
    ap.add_argument("--ops", type=int, default=24, help="ops per sequence")
    ap.add_argument("--mix", choices=("read-heavy", "default"), default="read-heavy")
    ap.add_argument("--big", type=float, default=0.6, help="share of full-size read tables (scale_gpu's throughput: 0.6)")
    ap.add_argument("--constants", choices=("kvkernels", "none"), default="kvkernels",
                    help="the stream of kvkernels, or of a set with no BLOCK/TARGET constants")
    ap.add_argument("--out", type=Path, default=None, help="write the table as JSON here")
    args = ap.parse_args(argv)
    import torch

    from fuzz.engine.production.generator import READ_HEAVY_MIX

    torch.set_num_threads(1)  # CPU seconds of this thread only: no idle worker threads counted
    mix = READ_HEAVY_MIX if args.mix == "read-heavy" else None
    measure(2, 4, mix, args.big, seed0=10**6, constants=args.constants)  # imports and first-call caches, untimed
    res = table(measure(args.sequences, args.ops, mix, args.big, constants=args.constants))
    print(f"{'kind':<30}{'ops':>6}" + "".join(f"{p + ' us':>11}" for p in (*PARTS, "total")))
    for kind, r in res.items():
        print(f"{kind:<30}{r['ops']:>6}" + "".join(f"{r[p + '_us']:>11.1f}" for p in (*PARTS, "total")))
    if args.out:
        report = {"command": " ".join(["benchmarks/profile_host_ops.py", *(argv or sys.argv[1:])]),
                  "mix": args.mix, "big": args.big, "constants": args.constants, "sequences": args.sequences, "ops": args.ops,
                  "cpu_seconds": "time.process_time, torch on one thread", "kinds": res}
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
