"""``kvfuzz merge OUT_DIR... --out DIR``: one result from many shards or nights.

Each input is a ``kvfuzz run --out`` directory (its case files and, where ``ci/fuzz.sh``
put it, ``summary.json``), a directory of such directories (an artifact download), or an
earlier merge's ``--out``. The merge keeps one case file per signature (the one with the
fewest ops), counts the occurrences (each shard's ``summary.json`` ``occurrences`` where
it has one, else one per case file), lists the shards that saw it and adds up the
reproduction rates (``reproduced: {k, n}`` of each shard's case). It writes the kept case
files, ``summary.json`` (``kvfuzz-merge/1``) and ``junit.xml`` into ``--out``, and prints a
short report.

Every contribution is recorded per shard (``by_shard``), and a shard is named by a hash of
what it left: so merging a merge again, or one shard twice, counts nothing twice, and the
result is the same whatever the order of the inputs. A case file or summary that cannot be
read is reported (``unreadable``) and skipped; the rest still merges.
"""

from __future__ import annotations

import hashlib
import json
import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from ..engine.case import SCHEMA as CASE_SCHEMA
from ..engine.case import Case, CaseError, write_case
from .baseline import Baseline, Known, Verdict, baseline_json

SCHEMA = "kvfuzz-merge/1"
RUN_SUMMARY = "kvfuzz-summary/1"
# What makes two case files the same case, whatever folder they sit in (for a stable choice).
_IDENTITY = ("config", "ops", "signature", "seed", "scenario", "tier", "kernels", "knobs")
# What a merge rewrites in the case it keeps (relative to its new folder, or summed over shards).
_LOCAL = ("kernels_file", "reproduced", "flaky")


class MergeUsageError(ValueError):
    """Nothing to merge, or an --out that cannot be one (exit 2)."""


@dataclass
class _Candidate:
    key: tuple
    raw: dict
    source: Path


@dataclass
class _Failure:
    signature: str
    by_shard: dict = field(default_factory=dict)  # shard id -> {occurrences, reproduced, flaky}
    candidates: list = field(default_factory=list)
    kernels: set = field(default_factory=set)
    messages: set = field(default_factory=set)  # first lines; the kept case's wins


@dataclass
class _Collection:
    shards: dict = field(default_factory=dict)  # id -> info
    failures: dict = field(default_factory=dict)  # signature -> _Failure
    unreadable: list = field(default_factory=list)  # {path, error}

    def failure(self, sig: str) -> _Failure:
        return self.failures.setdefault(sig, _Failure(sig))

    def shard(self, info: dict) -> None:
        """One shard reached twice (a merge and its own shard, a copy) is one shard."""
        old = self.shards.get(info["id"])
        if old is None or str(info.get("path")) < str(old.get("path")):
            self.shards[info["id"]] = info

    def bad(self, path, error: str) -> None:
        entry = {"path": str(Path(path).resolve()), "error": error}
        if entry not in self.unreadable:
            self.unreadable.append(entry)


@dataclass
class MergeResult:
    summary: dict
    text: str
    junit: str
    out: Path

    @property
    def exit_code(self) -> int:
        return self.summary["exit_code"]


# ---- reading --------------------------------------------------------------------------------


@dataclass
class _Dir:
    path: Path
    cases: list = field(default_factory=list)  # (path, raw dict, Case)
    summaries: list = field(default_factory=list)  # (path, raw dict)
    files: list = field(default_factory=list)  # every *.json, for the shard's hash

    @property
    def empty(self) -> bool:
        return not self.cases and not self.summaries


def _scan(path: Path, into: _Collection) -> _Dir:
    d = _Dir(path)
    for f in sorted(path.glob("*.json")):
        if f.name.startswith(".") or not f.is_file():
            continue
        try:
            data = f.read_bytes()
            d.files.append((f.name, data))
            raw = json.loads(data)
        except OSError as exc:
            into.bad(f, f"cannot read: {exc.strerror or exc}")
            continue
        except ValueError as exc:  # truncated or not JSON: a case killed mid-copy, a broken upload
            into.bad(f, f"not JSON: {exc}")
            continue
        schema = raw.get("schema") if isinstance(raw, dict) else None
        if schema == CASE_SCHEMA:
            try:
                d.cases.append((f, raw, Case.from_json(raw, f)))
            except CaseError as exc:
                into.bad(f, str(exc).removeprefix(f"{f}: "))
        elif schema in (RUN_SUMMARY, SCHEMA):
            if isinstance(raw.get("failures", []), list):
                d.summaries.append((f, raw))
            else:
                into.bad(f, "a summary whose 'failures' is not a list")
    return d


