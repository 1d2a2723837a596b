"""What a production read table costs on Triton's interpreter, told from its sizes alone.

The interpreter runs a launch's programs one after the other in Python, each at a fixed
cost (a few ms on a loaded 2-core runner) plus one for every trip of its column loop; a
read table of the production constants reaching a second trip (``cdiv(TARGET, bs)`` column
programs per row, so about TARGET programs whatever bs is) runs thousands of programs and
takes seconds. Drawn by default, such tables ate a sequence's minute (about 16 ops a
minute on a foreign set) while the ops that need no trip at all (a tail column block, a
far row offset, a partial id block) waited behind them. So on the interpreter the
generator prices every table it draws, ``work = programs + column-block trips`` from the
set's constants (``boundary.Constants``, the same ones its sizes aim at), before it
commits to it: a table under ``op_work`` is drawn freely, a dearer one only when it gives
a long row a second trip (``reaches_trip``: the one thing only many programs reach) and
the sequence's ``Prices`` still hold it. The read table's block is the constants' column
block where one is named so (``BLOCK_COLS``, a launch's ``COLS``), else every block; a
second trip is one for every such block, so a table let through for one is never let
through for a trip of an id block the read table does not have. The figures are estimates
and cost no kernel run: a generator stays a pure function of its seed and ``scale_info``.
"""

from __future__ import annotations

from ..boundary import Constants, cdiv

SWEEP_BLOCK = 128  # a set with no constants (a power-of-two sweep): a block the estimate assumes


def _pairs(constants: Constants) -> list[tuple[int, int]]:
    """(column block, target) pairs of the read table: the blocks named for columns where
    there are any, else every block. A sweep's 1-wide "blocks" would price every table as one
    program per column, so a sweep is priced at one typical block."""
    if constants.source == "sweep":
        return [(SWEEP_BLOCK, max(constants.targets.values(), default=SWEEP_BLOCK))]
    pairs = constants.pairs()
    cols = [(b, t) for bn, b, _, t in pairs if "COL" in bn.upper()]
    return cols or [(b, t) for _, b, _, t in pairs] or [(SWEEP_BLOCK, SWEEP_BLOCK)]


def programs(constants: Constants, bs: int, cols: int) -> int:
    """The most read-table programs any block/target pair of the constants would launch for
    ``bs`` rows of ``cols`` columns (SPEC §2's bs-sized strided grid)."""
    return max((bs * min(cdiv(t, bs), cdiv(cols, b)) for b, t in _pairs(constants)), default=bs)


def trips(constants: Constants, bs: int, cols: int, long_rows: int | None = None) -> int:
    """Column-block trips of a table whose ``long_rows`` rows are ``cols`` long and the others
    half that on average (the generators' seeded lengths); every row long when None."""
    b = min(b for b, _ in _pairs(constants))
    per_row = cdiv(max(cols, 0), b)
    if long_rows is None or long_rows >= bs:
        return bs * per_row
    return long_rows * per_row + (bs - long_rows) * per_row // 2


def table_work(constants: Constants, bs: int, cols: int, *, long_rows: int | None = None, launches: int = 1,
               grid_cols: int | None = None) -> int:
    """Programs plus trips of ``launches`` launches of a bs x cols read table. ``grid_cols``:
    the width its grid is sized by when that is not a row's (a packed table's ``max_tokens``,
    the whole batch's tokens)."""
    return launches * (programs(constants, bs, cols if grid_cols is None else grid_cols)
                       + trips(constants, bs, cols, long_rows))


def trip_pages(constants: Constants, bs: int) -> int:
    """The fewest columns that give a program of a bs-sized strided grid a second trip for every
    column block (what only a table of about TARGET programs can reach)."""
    return max(cdiv(t, bs) * b for b, t in _pairs(constants)) + 1


def reaches_trip(constants: Constants, bs: int, cols: int) -> bool:
    return cols >= trip_pages(constants, bs)


class Prices:
    """One sequence's allowance on the interpreter (``ScaleLimits``' ``op_work``, ``trip_work``,
    ``sequence_work``): every table up to ``op_work`` freely; a dearer one (up to ``trip_work``)
    only where it reaches a second trip, outside the tour (``touring``), while ``left`` holds it."""

    tries = 32  # draws a table gets before its fallback (8 unpriced): prices turn many down

    def __init__(self, constants: Constants, limits):
        self.constants = constants
        self.op_work, self.trip_work = limits.op_work, limits.trip_work or limits.op_work
        self.left = limits.sequence_work or 0
        self.touring = False  # the op being drawn is the tour's (or the far table): cheap only

    def work(self, bs: int, cols: int, **kw) -> int:
        return table_work(self.constants, bs, cols, **kw)

    def affords(self, bs: int, cols: int, **kw) -> bool:
        """Whether a bs x cols table (``kw``: as ``table_work``'s) is within the prices now."""
        work = self.work(bs, cols, **kw)
        trip = not self.touring and reaches_trip(self.constants, bs, cols)
        return work <= self.op_work or (trip and work <= min(self.trip_work, self.left))

    def take(self, bs: int, cols: int, **kw) -> bool:
        """Charge a table drawn: what is past ``op_work`` comes out of ``left``; True if it is dear."""
        work = self.work(bs, cols, **kw)
        if work > self.op_work:
            self.left -= work
            return True
        return False
