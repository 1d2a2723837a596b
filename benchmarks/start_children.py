"""What a child costs to start, forked from ``zygote``'s preloaded server or spawned.

Two parts, each printed and written as JSON (``--out``):

* ``children``: ``--children`` supervised children per start method, one after another, each
  importing torch, Triton and numpy at its entry (what every kvfuzz child needs before its
  kernel set): seconds from ``Child(...)`` in the parent to the entry having imported them,
  the first child apart (it starts the server) from the median of the rest, and the CPU
  seconds the child itself spent to get there (``os.times`` at the entry: a forked child
  does not count the server's imports, a spawned one counts its whole start-up);
* ``campaign``: ``kvfuzz run --backend interpret --max-sequences N`` on a faulty fixture per
  start method: seconds from process start to the first case file written, the whole run's
  wall, and its CPU seconds (user + sys of the CLI and every descendant it reaped: the fork
  servers are stopped, and so reaped, before the CLI exits).

    .venv/bin/python -m benchmarks.start_children --out benchmarks/results/FILE.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
METHODS = ("spawn", "forkserver")


def _ready(beat, out):  # runs in the child
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import triton  # noqa: F401
    import triton.language  # noqa: F401

    t = os.times()
    Path(out).write_text(json.dumps({"at": time.monotonic(), "cpu": t.user + t.system}))


def children(method: str, n: int) -> dict:
    from fuzz.engine import supervise

    os.environ["KVFUZZ_START_METHOD"] = method
    starts, cpus = [], []
    with tempfile.TemporaryDirectory() as root:
        for i in range(n):
            out = Path(root) / f"{i}.json"
            t0 = time.monotonic()
            child = supervise.Child("benchmarks.start_children:_ready", (str(out),), log_dir=Path(root))
            child.proc.join(timeout=600)
            got = json.loads(out.read_text())
            child.close()
            starts.append(got["at"] - t0)
            cpus.append(got["cpu"])
    return {"part": "children", "method": method, "n": n, "first_s": round(starts[0], 3),
            "median_rest_s": round(statistics.median(starts[1:]), 3) if n > 1 else None,
            "child_cpu_median_s": round(statistics.median(cpus), 3), "load": round(os.getloadavg()[0], 1)}


def campaign(method: str, fixture: str, sequences: int) -> dict:
    with tempfile.TemporaryDirectory() as root:
        out = Path(root) / "cases"
        env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "KVFUZZ_BACKEND", "KVFUZZ_KERNELS")}
        env["KVFUZZ_START_METHOD"] = method
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "fuzz", "run", "--backend", "interpret", "--kernels", fixture,
                                 "--max-sequences", str(sequences), "--budget-s", "600", "--out", str(out)],
                                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        first = None
        while proc.poll() is None:
            if first is None and out.is_dir() and any(p.suffix == ".json" for p in out.iterdir()):
                first = time.monotonic() - t0
            time.sleep(0.05)
        wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cases = sorted(p.name for p in out.glob("*.json")) if out.is_dir() else []
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"part": "campaign", "method": method, "fixture": fixture, "max_sequences": sequences,
            "exit": proc.returncode, "first_case_s": None if first is None else round(first, 2),
            "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "cases": cases, "load": round(os.getloadavg()[0], 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--children", type=int, default=6)
    ap.add_argument("--fixture", default="tests/fixtures/kernels/foreign/segfault.py")
    ap.add_argument("--sequences", type=int, default=2)
    ap.add_argument("--parts", default="children,campaign")
    ap.add_argument("--repeat", type=int, default=1, help="rounds, the methods alternating (a shared machine's load drifts)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    rows = []
    for method in METHODS * args.repeat:
        if "children" in args.parts:
            rows.append(children(method, args.children))
            print(json.dumps(rows[-1]), flush=True)
        if "campaign" in args.parts:
            rows.append(campaign(method, args.fixture, args.sequences))
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"machine": platform.node(), "python": platform.python_version(),
                                        "cpus": os.cpu_count(), "load_after": os.getloadavg(), "rows": rows},
                                       indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