def _summary_of(d: _Dir):
    """The directory's summary: ``summary.json`` first (where ci/fuzz.sh writes it)."""
    if not d.summaries:
        return None, None
    return min(d.summaries, key=lambda s: (s[0].name != "summary.json", s[0].name))


def _shard_id(d: _Dir, summary_path: Path | None) -> str:
    digest = hashlib.sha256()
    if summary_path is not None:  # a run's summary is unique to that run (ops, elapsed, seed, shard)
        digest.update(next(data for name, data in d.files if name == summary_path.name))
    else:
        for name, data in d.files:
            digest.update(name.encode() + b"\0" + data + b"\0")
    return f"{d.path.resolve().name}@{digest.hexdigest()[:10]}"


def _count(value, default: int = 1) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def _reproduced(value) -> dict | None:
    if isinstance(value, dict) and all(isinstance(value.get(x), int) and not isinstance(value.get(x), bool)
                                       for x in ("k", "n")) and 0 <= value["k"] <= value["n"]:
        unknown = value.get("unknown")  # replays that could not run (counted neither way)
        fresh = value.get("fresh")  # replays that ran each in a fresh process
        return {"k": value["k"], "n": value["n"],
                **({"fresh": fresh} if _count(fresh, -1) >= 0 else {}),
                **({"unknown": unknown} if isinstance(unknown, int) and not isinstance(unknown, bool) and unknown > 0
                   else {})}
    return None


def _candidate(f: Path, raw: dict, case: Case) -> _Candidate:
    """Fewest ops first, then the smallest case; the rest of the file (its environment)
    breaks ties, so the choice never depends on the order of the inputs."""
    identity = json.dumps({k: raw.get(k) for k in _IDENTITY}, sort_keys=True)
    rest = json.dumps({k: v for k, v in raw.items() if k not in _LOCAL}, sort_keys=True, default=str)
    return _Candidate((len(case.ops), len(identity), identity, rest), raw, f)


def _add(contrib: dict, occurrences: int, reproduced, flaky) -> None:
    contrib["occurrences"] += occurrences
    if reproduced is not None:
        contrib["reproduced"] = _summed([r for r in (contrib["reproduced"], reproduced) if r])
    if isinstance(flaky, bool):
        contrib["flaky"] = flaky or bool(contrib["flaky"])


def _message(raw: dict) -> str | None:
    msg = (raw.get("divergence") or {}).get("message") if isinstance(raw.get("divergence"), dict) else None
    return next(iter(str(msg).splitlines()), None) if msg else None


def _shard_info(sid: str, path, summary: dict | None) -> dict:
    """What the merged summary says of a shard (from its run summary, or an earlier
    merge's record of it), with the types checked: a hand-edited summary cannot break it."""
    s = summary if isinstance(summary, dict) else {}
    opts = s.get("options") if isinstance(s.get("options"), dict) else s

    def text(value):
        return value if isinstance(value, str) else None

    health = s.get("health") if isinstance(s.get("health"), list) else []
    errors = s.get("harness_errors")
    return {"id": sid, "label": sid.rpartition("@")[0] or sid, "path": str(path), "summary": bool(s.get("summary", s)),
            "backend": text(s.get("backend")), "kernels": text(s.get("kernels")), "shard": text(opts.get("shard")),
            "seed": opts.get("seed") if isinstance(opts.get("seed"), int) else None,
            "ops": _count(s.get("ops"), 0), "sequences": _count(s.get("sequences"), 0),
            "elapsed_s": s.get("elapsed_s") if isinstance(s.get("elapsed_s"), (int, float)) else None,
            "exit_code": s.get("exit_code") if isinstance(s.get("exit_code"), int) else None,
            "interrupted": text(s.get("interrupted")), "health": [str(h) for h in health],
            "harness_errors": len(errors) if isinstance(errors, list) else _count(errors, 0)}


