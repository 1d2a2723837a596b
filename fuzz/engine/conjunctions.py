"""What a conjunction's missing siblings need: the edit that reaches a feature next to one an entry holds.

A bug behind a rare conjunction is found where every part of it holds at once: a read table's
third trip **and** a partial last block, a packed row's unaligned ``kv_start`` **and** a second
trip, a flush growing down **and** a reader in flight **and** a walk stopped by its move limit.
Its features are named by their parts (``trips|KERNEL|TRIPS|EDGE``, ``start|KERNEL|WHERE|TRIPS``,
``spec|flush|GROW|WHO|STOP``), so an entry holding one names its siblings, the same feature with
one part changed, and the corpus's counts say which of them no entry holds. Each part has the
edit that changes it alone:

* a row's trips and last block: the alloc that made the row, resized to the length they need
  (``aim``, ``streams.resize``), or the launch knobs at their smallest (``aimed_edit``);
* the pool's config (page size, grow direction, move limit): the one config draw that gives it
  (``reconfig_wants``, ``retune``); a fresh sequence's config the least held (``rare_config``);
* a reader in flight at a flush or none: a forward (or a fire) drawn just before it, the flush
  itself not urgent (``flush_siblings``, ``reader_edit``).
"""

from __future__ import annotations

import dataclasses
import functools
import random

from .features import config_features, feature_id, trip_bucket
from .generate import drawn_kind, op_draws, random_config
from .knobs import knob_module
from .streams import ChoiceRandom, flat, marks_of, params_of, row_target, segments, smallest


def frontier(entry: dict, why: str | None, rng: random.Random) -> list | None:
    """The goal a resize aims at (``streams.resize``) when ``entry`` was picked for trip feature
    ``why``: half the time ``why``'s own row, half the time the row of the entry's most trips (one
    more trip from there is what no entry has reached: a stone's own row may be a trip behind)."""
    goals = entry.get("goals") or {}
    if why not in goals:
        return None
    return goals[why] if rng.random() < 0.5 else max(goals.values(), key=lambda g: (g[3], -g[1]))


def aimed_edit(entry: dict, why: str, kernels) -> str:
    """A frontier plan's one edit: an aimed ``resize``, or where the stone's stride spans its
    row (the grid covers any length of it: at the largest programs per row, one trip whatever
    the row) and its knobs are not yet their smallest, ``shrink`` them (``streams.smallest``)."""
    goal, mod = (entry.get("goals") or {}).get(why) or [], knob_module(kernels)
    if len(goal) > 4 and goal[4] >= goal[0] and mod is not None and entry.get("knobs") != smallest(mod):
        return "shrink"
    return "resize"


def missing(counts, why: str, goal: list) -> list[tuple[int, str]]:
    """The trip features next to ``goal`` (``why``'s, a trip or progress feature) that no entry
    holds, as (trips, last block): one more trip with a partial or a full last block, or the
    same trips with the other edge. The kill of a third-trip bug is such a conjunction (3+ trips
    AND a partial, or a full, last block), so a stone at 2 trips partial aims at 3 trips
    partial, and one at 3 trips partial at 3 trips full. Never past 3+ (each interpreted trip is paid
    for: aims at 8+ spent a campaign on long rows, benchmarks/results/guided-vs-blind-foreign/README.md)."""
    kernel, have = why.split("|")[1], goal[3]
    if why.startswith("start|"):  # a packed row's kv_start: the same start one trip further
        want = f"start|{kernel}|{why.split('|')[2]}|trips {trip_bucket(have + 1)}"
        return [(have + 1, None)] if have < 3 and feature_id(want) not in counts else []
    more = [(have + 1, "partial"), (have + 1, "full")] if have < 3 else []  # past 3+: no bucket the report expects
    wants = more + [(have, e) for e in ("partial", "full") if have >= 1 and len(goal) > 4]
    return [w for w in wants if feature_id(f"trips|{kernel}|{trip_bucket(w[0])}|{w[1]}") not in counts]


def aim(goal: list | None, why: str | None, counts, rng: random.Random) -> tuple[int, int] | None:
    """(the row length ``goal`` starts from, the length aimed at): one of the trip features
    ``missing`` next to it, drawn (none missing: one more trip, either edge), made a length by
    ``streams.row_target``."""
    if goal is None or why is None:
        return None
    trips, edge = rng.choice(missing(counts, why, goal) or [(goal[3] + 1, None)])
    return goal[0], row_target(goal, rng, trips, edge)


START_TRIPS = ("2", "3+", "4-7", "8+")  # a packed row's kv_start must survive a second trip
CONFIG_TRIES = 4  # a fresh sequence's pool config: the least held of this many draws (``rare_config``)


def rare_config(counts, seed: int | str, want=None, tries: int = CONFIG_TRIES) -> list[float]:
    """The draws of a pool config (a stream's first draws), the one of ``tries`` drawn for ``seed``
    whose page size, growth and laziness the corpus (its feature ``counts``) holds fewest entries of,
    among those ``want(config)`` accepts (all, when none does)."""
    best = None
    for i in range(tries):
        draws = ChoiceRandom((), f"kvfuzz-config:{seed}" + (f":{i}" if i else ""))
        c = random_config(draws)
        held = sum(counts.get(feature_id(f), 0) for f in config_features(c, "", None) if "scenario" not in f and "lazy" not in f)
        key = (want is not None and not want(c), held)
        if best is None or key < best[0]:
            best = (key, draws.log)
    return list(best[1])


