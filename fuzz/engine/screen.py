"""A guided plan screened on the spec before the target runs it.

Running a plan on the target is what a guided sequence pays for: the code under test and every
check, op by op (on the interpreter a few milliseconds an op, tens for a read table of long
rows). Its **shadow run**, the generator against the spec alone (``generate.regenerate``), costs
a small share of that (about 0.05 ms an op), and the spec alone already says part of what the
target run would reach (``spec_features``):

* how each flush's walk stopped (``spec|flush|...``), exactly: it is read from the spec;
* each read table's trips, masks and ``kv_start`` against its trips, predicted from its rows and
  the launches a table of its shape made before (``spec_features.predicted``): the launcher's
  grid is learnt from the set's own launches, whatever it names things.

So a plan is drawn several times (a fresh sequence under other draws, another mutation of
another pick) and the first whose shadow reaches a feature no corpus entry holds is the one run;
where none does, the first drawn (what an unscreened guide runs). Six draws where ops launch
kernels, two where they do not (``Screen``). A conjunction the spec can see (a walk stopped by
its move limit while a reader is in flight, a third trip over a partial block) is then found for
the price of shadow runs where blind generation pays target runs
(benchmarks/results/guided-vs-blind-foreign/README.md).
"""

from __future__ import annotations

from .features import feature_id
from .generate import regenerate
from .spec_features import Batches, predicted
from .streams import flat, marks_of, params_of, segments

TRIES = 6  # plans drawn at most for one sequence (``Screen``)
CHEAP_TRIES = 2  # ... where its ops launch no kernel (the torch tier)
LONGEST = 200  # a plan's ops screened at most (the small track's sequence)
CONJUNCTIONS = ("trips", "start", "spec")  # the domains whose features name their parts (``conjunctions``)
RESAMPLES = 24  # variants of a stone's read table drawn and predicted (``resample``)
KEEP = 3  # ... of which run at most


def spec_names(op, spec, out, batches: Batches) -> set[str]:
    """The features the spec alone says ``op`` reaches (what ``spec_features.note_op`` and a read
    table's launches would add): a flush's stop, a read table's predicted trips, masks and starts."""
    flushed = batches.flushed(op, spec)
    if out.error is not None:
        return set()
    if flushed:
        return set(flushed)
    if op.kind in ("read_table", "read_table_packed"):
        return predicted(op, spec.config.page_size)
    return set()


class _Novel(Exception):
    """A screened shadow run reached a feature no entry holds: the rest of it need not run."""


def shadow(info: dict, seed: int | str, entry: dict, stream, marks, n_ops: int, names: set | None = None,
           counts=None, per_op: dict | None = None):
    """The plan ``stream`` (cut at ``marks``; None: every op fresh, from ``seed``'s draws) run on
    the spec for ``n_ops`` ops as sequence ``seed`` would draw it, with ``entry``'s hostile mode
    and ``req_to_token`` dtype: (ops, config, the stream as drawn with its ranges and marks; ops
    empty where the run ended early, its marks say how many were drawn); what
    the spec says its ops reach is added to ``names`` (``spec_names``), and with ``counts`` (the
    corpus's) the run ends at the first op that reaches a conjunction they lack (``CONJUNCTIONS``);
    ``per_op``: op index -> what the spec says it reaches, for each op that reaches some."""
    config, scenario, rng = params_of(stream, seed, marks, chains=info["chains"])
    drawn_marks: list[int] = []

    def begin():
        rng.begin_op()
        drawn_marks.append(rng.pos)

    names, batches = set() if names is None else names, Batches()

    def on_spec(op, spec, out):
        got = spec_names(op, spec, out, batches)
        names.update(got)
        if per_op is not None and got:
            per_op[len(drawn_marks) - 1] = got
        if counts is not None and conjunction(n for n in got if feature_id(n) not in counts):
            raise _Novel

    ops = []
    try:
        _, _, ops = regenerate(0, n_ops, has=info["has"], skips=info["skips"], hostile=entry.get("hostile", "spec"),
                               params=(config, scenario, rng), r2t_dtype=entry.get("r2t"), on_op=begin,
                               rules=info["rules"], on_spec=None if names is None and per_op is None else on_spec,
                               reads=False)
    except _Novel:
        pass
    return ops, config, {"stream": rng.log, "ranges": rng.ranges, "marks": drawn_marks}


