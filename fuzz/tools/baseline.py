"""Known failures: a baseline a night is compared against, so only new failures fail it.

A baseline is either

- a small JSON file, ``{"schema": "kvfuzz-baseline/1", "known": [{"signature":
  "op/oracle/field", "reason": "...", "kernels": "name" or ["name", ...]}]}`` (``reason``
  and ``kernels`` optional; without ``kernels`` an entry matches every kernel set), or
- a directory of accepted case files (``kvfuzz-case/1``; each case's signature is known,
  its ``note`` or ``reason`` key the reason), e.g. last night's ``kvfuzz merge --out``, or
- a ``summary.json`` of ``kvfuzz run`` / ``kvfuzz merge`` (the signatures it failed on).

``compare`` splits what a run or a merge found into **new** (not in the baseline: these,
and only these, fail it), **known** and **no longer seen** (in the baseline, not found
this time: fixed, or just not reached by this run).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from ..engine.case import SCHEMA as CASE_SCHEMA
from ..engine.case import CaseError, Signature

SCHEMA = "kvfuzz-baseline/1"
SUMMARY_SCHEMAS = ("kvfuzz-summary/1", "kvfuzz-merge/1")


class BaselineError(CaseError):
    """A baseline that cannot be read (exit 2, like any file kvfuzz cannot read)."""


def kernels_name(kernels: str | None) -> str | None:
    """How kernel sets are compared: a ``.py`` file by its stem (it moves between
    checkouts), a module by its dotted name."""
    if not kernels:
        return None
    return Path(kernels).stem if kernels.endswith(".py") else kernels


@dataclass(frozen=True)
class Known:
    signature: str
    reason: str | None = None
    kernels: tuple[str, ...] | None = None  # None: any kernel set

    def matches(self, signature: str, kernels: Iterable[str | None] = ()) -> bool:
        """Whether a failure with ``signature``, seen with these kernel sets, is this one."""
        if signature != self.signature:
            return False
        if self.kernels is None:
            return True
        mine = {kernels_name(k) for k in self.kernels}
        seen = {kernels_name(k) for k in kernels if k}
        return bool(seen) and seen <= mine

    def to_json(self) -> dict:
        out = {"signature": self.signature, "reason": self.reason}
        if self.kernels is not None:
            out["kernels"] = list(self.kernels)
        return out


@dataclass
class Verdict:
    """What was found, against a baseline. Lists are of signatures (``op/oracle/field``),
    sorted; ``reasons`` has the baseline's reason for each known and no-longer-seen one."""

    source: str
    new: list[str] = field(default_factory=list)
    known: list[str] = field(default_factory=list)
    no_longer_seen: list[str] = field(default_factory=list)
    reasons: dict[str, str | None] = field(default_factory=dict)

    def is_known(self, signature) -> bool:
        return str(signature) in self.known

    def to_json(self) -> dict:
        return {"source": self.source, "new": self.new, "known": self.known, "no_longer_seen": self.no_longer_seen,
                "reasons": self.reasons}

    def text(self) -> str:
        return (f"baseline {self.source}: {len(self.new)} new, {len(self.known)} known, "
                f"{len(self.no_longer_seen)} no longer seen")


@dataclass
class Baseline:
    source: str
    known: list[Known] = field(default_factory=list)

    def lookup(self, signature, kernels: Iterable[str | None] = ()) -> Known | None:
        kernels = list(kernels)
        return next((k for k in self.known if k.matches(str(signature), kernels)), None)

    def compare(self, found: Mapping[str, Iterable[str | None]]) -> Verdict:
        """``found``: each signature found, with the kernel sets it was found with."""
        v = Verdict(self.source)
        for sig, kernels in sorted(found.items()):
            entry = self.lookup(sig, kernels)
            if entry is None:
                v.new.append(sig)
            else:
                v.known.append(sig)
                v.reasons[sig] = entry.reason
        for entry in self.known:
            if entry.signature not in found and entry.signature not in v.no_longer_seen:
                v.no_longer_seen.append(entry.signature)
                v.reasons[entry.signature] = entry.reason
        v.no_longer_seen.sort()
        v.reasons = dict(sorted(v.reasons.items()))
        return v


