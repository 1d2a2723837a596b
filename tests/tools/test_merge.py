"""``kvfuzz merge`` and baselines: one result from many shards, and only new failures fail it.

Shard outputs are built from synthetic case files (written with fuzz.engine.case, as a
campaign writes them) and, in the slow tests, from two real shards of a short campaign on
a torch-tier kernel set with a planted bug (``past_prefix.py``: ``read_table/result/out``).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import kvref
from fuzz.engine.case import Case, Signature, load_case, write_case
from fuzz.engine.kinds import parse_ops
from fuzz.tools.baseline import BaselineError, load_baseline
from fuzz.tools.merge import MergeUsageError, merge
from tests.fuzz.test_engine import FAKES, kvfuzz, show

READ = Signature("read_table", "result", "out")
FREE = Signature("free", "state", "p2v")
CRASH = Signature("free", "crash", "SIGSEGV")


def a_case(sig: Signature, n_ops: int, *, kernels="kvkernels", seed=0, reproduced=None, **extra) -> Case:
    ops = parse_ops([{"op": "alloc", "n": i + 1} for i in range(n_ops)])
    rate = {} if reproduced is None else {"reproduced": reproduced, "flaky": 0 < reproduced["k"] < reproduced["n"]}
    return Case(config=kvref.PoolConfig(num_pages=16), ops=ops, signature=sig, seed=seed, tier="torch",
                kernels=kernels, divergence={"message": f"{sig} diverged", "oracle": sig.oracle},
                lengths={"original": n_ops * 3, "minimized": n_ops}, extra=extra, **rate,
                omitted=() if reproduced is not None else ("reproduced", "flaky"))


def a_shard(root: Path, name: str, cases, *, occurrences: dict | None = None, summary=True, shard="0/2",
            ops=1000) -> Path:
    """A ``kvfuzz run --out`` directory: its case files and (as ci/fuzz.sh writes it) summary.json."""
    d = root / name
    d.mkdir(parents=True)
    paths = [write_case(c, d) for c in cases]
    if summary:
        failures = [{"signature": str(c.signature), "case": str(p), "seed": c.seed,
                     "occurrences": (occurrences or {}).get(str(c.signature), 1), "message": f"{c.signature} diverged"}
                    for c, p in zip(cases, paths)]
        data = {"schema": "kvfuzz-summary/1", "backend": "torch", "kernels": "kvkernels",
                "options": {"shard": shard, "seed": 7}, "ops": ops, "sequences": ops // 50, "elapsed_s": 3.5,
                "health": [], "harness_errors": [], "interrupted": None, "failures": failures,
                "exit_code": 1 if cases else 0}
        (d / "summary.json").write_text(json.dumps(data, indent=1))
    (d / "junit.xml").write_text("<testsuites/>")  # beside them, as ci/fuzz.sh leaves it: not an input
    return d


def a_baseline(path: Path, *entries) -> Path:
    path.write_text(json.dumps({"schema": "kvfuzz-baseline/1", "known": [
        {"signature": str(sig), "reason": reason} for sig, reason in entries]}))
    return path


def failure(summary: dict, sig) -> dict:
    return next(f for f in summary["failures"] if f["signature"] == str(sig))


def tree(out: Path) -> dict:
    """What a merge left, for comparing two merges."""
    return {p.name: p.read_text() for p in sorted(out.iterdir())}


@pytest.fixture
def two_shards(tmp_path):
    a = a_shard(tmp_path, "kvfuzz-out-shard-0", [a_case(READ, 9, reproduced={"k": 3, "n": 3}), a_case(FREE, 4)],
                occurrences={str(READ): 40, str(FREE): 2}, shard="0/2")
    b = a_shard(tmp_path, "kvfuzz-out-shard-1", [a_case(READ, 5, seed=1, reproduced={"k": 1, "n": 3})],
                occurrences={str(READ): 7}, shard="1/2")
    return a, b


# ---- dedup, counts, rates ---------------------------------------------------------------------


def test_two_shards_merge_into_one_case_per_signature(two_shards, tmp_path):
    a, b = two_shards
    r = merge([a, b], tmp_path / "merged")
    read = failure(r.summary, READ)
    assert read["occurrences"] == 47 and len(read["shards"]) == 2  # 40 + 7, from each shard's summary.json
    assert read["minimized_ops"] == 5 and len(load_case(tmp_path / "merged" / read["case"]).ops) == 5  # the shortest
    assert read["reproduced"] == {"k": 4, "n": 6} and read["flaky"] is True
    assert load_case(tmp_path / "merged" / read["case"]).reproduced == {"k": 4, "n": 6}
    assert failure(r.summary, FREE)["occurrences"] == 2 and len(failure(r.summary, FREE)["shards"]) == 1
    assert sorted(p.name for p in (tmp_path / "merged").glob("*.json")) == sorted(
        ["summary.json", read["case"], failure(r.summary, FREE)["case"]])
    assert r.summary["ops"] == 2000 and r.exit_code == 1 and r.summary["unreadable"] == []
    assert "NEW    read_table/result/out  47x in 2 shard(s), 5 ops, reproduced 4/6 (flaky)" in r.text


def test_a_merged_rate_says_how_many_replays_ran_fresh_only_when_every_shard_did(tmp_path):
    a = a_shard(tmp_path, "a", [a_case(READ, 9, reproduced={"k": 3, "n": 3, "fresh": 3})], shard="0/3")
    b = a_shard(tmp_path, "b", [a_case(READ, 5, seed=1, reproduced={"k": 2, "n": 5, "fresh": 5})], shard="1/3")
    c = a_shard(tmp_path, "c", [a_case(READ, 7, seed=2, reproduced={"k": 1, "n": 3})], shard="2/3")
    both = merge([a, b], tmp_path / "ab")
    assert failure(both.summary, READ)["reproduced"] == {"k": 5, "n": 8, "fresh": 8}
    assert load_case(tmp_path / "ab" / failure(both.summary, READ)["case"]).reproduced == {"k": 5, "n": 8, "fresh": 8}
    # a shard whose case does not say its replays ran fresh (an older kvfuzz): the sum claims nothing
    assert failure(merge([a, b, c], tmp_path / "abc").summary, READ)["reproduced"] == {"k": 6, "n": 11}


def test_without_a_summary_each_case_file_is_one_occurrence(tmp_path):
    a = a_shard(tmp_path, "a", [a_case(READ, 3)], summary=False)
    b = a_shard(tmp_path, "b", [a_case(READ, 3, kernels="other.py")], summary=False)
    r = merge([a, b], tmp_path / "m")
    assert failure(r.summary, READ)["occurrences"] == 2
    assert failure(r.summary, READ)["kernels"] == ["kvkernels", "other.py"]
    assert any("no summary.json" in p for p in r.summary["problems"])


def test_a_folder_of_shard_folders_is_merged_as_its_shards(two_shards, tmp_path):
    r = merge([two_shards[0].parent], tmp_path / "m")  # an artifact download: one folder per shard
    assert len(r.summary["shards"]) == 2 and failure(r.summary, READ)["occurrences"] == 47


def test_the_merged_case_still_finds_its_kernel_file(tmp_path):
    kernels = tmp_path / "src" / "my_kernels.py"
    kernels.parent.mkdir()
    kernels.write_text("# a kernel set\n")
    shard = tmp_path / "deep" / "shard"
    shard.mkdir(parents=True)
    raw = a_case(READ, 2, kernels="my_kernels.py").to_json()
    raw["kernels_file"] = "../../src/my_kernels.py"
    (shard / "c.json").write_text(json.dumps(raw))
    r = merge([shard], tmp_path / "m")
    kept = json.loads((tmp_path / "m" / failure(r.summary, READ)["case"]).read_text())
    assert (tmp_path / "m" / kept["kernels_file"]).resolve() == kernels.resolve()


# ---- idempotency ------------------------------------------------------------------------------


def test_merging_again_changes_nothing(two_shards, tmp_path):
    a, b = two_shards
    first = merge([a, b], tmp_path / "m1")
    expected = tree(tmp_path / "m1")
    assert tree(merge([tmp_path / "m1"], tmp_path / "m2").out) == expected  # the merged output, merged again
    assert tree(merge([b, a, a], tmp_path / "m3").out) == expected  # another order, one shard twice
    assert tree(merge([tmp_path / "m1", a, b], tmp_path / "m4").out) == expected  # a merge and its own shards
    assert tree(merge([a, b], tmp_path / "m1").out) == expected  # into the same folder again
    assert tree(merge([tmp_path / "m1"], tmp_path / "m1").out) == expected  # a merge into itself
    assert first.summary == json.loads((tmp_path / "m1" / "summary.json").read_text())


def test_two_nights_add_up_and_then_stay_put(two_shards, tmp_path):
    a, b = two_shards
    merge([a, b], tmp_path / "night1")
    night2 = a_shard(tmp_path, "night2", [a_case(READ, 8)], occurrences={str(READ): 5}, ops=500)
    r = merge([tmp_path / "night1", night2], tmp_path / "week")
    assert failure(r.summary, READ)["occurrences"] == 52 and len(r.summary["shards"]) == 3
    assert tree(merge([tmp_path / "week", tmp_path / "night1"], tmp_path / "week2").out) == tree(tmp_path / "week")


# ---- partial and corrupt inputs -----------------------------------------------------------------


def test_a_truncated_case_file_is_reported_and_skipped(two_shards, tmp_path):
    a, b = two_shards
    case = next(p for p in b.glob("*.json") if p.name != "summary.json")
    case.write_text(case.read_text()[:200])  # a copy cut short
    (a / "broken.json").write_text(json.dumps({"schema": "kvfuzz-case/1", "config": {}, "ops": 3,
                                               "signature": {"op": "x"}}))
    r = merge([a, b], tmp_path / "m")
    bad = {Path(e["path"]).name: e["error"] for e in r.summary["unreadable"]}
    assert set(bad) == {case.name, "broken.json"} and "not JSON" in bad[case.name]
    assert f"UNREADABLE {case.resolve()}" in r.text
    read = failure(r.summary, READ)  # shard 1 still counts: its summary.json names the signature
    assert read["occurrences"] == 47 and read["minimized_ops"] == 9
    suite = ET.fromstring(r.junit).find("testsuite")
    assert any(tc.get("name", "").startswith("unreadable: ") for tc in suite.findall("testcase"))


def test_a_truncated_summary_falls_back_to_the_case_files(two_shards, tmp_path):
    a, b = two_shards
    (b / "summary.json").write_text('{"schema": "kvfuzz-summary/1", "fail')
    r = merge([a, b], tmp_path / "m")
    assert failure(r.summary, READ)["occurrences"] == 41  # 40 from shard 0's summary, 1 for shard 1's case file
    assert [Path(e["path"]).name for e in r.summary["unreadable"]] == ["summary.json"]


def test_a_missing_shard_is_reported_not_fatal(two_shards, tmp_path):
    r = merge([*two_shards, tmp_path / "kvfuzz-out-shard-2"], tmp_path / "m")
    assert r.summary["unreadable"] == [{"path": str((tmp_path / "kvfuzz-out-shard-2").resolve()),
                                        "error": "no such directory"}]
    assert len(r.summary["shards"]) == 2


def test_usage_errors(tmp_path, two_shards):
    taken = tmp_path / "file"
    taken.write_text("x")
    with pytest.raises(MergeUsageError, match="is a file"):
        merge(two_shards, taken)
    with pytest.raises(MergeUsageError, match="nothing to merge"):
        merge([], tmp_path / "m")
    with pytest.raises(MergeUsageError, match="none of the inputs exists"):
        merge([tmp_path / "nope"], tmp_path / "m")
    (tmp_path / "empty").mkdir()
    with pytest.raises(MergeUsageError, match="no input has case files"):
        merge([tmp_path / "empty"], tmp_path / "m")


def test_cli_exit_codes(tmp_path, two_shards):
    taken = tmp_path / "file"
    taken.write_text("x")
    r = kvfuzz("merge", *two_shards, "--out", taken)
    assert r.returncode == 2 and "is a file" in r.stderr and "Traceback" not in r.stderr, show(r)
    r = kvfuzz("merge", "--out", tmp_path / "m")
    assert r.returncode == 2, show(r)
    r = kvfuzz("merge", tmp_path / "nope", "--out", tmp_path / "m")
    assert r.returncode == 2 and "nothing to merge" in r.stderr, show(r)
    r = kvfuzz("merge", *two_shards, "--out", tmp_path / "m", "--baseline", taken)
    assert r.returncode == 2 and "baseline" in r.stderr and "Traceback" not in r.stderr, show(r)
    clean = a_shard(tmp_path, "clean", [])
    r = kvfuzz("merge", clean, "--out", tmp_path / "m", "--summary", tmp_path / "s.json",
               "--junit-xml", tmp_path / "j.xml")
    assert r.returncode == 0 and "0 new; exit 0" in r.stdout, show(r)
    assert json.loads((tmp_path / "s.json").read_text())["schema"] == "kvfuzz-merge/1"
    assert ET.parse(tmp_path / "j.xml").getroot().tag == "testsuites"


# ---- baselines ------------------------------------------------------------------------------------


def test_known_failures_do_not_fail_the_merge(two_shards, tmp_path):
    base = load_baseline(a_baseline(tmp_path / "baseline.json", (READ, "issue 12: the off-by-one"),
                                    (FREE, "issue 13")))
    r = merge(two_shards, tmp_path / "m", baseline=base)
    assert r.exit_code == 0
    assert r.summary["baseline"]["known"] == sorted([str(READ), str(FREE)]) and r.summary["baseline"]["new"] == []
    assert "KNOWN  read_table/result/out" in r.text and "issue 12: the off-by-one" in r.text
    suite = ET.fromstring(r.junit).find("testsuite")
    skipped = {tc.get("name"): tc.find("skipped").get("message") for tc in suite.findall("testcase")
               if tc.find("skipped") is not None}
    assert skipped[str(READ)] == "known failure: issue 12: the off-by-one"
    assert suite.get("failures") == "0" and suite.get("skipped") == "2"


def test_only_new_signatures_fail_and_missing_ones_are_no_longer_seen(two_shards, tmp_path):
    base = load_baseline(a_baseline(tmp_path / "baseline.json", (READ, "known"), (CRASH, "the old segfault")))
    r = merge(two_shards, tmp_path / "m", baseline=base)
    b = r.summary["baseline"]
    assert (b["new"], b["known"], b["no_longer_seen"]) == ([str(FREE)], [str(READ)], [str(CRASH)])
    assert r.exit_code == 1 and failure(r.summary, FREE)["status"] == "new"
    assert "NO LONGER SEEN (fixed?) free/crash/SIGSEGV  [the old segfault]" in r.text
    suite = ET.fromstring(r.junit).find("testsuite")
    cases = {tc.get("name"): tc for tc in suite.findall("testcase")}
    assert cases[str(FREE)].find("failure") is not None and suite.get("failures") == "1"
    assert "fixed?" in cases[str(CRASH)].find("system-out").text and cases[str(CRASH)].find("failure") is None


def test_a_merge_of_outputs_without_the_bug_says_no_longer_seen(tmp_path):
    clean = a_shard(tmp_path, "tonight", [a_case(FREE, 2)])
    base = load_baseline(a_baseline(tmp_path / "baseline.json", (READ, "issue 12")))
    r = merge([clean], tmp_path / "m", baseline=base)
    assert r.summary["baseline"]["no_longer_seen"] == [str(READ)] and "NO LONGER SEEN" in r.text


def test_baselines_load_from_a_file_a_folder_of_cases_or_a_summary(two_shards, tmp_path):
    folder = load_baseline(two_shards[0])  # a folder of accepted cases (its summary.json is skipped)
    assert sorted(k.signature for k in folder.known) == sorted([str(READ), str(FREE)])
    assert load_baseline(two_shards[1] / "summary.json").known[0].signature == str(READ)
    merged = merge(two_shards, tmp_path / "m")
    assert len(load_baseline(tmp_path / "m").known) == len(load_baseline(tmp_path / "m" / "summary.json").known) == 2
    assert merged.exit_code == 1
    restricted = tmp_path / "restricted.json"
    restricted.write_text(json.dumps({"schema": "kvfuzz-baseline/1", "known": [
        {"signature": str(READ), "reason": "only theirs", "kernels": ["theirs.py"]}]}))
    base = load_baseline(restricted)
    assert base.lookup(READ, ["/x/theirs.py"]) is not None and base.lookup(READ, ["kvkernels"]) is None
    for bad in ({"schema": "kvfuzz-baseline/2", "known": []}, {"schema": "kvfuzz-baseline/1", "known": [{"x": 1}]},
                {"schema": "kvfuzz-baseline/1", "known": [{"signature": "no-slashes"}]}):
        restricted.write_text(json.dumps(bad))
        with pytest.raises(BaselineError):
            load_baseline(restricted)
    restricted.write_text('{"schema": "kvfuzz-baseline/1", "kno')
    with pytest.raises(BaselineError, match="not JSON"):
        load_baseline(restricted)


def test_write_baseline_accepts_what_was_merged(two_shards, tmp_path):
    old = a_baseline(tmp_path / "old.json", (CRASH, "the old segfault"))
    r = kvfuzz("merge", *two_shards, "--out", tmp_path / "m", "--baseline", old, "--write-baseline",
               tmp_path / "new.json")
    assert r.returncode == 1, show(r)
    new = load_baseline(tmp_path / "new.json")
    assert sorted(k.signature for k in new.known) == sorted(map(str, (READ, FREE, CRASH)))
    assert next(k for k in new.known if k.signature == str(CRASH)).reason == "the old segfault"
    r = kvfuzz("merge", *two_shards, "--out", tmp_path / "m", "--baseline", tmp_path / "new.json")
    assert r.returncode == 0 and "0 new, 2 known, 1 no longer seen" in r.stdout, show(r)


# ---- two real shards of a short campaign --------------------------------------------------------


@pytest.fixture(scope="module")
def real_shards(tmp_path_factory):
    """Shard 0/2 plainly, shard 1/2 with a baseline that knows the planted bug (and one
    signature it will not see); each writes summary.json into its --out, as ci/fuzz.sh does."""
    tmp = tmp_path_factory.mktemp("real")
    baseline = a_baseline(tmp / "baseline.json", (READ, "planted: the read table writes past the prefix"),
                          (CRASH, "not in this kernel set"))
    runs = []
    for i, extra in ((0, []), (1, ["--baseline", baseline])):
        out = tmp / f"kvfuzz-out-shard-{i}"
        r = kvfuzz("run", "--backend", "torch", "--kernels", FAKES / "past_prefix.py", "--max-sequences", 4,
                   "--workers", 1, "--shard", f"{i}/2", "--out", out, "--summary", out / "summary.json",
                   "--junit-xml", out / "junit.xml", *extra)
        runs.append(r)
    return tmp, baseline, runs


@pytest.mark.slow
def test_run_with_a_baseline_exits_0_on_known_failures(real_shards):
    tmp, _, (plain, known) = real_shards
    assert plain.returncode == 1, show(plain)
    assert known.returncode == 0, show(known)
    assert "[known: planted: the read table writes past the prefix]" in known.stdout
    assert "1 known, 1 no longer seen" in known.stdout and "no longer seen (fixed?): free/crash/SIGSEGV" in known.stdout
    s = json.loads((tmp / "kvfuzz-out-shard-1" / "summary.json").read_text())
    assert s["exit_code"] == 0 and s["baseline"]["known"] == [str(READ)]
    assert s["baseline"]["no_longer_seen"] == [str(CRASH)] and failure(s, READ)["known"] is True
    suite = ET.parse(tmp / "kvfuzz-out-shard-1" / "junit.xml").getroot().find("testsuite")
    assert suite.get("failures") == "0" and suite.get("skipped") == "1"
    assert any(tc.find("skipped") is not None and tc.get("name") == str(READ) for tc in suite.findall("testcase"))


@pytest.mark.slow
def test_two_real_shards_merge_into_one_signature(real_shards):
    tmp, baseline, runs = real_shards
    shards = [tmp / "kvfuzz-out-shard-0", tmp / "kvfuzz-out-shard-1"]
    per_shard = [failure(json.loads((s / "summary.json").read_text()), READ)["occurrences"] for s in shards]
    r = kvfuzz("merge", *shards, "--out", tmp / "merged")
    assert r.returncode == 1 and "NEW    read_table/result/out" in r.stdout, show(r)
    s = json.loads((tmp / "merged" / "summary.json").read_text())
    assert [f["signature"] for f in s["failures"]] == [str(READ)]
    assert failure(s, READ)["occurrences"] == sum(per_shard) and len(failure(s, READ)["shards"]) == 2
    r = kvfuzz("merge", *shards, "--out", tmp / "merged-known", "--baseline", baseline)
    assert r.returncode == 0 and "KNOWN  read_table/result/out" in r.stdout, show(r)
    assert "NO LONGER SEEN (fixed?) free/crash/SIGSEGV" in r.stdout
    again = kvfuzz("merge", tmp / "merged", "--out", tmp / "merged-again")
    assert again.returncode == 1, show(again)
    assert tree(tmp / "merged-again") == tree(tmp / "merged")
    replay = kvfuzz("replay", tmp / "merged" / failure(s, READ)["case"])  # the kept case still replays
    assert replay.returncode == 1 and "same signature" in replay.stdout, show(replay)


def test_merge_needs_no_torch(two_shards, tmp_path):
    """The nightly's merge job installs kvfuzz without its dependencies."""
    import subprocess
    import sys

    code = ("import sys; from fuzz.cli import main; rc = main(sys.argv[1:]); "
            "assert not {'torch', 'triton', 'numpy', 'hypothesis'} & set(sys.modules), sorted(sys.modules); "
            "sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code, "merge", *map(str, two_shards), "--out", str(tmp_path / "m")],
                       capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2], timeout=120)
    assert r.returncode == 1 and "NEW" in r.stdout, show(r)


