"""The spec's half of a differential run, alone: kvref's allocator and the raw tables.

It is what the generators read (never the target) to know which requests are live, so
an op sequence is a function of its seed and of the spec only. That is what lets a
supervisor that watched a worker die rebuild the ops the worker had run, from the seed
and the op index, without running (or even importing) the kernel set.
"""

from __future__ import annotations

import kvref
from kvref import ContractViolation

from .ops import KernelOp, Op
from .verdict import Outcome

__all__ = ["Capabilities", "Outcome", "SpecSide", "unsupported"]


class Capabilities:
    """Which optional functions a kernel set has (a stand-in for a Tier where only
    ``has`` is asked: the ops a run skips depend on it)."""

    def __init__(self, names):
        self.names = frozenset(names)

    def has(self, fn: str) -> bool:
        return fn in self.names


class SpecSide:
    def __init__(self, config: kvref.PoolConfig, rules=()):
        self.config = config
        self.spec = kvref.Allocator(config, rules=frozenset(rules))
        rows = config.table_rows
        self.raw = {"v2p": [0] + [-1] * (rows - 1), "p2v": [0] + [-1] * (rows - 1)}

    def apply(self, op: Op) -> Outcome:
        try:
            if isinstance(op, KernelOp):
                return Outcome(op.spec(self.raw["v2p"], self.raw["p2v"]))
            return Outcome(op.spec(self.spec))
        except ContractViolation as exc:
            return Outcome(error=exc)


def unsupported(op: Op) -> Outcome:
    """What a run answers for an op the kernel set cannot run (it is skipped)."""
    return Outcome(error=ContractViolation(f"{op.kind}: not in this kernel set"))
