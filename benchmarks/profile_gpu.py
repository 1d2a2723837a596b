"""Where the GPU's time goes when kvfuzz fuzzes: the device kernels of production-scale sequences
(``kernels``: torch.profiler, CUDA time per kernel name, and the share of the wall the device was
busy), the host's time of the same sequences (``host``: cProfile alone, with the host reads the
checks made: ``KVFUZZ_DEFER_CHECKS`` sets how many ops' checks one read serves), where they
synchronize with the device (``syncs``: every synchronizing CUDA call, by call site), and one
small-shape worker's host time (``small``: cProfile of the small track's sequences, with the
device time beside it).

    PYTHONPATH=. python3 benchmarks/profile_gpu.py kernels --set kvkernels --seconds 4
    PYTHONPATH=. python3 benchmarks/profile_gpu.py kernels --set indep --mix default
    KVFUZZ_DEFER_CHECKS=1 PYTHONPATH=. python3 benchmarks/profile_gpu.py host --set kvkernels
    PYTHONPATH=. python3 benchmarks/profile_gpu.py small --seconds 10

Both warm up first (untimed sequences of seeds that are never profiled), so compiles stay out of
the profile, and print one JSON line (``--out``) beside the tables. On a CPU (``--device cpu``:
the interpreter, small limits) it is a smoke run of the script, not a figure.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOREIGN = ROOT / "tests" / "fixtures" / "kernels" / "foreign"


def _device_table(prof, top: int) -> tuple[str, float, list[dict]]:
    """The profile's kernels by device time (self), the device's busy seconds, and the top rows."""
    rows = []
    busy = 0.0
    for evt in prof.key_averages():
        dev = getattr(evt, "self_device_time_total", None)
        if dev is None:
            dev = getattr(evt, "self_cuda_time_total", 0)
        if dev and getattr(evt, "device_type", None) is not None and "CUDA" in str(evt.device_type):
            busy += dev
        rows.append({"name": evt.key[:90], "calls": evt.count, "device_ms": round(dev / 1e3, 3),
                     "cpu_ms": round(evt.self_cpu_time_total / 1e3, 3)})
    rows.sort(key=lambda r: -r["device_ms"])
    lines = [f"{'device ms':>10} {'calls':>7} {'cpu ms':>9}  name"]
    lines += [f"{r['device_ms']:10.1f} {r['calls']:7d} {r['cpu_ms']:9.1f}  {r['name']}" for r in rows[:top]]
    return "\n".join(lines), busy / 1e6, rows[:top]


def _device(tier):
    """What torch.profiler records on this tier, and how to wait for the device."""
    import torch
    from torch.profiler import ProfilerActivity

    if tier.device == "cuda":
        return [ProfilerActivity.CPU, ProfilerActivity.CUDA], torch.cuda.synchronize
    return [ProfilerActivity.CPU], lambda: None


def _production(args, tier, limits):
    """Warm up, then a function that runs production sequences for ``args.seconds`` (the
    read-heavy mix or the default one) and returns their totals and wall seconds."""
    from benchmarks.profiling import warm_up
    from fuzz.engine.production.generator import READ_HEAVY_MIX
    from fuzz.engine.tracks import get

    heavy = args.mix == "read-heavy"
    kw = dict(mix=READ_HEAVY_MIX, big=0.6, check_every=8) if heavy else dict(mix=None)
    warm_up(tier, 10**6, args.warmup, args.ops, limits=limits, **kw)
    production = get("production")
    _, sync = _device(tier)

    def sequences() -> tuple[dict, float]:
        totals = {"sequences": 0, "ops": 0, "elements": 0, "host_reads": 0}
        seed = 2 * 10**6
        start = time.monotonic()
        while time.monotonic() < start + args.seconds:
            run = production.run_sequence(tier, seed, args.ops, limits=limits, **kw).run
            totals["sequences"] += 1
            totals["ops"] += run.stats.ops
            totals["elements"] += run.elements_checked
            totals["host_reads"] += run.host_reads
            seed += 1
        sync()
        return totals, time.monotonic() - start

    sync()
    return sequences


def kernels(args, tier, limits) -> dict:
    from torch.profiler import profile

    sequences = _production(args, tier, limits)
    with profile(activities=_device(tier)[0]) as prof:
        totals, wall = sequences()  # its clock starts inside: the profiler's own start takes seconds
    table, busy, top = _device_table(prof, args.top)
    print(table)
    return {**totals, "wall_s": round(wall, 2), "device_busy_s": round(busy, 3),
            "device_busy_share": round(busy / wall, 3) if wall else None,
            "elements_per_s": totals["elements"] / wall, "top": top}


def host(args, tier, limits) -> dict:
    """Production sequences under cProfile alone (torch.profiler slows the host about 5x):
    where the host's time per op goes, and the ops and host reads it ran."""
    sequences = _production(args, tier, limits)
    cp = cProfile.Profile()
    cpu0 = time.process_time()
    cp.enable()
    totals, wall = sequences()
    cp.disable()
    cpu = time.process_time() - cpu0
    _print_stats(cp, args.top)
    return {**totals, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "ops_per_s": totals["ops"] / wall,
            "us_per_op_cpu": round(1e6 * cpu / max(totals["ops"], 1), 1), "elements_per_s": totals["elements"] / wall,
            "defer": os.environ.get("KVFUZZ_DEFER_CHECKS", "default")}


