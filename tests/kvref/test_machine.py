"""A Hypothesis state machine over the reference allocator: after every rule the state
passes kvref.check_all and reads back what a model dict says was last written. Together
with the per-rule postconditions (taken from SPEC.md §3) this tests the spec's internal
consistency across random small PoolConfigs (grow up/down, lazy/eager, page size 1..4).

A lazy pool runs with an eager twin fed the same trace; after every urgent flush the two
must hold the same live pages and data (SPEC §4.9)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kvref import Allocator, ContractViolation, PoolConfig, check_all
from kvref.invariants import check_lazy_eager_agree


@st.composite
def pool_configs(draw):
    min_page = draw(st.integers(1, 3))
    return PoolConfig(
        num_pages=draw(st.integers(min_page + 1, min_page + 8)),
        min_page=min_page,
        page_size=draw(st.integers(1, 4)),
        grow=draw(st.sampled_from(["up", "down"])),
        lazy=draw(st.sampled_from([True, True, False])),  # a lazy run also drives its eager twin
        multiplier=draw(st.integers(1, 3)),
        max_moves=draw(st.sampled_from([2, 1, 3, 0])),
    )


def span_of(cfg, wm):
    return range(cfg.min_page, wm) if cfg.grow == "up" else range(wm + 1, cfg.num_pages)


def eager_twin(cfg):
    return Allocator(PoolConfig(**{**cfg.to_json(), "lazy": False})) if cfg.lazy else None


class AllocatorMachine(RuleBasedStateMachine):
    a: Allocator | None = None

    @initialize(cfg=pool_configs())
    def setup(self, cfg):
        self.cfg = cfg
        self.a = Allocator(cfg)
        self.initial = self.a.snapshot()
        self.live: list[int] = []  # live virtual pages
        self.model: dict[int, int] = {}  # token -> last stamp written
        self.next_stamp = 1
        # dropped if pending pages make the lazy pool refuse an alloc the eager one grants
        self.twin = eager_twin(cfg)

    # ---- helpers --------------------------------------------------------------
    def pools(self):
        return [p for p in (self.a, self.twin) if p is not None]

    def tokens_of(self, pages):
        ps = self.cfg.page_size
        return [p * ps + o for p in pages for o in range(ps)]

    def do_free(self, pages, cut):
        """Free `pages` as one run, its last page short by `cut` tokens; check §3 free."""
        cfg = self.cfg
        tokens = self.tokens_of(pages)
        tokens = tokens[: len(tokens) - cut]
        before = self.a.snapshot()
        for pool in self.pools():
            pool.free(tokens)
        after = self.a.snapshot()
        assert after["free_virtual"] == before["free_virtual"] + pages
        assert all(after["v2p"][v] == -1 for v in pages)
        if cfg.lazy:
            assert after["holes"] == before["holes"] + [before["v2p"][v] for v in pages]
            assert after["watermark"] == before["watermark"]
        else:
            step = -len(pages) if cfg.grow == "up" else len(pages)
            assert after["watermark"] == before["watermark"] + step
        gone = set(pages)
        self.live = [p for p in self.live if p not in gone]
        self.model = {t: s for t, s in self.model.items() if t // cfg.page_size not in gone}

    def do_flush(self, urgent):
        cfg = self.cfg
        before = self.a.snapshot()
        self.a.flush(urgent)
        after = self.a.snapshot()
        assert after["free_virtual"] == before["free_virtual"]
        moved = [v for v in self.live if after["v2p"][v] != before["v2p"][v]]
        if cfg.lazy and not urgent:
            assert len(moved) <= cfg.max_moves
        if not cfg.lazy:
            assert moved == []
        fl = before["in_flight"]
        if cfg.lazy and fl is not None and not fl["fired"] and not urgent:
            # a reader is in flight: the pages it writes do not move, the move sources wait in
            # ONE pending batch tied to its event (in walk order: nearest the frontier first),
            # and earlier batches of that event stay pending
            assert not set(moved) & set(fl["pages"])
            sources = sorted((before["v2p"][v] for v in moved), reverse=cfg.grow == "up")
            kept = [b for b in before["pending"] if b[0] == fl["id"]]
            assert after["pending"] == kept + ([[fl["id"], sources]] if sources else [])
        elif cfg.lazy:
            assert after["pending"] == []
        if urgent:
            assert after["in_flight"] is None or after["in_flight"]["fired"]
        if cfg.lazy and urgent:
            assert after["holes"] == [] and after["pending"] == []
            assert len(span_of(cfg, after["watermark"])) == after["live_pages"] == len(self.live)
            if self.twin is not None:
                self.twin.flush(urgent=True)
                check_lazy_eager_agree(cfg, after, self.twin.config, self.twin.snapshot(), self.model)

    def some_pages(self, data, pool, max_size=4, min_size=1):
        return data.draw(st.lists(st.sampled_from(pool), unique=True, min_size=min_size, max_size=max_size), label="pages")

    # ---- operations (one rule dispatches them, see `act`) ----------------------
    def op_alloc(self, data):
        cfg, ps = self.cfg, self.cfg.page_size
        n = data.draw(st.integers(0, 5), label="pages")
        before = self.a.snapshot()
        holes, wm = before["holes"], before["watermark"]
        capacity = cfg.num_pages - cfg.min_page - len(span_of(cfg, wm)) + len(holes)
        tokens = self.a.alloc(n * ps)
        if self.twin is not None:
            if self.twin.alloc(n * ps) != tokens:
                # only pending pages (not reusable yet) can make the lazy pool the smaller one
                assert tokens is None and before["pending"], "lazy and eager pools disagree on an alloc"
                self.twin = None
        if tokens is None:
            assert n > capacity or n > len(before["free_virtual"])
            assert self.a.snapshot() == before
            return
        assert n <= capacity
        pages = before["free_virtual"][:n]
        assert tokens == [v * ps + o for v in pages for o in range(ps)]
        d = min(n, len(holes))
        new = n - d
        frontier = list(range(wm, wm + new)) if cfg.grow == "up" else list(range(wm - new + 1, wm + 1))
        after = self.a.snapshot()
        assert [after["v2p"][v] for v in pages] == holes[:d] + frontier
        assert after["holes"] == holes[d:]
        assert after["free_virtual"] == before["free_virtual"][n:]
        self.live.extend(pages)

    def freeable(self):
        """Live pages a free may name: in a lazy pool, not those the unfired forward writes."""
        fl = self.a.in_flight
        if not self.cfg.lazy or fl is None or fl.event.fired:
            return self.live
        return [p for p in self.live if p not in fl.pages]

    def op_free(self, data):
        if self.freeable():
            pages = self.some_pages(data, self.freeable())
            self.do_free(pages, data.draw(st.integers(0, self.cfg.page_size - 1), label="cut"))

    def op_server_step(self, data):
        """What a server step does: start a forward over some live pages, free some others,
        flush while the forward may still be in flight (this is what makes `pending`)."""
        fwd = self.some_pages(data, self.live, max_size=2, min_size=0) if self.live else []
        for pool in self.pools():
            pool.forward(self.tokens_of(fwd))
        rest = [p for p in self.live if p not in fwd]
        if rest:  # free at most half of them, so live pages are left to move
            self.do_free(self.some_pages(data, rest, max_size=max(1, len(rest) // 2)), 0)
        fire = data.draw(st.booleans(), label="fire")
        if fire:
            for pool in self.pools():
                pool.fire()
        self.do_flush(fire and data.draw(st.booleans(), label="urgent"))

    def op_bad_free(self, data):
        cfg, ps = self.cfg, self.cfg.page_size
        kinds = ["not_live"] + (["duplicate"] if self.live else []) + (["shape"] if self.live and ps > 1 else [])
        pinned = sorted(set(self.live) - set(self.freeable()))
        kinds += ["in_flight"] if pinned else []
        kind = data.draw(st.sampled_from(kinds), label="bad kind")
        if kind == "not_live":
            not_live = [p for p in range(-1, cfg.num_pages + 2) if p not in self.live]
            bad = data.draw(st.sampled_from(not_live), label="bad page")
            good = self.some_pages(data, self.live, max_size=2, min_size=0) if self.live else []
            tokens = self.tokens_of(good + [bad])
        elif kind == "duplicate":
            p = data.draw(st.sampled_from(self.live), label="page")
            tokens = self.tokens_of([p, p])
        elif kind == "in_flight":  # a lazy pool cannot free what the unfired forward writes
            good = self.some_pages(data, self.freeable(), max_size=2, min_size=0) if self.freeable() else []
            tokens = self.tokens_of(good + [data.draw(st.sampled_from(pinned), label="page")])
        else:
            p = data.draw(st.sampled_from(self.live), label="page")
            tokens = [p * ps + 1, p * ps + 2][: ps - 1]  # starts mid-page
        before = self.a.snapshot()
        with pytest.raises(ContractViolation):
            self.a.free(tokens)
        assert self.a.snapshot() == before

    def op_write(self, data):
        if not self.live:
            return
        tokens = self.some_pages(data, self.tokens_of(self.live), max_size=6)
        stamps = list(range(self.next_stamp, self.next_stamp + len(tokens)))
        self.next_stamp += len(tokens)
        for pool in self.pools():
            pool.write(tokens, stamps)
        self.model.update(zip(tokens, stamps, strict=True))

    def op_forward(self, data):
        """Start a forward over some live tokens (the previous one completes first); maybe fire it."""
        live_tokens = self.tokens_of(self.live)
        tokens = self.some_pages(data, live_tokens, min_size=0) if live_tokens else []
        fire = data.draw(st.booleans(), label="fire")
        for pool in self.pools():
            pool.forward(tokens)
            if fire:
                pool.fire()

    def op_flush(self, data):
        self.do_flush(data.draw(st.booleans(), label="urgent"))

    def op_clear(self, data):
        self.a.clear()
        assert self.a.snapshot() == self.initial
        self.live, self.model = [], {}
        self.twin = eager_twin(self.cfg)

    # One rule, so that Hypothesis's swarm testing (which switches whole rules off per
    # example) cannot starve the runs of allocs or frees; the weights are the repeats.
    OPS = ["alloc"] * 3 + ["free"] * 2 + ["server_step"] * 3 + ["write"] * 2 + ["forward", "flush", "bad_free", "clear"]

    @rule(op=st.sampled_from(OPS), data=st.data())
    def act(self, op, data):
        getattr(self, "op_" + op)(data)

    # ---- after every rule -----------------------------------------------------
    @invariant()
    def consistent(self):
        if self.a is None:
            return
        cfg = self.cfg
        snap = self.a.snapshot()
        check_all(cfg, snap, self.model)
        bound = {v for v in range(cfg.min_page, cfg.num_pages) if snap["v2p"][v] != -1}
        assert bound == set(self.live)
        assert snap["live_pages"] == len(self.live)
        tokens = list(self.model)
        expected = [self.model[t] for t in tokens]
        assert self.a.read(tokens) == expected
        # translate sends a forward's writes to the slot the data lives in
        assert [snap["kv"][s] for s in self.a.translate(tokens)] == expected
        if self.twin is not None:
            check_all(self.twin.config, self.twin.snapshot(), self.model)
            assert self.twin.read(tokens) == expected


AllocatorMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestAllocatorMachine = AllocatorMachine.TestCase
