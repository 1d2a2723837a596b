"""The morning page (``kvfuzz report``, fuzz/tools/night.py, nights.py, page.py).

- a page built from a real, small guided campaign (bounded by work: --max-sequences) on a
  torch-tier kernel set with a planted bug, checked without a browser (parsed, every link
  resolves, nothing fetched) and, where Chromium is installed, in headless Chromium (no
  console message, the verdict, the replay command and the coverage plot in the DOM, a
  screenshot); the replay command it prints replays the bug;
- two nights, the second of which fixed one bug and met a new one, and stopped reaching a
  feature: the page says exactly that, from the directories or from the history file;
- a long night (thousands of signatures merged): the page's size stays bounded.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from html import unescape
from pathlib import Path

import pytest

from fuzz.tools import night as night_mod
from fuzz.tools.merge import merge
from fuzz.tools.morning import main as report
from fuzz.tools.nights import load_history
from tests.fuzz.test_engine import FAKES, cli_env, kvfuzz, show
from tests.tools.browser import check_html, chromium, open_page
from tests.tools.test_merge import CRASH, FREE, READ, a_case, a_shard

REPO = Path(__file__).resolve().parents[2]


def text_of(html: str, element_id: str) -> str:
    """The text of the element with ``element_id`` as it reads: tags dropped, a block's end a
    space, whitespace folded."""
    m = re.search(rf'<(\w+)[^>]* id="{re.escape(element_id)}"[^>]*>(.*?)</\1>', html, re.S)
    assert m, f"no element with id {element_id!r}"
    text = re.sub(r"<[^>]+>", "", re.sub(r"</(div|p|h\d|li|td|th|tr|pre)>", " ", m[2]))
    return " ".join(unescape(text).split())


# ---- a real campaign's page ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_night(tmp_path_factory):
    """A night with one guided campaign (30 sequences, one worker) that meets the planted bug,
    and the corpus's coverage as the nightly writes it; its page, written beside it."""
    root = tmp_path_factory.mktemp("real-night")
    out = root / "night-1" / "guided"
    r = kvfuzz("run", "--backend", "torch", "--kernels", FAKES / "past_prefix.py", "--max-sequences", 30,
               "--workers", 1, "--guided", "--progress-s", 1, "--out", out, "--summary", out / "summary.json",
               "--junit-xml", out / "junit.xml")
    assert r.returncode == 1, show(r)
    cov = kvfuzz("coverage", out / "corpus", "--json")
    assert cov.returncode == 0, show(cov)
    (root / "night-1" / "coverage.json").write_text(cov.stdout)
    page = root / "night-1" / "report.html"
    rep = kvfuzz("report", root / "night-1", "--html", page)
    assert rep.returncode == 0, show(rep)
    return root / "night-1", page


@pytest.mark.slow
def test_a_real_campaigns_page_says_what_it_found(real_night):
    night, page = real_night
    html = page.read_text()
    problems, parsed = check_html(page)
    assert problems == []
    assert any(h.endswith("past_prefix--read_table-result-out.json") for h in parsed.links)
    assert text_of(html, "verdict").startswith("Verdict 1 new signature(s), 0 known, 0 no longer seen; the campaigns' exit 1")
    card = text_of(html, "finding-0")
    assert "read_table/result/out" in card and "5/5" in card and "read_table(rows=" in card
    summary = json.loads((night / "guided" / "summary.json").read_text())
    timeline = summary["feature_timeline"]
    assert len(timeline) >= 2 and [p[2] for p in timeline] == sorted(p[2] for p in timeline)
    assert timeline[-1][2] == sum(summary["features"]["by_domain"].values()) > 0  # the last look: every entry
    assert 'id="features-over-time"' in html and "<polyline" in html


