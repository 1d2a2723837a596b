"""Kernel-level ops on raw tables: straight through the kernel set, diffed against kvref.kernels."""

import os

import pytest

from fuzz.engine.case import Signature
from fuzz.engine.dispatch import replay
from fuzz.engine.ops import Op, OpError
from fuzz.engine.tiers import make_tier
from kvref import PoolConfig

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "kernels", "forget_p2v_tombstone.py")
TIERS = ["torch", pytest.param("interpret", marks=pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter is off (a GPU is present)"))]
CONFIG = PoolConfig(num_pages=10)
OPS = [
    {"op": "k_alloc_bind", "v": [5, 2, 7], "start": 3},
    {"op": "k_bind", "v": [1, 9], "p": [9, 1]},
    {"op": "k_free_unbind", "v": [2, 9]},
    {"op": "k_free_unbind", "v": [2]},            # double free: the spec refuses, the kernel must stay in bounds
    {"op": "k_bind", "v": [4, 4], "p": [6, 8]},   # duplicate ids: refused
    {"op": "k_bind", "v": [12], "p": [2]},        # past the table (rows = 11): refused
    {"op": "k_alloc_bind", "v": [2], "start": 6},
]


@pytest.mark.parametrize("backend", TIERS)
def test_raw_ops_agree_with_the_spec(backend):
    divergence, run = replay(CONFIG, OPS, make_tier(backend))
    assert divergence is None, str(divergence)
    assert run.stats.contract_ops == 3
    assert run.raw_spec["v2p"] == [0, 9, 6, -1, -1, 3, -1, 5, -1, -1, -1]
    assert run.raw_target.v2p.tolist() == run.raw_spec["v2p"]


@pytest.mark.parametrize("backend", TIERS[1:])
def test_a_free_kernel_that_forgets_p2v_diverges_on_raw_tables(backend):
    divergence, _ = replay(CONFIG, OPS, make_tier(backend, FIXTURE))
    assert divergence is not None
    assert (divergence.step, divergence.signature) == (2, Signature("k_free_unbind", "state", "raw_p2v"))


def test_a_stray_store_past_the_raw_table_is_a_memory_finding(monkeypatch):
    import kvkernels.torch_path as tp

    real = tp.free_unbind_inplace

    def stray(v_pages, v2p, p2v):
        out = real(v_pages, v2p, p2v)
        v2p.as_strided((1,), (1,), v2p.storage_offset() + v2p.numel() + 2).fill_(5)  # two rows past the end
        return out

    monkeypatch.setattr(tp, "free_unbind_inplace", stray)
    divergence, _ = replay(CONFIG, OPS[:3], make_tier("torch"))
    assert divergence is not None and divergence.signature == Signature("k_free_unbind", "memory", "raw_v2p")


@pytest.mark.parametrize("op", [{"op": "k_bind", "v": [1]}, {"op": "k_alloc_bind", "v": [1], "start": "3"},
                                {"op": "k_free_unbind", "v": 3}])
def test_malformed_raw_ops_are_op_errors(op):
    with pytest.raises(OpError):
        Op.from_json(op)
