"""Time the vectorized oracle (fuzz/engine/vector_oracle.py) at production shapes on a GPU.

Why: the GPU fuzz loop checks every kernel-level op against this oracle, so its cost per
read-table element bounds the loop's rate. For bs 64/256/512 x max_pages 2k/16k x ps 1/16
on a 2^20-page pool it times the oracle's read_table (without and with its SPEC §2 flags,
``oracle_clauses_us``: how the fuzz loop calls it) and first_mismatch (equal path,
against a copy) with CUDA events after warm-up, and reports elements checked per second
and the modelled bytes per second against the device's bandwidth. Along the way it
spot-checks oracle rows against kvref, checks that first_mismatch finds a planted
difference, runs every oracle op once under ``torch.cuda.set_sync_debug_mode("error")``,
and times the oracle's read_table replayed from a CUDA graph (capture also proves it
never syncs), which shows how much of its time is launch overhead.

Run from the repo root: ``python benchmarks/vector_oracle_gpu.py --out vector-oracle-h200.json``.
On a CPU (a smoke test of the script only): ``--device cpu --small``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fuzz.engine import vector_oracle as vo  # noqa: E402
from kvref import kernels as ref  # noqa: E402

POISON = 0x7A7A7A7A


def make_timer(device: torch.device):
    """``timer(fn, iters) -> µs per call``: CUDA events on a GPU, perf_counter on the CPU."""

    def timer(fn, iters: int) -> float:
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1000.0 / iters
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) * 1e6 / iters

    return timer


def bench(timer, fn, *, warmup: int = 2, budget_s: float = 0.25) -> float:
    for _ in range(warmup):
        fn()
    probe = timer(fn, 1)
    iters = int(min(50, max(3, budget_s * 1e6 / max(probe, 1.0))))
    return timer(fn, iters)


def graph_us(timer, fn) -> float | str:
    """µs per replay of ``fn`` captured in a CUDA graph (launch overhead gone); a capture error as text."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return round(bench(timer, graph.replay), 1)
    except RuntimeError as e:  # a host sync or an uncapturable op inside fn
        return f"capture failed: {e}".splitlines()[0]


def make_pool(num_pages: int, device, gen) -> tuple[torch.Tensor, torch.Tensor]:
    """v2p/p2v of a pool with every page bound at random, 10% of the virtual pages tombstoned."""
    v2p = torch.full((num_pages + 1,), -1, dtype=torch.int64, device=device)
    p2v = torch.full((num_pages + 1,), -1, dtype=torch.int64, device=device)
    v = torch.arange(1, num_pages, device=device)
    p = torch.randperm(num_pages - 1, device=device, generator=gen) + 1
    v2p[v] = p
    p2v[p] = v
    v2p[0] = p2v[0] = 0
    tomb = torch.rand(num_pages + 1, device=device, generator=gen) < 0.1
    tomb[0] = False
    v2p.masked_fill_(tomb, -1)  # a lazily freed page: p2v keeps no row for it either
    p2v.masked_fill_(tomb[p2v.clamp(min=0)] & (p2v > 0), -1)
    return v2p, p2v


def make_requests(n_req: int, max_pages: int, ps: int, num_pages: int, device, gen):
    """req_to_token [n_req, max_pages * ps] int32: whole pages of tokens, -1 past each row's length."""
    width = max_pages * ps
    pages = torch.randint(1, num_pages, (n_req, max_pages), device=device, generator=gen, dtype=torch.int32)
    r2t = (pages.unsqueeze(-1) * ps + torch.arange(ps, device=device, dtype=torch.int32)).reshape(n_req, width)
    lens = torch.randint(1, width + 1, (n_req,), device=device, generator=gen, dtype=torch.int32)
    r2t.masked_fill_(torch.arange(width, device=device).unsqueeze(0) >= lens.unsqueeze(1), -1)
    return r2t, lens


def spot_check(r2t, req, seq, v2p_list, out, *, multiplier, ps, max_pages, rows_to_check) -> bool:
    """kvref on a few whole rows of the batch must agree with the oracle's rows."""
    for b in rows_to_check:
        r = int(req[b])
        expected = [[POISON] * max_pages]
        ref.read_table(req_to_token=[r2t[r].tolist()], req_pool_indices=[0], seq_lens=[int(seq[b])], v2p=v2p_list,
                       multiplier=multiplier, page_size=ps, max_pages=max_pages, out=expected)
        if out[b, :max_pages].tolist() != expected[0]:
            return False
    return True


