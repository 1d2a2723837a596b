"""Production-scale fuzzing on a GPU: throughput, and what it finds.

Three parts, each timed:
1. production-scale fuzzing (fuzz/engine/production/) of ``kvkernels`` at its default
   constants and of the foreign fixture ``indep.py`` for ``--seconds`` each, twice: a
   read-heavy mix at full production sizes (the throughput figure: result elements diffed
   against the vectorized oracle per second; the goal on an H200 is >= 1e10, kernel +
   oracle + compare moving about 48 B per read-table element) and the default mix
   (binds, frees, packed tables, translate, graph replays): every divergence is listed;
2. the planted production-only variants of indep.py (stride_skips_trips, floor_div_grid,
   drops_last_col_block): seconds to the first divergence;
3. graph-replay fuzzing of ``host_bound_seq_lens`` (clean eagerly, wrong under CUDA-graph
   replay): seconds to find it, within 60 s.
Everything goes to ``--out`` as JSON.

``--compile-ahead on`` compiles, before each fuzzing phase's warm-up, the specializations its
warm-up and its first ``--ahead-sequences`` timed sequences meet (``production.ahead``: a scout
with launches recorded, not run, then a pool of compile processes) into the Triton cache, and
reports it as the phase's ``compile_ahead``; the phase's ``compiles`` / ``loads`` then say what
still compiled and what was only loaded in the timed window. ``--only kvkernels/throughput``
runs one phase (one per process, each with a fresh ``--cache-dir``, is what compares on and off:
``benchmarks/compile_ahead_gpu.sh``); ``--no-variants`` skips parts 2 and 3. The compiled
variants are then loaded into this process's kernels (``ahead.preload``), before the warm-up,
as a campaign's workers load them before their first op.

GPU (from the repo root)::

    PYTHONPATH=. python3 benchmarks/scale_gpu.py --seconds 45 --out scale-gpu.json

CPU smoke run (the interpreter, small limits; a few seconds)::

    PYTHONPATH=. python3 benchmarks/scale_gpu.py --device cpu --small --out /tmp/scale-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOREIGN = ROOT / "tests" / "fixtures" / "kernels" / "foreign"
VARIANTS = ("stride_skips_trips", "floor_div_grid", "drops_last_col_block")


def compile_ahead(tier, *, seed0: int, warmup: int, sequences: int, limits, mix=None, big=None,
                  check_every: int = 1, n_ops: int = 24) -> dict:
    """Compile what the warm-up (seeds below seed0) and the first ``sequences`` timed sequences
    of a phase meet, before it starts (``production.ahead``)."""
    from fuzz.engine.compile_check.client import kernels_ref
    from fuzz.engine.production import ahead
    from fuzz.engine.production.generator import scale_info

    seeds = [seed0 - 1 - k for k in range(warmup)] + [seed0 + k for k in range(sequences)]
    with tempfile.TemporaryDirectory() as tmp:
        recipes = Path(tmp) / "recipes.json"
        job = {"kernels": kernels_ref(tier), "recipes_out": str(recipes),
               "streams": [ahead.stream(seeds, mix=mix, big=big, limits=limits, n_ops=n_ops, check_every=check_every)]}
        report = ahead.run_job(job)
        if recipes.is_file():  # loaded into this process's kernels, as a campaign's worker does
            report["preload"] = ahead.preload(recipes)
    report["same_boundaries"] = report.get("constants") == scale_info(tier)["constants"]  # the scout drew as we do
    return report


def fuzz(tier, seconds: float, *, seed0: int, limits, mix=None, big=None, check_every: int = 1,
         n_ops: int = 24, stop_at_first: bool = False, warmup: int = 0, ahead: int = 0) -> dict:
    """Sequences from seed0 on, for ``seconds``, after ``warmup`` untimed sequences (seeds below
    seed0: they compile what the timed ones meet first); throughput, the compiles inside the
    timed part, and the divergences found. ``ahead``: sequences compiled ahead (0: none)."""
    import torch

    from benchmarks.profiling import warm_up
    from fuzz.engine.launches import compile_seconds, compiles, load_seconds, loads
    from fuzz.engine.tracks import get

    report_ahead = None
    if ahead:
        report_ahead = compile_ahead(tier, seed0=seed0, warmup=warmup, sequences=ahead, limits=limits, mix=mix,
                                     big=big, check_every=check_every, n_ops=n_ops)
    warm_up(tier, seed0, warmup, n_ops, limits=limits, mix=mix, big=big, check_every=check_every)
    compile0 = (compile_seconds(), compiles(), load_seconds(), loads())
    start = time.monotonic()
    deadline = start + seconds
    res = {"sequences": 0, "ops": 0, "elements": 0, "graph_replays": 0, "not_applicable": 0, "divergences": []}
    seed = seed0
    while time.monotonic() < deadline:
        seq = get("production").run_sequence(tier, seed, n_ops, deadline=deadline, limits=limits, mix=mix, big=big,
                                             check_every=check_every)
        config, d, run = seq.config, seq.divergence, seq.run
        res["sequences"] += 1
        res["ops"] += run.stats.ops
        res["elements"] += run.elements_checked
        res["graph_replays"] += run.graph_replays
        res["not_applicable"] += run.graph_not_applicable
        if d is not None:
            res["divergences"].append({"seed": seed, "after_s": round(time.monotonic() - start, 2),
                                       "signature": str(d.signature), "divergence": str(d)[:400],
                                       "config": config.to_json(), "op": d.op.to_json() if d.op else None})
            if stop_at_first:
                break
        seed += 1
    if str(tier.device).startswith("cuda"):
        torch.cuda.synchronize()
    wall = time.monotonic() - start
    res["wall_s"] = round(wall, 2)
    res["warmup_sequences"] = warmup
    res["compile_s"] = round(compile_seconds() - compile0[0], 2)
    res["compiles"] = compiles() - compile0[1]
    res["load_s"] = round(load_seconds() - compile0[2], 2)
    res["loads"] = loads() - compile0[3]
    res["compile_ahead"] = report_ahead
    res["elements_per_s"] = res["elements"] / wall if wall > 0 else 0.0
    res["ops_per_s"] = res["ops"] / wall if wall > 0 else 0.0
    if str(tier.device).startswith("cuda"):
        res["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--small", action="store_true", help="small limits (a smoke run)")
    ap.add_argument("--seconds", type=float, default=None, help="per fuzzing phase (default 45 on cuda, 3 on cpu)")
    ap.add_argument("--find-seconds", type=float, default=60.0, help="budget to find each planted variant")
    ap.add_argument("--out", default="scale-gpu.json")
    ap.add_argument("--warmup", type=int, default=0, help="untimed sequences before each fuzzing phase")
    ap.add_argument("--compile-ahead", choices=("on", "off"), default="off",
                    help="compile each phase's specializations before it (production.ahead)")
    ap.add_argument("--ahead-sequences", type=int, default=96, help="timed sequences the compile-ahead scouts")
    ap.add_argument("--only", default=None, help="comma-separated phases to run, e.g. indep/throughput,indep/mixed")
    ap.add_argument("--no-variants", action="store_true", help="skip the planted variants and the graph part")
    ap.add_argument("--cache-dir", default=None, help="TRITON_CACHE_DIR for this run (a fresh one: a cold start)")
    args = ap.parse_args(argv)
    if args.cache_dir:
        os.environ["TRITON_CACHE_DIR"] = str(Path(args.cache_dir).resolve())  # before triton is imported
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    else:
        os.environ.pop("TRITON_INTERPRET", None)
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(FOREIGN))
    import torch
    import triton
    import variants

    from fuzz.engine.production import generator as scale
    from fuzz.engine.production.ahead import describe
    from fuzz.engine.production.limits import ScaleLimits
    from fuzz.engine.tiers import make_tier

    backend = "cuda" if args.device == "cuda" else "interpret"
    seconds = args.seconds if args.seconds is not None else (45.0 if args.device == "cuda" else 3.0)
    # Small limits cap read tables below the ~TARGET_BLOCKS programs a second trip needs:
    # stride_skips_trips is out of reach there, so the smoke run does not wait for it.
    find_s = min(args.find_seconds, 5.0) if args.small else args.find_seconds
    if args.small:
        limits = ScaleLimits.small()
    else:
        limits = ScaleLimits.production() if args.device == "cuda" else ScaleLimits.interpreter()
    report = {"env": {"device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
                      "torch": torch.__version__, "triton": triton.__version__, "backend": backend,
                      "seconds_per_phase": seconds, "limits": "small" if args.small else "default",
                      "warmup_sequences": args.warmup, "compile_ahead": args.compile_ahead,
                      "ahead_sequences": args.ahead_sequences if args.compile_ahead == "on" else 0,
                      "cpus": os.cpu_count()},
              "fuzz": {}, "variants": {}, "graph": {}}

    def log(msg):
        print(msg, flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        paths = {name: str(variants.materialize(name, tmp)) for name in (*VARIANTS, "host_bound_seq_lens")}
        sets = {"kvkernels": "kvkernels", "indep": str(FOREIGN / "indep.py")}
        only = set(args.only.split(",")) if args.only else None
        for i, (name, kernels) in enumerate(sets.items()):
            phases = [(phase, kw) for phase, kw in (("throughput", dict(mix=scale.READ_HEAVY_MIX, big=0.6, check_every=8)),
                                                    ("mixed", dict(mix=None)))
                      if only is None or f"{name}/{phase}" in only]
            if not phases:
                continue
            tier = make_tier(backend, kernels)
            for phase, kw in phases:
                res = fuzz(tier, seconds, seed0=1000 * (i + 1) + (0 if phase == "throughput" else 500), limits=limits,
                           warmup=args.warmup, ahead=args.ahead_sequences if args.compile_ahead == "on" else 0, **kw)
                report["fuzz"][f"{name}/{phase}"] = res
                log(f"{name:9s} {phase:10s}: {res['elements_per_s']:.3e} elements/s, {res['ops_per_s']:.1f} ops/s, "
                    f"{res['sequences']} sequences, {len(res['divergences'])} divergences, "
                    f"{res['graph_replays']} graph replays ({res['not_applicable']} not applicable), "
                    f"{res['compiles']} compiles ({res['compile_s']} s), {res['loads']} loads ({res['load_s']} s) after "
                    f"{args.warmup} warm-up sequences"
                    + (f"; compile-ahead: {describe(res['compile_ahead'])}" if res["compile_ahead"] else ""))
                for d in res["divergences"][:3]:
                    log(f"    seed {d['seed']}: {d['divergence']}")
        for name in () if args.no_variants else VARIANTS:
            tier = make_tier(backend, paths[name])
            res = fuzz(tier, find_s, seed0=0, limits=limits, stop_at_first=True, n_ops=16)
            first = res["divergences"][0] if res["divergences"] else None
            report["variants"][name] = {"found": first is not None, "after_s": first and first["after_s"],
                                        "signature": first and first["signature"], "sequences": res["sequences"],
                                        "divergence": first and first["divergence"]}
            log(f"variant {name}: " + (f"found after {first['after_s']} s: {first['signature']}" if first
                                      else f"NOT found in {find_s} s ({res['sequences']} sequences)"))
        if not args.no_variants:
            tier = make_tier(backend, paths["host_bound_seq_lens"])
            eager = fuzz(tier, min(seconds, 15.0), seed0=0, limits=limits, mix=scale.EAGER_MIX)
            graph = fuzz(tier, find_s, seed0=0, limits=limits, mix=scale.GRAPH_MIX, stop_at_first=True, n_ops=8)
            first = graph["divergences"][0] if graph["divergences"] else None
            report["graph"]["host_bound_seq_lens"] = {
                "eager_divergences": len(eager["divergences"]), "eager_ops": eager["ops"],
                "found_under_replay": first is not None, "after_s": first and first["after_s"],
                "signature": first and first["signature"], "divergence": first and first["divergence"],
                "replays": graph["graph_replays"], "not_applicable": graph["not_applicable"]}
            log(f"host_bound_seq_lens: eager {len(eager['divergences'])} divergences in {eager['ops']} ops; under "
                f"{'CUDA graph' if args.device == 'cuda' else 'emulated'} replay: "
                + (f"found after {first['after_s']} s: {first['signature']}" if first else f"NOT found in {find_s} s"))
    thr = [v["elements_per_s"] for k, v in report["fuzz"].items() if k.endswith("/throughput")]
    # None where no read-heavy phase ran (--only a mix): not a measured zero, nor a missed goal
    report["summary"] = {"elements_per_s_min": min(thr) if thr else None,
                         "goal_1e10_met": min(thr) >= 1e10 if thr else None,
                         "variants_found": sum(v["found"] for v in report["variants"].values()),
                         "host_bound_found_under_replay": report["graph"].get("host_bound_seq_lens", {}).get(
                             "found_under_replay"),
                         "clean_sets_clean": all(not v["divergences"] for v in report["fuzz"].values())}
    Path(args.out).write_text(json.dumps(report, indent=1))
    log(f"summary: {report['summary']}")
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
