"""Cases that replay: fault fixtures whose trigger is a process's history or chance, campaigns bounded by work.

Four kernel sets (``tests/fixtures/kernels/foreign/``): one that exits with status 0 on the Nth
free of its process (``exit_nth``), one SIGKILLed on its Nth alloc (``kill_nth``), one that
hangs on its Nth free (``hang_late`` with ``KVFUZZ_FIXTURE_HANG_AT``) and one whose free loses a
store one call in three (``flaky``). Each runs ``--campaigns`` campaigns (seeds 0, 1, ...)
of ``kvfuzz run --max-sequences 6 --ops-per-sequence 30 --op-timeout 1.5`` (work, not time: the same campaigns on
any machine); then for every case:

- its lengths as found and minimized, its rate (``reproduced``: k/n, all n from fresh processes),
  ``flaky``, ``minimal`` and whether the campaign marked its set ``nondeterministic``;
- the exit codes of ``kvfuzz replay CASE`` (``--replays`` times; 20 for ``flaky``): each must be 1;
- for a fault case, the parts (single ops, history sequences) without which it still fails,
  each replayed in a fresh process (``confirm.needless_parts``): none, for a 1-minimal case.

A row is right when every case replays (exit 1 each time), no case of a set that is
deterministic given its history is rated flaky, and every fault case is 1-minimal.

    TRITON_INTERPRET=1 .venv/bin/python benchmarks/replay_matrix.py --out /tmp/rm
    TRITON_INTERPRET=1 .venv/bin/python benchmarks/replay_matrix.py --only exit_nth --campaigns 2 --out /tmp/rm
    TRITON_INTERPRET=1 .venv/bin/python benchmarks/replay_matrix.py --only hang_nth --shrink-jobs 3 --out /tmp/rm3

``--shrink-jobs N`` is the campaigns' (fault candidates N at once; default: ``kvfuzz run``'s); each
case's row keeps what its confirmation cost (``confirm_work``: children and replays, from the
campaign's summary) and when each step ended (``confirm_s``), so widths compare by the same cases.

Writes ``replay_matrix.json`` and ``replay_matrix.md`` (the table) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOREIGN = ROOT / "tests" / "fixtures" / "kernels" / "foreign"

# name -> (fixture file, its environment, whether its faults are deterministic given their history).
# N is small so that a 6-sequence campaign of 30-op sequences meets each trigger more than once.
FIXTURES = {
    "exit_nth": ("exit_nth.py", {"KVFUZZ_FIXTURE_EXIT_AT": "12"}, True),
    "kill_nth": ("kill_nth.py", {"KVFUZZ_FIXTURE_KILL_AT": "10"}, True),
    "hang_nth": ("hang_late.py", {"KVFUZZ_FIXTURE_HANG_AT": "10", "KVFUZZ_FIXTURE_HANG_K": "-1"}, True),
    "flaky": ("flaky.py", {"KVFUZZ_FIXTURE_FLAKY_P": "0.333"}, False),
}
# A hang costs an op-timeout per replay and per candidate that still hangs: 1.5 s tells one on the
# interpreter (an op of these sizes takes milliseconds; a loaded runner's wait for a core is not counted).
LIMITS = ("--ops-per-sequence", 30, "--workers", 1, "--progress-s", 10)
SEQUENCES = 6
OP_TIMEOUT_S = 1.5
REPLAY_OP_TIMEOUT_S = 5
FLAKY_REPLAYS = 20


def kvfuzz(*args, env: dict, timeout: float = 900, log: Path | None = None) -> tuple[int | None, str]:
    """``python -m fuzz ARGS``: its exit code and output. With ``log``, the output goes to that file as it
    is written, so a call cut short by the caller's own timeout still shows how far each campaign got."""
    cmd = [sys.executable, "-m", "fuzz", *map(str, args)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    try:
        if log is None:
            r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
            return r.returncode, r.stdout + r.stderr
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as f:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, env=env).returncode
        return rc, log.read_text(errors="replace")
    except subprocess.TimeoutExpired:
        return None, "timed out"


def needless(case, backend: str, env: dict, jobs: int = 1) -> list[str]:
    """``confirm.needless_parts`` of a case, on ``jobs`` executors of its own (parts at once) with
    the fixture's environment."""
    from fuzz.engine.case import resolve_kernels
    from fuzz.engine.confirm import needless_parts
    from fuzz.engine.supervise import Executor
    from fuzz.engine.tiers import TierSpec

    kernels = resolve_kernels(case.kernels, case.path, case.kernels_file)
    exs = [Executor(TierSpec(backend, kernels), op_timeout=REPLAY_OP_TIMEOUT_S, log_dir=Path(tempfile.gettempdir()),
                    env=env) for _ in range(max(1, jobs))]
    for ex in exs:
        ex.standby()
    try:
        return needless_parts(case, exs[0], exs[1:])
    finally:
        for ex in exs:
            ex.close()


