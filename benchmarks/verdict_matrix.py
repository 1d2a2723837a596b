"""Every verdict on kernel sets kvfuzz was not written around, as a team would run it.

Each row is one ``kvfuzz run --backend BACKEND --kernels SET --budget-s B --out DIR --json``
on a foreign or letter-of-SPEC fixture (``tests/fixtures/kernels/``), with default flags
otherwise, then ``kvfuzz replay`` of every case it wrote. A row passes when the exit code is
the one the fixture's README gives (0 only for a SPEC-correct set, 1 for a set with a fault),
every signature starts with what it should (``expect``), and each case replays (exit 1),
except for a fault drawn at random (``flaky.py``), whose replays may pass. A row whose fault has a
trigger the campaign may never draw (``hang_late.py``'s free of exactly 49 pages) and that ends
clean without reaching it is ``n/a``: nothing was judged. Prints one line a row and writes
``verdict_matrix.json`` into ``--out``.

    TRITON_INTERPRET=1 .venv/bin/python benchmarks/verdict_matrix.py --out /tmp/vm
    TRITON_INTERPRET=1 .venv/bin/python benchmarks/verdict_matrix.py --only segfault,flaky --out /tmp/vm
    TRITON_INTERPRET=1 .venv/bin/python benchmarks/verdict_matrix.py --guided --out /tmp/vm-guided

``--guided``: each campaign coverage-guided from a corpus of its own (``--corpus DIR/SET/corpus``),
as ``ci/nightly.sh``'s guided step runs; the verdicts it must give are the same.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "tests" / "fixtures" / "kernels"

# name, file, budget (s), exit code, signature prefixes a case may have (None: clean), replays deterministic
ROWS = (
    ("literal_blocks", "foreign/literal_blocks.py", 30, 0, None, True),
    ("indep", "foreign/indep.py", 30, 0, None, True),
    ("clamp_max_tokens", "letter/clamp_max_tokens.py", 30, 0, None, True),
    ("refuse_short_out", "letter/refuse_short_out.py", 30, 0, None, True),
    ("letter_all", "letter/letter_all.py", 30, 0, None, True),
    ("trusting", "foreign/trusting.py", 30, 1, ("translate/", "free/", "read_table", "k_"), True),
    ("segfault", "foreign/segfault.py", 30, 1, ("free/crash/SIGSEGV", "k_free_unbind/crash/SIGSEGV",
                                                "chain_free/crash/SIGSEGV"), True),  # a chain's free runs the same kernel
    ("hang_late", "foreign/hang_late.py", 900, 1, ("free/timeout", "k_free_unbind/timeout", "chain_free/timeout"),
     True),  # (a chain's free, too)
    ("flaky", "foreign/flaky.py", 30, 1, ("free/", "k_free_unbind/", "flush/", "alloc/", "chain_free/"), False),
)
# Rows bounded by work (--max-ops), their budget only a cap: hang_late's free of exactly 49 pages
# comes at a fixed op of seed 0's blind stream (a budget of seconds reaches it on a fast machine and
# misses it on a slow one). The first such free is near op 74,000 (generate.regenerate over seed 0's
# sequences, chain seeds among them, counting each free's pages): the cap leaves room past it.
# A guided campaign's ops are not blind's and vary with its corpus's timing: it may draw no such
# free within the cap. The fixture marks a trigger it reached (``KVFUZZ_FIXTURE_HANG_MARK``), so a
# clean exit without one is "never reached", a row with nothing to judge, not a verdict missed.
MAX_OPS = {"hang_late": 90_000}
TRIGGER_MARKED = {"hang_late"}


def kvfuzz(*args, timeout: float, env: dict | None = None) -> tuple[int | None, str, float]:
    start = time.monotonic()
    try:
        r = subprocess.run([sys.executable, "-m", "fuzz", *map(str, args)], cwd=ROOT, capture_output=True,
                           text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
        return r.returncode, r.stdout + r.stderr, time.monotonic() - start
    except subprocess.TimeoutExpired:
        return None, "timed out", time.monotonic() - start


def row(name, path, budget, want_rc, prefixes, deterministic, backend: str, out: Path, guided: bool = False) -> dict:
    where = out / name
    guide = ("--corpus", where / "corpus") if guided else ()
    work = ("--max-ops", MAX_OPS[name]) if name in MAX_OPS else ()
    mark = where / "trigger-reached.txt"
    mark.unlink(missing_ok=True)
    where.mkdir(parents=True, exist_ok=True)
    env = {"KVFUZZ_FIXTURE_HANG_MARK": str(mark)} if name in TRIGGER_MARKED else None
    rc, text, took = kvfuzz("run", "--backend", backend, "--kernels", KERNELS / path, "--budget-s", budget,
                            "--out", where, "--json", *guide, *work, timeout=budget + 400, env=env)
    reached = mark.exists() if name in TRIGGER_MARKED else None
    cases = sorted(where.glob("*.json")) if where.exists() else []
    got = []
    for case in cases:
        data = json.loads(case.read_text())
        sig = data.get("signature") or {}
        signature = "/".join(str(sig.get(k)) for k in ("op", "oracle", "field"))
        replay_rc, _, _ = kvfuzz("replay", case, timeout=300)
        got.append({"signature": signature, "ops": len(data.get("ops") or []), "reproduced": data.get("reproduced"),
                    "replay_exit": replay_rc})
    unjudged = reached is False and rc == 0 and not got  # the campaign never drew the fault's trigger
    wrong = []
    if rc != want_rc and not unjudged:
        wrong.append(f"exit {rc}, not {want_rc}")
    if prefixes is None and got:
        wrong.append("cases from a clean set")
    if prefixes is not None and not got and not unjudged:
        wrong.append("no case")
    for c in got:
        if prefixes is not None and not c["signature"].startswith(prefixes):
            wrong.append(f"unexpected {c['signature']}")
        if deterministic and c["replay_exit"] != 1:
            wrong.append(f"{c['signature']} replays with exit {c['replay_exit']}")
    last = next((line for line in reversed(text.splitlines()) if line.startswith("kvfuzz run: backend=")), "")
    return {"set": name, "file": path, "budget_s": budget, "max_ops": MAX_OPS.get(name), "exit": rc, "seconds": round(took, 1), "cases": got,
            "ok": not wrong, "status": "WRONG" if wrong else "n/a" if unjudged else "ok", "wrong": wrong,
            "trigger_reached": reached, "run_line": last[:400]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="interpret")
    ap.add_argument("--only", help="comma list of row names")
    ap.add_argument("--guided", action="store_true", help="each campaign guided from a corpus of its own")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [r for r in ROWS if not args.only or r[0] in args.only.split(",")]
    results = []
    for r in rows:
        results.append(row(*r, backend=args.backend, out=args.out, guided=args.guided))
        res = results[-1]
        cases = ", ".join(f"{c['signature']} ({c['ops']} ops, rate {c['reproduced']}, replay {c['replay_exit']})"
                          for c in res["cases"]) or "no case"
        cases += ": the fault's trigger never ran, nothing to judge" if res["status"] == "n/a" else ""
        print(f"{res['status']:5s} {res['set']:18s} exit {res['exit']} in {res['seconds']} s: {cases}"
              + (f"  <- {'; '.join(res['wrong'])}" if res["wrong"] else ""), flush=True)
    from fuzz.environment import environment

    record = {"backend": args.backend, "guided": args.guided, "environment": environment(), "rows": results}
    (args.out / "verdict_matrix.json").write_text(json.dumps(record, indent=1) + "\n")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
