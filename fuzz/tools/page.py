"""The morning page: one night (``night.read_night``) and the nights before it, as one HTML file.

Self-contained: the style is inline, the charts are inline SVG (``svg``), there is no script
and nothing is fetched, so it opens from a CI artifact or a file share. Links are in-page
anchors and relative links to the case files, so the folder it was written into can be
moved whole. The verdict comes first; every list a long night can make long is capped, with
"and N more" (``night.DETAILED``, ``night.LISTED``, ``CAPPED``).
"""

from __future__ import annotations

import os
import shlex
from html import escape
from pathlib import Path
from urllib.parse import quote

from ..engine.verdict import never_again
from . import svg
from .night import DETAILED, LISTED, exit_code
from .nights import SHOWN_NIGHTS, since

CAPPED = 50  # signatures named in one verdict list

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1100px;padding:0 16px 48px;color:#222}
h1{font-size:22px;margin:18px 0 4px}h2{border-bottom:1px solid #ccc;margin-top:28px}
nav a{margin-right:12px}table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:2px 6px;
text-align:left;vertical-align:top}th{background:#f4f4f4}td.n{text-align:right}pre{background:#f6f6f6;padding:6px;
overflow-x:auto;margin:4px 0}.new{color:#b00020;font-weight:600}.known{color:#8a6d00}.fixed{color:#1b7a1b}
.verdict{font-size:18px;padding:8px 12px;border-radius:4px;margin:8px 0}.bad{background:#fde8ea}.ok{background:#e6f4e6}
.charts{display:flex;flex-wrap:wrap;gap:8px 24px}.cols{display:grid;grid-template-columns:auto 1fr;gap:0 32px}.cols>div{min-width:0}.card{border:1px solid #ddd;border-radius:4px;padding:6px 12px;margin:10px 0}.muted{color:#666}
svg.chart text{font:11px system-ui,sans-serif;fill:#333}svg.chart .ct{font-weight:600}svg.chart .grid{stroke:#eee}
"""


def _e(value) -> str:
    return escape("" if value is None else str(value))


def _n(value) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else _e(value)


def _short(kernels) -> str:
    """A kernel set's file by its name (the whole path on hover), a module as it is."""
    text = "" if kernels is None else str(kernels)
    return f'<span title="{_e(text)}">{_e(Path(text).name)}</span>' if text.endswith(".py") else _e(text)


def _table(head: list[str] | None, rows: list[list], numeric: set[int] = frozenset()) -> str:
    out = ["<table>" + ("<tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>" if head else "")]
    for row in rows:
        out.append("<tr>" + "".join(f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(row)) + "</tr>")
    return "".join(out) + "</table>"


def _capped(items: list[str], render) -> str:
    shown = "".join(f"<li>{render(x)}</li>" for x in items[:CAPPED])
    more = f'<li class="muted">and {len(items) - CAPPED} more</li>' if len(items) > CAPPED else ""
    return f"<ul>{shown}{more}</ul>"


class Page:
    def __init__(self, night: dict, nights: list[dict], out: Path, problems: list[str]):
        self.night, self.nights, self.out, self.problems = night, nights, out, problems
        self.anchor = {}  # signature -> its finding's anchor (the first, detailed one)
        for i, f in enumerate(night["findings"][:DETAILED]):
            self.anchor.setdefault(f["signature"], f"finding-{i}")

    def href(self, path: Path) -> str:
        return quote(os.path.relpath(path, self.out.parent.resolve()).replace(os.sep, "/"))

    def sig(self, s: str) -> str:
        a = self.anchor.get(s)
        return f'<a href="#{a}"><code>{_e(s)}</code></a>' if a else f"<code>{_e(s)}</code>"

    # ---- the verdict --------------------------------------------------------------------------
    def verdict(self) -> str:
        n = self.night
        new = sorted({f["signature"] for f in n["findings"] if f["status"] == "new"})
        known = sorted({f["signature"] for f in n["findings"] if f["status"] == "known"})
        code = exit_code(n)
        head = (f'{len(new)} new signature(s)' if new else "no new signature") + \
            f", {len(known)} known, {len(n['no_longer_seen'])} no longer seen; the campaigns' exit {code}"
        out = [f'<section id="verdict"><h2>Verdict</h2><div class="verdict {"bad" if code else "ok"}">{_e(head)}</div>']
        m = n["mutants"]
        if m is not None:
            survived = [r["mutant"] for r in m["rows"] if not r["killed"]]
            out.append(f'<p id="mutants-verdict" class="{"new" if survived else "fixed"}">Mutants: '
                       f'{_e(m["total"] or "no total line (cut short?)")}'
                       + (f'; survived: {_e(", ".join(survived))} (<a href="#mutants">kill table</a>)' if survived else "")
                       + "</p>")
        change = since(self.nights[-2] if len(self.nights) > 1 else None, self.nights[-1])
        if change is not None:
            out.append(self._since(change))
        if new:
            out.append(f'<p class="new">New ({len(new)}):</p>' + _capped(new, self.sig))
        if known:
            out.append(f'<p class="known">Known ({len(known)}, in the baseline):</p>'
                       + _capped(known, lambda s: f"{self.sig(s)} <span class='muted'>{_e(n['reasons'].get(s))}</span>"))
        if n["no_longer_seen"]:
            out.append(f'<p class="fixed">No longer seen (in the baseline, not met tonight: fixed?) '
                       f'({len(n["no_longer_seen"])}):</p>'
                       + _capped(n["no_longer_seen"], lambda s: f"<code>{_e(s)}</code> <span class='muted'>"
                                                                f"{_e(n['reasons'].get(s))}</span>"))
        out.append(self._unchecked())
        out.append("<h3>Campaigns</h3>" + _table(
            ["campaign", "scale", "tier", "kernels", "ops", "ops/s", "elements/s", "s", "stopped by", "signatures", "exit"],
            [[_e(c["name"]), _e(c["scale"]), _e(c["backend"]), _short(c["kernels"]), _n(c["ops"]), _n(c["ops_per_s"]),
              _n(c["elements_per_s"]) if c["elements"] else "-", _n(c["elapsed_s"]), _e(c["stopped_by"]),
              _n(sum(f["campaign"] == c["name"] for f in n["findings"])), _e(c["exit_code"])]
             for c in n["campaigns"]], {4, 5, 6, 7, 9}))
        return "".join(out) + "</section>"

    def _since(self, ch: dict) -> str:
        parts = [f"Since the night before ({_e(ch['prev'])}, {_e(ch['prev_date'])}): "]
        parts.append(f'<span class="{"new" if ch["new"] else ""}">{len(ch["new"])} new signature(s)</span>'
                     + (": " + ", ".join(self.sig(s) for s in ch["new"][:CAPPED]) if ch["new"] else ""))
        parts.append(f'; <span class="{"fixed" if ch["fixed"] else ""}">{len(ch["fixed"])} no longer seen (fixed?)</span>'
                     + (": " + ", ".join(f"<code>{_e(s)}</code>" for s in ch["fixed"][:CAPPED]) if ch["fixed"] else ""))
        parts.append(f"; {len(ch['still'])} still seen.")
        more = [len(ch["new"]) - CAPPED, len(ch["fixed"]) - CAPPED]
        if max(more) > 0:
            parts.append(f' <span class="muted">(lists capped at {CAPPED}: and {max(more[0], 0)} / '
                         f'{max(more[1], 0)} more)</span>')
        out = [f'<p id="since">{"".join(parts)}</p>']
        if ch["lost"]:
            out.append('<p class="new">Features reached the night before and not tonight:</p><ul>'
                       + "".join(f"<li><code>{_e(k)}</code>: {_e(', '.join(v))}</li>" for k, v in ch["lost"].items())
                       + "</ul>")
        return "".join(out)

    def _unchecked(self) -> str:
        n, items = self.night, []
        for c in n["campaigns"]:
            for why, k in sorted(c["not_applicable"].items(), key=lambda kv: -kv[1]):
                items.append(f"{_e(c['name'])}: not checked {k}x: {_e(why)}")
            far = c["far_ops"] if isinstance(c["far_ops"], dict) else None
            if far and far.get("not_applicable"):
                items.append(f"{_e(c['name'])}: {far['not_applicable']} of {far.get('ran', 0) + far['not_applicable']} "
                             f"far read tables did not run (no memory for them)")
            items += [f"{_e(c['name'])}: not clean: {_e(h)}" for h in c["health"]]
            items += [f"{_e(c['name'])}: {_e(p)}" for p in c.get("problems", [])]
            if c["harness_errors"]:
                items.append(f"{_e(c['name'])}: {c['harness_errors']} internal harness error(s) (exit 3)")
            if c["interrupted"]:
                items.append(f"{_e(c['name'])}: interrupted ({_e(c['interrupted'])})")
        items += [f"unreadable: {_e(u['path'])}: {_e(u['error'])}" for u in n["unreadable"]]
        items += [_e(p) for p in self.problems]
        if not items:
            return '<p id="unchecked">Everything drawn was checked: no op not applicable, no far table skipped.</p>'
        return '<div id="unchecked"><h3>What could not be checked</h3>' + _capped(items, lambda x: x) + "</div>"

    # ---- the findings -------------------------------------------------------------------------
    def findings(self) -> str:
        fs = self.night["findings"]
        out = [f'<section id="findings"><h2>Findings ({len(fs)})</h2>']
        if not fs:
            out.append("<p>No finding tonight.</p>")
        for i, f in enumerate(fs[:DETAILED]):
            out.append(self._card(i, f))
        rest = fs[DETAILED:DETAILED + LISTED]
        if rest:
            out.append("<h3>More findings</h3>" + _table(
                ["signature", "status", "campaign", "kernels", "occurrences", "rate", "ops", "case file"],
                [[f"<code>{_e(f['signature'])}</code>", _e(f["status"]), _e(f["campaign"]), _e(f["kernels"]),
                  _n(f["occurrences"]), self._rate(f), _n(f["minimized_ops"]), self._case_link(f)] for f in rest],
                {4, 6}))
        if len(fs) > DETAILED + LISTED:
            out.append(f'<p class="muted" id="more-findings">and {len(fs) - DETAILED - LISTED} more findings '
                       f"(every one is in the campaigns' summary.json)</p>")
        return "".join(out) + "</section>"

    @staticmethod
    def _rate(f: dict) -> str:
        r = f["reproduced"]
        if not r:
            return "-"
        if never_again(r):
            return f'0/{r.get("n")} <span class="muted">not reproduced</span>'
        return f"{r.get('k')}/{r.get('n')}" + (' <span class="new">flaky</span>' if f["flaky"] else "")

    def _case_link(self, f: dict) -> str:
        if f["case"] is None:
            return f'<span class="muted">not found ({_e(f["case_named"])})</span>'
        return f'<a class="case" href="{self.href(f["case"])}">{_e(f["case"].name)}</a>'

    def _card(self, i: int, f: dict) -> str:
        rows = [("status", f'<span class="{f["status"]}">{_e(f["status"])}</span>'),
                ("kernels / allocator", f"{_e(f['kernels'])} / {_e(f['allocator'] or 'ours')}"),
                ("tier, campaign", f"{_e(f['tier'])}, {_e(f['campaign'])}"),
                ("rate", self._rate(f) + f", met {_n(f['occurrences'])}x"
                 + (f", first after {f['found_after_s']:.1f} s" if f["found_after_s"] is not None else "")),
                ("case file", self._case_link(f))]
        d = f.get("divergence") or {}
        if d.get("message"):
            rows.append(("divergence", f"{_e(d['message'])}" + (f" (op {d['step']})" if d.get("step") is not None else "")))
        if d.get("spec") is not None:
            rows.append(("spec", f"<code>{_e(d['spec'])}</code>"))
            rows.append(("target", f"<code>{_e(d['target'])}</code>"))
        if d.get("fault"):
            rows.append(("its last stderr", f"<pre>{_e(d['fault'])}</pre>"))
        if f.get("case_error"):
            rows.append(("case file", _e(f["case_error"])))
        ops = f.get("ops")
        body = (f"<p>minimized to {len(ops)} op(s):</p><pre class='ops'>{_e(chr(10).join(ops))}</pre>"
                if ops is not None else "")
        replay = ""
        if f["case"] is not None:
            cmd = f"kvfuzz replay {shlex.quote(os.path.relpath(f['case'], self.out.parent.resolve()))}"
            replay = f'<p>replay (in this page\'s folder):</p><pre class="replay">{_e(cmd)}</pre>'
        return (f'<div class="card" id="finding-{i}"><h3><code>{_e(f["signature"])}</code></h3>'
                + _table(None, [[_e(k), v] for k, v in rows])
                + body + replay + "</div>")

    # ---- what was fuzzed ----------------------------------------------------------------------
    def fuzzed(self) -> str:
        n = self.night
        out = ['<section id="fuzzed"><h2>What was fuzzed</h2>']
        kinds: dict[tuple, int] = {}
        hostile: dict[str, int] = {}
        for c in n["campaigns"]:
            if c["letter"]:
                continue
            for k, v in c["by_kind"].items():
                kinds[(c["scale"] or "?", k)] = kinds.get((c["scale"] or "?", k), 0) + v
            for k, v in c["hostile"].items():
                hostile[k] = hostile.get(k, 0) + v
        out.append('<div class="cols"><div>')
        if kinds:
            scales = sorted({s for s, _ in kinds})
            out.append("<h3>Ops by kind and scale</h3>" + _table(
                ["kind", *scales], [[f"<code>{_e(k)}</code>", *(_n(kinds.get((s, k))) for s in scales)]
                                    for k in sorted({k for _, k in kinds})], set(range(1, len(scales) + 1))))
        out.append("</div><div>")
        out.append("<h3>Hostile classes probed</h3>" + (_table(
            ["class", "probes"], [[_e(k), _n(v)] for k, v in sorted(hostile.items())], {1}) if hostile else
            "<p>none</p>"))
        prod = [c for c in n["campaigns"] if (c["elements"] or c["far_ops"]) and not c["letter"]]  # kernel-level shapes
        if prod:
            items = [f"{_e(c['name'])}: {_n(c['elements'])} elements diffed" for c in prod]
            items += [f"{_e(c['name'])}: far read tables: {c['far_ops'].get('ran')} ran, "
                      f"{c['far_ops'].get('not_applicable')} not applicable" for c in prod if isinstance(c["far_ops"], dict)]
            items += [f"{_e(c['name'])}: {_e(note)}" for c in prod for note in c["notes"]]
            out.append("<h3>Production shapes met</h3>" + _capped(items, lambda x: x))
        if n["bench"]:
            out.append("<h3>Throughput (kvfuzz bench)</h3>" + _table(
                ["tier", "diffed ops/s"], [[_e(r.get("backend")), _n(r.get("ops_per_s"))
                                            if "ops_per_s" in r else f"failed (exit {_e(r.get('exit'))})"]
                                           for r in n["bench"]], {1}))
        out.append("</div></div>")
        m = n["mutants"]
        if m is not None:
            out.append(f"<h3 id='mutants'>Mutant kill table</h3><p>{_e(m['total'] or 'no total line (cut short?)')}</p>" + _table(
                ["mutant", "verdict", "s", "ops", "case", "signature"],
                [[_e(r["mutant"]), '<span class="fixed">killed</span>' if r["killed"] else '<span class="new">SURVIVED</span>',
                  f"{r['seconds']:.1f}", _n(r["ops"]), _e(r.get("case", "")), f"<code>{_e(r.get('signature', ''))}</code>"]
                 for r in m["rows"]], {2, 3}))
        letters = [c for c in n["campaigns"] if c["letter"]]
        if letters:
            out.append("<h3>Letter-of-SPEC kernel sets</h3><p class='muted'>right on all valid input: a finding "
                       "against one is kvfuzz handing it input SPEC refuses</p>" + _table(
                           ["set", "scale", "ops", "signatures", "exit"],
                           [[_e(c["name"]), _e(c["scale"]), _n(c["ops"]),
                             _n(sum(f["campaign"] == c["name"] for f in n["findings"])), _e(c["exit_code"])]
                            for c in letters], {2, 3}))
        return "".join(out) + "</section>"

    # ---- coverage -----------------------------------------------------------------------------
    def coverage(self) -> str:
        n = self.night
        out = ['<section id="coverage"><h2>Coverage</h2>']
        series = [(c["name"], [(p[0], p[2]) for p in c["feature_timeline"]]) for c in n["campaigns"]
                  if c["feature_timeline"]]
        plot = svg.line_chart("features-over-time", "features reached over the night", series,
                              x_label="seconds into the campaign", y_label="features", x_min=0.0,
                              y_from_zero=False) if series else ""
        out.append(plot or '<p id="features-over-time" class="muted">No guided campaign recorded a feature '
                           'timeline tonight.</p>')
        cov = n["coverage"]
        if cov is None:
            out.append("<p class='muted'>No coverage.json or coverage.txt in the night's folder.</p>")
            return "".join(out) + "</section>"
        if cov["features"]:
            out.append("<p>Features by domain: " + ", ".join(f"{_e(d)} {_n(v)}" for d, v in sorted(cov["features"].items()))
                       + "</p>")
        rows = [[f"<code>{_e(k)}</code>", _n(v["reached_n"]), _e(", ".join(v["reached"][:8])
                                                                 + (" ..." if len(v["reached"]) > 8 else "")),
                 "<br>".join(_e(x) for x in v["never"]) or '<span class="fixed">none</span>'] for k, v in cov["kernels"].items()]
        if rows:
            out.append("<h3>Per kernel</h3>" + _table(["kernel", "reached", "some reached", "never reached"], rows, {1}))
        if cov["code"]:
            out.append("<h3>Per file: the functions with lines no sequence ran</h3>")
        for short, v in cov["code"].items():  # folded: a list per function, long on a young corpus
            out.append(f"<details><summary><code>{_e(short)}</code>: {_n(v['lines'])} lines in functions, "
                       f"{_n(v['never'])} never ran</summary>"
                       + _capped(v["functions"], lambda x: f"<code>{_e(x)}</code>") + "</details>")
        return "".join(out) + "</section>"

    # ---- nights over time ---------------------------------------------------------------------
    def trends(self) -> str:
        nights = self.nights[-SHOWN_NIGHTS:]
        out = [f'<section id="nights"><h2>Nights over time ({len(self.nights)})</h2>']
        if len(self.nights) > SHOWN_NIGHTS:
            out.append(f"<p class='muted'>the last {SHOWN_NIGHTS}; and {len(self.nights) - SHOWN_NIGHTS} earlier "
                       f"nights in the history file</p>")
        labels = [r.get("label") or r["id"] for r in nights]
        if len(set(labels)) < len(labels):  # one KVFUZZ_OUT reused night after night: tell them by date
            labels = [str(r.get("date") or "")[5:16] or lab for lab, r in zip(labels, nights)]
        changes = [since(self.nights[self.nights.index(r) - 1] if self.nights.index(r) else None, r) for r in nights]
        xs = [(i, _e(lab)) for i, lab in enumerate(labels)]
        out.append('<div class="charts">')
        out.append(svg.bar_chart("signatures-per-night", "signatures per night", labels,
                                 [("seen", [len(r.get("signatures") or []) for r in nights]),
                                  ("new since the night before", [len(c["new"]) if c else 0 for c in changes]),
                                  ("no longer seen", [len(c["fixed"]) if c else 0 for c in changes])],
                                 y_label="signatures"))

        def line(key: str, name: str):
            return [(i, r[key]) for i, r in enumerate(nights) if isinstance(r.get(key), (int, float))]

        for sid, title, key, ylab in (("features-per-night", "features reached per night", "features", "features"),
                                      ("ops-per-night", "ops per second per night", "ops_per_s", "ops/s"),
                                      ("elements-per-night", "elements per second per night", "elements_per_s",
                                       "elements/s"),
                                      ("first-finding-per-night", "time to the first finding", "first_finding_s", "s")):
            pts = line(key, title)
            if pts:
                out.append(svg.line_chart(sid, title, [(key, pts)], x_label="night", y_label=ylab, x_ticks=xs))
        out.append("</div>")
        out.append(_table(["night", "date", "signatures", "new since before", "no longer seen", "features", "ops/s",
                           "elements/s", "first finding (s)", "exit"],
                          [[_e(labels[i]), _e(r.get("date")), _n(len(r.get("signatures") or [])),
                            _n(len(c["new"])) if c else "-", _n(len(c["fixed"])) if c else "-", _n(r.get("features")),
                            _n(r.get("ops_per_s")), _n(r.get("elements_per_s")),
                            f"{r['first_finding_s']:.1f}" if isinstance(r.get("first_finding_s"), (int, float)) else "-",
                            _e(r.get("exit_code"))] for i, (r, c) in enumerate(zip(nights, changes))],
                          {2, 3, 4, 5, 6, 7, 8}))
        return "".join(out) + "</section>"

    def html(self) -> str:
        n = self.night
        title = f"kvfuzz morning page: {n['label']} ({n['date']})"
        nav = "".join(f'<a href="#{a}">{t}</a>' for a, t in (("verdict", "Verdict"), ("findings", "Findings"),
                                                              ("fuzzed", "What was fuzzed"), ("coverage", "Coverage"),
                                                              ("nights", "Nights over time")))
        return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
                f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{STYLE}</style></head>'
                f'<body><h1>{_e(title)}</h1><p class="muted">{_e(n["dir"])}</p><nav>{nav}</nav>'
                + self.verdict() + self.findings() + self.fuzzed() + self.coverage() + self.trends()
                + "</body></html>\n")


def render(night: dict, nights: list[dict], out, problems: list[str] = ()) -> str:
    """The page of ``night`` (whose record is ``nights[-1]``) for the file ``out``."""
    return Page(night, nights, Path(out).resolve(), list(problems)).html()
