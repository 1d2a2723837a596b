"""fuzz/engine/launches.py: launch counting, recording and replay, constexpr/grid observation,
and program-order fuzzing on the interpreter."""

from __future__ import annotations

import os

import pytest
import torch
import triton
import triton.language as tl

from fuzz.engine import launches, signatures, tiers

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEV = "cpu" if INTERPRET else "cuda"
needs_interpreter = pytest.mark.skipif(not INTERPRET, reason="Triton's interpreter is off (a GPU is present)")
if not INTERPRET and not torch.cuda.is_available():  # pragma: no cover
    pytest.skip("neither the interpreter nor a GPU", allow_module_level=True)


@triton.jit
def _copy_kernel(x_ptr, y_ptr, n, B: tl.constexpr, FLAG: tl.constexpr = False):
    offs = tl.program_id(0) * B + tl.arange(0, B)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


@triton.jit
def _claim_kernel(counter_ptr, out_ptr, W: tl.constexpr):
    """Order-dependent: each program takes the next slot and writes its linear id there."""
    pid = tl.program_id(0) * W + tl.program_id(1)
    slot = tl.atomic_add(counter_ptr, 1)
    tl.store(out_ptr + slot, pid)


@triton.jit
def _fail_kernel(out_ptr, BAD: tl.constexpr):
    pid = tl.program_id(0)
    tl.store(out_ptr + pid, pid)
    if pid == BAD:
        tl.static_assert(False, "program BAD failed")


def _copy(x, block=256):
    y = torch.zeros_like(x)
    _copy_kernel[(triton.cdiv(x.numel(), block),)](x, y, x.numel(), B=block)  # a literal block size
    return y


def _claims(grid=(12,)) -> list[int]:
    counter = torch.zeros(1, dtype=torch.int32, device=DEV)
    gx, gy = (*grid, 1)[:2]
    out = torch.full((gx * gy,), -1, dtype=torch.int32, device=DEV)
    _claim_kernel[grid](counter, out, W=gy)
    return out.tolist()


def test_count_counts_launches_and_not_warmups():
    x = torch.arange(600, dtype=torch.float32, device=DEV)
    before = launches.count()
    _copy(x)
    _copy(x, block=64)
    assert launches.count() == before + 2
    _copy_kernel.run(x, x.clone(), x.numel(), B=64, grid=(1,), warmup=True)
    assert launches.count() == before + 2


def test_install_is_idempotent():
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    launches.install()
    runs = {cls: vars(cls).get("run") for cls in (JITFunction, InterpretedFunction)}
    launches.install()
    assert runs == {cls: vars(cls).get("run") for cls in (JITFunction, InterpretedFunction)}
    before = launches.count()
    _copy(torch.ones(3, device=DEV))
    assert launches.count() == before + 1  # one wrapper, counted once


def test_install_survives_other_patchers_of_run():
    """During the switch-over tiers.count_launches and graph.LaunchRecorder still patch run."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    cls = InterpretedFunction if INTERPRET else JITFunction
    launches.install()
    ours = vars(cls)["run"]
    try:
        cls.run = lambda self, *a, _run=ours, **k: _run(self, *a, **k)  # someone wraps on top of ours
        launches.install()
        before = launches.count()
        _copy(torch.ones(3, device=DEV))
        assert launches.count() == before + 1  # not wrapped twice
        cls.run = ours._kvfuzz_original  # someone restores what they saw before ours
        launches.install()
        assert vars(cls)["run"] is not ours._kvfuzz_original
        before = launches.count()
        _copy(torch.ones(3, device=DEV))
        assert launches.count() == before + 1
    finally:
        cls.run = ours


@needs_interpreter
def test_recorder_inside_lets_a_dispatch_mode_tell_launch_internals_apart():
    """The hook graph.py's _AllocWatch needs: the interpreter's own torch ops run inside."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Watch(TorchDispatchMode):
        def __init__(self, rec):
            super().__init__()
            self.rec, self.outside, self.inside = rec, [], []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            (self.inside if self.rec.inside else self.outside).append(str(func))
            return func(*args, **(kwargs or {}))

    x = torch.arange(10, dtype=torch.float32)
    with launches.Recorder() as rec, Watch(rec) as watch:
        _copy(x)
    assert len(rec.launches) == 1 and watch.inside
    assert any("zeros_like" in op for op in watch.outside) and not any("set_" in op for op in watch.outside)


