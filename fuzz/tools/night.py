"""What one night left, read into one plain dict: the data of the morning page (``page``).

A night is a directory ``ci/nightly.sh`` filled (``KVFUZZ_OUT``): a ``summary.json`` per
campaign (``cases/``, ``guided/``, ``production/``, ``letter/SET-SCALE/``; or a ``kvfuzz
merge`` result, ``kvfuzz-merge/1``), the case files beside them, ``coverage.json`` or
``coverage.txt``, ``mutants.txt`` and ``bench.json``. Only JSON and text are read: no torch,
no Triton, no GPU, so the page is built wherever the artifacts land.

A long night can hold thousands of signatures: each is counted, but only the first
``DETAILED`` (new ones first, then the most frequent) have their case file read and are
shown in full, the next ``LISTED`` get a row, and the rest are "and N more".
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime, timezone
from pathlib import Path

from ..engine.stacks import brief
from ..engine.verdict import never_again

RUN = "kvfuzz-summary/1"
MERGE = "kvfuzz-merge/1"
NIGHT = "kvfuzz-night/1"  # a night's line in the history file (``record``)
DETAILED = 25
LISTED = 200
SHOWN_VALUES = 24  # of a divergence's spec / target values, shown before "..."


class ReportUsageError(ValueError):
    """No night to report on, or an input that is not one (the CLI's exit 2)."""


def _num(value, default=0):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value) -> list:
    return value if isinstance(value, list) else []


# ---- campaigns --------------------------------------------------------------------------------


def _campaign(path: Path, raw: dict, root: Path) -> dict:
    rel = path.parent.relative_to(root).as_posix()
    opts = _dict(raw.get("options"))
    c = {"name": rel if rel != "." else root.name, "dir": str(path.parent), "schema": raw.get("schema"),
         "backend": raw.get("backend"), "kernels": raw.get("kernels"), "allocator": raw.get("allocator"),
         "scale": opts.get("scale"), "seed": opts.get("seed"), "shard": opts.get("shard"),
         "ops": _num(raw.get("ops")), "sequences": _num(raw.get("sequences")),
         "elapsed_s": _num(raw.get("elapsed_s"), None), "ops_per_s": _num(raw.get("ops_per_s"), None),
         "elements": _num(raw.get("elements_checked")), "elements_per_s": _num(raw.get("elements_per_s"), None),
         "by_kind": _dict(raw.get("by_kind")), "hostile": _dict(raw.get("hostile_classes")),
         "not_applicable": _dict(raw.get("not_applicable")), "far_ops": raw.get("far_ops"),
         "exit_code": raw.get("exit_code"), "health": [str(h) for h in _list(raw.get("health"))],
         "harness_errors": len(_list(raw.get("harness_errors"))), "interrupted": raw.get("interrupted"),
         "stopped_by": raw.get("stopped_by"), "notes": [str(n) for n in _list(raw.get("notes"))],
         "feature_timeline": [p for p in _list(raw.get("feature_timeline")) if isinstance(p, list) and len(p) == 3],
         "features": _dict(raw.get("features")), "baseline": raw.get("baseline") if isinstance(raw.get("baseline"), dict)
         else None, "letter": rel.startswith("letter/")}
    if raw.get("schema") == MERGE:  # a merge of shards: its totals, the shards' backends and kernel sets
        shards = [s for s in _list(raw.get("shards")) if isinstance(s, dict)]
        c["backend"] = ", ".join(sorted({str(s.get("backend")) for s in shards if s.get("backend")})) or None
        c["kernels"] = ", ".join(sorted({str(s.get("kernels")) for s in shards if s.get("kernels")})) or None
        c["elapsed_s"] = sum(_num(s.get("elapsed_s")) for s in shards) or None
        c["shards"] = len(shards)
        c["problems"] = [str(p) for p in _list(raw.get("problems"))]
    return c


