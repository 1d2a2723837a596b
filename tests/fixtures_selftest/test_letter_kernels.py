"""The letter-of-SPEC kernel sets of tests/fixtures/kernels/letter/ do what their README says,
and kvfuzz reports each of them clean.

Each set is right on every input meeting one SPEC §2 precondition and does something else on
input breaking it (a kernel that is merely forgiving hides generator bugs). The
first tests show each behaviour on one call that breaks its precondition (so the sets are not
indep.py under another name); the campaigns show kvfuzz never hands them such input as valid.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1].parent
LETTER = REPO / "tests/fixtures/kernels/letter"
SETS = ("clamp_max_tokens", "refuse_short_out", "drop_overlong_rows", "int32_bounded", "narrow_width", "letter_all")
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_interpreter = pytest.mark.skipif(not INTERPRET, reason="Triton's interpreter is off (a GPU is present)")
P = -7  # poison
I64 = torch.int64


def _load(stem: str, folder: Path = LETTER):
    spec = importlib.util.spec_from_file_location(f"_kvfuzz_letter_test_{stem}", folder / f"{stem}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _indep():
    return _load("indep", REPO / "tests/fixtures/kernels/foreign")


def _packed(kernels, *, seq, indptr, max_tokens, out_len, v2p=None, multiplier=1):
    out = torch.full((out_len,), P, dtype=torch.int32)
    r2t = torch.arange(16, dtype=I64).reshape(1, 16)
    kernels.build_kv_read_table_packed(req_to_token=r2t, req_pool_indices=torch.zeros(len(seq), dtype=I64),
                                       seq_lens=torch.tensor(seq, dtype=I64),
                                       v2p=torch.arange(20, dtype=I64) if v2p is None else v2p,
                                       indptr=torch.tensor(indptr, dtype=I64), multiplier=multiplier, page_size=1,
                                       max_tokens=max_tokens, out=out)
    return out.tolist()


def _table(kernels, *, r2t, seq, max_pages, v2p=None, multiplier=1, page_size=1):
    out = torch.full((len(seq), max_pages), P, dtype=torch.int32)
    kernels.build_kv_read_table(req_to_token=r2t, req_pool_indices=torch.zeros(len(seq), dtype=I64),
                                seq_lens=torch.tensor(seq, dtype=I64),
                                v2p=torch.arange(40, dtype=I64) if v2p is None else v2p, multiplier=multiplier,
                                page_size=page_size, max_pages=max_pages, out=out)
    return out.tolist()


@needs_interpreter
def test_each_set_breaks_ranks_with_indep_only_where_its_precondition_is_broken():
    indep = _indep()
    # indptr[bs] = 6 > max_tokens = 4 and an out of 6: indep clamps at out.numel(), the letter at max_tokens.
    call = dict(seq=[3, 3], indptr=[0, 3, 6], max_tokens=4, out_len=6)
    assert _packed(indep, **call) == [0, 1, 2, 0, 1, 2]
    assert _packed(_load("clamp_max_tokens"), **call) == [0, 1, 2, 0, P, P]
    ok = dict(seq=[3, 1], indptr=[0, 3, 4], max_tokens=6, out_len=6)  # valid: both agree
    assert _packed(_load("clamp_max_tokens"), **ok) == _packed(indep, **ok) == [0, 1, 2, 0, P, P]
    # out shorter than max_tokens: refused.
    with pytest.raises(ValueError, match="max_tokens"):
        _packed(_load("refuse_short_out"), seq=[2], indptr=[0, 2], max_tokens=4, out_len=3)
    assert _packed(indep, seq=[2], indptr=[0, 2], max_tokens=4, out_len=3) == [0, 1, P]
    # a row needing more than max_pages columns: nothing of it, where indep writes its first max_pages.
    r2t = torch.arange(8, dtype=I64).reshape(1, 8)
    assert _table(indep, r2t=r2t, seq=[5, 2], max_pages=3) == [[0, 1, 2], [0, 1, P]]
    assert _table(_load("drop_overlong_rows"), r2t=r2t, seq=[5, 2], max_pages=3) == [[P, P, P], [0, 1, P]]
    # v2p[page] * multiplier = 2^31 (breaks entry_fits_int32): int64 then cast wraps to -2^31, int32 clamps at 0.
    v2p = torch.full((40,), 1 << 20, dtype=I64)
    assert _table(indep, r2t=r2t, seq=[1], max_pages=1, v2p=v2p, multiplier=1 << 11) == [[-(1 << 31)]]
    assert _table(_load("int32_bounded"), r2t=r2t, seq=[1], max_pages=1, v2p=v2p, multiplier=1 << 11) == [[0]]
    # req_to_token 4 wide but max_pages 6 (breaks the width clause): the letter reads row 0's columns 4, 5
    # from its buffer (here row 1), indep writes nothing past the width.
    r2t = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=I64)
    assert _table(indep, r2t=r2t, seq=[6], max_pages=6) == [[1, 2, 3, 4, P, P]]
    assert _table(_load("narrow_width"), r2t=r2t, seq=[6], max_pages=6) == [[1, 2, 3, 4, 5, 6]]
    everything = _load("letter_all")
    assert _packed(everything, **call) == [0, 1, 2, 0, P, P]
    assert _table(everything, r2t=r2t, seq=[6], max_pages=6) == [[1, 2, 3, 4, 5, 6]]


def _campaign(stem: str, scale: str, out: Path) -> tuple[int, str]:
    # A budget of work, not seconds (the same ops on a loaded CI runner as on an idle one): one
    # sequence, at production scale of 12 ops; op-timeout generous because this 2-core CI machine
    # runs other tests beside it (a production op can take 30 s there).
    work = ["--max-sequences", "1"] + (["--ops-per-sequence", "12"] if scale == "production" else [])
    cmd = [sys.executable, "-m", "fuzz", "run", "--backend", "interpret", "--kernels", str(LETTER / f"{stem}.py"),
           "--scale", scale, *work, "--budget-s", "600", "--workers", "1", "--op-timeout", "300", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    return proc.returncode, proc.stdout + proc.stderr


@needs_interpreter
@pytest.mark.parametrize("scale", ["small", "production"])
@pytest.mark.parametrize("stem", SETS)
def test_letter_sets_are_clean_at_both_scales(stem, scale, tmp_path):
    rc, text = _campaign(stem, scale, tmp_path)
    assert rc == 0 and "failures=0" in text, text[-3000:]
