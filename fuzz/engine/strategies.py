"""Hypothesis strategies over the op language, and the differential state machine.

The seeded generator (``generate``) is the fast path the CLI runs; this module is the
same grammar (``shapes``, every choice a Hypothesis draw) seen through Hypothesis, which
adds shrinking to a minimal rule sequence and swarm selection of rules. Both produce the
op records of ``ops`` and feed them to ``PoolRun.step``, so a failure found here is a
case file the CLI replays:
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
from hypothesis import target
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, multiple, precondition, rule

import kvref

from . import shapes
from .features import Collector
from .knobs import knob_module
from .ops import R2T_DTYPES, Clear, Fire, Op
from .runner import PoolRun
from .shapes import HypothesisChooser
from .tiers import Tier, make_tier
from .verdict import Divergence

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
    """One choice per launch knob the kernel set exposes (``fuzz.engine.knobs``), or None."""
    mod = knob_module(kernels)
    if mod is None:
        return st.none()
    return st.fixed_dictionaries({name: st.sampled_from(tuple(choices))
                                  for name, choices in sorted(mod.FUZZ_KNOBS.items())})


# ---- ops: the shared grammar (``shapes``) seen through Hypothesis ------------------------


def _built(build):
    """A strategy whose example is ``build(chooser)``, every choice a Hypothesis draw."""
    return st.composite(lambda draw: build(HypothesisChooser(draw)))()


def pool_ops(config: kvref.PoolConfig, live=(), dead=()):
    """Any one pool op of the language, given the live requests (lists of tokens) and the
    dead runs."""
    live = [list(r) for r in live if r]
    dead = [list(r) for r in dead if r]
    tokens = sorted({t for r in live for t in r})
    room = config.capacity_pages
    choices = [_built(lambda ch: shapes.alloc_op(ch, config, room, ch.pick(shapes.ALLOC_MODES))),
               _built(shapes.flush_op), st.just(Fire()), st.just(Clear()),
               _built(lambda ch: shapes.forward_op(ch, tokens)),
               _built(lambda ch: shapes.write_op(ch, tokens)),
               _built(lambda ch: shapes.read_op(ch, tokens)),
               _built(lambda ch: shapes.translate_op(ch, config, tokens, [t for r in dead for t in r])),
               _built(lambda ch: shapes.read_table_op(ch, config, live, dead)),
               _built(lambda ch: shapes.read_table_packed_op(ch, config, live, dead)),
               violation_ops(config, live, dead)]
    if live:
        choices.append(_built(lambda ch: shapes.free_op(ch, config, ch.pick(live))[0]))
    return st.one_of(choices)


def violation_ops(config: kvref.PoolConfig, live, dead, bound: dict | None = None):
    """An op the spec must refuse. ``dead`` must hold only runs of pages that are not live."""
    return _built(lambda ch: shapes.violation_op(ch, config, live, dead, bound or {})[1])


def raw_ops(config: kvref.PoolConfig, bound: dict[int, int]):
    """A valid kernel-level op on raw tables in the state ``bound`` (v -> p)."""
    return _built(lambda ch: shapes.raw_op(ch, config, bound))


# ---- the state machine -----------------------------------------------------------


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
        self.ops: list[Op] = []
        self.divergence: Divergence | None = None

    # ---- plumbing -------------------------------------------------------------
    @initialize(config=pool_configs(), data=st.data())
    def setup(self, config, data):
        tier = type(self).tier or make_tier("torch")
        self.config = config
        self.knobs = data.draw(launch_knobs(tier.kernels), label="knobs")
        self.r2t_dtype = data.draw(st.sampled_from(R2T_DTYPES), label="r2t_dtype")  # one per run, as a sequence
        self.run = PoolRun(config, tier, knobs=self.knobs)
        self.seen = Collector().__enter__()  # value features of its launches, for hypothesis.target (teardown)
        self.gen = 0
        self.stamp = 1
        self.dead: list[list[int]] = []
        self.raw_bound: dict[int, int] = {}
        self.cleared_at = 0

    def _do(self, op: Op):
        op = shapes.with_r2t_dtype(op, self.r2t_dtype)
        self.ops.append(op)
        try:
            return self.run.step(op)
        except Divergence as d:
            self.divergence = d
            raise

    def _ch(self, data) -> HypothesisChooser:
        return HypothesisChooser(lambda strategy: data.draw(strategy, label="op"))

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

    def _free(self, req, data) -> list[int]:
        op, keep = shapes.free_op(self._ch(data), self.config, list(req.tokens))
        self._do(op)
        self.dead = (self.dead + [shapes.whole_pages(op.tokens, self.config.page_size)])[-16:]
        return keep

    # ---- rules: the op language -------------------------------------------------
    @rule(target=requests, data=st.data())
    def alloc(self, data):
        spec = self.run.spec
        ch = self._ch(data)
        out = self._do(shapes.alloc_op(ch, self.config, spec.index_room() + len(spec.holes),
                                       ch.pick(shapes.ALLOC_MODES)))
        return Request(tuple(out.result), self.gen) if out.result else multiple()

    @rule(target=requests, req=consumes(requests), data=st.data())
    def free(self, req, data):
        """Free a live request, or part of it (the rest stays live)."""
        if req.gen != self.gen:
            return multiple()
        if not shapes.freeable(self.run.spec, [req.tokens]):
            return req  # the unfired forward writes it (a lazy pool cannot free it yet)
        keep = self._free(req, data)
        return Request(tuple(keep), self.gen) if keep else multiple()

    @precondition(lambda self: self._flush_has_work())
    @rule(data=st.data())
    def flush(self, data):
        self._do(shapes.flush_op(self._ch(data)))

    @_has_requests
    @rule(reqs=st.lists(requests, max_size=3), data=st.data())
    def forward(self, reqs, data):
        self._do(shapes.forward_op(self._ch(data), self._tokens(reqs)))

    @precondition(lambda self: self.run.spec.reader_in_flight())  # else fire is a no-op
    @rule()
    def fire(self):
        self._do(Fire())

    @rule(reqs=st.lists(requests, min_size=1, max_size=3), data=st.data())
    def write(self, reqs, data):
        op = shapes.write_op(self._ch(data), self._tokens(reqs), self.stamp)
        self.stamp += len(op.tokens)
        self._do(op)

    @rule(reqs=st.lists(requests, min_size=1, max_size=3), data=st.data())
    def read(self, reqs, data):
        self._do(shapes.read_op(self._ch(data), self._tokens(reqs)))

    @_has_requests
    @rule(reqs=st.lists(requests, max_size=4), data=st.data())
    def read_table(self, reqs, data):
        self._do(shapes.read_table_op(self._ch(data), self.config, [list(r.tokens) for r in reqs], self.dead))

    @_has_requests
    @rule(reqs=st.lists(requests, max_size=3), data=st.data())
    def read_table_packed(self, reqs, data):
        self._do(shapes.read_table_packed_op(self._ch(data), self.config, [list(r.tokens) for r in reqs],
                                             self.dead))

    @_has_requests
    @rule(reqs=st.lists(requests, max_size=2), data=st.data())
    def translate(self, reqs, data):
        dead = [t for r in self.dead for t in r]
        self._do(shapes.translate_op(self._ch(data), self.config, self._tokens(reqs), dead))

    @rule(data=st.data())
    def kernel_level(self, data):
        """A kernel-level op on the raw tables, straight through the kernel set."""
        op = shapes.raw_op(self._ch(data), self.config, self.raw_bound)
        if self._do(op).error is None:
            shapes.observe_raw(op, self.raw_bound)

    # clear needs no live request, so it is one of the few rules eligible on an empty
    # pool; unguarded it took a quarter of all steps and the pool never filled up.
    @precondition(lambda self: len(self.ops) - self.cleared_at >= CLEAR_EVERY)
    @rule()
    def clear(self):
        self._do(Clear())
        self.gen += 1
        self.dead = []
        self.cleared_at = len(self.ops)

    @_has_requests
    @rule(reqs=st.lists(requests, max_size=2), data=st.data())
    def violation(self, reqs, data):
        kind, op = shapes.violation_op(self._ch(data), self.config, self._live(reqs), self._dead_runs(),
                                       self.raw_bound)
        out = self._do(op)
        if out.error is None:
            raise AssertionError(f"shapes: a {kind} violation ({op}) was meant to break a contract, "
                                 "but the spec accepted it")

    def teardown(self):
        # Hypothesis tears down after a failing step too; the final full-state check
        # would then replace the step's Divergence with a later, vaguer one.
        seen = getattr(self, "seen", None)
        if seen is not None:  # the guided track's features (value ones: no tracer here), steering Hypothesis too
            seen.__exit__(None, None, None)
            seen.add_run(self.run)
            target(float(len(seen.names)), label="kvfuzz features")
        if self.run is not None and self.divergence is None:
            self.run.finish()