def _case_path(given, summary_dir: Path) -> Path | None:
    """Where a failure's case file is now: as the summary names it, else beside the summary
    (an artifact downloaded elsewhere keeps its folder, not the CI machine's absolute path)."""
    if not isinstance(given, str) or not given:
        return None
    p = Path(given)
    for cand in ((p if p.is_absolute() else summary_dir / p), summary_dir / p.name):
        if cand.is_file():
            return cand.resolve()
    return None


def _findings(raw: dict, campaign: dict, summary_dir: Path) -> list[dict]:
    out = []
    for f in _list(raw.get("failures")):
        if not isinstance(f, dict) or not isinstance(f.get("signature"), str):
            continue
        known = f.get("status") == "known" if "status" in f else bool(f.get("known"))
        kernels = f.get("kernels")
        out.append({"signature": f["signature"], "status": "known" if known else "new", "campaign": campaign["name"],
                    "kernels": ", ".join(kernels) if isinstance(kernels, list) else campaign["kernels"],
                    "allocator": campaign["allocator"], "tier": campaign["backend"],
                    "occurrences": _num(f.get("occurrences"), 1), "reproduced": f.get("reproduced")
                    if isinstance(f.get("reproduced"), dict) else None, "flaky": f.get("flaky"),
                    "found_after_s": _num(f.get("found_after_s"), None), "minimized_ops": f.get("minimized_ops"),
                    "message": f.get("message"), "case": _case_path(f.get("case"), summary_dir),
                    "case_named": f.get("case")})
    return out


def _ops_text(ops) -> list[str]:
    """The ops as the op language prints them (``Op.__str__``); an op this kvfuzz cannot
    parse (a newer case file) as its JSON."""
    try:
        from ..engine.kinds import parse_ops

        return [str(op) for op in parse_ops(ops)]
    except Exception:  # noqa: BLE001 - a page must still show what the file holds
        return [json.dumps(op) for op in _list(ops)]


def _values(v) -> str:
    text = json.dumps(v)
    if isinstance(v, list) and len(v) > SHOWN_VALUES:
        text = json.dumps(v[:SHOWN_VALUES])[:-1] + f", ... ({len(v)} values)]"
    return text


def _detail(finding: dict) -> None:
    """Read the finding's case file: its minimized ops and its divergence, spec vs target."""
    finding["ops"], finding["divergence"] = None, None
    if finding["case"] is None:
        return
    try:
        raw = json.loads(finding["case"].read_text())
    except (OSError, ValueError) as exc:
        finding["case_error"] = f"unreadable case file: {exc}"
        return
    finding["ops"] = _ops_text(_list(raw.get("ops")))
    d = _dict(raw.get("divergence"))
    fault = _dict(raw.get("fault"))
    finding["divergence"] = {"step": d.get("step"), "message": d.get("message"), "oracle": d.get("oracle"),
                             "field": d.get("field"),
                             "spec": _values(d["spec"]) if "spec" in d else None,
                             "target": _values(d["target"]) if "target" in d else None,
                             "fault": "\n".join(brief([str(x) for x in _list(fault.get("stack"))], 8)  # a hang: where
                                                or [str(x) for x in _list(fault.get("stderr_tail"))[-8:]]) or None}
    finding["config"] = raw.get("config")
    finding["seed"] = raw.get("seed")
    finding["tier"] = raw.get("tier") or finding["tier"]


# ---- what else a night left -----------------------------------------------------------------


_KILLED = re.compile(r"^(\S+)\s+killed in\s+([\d.]+) s,\s+(\d+) ops, case (\d+) -> (\d+) ops, (\S+)")
_SURVIVED = re.compile(r"^(\S+)\s+SURVIVED\s+([\d.]+) s \((\d+) ops\)")


def mutants(text: str) -> dict:
    """``kvfuzz mutants``' lines: each mutant, killed (seconds, ops, signature) or survived."""
    rows, total = [], None
    for line in text.splitlines():
        if m := _KILLED.match(line):
            rows.append({"mutant": m[1], "killed": True, "seconds": float(m[2]), "ops": int(m[3]),
                         "case": f"{m[4]} -> {m[5]} ops", "signature": m[6]})
        elif m := _SURVIVED.match(line):
            rows.append({"mutant": m[1], "killed": False, "seconds": float(m[2]), "ops": int(m[3])})
        elif line.startswith("kvfuzz mutants:") and "killed" in line:
            total = line.removeprefix("kvfuzz mutants:").strip()
    return {"rows": rows, "total": total}


