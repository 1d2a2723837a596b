"""Seconds to the first case: what a user's ``kvfuzz run`` takes from process start to the
first confirmed, minimized case written, over planted bugs, on a cold and a warm Triton cache.

``kvfuzz mutants`` reports a time to kill measured inside one process (``found_after``: the
finding, before it is confirmed and minimized, with the interpreter already imported). A
user waits for more than that: the process starting, the workers importing torch and Triton
and loading (or compiling) the kernels, the finding's reproductions in fresh children, its
minimization, and the case file. So each campaign here is a fresh ``python -m fuzz run
--stop-on-first`` process, timed from just before it is started to the modification time of
the one case file it writes (with ``--stop-on-first`` the campaign ends once that case is
confirmed, minimized and rewritten; ``summary.json`` is written after it). Cold: a fresh,
empty ``--cache-dir`` and no fork daemon (a socket directory of its own); warm: the same
cache directory again, right after the cold run filled it, and the daemon an earlier
command left (``zygote_dir``).

A catalogue mutant (``fuzz/tools/mutants.py``) reaches the command line as a module that
replaces itself by the mutant (``mutants.mutant_module``): ``--kernels`` for a kernel
mutant, ``--allocator MODULE:DeviceAllocator`` for an allocator one. ``--sets`` adds kernel
set files (the foreign fixtures), each run at ``--scale``. A campaign that writes no case
within its budget counts as infinitely slow in the median and the worst.

    .venv/bin/python benchmarks/first_case.py --backend interpret --mutants free-sorts-holes --cold --warm \\
        --budget-s 60 --out benchmarks/results/first-case-interpret
    .venv/bin/python benchmarks/first_case.py --backend cuda --out benchmarks/results/first-case-h200   # all mutants
    .venv/bin/python benchmarks/first_case.py --backend interpret --mutants none --scale production \\
        --sets tests/fixtures/kernels/foreign/int32_offset.py --cold --out /tmp/fc

Writes ``first_case.json`` (every campaign, the machine and versions) and ``first_case.md``
(the table) into ``--out``. Version-agnostic (torch and Triton only through ``kvfuzz run``),
no network.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WRAPPER = '''"""kvfuzz mutant {name}, as a module the command line loads (benchmarks/first_case.py)."""
import sys

from fuzz.tools.mutants import MUTANTS, mutant_module

sys.modules[__name__] = mutant_module(next(m for m in MUTANTS if m.name == {name!r}))
'''


def targets(args, scratch: Path) -> list[dict]:
    """(name, the ``kvfuzz run`` flags that select it) for every campaign target asked for."""
    from fuzz.tools.mutants import MUTANTS, runs_on

    out = []
    names = [] if args.mutants == "none" else [m.name for m in MUTANTS] if args.mutants == "all" else \
        [n for n in args.mutants.split(",") if n]
    known = {m.name: m for m in MUTANTS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"first_case.py: unknown mutant(s) {', '.join(unknown)} (fuzz/tools/mutants.py)")
    for name in names:
        m = known[name]
        if not runs_on(m, args.backend):
            print(f"first_case.py: skipping {name} (a Triton-kernel mutant) on --backend {args.backend}", file=sys.stderr)
            continue
        module = "kvfuzz_first_case_" + name.replace("-", "_")
        (scratch / f"{module}.py").write_text(WRAPPER.format(name=name))
        flags = ["--allocator", f"{module}:DeviceAllocator"] if m.file == "allocator.py" else ["--kernels", module]
        out.append({"name": name, "kind": "mutant", "flags": flags, "scale": "small"})
    for path in [p for p in (args.sets or "").split(",") if p]:
        if not Path(path).is_file():
            raise SystemExit(f"first_case.py: --sets {path}: no such file")
        out.append({"name": Path(path).stem, "kind": "set", "flags": ["--kernels", str(Path(path).resolve())],
                    "scale": args.scale})
    return out


def zygote_dir(args, scratch: Path, cache_state: str) -> Path:
    """The fork daemon's socket directory (``KVFUZZ_ZYGOTE_DIR``, the default start method):
    cold, one of its own (no daemon yet: the campaign starts one and waits for its import of
    torch and Triton); warm, one shared by every warm campaign, whose daemon an earlier command
    left (``prestart``), as a user's second ``kvfuzz run`` finds it."""
    shared = cache_state == "warm" or (cache_state == "cold" and args.cold_daemon == "shared")
    where = scratch / ("z-warm" if shared else f"z-{len(list(scratch.glob('z-*')))}")
    where.mkdir(mode=0o700, exist_ok=True)
    return where


