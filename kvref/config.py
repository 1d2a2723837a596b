"""Pool configuration (SPEC.md §1), validated once so every later step can trust it."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .errors import ContractViolation


@dataclass(frozen=True)
class PoolConfig:
    num_pages: int
    min_page: int = 1
    page_size: int = 1
    grow: str = "up"
    lazy: bool = True
    multiplier: int = 1
    max_moves: int = 8

    def __post_init__(self) -> None:
        for name in ("num_pages", "min_page", "page_size", "multiplier", "max_moves"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ContractViolation(f"PoolConfig.{name} must be an int, got {value!r}")
        if self.min_page < 1:
            raise ContractViolation(f"min_page must be >= 1 (page 0 is the padding sink), got {self.min_page}")
        if self.num_pages <= self.min_page:
            raise ContractViolation(
                f"num_pages ({self.num_pages}) must exceed min_page ({self.min_page})"
            )
        if self.page_size < 1:
            raise ContractViolation(f"page_size must be >= 1, got {self.page_size}")
        if self.multiplier < 1:
            raise ContractViolation(f"multiplier must be >= 1, got {self.multiplier}")
        if self.max_moves < 0:
            raise ContractViolation(f"max_moves must be >= 0, got {self.max_moves}")
        if self.grow not in ("up", "down"):
            raise ContractViolation(f"grow must be 'up' or 'down', got {self.grow!r}")
        if not isinstance(self.lazy, bool):
            raise ContractViolation(f"lazy must be a bool, got {self.lazy!r}")

    @property
    def table_rows(self) -> int:
        """v2p and p2v both have num_pages + 1 rows; the last is a sentinel."""
        return self.num_pages + 1

    @property
    def capacity_pages(self) -> int:
        return self.num_pages - self.min_page

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "PoolConfig":
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ContractViolation(f"unknown PoolConfig fields: {sorted(unknown)}")
        return cls(**data)