def test_recorder_records_outermost_launches_and_replays_them():
    x = torch.arange(300, dtype=torch.float32, device=DEV)
    y = torch.zeros_like(x)
    inner = []

    def grid(meta):  # a launch made while Triton resolves the grid is nested inside this one
        inner.append(_copy(x[:5]))
        return (triton.cdiv(meta["n"], meta["B"]),)

    with launches.Recorder() as rec:
        assert not rec.inside
        before = launches.count()
        _copy_kernel[grid](x, y, x.numel(), B=128)
        assert launches.count() == before + 2 and len(inner) == 1
    assert len(rec.launches) == 1
    (launch,) = rec.launches
    assert launch.name == "_copy_kernel" and launch.constexprs == {"B": 128} and launch.grid_dims == (3,)
    assert torch.equal(y, x)
    with rec:
        _copy_kernel.run(x, y, x.numel(), B=64, grid=(1,), warmup=True)  # a warm-up: not recorded
    _copy(x[:4])  # after the recorder: not recorded
    assert len(rec.launches) == 1
    x.add_(1)
    before = launches.count()
    launch.replay()
    assert torch.equal(y, x) and launches.count() == before + 2 and len(inner) == 2


def test_seen_collects_literal_block_sizes_and_grids():
    x = torch.arange(1000, dtype=torch.float32, device=DEV)
    with launches.Seen() as seen:
        _copy(x)
        _copy(x[:10], block=16)
        y = torch.zeros_like(x)
        _copy_kernel[lambda meta: (triton.cdiv(meta["n"], meta["B"]),)](x, y, x.numel(), B=512, FLAG=True)
    _copy(x, block=32)  # after: not seen
    assert seen.constexprs["_copy_kernel"] == {"B": {256, 16, 512}}  # the bool FLAG is not an int constexpr
    assert seen.grids["_copy_kernel"] == {(4,), (1,), (2,)}


def test_observe_sees_every_outermost_launch():
    got = []
    stop = launches.observe(got.append)
    try:
        _copy(torch.ones(5, device=DEV), block=8)
    finally:
        stop()
    stop()  # twice: harmless
    _copy(torch.ones(5, device=DEV))
    assert [(g.name, g.constexprs, g.grid_dims) for g in got] == [("_copy_kernel", {"B": 8}, (1,))]


@pytest.mark.parametrize("callable_grid", [False, True])
def test_a_budget_refuses_a_launch_before_it_runs(callable_grid):
    """``budget(check)``: the launch's programs (its grid, tuple or callable, as resolved) are
    asked before it runs; refused, it raises OverBudget (no ``except Exception`` takes it),
    writes nothing and reaches no observer or recorder; allowed, it runs as ever."""
    from fuzz.engine.budget import OverBudget
    from fuzz.engine.launches import budget

    x, asked, seen = torch.arange(1000, dtype=torch.float32, device=DEV), [], []
    y = torch.zeros_like(x)
    grid = (lambda meta: (triton.cdiv(meta["n"], meta["B"]),)) if callable_grid else (4,)
    stop = launches.observe(seen.append)
    try:
        with launches.Recorder() as rec, budget(lambda n: asked.append(n) or n > 3):
            with pytest.raises(OverBudget, match="_copy_kernel: 4 programs"):
                try:
                    _copy_kernel[grid](x, y, x.numel(), B=256)
                except Exception:  # pragma: no cover - what the harness's handlers would do
                    pytest.fail("OverBudget is an Exception")
            assert not y.any() and not seen and not rec.launches
            _copy_kernel[(triton.cdiv(10, 16),)](x, y, 10, B=16)  # 1 program: allowed
    finally:
        stop()
    _copy_kernel[grid](x, y, x.numel(), B=256)  # the budget left: runs
    assert asked == [4, 1] and [g.grid_dims for g in seen] == [(1,)] and len(rec.launches) == 1
    assert torch.equal(y, x)