def prestart(args, scratch: Path) -> None:
    """Start the warm daemon, untimed, and wait until it has forked a child (its preload done)."""
    code = ("from fuzz.engine import zygote; p = zygote.start(print, ('',), extra_env={}, "
            f"interpret={args.backend == 'interpret'!r}); p.join(300)")
    env = _env(scratch, zygote_dir(args, scratch, "warm"))
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, timeout=300)


def _env(scratch: Path, zdir: Path) -> dict:
    return {**os.environ, "KVFUZZ_ZYGOTE_DIR": str(zdir),
            "PYTHONPATH": os.pathsep.join([str(scratch), str(ROOT), os.environ.get("PYTHONPATH", "")])}


def daemon_cpu(zdir: Path) -> float:
    """CPU seconds of the fork daemons serving ``zdir`` and of the children they reaped (the
    workers and executors: ``/proc/PID/stat``'s utime, stime, cutime, cstime): a campaign's
    children are the daemon's, not the campaign's, so ``RUSAGE_CHILDREN`` misses them."""
    total = 0.0
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if str(zdir) not in (proc / "cmdline").read_bytes().decode(errors="replace") or \
                    b"daemon.main" not in (proc / "cmdline").read_bytes():
                continue
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return total


def campaign(args, target: dict, cache: Path, scratch: Path, cache_state: str) -> dict:
    """One ``kvfuzz run --stop-on-first`` from a fresh process: seconds to its case file."""
    out = Path(tempfile.mkdtemp(prefix="cases-", dir=scratch))
    summary = out / "summary.json"
    cmd = [sys.executable, "-m", "fuzz", "run", "--backend", args.backend, "--scale", target["scale"],
           *target["flags"], "--seed", str(args.seed), "--budget-s", str(args.budget_s), "--stop-on-first",
           "--cache-dir", str(cache), "--out", str(out / "cases"), "--summary", str(summary),
           *(args.run_flags.split() if args.run_flags else [])]
    zdir = zygote_dir(args, scratch, cache_state)
    env = _env(scratch, zdir)
    cpu0 = (resource.getrusage(resource.RUSAGE_CHILDREN), daemon_cpu(zdir))
    start = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.budget_s * 4 + 300)
    wall = time.time() - start
    time.sleep(1.0)  # the daemon reaps the campaign's last children (they leave with their client)
    own = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = {"command": round(own.ru_utime + own.ru_stime - cpu0[0].ru_utime - cpu0[0].ru_stime, 2),
           "children": round(daemon_cpu(zdir) - cpu0[1], 2)}
    cases = sorted((out / "cases").glob("*.json")) if (out / "cases").is_dir() else []
    first = min((p.stat().st_mtime for p in cases), default=None)
    s = json.loads(summary.read_text()) if summary.is_file() else {}
    failures = s.get("failures") or []
    row = {"target": target["name"], "kind": target["kind"], "scale": target["scale"], "cache": cache_state,
           "exit_code": proc.returncode, "process_s": round(wall, 2), "cpu_s": cpu,
           "first_case_s": None if first is None else round(first - start, 2),
           "found_after_s": failures[0].get("found_after_s") if failures else None,
           "signature": failures[0].get("signature") if failures else None,
           "minimized_ops": failures[0].get("minimized_ops") if failures else None,
           "original_ops": failures[0].get("original_ops") if failures else None,
           "reproduced": failures[0].get("reproduced") if failures else None,
           "ops": s.get("ops"), "stopped_by": s.get("stopped_by"), "compiles": s.get("compiles"),
           "compile_s": s.get("compile_s"), "loads": s.get("loads"), "load_s": s.get("load_s"),
           # where the seconds went (the summary's, from the campaign's start): the process, the first
           # worker set up and its first op; the case's rate, minimization, second rate, rewrite
           "head_start": [w["head_start"] for w in s.get("workers", ()) if w.get("head_start")] or None,
           "timeline": s.get("timeline"), "confirm_timeline": failures[0].get("confirm_timeline") if failures else None,
           # what confirming ran: children started and replays sent, so far, at the end of each step
           "confirm_work": failures[0].get("confirm_work") if failures else None}
    rep = row["reproduced"]
    row["confirmed"] = bool(rep and rep.get("k"))  # a case written at once and never confirmed is not the figure
    if proc.returncode not in (0, 1):
        row["stderr_tail"] = (proc.stderr or proc.stdout)[-600:]
    return row


