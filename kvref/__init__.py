"""kvref: SPEC.md as plain Python (standard library only), the oracle of kvfuzz."""

from . import kernels
from .config import PoolConfig
from .errors import ContractViolation

__all__ = ["ContractViolation", "PoolConfig", "kernels"]
