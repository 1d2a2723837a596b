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

Writes ``shrink_width.json`` and ``shrink_width.md`` into ``--out`` as each campaign ends.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.replay_matrix import FIXTURES, OP_TIMEOUT_S, campaign  # noqa: E402


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="interpret")
    ap.add_argument("--only", default="hang_nth,kill_nth", help="comma-separated fixture names (replay_matrix's)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--widths", default="1,3")
    ap.add_argument("--op-timeout", type=float, default=OP_TIMEOUT_S)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    names = [n for n in FIXTURES if n in args.only.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
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
