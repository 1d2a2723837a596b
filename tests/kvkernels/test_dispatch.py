"""The kernel-set contract: signatures, dispatch torch vs Triton, grids, empty input, argument checks."""

from __future__ import annotations

import inspect

import pytest
import torch

import kvkernels
from kvkernels import launchers, torch_path, triton_kernels
from kvref import ContractViolation

KERNEL_SET = {
    "alloc_bind_inplace": "(v_pages, v2p, p2v, start_phys)",
    "free_unbind_inplace": "(v_pages, v2p, p2v)",
    "bind_inplace": "(v_pages, p_pages, v2p, p2v) -> None",
    "build_kv_read_table": "(*, req_to_token, req_pool_indices, seq_lens, v2p, multiplier, page_size, max_pages, out)",
    "build_kv_read_table_legacy":
        "(*, req_to_token, req_pool_indices, seq_lens, v2p, multiplier, page_size, max_pages, out)",
    "build_kv_read_table_packed": "(*, req_to_token, req_pool_indices, seq_lens, v2p, indptr, multiplier, page_size, "
                                  "max_tokens, out, kv_start_idx=None)",
    "translate_tokens": "(*, loc, v2p, page_size, out=None)",
}
KERNELS = ["alloc_bind_kernel", "bind_kernel", "free_unbind_kernel", "translate_kernel", "read_table_kernel",
           "read_table_legacy_kernel", "read_table_packed_kernel"]


@pytest.mark.parametrize("module", [kvkernels, torch_path], ids=["kvkernels", "torch_path"])
@pytest.mark.parametrize("name", sorted(KERNEL_SET))
def test_kernel_set_signatures(module, name):
    sig = inspect.signature(getattr(module, name))
    assert str(sig).replace("'", "") == KERNEL_SET[name]
    assert name in module.__all__


class _NoLaunch:
    """Stands in for a kernel: any launch fails the test."""

    def __init__(self, name):
        self.name = name

    def __getitem__(self, grid):
        pytest.fail(f"{self.name} was launched with grid {grid}")