def read_table_rows(args, device, timer, gen):
    rows = []
    num_pages = args.pool_pages
    v2p, _ = make_pool(num_pages, device, gen)
    v2p_list = v2p.tolist()
    for max_pages in args.max_pages:
        for ps in args.page_sizes:
            n_req = max(args.bs)
            r2t, lens = make_requests(n_req, max_pages, ps, num_pages, device, gen)
            multiplier = 64 if ps == 1 else 1
            for bs in args.bs:
                req = torch.randperm(n_req, device=device, generator=gen)[:bs]
                seq = lens[req]
                out = torch.full((bs, max_pages), POISON, dtype=torch.int32, device=device)

                def oracle(out=out, req=req, seq=seq, ps=ps, max_pages=max_pages, multiplier=multiplier, r2t=r2t):
                    vo.read_table(req_to_token=r2t, req_pool_indices=req, seq_lens=seq, v2p=v2p,
                                  multiplier=multiplier, page_size=ps, max_pages=max_pages, out=out)

                def checked(out=out, req=req, seq=seq, ps=ps, max_pages=max_pages, multiplier=multiplier, r2t=r2t):
                    vo.read_table(req_to_token=r2t, req_pool_indices=req, seq_lens=seq, v2p=v2p,
                                  multiplier=multiplier, page_size=ps, max_pages=max_pages, out=out, clauses=[])

                oracle()
                copy = out.clone()
                oracle_us = bench(timer, oracle)
                clauses_us = bench(timer, checked)  # with SPEC §2's flags, as the fuzz loop calls it
                oracle_graph_us = graph_us(timer, oracle) if device.type == "cuda" else "n/a (cpu)"
                compare_us = bench(timer, lambda out=out, copy=copy: vo.first_mismatch(out, copy))
                total_us = bench(timer, lambda oracle=oracle, out=out, copy=copy: (oracle(), vo.first_mismatch(out, copy)))

                # A planted difference is found, with its index and both values.
                b, c = bs - 1, max_pages // 2
                copy[b, c] += 1
                found = vo.first_mismatch(out, copy)
                mismatch_ok = found is not None and found[0] == (b, c) and found[2] == found[1] + 1
                copy[b, c] -= 1

                ok = spot_check(r2t, req.tolist(), seq.tolist(), v2p_list, out, multiplier=multiplier, ps=ps,
                                max_pages=max_pages, rows_to_check=sorted({0, bs - 1}))
                elements = bs * max_pages
                model = vo.read_table_bytes(bs=bs, max_pages=max_pages, page_size=ps, v2p_rows=num_pages + 1)
                model_total = model + 8 * elements  # first_mismatch reads both int32 tensors
                rows.append(dict(
                    bs=bs, max_pages=max_pages, page_size=ps, pool_pages=num_pages, elements=elements,
                    oracle_us=round(oracle_us, 1), oracle_clauses_us=round(clauses_us, 1), oracle_graph_us=oracle_graph_us, compare_us=round(compare_us, 1), total_us=round(total_us, 1),
                    elements_per_s=elements / (total_us * 1e-6),
                    model_bytes=model_total, model_bytes_per_s=model_total / (total_us * 1e-6),
                    frac_of_peak=model_total / (total_us * 1e-6) / (args.peak_tbps * 1e12),
                    oracle_model_bytes_per_s=model / (oracle_us * 1e-6),
                    spot_check_vs_kvref=ok, planted_mismatch_found=mismatch_ok,
                ))
            del r2t, lens
    return rows


