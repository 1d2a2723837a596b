"""Sweep TARGET_BLOCKS for the strided read table on a GPU (CUDA graph, captured at full size).

Run from the repo root on a CUDA machine: ``PYTHONPATH=. python3 benchmarks/sweep_target_blocks.py``.
The H200 figures are in benchmarks/results/sweep-target-blocks-h200/sweep-target-blocks.log.
"""

import argparse

import torch

import kvkernels
from fuzz.tools.bench_kernels import _time_us
from kvkernels import launchers

MAX_CONTEXT = 131072  # tokens, page size 1
DEV = "cuda"


def graph_for(bs: int, r2t, v2p):
    req = torch.arange(bs, device=DEV)
    seq = torch.full((bs,), MAX_CONTEXT, device=DEV)
    out = torch.zeros(bs, MAX_CONTEXT, device=DEV, dtype=torch.int32)

    def build():
        kvkernels.build_kv_read_table(req_to_token=r2t, req_pool_indices=req, seq_lens=seq, v2p=v2p, multiplier=1,
                                      page_size=1, max_pages=MAX_CONTEXT, out=out)
    build()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        build()
    return graph, seq


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    r2t = torch.arange(256 * MAX_CONTEXT, device=DEV, dtype=torch.int64).reshape(256, MAX_CONTEXT) % MAX_CONTEXT
    v2p = torch.randperm(MAX_CONTEXT + 1, device=DEV, dtype=torch.int64)
    for target in (1024, 2048, 4096, 8192):
        launchers.TARGET_BLOCKS = target
        for bs in (16, 64, 256):
            graph, seq = graph_for(bs, r2t, v2p)
            times = []
            for live in (1024, 8192, MAX_CONTEXT):
                seq.fill_(live)
                times.append(round(_time_us(graph.replay), 2))
            print(f"TARGET_BLOCKS={target} bs={bs}: live 1k/8k/128k = {times} us", flush=True)


if __name__ == "__main__":
    main()
