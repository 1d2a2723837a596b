"""Hypothesis strategies over the op language, and the differential state machine.

The seeded generator (``fuzz.generate``) is the fast path the CLI runs; this module is
the same op language seen through Hypothesis, which adds shrinking to a minimal rule
sequence and swarm selection of rules. Both produce the op dicts of ``fuzz.ops`` and
feed them to ``PoolRun.step``, so a failure found here is a case file the CLI replays:
the machine keeps the op list it ran (``machine.ops``, with ``machine.knobs``, the
launch block sizes it drew when the kernel set exposes any) for exactly that.

Live requests are a Bundle. A ``clear`` cannot empty a Bundle, so each request carries
the generation it was allocated in; a request from an older generation is dead (its
ids may even be live again, owned by a newer request) and only ever appears as a
read-table row, where any token is fair game.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, multiple, precondition, rule

import kvref

from .backends import Tier, make_tier
from .knobs import knob_module
from .ops import validate_op
from .runner import Divergence, PoolRun

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
CLEAR_EVERY = 12  # ops between two clears, at least


# ---- pool configs ----------------------------------------------------------------


@st.composite
def pool_configs(draw, max_pages: int = 24, page_sizes=(1, 2, 4), lazy: bool | None = None) -> kvref.PoolConfig:
    """Small pools: every shape of SPEC §1 (both growth directions, lazy and eager)."""
    min_page = draw(st.integers(1, 3))
    return kvref.PoolConfig(
        num_pages=draw(st.integers(min_page + 1, max(min_page + 1, max_pages))),
        min_page=min_page,
        page_size=draw(st.sampled_from(page_sizes)),
        grow=draw(st.sampled_from(("up", "down"))),
        lazy=draw(st.booleans()) if lazy is None else lazy,
        multiplier=draw(st.sampled_from((1, 2, 3, 16))),
        max_moves=draw(st.sampled_from((0, 1, 2, 8, 64))),
    )


def launch_knobs(kernels):
    """One choice per launch knob the kernel set exposes (``fuzz.knobs``), or None."""
    mod = knob_module(kernels)
    if mod is None:
        return st.none()
    return st.fixed_dictionaries({name: st.sampled_from(tuple(choices))
                                  for name, choices in sorted(mod.FUZZ_KNOBS.items())})


# ---- helpers ---------------------------------------------------------------------


def pages_of(tokens: list[int], page_size: int) -> list[list[int]]:
    return [tokens[i:i + page_size] for i in range(0, len(tokens), page_size)]


def _flat(pages: list[list[int]]) -> list[int]:
    return [t for p in pages for t in p]


def _junk_ids(config: kvref.PoolConfig):
    """Ids a forward pass may hand translate: padding (-1), negatives, past the pool."""
    top = (config.num_pages + 3) * config.page_size
    return st.one_of(st.just(-1), st.integers(-50, -2), st.integers(0, top), st.sampled_from((INT64_MIN, INT64_MAX)))


# ---- pool ops --------------------------------------------------------------------


def alloc_ops(config: kvref.PoolConfig, room: int | None = None):
    """alloc{n}: usually what fits, sometimes exactly one page too many (returns None)."""
    room = config.capacity_pages if room is None else max(room, 0)
    pages = st.one_of(st.integers(1, max(1, min(room, 6))), st.integers(0, room + 1))
    return pages.map(lambda k: {"op": "alloc", "n": k * config.page_size})


@st.composite
def _free_run(draw, config: kvref.PoolConfig, pages: list[list[int]]) -> list[int]:
    """A run shaped like a req_to_token row (SPEC §3 free, step 1): pages in any order,
    the last page possibly partial."""
    pages = list(pages)
    if config.page_size == 1 or draw(st.booleans()):
        pages = draw(st.permutations(pages))
    tokens = _flat(pages)
    if config.page_size > 1 and pages:
        tokens = tokens[: len(tokens) - draw(st.integers(0, config.page_size - 1))]
    return tokens


def free_ops(config: kvref.PoolConfig, tokens: list[int]):
    """free{tokens} of a whole live request."""
    return _free_run(config, pages_of(tokens, config.page_size)).map(lambda t: {"op": "free", "tokens": t})


@st.composite
def split_free_ops(draw, config: kvref.PoolConfig, tokens: list[int]) -> tuple[dict, list[int]]:
    """free{tokens} of a part of a live request (a prefix or a suffix of its pages, or
    any subset); returns (op, the tokens still live)."""
    pages = pages_of(tokens, config.page_size)
    if len(pages) < 2:
        return draw(free_ops(config, tokens)), []
    how = draw(st.sampled_from(("prefix", "suffix", "subset")))
    if how == "subset":
        gone_idx = set(draw(st.sets(st.integers(0, len(pages) - 1), min_size=1, max_size=len(pages) - 1)))
    else:
        cut = draw(st.integers(1, len(pages) - 1))
        gone_idx = set(range(cut)) if how == "prefix" else set(range(cut, len(pages)))
    gone = [p for i, p in enumerate(pages) if i in gone_idx]
    keep = [p for i, p in enumerate(pages) if i not in gone_idx]
    return {"op": "free", "tokens": draw(_free_run(config, gone))}, _flat(keep)


def flush_ops():
    return st.builds(lambda u: {"op": "flush", "urgent": u}, st.booleans())


def forward_ops(tokens: list[int]):
    """forward{tokens}: the pages a forward pass writes (any live tokens, maybe none)."""
    return st.lists(st.sampled_from(tokens), unique=True).map(lambda t: {"op": "forward", "tokens": t}) \
        if tokens else st.just({"op": "forward", "tokens": []})


@st.composite
def write_ops(draw, tokens: list[int], first_stamp: int = 1) -> dict:
    """write{tokens, stamps}: unique live tokens; stamps count up, or sit at int64's ends."""
    toks = draw(st.lists(st.sampled_from(tokens), unique=True, max_size=16)) if tokens else []
    if draw(st.integers(0, 7)) == 0:
        stamps = draw(st.lists(st.sampled_from((INT64_MIN, INT64_MAX, -1, 0, 2**31, -(2**31) - 1)),
                               min_size=len(toks), max_size=len(toks)))
    else:
        stamps = list(range(first_stamp, first_stamp + len(toks)))
    return {"op": "write", "tokens": toks, "stamps": stamps}