def test_order_for_is_a_seeded_permutation():
    for mode in launches.MODES:
        for n in (0, 1, 2, 7, 64):
            for k in range(4):
                order = launches.order_for(mode, 3, k, n)
                assert sorted(order) == list(range(n)) and order == launches.order_for(mode, 3, k, n)
    assert launches.order_for("launch", 1, 0, 5) == [0, 1, 2, 3, 4]
    assert launches.order_for("reversed", 1, 0, 5) == [4, 3, 2, 1, 0]
    assert len({tuple(launches.order_for("shuffled", 1, k, 16)) for k in range(5)}) == 5  # per launch
    with pytest.raises(ValueError):
        launches.set_program_order("sideways", 0)


@needs_interpreter
def test_an_order_dependent_kernel_diverges_and_replays():
    n = 12
    assert _claims() == list(range(n))
    with launches.program_order("launch", 5):
        assert _claims() == list(range(n))
    with launches.program_order("reversed", 5):
        assert _claims() == list(range(n - 1, -1, -1))
        assert _claims((3, 4)) == list(range(11, -1, -1))  # program_id correct on both axes
    for mode in ("shuffled", "interleaved", "random"):
        with launches.program_order(mode, 5):
            first = [_claims(), _claims((3, 4))]
        with launches.program_order(mode, 5):  # a replay from the start draws the same orders
            assert [_claims(), _claims((3, 4))] == first
        assert all(sorted(r) == list(range(n)) for r in first)
        # the draw depends on the seed and the kernel, not on the launches before it
        assert first[0] == first[1] == launches.order_for(mode, 5, "_claim_kernel", n) != list(range(n))
    assert _claims() == list(range(n))  # restored on exit


@needs_interpreter
def test_set_program_order_for_a_worker():
    try:
        launches.set_program_order("shuffled", 9)
        a = _claims()
        launches.set_program_order("shuffled", 9)
        assert _claims() == a != list(range(12))
    finally:
        launches.set_program_order()
    assert _claims() == list(range(12))


@needs_interpreter
def test_program_order_keeps_recording_and_errors():
    with launches.program_order("shuffled", 1):
        with launches.Recorder() as rec:
            first = _claims()
        (launch,) = rec.launches
        counter, out = launch.args
        counter.zero_()  # the counter must restart, or the replay claims slots past the end
        out.fill_(-1)
        launch.replay()  # a later launch of the same kernel: the same draw (a minimized case replays it)
        assert out.tolist() == launches.order_for("shuffled", 1, "_claim_kernel", 12) == first
    assert launch.grid_dims == (12,) and first != list(range(12))
    from triton.runtime.errors import InterpreterError

    for mode, ran in (("launch", [0, 1, 2, 3, -1, -1]), ("reversed", [-1, -1, -1, 3, 4, 5])):
        out = torch.full((6,), -1, dtype=torch.int32)
        with launches.program_order(mode, 0), pytest.raises(InterpreterError, match="program BAD failed"):
            _fail_kernel[(6,)](out, BAD=3)
        assert out.tolist() == ran  # programs run one at a time: the failing one stops the launch


@needs_interpreter
@pytest.mark.parametrize("mode", launches.MODES)
def test_an_order_independent_kernel_is_the_same_in_every_mode(mode, monkeypatch):
    import kvkernels
    from kvkernels import launchers

    monkeypatch.setattr(launchers, "BLOCK_IDS", 4)
    g = torch.Generator().manual_seed(0)
    v2p = torch.full((64,), -1, dtype=torch.int64)
    p2v = torch.full((80,), -1, dtype=torch.int64)
    v = torch.randperm(64, generator=g)[:37]
    p = torch.randperm(79, generator=g)[:37] + 1
    v2p[v], p2v[p] = p, v
    unbound = next(i for i in range(64) if i not in set(v.tolist()))
    free = torch.cat([v[::2], torch.tensor([unbound])])  # distinct pages, one never bound (reads -1)

    def run():
        a, b = v2p.clone(), p2v.clone()
        out = kvkernels.free_unbind_inplace(free, a, b)
        return out, a, b

    expected = run()
    with launches.program_order(mode, 11), launches.Recorder() as rec:
        got = run()
    assert rec.launches[0].grid_dims == (triton.cdiv(free.numel(), 4),) and rec.launches[0].constexprs == {"BLOCK": 4}
    assert all(torch.equal(e, x) for e, x in zip(expected, got))


