"""DeviceAllocator's lazy free and read-table builds never wait for the device (SPEC.md §5).

Runs on the torch tier (``kvkernels.torch_path``) and on the interpreter tier (the
Triton kernels under ``TRITON_INTERPRET=1``), each free path and each read-table build
wrapped in ``no_host_sync``. The eager free and flush may synchronise (SPEC.md §3):
they run under the recording detector, which must not change what they do.
"""

from __future__ import annotations

import random
import types

import pytest
import torch

import kvkernels
from fuzz.sync.gpu import ALLOCATOR_PROBES, allocator_case
from fuzz.sync.runtime import HostSyncError, no_host_sync, record_host_syncs
from kvkernels import DeviceAllocator, launchers, torch_path
from kvref import PoolConfig


def _interpreter_kernels():
    if not launchers.INTERPRET:
        pytest.skip("the interpreter tier needs TRITON_INTERPRET=1 before kvkernels is imported")
    return kvkernels


TIERS = {"torch": lambda: torch_path, "interpret": _interpreter_kernels}


@pytest.fixture(params=sorted(TIERS))
def kernels(request):
    return TIERS[request.param]()


MUST_NOT_SYNC = [name for name, must in ALLOCATOR_PROBES if must]


@pytest.mark.parametrize("probe", MUST_NOT_SYNC)
def test_probe_cases_do_not_sync(kernels, probe):
    """The same cases the GPU ground truth captures in a CUDA graph (fuzz.sync.gpu)."""
    fn, make = allocator_case(probe, kernels, "cpu")
    plain_args, watched_args = make(), make()
    expected = fn(plain_args)
    with no_host_sync():
        got = fn(watched_args)
    if expected is not None:
        assert torch.equal(got, expected)
    a, b = plain_args["alloc"], watched_args["alloc"]
    assert a.snapshot() == b.snapshot()


def _read_table_inputs(pool: DeviceAllocator, runs: list[torch.Tensor], max_pages: int):
    ps = pool.config.page_size
    width = max_pages * ps
    req_to_token = torch.full((len(runs) + 1, width), -1, dtype=torch.int64)
    for b, run in enumerate(runs):
        req_to_token[b, : run.numel()] = run
    seq_lens = torch.tensor([r.numel() for r in runs], dtype=torch.int64)
    out = torch.full((len(runs) + 1, max_pages), -7, dtype=torch.int32)
    return dict(req_to_token=req_to_token, req_pool_indices=torch.arange(len(runs), dtype=torch.int64),
                seq_lens=seq_lens, out=out, max_pages=max_pages)


CONFIGS = [
    dict(page_size=1, grow="up", multiplier=1),
    dict(page_size=1, grow="down", multiplier=3),
    dict(page_size=2, grow="up", multiplier=1),
    dict(page_size=4, grow="down", multiplier=2),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"ps{c['page_size']}-{c['grow']}-m{c['multiplier']}")
def test_every_lazy_free_and_read_table_build_of_a_trace(kernels, cfg):
    """A random trace: allocs, lazy frees (with holes, with a forward in flight), read tables."""
    rng = random.Random(f"{cfg}")
    ps = cfg["page_size"]
    pool = DeviceAllocator(PoolConfig(num_pages=40, lazy=True, **cfg), kernels=kernels)
    live: list[torch.Tensor] = []
    frees = builds = 0
    for _ in range(60):
        roll = rng.random()
        if roll < 0.45 or not live:
            run = pool.alloc(ps * rng.randint(1, 4))
            if run is not None:
                live.append(run)
        elif roll < 0.8:
            run = live.pop(rng.randrange(len(live)))
            if rng.random() < 0.3:
                pool.forward(run)  # a reader in flight: a later flush parks moved pages in pending
            if ps > 1 and rng.random() < 0.5 and run.numel() > ps:
                run = run[: run.numel() - rng.randint(1, ps - 1)]  # the last page may be partial
            with no_host_sync():
                pool.free(run)
            frees += 1
        elif roll < 0.92:
            max_pages = max([r.numel() // ps for r in live] + [1])
            args = _read_table_inputs(pool, live, max_pages)
            with no_host_sync():
                pool.build_read_table(**args)
            if hasattr(pool.kernels, "build_kv_read_table_legacy"):
                with no_host_sync():
                    pool.build_read_table(legacy=True, **args)
            builds += 1
        else:
            pool.flush(urgent=rng.random() < 0.5)  # may sync: outside the detector
    with no_host_sync():
        pool.free(torch.empty(0, dtype=torch.int64))  # N == 0 is a no-op, and free of sync too
    assert frees >= 10 and builds >= 3


def test_eager_free_and_flush_may_sync_and_the_detector_does_not_change_them(kernels):
    cfg = PoolConfig(num_pages=24, page_size=2, lazy=False)
    plain = DeviceAllocator(cfg, kernels=kernels)
    watched = DeviceAllocator(cfg, kernels=kernels)
    for pool in (plain, watched):
        runs = [pool.alloc(2 * k) for k in (2, 3, 1)]
        if pool is plain:
            pool.free(runs[0])
        else:
            with record_host_syncs():
                pool.free(runs[0])
    assert plain.snapshot() == watched.snapshot()

    lazy_cfg = PoolConfig(num_pages=24, page_size=1, lazy=True)
    plain, watched = DeviceAllocator(lazy_cfg, kernels=kernels), DeviceAllocator(lazy_cfg, kernels=kernels)
    for pool in (plain, watched):
        runs = [pool.alloc(k) for k in (3, 4, 2)]
        pool.free(runs[0])
        if pool is plain:
            pool.flush(urgent=True)
        else:
            with record_host_syncs():
                pool.flush(urgent=True)
    assert plain.snapshot() == watched.snapshot()


def _syncing_kernel_set(base):
    """A kernel set whose free_unbind reads the freed pages back: the detector must see it."""
    ks = types.ModuleType("syncing_kernels")
    for name in dir(base):
        if not name.startswith("__"):
            setattr(ks, name, getattr(base, name))

    def free_unbind_inplace(v_pages, v2p, p2v):
        p = base.free_unbind_inplace(v_pages, v2p, p2v)
        if p.tolist():  # the kind of line SPEC.md §5 forbids
            pass
        return p

    ks.free_unbind_inplace = free_unbind_inplace
    return ks


def test_a_syncing_kernel_set_is_caught_through_device_allocator(kernels):
    pool = DeviceAllocator(PoolConfig(num_pages=16), kernels=_syncing_kernel_set(kernels))
    run = pool.alloc(3)
    with pytest.raises(HostSyncError) as info:
        with no_host_sync():
            pool.free(run)
    (event,) = info.value.events
    assert event.op == "Tensor.tolist" and event.function == "free_unbind_inplace"


def test_a_syncing_allocator_subclass_is_caught(kernels):
    class Tombstoning(DeviceAllocator):
        def _free_lazy(self, tokens):
            self.v2p[tokens] = -1  # the fixture bug, on the real allocator
            super()._free_lazy(tokens)

    pool = Tombstoning(PoolConfig(num_pages=16), kernels=kernels)
    run = pool.alloc(2)
    with pytest.raises(HostSyncError, match="index_put_"):
        with no_host_sync():
            pool.free(run)
