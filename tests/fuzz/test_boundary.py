"""Boundary-directed shapes (fuzz/engine/boundary.py): constants found, draws where they bite."""

from __future__ import annotations

import random
import types
from pathlib import Path

import pytest

from fuzz.engine.boundary import Boundaries, Constants, bs_steps, cdiv, kernel_constants

FOREIGN = Path(__file__).resolve().parents[1] / "fixtures" / "kernels" / "foreign"


def _module(**consts) -> types.ModuleType:
    mod = types.ModuleType("fake_kernels")
    vars(mod).update(consts)
    return mod


def test_constants_are_read_from_the_module_and_its_launchers():
    launchers = _module(BLOCK_COLS=512, TARGET_BLOCKS=1024, BLOCK_IDS=1024, INTERPRET=True, _BLOCK_PRIVATE=64,
                        _TARGET_HIDDEN=2048, __BLOCK_DUNDER=9)
    mod = _module(launchers=launchers, BLOCK=128, block_lower=7, NAME="x", FLAG_BLOCK=True)
    c = kernel_constants(mod)
    assert c.source == "module"
    # private constants count (SGLang's _BLOCK_COLS / _TARGET_BLOCKS are how real sets name them)
    assert c.blocks == {"BLOCK": 128, "BLOCK_COLS": 512, "BLOCK_IDS": 1024, "_BLOCK_PRIVATE": 64}
    assert c.targets == {"TARGET_BLOCKS": 1024, "_TARGET_HIDDEN": 2048}
    assert ("BLOCK_COLS", 512, "TARGET_BLOCKS", 1024) in c.pairs()


def test_the_foreign_set_constants_as_indep_declares_them():
    text = (FOREIGN / "indep.py").read_text()
    mod = _module(**{line.split("=")[0].strip(): int(line.split("=")[1].split("#")[0])
                     for line in text.splitlines() if line.startswith(("BLOCK", "TARGET"))})
    c = kernel_constants(mod)
    assert c.blocks == {"BLOCK": 128, "BLOCK_COLS": 512} and c.targets == {"TARGET_BLOCKS": 1024}


def test_without_constants_powers_of_two_are_swept():
    c = kernel_constants(_module(WIDTH=3))
    assert c.source == "sweep"
    assert sorted(c.blocks.values()) == [1 << j for j in range(15)]


@pytest.mark.parametrize("target", [1, 7, 1024, 2048])
def test_bs_steps_are_exactly_where_cdiv_changes(target):
    hi = 3 * target
    want = [bs for bs in range(1, hi + 1) if bs == 1 or cdiv(target, bs) != cdiv(target, bs - 1)]
    assert bs_steps(target, hi) == want


def test_sizes_sit_at_block_multiples_plus_minus_one():
    b = Boundaries(Constants({"BLOCK": 128}, {"TARGET": 1024}), random.Random(0), aim=1.0)
    draws = [b.size(1, 65536) for _ in range(400)]
    assert all(1 <= v <= 65536 for v, _ in draws)
    aimed = [v for v, tag in draws if tag.startswith("BLOCK*")]
    assert len(aimed) > 200 and all(v % 128 in (0, 1, 127) for v in aimed)
    assert 129 in aimed or 127 in aimed


def test_batch_sizes_step_cdiv_and_reach_past_the_cap():
    b = Boundaries(Constants({"BLOCK_COLS": 512}, {"TARGET_BLOCKS": 1024}), random.Random(1), aim=1.0)
    seen = {b.bs(512)[0] for _ in range(2000)}
    assert {512, 511, 1024, 1023, 342, 341, 1}.issubset(seen)
    assert max(seen) <= 1024


def test_trip_pages_give_a_second_trip_at_that_bs():
    b = Boundaries(Constants({"BLOCK_COLS": 512}, {"TARGET_BLOCKS": 1024}), random.Random(2), aim=1.0)
    for bs in (1, 64, 256, 512, 1024):
        cols = {b.trip_pages(bs, 1 << 20)[0] for _ in range(300)}
        cp = cdiv(1024, bs)
        assert cp * 512 + 1 in cols  # the first column of the second trip
        assert b.min_trip_pages(bs) == [(cp * 512 + 1, "cdiv(TARGET_BLOCKS,bs)*BLOCK_COLS+1")]


def test_launches_show_the_literal_block_sizes_of_a_set_that_names_none():
    """literal_blocks.py writes its block sizes into its launchers (B=256, BLOCK_COLS=128 passed as
    literals, a grid capped at cdiv(2048, bs)): no module constant says so, its launches do."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        import pytest

        pytest.skip("the interpreter tier's twin runs on the GPU box")
    from fuzz.engine.boundary import describe
    from fuzz.engine.production.observe import observed_constants
    from fuzz.engine.tiers import make_tier

    tier = make_tier("interpret", str(FOREIGN / "literal_blocks.py"))
    assert kernel_constants(tier.kernels).source == "sweep"  # nothing to read by name
    seen = observed_constants(tier.kernels, "cpu")
    c = kernel_constants(tier.kernels, seen)
    assert c.source == "launches"
    assert 256 in c.blocks.values() and 128 in c.blocks.values(), c
    assert list(c.targets.values()) == [2048], c
    line = describe(c.to_json())
    assert "(launch)" in line and "2048" in line and "sweep" not in line
    assert "power-of-two sweep" in describe(kernel_constants(tier.kernels).to_json())
