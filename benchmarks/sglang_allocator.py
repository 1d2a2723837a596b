"""SGLang's allocator under the fuzz: the clean campaign and the kill table of its mutants.

    python benchmarks/sglang_allocator.py --backend torch --max-sequences 100 --json OUT.json [--mutants a,b]

Runs, through the CLI as a user would (``kvfuzz run --allocator kvfuzz-sglang``):

1. the shipped allocator, ``--max-sequences`` sequences from seed 0: its ops, the pool
   shapes it met (``by_shape``, from the sequences' configs in the summary), its failures;
2. each planted bug (``fuzz/clients/sglang_mutants.py``), ``--stop-on-first`` within the
   same bound: whether it was found, after how many ops and sequences, the signature, the
   case's original and minimized length; then the case replayed on the mutant (exit 1
   expected) and on the shipped allocator (exit 0 expected: the case is the mutant's).

Bounded by work, so the table does not depend on the machine; the seconds are recorded
beside it. Needs SGLang 0.5.23 where kvfuzz finds it (``PYTHONPATH`` for a ``--target``
install).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BASELINE = Path(__file__).resolve().parent.parent / "fuzz/clients/sglang-baseline.json"


def kvfuzz(*args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fuzz", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=os.environ)


def campaign(allocator: str, backend: str, sequences: int, out: Path, *extra) -> tuple[dict, float, int]:
    summary = out / "summary.json"
    t0 = time.time()
    r = kvfuzz("run", "--allocator", allocator, "--backend", backend, "--max-sequences", sequences, "--seed", 0,
               "--workers", 1, "--out", out / "cases", "--summary", summary, *extra)
    if not summary.is_file():
        raise SystemExit(f"{allocator}: no summary (exit {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return json.loads(summary.read_text()), round(time.time() - t0, 1), r.returncode


def shapes_met(sequences: int) -> dict:
    """How many of the first ``sequences`` sequences (seed 0, one worker: seeds 0, 1, ...)
    drew each pool shape: lazy or eager, grow direction, page size, reserved floor, move cap."""
    from collections import Counter

    from fuzz.engine.generate import sequence_params

    met = {k: Counter() for k in ("mode", "grow", "page_size", "min_page", "max_moves")}
    for seed in range(sequences):
        c = sequence_params(seed)[0]
        for key, value in (("mode", "lazy" if c.lazy else "eager"), ("grow", c.grow), ("page_size", c.page_size),
                           ("min_page", c.min_page), ("max_moves", c.max_moves)):
            met[key][str(value)] += 1
    return {k: dict(sorted(v.items())) for k, v in met.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="torch")
    ap.add_argument("--max-sequences", type=int, default=100)
    ap.add_argument("--clean-sequences", type=int, default=None, help="the shipped allocator's bound (default: the same; 0: no clean run)")
    ap.add_argument("--mutants", default=None, help="comma-separated names (default: all)")
    ap.add_argument("--json", required=True)
    ap.add_argument("--keep", default=None, help="copy each mutant's case here")
    ap.add_argument("--shapes-of", default=None, metavar="SUMMARY",
                    help="no campaign: the pool shapes a finished campaign's summary met, to --json")
    a = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    if a.shapes_of:
        s = json.loads(Path(a.shapes_of).read_text())
        Path(a.json).write_text(json.dumps(shapes_met(s["sequences"]), indent=1) + "\n")
        print("ops", s["ops"], "sequences", s["sequences"], "failures",
              [(f["signature"], f.get("known")) for f in s["failures"]], "by_kind", s["by_kind"])
        return 0
    from fuzz.clients.sglang_mutants import MUTANTS

    names = a.mutants.split(",") if a.mutants else list(MUTANTS)
    result = {"backend": a.backend, "max_sequences": a.max_sequences, "seed": 0, "mutants": []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        # SPEC's hostile ops are not sent to SGLang's allocator (it has no checked mode) but still
        # probe its kernels on copies: those findings are the kernel adapter's baseline.
        n_clean = a.max_sequences if a.clean_sequences is None else a.clean_sequences
        s, secs, rc = campaign("kvfuzz-sglang", a.backend, n_clean, tmp / "clean", "--baseline", BASELINE) \
            if n_clean else ({"ops": 0, "sequences": 0, "failures": [], "by_kind": {}}, 0.0, 0)
        result["clean"] = {"exit": rc, "ops": s["ops"], "sequences": s["sequences"], "seconds": secs,
                           "failures": [f["signature"] for f in s["failures"]], "by_kind": s["by_kind"],
                           "new_failures": [f["signature"] for f in s["failures"] if not f.get("known")],
                           "environment": s.get("versions"), "allocator_sha256": s.get("allocator_sha256"),
                           "shapes": shapes_met(s["sequences"])}
        print(f"clean: exit {rc}, {s['ops']} ops, {s['sequences']} sequences, failures {result['clean']['failures']}",
              flush=True)
        for name in names:
            out = tmp / name
            # valid input only: SPEC's hostile ops probe the kernels, whose known findings (the
            # kernel adapter's baseline) would stop the campaign before the mutant's own bug
            s, secs, rc = campaign(f"kvfuzz-sglang:mutant_{name}", a.backend, a.max_sequences, out, "--stop-on-first",
                                   "--hostile", "off")
            row = {"mutant": name, "where": MUTANTS[name][0], "found": bool(s["failures"]), "ops": s["ops"],
                   "sequences": s["sequences"], "seconds": secs}
            if s["failures"]:
                f = s["failures"][0]
                case = Path(f["case"])
                on_mutant = kvfuzz("replay", case).returncode
                on_shipped = kvfuzz("replay", case, "--allocator", "kvfuzz-sglang").returncode
                row.update(signature=f["signature"], original_ops=f["original_ops"], minimized_ops=f["minimized_ops"],
                           replay_on_mutant=on_mutant, replay_on_shipped=on_shipped, case=case.name)
                if a.keep:
                    Path(a.keep).mkdir(parents=True, exist_ok=True)
                    (Path(a.keep) / f"{name}.json").write_text(case.read_text())
            result["mutants"].append(row)
            print(json.dumps(row), flush=True)
    Path(a.json).write_text(json.dumps(result, indent=1) + "\n")
    killed = sum(1 for m in result["mutants"] if m["found"] and m.get("replay_on_mutant") == 1
                 and m.get("replay_on_shipped") == 0)
    rc = result["clean"]["exit"]
    print(f"killed {killed}/{len(result['mutants'])}; clean: exit {rc}, failures {result['clean']['failures']}")
    return 0 if killed == len(result["mutants"]) and rc == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