@pytest.mark.cuda
def test_program_order_is_a_noop_for_compiled_launches():
    """A GPU runs programs in its own order (the claim kernel really permutes there), so the
    order fuzzing must leave compiled launches alone: every program still runs once, and a
    launch goes nowhere near the interpreter's grid loop."""
    from triton.runtime import interpreter

    before = vars(interpreter.GridExecutor).get("__call__")
    with launches.program_order("reversed", 1):
        assert sorted(_claims()) == list(range(12))
        x = torch.arange(100, dtype=torch.int64, device=DEV)
        y = torch.full_like(x, -1)
        _copy_kernel[(4,)](x, y, 100, B=32)
        assert torch.equal(x, y)
    assert _claims() != [] and vars(interpreter.GridExecutor).get("__call__") is not None and before is not None


class _FakeJit:
    """A stand-in for a JITFunction: per-device kernel caches whose first item maps keys to kernels."""

    def __init__(self):
        self.device_caches = {0: ({}, {}, None, None, None)}

    def add_variant(self, key):
        self.device_caches[0][0][key] = object()


def test_a_launch_that_adds_a_kernel_variant_counts_as_one_compile_however_fast():
    from fuzz.engine import launches

    fn = _FakeJit()
    n0, s0 = launches.compiles(), launches.compile_seconds()
    before = launches._variants(fn)
    fn.add_variant("n==1")  # a fast load from a warm on-disk cache is still a new specialization
    launches._note_compile(fn, 0.004, before)
    assert launches.compiles() == n0 + 1
    assert launches.compile_seconds() == pytest.approx(s0 + 0.004)
    launches._note_compile(fn, 3.0, launches._variants(fn))  # held the host, compiled nothing (a full queue)
    assert launches.compiles() == n0 + 1
    assert launches.compile_seconds() == pytest.approx(s0 + 0.004)


def test_a_launch_whose_caches_cannot_be_read_is_judged_by_how_long_it_held_the_host():
    from fuzz.engine import compile_tally, launches

    class Opaque:  # another Triton's JITFunction: no device_caches
        pass

    fn = Opaque()
    n0 = launches.compiles()
    compile_tally._note_compile(fn, compile_tally.COMPILE_MIN_S / 10, compile_tally._variants(fn))
    assert launches.compiles() == n0
    compile_tally._note_compile(fn, compile_tally.COMPILE_MIN_S * 2, compile_tally._variants(fn))
    assert launches.compiles() == n0 + 1


