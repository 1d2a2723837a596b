"""The Hypothesis state machine (fuzz.engine.strategies) on both CPU tiers, and proof that it
catches the planted bug: a machine that cannot fail would pass these too, so the
last tests run it against a kernel set that forgets the p2v tombstone."""

from __future__ import annotations

import json
import os
import types
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test

import kvref
from fuzz.engine.case import Case, load_case, write_case
from fuzz.engine.dispatch import replay
from fuzz.engine.ops import Alloc, Free, Op
from fuzz.engine.runner import PoolRun
from fuzz.engine.strategies import DifferentialMachine, launch_knobs, pool_configs, pool_ops, violation_ops
from fuzz.engine.tiers import make_tier
from fuzz.engine.verdict import Divergence

REPO = Path(__file__).resolve().parents[2]
PLANTED = str(REPO / "tests/fixtures/kernels/forget_p2v_tombstone.py")

needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="Triton's interpreter is off (a GPU is present)")


def machine_settings(max_examples: int) -> settings:
    # No explain phase: on a failure it replays the shrunk example hundreds of times,
    # which costs ~30 s on the interpreter tier.
    return settings(max_examples=max_examples, stateful_step_count=30, deadline=None, database=None,
                    report_multiple_bugs=False, phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


def test_machine_agrees_on_torch_tier():
    run_state_machine_as_test(DifferentialMachine.for_tier(make_tier("torch")), settings=machine_settings(30))


@needs_interpreter
def test_machine_agrees_on_interpreter_tier():
    run_state_machine_as_test(DifferentialMachine.for_tier(make_tier("interpret")), settings=machine_settings(20))


def test_base_machine_defaults_to_the_torch_tier():
    run_state_machine_as_test(DifferentialMachine, settings=machine_settings(3))


class _Recorder:
    """Keeps what the last machine ran (Hypothesis replays the shrunk example last)."""
    last: tuple | None = None


@needs_interpreter
def test_machine_catches_the_planted_bug(tmp_path):
    tier = make_tier("interpret", PLANTED)

    class Recording(DifferentialMachine.for_tier(tier)):
        def teardown(self):
            if self.run is not None:
                _Recorder.last = (self.config, self.knobs, list(self.ops), self.divergence)
            super().teardown()

    # derandomized: that it finds the bug, and shrinks it to 5 ops, must not hang on Hypothesis' seed
    # of the run (a failure here is then the machine's, never the draw's; six random seeds all passed)
    with pytest.raises(Divergence) as info:
        run_state_machine_as_test(Recording, settings=settings(machine_settings(30), derandomize=True))
    d = info.value
    # Forgetting the tombstone shows at the free itself (the allocator's or the raw
    # kernel-level one): a stale p2v row, a crash in the eager compaction, or a stray
    # store of an unchecked double free.
    assert d.kind in ("free", "k_free_unbind"), str(d)
    assert d.oracle in ("state", "crash", "memory", "invariant"), str(d)

    # The shrunk example is an ordinary op list: it replays, and it is a case file.
    config, knobs, ops, seen = _Recorder.last
    assert seen is not None and seen.signature == d.signature
    assert len(ops) <= 5, ops
    again, _ = replay(config, ops, tier, knobs=knobs)
    assert again is not None and again.signature == d.signature
    case = Case.found(config=config, ops=ops, tier="interpret", kernels=PLANTED, divergence=again,
                      original_len=len(ops), knobs=knobs)
    loaded = load_case(write_case(case, tmp_path))
    assert loaded.ops == ops and loaded.signature == d.signature
    fixed, _ = replay(loaded.config, loaded.ops, make_tier("interpret"), knobs=loaded.knobs)
    assert fixed is None, str(fixed)


# ---- the strategies on their own ------------------------------------------------------


def _live_and_dead(config: kvref.PoolConfig, spec: kvref.Allocator, sizes: list[int]):
    live = [r for r in (spec.alloc(k * config.page_size) for k in sizes) if r]
    dead = []
    if len(live) > 1:
        dead.append(live.pop(0))
        spec.free(dead[0])
    return live, dead


@settings(max_examples=60, deadline=None, database=None)
@given(config=pool_configs(), sizes=st.lists(st.integers(1, 4), min_size=1, max_size=4), data=st.data())
def test_pool_ops_are_well_formed_json(config, sizes, data):
    spec = kvref.Allocator(config)
    live, dead = _live_and_dead(config, spec, sizes)
    op = data.draw(pool_ops(config, live, dead))
    assert Op.from_json(json.loads(json.dumps(op.to_json()))) == op


@settings(max_examples=60, deadline=None, database=None)
@given(config=pool_configs(), sizes=st.lists(st.integers(1, 4), min_size=1, max_size=4), data=st.data())
def test_violation_ops_break_a_contract_on_both_sides(config, sizes, data):
    run = PoolRun(config, make_tier("torch"))
    live, dead = [], []
    for k in sizes:
        r = run.step(Alloc(k * config.page_size)).result
        if r:
            live.append(r)
    if len(live) > 1:
        dead.append(live.pop(0))
        run.step(Free(dead[0]))
    op = data.draw(violation_ops(config, live, dead))
    out = run.step(op)  # the checked target must refuse it too, unchanged, and stay in its buffers
    assert out.error is not None, op
    run.finish()


def test_launch_knobs_follow_the_kernel_set():
    knobbed = types.ModuleType("knobbed")
    knobbed.FUZZ_KNOBS = {"BLOCK_COLS": (4, 512), "TARGET_BLOCKS": (2, 1024)}
    seen = set()

    # deadline=None, as everywhere else in the suite: Hypothesis' default 200 ms per example fails a
    # test whose one example a loaded runner happened to pause (as flaky, if its replay is fast)
    @settings(max_examples=40, database=None, deadline=None)
    @given(launch_knobs(knobbed))
    def draw(knobs):
        assert set(knobs) == {"BLOCK_COLS", "TARGET_BLOCKS"}
        assert knobs["BLOCK_COLS"] in (4, 512) and knobs["TARGET_BLOCKS"] in (2, 1024)
        seen.add(tuple(sorted(knobs.items())))

    draw()
    assert len(seen) > 1

    @settings(max_examples=5, database=None, deadline=None)
    @given(launch_knobs(types.ModuleType("plain")))
    def none(knobs):
        assert knobs is None

    none()
