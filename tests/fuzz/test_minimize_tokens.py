"""The minimizer's ``keep-token-sources`` pass: a case that names tokens by id shrinks to the allocs
that made them, renamed. The case is a chain's hang found by ``benchmarks/verdict_matrix.py`` on
``hang_late.py`` (a free of exactly 49 pages never returns), as delta debugging left it: 48 ops.
A judge here stands in for the hanging kernel (no child, no op-timeout): it fails a sequence whose
last op frees exactly 49 pages that the spec says are held."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from fuzz.engine import minimize
from fuzz.engine.case import load_case
from fuzz.engine.minimize import Minimizer
from fuzz.engine.spec_side import SpecSide
from fuzz.engine.verdict import Signature

CASE = Path(__file__).parent / "fixtures" / "cases" / "chain-free-49-pages.json"
SIG = Signature("chain_free", "timeout", "no-progress")


def judge(config, ops):
    side = SpecSide(config)
    for op in ops[:-1]:
        side.apply(op)
    last = ops[-1]
    if last.kind != "chain_free" or side.apply(last).error is not None:
        return None  # tokens nobody holds: refused, not the hang
    pages = {t // config.page_size for t in last.tokens}
    return SimpleNamespace(signature=SIG) if len(pages) == 49 else None


def _minimized(case):
    m = Minimizer(None, SIG, judge=judge, max_replays=400)
    config, ops, found = m.run(case.config, case.ops)
    assert found.signature == SIG and judge(config, ops) is not None
    return m, ops


def test_a_case_naming_tokens_by_id_shrinks_to_the_allocs_that_made_them():
    case = load_case(CASE)
    assert len(case.ops) == 48 and judge(case.config, case.ops) is not None
    m, ops = _minimized(case)
    assert [op.kind for op in ops] == ["chain_alloc", "chain_free"], ops  # merged: one alloc of the pages
    assert m.stats["keep-token-sources"] == [1, 1] and m.one_minimal
    assert m.replays <= 40, m.report()  # 36: the same as kvfuzz minimize with hang_late.py's kernels


def test_without_it_delta_debugging_takes_seven_times_the_replays(monkeypatch):
    """What the pass is for: dropping an op before an alloc moves the ids the free names, so most
    of ddmin's candidates free tokens nobody holds. Each replay of a hang waits out an op-timeout;
    the campaign's cap of 400 stopped this case at 48 ops."""
    with_pass, _ = _minimized(load_case(CASE))
    monkeypatch.setattr(minimize, "PASSES", [p for p in minimize.PASSES if p[0] != "keep-token-sources"])
    without, ops = _minimized(load_case(CASE))
    assert len(ops) == 2 and without.replays > 5 * with_pass.replays, (without.report(), with_pass.report())


def test_a_token_no_alloc_returned_leaves_the_case_to_the_other_passes():
    case = load_case(CASE)
    alien = case.ops[:-1] + [type(case.ops[-1])(pool=0, tokens=(10_000,))]
    m = Minimizer(None, SIG, judge=lambda c, o: SimpleNamespace(signature=SIG))
    assert minimize.keep_token_sources(m, minimize.Candidate(case.config, alien)) is None and m.replays == 0


def test_an_op_the_spec_cannot_replay_leaves_the_case_to_the_other_passes():
    class Unreplayable:  # an op whose spec raises outright, not a contract violation
        kind = "unreplayable"

        def spec(self, s):
            raise RuntimeError("no spec for this op")

    case = load_case(CASE)
    m = Minimizer(None, SIG, judge=judge)
    cand = minimize.Candidate(case.config, [Unreplayable(), *case.ops])
    assert minimize.keep_token_sources(m, cand) is None and m.replays == 0