def _read_shard(d: _Dir, c: _Collection) -> None:
    spath, summary = _summary_of(d)
    sid = _shard_id(d, spath)
    c.shard(_shard_info(sid, d.path.resolve(), summary))
    fresh = {}  # signature -> this shard's contribution
    listed = set()
    for entry in summary.get("failures", []) if summary else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("signature"), str):
            c.bad(spath, f"a failure entry without a signature: {entry!r}"[:300])
            continue
        sig = entry["signature"]
        listed.add(sig)
        contrib = fresh.setdefault(sig, {"occurrences": 0, "reproduced": None, "flaky": None})
        contrib["occurrences"] += _count(entry.get("occurrences"))
        f = c.failure(sig)
        if isinstance(summary.get("kernels"), str):
            f.kernels.add(summary["kernels"])
        if entry.get("message"):
            f.messages.add(str(entry["message"]).splitlines()[0])
    for path, raw, case in d.cases:
        sig = str(case.signature)
        contrib = fresh.setdefault(sig, {"occurrences": 0, "reproduced": None, "flaky": None})
        _add(contrib, 0 if sig in listed else 1, _reproduced(raw.get("reproduced")), raw.get("flaky"))
        f = c.failure(sig)
        f.candidates.append(_candidate(path, raw, case))
        if case.kernels:
            f.kernels.add(case.kernels)
        f.messages.update(m for m in [_message(raw)] if m)
    for sig, contrib in fresh.items():
        c.failure(sig).by_shard.setdefault(sid, contrib)


def _read_merge(d: _Dir, c: _Collection) -> None:
    """An earlier merge: its shards and per-shard counts as they were, its cases as candidates."""
    spath, summary = _summary_of(d)
    for info in summary.get("shards") if isinstance(summary.get("shards"), list) else []:
        if isinstance(info, dict) and isinstance(info.get("id"), str) and "@" in info["id"]:
            c.shard(_shard_info(info["id"], info.get("path", "?"), info))
    for entry in summary.get("unreadable") if isinstance(summary.get("unreadable"), list) else []:
        if isinstance(entry, dict) and "path" in entry:
            c.bad(entry["path"], str(entry.get("error", "")))
    listed = set()
    for entry in summary["failures"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("signature"), str):
            c.bad(spath, f"a failure entry without a signature: {entry!r}"[:300])
            continue
        f = c.failure(entry["signature"])
        listed.add(entry["signature"])
        by_shard = entry.get("by_shard") if isinstance(entry.get("by_shard"), dict) else {}
        for sid, contrib in by_shard.items():
            if isinstance(contrib, dict) and "@" in sid:
                f.by_shard.setdefault(sid, {"occurrences": _count(contrib.get("occurrences")),
                                            "reproduced": _reproduced(contrib.get("reproduced")),
                                            "flaky": contrib.get("flaky") if isinstance(contrib.get("flaky"), bool)
                                            else None})
        kernels = entry.get("kernels") if isinstance(entry.get("kernels"), list) else []
        f.kernels.update(k for k in kernels if isinstance(k, str))
        if isinstance(entry.get("message"), str) and entry["message"]:
            f.messages.add(entry["message"])
    stray = [(p, raw, case) for p, raw, case in d.cases if str(case.signature) not in listed]
    for path, raw, case in d.cases:
        if str(case.signature) not in listed:
            continue
        f = c.failure(str(case.signature))
        f.candidates.append(_candidate(path, raw, case))
        if case.kernels:
            f.kernels.add(case.kernels)
        f.messages.update(m for m in [_message(raw)] if m)
    if stray:  # case files added to a merged folder by hand: each one seen once, by that folder
        _read_shard(_Dir(d.path, stray, [], d.files), c)


