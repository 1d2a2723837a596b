"""Fixtures for the kvkernels tests: the tiers, red zones and random pool tables.

``tier`` runs a test on the torch path (CPU), on the Triton kernels under the
interpreter (CPU, when ``TRITON_INTERPRET=1`` is on, as tests/conftest.py arranges
without a GPU) and on the compiled kernels (CUDA, ``cuda`` marker). Every cuda test is
therefore the twin of an interpreter test; each one skips where its machine is missing.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from types import ModuleType

import pytest
import torch

import kvkernels
from kvkernels import launchers, torch_path

CANARY32 = 0x5A5A5A5A
CANARY64 = 0x5A5A5A5A5A5A5A5A
GUARD = 8  # guard rows on each side of a red-zoned buffer


@dataclass
class Guarded:
    """A tensor allocated inside a bigger buffer whose guard rows hold a canary."""

    buf: torch.Tensor
    view: torch.Tensor
    canary: int

    def guards_intact(self) -> bool:
        flat = self.buf.reshape(-1)
        n = self.view.numel()
        return bool((flat[:GUARD] == self.canary).all()) and bool((flat[GUARD + n :] == self.canary).all())


@dataclass
class Tier:
    name: str
    k: ModuleType  # the kernel set under test
    device: torch.device

    @property
    def triton(self) -> bool:
        return self.name != "torch"

    def t(self, values, dtype=torch.int64) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=self.device)

    def guarded(self, values, dtype=torch.int64, canary=CANARY64) -> Guarded:
        """1-D ``values`` inside [GUARD canaries | values | GUARD canaries]."""
        values = list(values)
        buf = torch.full((len(values) + 2 * GUARD,), canary, dtype=dtype, device=self.device)
        view = buf[GUARD : GUARD + len(values)]
        if values:
            view.copy_(torch.tensor(values, dtype=dtype))
        return Guarded(buf, view, canary)

    def shrink_blocks(self, monkeypatch, *, cols: int = 4, target: int = 8, ids: int = 4) -> None:
        """Small blocks, so the strided loop and the id grids run several iterations/programs."""
        monkeypatch.setattr(launchers, "BLOCK_COLS", cols)
        monkeypatch.setattr(launchers, "TARGET_BLOCKS", target)
        monkeypatch.setattr(launchers, "BLOCK_IDS", ids)


def _make_tier(name: str) -> Tier:
    if name == "torch":
        return Tier(name, torch_path, torch.device("cpu"))
    if name == "interpret":
        if not launchers.INTERPRET:
            pytest.skip("Triton's interpreter is off (a GPU is present): the cuda twin runs the kernels")
        return Tier(name, kvkernels, torch.device("cpu"))
    return Tier(name, kvkernels, torch.device("cuda"))


@pytest.fixture(params=["torch", "interpret", pytest.param("cuda", marks=pytest.mark.cuda)])
def tier(request) -> Tier:
    return _make_tier(request.param)


@pytest.fixture(params=["interpret", pytest.param("cuda", marks=pytest.mark.cuda)])
def triton_tier(request) -> Tier:
    """The Triton tiers only: for what the torch path does not have (grids, launches)."""
    return _make_tier(request.param)


class Pages:
    """Random pool tables as Python lists (kvref's representation), from a seeded rng."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    @staticmethod
    def initial(rows: int) -> tuple[list[int], list[int]]:
        """SPEC §1: every row -1 except row 0 (the padding sink)."""
        v2p = [-1] * rows
        p2v = [-1] * rows
        v2p[0] = p2v[0] = 0
        return v2p, p2v

    def bound(self, rows: int, fill: float = 0.5) -> tuple[list[int], list[int]]:
        """A random bijection between some virtual and physical pages in [1, rows - 1)."""
        v2p, p2v = self.initial(rows)
        ids = list(range(1, rows - 1))
        k = int(len(ids) * fill)
        for v, p in zip(self.rng.sample(ids, k), self.rng.sample(ids, k), strict=True):
            v2p[v] = p
            p2v[p] = v
        return v2p, p2v


@pytest.fixture
def rng(request) -> random.Random:
    """Seeded from the test id, so a failure reproduces."""
    return random.Random(request.node.nodeid)


@pytest.fixture
def pages(rng) -> Pages:
    return Pages(rng)