def _signature_text(value, where: str) -> str:
    if isinstance(value, dict):
        return str(Signature.from_json(value))
    if isinstance(value, str) and len(value.split("/", 2)) == 3 and all(value.split("/", 2)):
        return value
    raise BaselineError(f"{where}: a signature is 'op/oracle/field' (or {{op, oracle, field}}), got {value!r}")


def _entry(item, where: str) -> Known:
    if isinstance(item, str):
        return Known(_signature_text(item, where))
    if not isinstance(item, dict) or "signature" not in item:
        raise BaselineError(f"{where}: each 'known' entry is {{signature, reason?, kernels?}}, got {item!r}")
    reason = item.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise BaselineError(f"{where}: 'reason' must be a string, got {reason!r}")
    kernels = item.get("kernels")
    if isinstance(kernels, str):
        kernels = (kernels,)
    elif kernels is not None:
        if not isinstance(kernels, list) or not all(isinstance(k, str) for k in kernels):
            raise BaselineError(f"{where}: 'kernels' must be a name or a list of names, got {kernels!r}")
        kernels = tuple(kernels)
    return Known(_signature_text(item["signature"], where), reason, kernels)


def _from_directory(path: Path) -> Baseline:
    from ..engine.case import Case

    known: dict[str, Known] = {}
    for f in sorted(path.glob("*.json")):
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError) as exc:
            raise BaselineError(f"baseline {f}: cannot read: {exc}") from None
        if not isinstance(data, dict) or data.get("schema") != CASE_SCHEMA:
            continue  # a summary.json beside the cases, bench output, ...
        case = Case.from_json(data, f)
        reason = data.get("reason") or data.get("note") or f"accepted case {f.name}"
        known.setdefault(str(case.signature), Known(str(case.signature), str(reason)))
    return Baseline(str(path), sorted(known.values(), key=lambda k: k.signature))


def load_baseline(path) -> Baseline:
    """A baseline from a ``kvfuzz-baseline/1`` file, a directory of case files, or a
    run's or merge's ``summary.json``. Raises BaselineError when it cannot be read: a
    broken baseline would turn every known failure into a new one."""
    path = Path(path)
    if path.is_dir():
        return _from_directory(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise BaselineError(f"baseline {path}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise BaselineError(f"baseline {path}: not JSON: {exc}") from None
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema == SCHEMA:
        items = data.get("known", [])
        if not isinstance(items, list):
            raise BaselineError(f"baseline {path}: 'known' must be a list")
        return Baseline(str(path), [_entry(item, f"baseline {path}") for item in items])
    if schema in SUMMARY_SCHEMAS:
        sigs = sorted({f["signature"] for f in data.get("failures", []) if isinstance(f, dict) and "signature" in f})
        return Baseline(str(path), [Known(_signature_text(s, f"baseline {path}"), f"in {path.name}") for s in sigs])
    raise BaselineError(f"baseline {path}: schema {schema!r} is none of {SCHEMA!r}, {', '.join(SUMMARY_SCHEMAS)} "
                        f"(or give a directory of case files)")


def baseline_json(entries: Iterable[Known]) -> dict:
    return {"schema": SCHEMA, "known": [e.to_json() for e in sorted(entries, key=lambda e: e.signature)]}


def run_exit_code(summary, verdict: Verdict | None) -> int:
    """``kvfuzz run``'s exit code with a baseline: 3 harness error; 1 only for a new
    signature; 2 not clean for another reason (the health checks); 0 clean or only known."""
    if verdict is None:
        return summary.exit_code
    return 3 if summary.harness_errors else 1 if verdict.new else 2 if summary.health else 0
