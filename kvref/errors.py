"""The one error the spec raises for a broken precondition.

A subclass of ValueError so that callers who only know "bad input" still catch it;
its own type so that the differential runner can tell "the spec refused this" from a
crash inside the spec.
"""


class ContractViolation(ValueError):
    """A call broke a precondition of SPEC.md; nothing was changed."""