def syncs(args, tier, limits) -> dict:
    """Every synchronizing CUDA call of the same sequences (``torch.cuda.set_sync_debug_mode``),
    counted by the innermost kvfuzz or kernel-set frame that made it: what keeps the host from
    running ahead of the device (the checks' host reads should be the only ones)."""
    import collections
    import traceback
    import warnings

    import torch

    sequences = _small(args, tier) if args.track == "small" else _production(args, tier, limits)
    sites: collections.Counter = collections.Counter()

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return
        frames = [f for f in traceback.extract_stack()[:-1] if "/fuzz/" in f.filename or "kvkernels" in f.filename
                  or "fixtures" in f.filename]
        f = frames[-1] if frames else None
        sites[f"{Path(f.filename).name}:{f.lineno} {f.name}" if f else "elsewhere"] += 1

    torch.cuda.set_sync_debug_mode("warn")
    shown = warnings.showwarning
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            totals, wall = sequences()
    finally:
        warnings.showwarning = shown
        torch.cuda.set_sync_debug_mode("default")
    for site, n in sites.most_common(args.top):
        print(f"{n:7d}  {site}")
    return {**totals, "wall_s": round(wall, 2), "syncs": sum(sites.values()), "track": args.track,
            "syncs_per_op": round(sum(sites.values()) / max(totals["ops"], 1), 2), "sites": dict(sites.most_common(args.top)),
            "defer": os.environ.get("KVFUZZ_DEFER_CHECKS", "default")}


def _print_stats(cp, top: int) -> None:
    out = io.StringIO()
    pstats.Stats(cp, stream=out).sort_stats("tottime").print_stats(top)
    pstats.Stats(cp, stream=out).sort_stats("cumulative").print_stats(top)
    print(out.getvalue())


def _small(args, tier):
    """Warm up, then a function that runs small-track sequences for ``args.seconds``."""
    from fuzz.engine.tracks import get

    track = get("small")
    for s in range(args.warmup):
        track.run_sequence(tier, 10**6 + s, args.ops)

    def sequences() -> tuple[dict, float]:
        totals = {"sequences": 0, "ops": 0}
        start = time.monotonic()
        while time.monotonic() < start + args.seconds:
            seq = track.run_sequence(tier, totals["sequences"], args.ops)
            totals["ops"] += len(seq.ops)
            totals["sequences"] += 1
        return totals, time.monotonic() - start

    return sequences


def small(args, tier, limits) -> dict:
    from torch.profiler import profile

    sequences = _small(args, tier)  # its warm-up seeds are never profiled: they compile what the rest meet first
    acts, sync = _device(tier)
    cp = cProfile.Profile()
    with profile(activities=acts) as prof:
        cpu0 = time.process_time()
        cp.enable()
        totals, wall = sequences()  # its clock starts inside: the profiler's own start takes seconds
        sync()
        cp.disable()
        cpu = time.process_time() - cpu0
    table, busy, top = _device_table(prof, args.top)
    print(table)
    _print_stats(cp, args.top)
    ops = totals["ops"]
    return {**totals, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "ops_per_s": ops / wall, "us_per_op_cpu": round(1e6 * cpu / max(ops, 1), 1),
            "device_busy_s": round(busy, 3), "device_busy_share": round(busy / wall, 3) if wall else None,
            "top": top}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=("kernels", "host", "syncs", "small"))
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--set", default="kvkernels", help="kvkernels, or a foreign fixture's name (indep)")
    ap.add_argument("--mix", choices=("read-heavy", "default"), default="read-heavy")
    ap.add_argument("--track", choices=("production", "small"), default="production", help="syncs: which track")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--ops", type=int, default=None, help="ops per sequence (24 production, 200 small)")
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", default=None, help="JSON of the figures")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(ROOT))
    from fuzz.engine.production.limits import ScaleLimits
    from fuzz.engine.tiers import make_tier

    backend = "cuda" if args.device == "cuda" else "interpret"
    kernels_ref = args.set if args.set == "kvkernels" else str(FOREIGN / f"{args.set}.py")
    tier = make_tier(backend, kernels_ref)
    limits = ScaleLimits.production() if args.device == "cuda" else ScaleLimits.small()
    if args.ops is None:
        args.ops = 200 if args.part == "small" or args.track == "small" else 24
    res = {"kernels": kernels, "host": host, "syncs": syncs, "small": small}[args.part](args, tier, limits)
    res.update(part=args.part, set=args.set, mix=args.mix, device=args.device)
    line = json.dumps({k: v for k, v in res.items() if k != "top"})
    print(line)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