def read_ops(tokens: list[int]):
    """read{tokens}: live tokens, repeats allowed."""
    if not tokens:
        return st.just({"op": "read", "tokens": []})
    return st.lists(st.sampled_from(tokens), max_size=16).map(lambda t: {"op": "read", "tokens": t})


@st.composite
def translate_ops(draw, config: kvref.PoolConfig, tokens: list[int], dead: list[int] = ()) -> dict:
    """translate{loc}: live tokens mixed with padding, negatives, dead and far ids."""
    pool = st.one_of(*(s for s in (st.sampled_from(tokens) if tokens else None,
                                   st.sampled_from(list(dead)) if dead else None,
                                   _junk_ids(config)) if s is not None))
    return {"op": "translate", "loc": draw(st.lists(pool, max_size=12))}


@st.composite
def _rows(draw, rows: list[list[int]]) -> list[list[int]]:
    """req_to_token rows: the given token lists, some tokens replaced by -1 (padding)."""
    out = []
    for row in rows or [[]]:
        row = list(row)
        if row and draw(st.integers(0, 5)) == 0:
            for i in draw(st.sets(st.integers(0, len(row) - 1), max_size=3)):
                row[i] = -1
        out.append(row)
    return out


@st.composite
def read_table_ops(draw, config: kvref.PoolConfig, rows: list[list[int]], broken: bool = False) -> dict:
    """read_table: live, dead and padded rows, short live prefixes, slack in max_pages
    and width; ``broken`` puts a seq_len past max_pages (a contract violation)."""
    ps = config.page_size
    rows = draw(_rows(rows))
    bs = draw(st.one_of(st.integers(0, 4), st.sampled_from((17, 64))))
    req_idx = [draw(st.integers(0, len(rows) - 1)) for _ in range(bs)]
    lens = [draw(st.one_of(st.just(len(rows[j])), st.integers(0, len(rows[j])))) for j in req_idx]
    max_pages = max([-(-n // ps) for n in lens] + [1]) + draw(st.sampled_from((0, 0, 1, 5)))
    width = max([max_pages * ps] + [len(r) for r in rows]) + draw(st.sampled_from((0, 0, 3)))
    if broken:
        if not req_idx:
            req_idx = [0]
            lens = [0]
        b = draw(st.integers(0, len(lens) - 1))
        lens[b] = max_pages * ps + draw(st.integers(1, ps + 8))
    return {"op": "read_table", "rows": rows, "req_idx": req_idx, "seq_lens": lens, "max_pages": max_pages,
            "width": width, "legacy": draw(st.booleans())}


@st.composite
def read_table_packed_ops(draw, config: kvref.PoolConfig, rows: list[list[int]]) -> dict:
    """read_table_packed: the CSR form, with and without kv_start, gaps in indptr."""
    ps = config.page_size
    rows = draw(_rows(rows))
    bs = draw(st.integers(1, 4))
    req_idx = [draw(st.integers(0, len(rows) - 1)) for _ in range(bs)]
    kv_start = draw(st.one_of(st.none(), st.lists(st.integers(0, ps), min_size=bs, max_size=bs)))
    lens = []
    for b, j in enumerate(req_idx):
        start = 0 if kv_start is None else kv_start[b]
        lens.append(draw(st.integers(0, max(0, len(rows[j]) - start))))
    indptr = [0]
    for n in lens:
        indptr.append(indptr[-1] + n + draw(st.sampled_from((0, 0, 2))))
    width = max([len(r) for r in rows] + [1]) + ps
    return {"op": "read_table_packed", "rows": rows, "req_idx": req_idx, "seq_lens": lens, "kv_start": kv_start,
            "indptr": indptr, "max_tokens": max(lens + [1]), "width": width}


VIOLATIONS = ("unaligned", "reserved", "out_of_range", "duplicate", "double_free", "write_dead", "read_dead",
              "forward_dead", "write_twice", "read_table_short")


@st.composite
def violation_ops(draw, config: kvref.PoolConfig, live: list[list[int]], dead: list[list[int]]) -> dict:
    """An op the spec must refuse (ContractViolation). ``dead`` must hold only runs of
    pages that are not live now; kinds whose material is missing fall back to
    ``reserved``."""
    ps = config.page_size
    kind = draw(st.sampled_from(VIOLATIONS))
    if kind in ("duplicate", "write_twice") and not live:
        kind = "reserved"
    if kind in ("double_free", "write_dead", "read_dead", "forward_dead") and not dead:
        kind = "reserved"
    if kind == "unaligned" and ps == 1:
        kind = "out_of_range"
    if kind == "unaligned":
        return {"op": "alloc", "n": draw(st.integers(0, 4)) * ps + draw(st.integers(1, ps - 1))}
    if kind == "reserved":
        page = draw(st.integers(0, config.min_page - 1))
        return {"op": "free", "tokens": list(range(page * ps, page * ps + ps))}
    if kind == "out_of_range":
        page = draw(st.integers(config.num_pages, config.num_pages + 4))
        return {"op": "free", "tokens": list(range(page * ps, page * ps + ps))}
    if kind == "read_table_short":
        return draw(read_table_ops(config, live, broken=True))
    if kind in ("duplicate", "write_twice"):
        req = draw(st.sampled_from(live))
        if kind == "write_twice":
            return {"op": "write", "tokens": [req[0], req[0]], "stamps": [1, 2]}
        return {"op": "free", "tokens": req[:ps] + req[:ps]}
    run = draw(st.sampled_from(dead))
    if kind == "double_free":
        return {"op": "free", "tokens": run}
    if kind == "write_dead":
        return {"op": "write", "tokens": run[:1], "stamps": [7]}
    if kind == "read_dead":
        return {"op": "read", "tokens": run[:2]}
    return {"op": "forward", "tokens": run[:1]}


def pool_ops(config: kvref.PoolConfig, live: list[list[int]] = (), dead: list[list[int]] = ()):
    """Any one op of the language, given the live requests (lists of tokens) and the
    dead runs. Free ops here free whole requests."""
    live = [list(r) for r in live if r]
    tokens = sorted({t for r in live for t in r})
    choices = [alloc_ops(config), flush_ops(), st.just({"op": "fire"}), st.just({"op": "clear"}),
               forward_ops(tokens), write_ops(tokens), read_ops(tokens), translate_ops(config, tokens),
               read_table_ops(config, live + [list(r) for r in dead]),
               read_table_packed_ops(config, live + [list(r) for r in dead]),
               violation_ops(config, live, [list(r) for r in dead])]
    if live:
        choices.append(st.sampled_from(live).flatmap(lambda r: free_ops(config, r)))
    return st.one_of(choices).map(validate_op)


# ---- the state machine -----------------------------------------------------------


@st.composite
def raw_ops(draw, raw_v2p: list[int]) -> dict:
    """A valid kernel-level op on raw tables in the state ``raw_v2p`` (ids in [1, rows - 1))."""
    rows = len(raw_v2p)
    bound = [v for v in range(1, rows - 1) if raw_v2p[v] != -1]
    used_p = {raw_v2p[v] for v in bound}
    free_v = [v for v in range(1, rows - 1) if raw_v2p[v] == -1]
    free_p = [p for p in range(1, rows - 1) if p not in used_p]
    kinds = (["k_free_unbind"] if bound else []) + (["k_bind", "k_alloc_bind"] if free_v and free_p else [])
    kind = draw(st.sampled_from(kinds or ["k_free_unbind"]), label="raw kind")
    if kind == "k_free_unbind":
        return {"op": kind, "v": draw(st.lists(st.sampled_from(bound), min_size=1, unique=True), label="v")
                if bound else []}
    n = draw(st.integers(1, min(len(free_v), len(free_p), 8)), label="n")
    v = draw(st.lists(st.sampled_from(free_v), min_size=n, max_size=n, unique=True), label="v")
    if kind == "k_alloc_bind":
        runs = [p for p in free_p if all(p + i in free_p for i in range(n))]
        if runs:
            return {"op": kind, "v": v, "start": draw(st.sampled_from(runs), label="start")}
    return {"op": "k_bind", "v": v,
            "p": draw(st.lists(st.sampled_from(free_p), min_size=n, max_size=n, unique=True), label="p")}


@dataclass(frozen=True, eq=False)
class Request:
    """A live request: its tokens, in allocation order, and the clear-generation it
    was allocated in."""
    tokens: tuple
    gen: int

    def __repr__(self) -> str:
        return f"Request({list(self.tokens)}, gen={self.gen})"


# An argument drawing a list from an empty Bundle would invalidate the whole example.
_has_requests = precondition(lambda self: bool(self.bundle("requests")))


class DifferentialMachine(RuleBasedStateMachine):
    """Spec vs target, one op per rule, through ``PoolRun.step`` (which raises
    Divergence at the first disagreement). Subclass per tier with ``for_tier``; the
    base class runs the torch tier."""

    tier: Tier | None = None
    requests = Bundle("requests")

    @classmethod
    def for_tier(cls, tier: Tier) -> type:
        name = f"{cls.__name__}_{tier.backend}_{tier.kernels_name}"
        return type("".join(ch if ch.isalnum() else "_" for ch in name), (cls,), {"tier": tier})

    def __init__(self):
        super().__init__()
        self.run: PoolRun | None = None
        self.ops: list[dict] = []
        self.divergence: Divergence | None = None

    # ---- plumbing -------------------------------------------------------------
    @initialize(config=pool_configs(), data=st.data())
    def setup(self, config, data):
        tier = type(self).tier or make_tier("torch")
        self.config = config
        self.knobs = data.draw(launch_knobs(tier.kernels), label="knobs")
        self.run = PoolRun(config, tier, knobs=self.knobs)
        self.gen = 0
        self.stamp = 1
        self.dead: list[list[int]] = []
        self.cleared_at = 0

    def _do(self, op: dict):
        validate_op(op)
        self.ops.append(op)
        try:
            return self.run.step(op)
        except Divergence as d:
            self.divergence = d
            raise

    def _live(self, reqs) -> list[list[int]]:
        return [list(r.tokens) for r in reqs if r.gen == self.gen]

    def _tokens(self, reqs) -> list[int]:
        return sorted({t for r in self._live(reqs) for t in r})

    def _dead_runs(self) -> list[list[int]]:
        """Freed runs whose pages are all still unbound in the spec (so a second free is
        a double free, not a free of someone else's re-allocated page)."""
        ps, v2p = self.config.page_size, self.run.spec.v2p
        return [r for r in self.dead if all(v2p[t // ps] == -1 for t in r[::ps])]

    def _flush_has_work(self) -> bool:
        spec = self.run.spec
        return bool(spec.holes or spec.pending or spec.reader_in_flight())

    def _freed(self, op: dict) -> None:
        ps = self.config.page_size
        pages = sorted({t // ps for t in op["tokens"]})
        self.dead = (self.dead + [[p * ps + o for p in pages for o in range(ps)]])[-16:]

    # ---- rules: the op language -------------------------------------------------
    @rule(target=requests, data=st.data())
    def alloc(self, data):
        spec = self.run.spec
        out = self._do(data.draw(alloc_ops(self.config, spec.index_room() + len(spec.holes)), label="op"))
        return Request(tuple(out.result), self.gen) if out.result else multiple()

    @rule(req=consumes(requests), data=st.data())
    def free(self, req, data):
        if req.gen != self.gen:
            return
        op = data.draw(free_ops(self.config, list(req.tokens)), label="op")
        self._do(op)
        self._freed(op)

    @rule(target=requests, req=consumes(requests), data=st.data())
    def free_part(self, req, data):
        if req.gen != self.gen:
            return multiple()
        op, keep = data.draw(split_free_ops(self.config, list(req.tokens)), label="op")
        self._do(op)
        self._freed(op)
        return Request(tuple(keep), self.gen) if keep else multiple()

    @precondition(lambda self: self._flush_has_work())
    @rule(op=flush_ops())
    def flush(self, op):
        self._do(op)

    @_has_requests
    @rule(reqs=st.lists(requests, max_size=3), data=st.data())
    def forward(self, reqs, data):
        self._do(data.draw(forward_ops(self._tokens(reqs)), label="op"))

    @precondition(lambda self: self.run.spec.reader_in_flight())  # else fire is a no-op
    @rule()
    def fire(self):
        self._do({"op": "fire"})

    @rule(reqs=st.lists(requests, min_size=1, max_size=3), data=st.data())
    def write(self, reqs, data):
        op = data.draw(write_ops(self._tokens(reqs), self.stamp), label="op")
        self.stamp += len(op["tokens"])
        self._do(op)

    @rule(reqs=st.lists(requests, min_size=1, max_size=3), data=st.data())
    def read(self, reqs, data):
        self._do(data.draw(read_ops(self._tokens(reqs)), label="op"))

    @_has_requests
    @rule(reqs=st.lists(requests, max_size=4), data=st.data())
    def read_table(self, reqs, data):
        rows = [list(r.tokens) for r in reqs] + data.draw(st.lists(st.sampled_from(self.dead), max_size=1)
                                                          if self.dead else st.just([]), label="dead rows")
        self._do(data.draw(read_table_ops(self.config, rows), label="op"))

    @_has_requests
    @rule(reqs=st.lists(requests, max_size=3), data=st.data())
    def read_table_packed(self, reqs, data):
        rows = [list(r.tokens) for r in reqs] + self.dead[-1:]
        self._do(data.draw(read_table_packed_ops(self.config, rows), label="op"))

    @_has_requests
    @rule(reqs=st.lists(requests, max_size=2), data=st.data())
    def translate(self, reqs, data):
        dead = [t for r in self.dead for t in r]
        self._do(data.draw(translate_ops(self.config, self._tokens(reqs), dead), label="op"))

    @rule(data=st.data())
    def kernel_level(self, data):
        """A kernel-level op on the raw tables, straight through the kernel set."""
        self._do(data.draw(raw_ops(self.run.raw_spec["v2p"]), label="op"))

    # clear needs no live request, so it is one of the few rules eligible on an empty
    # pool; unguarded it took a quarter of all steps and the pool never filled up.
    @precondition(lambda self: len(self.ops) - self.cleared_at >= CLEAR_EVERY)
    @rule()
    def clear(self):
        self._do({"op": "clear"})
        self.gen += 1
        self.dead = []
        self.cleared_at = len(self.ops)

    @_has_requests
    @rule(reqs=st.lists(requests, max_size=2), data=st.data())
    def violation(self, reqs, data):
        op = data.draw(violation_ops(self.config, self._live(reqs), self._dead_runs()), label="op")
        out = self._do(op)
        if out.error is None:
            raise AssertionError(f"strategies: {op} was meant to break a contract, but the spec accepted it")

    def teardown(self):
        # Hypothesis tears down after a failing step too; the final full-state check
        # would then replace the step's Divergence with a later, vaguer one.
        if self.run is not None and self.divergence is None:
            self.run.finish()