def test_run_refuses_a_broken_baseline_before_fuzzing(tmp_path):
    broken = tmp_path / "baseline.json"
    broken.write_text('{"schema": "kvfuzz-baseline/1", "known": [{"signature": "nope"}]}')
    r = kvfuzz("run", "--budget-s", 60, "--out", tmp_path / "out", "--baseline", broken)
    assert r.returncode == 2 and "signature" in r.stderr and "Traceback" not in r.stderr, show(r)
    assert not (tmp_path / "out").exists()


def test_which_of_two_equal_cases_is_kept_does_not_depend_on_the_order(tmp_path):
    one, two = a_case(READ, 3), a_case(READ, 3)
    one.environment, two.environment = {"gpu": "H200"}, {"gpu": "A100"}
    a, b = a_shard(tmp_path, "a", [one]), a_shard(tmp_path, "b", [two])
    assert tree(merge([a, b], tmp_path / "ab").out) == tree(merge([b, a], tmp_path / "ba").out)


def test_a_copy_of_a_shard_under_another_name_is_the_same_shard(two_shards, tmp_path):
    import shutil

    a, b = two_shards
    copy = tmp_path / "copies" / "renamed-artifact"
    shutil.copytree(a, copy)
    r = merge([a, b, copy], tmp_path / "m")
    assert len(r.summary["shards"]) == 2 and failure(r.summary, READ)["occurrences"] == 47
    assert tree(tmp_path / "m") == tree(merge([copy, b, a], tmp_path / "m2").out)


