"""CUDA-graph replay fuzzing (fuzz/engine/production/graph.py): the launch-recording emulation on the
interpreter, and real CUDA graphs on a GPU."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from fuzz.engine.dispatch import replay
from fuzz.engine.ops import Op
from fuzz.engine.production import ops as scale
from fuzz.engine.production.graph import EmulatedCapture, GReadTable, LaunchRecorder
from fuzz.engine.production.ops import PSetup
from fuzz.engine.tiers import make_tier
from kvref import PoolConfig

FOREIGN = Path(__file__).resolve().parents[1] / "fixtures" / "kernels" / "foreign"
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_interpreter = pytest.mark.skipif(not INTERPRET, reason="Triton's interpreter is off (a GPU is present)")

sys.path.insert(0, str(FOREIGN))
import variants  # noqa: E402

sys.path.remove(str(FOREIGN))

CONFIG = PoolConfig(num_pages=3000, page_size=4, multiplier=2)
SETUP = PSetup(n=2500, v=(1, 2999, 7, 3, 0), p=(1, 2500, 11, 5, 0))


def _graph_op(**kw) -> GReadTable:
    base = dict(seed=5, bs=6, max_pages=40, rows=4, width=160, src=(0, 3001, 1, 0, 0, 3001, 17, 9), cap_len=3,
                long_len=150, steps=4, tombs=2, packed=False)
    return GReadTable(**{**base, **kw})


@pytest.fixture(scope="module")
def host_bound(tmp_path_factory) -> str:
    return str(variants.materialize("host_bound_seq_lens", tmp_path_factory.mktemp("v")))


def _backend() -> str:
    return "interpret" if INTERPRET else "cuda"


@needs_interpreter
def test_the_recorder_replays_the_launches_of_a_call():
    tier = make_tier("interpret", str(FOREIGN / "indep.py"))
    v2p = torch.full((10,), -1, dtype=torch.int64)
    p2v = v2p.clone()
    v = torch.tensor([1, 2, 3])
    from triton.runtime.interpreter import InterpretedFunction

    original = vars(InterpretedFunction)["run"]
    with LaunchRecorder() as rec:
        tier.kernels.alloc_bind_inplace(v, v2p, p2v, 4)
    assert len(rec.launches) == 1 and rec.stale_args() == []
    v.copy_(torch.tensor([5, 6, 7]))  # the captured input, refreshed in place
    rec.launches[0].replay()
    assert v2p[5:8].tolist() == [4, 5, 6]
    assert vars(InterpretedFunction)["run"] is original  # unwrapped again


def test_a_torch_path_is_not_applicable_rather_than_clean():
    tier = make_tier("torch")
    cap = EmulatedCapture()
    why = cap.capture(lambda: tier.kernels.alloc_bind_inplace(torch.tensor([1]), torch.full((4,), -1),
                                                              torch.full((4,), -1), 2))
    assert why is not None and "no Triton kernel" in why
    d, run = replay(CONFIG, [SETUP, _graph_op()], tier)
    assert d is None and run.graph_not_applicable == 1 and run.graph_replays == 0
    assert "not applicable" in run.notes[0]


@needs_interpreter
def test_a_launcher_computing_kernel_inputs_with_torch_is_not_emulated():
    tier = make_tier("interpret", str(FOREIGN / "indep.py"))
    v2p = torch.full((10,), -1, dtype=torch.int64)
    p2v = v2p.clone()
    v = torch.tensor([1, 2, 3])
    why = EmulatedCapture().capture(lambda: tier.kernels.alloc_bind_inplace(v + 1, v2p, p2v, 4))
    assert why is not None and "torch ops" in why


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("kernels", ["indep", "kvkernels"])
def test_a_correct_read_table_stays_clean_under_replay(kernels, packed):
    if not INTERPRET and not torch.cuda.is_available():
        pytest.skip("no Triton tier here")
    tier = make_tier(_backend(), str(FOREIGN / "indep.py") if kernels == "indep" else "kvkernels")
    op = _graph_op(packed=packed, max_pages=150 if packed else 40)
    d, run = replay(CONFIG, [SETUP, op], tier)
    assert d is None, str(d)
    assert run.graph_replays == op.steps and run.graph_not_applicable == 0
    assert run.elements_checked >= op.bs * op.max_pages * op.steps


def test_host_bound_is_clean_eagerly_and_caught_under_replay(host_bound):
    if not INTERPRET and not torch.cuda.is_available():
        pytest.skip("no Triton tier here")
    tier = make_tier(_backend(), host_bound)
    eager = scale.PReadTable(seed=5, bs=6, max_pages=40, req=(1, 0, 4), long_len=150, n_long=2, legacy=False)
    rows = scale.PRows(seed=5, rows=4, width=160, src=(0, 3001, 1, 0, 0, 3001, 17, 9), pad_every=0)
    d, _ = replay(CONFIG, [SETUP, rows, eager], tier)
    assert d is None, str(d)
    ops = json.loads(json.dumps([SETUP.to_json(), _graph_op().to_json()]))  # a case file replays it under capture
    d, _ = replay(CONFIG, ops, tier)
    assert d is not None and (d.kind, d.oracle, d.field) == ("g_read_table", "result", "out"), str(d)
    assert "replay" in d.message
    assert Op.from_json(ops[1]) == _graph_op()


@pytest.mark.cuda
def test_cuda_graph_replay_catches_host_bound(host_bound):
    tier = make_tier("cuda", host_bound)
    d, _ = replay(CONFIG, [SETUP, _graph_op()], tier)
    assert d is not None and d.kind == "g_read_table"
