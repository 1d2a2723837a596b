"""The checker's own annotations: a ``# sync-ok: <reason>`` pragma allows one line, and must say why."""

from __future__ import annotations

from ..records import Family, Rule

PRAGMA_WITHOUT_REASON = Rule(
    "SYNC00", "pragma-without-reason", "a `# sync-ok` pragma without a reason",
    "`# sync-ok:` pragma without a reason: write `# sync-ok: <why this sync is fine>`",
    "not a sync: an allowance nobody can review later",
    "x = pages.tolist()  # sync-ok", "x = pages.tolist()  # sync-ok: debug builds only")

# Reported by the analysis over each checked file's comments, not by an AST hook.
FAMILY = Family("pragmas", "Pragmas", (PRAGMA_WITHOUT_REASON,), {})
