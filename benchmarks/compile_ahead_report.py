"""The table of ``benchmarks/compile_ahead_gpu.sh``: each run with and without compiling ahead.

``python benchmarks/compile_ahead_report.py DIR``: reads ``DIR/scale-SET-PHASE-{off,on}.json``
(``scale_gpu.py``) and ``DIR/campaign-indep-{off,on}.json`` (``kvfuzz run --summary``), prints
one line per run and writes ``DIR/compile-ahead.json``. The share that matters: compile seconds
inside the timed window over its wall seconds (the issue's target: under 10%), and, for the
campaign, the share of its Triton launches that still compiled.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _ahead(report) -> dict | None:
    if not report:
        return None
    keep = ("specializations", "sequences", "launches", "compiled", "cached", "failed", "seconds", "scout_s",
            "compile_s", "processes", "skipped", "cut", "same_boundaries", "preload", "follow", "error")
    out = {k: report[k] for k in keep if k in report}
    if isinstance(out.get("failed"), list):
        out["failed"] = len(out["failed"])
    return out


def scale_rows(folder: Path) -> list[dict]:
    rows = []
    for path in sorted(folder.glob("scale-*-*-*.json")):
        data = json.loads(path.read_text())
        for phase, res in data.get("fuzz", {}).items():
            wall = res.get("wall_s") or 0.0
            rows.append({"run": path.stem, "phase": phase, "compile_ahead": data["env"].get("compile_ahead"),
                         "elements_per_s": res["elements_per_s"], "ops_per_s": round(res["ops_per_s"], 1),
                         "sequences": res["sequences"], "wall_s": wall, "compiles": res["compiles"],
                         "compile_s": res["compile_s"], "loads": res.get("loads"), "load_s": res.get("load_s"),
                         "compile_share": round(res["compile_s"] / wall, 3) if wall else None,
                         "divergences": len(res["divergences"]), "ahead": _ahead(res.get("compile_ahead"))})
    return rows


def campaign_rows(folder: Path) -> list[dict]:
    rows = []
    for path in sorted(folder.glob("campaign-*-*.json")):
        d = json.loads(path.read_text())
        launches = d.get("triton_launches") or 0
        rows.append({"run": path.stem, "ops": d["ops"], "sequences": d["sequences"], "elapsed_s": d["elapsed_s"],
                     "ops_per_s": d["ops_per_s"], "elements_per_s": d.get("elements_per_s"),
                     "steady_ops_per_s": d.get("steady_ops_per_s"), "launches": launches,
                     "compiles": d.get("compiles"), "compile_s": d.get("compile_s"), "loads": d.get("loads"),
                     "load_s": d.get("load_s"),
                     "compiled_launch_share": round(d.get("compiles", 0) / launches, 4) if launches else None,
                     "failures": len(d.get("failures", [])), "exit_code": d.get("exit_code"),
                     "ahead": _ahead(d.get("compile_ahead"))})
    return rows


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", nargs="?", default="benchmarks/results/gpu-run", help="the OUT of compile_ahead_gpu.sh")
    folder = Path(ap.parse_args(argv[1:]).folder)
    scale, campaign = scale_rows(folder), campaign_rows(folder)
    for r in scale:
        print(f"{r['phase']:22s} ahead={r['compile_ahead']:3s} {r['elements_per_s']:.3e} el/s  {r['ops_per_s']:7.1f} ops/s  "
              f"{r['sequences']:4d} seq  compiles {r['compiles']:4d} ({r['compile_s']:.2f} s, "
              f"{100 * (r['compile_share'] or 0):.1f}% of {r['wall_s']} s)  loads {r['loads']} ({r['load_s']} s)  "
              f"ahead {r['ahead']}")
    for r in campaign:
        print(f"{r['run']:22s} ops {r['ops']} ({r['ops_per_s']} ops/s, steady {r['steady_ops_per_s']})  "
              f"elements/s {r['elements_per_s']}  launches {r['launches']}  compiles {r['compiles']} "
              f"({r['compile_s']} s; {r['compiled_launch_share']} of launches)  loads {r['loads']} ({r['load_s']} s)  "
              f"exit {r['exit_code']}  ahead {r['ahead']}")
    (folder / "compile-ahead.json").write_text(json.dumps({"scale": scale, "campaign": campaign}, indent=1))
    print(f"wrote {folder / 'compile-ahead.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
