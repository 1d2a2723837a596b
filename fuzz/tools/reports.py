"""What a campaign leaves for CI: a JSON summary, JUnit XML, and a statistics table.

- ``summary_json``: ops, sequences, rates, counts per op kind and per scenario, contract
  ops and the hostile classes probed, every signature found with its case file, elapsed
  time, versions and the kernel set's hash;
- ``junit_xml``: one test case per signature found (a failure) and one passing test case
  per op kind exercised, so a CI system shows what was fuzzed, not just what broke;
- ``stats_table``: the same counts as text, the way Hypothesis prints its statistics.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path


def kvfuzz_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("kvfuzz")
    except metadata.PackageNotFoundError:
        return "unknown"


def summary_json(summary, *, backend: str, kernels: str, kernels_sha256: str | None, options: dict,
                 baseline=None, allocator: str | None = None) -> dict:
    """``baseline``: a ``fuzz.tools.baseline.Verdict``; then each failure says whether it is
    known, a ``baseline`` block lists new / known / no longer seen, and the exit code is
    the one against the baseline (1 only for a new signature)."""
    from ..engine.allocators import DEFAULT, source_hash
    from ..environment import environment

    data = {
        "schema": "kvfuzz-summary/1",
        "backend": backend,
        "kernels": kernels,
        "kernels_sha256": kernels_sha256,
        "allocator": allocator or DEFAULT,
        "allocator_sha256": source_hash(allocator or DEFAULT),
        "options": options,
        "ops": summary.ops,
        "sequences": summary.sequences,
        "ops_per_s": round(summary.ops_per_s, 1),
        "steady_ops_per_s": None if summary.steady_ops_per_s is None else round(summary.steady_ops_per_s, 1),
        "elapsed_s": round(summary.elapsed_s, 3),
        "by_kind": dict(sorted(summary.by_kind.items())),
        "by_scenario": dict(sorted(summary.by_scenario.items())),
        "contract_ops": summary.contract_ops,
        "elements_checked": summary.elements,
        "elements_per_s": round(summary.elements / summary.elapsed_s, 1) if summary.elapsed_s > 0 else 0.0,
        "hostile_classes": dict(sorted(summary.hostile.items())),
        "triton_launches": summary.launches,
        "compile_s": round(getattr(summary, "compile_s", 0.0), 2),
        "compiles": getattr(summary, "compiles", 0),
        "loads": getattr(summary, "loads", 0),
        "load_s": round(getattr(summary, "load_s", 0.0), 2),
        "compile_ahead": getattr(summary, "compile_ahead", None),
        "not_applicable": dict(getattr(summary, "not_applicable", {})),
        "far_ops": getattr(summary, "far_ops", None),
        "faults": summary.faults,
        "restarts": summary.restarts,
        "op_timeout_s": getattr(summary, "op_timeout_s", None),
        "notes": getattr(summary, "notes", []),
        "workers": getattr(summary, "workers", []),
        "interrupted": summary.interrupted,
        "stopped_by": getattr(summary, "stopped_by", "budget"),
        "timeline": {k: round(v, 3) for k, v in getattr(summary, "timeline", {}).items()},
        "feature_timeline": getattr(summary, "feature_timeline", []),
        "health": summary.health,
        "harness_errors": summary.harness_errors,
        "failures": [{"signature": str(c.signature), "case": str(p), "seed": c.seed,
                      "original_ops": c.lengths.get("original"), "minimized_ops": c.lengths.get("minimized"),
                      "occurrences": summary.occurrences.get(c.signature, 1),
                      "found_after_s": round(summary.found_after.get(c.signature, 0.0), 3),
                      "confirm_timeline": {k: round(v, 3) for k, v in
                                           getattr(summary, "confirm_timeline", {}).get(c.signature, {}).items()},
                      "confirm_work": getattr(summary, "confirm_work", {}).get(c.signature),
                      "reproduced": c.reproduced, "flaky": bool(c.flaky), "mode": c.mode,
                      "needs_history": bool((c.history or {}).get("sequences")),
                      "history_note": (c.history or {}).get("note"),
                      "minimal": c.minimal, "nondeterministic": bool(c.nondeterministic),
                      "message": (c.divergence or {}).get("message")}
                     for c, p in zip(summary.cases, summary.paths)],
        "versions": {**environment(), "kvfuzz": kvfuzz_version()},
        "exit_code": summary.exit_code,
    }
    if baseline is not None:
        from .baseline import run_exit_code

        for f in data["failures"]:
            f["known"] = baseline.is_known(f["signature"])
        data["baseline"] = baseline.to_json()
        data["exit_code"] = run_exit_code(summary, baseline)
    return data


# What a summary measured rather than decided: the only fields that differ between two runs of
# the same seed, shard and --max-sequences / --max-ops on one worker (``without_timing``).
TIMING = ("ops_per_s", "steady_ops_per_s", "elapsed_s", "elements_per_s", "compile_s", "load_s", "op_timeout_s",
          "compile_ahead", "timeline", "feature_timeline")
TIMING_WORKER = ("last_op_s", "longest_op_s")
TIMING_FAILURE = ("found_after_s", "confirm_timeline", "confirm_work")


def without_timing(data: dict) -> dict:
    """A summary JSON without its timing fields (``TIMING``): what a deterministic campaign
    must reproduce byte for byte (``--op-timeout auto`` is 10x the longest op seen: timing)."""
    out = {k: v for k, v in data.items() if k not in TIMING}
    out["workers"] = [{k: v for k, v in w.items() if k not in TIMING_WORKER} for w in data.get("workers", [])]
    out["failures"] = [{k: v for k, v in f.items() if k not in TIMING_FAILURE} for f in data.get("failures", [])]
    return out


def junit_xml(summary, *, backend: str, kernels: str, baseline=None) -> str:
    """With ``baseline`` (a Verdict), a known failure is a skipped test case with the
    baseline's reason, and each signature no longer seen a passing one that says so."""
    suite = ET.Element("testsuite", name=f"kvfuzz[{backend}:{kernels}]", tests="0", failures="0", errors="0",
                       time=f"{summary.elapsed_s:.3f}")
    n = failures = 0
    for case, path in zip(summary.cases, summary.paths):
        tc = ET.SubElement(suite, "testcase", classname=f"kvfuzz.{backend}", name=str(case.signature), time="0")
        d = case.divergence or {}
        n += 1
        if baseline is not None and baseline.is_known(case.signature):
            reason = baseline.reasons.get(str(case.signature)) or "in the baseline"
            ET.SubElement(tc, "skipped", message=f"known failure: {reason}"[:500]).text = \
                f"case file: {path}\nbaseline: {baseline.source}\n"
            continue
        r = case.reproduced or {}
        rate = f" [reproduced {r.get('k')}/{r.get('n')}{', flaky' if case.flaky else ''}]" if r else ""
        failure = ET.SubElement(tc, "failure", message=(str(d.get("message", ""))[:480] + rate),
                                type=d.get("oracle", "divergence"))
        failure.text = (f"case file: {path}\nreplay: kvfuzz replay {path}\n"
                        + (f"reproduced: {r.get('k')}/{r.get('n')}{' (flaky)' if case.flaky else ''}\n" if r else "")
                        + (f"{(case.history or {}).get('note')}\n" if (case.history or {}).get("note") else ""))
        failures += 1
    failed_kinds = {c.signature.op for c in summary.cases}
    for kind, count in sorted(summary.by_kind.items()):
        if kind in failed_kinds:
            continue
        tc = ET.SubElement(suite, "testcase", classname=f"kvfuzz.{backend}", name=f"{kind} ({count} ops)", time="0")
        ET.SubElement(tc, "system-out").text = f"{count} {kind} ops agreed with the spec"
        n += 1
    for sig in baseline.no_longer_seen if baseline is not None else ():
        tc = ET.SubElement(suite, "testcase", classname=f"kvfuzz.{backend}.baseline", name=sig, time="0")
        ET.SubElement(tc, "system-out").text = (f"in the baseline ({baseline.reasons.get(sig) or 'no reason given'}) "
                                                f"but not found this time: fixed?")
        n += 1
    for text in summary.harness_errors:
        tc = ET.SubElement(suite, "testcase", classname="kvfuzz.harness", name="harness error", time="0")
        ET.SubElement(tc, "error", message="internal harness error").text = text
        n += 1
    suite.set("tests", str(n))
    suite.set("failures", str(failures))
    suite.set("errors", str(len(summary.harness_errors)))
    if baseline is not None:
        suite.set("skipped", str(len(baseline.known)))
    root = ET.Element("testsuites")
    root.append(suite)
    return ET.tostring(root, encoding="unicode", xml_declaration=True)


def stats_table(summary) -> str:
    lines = [f"kvfuzz statistics: {summary.ops} ops in {summary.sequences} sequences, {summary.elapsed_s:.1f} s"]

    def block(title: str, counts: dict) -> None:
        if not counts:
            return
        total = sum(counts.values()) or 1
        lines.append(f"  {title}:")
        for name, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"    {name:<28} {count:>10,}  {100.0 * count / total:5.1f}%")

    block("ops by kind", summary.by_kind)
    block("sequences by scenario", summary.by_scenario)
    block("hostile probes by class", summary.hostile)
    lines.append(f"  contract ops: {summary.contract_ops}, Triton launches: {summary.launches}, "
                 f"faults: {summary.faults}, worker restarts: {summary.restarts}")
    return "\n".join(lines)


def write(path: str, text: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)


def dumps(data: dict) -> str:
    return json.dumps(data, indent=1) + "\n"
