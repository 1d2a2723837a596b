"""Where a worker's set-up goes before its first op (the first case waits for it).

A warm first case on one H200 spends about 1.3 s between a worker's fork and its first op
(``ready`` in a campaign's timeline), 1.0 s of it in the tier (``setup_tier``). This script
splits that second, in fresh processes (``--repeats``, the first one apart: it may fill
Triton's cache), in the order a worker does it:

* ``import``: torch, Triton and the engine (a fork daemon's child has these already; here for scale);
* ``device``: the CUDA context (``torch.cuda.init`` and a first tensor), alone;
* ``kernels``: importing the kernel set (its ``@triton.jit`` decorations);
* ``smoke``: each of the smoke test's four first launches (a JIT binder, a cache lookup, a
  module load each);
* ``tier``: the whole ``make_tier`` again in a process of its own (what a worker pays);
* ``overlap``: ``make_tier`` with the context started on a thread first: whether the two overlap;
* ``launch`` (``--modes launch``): a cProfile of the first launch, printed to stderr.

    PYTHONPATH=. python3 benchmarks/profile_ready.py --backend cuda --out ready.json
    TRITON_INTERPRET=1 PYTHONPATH=. python3 benchmarks/profile_ready.py --backend interpret   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, threading, time
t0 = time.perf_counter()
marks = {}
def mark(name, since):
    marks[name] = round(time.perf_counter() - since, 4)
    return time.perf_counter()
import torch, triton  # noqa: E401
from fuzz.engine import tiers, worker  # noqa: F401
t = mark("import", t0)
backend, kernels, mode = sys.argv[1], sys.argv[2], sys.argv[3]
device = "cuda" if backend == "cuda" else "cpu"
tiers.select_backend(backend)
if mode == "parts":
    if backend == "cuda":
        torch.cuda.init()
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
    t = mark("device", t)
    module = tiers.load_kernels(kernels)
    t = mark("kernels", t)
    for name, call in tiers.smoke_calls(module, device):
        call()
        if backend == "cuda":
            torch.cuda.synchronize()
        t = mark("smoke_" + name, t)
elif mode == "launch":  # cProfile of the first launch (after the context): what it spends its time in
    import cProfile, io, pstats  # noqa: E401
    if backend == "cuda":
        torch.zeros(1, device="cuda")
    module = tiers.load_kernels(kernels)
    first = tiers.smoke_calls(module, device)[0][1]  # alloc_bind
    loaded = set(sys.modules)
    prof = cProfile.Profile()
    prof.enable()
    first()
    prof.disable()
    t = mark("first_launch", t)
    new = sorted(set(sys.modules) - loaded)
    print(f"{len(new)} modules imported by the first launch:", " ".join(new)[:3000], file=sys.stderr)
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(30)
    print(text.getvalue()[-6000:], file=sys.stderr)
elif mode == "tier":
    tiers.make_tier(backend, kernels)
    t = mark("tier", t)
else:  # overlap: the context on a thread while the kernel set imports
    th = None
    if backend == "cuda":
        th = threading.Thread(target=lambda: (torch.cuda.init(), torch.zeros(1, device="cuda")))
        th.start()
    module = tiers.load_kernels(kernels)
    if th is not None:
        th.join()
    tiers.make_tier(backend, kernels)
    t = mark("overlap_tier", t)
print(json.dumps(marks))
"""


def _run(backend: str, kernels: str, mode: str) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, backend, kernels, mode], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    if r.returncode:
        raise SystemExit(f"profile_ready.py: the child failed:\n{r.stderr[-2000:]}")
    if mode == "launch":
        print(r.stderr, file=sys.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("cuda", "interpret"), default="cuda")
    ap.add_argument("--kernels", default="kvkernels")
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--out", default=None)
    ap.add_argument("--modes", default="parts,tier,overlap", help="also: launch (cProfile of the first launch, to stderr)")
    args = ap.parse_args(argv)
    report = {"backend": args.backend, "kernels": args.kernels, "runs": {}}
    for mode in args.modes.split(","):
        runs = [_run(args.backend, args.kernels, mode) for _ in range(args.repeats)]
        rest = runs[1:] or runs
        report["runs"][mode] = {"first": runs[0],
                                "median": {k: round(statistics.median(r[k] for r in rest), 4) for k in rest[0]}}
        print(mode, "first", runs[0], "median of the rest", report["runs"][mode]["median"], flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
