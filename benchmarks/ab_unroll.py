"""A/B of the strided read table's loop: one column block per trip vs two (UNROLL=2,
both gathered before either is stored), against the legacy grid, graph-replayed on a GPU.

    PYTHONPATH=. python3 benchmarks/ab_unroll.py --out ab-unroll.json
"""

from __future__ import annotations

import argparse
import functools
import json

import torch

from benchmarks.sweep_read_table import MAX_CONTEXT, time_replays
from kvkernels import launchers


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="ab-unroll.json")
    args = ap.parse_args()
    rows = []
    for ps in (1, 16):
        max_pages = MAX_CONTEXT // ps
        v2p = torch.arange(max_pages + 2, device="cuda", dtype=torch.int64)
        for bs in (16, 64, 256, 512):
            r2t = torch.arange(bs * MAX_CONTEXT, device="cuda", dtype=torch.int64).reshape(bs, MAX_CONTEXT) % max_pages
            req = torch.arange(bs, device="cuda", dtype=torch.int64)
            seq = torch.full((bs,), MAX_CONTEXT, device="cuda", dtype=torch.int64)
            out = torch.zeros(bs, max_pages, device="cuda", dtype=torch.int32)
            configs = {"legacy (512, 4)": dict(legacy=True, block_cols=512, num_warps=4, unroll=1)}
            tuned = launchers.read_table_launch(bs, max_pages)
            for unroll in (1, 2):
                configs[f"strided {tuned} x{unroll}"] = dict(legacy=False, block_cols=tuned[0], num_warps=tuned[1],
                                                             unroll=unroll)
            graphs, results = {}, {}
            shared = dict(req_to_token=r2t, req_pool_indices=req, seq_lens=seq, v2p=v2p, multiplier=1, page_size=ps,
                          max_pages=max_pages, out=out, target_blocks=launchers.TARGET_BLOCKS)
            for name, cfg in configs.items():
                build = functools.partial(launchers._launch_read_table, **shared, **cfg)
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    build()
                torch.cuda.current_stream().wait_stream(s)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    build()
                graphs[name] = g
                out.zero_()
                g.replay()
                results[name] = out.clone()
            same = all(torch.equal(results[n], results["legacy (512, 4)"]) for n in results)
            for live in (1024, 8192, MAX_CONTEXT):
                seq.fill_(live)
                row = {"ps": ps, "bs": bs, "live": live, "same_output": same}
                for name, g in graphs.items():
                    row[name] = round(time_replays(g), 3)
                rows.append(row)
                print(row, flush=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
