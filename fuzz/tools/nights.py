"""Nights over time: the history file the nightly appends to, and what changed since the night before.

The history is JSON lines, one ``kvfuzz-night/1`` record per night (``night.record``): the
signatures seen, the features reached (in total and per kernel, by name), ops and elements
per second, the time to the first finding. A night reported twice (the same summaries, so
the same ``id``) is one line: appending it again replaces it. A line that is not a record
(a truncated write, a hand edit) is skipped and said, never fatal.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .night import NIGHT, ReportUsageError

SHOWN_NIGHTS = 60  # nights drawn in the trends; the history file keeps them all


def load_history(path) -> tuple[list[dict], list[str]]:
    """(records, problems) of the history file ``path``; a missing file is no nights yet."""
    p = Path(path)
    if p.is_dir():
        raise ReportUsageError(f"--history {path}: is a directory; give a file (JSON lines)")
    if not p.exists():
        return [], []
    records, problems = [], []
    for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as exc:
            problems.append(f"{path}:{n}: not JSON ({exc}): skipped")
            continue
        if not isinstance(rec, dict) or rec.get("schema") != NIGHT or not isinstance(rec.get("id"), str):
            problems.append(f"{path}:{n}: not a {NIGHT} record: skipped")
            continue
        if not _well_typed(rec):
            problems.append(f"{path}:{n}: a {NIGHT} record with a field of the wrong type: skipped")
            continue
        records.append(rec)
    return records, problems


def _well_typed(rec: dict) -> bool:
    """What the trends read of a record has the types ``night.record`` writes (a hand edit may not)."""
    lists = all(isinstance(rec.get(k, []), list) and all(isinstance(x, str) for x in rec.get(k, []))
                for k in ("signatures", "new", "no_longer_seen"))
    reached = rec.get("reached", {})
    kernels = isinstance(reached, dict) and all(isinstance(v, list) for v in reached.values())
    numbers = all(rec.get(k) is None or (isinstance(rec[k], (int, float)) and not isinstance(rec[k], bool))
                  for k in ("features", "ops", "ops_per_s", "elements_per_s", "first_finding_s"))
    return lists and kernels and numbers


def append_history(path, rec: dict) -> None:
    """Add ``rec`` to the history (replacing a line of the same night), atomically."""
    records, _ = load_history(path)
    lines = [json.dumps(r, sort_keys=True) for r in records if r["id"] != rec["id"]]
    lines.append(json.dumps(rec, sort_keys=True))
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(p)


def sequence(history: list[dict], nights: list[dict]) -> list[dict]:
    """The nights in order: the history's, then the directories given (oldest first); one
    record per night, the later copy kept where a night is in both."""
    out: dict[str, dict] = {}
    for rec in history + nights:
        out.pop(rec["id"], None)
        out[rec["id"]] = rec
    return list(out.values())


def since(prev: dict | None, now: dict) -> dict | None:
    """What changed from night ``prev`` to night ``now``: signatures met for the first time,
    signatures no longer seen, and per kernel the features no longer reached."""
    if prev is None:
        return None
    before, after = set(prev.get("signatures") or []), set(now.get("signatures") or [])
    lost = {}
    for kernel, names in (prev.get("reached") or {}).items():
        gone = sorted(set(names) - set((now.get("reached") or {}).get(kernel) or []))
        if gone:
            lost[kernel] = gone
    gained = {}
    for kernel, names in (now.get("reached") or {}).items():
        new = sorted(set(names) - set((prev.get("reached") or {}).get(kernel) or []))
        if new:
            gained[kernel] = new
    return {"prev": prev.get("label"), "prev_date": prev.get("date"), "new": sorted(after - before),
            "fixed": sorted(before - after), "still": sorted(after & before), "lost": lost, "gained": gained}
