"""What a frontier plan aims at (``guide.GuidedTrack.plan``): the row a resize starts from
(``frontier``), the one edit it makes (``aimed_edit``), the trip features next to its stone that no
entry holds (``missing``) and the row length that reaches one (``aim``)."""

from __future__ import annotations

import random

from .features import feature_id, trip_bucket
from .knobs import knob_module
from .mutations import row_target, smallest

__all__ = ["aim", "aimed_edit", "frontier", "missing"]


def frontier(entry: dict, why: str | None, rng: random.Random) -> list | None:
    """The goal a resize aims at (``mutations.resize``) when ``entry`` was picked for trip feature
    ``why``: half the time ``why``'s own row, half the time the row of the entry's most trips (one
    more trip from there is what no entry has reached: a stone's own row may be a trip behind)."""
    goals = entry.get("goals") or {}
    if why not in goals:
        return None
    return goals[why] if rng.random() < 0.5 else max(goals.values(), key=lambda g: (g[3], -g[1]))


def aimed_edit(entry: dict, why: str, kernels) -> str:
    """A frontier plan's one edit: an aimed ``resize``; where the stone's stride spans its row (one
    trip whatever the row) and its knobs are not yet their smallest, ``shrink`` them; for a packed
    row of 2+ trips from an aligned ``kv_start``, ``realign`` it (``mutations.realign``)."""
    goal, mod = (entry.get("goals") or {}).get(why) or [], knob_module(kernels)
    if "|aligned|" in why:
        return "realign"
    if len(goal) > 4 and goal[4] >= goal[0] and mod is not None and entry.get("knobs") != smallest(mod):
        return "shrink"
    return "resize"


def missing(counts, why: str, goal: list) -> list[tuple[int, str]]:
    """The trip features next to ``goal`` (``why``'s, a trip or progress feature) that no entry
    holds, as (trips, last block): one more trip with a partial or a full last block, or the
    same trips with the other edge. The kill of a third-trip bug is such a conjunction (3+ trips
    AND a partial, or a full, last block), so a stone at 2 trips partial aims at 3 trips partial, and
    one at 3 trips partial at 3 trips full. Never past 3+ (aims at 8+ spent a campaign on long rows)."""
    kernel, have = why.split("|")[1], goal[3]
    if why.startswith("start|"):  # unaligned one trip further; from aligned 2+ trips as long; page size 1: 2+, as long
        trips = {"aligned": have if have >= 2 else 0, "page size 1": max(have, 2) if have else 0}.get(
            why.split("|")[2], have + 1 if have < 3 else 0)
        return [(trips, None)] if trips and feature_id(f"start|{kernel}|unaligned|trips {trip_bucket(trips)}") not in counts else []
    more = [(have + 1, "partial"), (have + 1, "full")] if have < 3 else []  # past 3+: no bucket the report expects
    wants = more + [(have, e) for e in ("partial", "full") if have >= 1 and len(goal) > 4]
    return [w for w in wants if feature_id(f"trips|{kernel}|{trip_bucket(w[0])}|{w[1]}") not in counts]


def aim(goal: list | None, why: str | None, counts, rng: random.Random) -> tuple[int, int] | None:
    """(the row length ``goal`` starts from, the length aimed at): one of the trip features
    ``missing`` next to it, drawn (none missing: one more trip, either edge), made a length by
    ``mutations.row_target``."""
    if goal is None or why is None:
        return None
    trips, edge = rng.choice(missing(counts, why, goal) or [(goal[3] + 1, None)])
    return goal[0], row_target(goal, rng, trips, edge)
