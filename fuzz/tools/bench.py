"""``kvfuzz bench``: diffed ops per second per tier, and on a GPU the kernel benchmarks.

Each tier runs in its own process (``kvfuzz run --json``), because the interpreter
tier must set TRITON_INTERPRET=1 before Triton is imported and the CUDA tier must not.
Speed targets live here, never in timed tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from ..environment import environment


def _tier_rate(backend: str, seconds: float) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "fuzz", "run", "--backend", backend, "--budget-s", str(seconds),
               "--out", out, "--json", "--seed", "1"]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    try:
        data = json.loads(last)
    except json.JSONDecodeError:
        return {"backend": backend, "error": (proc.stderr or proc.stdout)[-400:], "exit": proc.returncode}
    return {"backend": backend, "ops": data["ops"], "ops_per_s": round(data["ops_per_s"], 1),
            "steady_ops_per_s": data.get("steady_ops_per_s"), "sequences": data["sequences"],
            "failures": len(data["failures"]), "seconds": seconds}


def main(seconds: float = 10.0, tiers: list[str] | None = None, out: str | None = None,
         plot: str | None = None) -> int:
    """``plot``: also draw the report as an SVG there (needs the ``plots`` extra; checked
    before any benchmark runs, so a missing matplotlib costs no benchmark time)."""
    if plot:
        from .plots import require_matplotlib

        require_matplotlib()
    import torch

    has_cuda = torch.cuda.is_available()
    chosen = list(tiers) if tiers else (["torch", "cuda"] if has_cuda else ["torch", "interpret"])
    report = {"environment": environment(), "fuzz": [], "kernels": None}
    for backend in chosen:
        row = _tier_rate(backend.strip(), seconds)
        report["fuzz"].append(row)
        if "error" in row:
            print(f"{backend:>10}: failed (exit {row['exit']}): {row['error']}")
        else:
            steady = f", {row['steady_ops_per_s']:.0f} after warm-up" if row.get("steady_ops_per_s") else ""
            print(f"{backend:>10}: {row['ops_per_s']:>9.1f} diffed ops/s{steady}  ({row['ops']} ops, "
                  f"{row['sequences']} sequences, {row['failures']} failures, {seconds:.0f} s)")
    if has_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        from .bench_kernels import run_all

        report["kernels"] = run_all(print_fn=print)
    if out:
        with open(out, "w") as f:
            json.dump(report, f, indent=1)
        print(f"results written to {out}")
    if plot:
        from .plots import plot_bench

        print(f"plot written to {plot_bench(report, plot)}")
    return 1 if any("error" in row for row in report["fuzz"]) else 0
