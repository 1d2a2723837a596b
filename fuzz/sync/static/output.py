"""Output formats: ``text`` for people, ``github`` for Actions annotations, ``json`` and ``sarif`` for tools.

Why four: a developer reads ``path:line:col: CODE message``; a GitHub Actions log turns
``::error file=…,line=…,col=…::`` lines into annotations on the diff; code-scanning
services ingest SARIF 2.1.0 (findings in allowed regions go in as suppressed results,
so the decision stays reviewable); anything else reads the JSON document.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import Iterable
from pathlib import Path

from . import reach
from .reach import Finding, Report
from .regions import KINDS
from .registry import all_rules

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def tool_version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("kvfuzz")
    except (ImportError, PackageNotFoundError):  # running from a checkout that is not installed
        return "0+unknown"


def summary(report: Report) -> str:
    n = len(report.findings)
    word = "finding" if n == 1 else "findings"
    line = f"check-sync: {n} {word} in {report.n_files} file(s), {report.n_free_paths} free-path function(s) checked"
    n_allowed = len(report.allowed)
    if n_allowed:
        line += f", {n_allowed} sync(s) allowed in exempt regions (-v lists them)"
    if report.errors:
        line += f", {len(report.errors)} file(s) could not be checked"
    if report.truncated:
        line += f", stopped after {reach.MAX_VISITS} function visits (some calls were not followed)"
    return line


# ------------------------------------------------------------------ text


def verbose_lines(report: Report) -> Iterable[str]:
    """Every decision: entry points, free paths, allowed regions and syncs, what no entry point reaches."""
    for path, plan in report.files.items():
        for name, why in plan.roots.items():
            yield f"{path}: free path {name}: entry point, {why}"
        for qual, chain in plan.reached.items():
            if qual not in plan.roots:
                yield f"{path}: free path {qual}: {chain}"
        for r in plan.regions:
            yield f"{path}:{r.start}-{r.end}: allowed region ({r.kind}) in {r.function}: {r.reason}"
        for qual, why in plan.exempt.items():
            yield f"{path}: exempt {qual}: {why}"
        for f in plan.allowed:
            assert f.exemption is not None
            yield (f"{f.path}:{f.line}:{f.col}: allowed {f.code} ({f.exemption.kind}: {f.exemption.detail}) "
                   f"{f.message}{f.where()}")
        if plan.unreached:
            yield f"{path}: not on a free path: {', '.join(plan.unreached)}"
        for note in plan.notes:
            yield f"{path}: note: {note}"


def render_text(report: Report, verbose: bool) -> str:
    lines = list(verbose_lines(report)) if verbose else []
    lines += [f.format() for f in report.findings]
    lines.append(summary(report))
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ GitHub Actions


def _gh_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _gh_prop(text: str) -> str:
    return _gh_data(text).replace(":", "%3A").replace(",", "%2C")


def render_github(report: Report, verbose: bool) -> str:
    lines = list(verbose_lines(report)) if verbose else []
    for f in report.findings:
        lines.append(f"::error file={_gh_prop(f.path)},line={f.line},col={f.col}::{_gh_data(f.code + ' ' + f.message + f.where())}")
    if verbose:
        for f in report.allowed:
            assert f.exemption is not None
            lines.append(f"::notice file={_gh_prop(f.path)},line={f.line},col={f.col}::"
                         f"{_gh_data(f'allowed {f.code} ({f.exemption.kind}): {f.exemption.detail}')}")
    for err in report.errors:
        lines.append(f"::error::{_gh_data('check-sync: ' + err)}")
    lines.append(summary(report))
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ JSON


def _exemption_json(f: Finding) -> dict | None:
    ex = f.exemption
    if ex is None:
        return None
    return {"kind": ex.kind, "detail": ex.detail, "reason": KINDS.get(ex.kind, "a `# sync-ok:` pragma"),
            "function": ex.function, "start_line": ex.start, "end_line": ex.end}


def finding_json(f: Finding) -> dict:
    rule = all_rules()[f.code]
    return {"path": f.path, "line": f.line, "column": f.col, "code": f.code, "name": rule.name,
            "message": f.message, "entry_point": f.entry, "chain": [h.to_json() for h in f.chain],
            "also_from": list(f.also_from), "exemption": _exemption_json(f)}


def render_json(report: Report, settings) -> str:
    doc = {
        "tool": {"name": "kvfuzz check-sync", "version": tool_version()},
        "summary": {"findings": len(report.findings), "allowed": len(report.allowed), "files": report.n_files,
                    "free_path_functions": report.n_free_paths, "errors": len(report.errors),
                    "truncated": report.truncated},
        "settings": {"roots": list(settings.roots), "strict": sorted(settings.strict),
                     "select": list(settings.select), "ignore": list(settings.ignore), "config": settings.source},
        "findings": [finding_json(f) for f in report.findings],
        "allowed": [finding_json(f) for f in report.allowed],
        "files": [{
            "path": p.path, "checked": p.target,
            "entry_points": [{"function": k, "why": v} for k, v in p.roots.items()],
            "free_paths": [{"function": k, "chain": v} for k, v in p.reached.items()],
            "exempt": [{"function": k, "why": v} for k, v in p.exempt.items()],
            "regions": [{"kind": r.kind, "function": r.function, "start_line": r.start, "end_line": r.end,
                         "detail": r.detail} for r in p.regions],
            "unreached": p.unreached, "notes": p.notes,
        } for p in report.files.values()],
        "errors": report.errors,
    }
    return json.dumps(doc, indent=1) + "\n"


# ------------------------------------------------------------------ SARIF 2.1.0


def source_root(start: str | None = None) -> str:
    """%SRCROOT%: the top of the git checkout holding the working directory, else the working directory.

    Why the checkout and not the working directory: code-scanning services resolve a
    result's URI against the repository root, wherever in it the check ran.
    """
    here = os.path.abspath(start or os.getcwd())
    probe = here
    while True:
        if os.path.exists(os.path.join(probe, ".git")):
            return probe
        parent = os.path.dirname(probe)
        if parent == probe:
            return here
        probe = parent


def _root_uri(root: str) -> str:
    uri = Path(root).as_uri()
    return uri if uri.endswith("/") else uri + "/"


def _artifact(path: str, root: str) -> dict:
    """A path under %SRCROOT% as a relative URI on that base; one outside it as an absolute file URI."""
    full = os.path.abspath(path)
    try:
        rel = os.path.relpath(full, root)
    except ValueError:  # another drive
        rel = os.pardir
    if rel == os.pardir or rel.startswith(os.pardir + os.sep):
        return {"uri": Path(full).as_uri()}
    return {"uri": urllib.parse.quote(rel.replace(os.sep, "/")), "uriBaseId": "%SRCROOT%"}


def _location(path: str, root: str, line: int, col: int | None = None, message: str | None = None) -> dict:
    artifact = _artifact(path, root)
    region = {"startLine": line, **({"startColumn": col} if col else {})}
    loc = {"physicalLocation": {"artifactLocation": artifact, "region": region}}
    if message:
        loc["message"] = {"text": message}
    return loc


def _result(f: Finding, index: dict[str, int], root: str) -> dict:
    text = f"{f.message}{f.where()}"
    res = {"ruleId": f.code, "ruleIndex": index[f.code], "level": "error", "message": {"text": text},
           "locations": [_location(f.path, root, f.line, f.col)]}
    if f.chain:
        hops = [{"location": _location(h.func.module.path, root, h.func.node.lineno, None, h.display)}
                for h in f.chain]
        hops.append({"location": _location(f.path, root, f.line, f.col, f.code)})
        res["codeFlows"] = [{"message": {"text": f"free path from {f.entry}"}, "threadFlows": [{"locations": hops}]}]
    if f.exemption is not None:
        kind = "inSource" if f.exemption.kind == "pragma" else "external"
        res["suppressions"] = [{"kind": kind, "justification": f"{f.exemption.kind}: {f.exemption.detail}"}]
    return res


def render_sarif(report: Report, root: str | None = None) -> str:
    """The SARIF log; artifact URIs are relative to %SRCROOT% (``root``, by default ``source_root()``)."""
    root = os.path.abspath(root) if root else source_root()
    rules = list(all_rules().values())
    index = {r.code: i for i, r in enumerate(rules)}
    driver = {
        "name": "kvfuzz check-sync", "version": tool_version(),
        "rules": [{
            "id": r.code, "name": r.name,
            "shortDescription": {"text": r.forms.replace("`", "")},
            "fullDescription": {"text": r.why},
            "help": {"text": f"Reported: {r.example}" + (f"\nInstead: {r.instead}" if r.instead else ""),
                     "markdown": f"Reported: `{r.example}`" + (f"  \nInstead: `{r.instead}`" if r.instead else "")},
            "defaultConfiguration": {"level": "error"},
        } for r in rules],
    }
    results = [_result(f, index, root) for f in (*report.findings, *report.allowed)]
    invocation = {"executionSuccessful": not report.errors,
                  "toolExecutionNotifications": [{"level": "error", "message": {"text": e}} for e in report.errors]}
    run = {"tool": {"driver": driver}, "results": results, "invocations": [invocation], "columnKind": "unicodeCodePoints",
           "originalUriBaseIds": {"%SRCROOT%": {"uri": _root_uri(root),
                                                "description": {"text": "the top of the git checkout, else the working directory"}}}}
    doc = {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}
    return json.dumps(doc, indent=1) + "\n"
