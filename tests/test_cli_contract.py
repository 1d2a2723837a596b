"""The CLI contract a CI job relies on: exit codes without holes, a JSON summary and JUnit
XML that validate, help with defaults, a version."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from tests.fuzz.test_engine import FAKES, kvfuzz, show


@pytest.mark.parametrize("budget", ["nan", "inf", "-inf", "0"])
def test_a_budget_that_is_not_a_finite_positive_number_is_a_usage_error(budget, tmp_path):
    r = kvfuzz("run", f"--budget-s={budget}", "--out", tmp_path / "out")
    assert r.returncode == 2 and "--budget-s" in r.stderr and "finite" in r.stderr, show(r)


def test_bench_refuses_an_unknown_tier_before_measuring_anything():
    # It did not run the torch tier first: that would take the tier's hour, and the call's timeout
    # (far below it, far above a slow runner's start-up) fails the test. No margin of seconds
    # between a start-up and a short tier to measure, as there was (30 s each).
    r = kvfuzz("bench", "--tiers", "torch,foo", "--seconds", "3600", timeout=300)
    assert r.returncode == 2 and "foo" in r.stderr and "Traceback" not in r.stderr, show(r)


def test_mutants_that_cannot_run_on_the_tier_asked_for_are_a_usage_error():
    r = kvfuzz("mutants", "--backend", "torch", "--only", "free-forgets-p2v-tombstone", "read-table-no-max-pages-clamp")
    assert r.returncode == 2 and "--backend interpret or cuda" in r.stderr and "killed 0/0" not in r.stdout, show(r)


def test_an_out_that_is_a_file_is_refused_at_once(tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("not a directory")
    # Not after burning the budget: an hour's budget, and the call's timeout (far below it) fails
    # the test if it was spent; no margin of seconds between start-up and budget (30 s and 60 s).
    r = kvfuzz("run", "--budget-s", "3600", "--out", taken, timeout=300)
    assert r.returncode == 2 and "not a directory" in r.stderr and "Traceback" not in r.stderr, show(r)


def test_a_run_that_ran_no_ops_is_not_clean(tmp_path):
    r = kvfuzz("run", "--budget-s", "0.001", "--out", tmp_path / "out")
    assert r.returncode == 2, show(r)
    assert "ran no ops" in r.stderr and "ops=0" in r.stdout, show(r)


def test_help_shows_defaults_and_there_is_a_version():
    r = kvfuzz("run", "--help")
    assert r.returncode == 0 and "(default: auto)" in r.stdout and "(default: spec)" in r.stdout, show(r)
    v = kvfuzz("--version")
    assert v.returncode == 0 and v.stdout.startswith("kvfuzz "), show(v)


@pytest.fixture(scope="module")
def failing_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reports")
    summary, junit = tmp / "summary.json", tmp / "junit.xml"
    r = kvfuzz("run", "--kernels", FAKES / "past_prefix.py", "--max-sequences", 8, "--out", tmp / "cases",
               "--summary", summary, "--junit-xml", junit, "--stats")
    assert r.returncode == 1, show(r)
    return r, json.loads(summary.read_text()), ET.parse(junit).getroot()


def test_the_summary_says_what_ran_and_what_failed(failing_run):
    r, s, _ = failing_run
    assert s["schema"] == "kvfuzz-summary/1" and s["exit_code"] == 1
    assert s["ops"] > 0 and s["sequences"] > 0 and s["ops_per_s"] > 0 and s["elapsed_s"] > 0
    assert 0 < sum(s["by_kind"].values()) <= s["ops"]  # the last report of a worker may trail its heartbeat
    assert s["by_kind"].get("read_table") and s["by_scenario"] and s["contract_ops"] > 0
    assert s["hostile_classes"], s
    assert s["kernels_sha256"] and len(s["kernels_sha256"]) == 64
    assert s["versions"]["kvfuzz"] and s["versions"]["torch"]
    failure = next(f for f in s["failures"] if f["signature"] == "read_table/result/out")
    assert failure["case"].endswith(".json") and failure["minimized_ops"] <= failure["original_ops"]
    assert "ops by kind" in r.stdout  # --stats


def test_the_junit_xml_has_what_its_schema_requires(failing_run):
    _, s, root = failing_run
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert len(suites) == 1
    suite = suites[0]
    for attr in ("name", "tests", "failures", "errors", "time"):
        assert suite.get(attr) is not None, attr
    cases = suite.findall("testcase")
    assert int(suite.get("tests")) == len(cases)
    assert int(suite.get("failures")) == len(suite.findall("testcase/failure")) == len(s["failures"])
    assert int(suite.get("errors")) == len(suite.findall("testcase/error")) == 0
    for case in cases:
        assert case.get("name") and case.get("classname") and case.get("time") is not None
        for failure in case.findall("failure"):
            assert failure.get("message") is not None and failure.get("type")
    passing = [c.get("name") for c in cases if not c.findall("failure")]
    assert any(name.startswith("alloc ") for name in passing)  # one passing case per op kind exercised
    float(suite.get("time"))
