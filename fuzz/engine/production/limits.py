"""How big the production generator goes, per device (the op language itself has no limits)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class ScaleLimits:
    """How big the generator goes (the op language itself has no limits)."""

    pool_pages: int = 1 << 20  # at page size 1
    pool_pages_paged: int = 1 << 16  # at page size > 1
    page_sizes: tuple = (1, 1, 16, 64)
    multipliers: tuple = (1, 2, 8, 64)
    max_ids: int = 1 << 16
    max_bs: int = 512
    max_step_bs: int = 4096  # bs at cdiv(TARGET, bs) steps may exceed max_bs up to this
    max_row_tokens: int = 1 << 18
    max_read_elems: int = 1 << 27  # bs * max_pages of one read table
    max_r2t_elems: int = 1 << 27
    max_packed: int = 1 << 25
    max_programs: int | None = None  # read-table programs per launch (the interpreter's cost)
    graph_steps: int = 32
    graph_programs: int | None = None
    # The share of sequences with one read table past 2^31 elements (p_read_table_far: 8-34 GB of
    # device memory for a moment, asked for first), early in the sequence. Every sequence on the
    # interpreter (on the CPU untouched pages cost nothing: ``interpreter_priced``); off on the torch tier.
    far_r2t: float = 0.75
    # The interpreter's prices (``cost``: programs + column-block trips): a read table up to
    # ``op_work`` is drawn freely, a dearer one up to ``trip_work`` only where it gives a row a
    # second trip and while the sequence's ``sequence_work`` holds it. None: unpriced (a GPU).
    op_work: int | None = None
    trip_work: int | None = None
    sequence_work: int | None = None
    # Each sequence first meets every op kind of its mix once (``ScaleGenerator.tour``), so a short
    # interpreter run has met them all; False: the mix's weights from the first op on (a GPU).
    tour: bool = False

    @classmethod
    def production(cls) -> ScaleLimits:
        return cls()

    @classmethod
    def interpreter(cls) -> ScaleLimits:
        """Production constants, sizes the interpreter runs in about a second per op."""
        return cls(pool_pages=1 << 17, pool_pages_paged=1 << 14, max_ids=1 << 14, max_bs=512, max_step_bs=2048,
                   max_row_tokens=1 << 17, max_read_elems=1 << 21, max_r2t_elems=1 << 22, max_packed=1 << 20,
                   max_programs=2200, graph_steps=6, graph_programs=300, far_r2t=0.0)

    @classmethod
    def interpreter_priced(cls) -> ScaleLimits:
        """The interpreter's limits (``--backend interpret``): ``interpreter``'s sizes, the tables
        priced (``cost``) and every sequence touring its mix first, with one far read table each
        (on the CPU it maps gigabytes it never touches: ``far``). About 1.5-4 ms per unit of
        work on a loaded 2-core runner: a tour of cheap ops costs a few seconds, a table that
        reaches a second trip of the production constants 2,000-6,000 units."""
        return dataclasses.replace(cls.interpreter(), far_r2t=1.0, op_work=400, trip_work=6000,
                                   sequence_work=9000, tour=True)

    @classmethod
    def small(cls) -> ScaleLimits:
        return cls(pool_pages=1 << 12, pool_pages_paged=1 << 9, page_sizes=(1, 2, 4), max_ids=700, max_bs=40,
                   max_step_bs=40, max_row_tokens=1 << 11, max_read_elems=1 << 14, max_r2t_elems=1 << 16,
                   max_packed=1 << 14, max_programs=300, graph_steps=4, graph_programs=120, far_r2t=0.0)

    @classmethod
    def for_tier(cls, tier) -> ScaleLimits:
        return cls.production() if str(tier.device).startswith("cuda") else cls.interpreter()
