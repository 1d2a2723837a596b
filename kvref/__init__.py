"""kvref: SPEC.md as plain Python (standard library only), the oracle of kvfuzz."""

from . import invariants, kernels
from .allocator import Allocator, Event, InFlight
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
    "PoolConfig",
    "check_all",
    "invariants",
    "kernels",
]