def test_summaries_of_the_wrong_shape_do_not_break_the_merge(two_shards, tmp_path):
    a, b = two_shards
    (b / "summary.json").write_text(json.dumps({
        "schema": "kvfuzz-summary/1", "options": "x", "health": "bad", "ops": -1, "harness_errors": 3,
        "failures": [1, {"signature": 5}, {"signature": str(READ), "occurrences": "many", "message": 7}]}))
    weird = tmp_path / "weird-merge"
    weird.mkdir()
    (weird / "summary.json").write_text(json.dumps({
        "schema": "kvfuzz-merge/1", "shards": [{"id": "x@1"}, "y", {"id": 3}], "unreadable": "no",
        "failures": [{"signature": str(FREE), "by_shard": {"x@1": {"occurrences": "?"}, "nohash": {}},
                      "kernels": "notalist", "message": ["m"]}]}))
    r = merge([a, b, weird], tmp_path / "m")
    assert failure(r.summary, READ)["occurrences"] == 41  # 40, and 1 for the entry with no count
    assert failure(r.summary, FREE)["occurrences"] == 3  # 2 from shard 0, 1 from the weird merge's x@1
    assert any("without a signature" in e["error"] for e in r.summary["unreadable"])
    assert any("internal harness error" in p for p in r.summary["problems"]) and r.text and r.junit
