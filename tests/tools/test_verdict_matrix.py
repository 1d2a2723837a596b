"""``benchmarks/verdict_matrix.py``'s judgement of one row, with kvfuzz's answers faked: a clean
exit is right for a correct set, wrong for a faulty one that reached its trigger, and judges
nothing where the campaign never drew the trigger."""

from __future__ import annotations

import pytest

from benchmarks import verdict_matrix as vm


def _fake(monkeypatch, rc: int, reach: bool):
    runs = []

    def kvfuzz(*args, timeout, env=None):
        runs.append((args, env))
        if args[0] == "run" and reach:
            with open(env["KVFUZZ_FIXTURE_HANG_MARK"], "a") as f:
                f.write("1 49\n")
        return rc, "kvfuzz run: ... failures=0", 1.0

    monkeypatch.setattr(vm, "kvfuzz", kvfuzz)
    return runs


def _row(name: str, tmp_path):
    spec = next(r for r in vm.ROWS if r[0] == name)
    return vm.row(*spec, backend="interpret", out=tmp_path)


def test_a_clean_campaign_that_never_drew_the_trigger_judges_nothing(tmp_path, monkeypatch):
    runs = _fake(monkeypatch, 0, reach=False)
    res = _row("hang_late", tmp_path)
    assert res["ok"] and res["trigger_reached"] is False and res["wrong"] == [], res
    assert runs[0][1] == {"KVFUZZ_FIXTURE_HANG_MARK": str(tmp_path / "hang_late" / "trigger-reached.txt")}


def test_a_clean_campaign_that_reached_the_trigger_missed_the_hang(tmp_path, monkeypatch):
    _fake(monkeypatch, 0, reach=True)
    res = _row("hang_late", tmp_path)
    assert not res["ok"] and res["trigger_reached"] is True, res
    assert "exit 0, not 1" in res["wrong"] and "no case" in res["wrong"]


@pytest.mark.parametrize("name, ok", [("indep", True), ("segfault", False)])
def test_rows_without_a_marked_trigger_are_judged_by_their_exit_and_cases(tmp_path, monkeypatch, name, ok):
    runs = _fake(monkeypatch, 0, reach=False)
    res = _row(name, tmp_path)
    assert res["ok"] is ok and res["trigger_reached"] is None and runs[0][1] is None, res