@pytest.mark.slow
def test_the_pages_replay_command_replays_the_bug(real_night):
    _, page = real_night
    cmd = re.search(r'<pre class="replay">(.*?)</pre>', page.read_text())[1]
    args = shlex.split(unescape(cmd))
    assert args[:2] == ["kvfuzz", "replay"]
    r = subprocess.run([sys.executable, "-m", "fuzz", *args[1:]], cwd=page.parent, capture_output=True, text=True,
                       timeout=240, env=cli_env())
    assert r.returncode == 1 and "read_table/result/out" in r.stdout + r.stderr, show(r)


@pytest.mark.slow
def test_the_page_in_headless_chromium(real_night, tmp_path):
    if chromium() is None:
        pytest.skip("no chromium on PATH: ci/setup.sh installs Debian's chromium where it runs as root with apt "
                    "(apt-get install chromium); the page was still checked without a browser")
    _, page = real_night
    shot = Path(os.environ.get("KVFUZZ_ARTIFACTS", tmp_path)) / "morning-page.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    opened = open_page(page, shot)
    assert opened.console == []
    dom = opened.dom
    assert 'id="verdict"' in dom and "1 new signature(s)" in dom
    assert re.search(r'<pre class="replay">kvfuzz replay \S+past_prefix--read_table-result-out\.json</pre>', dom)
    assert re.search(r'<svg id="features-over-time"[^>]*>.*<polyline', dom, re.S)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


def test_console_messages_are_caught(tmp_path):
    """The browser check fails where it should: a page whose script logs and throws."""
    if chromium() is None:
        pytest.skip("no chromium on PATH (ci/setup.sh installs it where it runs as root with apt)")
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><body><p id="x">x</p><script>console.error("boom"); nope();</script>'
                   "</body></html>")
    console = open_page(bad).console
    assert any("boom" in c for c in console) and any("nope is not defined" in c for c in console)


def test_the_html_check_finds_broken_links(tmp_path):
    page = tmp_path / "p.html"
    page.write_text('<html><body><a href="#gone">x</a><a href="missing.json">y</a><img src="http://x/y.png">'
                    '<p id="a"></p><p id="a"></p></div></body></html>')
    problems, _ = check_html(page)
    assert any("#gone" in p for p in problems) and any("missing.json" in p for p in problems)
    assert any("fetches" in p for p in problems) and any("duplicate id 'a'" in p for p in problems)
    assert any("</div> closes nothing" in p for p in problems)


# ---- two nights -----------------------------------------------------------------------------------


def a_night(root: Path, name: str, cases, reached: dict) -> Path:
    """A night's folder as ci/nightly.sh leaves it: a campaign (cases/) and coverage.json."""
    a_shard(root / name, "cases", cases)
    (root / name / "coverage.json").write_text(json.dumps({
        "entries": 3, "features": {"trips": sum(map(len, reached.values()))},
        "kernels": {k: {"reached": v, "never": []} for k, v in reached.items()}, "code": {}}))
    return root / name


THREE_TRIPS = "trips 3+ (partial last block)"


@pytest.fixture
def two_nights(tmp_path):
    one = a_night(tmp_path, "night-1", [a_case(READ, 3), a_case(FREE, 2)],
                  {"read_table_kernel": ["trips 1 (full last block)", THREE_TRIPS]})
    two = a_night(tmp_path, "night-2", [a_case(READ, 3), a_case(CRASH, 1)],
                  {"read_table_kernel": ["trips 1 (full last block)"]})
    (two / "mutants.txt").write_text(  # as kvfuzz mutants prints it
        "free-forgets-p2v-tombstone         killed in   0.57 s,      5 ops, case 4 -> 1 ops, free/state/p2v\n"
        "read-table-stride-skips-blocks     SURVIVED 8 s (329 ops)\n"
        "kvfuzz mutants: backend=interpret killed 1/2 (50%), budget 8 s per mutant\n")
    return one, two


SINCE = (r"Since the night before \(night-1, [^)]*\): 1 new signature\(s\): free/crash/SIGSEGV; "
         r"1 no longer seen \(fixed\?\): free/state/p2v; 1 still seen\.")