def reconfig_wants(why: str | None, counts) -> list:
    """The pool configs (tests of one) in which the siblings of ``why`` that no entry holds can be
    reached, where its own config cannot reach them (empty: its config can). A packed table whose
    rows reached two trips only with an aligned ``kv_start`` (or at page size 1: aligned by
    construction) needs pages of 2+ tokens. A flush's stop met growing one way needs a lazy pool
    growing the other; a walk that ended before its move limit, a smaller limit (one cut short
    where a reader pins nothing), and one cut short by it, no limit (so it reaches a pinned page).
    Mutations keep their entry's config (a corpus grown from its first entries stayed at page size
    1, one grow direction), so ``retune`` changes the one draw these need."""
    parts = (why or "").split("|")
    wants = []
    if parts[0] in ("trips", "start") and len(parts) > 1:
        k = parts[1]
        if any(feature_id(f"start|{k}|{w}|trips {b}") in counts for w in ("aligned", "page size 1") for b in START_TRIPS) \
                and not any(feature_id(f"start|{k}|unaligned|trips {b}") in counts for b in START_TRIPS):
            wants.append(_paged)
    return wants + [want for kind, want in flush_siblings(why, counts) if kind == "config"]


def _paged(c) -> bool:
    return c.page_size > 1


def _pool_shape(c, grow: str, moves: tuple = (0, 1 << 30)) -> bool:
    """A lazy pool growing ``grow`` whose walk's move limit is within ``moves``."""
    return c.lazy and c.grow == grow and moves[0] <= c.max_moves <= moves[1]


def retune(stream: list, seed: int, want, rng: random.Random) -> list | None:
    """``stream`` with one of its pool config's draws changed so that ``want(config)`` holds and as
    few of its fields as may be differ (the grow direction alone, the page size alone): the entry's
    pool but for what its missing siblings need. None: no one draw does it."""
    def config(s):
        return random_config(ChoiceRandom(s, f"kvfuzz-retune:{seed}"))

    base = config(stream)
    fields = [f.name for f in dataclasses.fields(base)]
    best = []
    draws = ChoiceRandom((), "kvfuzz-count")
    random_config(draws)
    for i in range(len(draws.log)):  # the config's draws: a stream's first
        for x in (0.05, 0.2, 0.35, 0.5, 0.65, 0.8, 0.95):
            cand = [*stream[:i], x, *stream[i + 1:]]
            c = config(cand)
            if want(c):
                best.append((sum(getattr(c, f) != getattr(base, f) for f in fields), i, x, cand))
    if not best:
        return None
    least = min(b[0] for b in best)
    return rng.choice([b[3] for b in best if b[0] == least])


# ---- a flush's siblings ----------------------------------------------------------------------------
OTHER = {"up": "down", "down": "up", "reader in flight": "no reader", "no reader": "reader in flight"}


def flush_siblings(why: str | None, counts) -> list[tuple[str, object]]:
    """The edits that take flush feature ``why`` (``spec|flush|GROW|WHO|STOP``) to a sibling no
    entry holds: ``("config", want)`` (``retune``: the other grow direction; a short walk where
    the walk never met its move limit; no limit where a reader is in flight, so it meets a pinned
    page), or ``("reader", True | False)`` (``reader_edit``: a reader in flight at that flush, or
    none). Empty for any other feature, or where every sibling is held."""
    parts = (why or "").split("|")
    if parts[:2] != ["spec", "flush"] or len(parts) < 5 or parts[4].startswith("pending"):
        return []
    grow, who, stop = parts[2:5]

    def lacks(g: str, w: str, s: str) -> bool:
        return feature_id(f"spec|flush|{g}|{w}|{s}") not in counts

    edits: list[tuple[str, object]] = []
    if lacks(OTHER[grow], who, stop):
        edits.append(("config", functools.partial(_pool_shape, grow=OTHER[grow])))
    if lacks(grow, OTHER[who], stop) and not (stop == "pinned page" and who == "reader in flight"):
        edits.append(("reader", who == "no reader"))
    if stop in ("frontier met", "pinned page") and lacks(grow, who, "move limit"):
        edits.append(("config", functools.partial(_pool_shape, grow=grow, moves=(0, 2))))
    if stop == "move limit" and who == "reader in flight" and lacks(grow, who, "pinned page"):
        edits.append(("config", functools.partial(_pool_shape, grow=grow, moves=(9, 1 << 30))))
    return edits


def reader_edit(entry: dict, focus: int | None, reader: bool) -> tuple[list[float], list[int]] | None:
    """(stream, marks) of ``entry`` with a forward (``reader``) or a fire drawn just before its op
    ``focus`` (a flush), and that flush not urgent (an urgent flush fires the forward first): the
    same state but for a reader in flight at it, or none. None where the op is no flush of a
    single pool's generator (a chain's draws its ops otherwise)."""
    if focus is None:
        return None
    segs = segments(entry)
    _, scenario, _ = params_of(entry["stream"], 0, entry["marks"])
    at = focus + 1
    if at >= len(segs) or len(segs[at]) < 2:
        return None
    draws, flush = op_draws(scenario, "forward" if reader else "fire"), op_draws(scenario, "flush", urgent=False)
    if draws is None or flush is None or drawn_kind(scenario, [d[0] for d in segs[at][:2]]) != "flush":
        return None  # another scenario's weights (a chain's), or the focus is no flush
    segs.insert(at, [[u, 0] for u in draws])
    segs[at + 1][2:3] = [[flush[2], 0]]
    return flat(segs), marks_of(segs)
