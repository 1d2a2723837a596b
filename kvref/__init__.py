"""kvref: SPEC.md as plain Python (standard library only), the oracle of kvfuzz.

Lives here: the kernel-level functions (``kernels``), the allocator state machine
(``allocator``), the named §2 preconditions (``preconditions``), the named §4 invariants (``invariants``), ``PoolConfig`` and the errors.
May import: the standard library only (never torch or numpy: an oracle that shares
torch's semantics cannot catch bugs that hide behind them). Imported by everything.
"""

from . import invariants, kernels, preconditions
from .allocator import RULES, Allocator, Event, InFlight
from .config import PoolConfig
from .errors import ContractViolation, InvariantViolation
from .invariants import INVARIANTS, check_all

__all__ = [
    "INVARIANTS",
    "Allocator",
    "ContractViolation",
    "Event",
    "InFlight",
    "InvariantViolation",
    "RULES",
    "PoolConfig",
    "check_all",
    "invariants",
    "kernels",
    "preconditions",
]