@triton.jit(do_not_specialize=["n_plain"])
def _k_classes(dst, src, n, n_plain, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n + n_plain
    tl.store(dst + offs, tl.load(src + offs, mask=mask, other=0), mask=mask)


@needs_interpreter
def test_the_specialization_key_is_what_a_gpu_compiles_a_variant_per():
    """Ints by 1 / multiple of 16 / other (not for do_not_specialize ones), pointers by dtype and
    16-byte alignment, constexprs by value: two launches get one key exactly when Triton on a
    GPU would run them with one compiled variant."""
    keys = []
    stop = launches.observe(lambda launch: keys.append(signatures.specialization(launch)))
    try:
        buf = torch.zeros(64, dtype=torch.int64)
        for dst, n, n_plain, block in ((buf[:16], 16, 0, 16), (buf[16:32], 32, 5, 16), (buf[1:17], 16, 0, 16),
                                       (buf[:16], 1, 0, 16), (buf[:16], 7, 0, 16), (buf[:16], 16, 0, 32)):
            _k_classes[(1,)](dst, buf, n, n_plain, BLOCK=block)
    finally:
        stop()
    same_class, unaligned, one, other, wider = keys[1:]
    assert keys[0] == same_class  # 16 and 32 are both multiples of 16; n_plain is not specialized
    assert len({keys[0], unaligned, one, other, wider}) == 5
    args = dict(keys[0][1])
    assert args["n_plain"] == "i32" and args["n"] == ("i32", "D") and args["BLOCK"] == 16
    assert args["dst"] == ("torch.int64", True) and dict(unaligned[1])["dst"] == ("torch.int64", False)


# ---- the interpreter patches triton.language once per launch (patch_language_once) -----------------


@triton.jit
def _twice(x):
    return x * 2


@triton.jit
def _nested_kernel(x_ptr, y_ptr, n, B: tl.constexpr, CALLS: tl.constexpr):
    offs = tl.program_id(0) * B + tl.arange(0, B)
    v = tl.load(x_ptr + offs, mask=offs < n, other=0)
    for _ in tl.static_range(CALLS):  # CALLS nested device-function calls per program
        v = _twice(v) - v  # stays v: x * 2 - x
    tl.store(y_ptr + offs, tl.sum(v, axis=0) + v * 0 + v, mask=offs < n)


@needs_interpreter
def test_the_interpreter_patches_the_language_once_per_launch_not_per_nested_call(monkeypatch):
    from triton.runtime import interpreter

    assert tiers.patch_language_once(), "this Triton's interpreter internals changed: the speed-up is off"
    scans = []
    real = interpreter._patch_builtin
    monkeypatch.setattr(interpreter, "_patch_builtin", lambda *a: (scans.append(a[0]), real(*a))[1])
    x = torch.arange(40, dtype=torch.int64)
    got = {}
    for calls in (1, 6):
        scans.clear()
        y = torch.zeros_like(x)
        _nested_kernel[(5,)](x, y, x.numel(), B=8, CALLS=calls)
        got[calls] = (len(scans), y.tolist())
    # Unpatched, each of the 5 x 6 nested calls scans four namespaces again (120 and more); patched,
    # the launch's scans and those of tl.sum (triton.language.standard sees tl.core, which the
    # launch's own scope does not patch) are all there is, however many calls.
    assert 0 < got[6][0] <= got[1][0] and got[6][0] < 5 * 6, f"language scans: {got[1][0]} and {got[6][0]}"
    want = [sum(range(8 * p, 8 * p + 8)) + i for p in range(5) for i in range(8 * p, 8 * p + 8)]
    assert got[1][1] == got[6][1] == want  # and the kernel computes what it says
    # After the launch its scope is restored: the language is Triton's own again.
    assert tl.core.is_builtin(tl.load) and tl.core.is_builtin(tl.tensor.__add__)


def test_bound_maps_a_launchs_arguments_as_signature_bind_does():
    """``_bound`` (the hook's binding, without ``Signature.bind``): positional and keyword
    arguments, a default applied, launch options left out; None where bind refuses."""
    import inspect

    pyfn = _copy_kernel.fn
    sig = inspect.signature(pyfn)
    calls = [((1, 2, 3), {"B": 4}), ((1, 2), {"n": 3, "B": 4, "num_warps": 2}), ((1, 2, 3, 4, True), {}),
             ((1, 2, 3), {}), ((1, 2, 3, 4), {"n": 5}), ((1, 2, 3, 4, True, 6), {})]
    for args, kwargs in calls:
        try:
            ref = sig.bind(*args, **{k: v for k, v in kwargs.items() if k in sig.parameters})
            ref.apply_defaults()
            want = dict(ref.arguments)
        except TypeError:
            want = None
        assert signatures._bound(pyfn, args, kwargs) == want, (args, kwargs)
    assert signatures._bound(pyfn, (1, 2, 3), {"B": 4}) == {"x_ptr": 1, "y_ptr": 2, "n": 3, "B": 4, "FLAG": False}
