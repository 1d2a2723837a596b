"""The one error the spec raises for a broken precondition.

A subclass of ValueError so that callers who only know "bad input" still catch it;
its own type so that the differential runner can tell "the spec refused this" from a
crash inside the spec.
"""


class ContractViolation(ValueError):
    """A call broke a precondition of SPEC.md; nothing was changed.

    ``clause``: the name of the precondition broken (``kvref.preconditions.CLAUSES``), or
    None where the refusal is not one of SPEC §2's clauses (the allocator's contract of §3,
    an op the harness refuses). The message names it too, so a log line says which rule.
    """

    def __init__(self, message: str = "", clause: str | None = None):
        super().__init__(f"{message} [{clause}]" if clause else message)
        self.clause = clause
        self.detail = message

    def __reduce__(self):  # keep the clause across a process boundary
        return (type(self), (self.detail, self.clause))


class InvariantViolation(AssertionError):
    """A state broke one of the invariants of SPEC.md §4.

    ``name`` is the invariant's short name (``sentinels``, ``bijection``, ...), stable
    across releases because case-file signatures include it.
    """

    def __init__(self, name: str, message: str):
        super().__init__(f"invariant {name!r} broken: {message}")
        self.name = name
        self.detail = message
