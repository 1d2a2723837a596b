"""Replays the regression corpus (tests/corpus/*.json, see its README) against our
default kernel sets on both CPU tiers: every case must agree with the spec. The last
test checks that the corpus is not vacuous: each hand-written case fails on a target
broken the way its note says it guards against."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fuzz.engine.case import load_case
from fuzz.engine.dispatch import replay
from fuzz.engine.tiers import make_tier
from kvkernels.allocator import DeviceAllocator

CORPUS = Path(__file__).resolve().parent / "corpus"
CASES = sorted(CORPUS.glob("*.json"))
TIERS = ["torch", pytest.param("interpret", marks=pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter is off (a GPU is present)"))]


def test_the_corpus_has_cases():
    assert CASES, f"no case files in {CORPUS}"


@pytest.mark.parametrize("backend", TIERS)
@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_corpus_case_passes(path, backend):
    case = load_case(path)
    tier = make_tier(backend)  # our kernels, whichever kernel set the case was found on
    divergence, _ = replay(case.config, case.ops, tier, knobs=case.knobs)
    assert divergence is None, f"{path.name} regressed on {backend}: {divergence}"


def _forget_pending(monkeypatch):
    """Compaction sources go straight back to holes even while a reader is in flight."""
    monkeypatch.setattr(DeviceAllocator, "_reader_in_flight", lambda self: False)


def _reverse_moves(monkeypatch):
    """Eager compaction pairs survivors with freed pages in the wrong order."""
    move = DeviceAllocator._move_pages
    monkeypatch.setattr(DeviceAllocator, "_move_pages", lambda self, src, dst: move(self, src, dst[::-1]))


def _free_ignores_forward(monkeypatch):
    """Checked mode no longer refuses a lazy free of pages the unfired forward writes."""
    from kvkernels import checks

    monkeypatch.setattr(checks, "check_free_in_flight", lambda *args: None)


BROKEN = {
    "read_table_ps4_tombstones_strided": (None, "tests/fuzz/fixtures/kernels/past_prefix.py", "read_table"),
    "lazy_flush_inflight_pending": (_forget_pending, None, "flush"),
    "eager_free_compaction_grow_down": (_reverse_moves, None, "free"),
    "lazy_free_inflight_written": (_free_ignores_forward, None, "free"),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_corpus_case_catches_what_it_pins(name, monkeypatch):
    patch, kernels, op = BROKEN[name]
    if patch:
        patch(monkeypatch)
    repo = Path(__file__).resolve().parents[1]
    case = load_case(CORPUS / f"{name}.json")
    tier = make_tier("torch", kernels and str(repo / kernels))
    divergence, _ = replay(case.config, case.ops, tier, knobs=case.knobs)
    assert divergence is not None and divergence.kind == op, divergence
    assert divergence.oracle == case.signature.oracle, divergence
