"""Where the guided track's collection cost goes: the same blind small-track sequences run bare
and under a ``features.Collector`` (value features only, as on CUDA), each mode under its own
``cProfile``, and the functions whose own time grew most from bare to collected.

``guided_vs_blind.py --parts overhead`` says how much collecting costs; ``--parts hook`` times
the hook alone on recorded launches. This says where the rest goes on a real tier.

    python benchmarks/profile_collect.py --backend cuda --seqs 15 --out prof.json
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _own_times(prof: cProfile.Profile) -> dict[str, tuple[float, int]]:
    stats = pstats.Stats(prof).stats
    out = {}
    for (file, line, name), (_, ncalls, tottime, _, _) in stats.items():
        out[f"{Path(file).name}:{line}({name})"] = (tottime, ncalls)
    return out


def _run(mode: str, tier, track, seed: int, n: int):
    from fuzz.engine import features, launches

    if mode == "bare":
        return track.run_sequence(tier, seed, n)
    if mode == "observed":  # the hook's plumbing alone: every launch described for an observer that does nothing
        stop = launches.observe(lambda launch: None)
        try:
            return track.run_sequence(tier, seed, n)
        finally:
            stop()
    col = features.Collector(None)
    with col:
        seq = track.run_sequence(tier, seed, n)
    col.add_run(seq.run)
    return seq


MODES = ("bare", "observed", "collected")


def _spread(calls: list[float]) -> dict:
    """Per-call microseconds: how many, their sum, median, p90, p99, max, and the share of the sum
    in calls over ten times the median (stalls, not the steady work)."""
    if not calls:
        return {"calls": 0}
    xs = sorted(calls)
    q = lambda f: round(1e6 * xs[min(len(xs) - 1, int(f * len(xs)))], 2)  # noqa: E731
    med = xs[len(xs) // 2]
    return {"calls": len(xs), "sum_s": round(sum(xs), 4), "median_us": q(0.5), "p90_us": q(0.9), "p99_us": q(0.99),
            "max_us": round(1e6 * xs[-1], 1), "stall_share": round(sum(x for x in xs if x > 10 * med) / sum(xs), 3)}


def _attribute(args, tier, track) -> int:
    """No profiler: per mode (bare; observed: each launch described for an observer that does
    nothing, the hook's plumbing; collected), CPU seconds, the garbage collector's seconds and
    collections (``gc.callbacks``), and the hook's own calls (``launches._describe``, the
    collector's call) timed where they run, as per-call spreads (``_spread``): steady work and
    stalls apart; ``--rounds`` rounds, each over seeds of its own (shapes the feature memo has
    not met), the modes' order rotated."""
    import gc

    from fuzz.engine import features, launches

    calls = {"describe": [], "collect": []}

    def timed(fn, key):
        def inner(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                calls[key].append(time.perf_counter() - t0)
        return inner

    launches._describe = timed(launches._describe, "describe")
    features.Collector.__call__ = timed(features.Collector.__call__, "collect")  # a described launch's
    features.Collector.light = timed(features.Collector.light, "collect")  # or one handed over light
    mode_now, gc_t = ["bare"], {}
    stats = {m: {"cpu_s": 0.0, "gc_s": 0.0, "gcs": 0, "ops": 0} for m in MODES}

    def on_gc(phase, info):
        if phase == "start":
            gc_t["t"] = time.perf_counter()
        elif "t" in gc_t:
            stats[mode_now[0]]["gc_s"] += time.perf_counter() - gc_t.pop("t")
            stats[mode_now[0]]["gcs"] += 1

    gc.callbacks.append(on_gc)
    for r in range(args.rounds):
        for seed in range(r * args.seqs, (r + 1) * args.seqs):  # each round seeds of its own: new shapes
            for k in range(len(MODES)):
                mode_now[0] = mode = MODES[(k + r + seed) % len(MODES)]
                t0 = time.process_time()
                seq = _run(mode, tier, track, seed, args.ops_per_seq)
                stats[mode]["cpu_s"] += time.process_time() - t0
                stats[mode]["ops"] += len(seq.ops)
    gc.callbacks.remove(on_gc)
    bare = stats["bare"]["cpu_s"]
    result = {"backend": args.backend, "rounds": args.rounds, "modes": {m: {k: round(v, 4) for k, v in d.items()} for m, d in stats.items()},
              "calls": {k: _spread(v) for k, v in calls.items()},
              "cost": {m: round(1 - bare / stats[m]["cpu_s"], 4) for m in MODES[1:]},
              "gc_extra_share_of_bare": {m: round((stats[m]["gc_s"] - stats["bare"]["gc_s"]) / bare, 4) for m in MODES[1:]}}
    print(json.dumps(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--seqs", type=int, default=15)
    ap.add_argument("--ops-per-seq", type=int, default=100)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--attribute", action="store_true", help="no profiler: the hook's own seconds and the GC's, per mode")
    ap.add_argument("--rounds", type=int, default=3, help="--attribute: rounds over the seeds (the modes' order rotated)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from fuzz.engine import tracks
    from fuzz.engine.tiers import make_tier

    tier, track = make_tier(args.backend), tracks.get("small")
    for seed in range(args.seqs * (args.rounds if args.attribute else 1)):  # untimed: each seed's compiles
        track.run_sequence(tier, seed, args.ops_per_seq)
    if args.attribute:
        return _attribute(args, tier, track)
    profs, cpu, ops = {"bare": cProfile.Profile(), "collected": cProfile.Profile()}, {"bare": 0.0, "collected": 0.0}, 0
    for seed in range(args.seqs):
        for mode in ("bare", "collected"):
            t0 = time.process_time()
            profs[mode].enable()
            seq = _run(mode, tier, track, seed, args.ops_per_seq)
            profs[mode].disable()
            cpu[mode] += time.process_time() - t0
        ops += len(seq.ops)
    own = {m: _own_times(p) for m, p in profs.items()}
    grew = sorted(((own["collected"].get(k, (0, 0))[0] - own["bare"].get(k, (0, 0))[0], k) for k in
                   set(own["bare"]) | set(own["collected"])), reverse=True)[: args.top]
    rows = [{"function": k, "extra_s": round(d, 4), "calls_bare": own["bare"].get(k, (0, 0))[1],
             "calls_collected": own["collected"].get(k, (0, 0))[1]} for d, k in grew]
    result = {"backend": args.backend, "ops": ops, "cpu_s": {m: round(c, 3) for m, c in cpu.items()},
              "cost": round(1 - cpu["bare"] / cpu["collected"], 3), "grew": rows,
              "top_collected": sorted(((round(t, 4), k) for k, (t, _) in own["collected"].items()), reverse=True)[: args.top]}
    print(json.dumps({k: result[k] for k in ("backend", "ops", "cpu_s", "cost")}))
    for r in rows:
        print(f"{r['extra_s']:+8.4f} s  {r['calls_bare']:>7} -> {r['calls_collected']:>7}  {r['function']}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
