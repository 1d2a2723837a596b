"""compute-sanitizer reports, as ``kvfuzz replay --sanitizer`` stores them in a case.

The texts in ``fixtures/sanitizer/`` follow the forms compute-sanitizer (old and new) and
cuda-memcheck print, as their manuals and users' logs show them: with and without line
info, ``Address``, ``Access at`` and ``Access to``, offset-first and kernel-first ``at``
lines, a C++ kernel name with spaces, several reports and a host backtrace in one text.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from fuzz.engine.case import load_case
from fuzz.tools import sanitizer
from fuzz.tools.sanitizer import parse_location, parse_report
from tests.fuzz.test_engine import kvfuzz, show

FIXTURES = Path(__file__).parent / "fixtures" / "sanitizer"

NEW_STYLE = """========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 8 bytes
=========     at _k_free_tagged+0x2a0 in /work/segfault.py:40
=========     by thread (2,0,0) in block (3,0,0)
=========     Access at 0x7fd5c6000008 is out of bounds
=========     and is 8,796,093,022,208 bytes after the nearest allocation at 0x7fd5c4000000 of size 1,024 bytes
=========
========= ERROR SUMMARY: 10 errors
"""
OLD_STYLE = """========= Invalid __global__ read of size 4 bytes
=========     at 0x1a0 in read_table_kernel
=========     by thread (31,0,0) in block (0,7,0)
=========     Address 0x7f0000000ffc is out of bounds
========= ERROR SUMMARY: 1 error
"""


def test_the_first_report_is_parsed_in_both_styles():
    new = parse_report(NEW_STYLE)
    assert (new["error"], new["kernel"], new["thread"], new["block"], new["address"], new["errors"]) == (
        "Invalid __global__ write of size 8 bytes", "_k_free_tagged", [2, 0, 0], [3, 0, 0], "0x7fd5c6000008", 10)
    assert "nearest allocation" in " ".join(new["lines"])
    old = parse_report(OLD_STYLE)
    assert (old["kernel"], old["thread"], old["block"], old["address"]) == (
        "read_table_kernel", [31, 0, 0], [0, 7, 0], "0x7f0000000ffc")


def test_a_clean_run_has_no_report():
    assert parse_report("========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n") is None
    assert parse_report("") is None


def test_the_sanitizer_needs_the_cuda_tier(tmp_path):
    case = tmp_path / "case.json"
    case.write_text(json.dumps({"schema": "kvfuzz-case/1", "config": {"num_pages": 8}, "ops": [{"op": "alloc", "n": 2}],
                                "signature": {"op": "alloc", "oracle": "state", "field": "v2p"}, "tier": "torch"}))
    r = kvfuzz("replay", case, "--sanitizer", "memcheck")
    assert r.returncode == 2 and "--backend cuda" in r.stderr and "Traceback" not in r.stderr, show(r)


# ---- file, line and address of the first report, from the fixture texts ----------------------

KEYS = ("space", "access", "size", "kernel", "offset", "file", "line", "thread", "block", "address", "errors")
EXPECTED = {
    "memcheck_address_lineinfo.txt":
        ("global", "write", 8, "_k_free_tagged", "0x1d0", "/path/to/segfault.py", 57, [2, 0, 0], [0, 0, 0],
         "0x7f1c2a000010", 3),
    "memcheck_access_at_relative.txt":
        ("global", "read", 4, "_build_kv_read_table_kernel", "0x2a0", "kvkernels/triton_kernels.py", 141,
         [31, 0, 0], [7, 2, 0], "0x7fd5c6000ffc", 1),
    "memcheck_access_to_no_lineinfo.txt":
        ("global", "atomic", 8, "_k_alloc_bind", "0x3f0", None, None, [0, 0, 0], [12, 0, 0], "0x7f00deadbee8", 4),
    "cuda_memcheck_offset_file_line_kernel.txt":
        ("global", "read", 8, "void vector_projection<double>(double*, int)", "0x000000c8",
         "/home/ubuntu/src/my_helper.cuh", 75, [9, 0, 0], [0, 0, 0], "0x000370e8", 2),
    "cuda_memcheck_offset_kernel.txt":
        ("global", "read", 4, "read_table_kernel", "0x1a0", None, None, [31, 0, 0], [0, 7, 0], "0x7f0000000ffc", 1),
    "memcheck_misaligned_cxx_kernel.txt":
        ("global", "write", 4, "void scatter<long>(long*, int const*, int)", "0x70", "/src/scatter.cu", 6,
         [0, 0, 0], [0, 0, 0], "0x7f671ac00001", 1),
    "initcheck_uninitialized.txt":
        ("global", "read", 8, "_k_translate", "0x90", "/work/kernels/foreign.py", 33, [5, 0, 0], [1, 0, 0],
         "0x7f2200000200", 1),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_first_report_names_its_file_line_and_address(name):
    report = parse_report((FIXTURES / name).read_text())
    assert tuple(report[k] for k in KEYS) == EXPECTED[name], report


def test_every_fixture_is_tested():
    assert {p.name for p in FIXTURES.glob("*.txt")} == {*EXPECTED, "clean.txt"}
    assert parse_report((FIXTURES / "clean.txt").read_text()) is None


def test_the_nearest_allocation_is_parsed():
    after = parse_report((FIXTURES / "memcheck_address_lineinfo.txt").read_text())
    assert after["allocation"] == {"base": "0x7f1a2a000000", "size": 4096, "where": "after", "distance": 8589934592}
    assert after["address_note"] == "is out of bounds"
    assert after["thread"] == [2, 0, 0]  # the first report's, not the second's (thread 3)
    before = parse_report((FIXTURES / "memcheck_access_at_relative.txt").read_text())
    assert before["allocation"] == {"base": "0x7fd5c6001000", "size": 2048, "where": "before", "distance": 4}
    inside = parse_report((FIXTURES / "memcheck_misaligned_cxx_kernel.txt").read_text())
    assert inside["allocation"]["where"] == "inside" and inside["address_note"] == "is misaligned"
    assert parse_report((FIXTURES / "memcheck_access_to_no_lineinfo.txt").read_text())["allocation"] is None


def test_a_report_does_not_borrow_details_from_the_next_one():
    text = ("========= Invalid __global__ write of size 8 bytes\n"
            "=========     at _k_a+0x10\n"
            "========= Invalid __global__ read of size 4 bytes\n"
            "=========     at _k_b+0x20 in /x/b.py:9\n"
            "=========     by thread (1,0,0) in block (2,0,0)\n"
            "=========     Address 0x10 is out of bounds\n")
    r = parse_report(text)
    assert (r["kernel"], r["file"], r["line"], r["thread"], r["address"]) == ("_k_a", None, None, None, None)


@pytest.mark.parametrize("line, expected", [
    ("    at _k+0x1d0 in /p/segfault.py:57", ("_k", "0x1d0", "/p/segfault.py", 57)),
    ("    at _k+0x1d0 in /p/segfault.py:57:13", ("_k", "0x1d0", "/p/segfault.py", 57)),  # with a column
    ("    at _k+0x1d0 in C:\\src\\k.py:8", ("_k", "0x1d0", "C:\\src\\k.py", 8)),
    ("    at _k+0x1d0", ("_k", "0x1d0", None, None)),
    ("    at 0x1a0 in _k", ("_k", "0x1a0", None, None)),
    ("    at 0xc8 in /a/b.cu:75:void f<int>(int*)", ("void f<int>(int*)", "0xc8", "/a/b.cu", 75)),
    ("    at _k", ("_k", None, None, None)),
])
def test_the_at_line_in_each_form(line, expected):
    loc = parse_location(line)
    assert (loc["kernel"], loc["offset"], loc["file"], loc["line"]) == expected
    assert parse_location("    by thread (0,0,0) in block (0,0,0)") is None


def test_replay_under_the_sanitizer_stores_file_line_and_address_in_the_case(tmp_path, monkeypatch, capsys):
    case_path = tmp_path / "case.json"
    case_path.write_text(json.dumps({
        "schema": "kvfuzz-case/1", "config": {"num_pages": 8}, "ops": [{"op": "alloc", "n": 2}],
        "signature": {"op": "free", "oracle": "crash", "field": "cuda-illegal-address"}, "tier": "cuda"}))
    text = (FIXTURES / "memcheck_address_lineinfo.txt").read_text()
    seen = {}

    def fake_run(cmd, **kwargs):
        seen["cmd"] = cmd
        return subprocess.CompletedProcess(cmd, 1, stdout=text, stderr="")

    monkeypatch.setattr(sanitizer.shutil, "which", lambda name: "/opt/cuda/bin/compute-sanitizer")
    monkeypatch.setattr(sanitizer.subprocess, "run", fake_run)
    code = sanitizer.replay_under_sanitizer(load_case(case_path), case_path, SimpleNamespace(backend="cuda", kernels=None),
                                            "memcheck")
    assert code == 1 and seen["cmd"][:3] == ["/opt/cuda/bin/compute-sanitizer", "--tool", "memcheck"]
    stored = load_case(case_path).extra["sanitizer"]
    report = stored["report"]
    assert stored["tool"] == "memcheck" and stored["exit"] == 1
    assert (report["file"], report["line"], report["address"], report["kernel"]) == (
        "/path/to/segfault.py", 57, "0x7f1c2a000010", "_k_free_tagged")
    out = capsys.readouterr().out
    assert "at /path/to/segfault.py:57" in out and "0x7f1c2a000010" in out
