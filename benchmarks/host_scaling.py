"""Does a host of N GPUs fuzz N times as fast as one? The figures table for 1, 2, 4, 8 GPUs.

Each row is one stage of ``fuzz.tools.host`` (the nightly's per-GPU campaigns and their
merge) on the first G GPUs, at one scale and layout, with the same seed and the same work:
``--max-sequences`` of the host, split over the GPUs so that every row runs the very same
sequences (``fuzz/tools/host.py``). So a row's ops are the same whatever G, its ops/s is
what G GPUs give, and its merge (signatures, occurrences summed over the GPUs, the corpus
union for ``guided``) is the one result a team reads.

Scales: ``small`` and ``production`` (blind), ``guided`` (small, coverage-guided, each row
from an empty corpus: the union of the GPUs' corpora is checked to be what the merged one
covers). Before a scale's first row, an untimed warm-up on every GPU fills ``--cache-dir``
(Triton's cache), so a 1-GPU row does not pay the compiles the 8-GPU row then loads.

A row's result goes to ``OUT/rows/ROW.json`` as it ends, and a row found there is not run
again: a run cut short (``--until-s``: start no row after that many seconds; a 10-minute
command limit) resumes where it stopped. ``OUT/host-scaling.json`` and ``.md`` (the table,
the machine and versions) are rewritten from every row present after each row.

One GPU host, from the repo root (everything: about 15 min of GPU time on H200s)::

    PYTHONPATH=. python3 benchmarks/host_scaling.py --out host-scaling   # then commit it under benchmarks/results/, named for the machine

CPU, N simulated GPUs (CPU campaigns standing in; the logic, not the figures)::

    KVFUZZ_SIMULATE_GPUS=4 PYTHONPATH=. python3 benchmarks/host_scaling.py --gpus 1,2,4 --backend torch \\
        --small-sequences 16 --scales small,guided --out /tmp/host-scaling-sim
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from fuzz.tools import host as hostmod
from fuzz.tools.reports import dumps, write

SCALES = ("small", "production", "guided")
WARMUP_SEQUENCES = 4  # per GPU: enough to meet the kernels' first specializations


def rows(scales, layouts, gpus):
    """(scale, layout, G) in the order they run; ``workers`` at one GPU is ``shards`` at one GPU."""
    return [(s, lay, g) for s in scales for lay in layouts for g in gpus if not (lay == "workers" and g == 1)]


def run_args(args, scale: str) -> list[str]:
    out = ["--scale", "production" if scale == "production" else "small", "--seed", str(args.seed),
           "--budget-s", str(args.cap_s), "--check-every", str(args.check_every)]
    return out + (["--cache-dir", args.cache_dir] if args.cache_dir else [])


def row_key(scale: str, layout: str, g: int) -> str:
    return f"{scale}-{layout}-{g}"


def one_row(args, host, scale: str, layout: str, g: int) -> dict:
    sequences = args.production_sequences if scale == "production" else args.small_sequences
    sub = hostmod.Host(host.devices[:g], host.simulated)
    placements = hostmod.plan(sub.devices, layout=layout, workers_per_gpu=args.workers_per_gpu,
                              max_sequences=sequences)
    where = Path(args.out) / "stages" / row_key(scale, layout, g)
    corpus = where.parent / f"{where.name}-corpus" if scale == "guided" else None
    if corpus is not None:
        import shutil

        shutil.rmtree(corpus, ignore_errors=True)  # each guided row from an empty corpus
    record = hostmod.run_stage(sub, placements, where, run_args(args, scale), corpus=corpus, backend=args.backend)
    return {"row": row_key(scale, layout, g), "scale": scale, "layout": layout, "gpus": g,
            "max_sequences": sequences, "workers_per_gpu": args.workers_per_gpu, "stage": str(where), **record}


def warm_up(args, host, scale: str) -> dict:
    placements = hostmod.plan(host.devices, workers_per_gpu=args.workers_per_gpu,
                              max_sequences=WARMUP_SEQUENCES * max(1, len(host.devices)))
    record = hostmod.run_stage(host, placements, Path(args.out) / "stages" / f"warmup-{scale}",
                               run_args(args, scale), backend=args.backend)
    return {"scale": scale, "wall_s": record["wall_s"], "exit_code": record["exit_code"]}


def _f(value, fmt: str = ",.0f") -> str:
    return "-" if value is None else format(value, fmt)


def table(results: list[dict]) -> str:
    """The figures, one line per row; ``x1`` against the same scale and layout's 1-GPU row (the
    shards row stands for both layouts at one GPU)."""
    one = {r["scale"]: r for r in results if r["gpus"] == 1}
    head = ("| scale | layout | GPUs | ops | ops/s | x1 GPU | per GPU | elements/s | steady ops/s | wall s "
            "| host CPUs busy | slowest/fastest GPU | signatures | occurrences (= GPUs' sum) | corpus kept / features "
            "| exit |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in results:
        base = one.get(r["scale"])
        x = r["ops_per_s"] / base["ops_per_s"] if base and base["ops_per_s"] else None
        rates = [c["ops_per_s"] for c in r["campaigns"] if c.get("ops_per_s")]
        spread = f"{min(rates) / max(rates):.2f}" if len(rates) > 1 and max(rates) else "-"
        merged = r.get("merge") or {}
        occ = "-" if not merged else (f"{merged['occurrences']} ({'=' if merged['occurrences'] == r['shard_occurrences'] else '!='}"
                                      f" {r['shard_occurrences']})")
        corpus = r.get("corpus")
        kept = "-" if not corpus else (f"{corpus['kept']} / {corpus['features']}"
                                       + ("" if corpus["union_covered"] else " (union NOT covered)"))
        lines.append(f"| {r['scale']} | {r['layout']} | {r['gpus']} | {r['ops']:,} | {_f(r['ops_per_s'])} "
                     f"| {_f(x, '.2f')} | {_f(x / r['gpus'] if x else None, '.2f')} | {_f(r['elements_per_s'], '.3g')} "
                     f"| {_f(r['steady_ops_per_s'])} | {r['wall_s']:.1f} | {_f(r['cpu_cores_busy'], '.1f')} of "
                     f"{r['host_cores']} | {spread} | {merged.get('signatures', '-')} | {occ} | {kept} "
                     f"| {r['exit_code']} |")
    return "\n".join(lines)


def report(out: Path, order: list[str], machine: dict, warmups: list) -> dict:
    results = [json.loads((out / "rows" / f"{k}.json").read_text()) for k in order
               if (out / "rows" / f"{k}.json").is_file()]
    data = {"schema": "kvfuzz-host-scaling/1", "machine": machine, "warmups": warmups, "rows": results,
            "missing": [k for k in order if not (out / "rows" / f"{k}.json").is_file()]}
    write(str(out / "host-scaling.json"), dumps(data))
    md = [f"# Host scaling: {machine.get('gpu') or 'no GPU'} x {machine['devices']}"
          + (" (simulated: CPU campaigns)" if machine["simulated"] else ""), "",
          f"kvfuzz {machine.get('git_sha')}, torch {machine.get('torch')}, Triton {machine.get('triton')}, "
          f"Python {machine.get('python')}, {machine['host_cores']} host cores. Command: `{machine['command']}`.", "",
          "The same seed and sequences in every row of a blind scale (guided: as many sequences, each worker's "
          "corpus steering its own); ops/s over the campaigns' own clocks (the slowest GPU's), steady after their "
          "warm-up; x1 GPU against the 1-GPU row; per GPU = x1 / GPUs.", "",
          table(results)]
    if data["missing"]:
        md += ["", f"Not run yet: {', '.join(data['missing'])} (run the command again: it resumes)."]
    write(str(out / "host-scaling.md"), "\n".join(md) + "\n")
    return data


def machine_info(host, args) -> dict:
    import os

    from fuzz.environment import environment

    env = environment()
    return {**{k: env.get(k) for k in ("git_sha", "torch", "triton", "python", "gpu", "platform")},
            "devices": len(host.devices), "simulated": host.simulated, "host_cores": os.cpu_count(),
            "command": " ".join(sys.argv)}


def _list(kind, choices=None):
    def parse(text: str):
        items = [kind(x) for x in text.split(",") if x]
        if choices and any(x not in choices for x in items):
            raise argparse.ArgumentTypeError(f"{text!r}: each one of {', '.join(choices)}")
        return items
    return parse


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--gpus", type=_list(int), default=[1, 2, 4, 8], help="GPU counts (those the host has)")
    ap.add_argument("--scales", type=_list(str, SCALES), default=list(SCALES))
    ap.add_argument("--layouts", type=_list(str, hostmod.LAYOUTS), default=list(hostmod.LAYOUTS))
    ap.add_argument("--small-sequences", type=int, default=2400, help="the host's sequences per small/guided row")
    ap.add_argument("--production-sequences", type=int, default=320, help="the host's sequences per production row")
    ap.add_argument("--workers-per-gpu", type=int, default=4)
    ap.add_argument("--check-every", type=int, default=None, help="default 16 on GPUs (the nightly's), else 1")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cap-s", type=float, default=1800, help="each campaign's --budget-s (a safety cap)")
    ap.add_argument("--cache-dir", default=None, help="Triton's cache for every row (default: OUT/triton-cache)")
    ap.add_argument("--backend", default=None, help="default: cuda on GPUs, interpret simulated")
    ap.add_argument("--until-s", type=float, default=None, help="start no row after this many seconds")
    ap.add_argument("--again", action="store_true", help="run the rows already in OUT/rows again")
    args = ap.parse_args(argv)
    try:
        host = hostmod.find_host()
    except hostmod.HostUsageError as exc:
        ap.error(str(exc))
    if max(args.gpus) > len(host.devices):
        ap.error(f"--gpus {max(args.gpus)}: this host has {len(host.devices)} GPUs "
                 f"(set {hostmod.SIMULATE_ENV}=N to simulate N)")
    if args.check_every is None:
        args.check_every = 16 if host.backend == "cuda" and args.backend in (None, "cuda") else 1
    out = Path(args.out)
    args.cache_dir = args.cache_dir or str(out / "triton-cache")
    (out / "rows").mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    todo = rows(args.scales, args.layouts, sorted(set(args.gpus)))
    order = [row_key(*t) for t in todo]
    machine, warmups, warm = machine_info(host, args), [], set()
    for scale, layout, g in todo:
        path = out / "rows" / f"{row_key(scale, layout, g)}.json"
        if path.is_file() and not args.again:
            continue
        if args.until_s is not None and time.monotonic() - start > args.until_s:
            print(f"host_scaling: --until-s {args.until_s:g} passed; run again to resume", file=sys.stderr)
            break
        if scale not in warm:
            warmups.append(warm_up(args, host, scale))
            warm.add(scale)
        result = one_row(args, host, scale, layout, g)
        write(str(path), dumps(result))
        print(f"host_scaling: {result['row']}: {result['ops']:,} ops, {result['ops_per_s']:,.0f} ops/s, "
              f"wall {result['wall_s']:.1f} s, exit {result['exit_code']}", flush=True)
        report(out, order, machine, warmups)
    data = report(out, order, machine, warmups)
    print((out / "host-scaling.md").read_text())
    return 0 if not data["missing"] and all(r["exit_code"] in (0, 1) for r in data["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