class _Recorder:
    """Wraps a kernel: records (grid, positional args) of each launch, then launches it."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append((tuple(grid), args, kwargs))
            return self.kernel[grid](*args, **kwargs)

        return launch


def _no_kernels(monkeypatch):
    for name in KERNELS:
        monkeypatch.setattr(triton_kernels, name, _NoLaunch(name))


def _no_torch_path(monkeypatch):
    for name in KERNEL_SET:
        monkeypatch.setattr(torch_path, name, lambda *a, _n=name, **k: pytest.fail(f"torch_path.{_n} was called"))


def _call_all(device, n_ids=3, bs=2):
    """One call of every kernel-set function through the kvkernels package, on ``device``."""

    def t(values):
        return torch.tensor(values, dtype=torch.int64, device=device)

    rows = 8
    v2p = t([0] + [-1] * (rows - 1))
    p2v = t([0] + [-1] * (rows - 1))
    vs = t([1, 2, 3][:n_ids])
    kvkernels.alloc_bind_inplace(vs, v2p, p2v, 4)
    kvkernels.bind_inplace(vs, t([4, 5, 6][:n_ids]), v2p, p2v)
    kvkernels.free_unbind_inplace(vs, v2p, p2v)
    batch = dict(req_to_token=t([[0, 1, 2, 3]] * 2), req_pool_indices=t([0, 1][:bs]), seq_lens=t([3, 4][:bs]),
                 v2p=v2p, multiplier=1, page_size=1)
    out = torch.zeros((2, 4), dtype=torch.int32, device=device)
    kvkernels.build_kv_read_table(**batch, max_pages=4, out=out)
    kvkernels.build_kv_read_table_legacy(**batch, max_pages=4, out=out)
    kvkernels.build_kv_read_table_packed(**batch, indptr=t([0, 3, 7][: bs + 1]), max_tokens=4,
                                         out=torch.zeros(8, dtype=torch.int32, device=device))
    kvkernels.translate_tokens(loc=vs, v2p=v2p, page_size=1)


def test_triton_tier_runs_the_kernels(triton_tier, monkeypatch):
    assert launchers.uses_triton(triton_tier.t([1]))
    _no_torch_path(monkeypatch)
    _call_all(triton_tier.device)


def test_triton_tier_empty_input_launches_nothing(triton_tier, monkeypatch):
    _no_kernels(monkeypatch)
    _no_torch_path(monkeypatch)
    _call_all(triton_tier.device, n_ids=0, bs=0)


def test_cpu_without_interpreter_uses_torch_path(monkeypatch):
    monkeypatch.setattr(launchers, "INTERPRET", False)
    assert not launchers.uses_triton(torch.zeros(1))
    _no_kernels(monkeypatch)
    calls = []
    real = {name: getattr(torch_path, name) for name in KERNEL_SET}
    for name in KERNEL_SET:
        monkeypatch.setattr(torch_path, name, lambda *a, _n=name, **k: calls.append(_n) or real[_n](*a, **k))
    _call_all(torch.device("cpu"))
    assert sorted(set(calls)) == sorted(KERNEL_SET)


def test_interpreter_detection_matches_triton():
    """INTERPRET is what Triton decided at decoration time, which tests/conftest.py drives."""
    assert launchers.INTERPRET == (type(triton_kernels.free_unbind_kernel).__name__ == "InterpretedFunction")
    if not torch.cuda.is_available():
        assert launchers.INTERPRET, "tests/conftest.py sets TRITON_INTERPRET=1 without a GPU"


@pytest.mark.parametrize("bs,max_pages,expect", [(1, 131072, 256), (1, 100, 1), (3, 4096, 8), (64, 8192, 16),
                                                 (256, 8192, 4), (2048, 8192, 1)])
def test_read_table_grid_formula(bs, max_pages, expect):
    grid = launchers.read_table_grid(bs, max_pages, block_cols=launchers.BLOCK_COLS,
                                     target_blocks=launchers.TARGET_BLOCKS)
    assert grid == (bs, expect)
    assert launchers.legacy_read_table_grid(bs, max_pages, block_cols=512) == (bs, -(-max_pages // 512))


@pytest.mark.parametrize("legacy", [False, True], ids=["strided", "legacy"])
def test_read_table_launch_grid(triton_tier, monkeypatch, legacy):
    """The strided kernel gets the bs-sized grid and col_stride = col_programs * BLOCK_COLS."""
    triton_tier.shrink_blocks(monkeypatch, cols=4, target=8)
    name = "read_table_legacy_kernel" if legacy else "read_table_kernel"
    rec = _Recorder(getattr(triton_kernels, name))
    monkeypatch.setattr(triton_kernels, name, rec)
    bs, max_pages = 3, 50
    out = torch.zeros((bs, max_pages), dtype=torch.int32, device=triton_tier.device)
    fn = kvkernels.build_kv_read_table_legacy if legacy else kvkernels.build_kv_read_table
    fn(req_to_token=triton_tier.t([list(range(max_pages))] * 2), req_pool_indices=triton_tier.t([0, 1, 0]),
       seq_lens=triton_tier.t([50, 3, 0]), v2p=triton_tier.t(list(range(60))), multiplier=1, page_size=1,
       max_pages=max_pages, out=out)
    ((grid, args, kwargs),) = rec.launches
    if legacy:
        assert grid == (3, 13)
    else:
        assert grid == (3, 3)  # min(cdiv(8, 3), cdiv(50, 4))
        assert args[-1] == 3 * 4  # col_stride
    assert kwargs["BLOCK"] == 4
    assert out[0].tolist() == list(range(50)) and out[1, :3].tolist() == [0, 1, 2]


def test_argument_checks(tier):
    """Shape, dtype and device checks (no values are read): ContractViolation before any write."""
    v2p, p2v = tier.t([0, -1, -1, -1]), tier.t([0, -1, -1, -1])
    r2t = tier.t([[0, 1, 2, 3]])
    batch = dict(req_to_token=r2t, req_pool_indices=tier.t([0]), seq_lens=tier.t([3]), v2p=v2p, multiplier=1,
                 page_size=1, max_pages=4)
    good = torch.full((1, 4), 7, dtype=torch.int32, device=tier.device)
    tier.k.build_kv_read_table(**batch, out=good)
    assert good.tolist() == [[0, 0, 0, 7]]
    good.fill_(7)
    bad_outs = [
        good.to(torch.int64),  # dtype
        good[:, :3],  # too few columns
        torch.zeros((4, 8), dtype=torch.int32, device=tier.device).t(),  # columns not packed
        torch.zeros(4, dtype=torch.int32, device=tier.device),  # 1-D
    ]
    for out in bad_outs:
        with pytest.raises(ContractViolation):
            tier.k.build_kv_read_table(**batch, out=out)
    with pytest.raises(ContractViolation):
        tier.k.build_kv_read_table(**{**batch, "out": torch.zeros((0, 4), dtype=torch.int32, device=tier.device)})
    with pytest.raises(ContractViolation):
        tier.k.build_kv_read_table(**{**batch, "seq_lens": tier.t([3, 4])}, out=good)
    with pytest.raises(ContractViolation):
        tier.k.build_kv_read_table(**{**batch, "page_size": 0}, out=good)
    with pytest.raises(ContractViolation):
        tier.k.bind_inplace(tier.t([1, 2]), tier.t([1]), v2p, p2v)
    with pytest.raises(ContractViolation):
        tier.k.free_unbind_inplace(tier.t([1]), v2p.to(torch.int32), p2v)
    with pytest.raises(ContractViolation):
        tier.k.alloc_bind_inplace(tier.t([1]), v2p, p2v, tier.t([1]))
    with pytest.raises(ContractViolation):
        tier.k.build_kv_read_table_packed(**{k: v for k, v in batch.items() if k != "max_pages"}, max_tokens=3,
                                          indptr=tier.t([0]), out=torch.zeros(4, dtype=torch.int32,
                                                                                device=tier.device))
    with pytest.raises(ContractViolation):
        tier.k.translate_tokens(loc=tier.t([1, 2]), v2p=v2p, page_size=1,
                                out=torch.zeros(3, dtype=torch.int64, device=tier.device))
    assert v2p.tolist() == [0, -1, -1, -1] and p2v.tolist() == [0, -1, -1, -1]
    assert good.tolist() == [[7, 7, 7, 7]]
