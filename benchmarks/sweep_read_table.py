"""Sweep the read table's launch config on a GPU, strided vs legacy, CUDA-graph replayed.

For every point of the kernel bench grid (fuzz/tools/bench_kernels.py: bs 1..512, page
size 1 and 16, a graph captured at max_pages = 128k tokens / ps and replayed at live
lengths from short to full), it times BLOCK_COLS in {128, 256, 512, 1024} x num_warps in
{1, 2, 4, 8} for the strided grid and the legacy grid, and reports per point the winning
config of each, the shipped config (512, 4) of each, and whether the tuned strided kernel
still loses to legacy. The launcher's choice may depend on (bs, max_pages) only (it must
be graph-safe), so the suggested rules pick, per (bs, max_pages), the config with the best
geometric mean over live lengths, and are printed in the form of
``kvkernels.launchers.READ_TABLE_RULES``.

Run from the repo root on a CUDA machine (about 2-3 minutes on an H200; ``--budget-s``
stops it early with what it has)::

    PYTHONPATH=. python3 benchmarks/sweep_read_table.py --out sweep-read-table.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch

from kvkernels import launchers

BLOCK_COLS = (128, 256, 512, 1024)
WARPS = (1, 2, 4, 8)
BATCHES = (1, 16, 64, 256, 512)
PAGE_SIZES = (1, 16)
MAX_CONTEXT = 131072  # tokens
LIVE = (1024, 8192, MAX_CONTEXT)
TODAY = (512, 4)


def time_replays(graph, min_ms: float = 20.0) -> float:
    """Mean µs per replay: a short probe sizes the loop to about ``min_ms``."""
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    end.synchronize()
    probe_us = max(start.elapsed_time(end) * 1000.0 / 5, 1.0)
    iters = int(min(500, max(20, min_ms * 1000.0 / probe_us)))
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / iters


def capture(bs: int, ps: int, r2t, v2p, legacy: bool, block_cols: int, num_warps: int):
    """A graph of one read-table build at full size; returns (graph, seq_lens to refresh in place)."""
    max_pages = MAX_CONTEXT // ps
    req = torch.arange(bs, device="cuda", dtype=torch.int64)
    seq = torch.full((bs,), MAX_CONTEXT, device="cuda", dtype=torch.int64)
    out = torch.zeros(bs, max_pages, device="cuda", dtype=torch.int32)

    def build():
        launchers._launch_read_table(req_to_token=r2t, req_pool_indices=req, seq_lens=seq, v2p=v2p, multiplier=1,
                                     page_size=ps, max_pages=max_pages, out=out, legacy=legacy,
                                     block_cols=block_cols, target_blocks=launchers.TARGET_BLOCKS,
                                     num_warps=num_warps)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        build()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        build()
    return graph, seq, out


def geomean(xs) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="sweep-read-table.json")
    ap.add_argument("--budget-s", type=float, default=220.0, help="stop sweeping after this long")
    ap.add_argument("--dtype", choices=("int64", "int32"), default="int64", help="req_to_token dtype (bench uses int64)")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--page-sizes", default=",".join(map(str, PAGE_SIZES)))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("sweep_read_table: needs a CUDA GPU", file=sys.stderr)
        return 2
    batches = [int(x) for x in args.batches.split(",")]
    page_sizes = [int(x) for x in args.page_sizes.split(",")]
    deadline = time.monotonic() + args.budget_s
    dtype = getattr(torch, args.dtype)
    top = max(batches)
    r2t = torch.arange(top * MAX_CONTEXT, device="cuda", dtype=torch.int64).reshape(top, MAX_CONTEXT)
    v2p = torch.randperm(MAX_CONTEXT + 1, device="cuda", dtype=torch.int64)
    rows = []  # one per (ps, bs, grid, block_cols, warps, live)
    reference = {}
    stopped = False
    for ps in page_sizes:
        tokens = (r2t % MAX_CONTEXT).to(dtype)
        for bs in batches:
            for legacy in (False, True):
                for block_cols in BLOCK_COLS:
                    for warps in WARPS:
                        if time.monotonic() > deadline:
                            stopped = True
                            break
                        graph, seq, out = capture(bs, ps, tokens, v2p, legacy, block_cols, warps)
                        for live in LIVE:
                            seq.fill_(live)
                            us = time_replays(graph)
                            rows.append({"ps": ps, "bs": bs, "grid": "legacy" if legacy else "strided",
                                         "block_cols": block_cols, "num_warps": warps, "live_tokens": live,
                                         "us": round(us, 3)})
                        key = (ps, bs)
                        if key not in reference:  # the shipped config's strided result: every config must match it
                            graph_ref, seq_ref, out_ref = capture(bs, ps, tokens, v2p, False, *TODAY)
                            seq_ref.fill_(MAX_CONTEXT)
                            graph_ref.replay()
                            reference[key] = out_ref
                        seq.fill_(MAX_CONTEXT)
                        graph.replay()
                        if not torch.equal(out, reference[key]):
                            print(f"MISMATCH: ps={ps} bs={bs} legacy={legacy} BLOCK_COLS={block_cols} "
                                  f"num_warps={warps} writes a different table", flush=True)
                            rows[-1]["mismatch"] = True
                        del graph
                    if stopped:
                        break
                if stopped:
                    break
            reference.pop((ps, bs), None)
            summarize_point(rows, ps, bs)
            if stopped:
                break
        if stopped:
            break
    report = summarize(rows)
    report["stopped_early"] = stopped
    report["env"] = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "dtype": args.dtype,
                     "target_blocks": launchers.TARGET_BLOCKS}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print("\nsuggested kvkernels.launchers.READ_TABLE_RULES (first match wins):")
    print("READ_TABLE_RULES = (")
    for rule in report["rules"]:
        print(f"    {tuple(rule)},")
    print(")")
    print(f"wrote {args.out}{' (stopped early at the budget)' if stopped else ''}")
    return 0


def _by(rows, **kw):
    return [r for r in rows if all(r[k] == v for k, v in kw.items())]


def _time(rows, ps, bs, grid, cfg, live):
    hit = _by(rows, ps=ps, bs=bs, grid=grid, block_cols=cfg[0], num_warps=cfg[1], live_tokens=live)
    return hit[0]["us"] if hit else None


def summarize_point(rows, ps, bs) -> None:
    for live in LIVE:
        line = [f"ps={ps:>2} bs={bs:>3} live={live:>6}:"]
        for grid in ("strided", "legacy"):
            pts = _by(rows, ps=ps, bs=bs, grid=grid, live_tokens=live)
            if not pts:
                continue
            best = min(pts, key=lambda r: r["us"])
            today = _time(rows, ps, bs, grid, TODAY, live)
            line.append(f"{grid} today {today} us, best {best['us']} us at ({best['block_cols']}, {best['num_warps']})")
        print("  ".join(line), flush=True)


def summarize(rows) -> dict:
    points, rules = [], []
    for ps in sorted({r["ps"] for r in rows}):
        max_pages = MAX_CONTEXT // ps
        for bs in sorted({r["bs"] for r in rows if r["ps"] == ps}):
            per_grid = {}
            for grid in ("strided", "legacy"):
                cfgs = sorted({(r["block_cols"], r["num_warps"]) for r in _by(rows, ps=ps, bs=bs, grid=grid)})
                full = [c for c in cfgs if all(_time(rows, ps, bs, grid, c, live) for live in LIVE)]
                if not full:
                    continue
                # The launcher sees (bs, max_pages), not the live length: one config for every length.
                choice = min(full, key=lambda c: geomean([_time(rows, ps, bs, grid, c, live) for live in LIVE]))
                per_grid[grid] = choice
                legacy = grid == "legacy"
                rules.append((bs, max_pages, legacy, *choice))
            for live in LIVE:
                point = {"ps": ps, "bs": bs, "max_pages": max_pages, "live_tokens": live}
                for grid in ("strided", "legacy"):
                    pts = _by(rows, ps=ps, bs=bs, grid=grid, live_tokens=live)
                    if not pts:
                        continue
                    best = min(pts, key=lambda r: r["us"])
                    point[grid] = {"today_us": _time(rows, ps, bs, grid, TODAY, live), "best_us": best["us"],
                                   "best": [best["block_cols"], best["num_warps"]]}
                    if grid in per_grid:
                        point[grid]["rule"] = list(per_grid[grid])
                        point[grid]["rule_us"] = _time(rows, ps, bs, grid, per_grid[grid], live)
                s, lg = point.get("strided"), point.get("legacy")
                if s and lg and s.get("rule_us") and lg.get("today_us"):
                    point["tuned_strided_over_legacy_today"] = round(s["rule_us"] / lg["today_us"], 3)
                    point["strided_loses"] = s["rule_us"] > lg["today_us"]
                points.append(point)
    # Rules sorted so that the narrowest shapes come first (first match wins).
    rules.sort(key=lambda r: (r[2], r[1], r[0]))
    return {"points": points, "rules": [list(r) for r in rules], "rows": rows,
            "losing_points": [p for p in points if p.get("strided_loses")]}


if __name__ == "__main__":
    sys.exit(main())