def coverage_from_text(text: str) -> dict:
    """``kvfuzz coverage``'s text, where the night kept no JSON: per kernel, the number reached
    and the never-reached lines; per file, the functions with lines never run."""
    kernels, code, features = {}, {}, {}
    current = None
    for line in text.splitlines():
        if m := re.match(r"corpus: (\d+) entries, features by domain: (.*)", line):
            features = {d: int(n) for d, n in re.findall(r"(\w+) (\d+)", m[2])}
        elif m := re.match(r"(\w+): reached (\d+)", line):
            kernels[m[1]] = {"reached_n": int(m[2]), "reached": [], "never": []}
        elif m := re.match(r"  never: (\w+): (.*)", line):
            kernels.setdefault(m[1], {"reached_n": 0, "reached": [], "never": []})["never"].append(m[2])
        elif m := re.match(r"(\S+\.py): (\d+) lines in functions, (\d+) never ran", line):
            current = code[m[1]] = {"lines": int(m[2]), "never": int(m[3]), "functions": []}
        elif current is not None and line.startswith("  "):
            current["functions"].append(line.strip())
    return {"features": features, "kernels": kernels, "code": code}


def coverage_from_json(rep: dict) -> dict:
    kernels = {k: {"reached_n": len(_list(v.get("reached"))), "reached": _list(v.get("reached")),
                   "never": _list(v.get("never"))} for k, v in _dict(rep.get("kernels")).items() if isinstance(v, dict)}
    chain = _dict(rep.get("chain"))
    if chain.get("reached") or chain.get("never"):  # a chain of pools' features, a row as the text's "chain:" line
        kernels["chain"] = {"reached_n": len(_list(chain.get("reached"))), "reached": _list(chain.get("reached")),
                            "never": _list(chain.get("never"))}
    code = {}
    for short, per in _dict(rep.get("code")).items():
        per = {fn: v for fn, v in _dict(per).items() if isinstance(v, dict)}
        fns = []
        for fn, v in sorted(per.items()):
            never = _list(v.get("never"))
            if never:
                fns.append(f"{fn}: never entered" if len(never) >= _num(v.get("lines")) else
                           f"{fn}: {len(never)} of {v.get('lines')} lines never ran: "
                           + ", ".join(map(str, never[:12])) + (" ..." if len(never) > 12 else ""))
        code[short] = {"lines": sum(_num(v.get("lines")) for v in per.values()),
                       "never": sum(len(_list(v.get("never"))) for v in per.values()), "functions": fns}
    return {"features": _dict(rep.get("features")), "kernels": kernels, "code": code}


def _coverage(root: Path) -> dict | None:
    try:
        if (root / "coverage.json").is_file():
            return coverage_from_json(json.loads((root / "coverage.json").read_text()))
        if (root / "coverage.txt").is_file():
            return coverage_from_text((root / "coverage.txt").read_text())
    except (OSError, ValueError, AttributeError):
        return None
    return None


def _bench(root: Path) -> list[dict]:
    try:
        rep = json.loads((root / "bench.json").read_text())
    except (OSError, ValueError):
        return []
    return [r for r in _list(_dict(rep).get("fuzz")) if isinstance(r, dict)]


# ---- one night --------------------------------------------------------------------------------


def _summaries(root: Path) -> tuple[list, list]:
    found, unreadable = [], []
    for f in sorted(root.rglob("summary.json")):
        try:
            raw = json.loads(f.read_text())
        except (OSError, ValueError) as exc:
            unreadable.append({"path": str(f), "error": str(exc)})
            continue
        if isinstance(raw, dict) and raw.get("schema") in (RUN, MERGE):
            found.append((f, raw))
    return found, unreadable


