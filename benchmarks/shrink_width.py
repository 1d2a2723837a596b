"""Fault cases shrunk N candidates at once: the replay matrix's campaigns at several ``--shrink-jobs``.

Each campaign of ``benchmarks/replay_matrix.py`` (a fixture, a seed: work-bounded, the same
findings at any width) runs once per width, the widths of one seed back to back so a shared
machine's load falls on all of them alike. Per campaign: its wall seconds, the seconds its cases'
shrinking took (``minimized`` less ``rated`` in the summary's ``confirm_timeline``, summed over its
cases), the candidates the sequential order reached (``minimal.candidates``: the cap's count, the
same at any width), the replays its confirmations ran in all (``confirm_work``: those run ahead and
never reached included) and whether every case (ops, pool, history, ``minimal``) is the one width 1
gave. Each row still passes the replay matrix's checks (replays exit 1, 1-minimal, no needless part).

    TRITON_INTERPRET=1 .venv/bin/python benchmarks/shrink_width.py --only hang_nth,kill_nth --seeds 0,1,2 \\
        --widths 1,2,3 --out /tmp/sw

In a campaign its cases are confirmed side by side already (a thread each), beside the worker that
goes on fuzzing. ``--alone`` measures one case at a time instead, as ``kvfuzz minimize`` shrinks it:
each campaign runs with ``--no-minimize`` (its cases rated, their history found, not shrunk), then
each fault case is shrunk by ``kvfuzz minimize --shrink-jobs W --op-timeout 1.5`` at every width
(a copy each), timed, and the ops it wrote compared with width 1's. The copies leave out the
campaign's ``nondeterministic`` mark for a set that is deterministic given a case's history (which
``minimize`` replays first): with it, ``minimize`` takes every case of the set for a flaky one (up to
10 tries a candidate, one at a time: 1458 candidates for kill_nth's 20-op case), not what the
campaign's confirmer does (one try a candidate, the mark aside). Its ``turns`` are the
candidates' turns one after the other (a batch is one): where each lane has a core (or waits, as a
hang or a GPU's set-up does), a shrink's seconds follow its turns, not its candidates.

Writes ``shrink_width.json`` and ``shrink_width.md`` (or ``alone.json``, ``alone.md``) into ``--out``
as each run ends.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.replay_matrix import FIXTURES, FOREIGN, LIMITS, OP_TIMEOUT_S, SEQUENCES, campaign, kvfuzz  # noqa: E402


def shrink_s(case: dict) -> float | None:
    steps = case.get("confirm_s") or {}
    return round(steps["minimized"] - steps["rated"], 1) if "minimized" in steps and "rated" in steps else None


def fingerprint(row: dict) -> list:
    """What must not depend on the width: each case's signature, lengths, history length and ``minimal``."""
    return sorted((c["signature"], json.dumps(c["lengths"], sort_keys=True), c["history"],
                   json.dumps(c["minimal"], sort_keys=True)) for c in row["cases"])