def collect(inputs) -> _Collection:
    c = _Collection()
    found_any = False
    for given in inputs:
        path = Path(given)
        if not path.exists():
            c.bad(path, "no such directory")
            continue
        if not path.is_dir():
            raise MergeUsageError(f"{path}: not a directory (give kvfuzz run --out directories)")
        found_any = True
        d = _scan(path, c)
        dirs = [d]
        if d.empty:  # a folder of shard folders (an artifact download, nightly-out/)
            subs = [_scan(sub, c) for sub in sorted(p for p in path.iterdir() if p.is_dir())]
            dirs = [s for s in subs if not s.empty] or [d]
        for one in dirs:
            if one.empty:
                if not any(e["path"].startswith(str(one.path.resolve())) for e in c.unreadable):
                    c.bad(one.path, "no case files and no summary.json")
                continue
            _, summary = _summary_of(one)
            (_read_merge if summary is not None and summary.get("schema") == SCHEMA else _read_shard)(one, c)
    if not found_any:
        raise MergeUsageError("nothing to merge: none of the inputs exists")
    if not c.shards:
        raise MergeUsageError("nothing to merge: no input has case files or a summary.json "
                              + "; ".join(f"{e['path']}: {e['error']}" for e in c.unreadable))
    return c


# ---- the merged result ----------------------------------------------------------------------


def _summed(rates: list[dict]) -> dict:
    """Rates of several shards as one: k, n and (when any shard had some) unknown, summed; fresh
    summed only when every shard says how many of its replays ran fresh (a rate whose replays
    may have run in reused processes must not read as all fresh)."""
    out = {"k": sum(r["k"] for r in rates), "n": sum(r["n"] for r in rates)}
    if all("fresh" in r for r in rates):
        out["fresh"] = sum(r["fresh"] for r in rates)
    unknown = sum(r.get("unknown", 0) for r in rates)
    return {**out, "unknown": unknown} if unknown else out


def _combined(by_shard: dict) -> tuple[int, dict | None, bool | None]:
    occurrences = sum(v["occurrences"] for v in by_shard.values())
    reps = [v["reproduced"] for v in by_shard.values() if v.get("reproduced")]
    reproduced = _summed(reps) if reps else None
    flags = [v["flaky"] for v in by_shard.values() if isinstance(v.get("flaky"), bool)]
    flaky = reproduced["k"] < reproduced["n"] if reproduced else (any(flags) if flags else None)
    return occurrences, reproduced, flaky


def _relocated(raw: dict, source: Path, out: Path) -> dict:
    """The case's ``kernels_file`` (relative to its folder) made relative to ``out``."""
    raw = dict(raw)
    kf = raw.get("kernels_file")
    if isinstance(kf, str) and (source.parent / kf).is_file():
        raw["kernels_file"] = os.path.relpath((source.parent / kf).resolve(), out.resolve())
    return raw


def _problems(shards: list[dict]) -> list[str]:
    out = []
    for s in shards:
        name = s["id"]
        if not s.get("summary"):
            out.append(f"{name}: no summary.json (occurrences counted one per case file)")
            continue
        if s.get("harness_errors") or s.get("exit_code") == 3:
            out.append(f"{name}: internal harness error (exit 3)")
        out += [f"{name}: not clean: {h}" for h in s.get("health") or []]
        if s.get("interrupted"):
            out.append(f"{name}: interrupted ({s['interrupted']})")
    return out


def _one_id_per_shard(c: _Collection) -> None:
    """A shard's id is ``folder@hash``; the same output under another folder name (a copy,
    a renamed artifact) is the same shard: keep the smallest id and count it once."""
    by_hash: dict[str, list[str]] = {}
    for sid in list(c.shards) + [s for f in c.failures.values() for s in f.by_shard]:
        ids = by_hash.setdefault(sid.rpartition("@")[2], [])
        if sid not in ids:
            ids.append(sid)
    alias = {sid: min(ids) for ids in by_hash.values() for sid in ids}
    shards = {}
    for sid, info in sorted(c.shards.items()):  # the kept id's own record (its folder), where there is one
        keep = alias[sid]
        if keep not in shards or (sid == keep and shards[keep]["id"] != keep):
            shards[keep] = info
    c.shards = {sid: dict(info, id=sid) for sid, info in shards.items()}
    for f in c.failures.values():
        merged = {}
        for sid, contrib in sorted(f.by_shard.items()):
            merged.setdefault(alias[sid], contrib)
        f.by_shard = merged