def read_night(path) -> dict:
    """The night in directory ``path`` (see the module's docstring)."""
    root = Path(path)
    if not root.is_dir():
        raise ReportUsageError(f"{path}: not a directory (give a night's output: ci/nightly.sh's KVFUZZ_OUT, "
                               f"a kvfuzz run --out or a kvfuzz merge --out)")
    found, unreadable = _summaries(root)
    if not found:
        raise ReportUsageError(f"{path}: no summary.json (kvfuzz-summary/1 or kvfuzz-merge/1) under it"
                               + "".join(f"; {u['path']}: {u['error']}" for u in unreadable))
    campaigns, findings = [], []
    digest = hashlib.sha256()
    for f, raw in found:
        c = _campaign(f, raw, root)
        campaigns.append(c)
        findings += _findings(raw, c, f.parent)
        digest.update(f.read_bytes())
    # within new and known, a finding none of whose fresh replays failed again comes after every one
    # that did: a stall of a loaded host reads last, not first because it was met often
    findings.sort(key=lambda x: (x["status"] != "new", never_again(x["reproduced"]), -x["occurrences"],
                                 x["signature"], x["campaign"]))
    for f in findings[:DETAILED]:
        _detail(f)
    mtime = max(f.stat().st_mtime for f, _ in found)
    seen = {f["signature"] for f in findings}
    no_longer = sorted({s for c in campaigns for s in _list(_dict(c["baseline"]).get("no_longer_seen"))} - seen)
    reasons = {k: v for c in campaigns for k, v in _dict(_dict(c["baseline"]).get("reasons")).items()}
    mut = None
    if (root / "mutants.txt").is_file():
        mut = mutants((root / "mutants.txt").read_text(errors="replace"))
    return {"label": root.resolve().name, "dir": str(root.resolve()), "id": digest.hexdigest()[:12],
            "date": datetime.fromtimestamp(mtime, timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "campaigns": campaigns, "findings": findings, "no_longer_seen": no_longer, "reasons": reasons,
            "unreadable": unreadable, "coverage": _coverage(root), "mutants": mut, "bench": _bench(root)}


def exit_code(night: dict) -> int:
    """The night's worst: 3 a harness error, 1 a new signature, 2 a run not clean, 0 clean."""
    codes = {c["exit_code"] for c in night["campaigns"] if isinstance(c["exit_code"], int)}
    return next((c for c in (3, 1, 2) if c in codes), 0)


# ---- the night as one line of history ---------------------------------------------------------


def record(night: dict) -> dict:
    """What the nights-over-time trends need of a night (a line of the history file)."""
    work = [c for c in night["campaigns"] if not c["letter"]]
    elapsed = sum(_num(c["elapsed_s"]) for c in work)
    prod = [c for c in work if c["elements"]]
    cov = night["coverage"] or {}
    guided = [c for c in work if c["features"]]
    features = sum(_num(n) for n in _dict(cov.get("features")).values()) or \
        max((sum(_num(n) for n in _dict(c["features"].get("by_domain")).values()) for c in guided), default=None)
    firsts = [f["found_after_s"] for f in night["findings"] if f["found_after_s"] is not None]
    return {"schema": NIGHT, "id": night["id"], "label": night["label"], "date": night["date"],
            "signatures": sorted({f["signature"] for f in night["findings"]}),
            "new": sorted({f["signature"] for f in night["findings"] if f["status"] == "new"}),
            "no_longer_seen": night["no_longer_seen"], "features": features,
            "reached": {k: v["reached"] for k, v in _dict(cov.get("kernels")).items() if v.get("reached")},
            "ops": sum(c["ops"] for c in work), "ops_per_s": round(sum(c["ops"] for c in work) / elapsed, 1)
            if elapsed else None,
            "elements_per_s": round(sum(c["elements"] for c in prod) / sum(_num(c["elapsed_s"]) for c in prod), 1)
            if prod and sum(_num(c["elapsed_s"]) for c in prod) else None,
            "first_finding_s": min(firsts) if firsts else None, "exit_code": exit_code(night)}
