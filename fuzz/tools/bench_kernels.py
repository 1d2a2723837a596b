"""GPU kernel benchmarks (DESIGN.md, Performance), run by ``kvfuzz bench`` on a GPU.

1. The read table built inside a CUDA graph captured at the largest size and replayed
   at shorter live lengths: the bs-sized strided grid against the legacy grid, with the
   DRAM bandwidth it reaches against the device's peak.
2. The lazy free: one fused launch (+ the two ``cat`` of the free path) against the
   unfused gather + two ``index_fill_`` + two ``cat``.
Times are CUDA-event means over many replays/calls; bandwidth counts the DRAM bytes the
live prefix must move (req_to_token read and out write per row, v2p once).
"""

from __future__ import annotations

import torch

import kvkernels


def _time_us(fn, iters: int = 200, warmup: int = 20) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / iters


def peak_bandwidth_gbs() -> float | None:
    try:
        props = torch.cuda.get_device_properties(0)
        clock_khz = getattr(props, "memory_clock_rate", None)
        bus = getattr(props, "memory_bus_width", None)
        if clock_khz and bus:
            return 2 * clock_khz * 1e3 * bus / 8 / 1e9
    except Exception:  # noqa: BLE001 - an optional figure
        pass
    return None


def bench_read_table(max_bs=256, max_context=131072, page_size=1, print_fn=print) -> list[dict]:
    dev = "cuda"
    max_pages = max_context // page_size
    peak = peak_bandwidth_gbs()
    rows = []
    r2t = torch.arange(max_bs * max_context, device=dev, dtype=torch.int64).reshape(max_bs, max_context)
    r2t %= max_pages * page_size
    v2p = torch.randperm(max_pages + 1, device=dev, dtype=torch.int64)
    for bs in (1, 16, 64, max_bs):
        req = torch.arange(bs, device=dev, dtype=torch.int64)
        seq = torch.full((bs,), max_context, device=dev, dtype=torch.int64)
        for name, fn in (("strided", kvkernels.build_kv_read_table), ("legacy", kvkernels.build_kv_read_table_legacy)):
            out = torch.zeros(bs, max_pages, device=dev, dtype=torch.int32)

            def build(fn=fn, out=out, req=req, seq=seq):
                fn(req_to_token=r2t, req_pool_indices=req, seq_lens=seq, v2p=v2p, multiplier=1,
                   page_size=page_size, max_pages=max_pages, out=out)
            build()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                build()
            for live in (1024, 8192, max_context):
                seq.fill_(live)
                us = _time_us(graph.replay)
                pages = live // page_size
                # DRAM bytes: each row's req_to_token entries (8 B) and out entries (4 B); the
                # v2p rows once (8 B each: the batch rows share pages here, so L2 serves repeats).
                gbs = (bs * pages * (8 + 4) + pages * 8) / (us * 1e-6) / 1e9
                rows.append({"bs": bs, "live_tokens": live, "grid": name, "us": round(us, 2), "GB_s": round(gbs, 1),
                             "pct_peak": round(100 * gbs / peak, 1) if peak else None})
            del graph
    by_key = {(r["bs"], r["live_tokens"], r["grid"]): r for r in rows}
    for r in rows:
        if r["grid"] == "strided":
            legacy = by_key[(r["bs"], r["live_tokens"], "legacy")]
            r["legacy_over_strided"] = round(legacy["us"] / r["us"], 2)
            print_fn(f"read table bs={r['bs']:>3} live={r['live_tokens']:>6}: strided {r['us']:8.2f} us "
                     f"({r['GB_s']:7.1f} GB/s, {r['pct_peak']}% of peak)  legacy {legacy['us']:8.2f} us  "
                     f"legacy/strided x{r['legacy_over_strided']}")
    return rows


def bench_free(num_pages=1 << 20, print_fn=print) -> list[dict]:
    dev = "cuda"
    rows = []
    v2p = torch.full((num_pages + 1,), -1, device=dev, dtype=torch.int64)
    p2v = torch.full((num_pages + 1,), -1, device=dev, dtype=torch.int64)
    free_list = torch.empty(0, device=dev, dtype=torch.int64)
    holes = torch.empty(0, device=dev, dtype=torch.int64)
    for n in (64, 1024, 16384):
        v = torch.randperm(num_pages - 1, device=dev)[:n] + 1
        p = torch.randperm(num_pages - 1, device=dev)[:n] + 1

        def rebind(v=v, p=p):
            kvkernels.bind_inplace(v, p, v2p, p2v)

        def fused(v=v, rebind=rebind):
            rebind()
            phys = kvkernels.free_unbind_inplace(v, v2p, p2v)
            torch.cat((free_list, v))
            torch.cat((holes, phys))

        def unfused(v=v, rebind=rebind):
            rebind()
            phys = v2p[v]
            v2p.index_fill_(0, v, -1)
            p2v.index_fill_(0, phys, -1)
            torch.cat((free_list, v))
            torch.cat((holes, phys))

        base = _time_us(rebind)
        f, u = _time_us(fused) - base, _time_us(unfused) - base
        rows.append({"pages": n, "fused_us": round(f, 2), "unfused_us": round(u, 2), "unfused_over_fused": round(u / f, 2)})
        print_fn(f"lazy free {n:>6} pages: fused {f:7.2f} us  unfused {u:7.2f} us  x{u / f:.2f} "
                 f"(bind {base:.2f} us subtracted)")
    return rows


def run_all(print_fn=print) -> dict:
    return {"device": torch.cuda.get_device_name(0), "peak_GB_s": peak_bandwidth_gbs(),
            "read_table": bench_read_table(print_fn=print_fn), "free": bench_free(print_fn=print_fn)}