def resample(info: dict, seed: int, entry: dict, focus: int | None, counts) -> tuple[list, list, int, set] | None:
    """(stream, marks, variants, what the spec predicts they reach) of ``entry`` with variants of its read table ``focus`` drawn right after
    it: the same kind drawn afresh ``RESAMPLES`` times from the same state (a read changes nothing, so
    each is another table over the rows that state holds: another batch, lengths, starts, and so
    another grid and stride), of which those the spec predicts reach a conjunction no entry holds are
    kept (``KEEP`` at most), each as drawn; the entry's later ops after them.
    The draws a stone's rows need are in its state; the table that reads them with the grid of one
    more trip is a batch draw away, where a resize of its rows is a shadow run per try. None where
    op ``focus`` is no read table, or no variant is predicted to reach anything new."""
    segs = segments(entry)
    at = (focus if focus is not None else -2) + 1
    if not 1 <= at < len(segs) or len(segs[at]) < 2:
        return None
    head = segs[at][:2]  # its contract draw and its kind: the same op kind, every other draw fresh
    trial = segs[:at + 1] + [[list(d) for d in head] for _ in range(RESAMPLES)]
    per_op: dict = {}
    ops, _, drawn = shadow(info, seed, entry, flat(trial), marks_of(trial), at + RESAMPLES, per_op=per_op)
    if len(ops) < at + RESAMPLES or ops[focus].kind not in ("read_table", "read_table_packed"):
        return None
    tried = segments(drawn)
    variants = [i for i in range(at, at + RESAMPLES) if ops[i].kind == ops[focus].kind]
    good = [i for i in variants if conjunction(n for n in per_op.get(i, ()) if feature_id(n) not in counts)]
    if not good:  # nothing predicted (no grid of this kind seen, or nothing new): an aimed edit instead
        return None
    keep = good[:KEEP]
    new = segs[:at + 1] + [tried[i + 1] for i in keep] + segs[at + 1:]
    return flat(new), marks_of(new), len(keep), set().union(*(per_op.get(i, set()) for i in keep))


def conjunction(names) -> bool:
    """Whether ``names`` hold a feature of a domain whose features name their parts (``CONJUNCTIONS``)."""
    return any(n.split("|", 1)[0] in CONJUNCTIONS for n in names)


def shadow_of(info: dict, seed: int, entry: dict):
    """A mutation's shadow run (``streams.resize`` checks what it made on it): ``(stream, marks, upto)``
    -> (ops, config, the stream as drawn), for the entry's length or its first ``upto`` ops."""
    return lambda stream, marks, upto=None: shadow(info, seed, entry, stream, marks,
                                                   entry.get("ops", 0) if upto is None else min(upto, entry.get("ops", 0)))


class Screen:
    """How many plans are drawn (``pick``): ``TRIES`` on a tier whose ops launch kernels (a shadow op
    costs about a fiftieth of an interpreted one), ``CHEAP_TRIES`` on one whose ops launch none (on
    the torch tier a shadow op costs about a third of the op: more draws than two cost more than
    the plan's own run). A count, not a CPU budget: a campaign bounded by work plans the same
    sequences on any machine."""

    def __init__(self):
        self.screened = self.drawn = 0  # sequences whose plan a shadow chose; plans drawn

    def pick(self, draw, info: dict, counts, tries: int = TRIES) -> dict:
        """The plan to run: ``draw(attempt)`` -> a plan (its ``stream``, ``marks``, ``length``, its
        ``parent`` entry or none; attempt 0 is the unscreened plan), screened in turn; a fresh
        plan's ops are drawn under attempt ``seed:attempt`` (``fresh_seed``) and kept as drawn. The
        first whose shadow reaches a conjunction no entry holds (``CONJUNCTIONS``) is run; failing
        that, the first that reaches any feature none holds, else the first drawn."""
        best, first = None, None
        for attempt in range(tries):
            plan = draw(attempt)
            self.drawn += 1
            names: set[str] = set(plan.get("screened") or ())  # a plan screened as it was made (``resample``)
            if "screened" not in plan:
                _, _, drawn = shadow(info, plan["fresh_seed"], plan.get("parent") or {"r2t": plan["r2t"]},
                                     plan["stream"], plan.get("marks"), min(plan["length"], LONGEST), names, counts)
                if plan.get("marks") is None:  # a fresh plan: its ops as drawn under its own fresh seed
                    plan = {**plan, "stream": drawn["stream"], "marks": drawn["marks"]}
            novel = sorted(n for n in names if feature_id(n) not in counts)
            if conjunction(novel):
                self.screened += attempt > 0
                return {**plan, "screened": novel}
            first = first or plan
            best = best or (novel and {**plan, "screened": novel})
        return best or first