def replays_of(path: Path, n: int, env: dict, jobs: int = 1) -> list[int | None]:
    """The exit codes of ``n`` runs of ``kvfuzz replay CASE``, ``jobs`` at once (each its own process:
    on a GPU each makes a CUDA context, and a flaky case's 20 replays one after another cost minutes)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        return list(pool.map(lambda _: kvfuzz("replay", path, "--op-timeout", REPLAY_OP_TIMEOUT_S, env=env)[0],
                             range(n)))


def campaign(name: str, seed: int, backend: str, out: Path, replays: int | None = None,
             sequences: int = SEQUENCES, op_timeout: float = OP_TIMEOUT_S, shrink_jobs: int | None = None,
             replay_jobs: int = 1) -> dict:
    """One campaign of fixture ``name`` and the checks of its cases: a row of the table."""
    from fuzz.engine.case import load_case

    file, env, deterministic = FIXTURES[name]
    where = out / name / str(seed)
    start = time.monotonic()
    width = ("--shrink-jobs", shrink_jobs) if shrink_jobs else ()
    rc, text = kvfuzz("run", "--backend", backend, "--kernels", FOREIGN / file, "--seed", seed, *LIMITS,
                      "--max-sequences", sequences, "--op-timeout", op_timeout, *width,
                      "--out", where / "cases", "--summary", where / "summary.json", env=env,
                      log=where / "run.log")
    row = {"fixture": name, "seed": seed, "rc": rc, "run_s": round(time.monotonic() - start, 1), "cases": [],
           "shrink_jobs": shrink_jobs}
    try:
        failures = {f.get("signature"): f for f in json.loads((where / "summary.json").read_text()).get("failures", [])}
    except (OSError, ValueError):
        failures = {}
    for path in sorted((where / "cases").glob("*.json")):
        case = load_case(path)
        n = replays or (FLAKY_REPLAYS if not deterministic else 1)
        codes = replays_of(path, n, env, replay_jobs)
        entry = {"signature": str(case.signature), "lengths": case.lengths, "reproduced": case.reproduced,
                 "flaky": bool(case.flaky), "minimal": case.minimal,
                 "history": len((case.history or {}).get("sequences") or []),
                 "nondeterministic": bool(case.nondeterministic), "replay_tries": case.replay_tries(),
                 "replay_rcs": codes, "confirm_work": failures.get(str(case.signature), {}).get("confirm_work"),
                 "confirm_s": failures.get(str(case.signature), {}).get("confirm_timeline"),
                 **({"fault": case.fault.get("message"), "stack": (case.fault.get("stack") or [])[:20]}
                    if case.fault else {})}
        if case.fault is not None and (case.reproduced or {}).get("k"):
            entry["needless"] = needless(case, backend, env, replay_jobs)
        entry["ok"] = bool(codes) and all(c == 1 for c in codes) and not (deterministic and case.flaky) and (
            case.fault is None or (entry.get("needless") == [] and (case.minimal or {}).get("one_minimal") is True))
        row["cases"].append(entry)
    row["ok"] = rc == 1 and bool(row["cases"]) and all(c["ok"] for c in row["cases"])
    if not row["ok"]:
        row["log_tail"] = text[-1500:]
    return row


def table(rows: list[dict]) -> str:
    lines = ["| fixture | seed | run exit | s | signature | ops found -> minimized | 1-minimal | rate (k/n fresh) | "
             "flaky | history | set marked | replay tries | replay exits | ok |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for c in r["cases"] or [{}]:
            rep = c.get("reproduced") or {}
            rcs = c.get("replay_rcs") or []
            exits = ", ".join(f"{x}: {rcs.count(x)}" for x in sorted(set(rcs), key=str)) if rcs else ""
            minimal = c.get("minimal") or {}
            needless = "" if "needless" not in c else f" (needless: {', '.join(c['needless']) or 'none'})"
            lines.append(
                f"| {r['fixture']} | {r['seed']} | {r['rc']} | {r['run_s']} | {c.get('signature', '(no case)')} | "
                f"{(c.get('lengths') or {}).get('original', '')} -> {(c.get('lengths') or {}).get('minimized', '')} | "
                f"{minimal.get('one_minimal', '')}{needless} | "
                f"{rep.get('k', '')}/{rep.get('n', '')} ({rep.get('fresh', '')}) | {c.get('flaky', '')} | "
                f"{c.get('history', '')} | {c.get('nondeterministic', '')} | {c.get('replay_tries', '')} | {exits} | "
                f"{c.get('ok', r['ok'])} |")
    return "\n".join(lines) + "\n"


def write(out: Path, rows: list[dict]) -> None:
    rows.sort(key=lambda r: (list(FIXTURES).index(r["fixture"]), r["seed"]))
    (out / "replay_matrix.json").write_text(json.dumps(rows, indent=1) + "\n")
    (out / "replay_matrix.md").write_text(table(rows))


def in_parallel(args, names: list[str], start: float) -> int:
    """Each campaign run by this script in a process of its own (``--campaigns 1``), ``--jobs`` at
    once: the table is the same as one process's, each row written as its campaign ends."""
    from concurrent.futures import ThreadPoolExecutor

    longest_first = sorted(names, key=lambda n: ("hang_nth", "flaky").index(n) if n in ("hang_nth", "flaky") else 2)
    todo = [(n, s) for n in longest_first for s in range(args.first_seed, args.first_seed + args.campaigns)]
    rows: list[dict] = []
    lock = threading.Lock()

    def one(name: str, seed: int) -> None:
        if args.deadline_s is not None and time.monotonic() - start > args.deadline_s:
            return
        part = args.out / "parts" / f"{name}-{seed}"
        width = ["--shrink-jobs", str(args.shrink_jobs)] if args.shrink_jobs else []
        subprocess.run([sys.executable, __file__, "--backend", args.backend, "--only", name, "--first-seed", str(seed),
                        "--campaigns", "1", "--op-timeout", str(args.op_timeout), "--out", str(part), *width,
                        "--replay-jobs", str(args.replay_jobs)],
                       cwd=ROOT, capture_output=True, text=True)
        got = json.loads((part / "replay_matrix.json").read_text()) if (part / "replay_matrix.json").exists() else [
            {"fixture": name, "seed": seed, "rc": None, "run_s": None, "cases": [], "ok": False,
             "log_tail": "the campaign's process wrote no row"}]
        with lock:
            rows.extend(got)
            for r in got:
                print(f"{name} seed {seed}: exit {r['rc']}, {len(r['cases'])} case(s), {r['run_s']} s, "
                      f"{'right' if r['ok'] else 'WRONG'}", flush=True)
            write(args.out, rows)

    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(lambda job: one(*job), todo))
    print(table(rows))
    return 0 if rows and all(r["ok"] for r in rows) else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="interpret")
    ap.add_argument("--campaigns", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=0, help="seeds FIRST .. FIRST + CAMPAIGNS - 1")
    ap.add_argument("--merge", type=Path, nargs="*", default=None,
                    help="no campaigns: one table of these replay_matrix.json files (runs split by --first-seed)")
    ap.add_argument("--only", default="", help="comma-separated fixture names")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--op-timeout", type=float, default=OP_TIMEOUT_S,
                    help="the campaigns' --op-timeout (a GPU's first launches in a fresh process load kernels)")
    ap.add_argument("--deadline-s", type=float, default=None,
                    help="start no campaign after this many seconds (the rows so far are written)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="campaigns at once, each in a process of its own (a GPU host's cores; the hang and flaky "
                         "campaigns, the longest, start first)")
    ap.add_argument("--replay-jobs", type=int, default=1,
                    help="a case's kvfuzz replay runs, and its needless-part checks, this many at once (each a "
                         "process of its own)")
    ap.add_argument("--shrink-jobs", type=int, default=None,
                    help="the campaigns' --shrink-jobs: fault candidates this many at once (default: kvfuzz run's)")
    args = ap.parse_args(argv)
    names = [n for n in FIXTURES if not args.only or n in args.only.split(",")]
    rows, start = [], time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.merge is not None:
        rows = [r for f in args.merge for r in json.loads(f.read_text())]
        write(args.out, rows)
        return 0 if all(r["ok"] for r in rows) else 1
    if args.jobs > 1:
        return in_parallel(args, names, start)
    for seed in range(args.first_seed, args.first_seed + args.campaigns):  # seed by seed, so rows cut short by --deadline-s cover every fixture
        for name in names:
            if args.deadline_s is not None and time.monotonic() - start > args.deadline_s:
                break
            rows.append(campaign(name, seed, args.backend, args.out, op_timeout=args.op_timeout,
                                 shrink_jobs=args.shrink_jobs, replay_jobs=args.replay_jobs))
            r = rows[-1]
            print(f"{name} seed {seed}: exit {r['rc']}, {len(r['cases'])} case(s), {r['run_s']} s, "
                  f"{'right' if r['ok'] else 'WRONG'}", flush=True)
            write(args.out, rows)
    print(table(rows))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