def _stats(rows: list[dict]) -> dict:
    times = [math.inf if r["first_case_s"] is None or not r.get("confirmed") else r["first_case_s"] for r in rows]
    if not times:
        return {"n": 0}
    def json_s(t: float) -> float | None:  # None: no case within the budget
        return None if t == math.inf else round(t, 2)

    return {"n": len(times), "found": sum(t != math.inf for t in times), "median_s": json_s(statistics.median(times)),
            "worst_s": json_s(max(times)), "best_s": json_s(min(times))}


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return "not found" if v == math.inf else f"{v:.1f}"
    return str(v)


def _cpu(cpu: dict | None) -> str:
    return "-" if not cpu else f"{cpu['command']:.1f} + {cpu['children']:.1f}"


def _work(work: dict | None) -> str:
    """Children started and replays run by the end of confirming (the last step marked)."""
    if not work:
        return "-"
    last = work[next(reversed(work))]
    return f"{last['children']} / {last['replays']}"


def _step(row: dict, name: str) -> str:
    """A confirmation step's end (seconds into the run), with the children and replays by then."""
    steps, work = row.get("confirm_timeline") or {}, row.get("confirm_work") or {}
    if name not in steps:
        return "-"
    w = work.get(name)
    return f"{steps[name]:.2f}" + (f" ({w['children']} / {w['replays']})" if w else "")


