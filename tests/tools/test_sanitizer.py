"""compute-sanitizer reports, as ``kvfuzz replay --sanitizer`` stores them in a case."""

from __future__ import annotations

import json

from fuzz.tools.sanitizer import parse_report
from tests.fuzz.test_engine import kvfuzz, show

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
