"""Campaigns on kernel sets that fault the GPU: the exit code of each, and what its cases say.

A repeatable measurement: a kernel set whose free stores at an illegal address
(``segfault.py``) and one whose free trips a device-side assert (``device_assert.py``), each
fuzzed by ``--campaigns`` one-worker campaigns (seeds 21, 22, ...). A CUDA fault must be a
case, never kvfuzz's own error: every campaign exits 1 (never 3), every case replays with exit
1, and a 1-op case is rated n/n (``reproduced``, with ``unknown`` for replays that could not
run). Per campaign: exit code, seconds, each case's signature, ops, rate and replay exit code.
Written as JSON to ``--out`` (default ``$OUT``, else ``faults-gpu/``): ``faults-gpu.json``.

GPU (from the repo root)::

    PYTHONPATH=. python3 benchmarks/faults_gpu.py --campaigns 10 --budget-s 30

CPU dry run (the interpreter's twin of an asynchronous fault, ``async_fault.py``; one short
campaign; about a minute on a loaded 2-core machine)::

    PYTHONPATH=. python3 benchmarks/faults_gpu.py --dry-run --out /tmp/faults-cpu
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOREIGN = ROOT / "tests" / "fixtures" / "kernels" / "foreign"
GPU_SETS = ("segfault.py", "device_assert.py")
CPU_SETS = ("async_fault.py",)


def kvfuzz(*args, timeout: float, env: dict | None = None) -> tuple[subprocess.CompletedProcess | None, float]:
    start = time.monotonic()
    try:
        r = subprocess.run([sys.executable, "-m", "fuzz", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                           timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        r = None
    return r, time.monotonic() - start


def campaign(kernels: Path, backend: str, seed: int, budget: float, out: Path, env: dict,
             extra: tuple[str, ...] = ()) -> dict:
    """One campaign and a replay of each of its cases."""
    cases_dir, summary = out / f"cases-{kernels.stem}-{seed}", out / f"summary-{kernels.stem}-{seed}.json"
    r, took = kvfuzz("run", "--backend", backend, "--kernels", kernels, "--budget-s", budget, "--workers", 1,
                     "--seed", seed, "--out", cases_dir, "--summary", summary, *extra, timeout=budget + 600, env=env)
    res = {"seed": seed, "exit": None if r is None else r.returncode, "seconds": round(took, 1), "cases": []}
    if r is None:
        res["error"] = "timed out"
        return res
    if r.returncode not in (0, 1):
        res["stderr_tail"] = r.stderr[-3000:]
    if not summary.exists():
        return res
    data = json.loads(summary.read_text())
    res["harness_errors"] = len(data.get("harness_errors") or [])
    for f in data.get("failures", []):
        rp, rtook = kvfuzz("replay", f["case"], timeout=600, env=env)
        res["cases"].append({"signature": f["signature"], "ops": f.get("minimized_ops"),
                             "original_ops": f.get("original_ops"), "reproduced": f.get("reproduced"),
                             "flaky": f.get("flaky"), "replay_exit": None if rp is None else rp.returncode,
                             "replay_s": round(rtook, 1), "case": f["case"]})
    return res


def judge(results: list[dict]) -> dict:
    """What the issue asks of these runs, as booleans over every campaign of a set."""
    cases = [c for r in results for c in r["cases"]]
    one_op = [c for c in cases if c["ops"] == 1]
    return {"campaigns": len(results),
            "all_exit_1": all(r["exit"] == 1 for r in results),
            "any_exit_3": any(r["exit"] == 3 for r in results),
            "every_case_replays_exit_1": bool(cases) and all(c["replay_exit"] == 1 for c in cases),
            "one_op_cases": len(one_op),
            "one_op_cases_n_of_n": all((c["reproduced"] or {}).get("k") == (c["reproduced"] or {}).get("n")
                                       and (c["reproduced"] or {}).get("n") for c in one_op),
            "unknown_replays": sum((c["reproduced"] or {}).get("unknown", 0) for c in cases)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--campaigns", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=30.0)
    ap.add_argument("--out", default=os.environ.get("OUT") or "faults-gpu")
    ap.add_argument("--dry-run", action="store_true", help="the CPU: interpreter, async_fault.py, one campaign")
    ap.add_argument("--sets", nargs="*", help=f"the kernel sets (default: {', '.join(GPU_SETS)})")
    ap.add_argument("--parallel", type=int, default=1, help="campaigns run side by side (one GPU shared)")
    ap.add_argument("--run-arg", action="append", default=[], help="one more argument for kvfuzz run (repeatable)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    backend, sets = ("interpret", CPU_SETS) if args.dry_run else ("cuda", tuple(args.sets or GPU_SETS))
    campaigns, budget = (1, min(args.budget_s, 15.0)) if args.dry_run else (args.campaigns, args.budget_s)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if args.dry_run:
        env["TRITON_INTERPRET"] = "1"
    report = {"backend": backend, "budget_s": budget, "sets": {}}
    for name in sets:
        with ThreadPoolExecutor(max(1, args.parallel)) as pool:  # each campaign is a subprocess of its own
            results = list(pool.map(lambda i, kernels=FOREIGN / name: campaign(
                kernels, backend, 21 + i, budget, out, env, tuple(args.run_arg)), range(campaigns)))
        report["sets"][name] = {"verdict": judge(results), "campaigns": results}
        print(f"{name}: exits {[r['exit'] for r in results]} {report['sets'][name]['verdict']}", flush=True)
        (out / "faults-gpu.json").write_text(json.dumps(report, indent=1) + "\n")  # after each set: a cut run keeps it
    ok = all(s["verdict"]["all_exit_1"] and s["verdict"]["every_case_replays_exit_1"]
             and s["verdict"]["one_op_cases_n_of_n"] for s in report["sets"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