def table(rows: list[dict]) -> str:
    lines = ["| fixture | seed | width | campaign s | shrink s | cases: ops found -> minimized | candidates (cap's count) "
             "| replays in all | children | same case as width 1 | right |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    first = {(r["fixture"], r["seed"]): fingerprint(r) for r in rows if r["shrink_jobs"] == 1}
    for r in rows:
        cases = r["cases"]
        shrink = [s for c in cases if (s := shrink_s(c)) is not None]
        work = [(c.get("confirm_work") or {}).get("written") or (c.get("confirm_work") or {}).get("minimized") or {}
                for c in cases]
        base = first.get((r["fixture"], r["seed"]))
        lines.append(
            f"| {r['fixture']} | {r['seed']} | {r['shrink_jobs']} | {r['run_s']} | {sum(shrink):.1f} | "
            f"{', '.join(str(c['lengths'].get('original')) + ' -> ' + str(c['lengths'].get('minimized')) for c in cases)}"
            f" | {', '.join(str((c['minimal'] or {}).get('candidates', '')) for c in cases)} | "
            f"{sum(w.get('replays', 0) for w in work)} | {sum(w.get('children', 0) for w in work)} | "
            f"{'-' if base is None else 'yes' if base == fingerprint(r) else 'NO'} | {r['ok']} |")
    return "\n".join(lines) + "\n"


def alone(name: str, seed: int, widths: list[int], backend: str, out: Path, op_timeout: float) -> list[dict]:
    """Campaign ``name`` at ``seed`` without shrinking, then each of its fault cases shrunk by
    ``kvfuzz minimize`` at each width: a row per case and width."""
    from fuzz.engine.case import load_case

    file, env, deterministic = FIXTURES[name]
    where = out / name / str(seed)
    kvfuzz("run", "--backend", backend, "--kernels", FOREIGN / file, "--seed", seed, *LIMITS, "--max-sequences",
           SEQUENCES, "--op-timeout", op_timeout, "--no-minimize", "--out", where / "found", env=env)
    rows = []
    for path in sorted((where / "found").glob("*.json")):
        case = load_case(path)
        if case.fault is None or not (case.reproduced or {}).get("k"):
            continue
        first = None
        for width in widths:
            copy = where / f"w{width}" / path.name
            copy.parent.mkdir(parents=True, exist_ok=True)
            if deterministic:
                case.with_fields(nondeterministic=None).write(copy)
            else:
                shutil.copy(path, copy)
            start = time.monotonic()
            rc, text = kvfuzz("minimize", copy, "--shrink-jobs", width, "--op-timeout", op_timeout,
                              "--budget-s", 1800, env=env)
            wall = round(time.monotonic() - start, 1)
            done = load_case(copy)
            said = re.search(r"in (\d+) replays.*?\((\d+) more spared by the cache(?:; \d+ at once: \d+ run ahead, "
                             r"(\d+) of them never reached, (\d+) turns)?", text)
            ops = [op.to_json() for op in done.ops]
            first = ops if first is None else first
            rows.append({"fixture": name, "seed": seed, "signature": str(case.signature), "width": width, "rc": rc,
                         "s": wall, "found": len(case.ops), "minimized": len(done.ops),
                         "history": len((case.history or {}).get("sequences") or []),
                         "candidates": int(said.group(1)) if said else None,
                         "ahead": int(said.group(3) or 0) if said else None,
                         "turns": int(said.group(4) or said.group(1)) if said else None,
                         "one_minimal": (done.minimal or {}).get("one_minimal"), "same": ops == first,
                         **({} if said and rc == 0 else {"log_tail": text[-1500:]})})
            r = rows[-1]
            print(f"{name} seed {seed} {r['signature']} width {width}: {r['found']} -> {r['minimized']} ops, "
                  f"{r['candidates']} candidates (+{r['ahead']} ahead), {wall} s, same {r['same']}", flush=True)
    return rows


def alone_table(rows: list[dict]) -> str:
    lines = ["| fixture | seed | case | history | width | s | ops found -> minimized | candidates (cap's count) | "
             "run ahead, never reached | turns | 1-minimal | same ops as width 1 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['fixture']} | {r['seed']} | {r['signature']} | {r['history']} | {r['width']} | {r['s']} | "
                     f"{r['found']} -> {r['minimized']} | {r['candidates']} | {r['ahead']} | {r['turns']} | "
                     f"{r['one_minimal']} | {'yes' if r['same'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="interpret")
    ap.add_argument("--only", default="hang_nth,kill_nth", help="comma-separated fixture names (replay_matrix's)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--widths", default="1,3")
    ap.add_argument("--op-timeout", type=float, default=OP_TIMEOUT_S)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--alone", action="store_true", help="each fault case shrunk on its own by kvfuzz minimize")
    args = ap.parse_args(argv)
    names = [n for n in FIXTURES if n in args.only.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    if args.alone:
        for seed in (int(s) for s in args.seeds.split(",")):
            for name in names:
                rows += alone(name, seed, [int(w) for w in args.widths.split(",")], args.backend, args.out,
                              args.op_timeout)
                (args.out / "alone.json").write_text(json.dumps(rows, indent=1) + "\n")
                (args.out / "alone.md").write_text(alone_table(rows))
        print(alone_table(rows))
        return 0 if rows and all(r["same"] and r["rc"] == 0 and r["one_minimal"] for r in rows) else 1
    for seed in (int(s) for s in args.seeds.split(",")):
        for name in names:
            for width in (int(w) for w in args.widths.split(",")):
                row = campaign(name, seed, args.backend, args.out / f"w{width}", op_timeout=args.op_timeout,
                               shrink_jobs=width)
                rows.append(row)
                print(f"{name} seed {seed} width {width}: exit {row['rc']}, {len(row['cases'])} case(s), "
                      f"{row['run_s']} s, shrink {sum(s for c in row['cases'] if (s := shrink_s(c))):.1f} s, "
                      f"{'right' if row['ok'] else 'WRONG'}", flush=True)
                (args.out / "shrink_width.json").write_text(json.dumps(rows, indent=1) + "\n")
                (args.out / "shrink_width.md").write_text(table(rows))
    print(table(rows))
    base = {(r["fixture"], r["seed"]): fingerprint(r) for r in rows if r["shrink_jobs"] == 1}
    same = all(base.get((r["fixture"], r["seed"]), fingerprint(r)) == fingerprint(r) for r in rows)
    return 0 if rows and same and all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
