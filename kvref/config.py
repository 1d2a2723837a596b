"""Pool configuration (SPEC.md §1), validated once so every later step can trust it."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ContractViolation


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class PoolConfig:
    num_pages: int
    min_page: int = 1
    page_size: int = 1
    grow: str = "up"
    lazy: bool = True
    multiplier: int = 1
    max_moves: int = 8
    chain: ChainConfig | None = None  # the pools sharing this one's byte buffer (docs/spec.md §6); None: alone

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
        if self.grow not in ("up", "down", "float"):
            raise ContractViolation(f"grow must be 'up', 'down' or 'float', got {self.grow!r}")
        if not isinstance(self.lazy, bool):
            raise ContractViolation(f"lazy must be a bool, got {self.lazy!r}")
        if self.grow == "float" and self.lazy:
            raise ContractViolation("a float pool frees holes-first, never lazily: lazy must be False (docs/spec.md §6)")
        if self.chain is not None:
            if not isinstance(self.chain, ChainConfig):
                raise ContractViolation(f"PoolConfig.chain must be a ChainConfig or None, got {self.chain!r}")
            self.chain.check_member(0, self)

    @property
    def table_rows(self) -> int:
        """v2p and p2v both have num_pages + 1 rows; the last is a sentinel."""
        return self.num_pages + 1

    @property
    def capacity_pages(self) -> int:
        return self.num_pages - self.min_page

    @property
    def is_float(self) -> bool:
        """A chain's middle member (docs/spec.md §6): a span between two END pools, not a band."""
        return self.grow == "float"

    @property
    def members(self) -> tuple[PoolConfig, ...]:
        """The configs of the chain's pools, this one first (itself alone when it has no chain)."""
        return (self,) if self.chain is None else (self, *self.chain.peers)

    def to_json(self) -> dict:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "chain"}
        if self.chain is not None:  # absent otherwise: the form of every case written before chains
            out["chain"] = self.chain.to_json()
        return out

    @classmethod
    def from_json(cls, data: dict) -> "PoolConfig":
        if not isinstance(data, dict):
            raise ContractViolation(f"a PoolConfig must be an object, got {data!r}")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ContractViolation(f"unknown PoolConfig fields: {sorted(unknown)}")
        data = dict(data)
        if data.get("chain") is not None:
            data["chain"] = ChainConfig.from_json(data["chain"])
        return cls(**data)


@dataclass(frozen=True)
class ChainConfig:
    """A chain of pools over one byte buffer of ``total_bytes`` (docs/spec.md §6).

    Member 0 is the ``PoolConfig`` holding this chain; ``peers`` are members 1.. (each
    without a chain of its own), in byte order. ``bytes_per_page[i]`` is member i's bytes per
    page; as in SGLang 0.5.23 each member's page ids span the whole buffer in its own units,
    so ``num_pages == total_bytes // bytes_per_page``. The layouts (``LAYOUTS``): two END
    pools, member 0 growing up from byte 0 and member 1 down from the top; or those two ends
    with a float pool between them (members up, float, down).

    Every member's page 0 is the padding sink at bytes ``[0, epp)``, so the sink takes the
    largest member's page 0 (``sink_bytes``), and no member may hand out a page below it:
    ``min_page * epp >= sink_bytes`` for each (SGLang's ``_reserved_floor_bytes``). A smaller
    ``min_page`` would let one member's padding writes land on another's live page."""

    total_bytes: int
    bytes_per_page: tuple[int, ...]
    peers: tuple[PoolConfig, ...] = ()

    LAYOUTS = {1: ("up",), 2: ("up", "down"), 3: ("up", "float", "down")}  # grow of each member, in byte order
    MAX_MEMBERS = 3

    def __post_init__(self) -> None:
        if not _is_int(self.total_bytes) or self.total_bytes < 1:
            raise ContractViolation(f"ChainConfig.total_bytes must be a positive int, got {self.total_bytes!r}")
        if not isinstance(self.bytes_per_page, tuple) or not all(_is_int(b) and b >= 1 for b in self.bytes_per_page):
            raise ContractViolation(f"ChainConfig.bytes_per_page must be a tuple of positive ints, got "
                                    f"{self.bytes_per_page!r}")
        if not isinstance(self.peers, tuple) or not all(isinstance(p, PoolConfig) for p in self.peers):
            raise ContractViolation(f"ChainConfig.peers must be a tuple of PoolConfig, got {self.peers!r}")
        if len(self.peers) + 1 > self.MAX_MEMBERS:
            raise ContractViolation(f"a chain has at most {self.MAX_MEMBERS} members (two END pools and a float "
                                    f"between them), got {len(self.peers) + 1}")
        if len(self.bytes_per_page) != len(self.peers) + 1:
            raise ContractViolation(f"ChainConfig.bytes_per_page has {len(self.bytes_per_page)} entries for "
                                    f"{len(self.peers) + 1} members")
        for i, peer in enumerate(self.peers, 1):
            if peer.chain is not None:
                raise ContractViolation(f"chain member {i} has a chain of its own")
            self.check_member(i, peer)

    @property
    def sink_bytes(self) -> int:
        """The bytes every member's page 0 may cover: the largest page of the chain."""
        return max(self.bytes_per_page)

    def min_page_for(self, i: int) -> int:
        """The least ``min_page`` member i may have: its first page at or above the sink."""
        epp = self.bytes_per_page[i]
        return -(-self.sink_bytes // epp)

    def check_member(self, i: int, cfg: PoolConfig) -> None:
        epp = self.bytes_per_page[i]
        if cfg.num_pages != self.total_bytes // epp:
            raise ContractViolation(f"chain member {i}: num_pages={cfg.num_pages}, but a member's pages span the "
                                    f"buffer: total_bytes // bytes_per_page = {self.total_bytes} // {epp} = "
                                    f"{self.total_bytes // epp}")
        layout = self.LAYOUTS[len(self.peers) + 1]
        if cfg.grow != layout[i] and (self.peers or cfg.is_float):  # one member alone is a plain pool, either way
            where = {1: "a member alone is an END pool", 2: "member 0 from byte 0, member 1 from the top",
                     3: "member 0 from byte 0, member 1 floating between, member 2 from the top"}[len(layout)]
            raise ContractViolation(f"chain member {i} must grow {layout[i]} ({where}), got {cfg.grow!r}")
        if cfg.min_page < self.min_page_for(i):
            raise ContractViolation(f"chain member {i}: min_page={cfg.min_page} puts its page {cfg.min_page} at byte "
                                    f"{cfg.min_page * epp}, inside the padding sink [0, {self.sink_bytes}) that "
                                    f"every member's page 0 shares; min_page must be at least "
                                    f"{self.min_page_for(i)}")

    def to_json(self) -> dict:
        return {"total_bytes": self.total_bytes, "bytes_per_page": list(self.bytes_per_page),
                "peers": [p.to_json() for p in self.peers]}

    @classmethod
    def from_json(cls, data) -> ChainConfig:
        if not isinstance(data, dict) or set(data) - {"total_bytes", "bytes_per_page", "peers"}:
            raise ContractViolation(f"a chain must be an object of total_bytes, bytes_per_page, peers, got {data!r}")
        bpp, peers = data.get("bytes_per_page"), data.get("peers", [])
        if not isinstance(bpp, list) or not isinstance(peers, list):
            raise ContractViolation(f"chain: bytes_per_page and peers must be lists, got {bpp!r}, {peers!r}")
        return cls(data.get("total_bytes"), tuple(bpp), tuple(PoolConfig.from_json(p) for p in peers))