def _write_outputs(c: _Collection, out: Path, baseline: Baseline | None) -> dict:
    _one_id_per_shard(c)
    out.mkdir(parents=True, exist_ok=True)
    failures, written = [], set()
    for sig in sorted(c.failures):
        f = c.failures[sig]
        occurrences, reproduced, flaky = _combined(f.by_shard)
        entry = {"signature": sig, "case": None, "minimized_ops": None, "occurrences": occurrences,
                 "shards": sorted(f.by_shard), "reproduced": reproduced, "flaky": flaky,
                 "kernels": sorted(f.kernels), "message": min(f.messages) if f.messages else None,
                 "by_shard": dict(sorted(f.by_shard.items()))}
        if f.candidates:
            best = min(f.candidates, key=lambda k: k.key)
            entry["message"] = _message(best.raw) or entry["message"]
            raw = _relocated(best.raw, best.source, out)
            if reproduced is not None:
                raw.update(reproduced=reproduced, flaky=flaky)
            path = write_case(Case.from_json(raw, best.source), out)
            written.add(path.name)
            entry.update(case=path.name, minimized_ops=best.key[0])
        failures.append(entry)
    for stale in out.glob("*.json"):  # --out holds this merge and nothing else
        if stale.name in written or stale.name == "summary.json":
            continue
        try:
            if json.loads(stale.read_text()).get("schema") == CASE_SCHEMA:
                stale.unlink()
        except (OSError, ValueError, AttributeError):
            pass
    shards = sorted(c.shards.values(), key=lambda s: s["id"])
    verdict = None
    if baseline is not None:
        verdict = baseline.compare({f["signature"]: f["kernels"] for f in failures})
        for f in failures:
            f["status"] = "known" if verdict.is_known(f["signature"]) else "new"
    new = [f for f in failures if f.get("status", "new") == "new"]
    from .reports import kvfuzz_version

    return {
        "schema": SCHEMA,
        "kvfuzz": kvfuzz_version(),
        "shards": shards,
        "ops": sum(_count(s.get("ops"), 0) for s in shards),
        "sequences": sum(_count(s.get("sequences"), 0) for s in shards),
        "failures": failures,
        "unreadable": sorted(c.unreadable, key=lambda e: (e["path"], e["error"])),
        "problems": _problems(shards),
        "baseline": None if verdict is None else verdict.to_json(),
        "exit_code": 1 if new else 0,
    }


def text_report(summary: dict, out: Path | str) -> str:
    shards = summary["shards"]
    lines = [f"kvfuzz merge: {len(shards)} shard(s), {summary['ops']:,} ops in {summary['sequences']:,} sequences, "
             f"{len(summary['failures'])} signature(s) -> {out}"]
    b = summary.get("baseline")
    reasons = (b or {}).get("reasons", {})
    for f in summary["failures"]:
        status = f.get("status", "new")
        rep = f", reproduced {f['reproduced']['k']}/{f['reproduced']['n']}" if f.get("reproduced") else ""
        rep += " (flaky)" if f.get("flaky") else ""
        where = f": {Path(out) / f['case']}" if f["case"] else ": no readable case file"
        why = f"  [{reasons.get(f['signature']) or 'in the baseline'}]" if status == "known" else ""
        lines.append(f"  {status.upper():<6} {f['signature']}  {f['occurrences']}x in {len(f['shards'])} shard(s)"
                     + (f", {f['minimized_ops']} ops" if f["minimized_ops"] is not None else "") + rep + where + why)
    for sig in (b or {}).get("no_longer_seen", []):
        lines.append(f"  NO LONGER SEEN (fixed?) {sig}  [{reasons.get(sig) or 'in the baseline'}]")
    for e in summary["unreadable"]:
        lines.append(f"  UNREADABLE {e['path']}: {e['error']} (skipped)")
    for p in summary["problems"]:
        lines.append(f"  PROBLEM {p}")
    n_new = sum(f.get("status", "new") == "new" for f in summary["failures"])
    tail = f"kvfuzz merge: {n_new} new"
    if b is not None:
        tail += f", {len(b['known'])} known, {len(b['no_longer_seen'])} no longer seen (baseline {b['source']})"
    lines.append(tail + f"; exit {summary['exit_code']}")
    return "\n".join(lines)