def markdown(report: dict) -> str:
    lines = [f"# Seconds to the first case: `kvfuzz run --stop-on-first`, backend {report['backend']}", "",
             f"Machine: {report['machine']}. {report['note']}", "",
             f"Budget {report['budget_s']:.0f} s per campaign, seed {report['seed']}; process start to the case "
             "file written (confirmed, minimized); `found_after_s` is the summary's (inside the run, before "
             "confirmation).", "",
             "| target | scale | cache | first case (s) | found after (s) | process (s) | CPU s (command + children) | "
             "case ops | reproduced | confirming: children / replays | signature |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    unconfirmed = " (unconfirmed: not counted)"
    for r in report["campaigns"]:
        rep = r["reproduced"]
        lines.append(f"| {r['target']} | {r['scale']} | {r['cache']} | {_fmt(r['first_case_s'])}"
                     f"{'' if r.get('confirmed') or r['first_case_s'] is None else unconfirmed} | "
                     f"{_fmt(r['found_after_s'])} | {_fmt(r['process_s'])} | {_cpu(r.get('cpu_s'))} | "
                     f"{_fmt(r['original_ops'])} -> {_fmt(r['minimized_ops'])} | "
                     f"{'-' if not rep else str(rep['k']) + '/' + str(rep['n'])} | {_work(r.get('confirm_work'))} | "
                     f"{_fmt(r['signature'])} |")
    lines += ["", "Where the seconds went, from the campaign's start (the process started `process` before it); "
              "confirming's steps with the children started and replays run by each step's end:", "",
              "| target | cache | process | worker ready | first op | found | rated | minimized | rerated | written |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["campaigns"]:
        t = r.get("timeline") or {}
        lines.append(f"| {r['target']} | {r['cache']} | {_fmt(t.get('process_start'))} | {_fmt(t.get('ready'))} | "
                     f"{_fmt(t.get('first_op'))} | {_fmt(r.get('found_after_s'))} | "
                     + " | ".join(_step(r, n) for n in ("rated", "minimized", "rerated", "written")) + " |")
    lines += ["", "| cache | campaigns | found | median (s) | worst (s) |", "|---|---|---|---|---|"]
    for state, st in report["summary"].items():
        if st.get("n"):
            lines.append(f"| {state} | {st['n']} | {st['found']} | {_fmt(st['median_s']) if st['median_s'] is not None else 'not found'} | "
                         f"{_fmt(st['worst_s']) if st['worst_s'] is not None else 'not found'} |")
    return "\n".join(lines) + "\n"


def versions() -> dict:
    out = {"python": platform.python_version(), "platform": platform.platform(), "cpu_count": os.cpu_count()}
    probe = ("import json, torch, triton; print(json.dumps({'torch': torch.__version__, 'triton': triton.__version__, "
             "'gpu': torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}))")
    try:
        out.update(json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                             timeout=300).stdout.strip().splitlines()[-1]))
    except Exception as exc:  # noqa: BLE001 - versions are context, not the measurement
        out["versions_error"] = str(exc)[:200]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("torch", "interpret", "cuda"), default="interpret")
    ap.add_argument("--mutants", default="all", help="catalogue names, comma-separated; 'all' (default) or 'none'")
    ap.add_argument("--sets", default="", help="kernel set files, comma-separated, run at --scale")
    ap.add_argument("--scale", choices=("small", "production"), default="production",
                    help="the scale of --sets campaigns (mutants run at small scale, as kvfuzz mutants does)")
    ap.add_argument("--cold", action="store_true", help="a fresh, empty --cache-dir per target")
    ap.add_argument("--warm", action="store_true", help="again, on the cache the cold run filled")
    ap.add_argument("--cold-daemon", choices=("fresh", "shared"), default="fresh",
                    help="cold campaigns without a fork daemon (fresh: each starts its own and waits for its "
                         "import of torch) or with the one an earlier command left (shared): a cold Triton "
                         "cache alone")
    ap.add_argument("--budget-s", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--note", default="", help="a line on the machine's load, for the table")
    ap.add_argument("--run-flags", default="", metavar="FLAGS",
                    help="more kvfuzz run flags for every campaign, one string (e.g. '--compile-ahead off': an A/B)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--render", type=Path, help="only rewrite OUT/first_case.md (and its summary) from this JSON")
    args = ap.parse_args(argv)
    if args.render:
        args.out.mkdir(parents=True, exist_ok=True)
        report = json.loads(args.render.read_text())
        for r in report["campaigns"]:
            r.setdefault("confirmed", bool(r.get("reproduced") and r["reproduced"].get("k")))
        report["summary"] = {s: _stats([r for r in report["campaigns"] if r["cache"] == s]) for s in report["summary"]}
        (args.out / "first_case.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
        (args.out / "first_case.md").write_text(markdown(report))
        return 0
    states = [s for s, on in (("cold", args.cold), ("warm", args.warm)) if on] or ["cold", "warm"]
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="kvfuzz-first-case-") as tmp:
        scratch = Path(tmp)
        chosen = targets(args, scratch)
        if not chosen:
            raise SystemExit("first_case.py: nothing to run (--mutants none and no --sets)")
        if "warm" in states or args.cold_daemon == "shared":
            prestart(args, scratch)
        for target in chosen:
            cache = scratch / f"cache-{target['name']}"
            cache.mkdir()
            if "cold" not in states:  # warm only: fill the cache first, untimed
                campaign(args, target, cache, scratch, "fill")
            for state in states:
                row = campaign(args, target, cache, scratch, state)
                rows.append(row)
                print(json.dumps(row), flush=True)
    report = {"schema": "kvfuzz-first-case/1", "backend": args.backend, "budget_s": args.budget_s, "seed": args.seed,
              "machine": f"{platform.node() or 'this machine'}, {os.cpu_count()} CPUs",
              "note": args.note or "", "versions": versions(), "campaigns": rows,
              "start_method": os.environ.get("KVFUZZ_START_METHOD") or "daemon (default)",
              "cold_daemon": args.cold_daemon, "run_flags": args.run_flags,
              "summary": {s: _stats([r for r in rows if r["cache"] == s]) for s in states}}
    (args.out / "first_case.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (args.out / "first_case.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
