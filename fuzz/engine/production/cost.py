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
the sequence's ``WorkBudget`` still holds it. The figures are estimates, conservative (the
smallest block and the largest target of the constants: a set whose blocks differ per
kernel is priced by its dearest), and they cost no kernel run: a generator stays a pure
function of its seed and ``scale_info``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..boundary import Constants, cdiv

SWEEP_BLOCK = 128  # a set with no constants (a power-of-two sweep): a block the estimate assumes


def _pairs(constants: Constants) -> list[tuple[int, int]]:
    """(block, target) pairs to price with; a sweep's 1-wide "blocks" would price every table
    as one program per column, so a sweep is priced at one typical block."""
    if constants.source == "sweep":
        return [(SWEEP_BLOCK, max(constants.targets.values(), default=SWEEP_BLOCK))]
    return [(b, t) for _, b, _, t in constants.pairs()] or [(SWEEP_BLOCK, SWEEP_BLOCK)]


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


def reaches_trip(constants: Constants, bs: int, cols: int) -> bool:
    """Whether a row ``cols`` long gives a program of a bs-sized strided grid a second trip for
    some block/target pair: what only a table of about TARGET programs can reach."""
    return any(cols > cdiv(t, bs) * b for b, t in _pairs(constants))


@dataclass
class WorkBudget:
    """One sequence's allowance on the interpreter: every op up to ``op_work`` freely; a dearer
    one (up to ``trip_work``) only where it reaches a second trip and while ``left`` holds it."""

    op_work: int
    trip_work: int
    left: int

    def allows(self, work: int, trip: bool) -> bool:
        return work <= self.op_work or (trip and work <= min(self.trip_work, self.left))

    def charge(self, work: int) -> None:
        """Count an op drawn: what it takes beyond ``op_work`` comes out of ``left``."""
        if work > self.op_work:
            self.left -= work
