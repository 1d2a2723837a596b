"""Malformed case files are usage errors (CaseError, exit 2), never a target 'crash'."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz.engine.case import CaseError, load_case, resolve_kernels

REPO = Path(__file__).resolve().parents[2]
GOOD = {"schema": "kvfuzz-case/1", "config": {"num_pages": 4}, "ops": [{"op": "alloc", "n": 2}],
        "signature": {"op": "alloc", "oracle": "state", "field": "v2p"}}


@pytest.mark.parametrize("ops,needle", [
    ([{"op": "free", "tokens": "12"}], "'tokens' must be a list of ints"),
    ([{"op": "alloc", "n": True}], "'n' must be an int"),
    ([{"op": "flush", "urgent": 1}], "'urgent' must be a bool"),
    ([{"op": "read_table", "rows": [[1]], "req_idx": [0], "seq_lens": [1], "max_pages": "2", "width": 2,
       "legacy": False}], "'max_pages' must be an int"),
    ([{"op": "read_table_packed", "rows": [[1]], "req_idx": [0], "seq_lens": [1], "kv_start": "x",
       "indptr": [0, 1], "max_tokens": 1, "width": 1}], "'kv_start' must be a list of ints or null"),
    ("alloc", "'ops' must be a list"),
])
def test_badly_typed_ops_are_case_errors(tmp_path, ops, needle):
    path = tmp_path / "case.json"
    path.write_text(json.dumps({**GOOD, "ops": ops}))
    with pytest.raises(CaseError, match=needle):
        load_case(path)


def test_bad_knobs_are_case_errors(tmp_path):
    path = tmp_path / "case.json"
    path.write_text(json.dumps({**GOOD, "knobs": {"BLOCK_COLS": "4"}}))
    with pytest.raises(CaseError, match="knobs"):
        load_case(path)


def test_an_unknown_knob_exits_2_naming_it(tmp_path):
    path = tmp_path / "case.json"
    path.write_text(json.dumps({**GOOD, "knobs": {"NO_SUCH_KNOB": 4}, "tier": "torch", "kernels": "kvkernels"}))
    proc = subprocess.run([sys.executable, "-m", "fuzz", "replay", str(path), "--backend", "torch"],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2 and "NO_SUCH_KNOB" in proc.stderr and "Traceback" not in proc.stderr


def test_a_relative_kernel_file_is_found_above_a_moved_case(tmp_path, monkeypatch):
    fixture = "tests/fixtures/kernels/forget_p2v_tombstone.py"
    (tmp_path / "tests/fixtures/kernels").mkdir(parents=True)
    shutil.copy(REPO / fixture, tmp_path / fixture)
    (tmp_path / "cases/deep").mkdir(parents=True)
    case = tmp_path / "cases/deep/case.json"
    case.write_text(json.dumps(GOOD))
    monkeypatch.chdir(tmp_path / "cases")  # the campaign ran elsewhere
    assert resolve_kernels(fixture, str(case)) == str(tmp_path / fixture)
    assert resolve_kernels("kvkernels", str(case)) == "kvkernels"
    assert resolve_kernels("missing/k.py", str(case)) == "missing/k.py"


def test_a_triton_kernel_set_on_the_torch_tier_is_a_setup_error():
    # --max-sequences, not a 2 s budget: the worker refuses the set, and one still importing past the
    # budget and its grace would be let go (the run then "ran no ops", not this message)
    proc = subprocess.run([sys.executable, "-m", "fuzz", "run", "--backend", "torch", "--max-sequences", "1",
                           "--kernels", "tests/fixtures/kernels/forget_p2v_tombstone.py", "--out", "/dev/null/x"],
                          cwd=REPO, capture_output=True, text=True, timeout=240,
                          env={k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--backend interpret" in proc.stderr and "Traceback" not in proc.stderr