def test_two_nights_the_page_says_what_was_fixed_and_what_is_new(two_nights, tmp_path, capsys):
    one, two = two_nights
    assert report([one, two], tmp_path / "page.html") == 0
    html = (tmp_path / "page.html").read_text()
    assert re.fullmatch(SINCE, text_of(html, "since")), text_of(html, "since")
    lost = re.search(r"Features reached the night before and not tonight:</p><ul>(.*?)</ul>", html)[1]
    assert unescape(re.sub(r"<[^>]+>", "", lost)) == f"read_table_kernel: {THREE_TRIPS}"
    assert check_html(tmp_path / "page.html")[0] == []
    assert "2 night(s) in the trends" in capsys.readouterr().out
    assert text_of(html, "mutants-verdict") == ("Mutants: backend=interpret killed 1/2 (50%), budget 8 s per mutant; "
                                                "survived: read-table-stride-skips-blocks (kill table)")


def test_two_nights_from_the_history_file(two_nights, tmp_path):
    one, two = two_nights
    history = tmp_path / "history.jsonl"
    report([one], tmp_path / "one.html", history=history)
    report([two], tmp_path / "two.html", history=history)
    report([two], tmp_path / "two.html", history=history)  # the same night again: one line, not two
    records, problems = load_history(history)
    assert problems == [] and [r["label"] for r in records] == ["night-1", "night-2"]
    assert records[1]["signatures"] == sorted([str(READ), str(CRASH)])
    html = (tmp_path / "two.html").read_text()
    assert re.fullmatch(SINCE, text_of(html, "since"))
    assert "Since the night before" not in (tmp_path / "one.html").read_text()  # the first night has none
    with history.open("a") as f:
        f.write('{"truncated\n')
        f.write(json.dumps({**records[0], "id": "edited", "signatures": 3}) + "\n")
    report([two], tmp_path / "again.html", history=history)
    unchecked = text_of((tmp_path / "again.html").read_text(), "unchecked")
    assert "history.jsonl:3: not JSON" in unchecked and "history.jsonl:4: a kvfuzz-night/1 record with a field" in unchecked


def test_bad_input_is_a_usage_error(tmp_path):
    (tmp_path / "empty").mkdir()
    for args, said in ((["report", tmp_path / "nope", "--html", tmp_path / "p.html"], "not a directory"),
                       (["report", tmp_path / "empty", "--html", tmp_path / "p.html"], "no summary.json"),
                       (["report", tmp_path / "empty", "--html", tmp_path], "is a directory")):
        r = kvfuzz(*args)
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, show(r)


# ---- a long night -----------------------------------------------------------------------------------


