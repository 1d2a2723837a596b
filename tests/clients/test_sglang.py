"""SGLang as a client (fuzz/clients/sglang.py, docs/sglang.md): its real kernels, installed
from PyPI into a temporary ``--target`` directory (never into kvfuzz's environment), fuzzed
on the interpreter tier: clean on valid input, and on SPEC's hostile classes no finding outside the
findings of the shipped baseline (fuzz/clients/sglang-baseline.json).

How SGLang is installed for the tests, and when they skip: ``tests/clients/sglang_site.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.clients.sglang_site import INSTALL_HINT, skip_if_sglang_importable
from tests.clients.sglang_site import pythonpath as _pythonpath
from tests.fuzz.test_engine import REPO, kvfuzz, show

BASELINE = REPO / "fuzz/clients/sglang-baseline.json"
CASES = sorted((REPO / "tests/clients/sglang-cases").glob("*.json"))  # docs/sglang.md's cases

pytestmark = pytest.mark.slow  # two short campaigns: about a minute in all


def _campaign(site: str, out: Path, hostile: str, sequences: int, *extra, seed: int = 0) -> tuple[subprocess.CompletedProcess, dict]:
    summary = out / "summary.json"
    r = kvfuzz("run", "--backend", "interpret", "--kernels", "kvfuzz-sglang", "--hostile", hostile, "--seed", seed,
               "--max-sequences", sequences, "--workers", 1, "--out", out / "cases", "--summary", summary, *extra,
               timeout=400, PYTHONPATH=_pythonpath(site))
    assert summary.is_file(), show(r)
    return r, json.loads(summary.read_text())


def test_valid_input_is_clean(sglang_site, tmp_path):
    r, summary = _campaign(sglang_site, tmp_path, "off", 3)  # seed 0's first 3 sequences run every kind
    assert r.returncode == 0 and summary["failures"] == [], show(r)
    assert summary["contract_ops"] == 0 and summary["ops"] > 0, summary
    assert {"read_table", "read_table_packed", "translate", "k_free_unbind"} <= set(summary["by_kind"]), summary


def test_spec_hostile_classes_find_exactly_the_baseline(sglang_site, tmp_path):
    # Seed 2 reaches both free classes and probes read_table_seq_lens within its first 6 sequences
    # (seeds 3 and 6 do too, with chain seeds among them); minimizing is not what this test is about.
    r, summary = _campaign(sglang_site, tmp_path, "spec", 6, "--no-minimize", seed=2)
    known = json.loads(BASELINE.read_text())
    assert known["schema"] == "kvfuzz-baseline/1"
    found = {f["signature"] for f in summary["failures"]}
    baseline = {k["signature"] for k in known["known"]}
    assert found <= baseline, f"new findings, not in the baseline: {found - baseline}\n{show(r)}"
    # the two free classes come within seconds; the packed class is rarer (0.27% of ops) and may not
    assert {"free/memory/p2v", "free/memory/v2p"} <= found, show(r)
    assert r.returncode == 1 and summary["hostile_classes"].get("free_unbind"), summary
    assert summary["hostile_classes"].get("read_table_seq_lens"), summary  # probed, and clean (docs/sglang.md)


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_the_documented_cases_still_fail_with_their_signature(sglang_site, case):
    r = kvfuzz("replay", case, timeout=180, PYTHONPATH=_pythonpath(sglang_site))
    signature = "{op}/{oracle}/{field}".format(**json.loads(case.read_text())["signature"])
    assert r.returncode == 1 and f"{signature}: " in r.stdout and "same signature" in r.stdout, show(r)
    assert signature in {k["signature"] for k in json.loads(BASELINE.read_text())["known"]}


PROBE = r"""
import json, sys, torch
import fuzz.clients.sglang as sgl
from fuzz.engine.tiers import load_kernels
assert load_kernels("kvfuzz-sglang") is sgl
assert "sglang" not in sys.modules, "the adapter imported the sglang package"
# The token-stream table bounds a row by seq_lens alone (docs/sglang.md, finding 3): a row of
# 6 tokens into an 8-element out with max_tokens=4 stores past both.
buf = torch.full((12,), -7, dtype=torch.int32)
sgl.build_kv_read_table_packed(req_to_token=torch.arange(16).reshape(1, 16), req_pool_indices=torch.tensor([0]),
                               seq_lens=torch.tensor([10]), v2p=torch.arange(17), indptr=torch.tensor([0, 4]),
                               multiplier=1, page_size=1, max_tokens=4, out=buf[:8])
print(json.dumps({"version": sgl.SGLANG_VERSION, "knobs": sgl.FUZZ_KNOBS, "past_out": buf[8:].tolist()}))
"""


def test_adapter_loads_by_file_and_the_token_stream_overflow_is_real(sglang_site):
    env = {"PYTHONPATH": _pythonpath(sglang_site), "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120,
                       env={**os.environ, **env})
    assert r.returncode == 0, show(r)
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["version"] == "0.5.23"
    assert got["knobs"] == {"ALLOC_BIND_BLOCK": [4, 128], "TRANSLATE_TOKEN_IDS_BLOCK": [4, 512],
                            "BLOCK_ITEMS": [4, 512], "TARGET_BLOCKS": [2, 1024]}
    assert got["past_out"] == [8, 9, -7, -7], got


def test_without_sglang_the_kernel_set_is_a_setup_error_naming_the_install(tmp_path):
    skip_if_sglang_importable()
    r = kvfuzz("run", "--backend", "interpret", "--kernels", "kvfuzz-sglang", "--budget-s", 5, "--out", tmp_path)
    assert r.returncode == 2 and INSTALL_HINT in r.stderr and "Traceback" not in r.stderr, show(r)