def other_ops(args, device, timer, gen):
    """bind / alloc_bind / free_unbind / translate / packed at fuzz batch sizes, timed and sync-checked."""
    num_pages, n_ids = args.pool_pages, args.ids
    v2p, p2v = make_pool(num_pages, device, gen)
    v = torch.randperm(num_pages - 2, device=device, generator=gen)[:n_ids] + 1
    p = torch.randperm(num_pages - 2, device=device, generator=gen)[:n_ids] + 1
    loc = torch.randint(-1, num_pages * 16, (n_ids,), device=device, generator=gen)
    bs, max_tokens = args.packed_bs, args.packed_max_tokens
    r2t, _ = make_requests(bs, max_tokens // 16, 16, num_pages, device, gen)
    seq = torch.randint(0, max_tokens + 1, (bs,), device=device, generator=gen)
    indptr = torch.zeros(bs + 1, dtype=torch.int64, device=device)
    indptr[1:] = torch.cumsum(seq, 0)
    packed_out = torch.full((bs * max_tokens,), POISON, dtype=torch.int32, device=device)
    req = torch.arange(bs, device=device)
    ops = {
        f"bind x{n_ids}": lambda: vo.bind(v2p, p2v, v, p),
        f"alloc_bind x{n_ids}": lambda: vo.alloc_bind(v2p, p2v, v, 1),
        f"free_unbind x{n_ids}": lambda: vo.free_unbind(v2p, p2v, v),
        f"translate x{n_ids} (ps 16)": lambda: vo.translate(loc=loc, v2p=v2p, page_size=16),
        f"read_table_packed bs {bs}, <= {max_tokens} tokens (ps 16)": lambda: vo.read_table_packed(
            req_to_token=r2t, req_pool_indices=req, seq_lens=seq, v2p=v2p, indptr=indptr, multiplier=1,
            page_size=16, max_tokens=max_tokens, out=packed_out, kv_start_idx=None),
    }
    results = []
    for name, fn in ops.items():
        sync = "n/a (cpu)"
        if device.type == "cuda":
            fn()
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                fn()
                sync = "none"
            except RuntimeError as e:
                sync = f"SYNC: {e}".splitlines()[0]
            finally:
                torch.cuda.set_sync_debug_mode(0)
        results.append(dict(op=name, us=round(bench(timer, fn), 1), host_sync=sync))
    return results


def read_table_sync_check(device, gen) -> str:
    if device.type != "cuda":
        return "n/a (cpu)"
    v2p, _ = make_pool(4096, device, gen)
    r2t, lens = make_requests(8, 64, 16, 4096, device, gen)
    out = torch.full((8, 64), POISON, dtype=torch.int32, device=device)
    args = dict(req_to_token=r2t, req_pool_indices=torch.arange(8, device=device), seq_lens=lens, v2p=v2p,
                multiplier=1, page_size=16, max_pages=64, out=out)
    vo.read_table(**args)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        vo.read_table(**args)
        return "none"
    except RuntimeError as e:
        return f"SYNC: {e}".splitlines()[0]
    finally:
        torch.cuda.set_sync_debug_mode(0)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="tiny shapes (a CPU smoke test of this script)")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--peak-tbps", type=float, default=4.8, help="device bandwidth, TB/s (H200: 4.8)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu --small", file=sys.stderr)
        return 2
    if args.small:
        args.pool_pages, args.bs, args.max_pages, args.page_sizes = 4096, [4, 8], [64, 256], [1, 16]
        args.ids, args.packed_bs, args.packed_max_tokens = 512, 4, 1024
    else:
        args.pool_pages, args.bs, args.max_pages, args.page_sizes = 2**20, [64, 256, 512], [2048, 16384], [1, 16]
        args.ids, args.packed_bs, args.packed_max_tokens = 65536, 64, 8192
    gen = torch.Generator(device=device).manual_seed(args.seed)
    timer = make_timer(device)
    t0 = time.perf_counter()

    rows = read_table_rows(args, device, timer, gen)
    others = other_ops(args, device, timer, gen)
    sync = read_table_sync_check(device, gen)
    elapsed = time.perf_counter() - t0

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"vector oracle on {name} (torch {torch.__version__}), pool {args.pool_pages} pages, "
          f"peak {args.peak_tbps} TB/s; read_table host sync: {sync}")
    print(f"{'bs':>4} {'max_pages':>9} {'ps':>3} {'oracle us':>10} {'graph us':>9} {'compare us':>10} {'total us':>9} "
          f"{'Melem/s':>9} {'model GB/s':>10} {'% peak':>7} {'kvref':>6} {'plant':>6}")
    for r in rows:
        graph = r["oracle_graph_us"] if isinstance(r["oracle_graph_us"], float) else "-"
        print(f"{r['bs']:>4} {r['max_pages']:>9} {r['page_size']:>3} {r['oracle_us']:>10.1f} {graph:>9} {r['compare_us']:>10.1f} "
              f"{r['total_us']:>9.1f} {r['elements_per_s'] / 1e6:>9.1f} {r['model_bytes_per_s'] / 1e9:>10.1f} "
              f"{100 * r['frac_of_peak']:>6.1f}% {'ok' if r['spot_check_vs_kvref'] else 'DIFF':>6} "
              f"{'ok' if r['planted_mismatch_found'] else 'MISS':>6}")
    for o in others:
        print(f"{o['op']:<52} {o['us']:>10.1f} us   host sync: {o['host_sync']}")
    print(f"done in {elapsed:.1f} s")

    report = dict(device=name, torch=torch.__version__, peak_tbps=args.peak_tbps, small=args.small, seed=args.seed,
                  bytes_per_element_model="fuzz.engine.vector_oracle.read_table_bytes (+8 B for first_mismatch)",
                  read_table=rows, other_ops=others, read_table_host_sync=sync, elapsed_s=round(elapsed, 2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    bad = [r for r in rows if not (r["spot_check_vs_kvref"] and r["planted_mismatch_found"])]
    syncs = [o for o in others if o["host_sync"].startswith("SYNC")] + ([sync] if sync.startswith("SYNC") else [])
    return 1 if bad or syncs else 0


if __name__ == "__main__":
    sys.exit(main())
