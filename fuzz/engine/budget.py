"""Work budgets checked before a launch runs, not after: ``launches`` hands each outermost
launch's program count (its grid as Triton resolves it) to the checks of
``launches.budget()`` entered now, and a launch one of them refuses raises ``OverBudget`` in
its place: it does not run, and no observer or recorder sees it. A guided fresh sequence ends this way, its op dropped, before
one read table of thousands of programs spends its budget many times over (``guide``)."""

from __future__ import annotations

import math

_BUDGETS: list = []  # checks of launches.budget(): each outermost launch's programs, before it runs


class OverBudget(BaseException):
    """A launch a ``budget`` check refused. A BaseException, so that no ``except Exception`` of
    the harness takes it for the target's crash; whoever set the budget catches it."""


def charge(launch) -> None:
    """Raise OverBudget where a check refuses the launch's programs (an unread grid passes)."""
    if _BUDGETS and launch.grid_dims is not None:
        programs = math.prod(launch.grid_dims)
        if any(check(programs) for check in list(_BUDGETS)):
            raise OverBudget(f"{launch.name}: {programs} programs")