def long_night(root: Path, n: int) -> Path:
    """``n`` distinct signatures from two shards, merged by kvfuzz merge into one folder."""
    from fuzz.engine.case import Signature

    sigs = [Signature("read_table", "result", f"out{i}") for i in range(n)]
    a = a_shard(root, "shard-0", [a_case(s, 2 + i % 5) for i, s in enumerate(sigs[: n // 2])], shard="0/2")
    b = a_shard(root, "shard-1", [a_case(s, 2 + i % 3) for i, s in enumerate(sigs[n // 2:])], shard="1/2")
    merge([a, b], root / "merged")
    for shard in (a, b):
        shutil.rmtree(shard)
    return root / "merged"


@pytest.mark.parametrize("n", [300, pytest.param(3000, marks=pytest.mark.slow)])
def test_a_long_nights_page_stays_bounded(tmp_path, n):
    merged = long_night(tmp_path, n)
    page = tmp_path / "page.html"
    report([merged], page)
    html = page.read_text()
    shown = night_mod.DETAILED + night_mod.LISTED
    assert html.count('class="card"') == night_mod.DETAILED
    assert f"and {n - shown} more findings" in html
    assert f"and {n - 50} more" in text_of(html, "verdict")  # the verdict's list of new signatures
    assert check_html(page)[0] == []
    assert page.stat().st_size < 200_000  # 300 and 3000 signatures: 81 and 82 KiB (docs/morning-page.md)


def test_a_long_nights_feature_timeline_stays_bounded(tmp_path):
    """A look every FEATURE_EVERY_S for ten hours keeps at most FEATURE_POINTS samples, the
    last one always the end of the run."""
    from fuzz.engine.summary import FEATURE_EVERY_S, FEATURE_POINTS, FeatureClock

    clock = FeatureClock(tmp_path / "corpus")
    t = 0.0
    while t < 36_000:
        clock.tick(t)
        t += FEATURE_EVERY_S
    clock.tick(t, force=True)
    times = [p[0] for p in clock.points]
    assert len(times) <= FEATURE_POINTS and times[-1] == t and times == sorted(times)
    assert times[0] == 0.0 and clock.every > FEATURE_EVERY_S


@pytest.mark.slow
def test_coverage_txt_reads_as_coverage_json_does(real_night):
    """A night that kept only coverage.txt (the nightly before it wrote JSON) shows the same
    counts and the same never-reached lines."""
    night, _ = real_night
    txt = kvfuzz("coverage", night / "guided" / "corpus")
    assert txt.returncode == 0, show(txt)
    from_text = night_mod.coverage_from_text(txt.stdout)
    from_json = night_mod.coverage_from_json(json.loads((night / "coverage.json").read_text()))
    assert from_text["features"] == from_json["features"] and from_text["features"]
    assert {k: (v["reached_n"], v["never"]) for k, v in from_text["kernels"].items()} == \
        {k: (v["reached_n"], v["never"]) for k, v in from_json["kernels"].items()}
    assert from_text["code"] == from_json["code"] and from_text["code"]


def test_a_hang_on_the_page_says_where_it_hung(tmp_path):
    """A hang case's fault shows its stack (innermost frame, then the ones outside libraries),
    a crash case's its last stderr lines."""
    lib = "/usr/lib/python3.11/site-packages"
    stack = [f"{lib}/torch/cuda/__init__.py:985 in synchronize", f"{lib}/triton/x.py:1 in run",
             "/team/kernels.py:12 in free", "/repo/fuzz/engine/supervise.py:250 in _child_entry"]
    for name, fault, expected in [
        ("hang", {"message": "no progress", "stderr_tail": ["noise"], "stack": stack},
         [stack[0], stack[2], stack[3], "(1 more frames: the case's fault.stack)"]),
        ("crash", {"message": "SIGSEGV", "stderr_tail": [f"line {i}" for i in range(12)]},
         [f"line {i}" for i in range(4, 12)]),
    ]:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"ops": [], "divergence": {"step": 0, "message": "m"}, "fault": fault}))
        finding = {"case": path, "tier": None}
        night_mod._detail(finding)
        assert finding["divergence"]["fault"].splitlines() == expected, finding


def test_a_finding_that_never_failed_again_reads_after_those_that_did_and_says_so(tmp_path):
    """A case none of whose five fresh replays failed (a loaded host's stall) is listed after a
    reproduced one, however often it was met, and its rate says it was not reproduced."""
    d = a_shard(tmp_path, "night", [a_case(READ, 2), a_case(CRASH, 3)], occurrences={str(CRASH): 9}, shard="0/1")
    summary = json.loads((d / "summary.json").read_text())
    for f in summary["failures"]:
        f["reproduced"] = {"k": 0, "n": 5, "fresh": 5} if f["signature"] == str(CRASH) else {"k": 3, "n": 3, "fresh": 3}
    (d / "summary.json").write_text(json.dumps(summary))
    page = tmp_path / "page.html"
    report([d], page)
    html = page.read_text()
    first, second = text_of(html, "finding-0"), text_of(html, "finding-1")
    assert str(READ) in first and "3/3" in first, first
    assert str(CRASH) in second and "0/5 not reproduced" in second, second
