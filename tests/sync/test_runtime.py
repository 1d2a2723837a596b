"""The CPU runtime detector (fuzz.sync.runtime): what it flags, what it must not, its contract."""

from __future__ import annotations

import inspect

import pytest
import torch

from fuzz.sync import corpus
from fuzz.sync.runtime import HostSyncDetector, HostSyncError, no_host_sync, record_host_syncs

# Documented limits (fuzz/sync/runtime.py docstring); the calibration table counts them.
KNOWN_CPU_MISSES = {"to_cpu_string"}


def _line_of(marker: str) -> int:
    src, start = inspect.getsourcelines(inspect.getmodule(_line_of))
    for i, line in enumerate(src, 1):
        if marker in line and "_line_of(" not in line:
            return i
    raise AssertionError(marker)


@pytest.fixture
def tables():
    return corpus.make_args("cpu")


def test_raises_naming_the_op_and_the_python_line(tables):
    v2p, idx = tables["v2p"], tables["idx"]
    with pytest.raises(HostSyncError) as info:
        with no_host_sync():
            v2p[idx] = -1  # MARK-store
    (event,) = info.value.events
    assert event.op.startswith("aten.index_put_")
    assert "Python scalar" in event.reason
    assert event.filename == __file__ and event.lineno == _line_of("# MARK-store")
    assert "v2p[idx] = -1" in event.line
    assert f"{__file__}:{event.lineno}" in str(info.value)


def test_record_mode_collects_every_event_without_raising(tables):
    v2p, idx = tables["v2p"], tables["idx"]
    with record_host_syncs() as events:
        idx.tolist()
        int(v2p[3])
        torch.unique(idx)
    assert [e.op for e in events] == ["Tensor.tolist", "aten._local_scalar_dense (from __int__)",
                                      "aten._unique2 (from unique)"]


def test_integer_tensor_indexing_and_index_fill_are_not_flagged(tables):
    v2p, p2v, idx, vals = tables["v2p"], tables["p2v"], tables["idx"], tables["vals"]
    with no_host_sync():
        phys = v2p[idx]  # gather with a LongTensor
        v2p.index_fill_(0, idx, -1)
        p2v.index_fill_(0, phys, -1)
        v2p[idx] = vals  # device-valued scatter
        v2p[2:5] = -1  # slice store: fill_ on a view
        n = idx.numel() + len(idx) + idx.shape[0]
        torch.cat((idx, vals))
    assert n == 9


def test_zero_dim_integer_index_is_flagged_because_aten_calls_item(tables):
    v2p, idx = tables["v2p"], tables["idx"]
    with record_host_syncs() as events:
        v2p[idx[0]]
    assert [e.op for e in events] == ["aten._local_scalar_dense (from __getitem__)"]


def test_boolean_mask_store_of_a_scalar_takes_the_masked_fill_path(tables):
    v2p, mask = tables["v2p"], tables["mask"]
    with no_host_sync():
        v2p[mask] = -1
    with record_host_syncs() as events:
        v2p[mask] = v2p[0]  # a device value: index_put_ lowers the mask to nonzero()
        v2p[mask]
    assert [e.op for e in events] == ["aten.index_put_ (from __setitem__) with a boolean mask",
                                      "aten.index (from __getitem__) with a boolean mask"]


def test_host_tensors_are_told_apart_from_device_tensors(tables):
    v2p = tables["v2p"]
    with no_host_sync():
        budget = torch.tensor(5)  # created on the host, never meets the device
        assert budget.item() == 5  # host memory: no wait
        offsets = torch.arange(3)
        assert offsets.tolist() == [0, 1, 2]
    with record_host_syncs() as events:
        v2p[torch.arange(3)]  # a host index must be copied to the device
    assert len(events) == 1
    assert events[0].op.startswith("aten.index") and "host tensor" in events[0].reason


def test_synchronize_is_caught_and_the_patch_is_undone():
    original = torch.cpu.synchronize
    with record_host_syncs() as events:
        torch.get_device_module(torch.device("cpu")).synchronize()
    assert [e.op for e in events] == ["torch.cpu.synchronize()"]
    assert torch.cpu.synchronize is original


def test_a_swallowed_error_still_fails_on_exit(tables):
    idx = tables["idx"]
    with pytest.raises(HostSyncError) as info:
        with no_host_sync():
            try:
                idx.tolist()
            except HostSyncError:
                pass  # a careless caller
    assert info.value.events[0].op == "Tensor.tolist"


def test_modes_are_removed_after_the_block(tables):
    idx = tables["idx"]
    with record_host_syncs():
        pass
    with record_host_syncs() as outer_events:
        pass
    idx.tolist()  # outside any block: nothing records it
    assert outer_events == []


def test_interpreted_kernel_launch_is_not_a_false_alarm_but_a_sync_after_it_is_caught(tables):
    if not corpus.CPU_KERNELS:
        pytest.skip("Triton's interpreter is off (a GPU is present): kernels cannot run on CPU tensors")
    import triton.runtime.interpreter  # noqa: F401  (the interpreter tier: TRITON_INTERPRET=1 from conftest)

    fn = corpus.BY_NAME["kernel_launch"].function()
    v2p, idx = tables["v2p"], tables["idx"]
    with no_host_sync():
        fn(v2p=v2p, idx=idx)  # the interpreter round-trips through numpy: not ours
    assert v2p[idx].tolist() == [-1, -1, -1]  # the kernel really ran
    with record_host_syncs() as events:
        fn(v2p=v2p, idx=idx)
        idx.tolist()
    assert [e.op for e in events] == ["Tensor.tolist"]


def test_code_running_inside_the_triton_interpreter_is_exempt(tables):
    """The interpreter moves tensors through host memory for us; a compiled launch would not."""
    from fuzz.sync import runtime

    if not runtime._INTERPRETER_FILES:
        pytest.skip("Triton's interpreter is not importable")
    # a function whose code object claims to live in triton/runtime/interpreter.py
    namespace = {}
    exec(compile("def round_trip(t):\n    return t.tolist()\n", runtime._INTERPRETER_FILES[0], "exec"), namespace)
    idx = tables["idx"]
    with no_host_sync():
        assert namespace["round_trip"](idx) == [3, 5, 7]
    with record_host_syncs() as events:
        idx.tolist()  # the same call from our own code is flagged
    assert len(events) == 1


@pytest.mark.parametrize("snippet", corpus.SNIPPETS, ids=[s.name for s in corpus.SNIPPETS])
def test_runtime_verdict_matches_the_label_on_the_corpus(snippet):
    if snippet.needs_kernels and not corpus.CPU_KERNELS:
        pytest.skip("a Triton launch on CPU tensors needs the interpreter (off where CUDA exists)")
    args = corpus.make_args("cpu")
    with record_host_syncs() as events:
        snippet.run("cpu", args)
    expected = snippet.label == corpus.SYNCS
    if snippet.name in KNOWN_CPU_MISSES:
        assert not events, "a documented miss is now caught: update KNOWN_CPU_MISSES and the runtime docstring"
        return
    assert bool(events) is expected, [e.describe() for e in events]


def test_cuda_device_model_treats_cpu_tensors_as_host():
    det = HostSyncDetector(device="cuda")
    t = torch.zeros(3)
    assert det.is_host(t) and not det.is_device(t)
    det_cpu = HostSyncDetector(device="cpu")
    assert det_cpu.is_device(t)  # emulation: untracked CPU tensors stand for device tensors
