"""The rule registry: every code the checker reports is one ``Rule`` record.

Why records: a rule kept in three places (the docstring table, the message table and
the if-chains that detect it) drifts between them. A rule family module
declares its rules next to the hooks that detect them; the message, the docs table
(``docs/check-sync.md``), ``--help``, ``--list-rules`` and SARIF's rule metadata are
all generated from the same records.

The families are collected here, by explicit import and in this order (the order of
the docs table and ``--help``); the record types live in the leaf ``records``, which
the family modules import, so no family module imports the registry.
"""

from __future__ import annotations

from collections.abc import Iterable

from .records import Family, Hook, Rule
from .rules import data_dependent, host_reads, pragmas, transfers, waits

__all__ = ["FAMILIES", "Family", "Hook", "Rule", "SelectionError", "all_rules", "expand_codes", "explain",
           "families", "family_of", "markdown_table", "selected_codes", "text_table"]


FAMILIES = (host_reads.FAMILY, data_dependent.FAMILY, transfers.FAMILY, waits.FAMILY, pragmas.FAMILY)


def families() -> tuple[Family, ...]:
    return FAMILIES


def all_rules() -> dict[str, Rule]:
    out: dict[str, Rule] = {}
    for fam in families():
        for rule in fam.rules:
            if rule.code in out:
                raise RuntimeError(f"rule code {rule.code} is declared twice")
            out[rule.code] = rule
    return dict(sorted(out.items()))


def family_of(code: str) -> Family:
    for fam in families():
        if any(r.code == code for r in fam.rules):
            return fam
    raise KeyError(code)


class SelectionError(ValueError):
    pass


def expand_codes(items: Iterable[str], what: str) -> set[str]:
    """Codes named by ``--select``/``--ignore`` items: a code, a prefix (``SYNC1``), or ``ALL``."""
    known = all_rules()
    out: set[str] = set()
    for raw in items:
        for item in (p.strip() for p in raw.split(",")):
            if not item:
                continue
            up = item.upper()
            hits = set(known) if up == "ALL" else {c for c in known if c.startswith(up)}
            if not hits:
                raise SelectionError(f"{what}: {item!r} names no rule (known: {', '.join(known)})")
            out |= hits
    return out


def selected_codes(select: Iterable[str] | None, ignore: Iterable[str] | None) -> set[str]:
    chosen = expand_codes(select, "--select") if select else set(all_rules())
    return chosen - (expand_codes(ignore, "--ignore") if ignore else set())


# ------------------------------------------------------------------ generated documentation


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table() -> str:
    """The rules table of docs/check-sync.md (a test keeps the two equal)."""
    lines = ["| code | name | form | why the host waits | example | instead |", "|---|---|---|---|---|---|"]
    for fam in families():
        for r in fam.rules:
            instead = f"`{_md(r.instead)}`" if r.instead else ""
            lines.append(f"| {r.code} | {r.name} | {_md(r.forms)} | {_md(r.why)} | `{_md(r.example)}` | {instead} |")
    return "\n".join(lines)


def text_table(width: int = 100) -> str:
    """The rule list of ``--help`` and ``--list-rules``: one line a rule, grouped by family."""
    lines = []
    for fam in families():
        lines.append(f"{fam.title}:")
        for r in fam.rules:
            line = f"  {r.code} {r.name:22} {r.forms}"
            lines.append(line if len(line) <= width else line[: width - 1] + "…")
    return "\n".join(lines)


def explain(code: str) -> str:
    rules = all_rules()
    if code.upper() not in rules:
        raise SelectionError(f"--explain: {code!r} names no rule (known: {', '.join(rules)})")
    r = rules[code.upper()]
    out = [f"{r.code} {r.name} ({family_of(r.code).title})", f"  matches: {r.forms}", f"  why: {r.why}",
           f"  reported: {r.example}"]
    if r.instead:
        out.append(f"  instead:  {r.instead}")
    return "\n".join(out)