def junit_xml(summary: dict, out: Path | str) -> str:
    """New failures fail, known ones are skipped with the baseline's reason, signatures no
    longer seen pass with a note, and each shard merged is a passing test case."""
    suite = ET.Element("testsuite", name="kvfuzz-merge", tests="0", failures="0", errors="0", skipped="0", time="0")
    n = failed = skipped = 0
    b = summary.get("baseline") or {}
    reasons = b.get("reasons", {})
    for f in summary["failures"]:
        tc = ET.SubElement(suite, "testcase", classname="kvfuzz.merge", name=f["signature"], time="0")
        detail = (f"case file: {f['case'] or '(none readable)'} (in the merge's --out)\n"
                  f"occurrences: {f['occurrences']} in shards {', '.join(f['shards'])}\n"
                  + (f"reproduced: {f['reproduced']['k']}/{f['reproduced']['n']}\n" if f.get("reproduced") else ""))
        n += 1
        if f.get("status") == "known":
            reason = reasons.get(f["signature"]) or "in the baseline"
            ET.SubElement(tc, "skipped", message=f"known failure: {reason}"[:500]).text = detail
            skipped += 1
        else:
            oracle = f["signature"].split("/")[1] if f["signature"].count("/") >= 2 else "divergence"
            ET.SubElement(tc, "failure", message=str(f.get("message") or "")[:500], type=oracle).text = detail
            failed += 1
    for sig in b.get("no_longer_seen", []):
        tc = ET.SubElement(suite, "testcase", classname="kvfuzz.merge.baseline", name=sig, time="0")
        ET.SubElement(tc, "system-out").text = (f"in the baseline ({reasons.get(sig) or 'no reason given'}) "
                                                f"but not found in any shard: fixed?")
        n += 1
    for e in summary["unreadable"]:
        tc = ET.SubElement(suite, "testcase", classname="kvfuzz.merge.input", name=f"unreadable: {e['path']}",
                           time="0")
        ET.SubElement(tc, "skipped", message=f"unreadable input, skipped: {e['error']}"[:500])
        n, skipped = n + 1, skipped + 1
    for s in summary["shards"]:
        tc = ET.SubElement(suite, "testcase", classname="kvfuzz.merge.shard", name=s["id"], time="0")
        ET.SubElement(tc, "system-out").text = (f"{s['path']}: {s.get('ops', '?')} ops, backend {s.get('backend')}, "
                                                f"kernels {s.get('kernels')}, shard {s.get('shard')}")
        n += 1
    if summary["problems"]:
        ET.SubElement(suite, "system-err").text = "\n".join(summary["problems"])
    for attr, value in (("tests", n), ("failures", failed), ("skipped", skipped)):
        suite.set(attr, str(value))
    root = ET.Element("testsuites")
    root.append(suite)
    return ET.tostring(root, encoding="unicode", xml_declaration=True)


def merge(inputs, out, *, baseline: Baseline | None = None) -> MergeResult:
    """Read every input, then write the merged case files, ``summary.json`` and
    ``junit.xml`` into ``out`` (which may be one of the inputs)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise MergeUsageError(f"--out {out}: is a file, not a directory")
    inputs = list(inputs)
    if not inputs:
        raise MergeUsageError("nothing to merge: give one or more kvfuzz run --out directories")
    c = collect(inputs)
    summary = _write_outputs(c, out, baseline)
    from .reports import dumps, write

    junit = junit_xml(summary, out)
    write(str(out / "summary.json"), dumps(summary))
    write(str(out / "junit.xml"), junit)
    return MergeResult(summary, text_report(summary, out), junit, out)


def accepted_baseline(summary: dict, baseline: Baseline | None) -> dict:
    """A ``kvfuzz-baseline/1`` that accepts every failure of this merge, keeping the old
    baseline's entries (their reasons, and those not seen this time)."""
    entries = {k.signature: k for k in (baseline.known if baseline else [])}
    for f in summary["failures"]:
        if f["signature"] not in entries:
            entries[f["signature"]] = Known(f["signature"], f"accepted from a merge: {f.get('message') or ''}"[:200])
    return baseline_json(entries.values())


__all__ = ["MergeResult", "MergeUsageError", "Verdict", "accepted_baseline", "collect", "junit_xml", "merge",
           "text_report"]
