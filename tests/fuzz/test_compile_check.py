"""The compile track (``fuzz.engine.compile_check``, ``tracks/compile.py``): Triton kernels
compiled for sm_90 on this CPU at the specializations a campaign meets, and on a GPU a
kernel that does not compile at one input reported as a crash of that op.

The compiling tests need a Triton that can compile for sm_90 here (its bundled ptxas);
they skip, saying why, where it cannot. Compiling is cached by Triton on disk, so only the
first run on a machine pays for it (about 0.15 s a kernel on one core).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

import kvref
from fuzz.cli import build_parser
from fuzz.engine import launches, tracks
from fuzz.engine.case import load_case
from fuzz.engine.compile_check import client
from fuzz.engine.compile_check.learn import LaunchBook, candidates
from fuzz.engine.compile_check.ops import CompileOp
from fuzz.engine.dispatch import replay
from fuzz.engine.kinds import parse_ops
from fuzz.engine.oplang import OpError
from fuzz.engine.tiers import SetupError, make_tier
from fuzz.engine.verdict import Divergence, crash_field, is_compile_error

REPO = Path(__file__).resolve().parents[2]
FOREIGN = REPO / "tests/fixtures/kernels/foreign"
FIXTURE_REL = "tests/fixtures/kernels/foreign/compile_fails_at_1.py"
FAKE_GPU_SET = str(REPO / "tests/fuzz/fixtures/kernels/compile_error_at_one.py")
SIG = "vs:*i64,v2p:*i64,p2v:*i64,p_out:*i64,n:i32,v2p_len:i32,p2v_len:i32,SIZE:constexpr"

needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="Triton's interpreter is off (a GPU is present)")


def free_op(spec: str, **kw) -> CompileOp:
    return CompileOp(kernel="_k_free_wide", spec=spec, signature=SIG, constexprs="SIZE=128",
                     attrs="vs,v2p,p2v,p_out", file="compile_fails_at_1.py", **kw)


# ---- the op record --------------------------------------------------------------------------------


def test_c_compile_ops_read_back_and_say_what_they_compile():
    op = free_op("n,v2p_len,p2v_len==1")
    assert parse_ops([op.to_json()]) == [op] and tracks.of_ops([op]).name == "compile"
    sig, consts, attrs = op.concrete()
    assert [sig[n] for n in ("n", "v2p_len", "p2v_len", "SIZE")] == ["constexpr"] * 4
    assert consts == {"n": "1", "v2p_len": "1", "p2v_len": "1", "SIZE": "128"} and attrs == ["vs", "v2p", "p2v", "p_out"]
    one = op.single("n")
    assert one.spec == "n==1" and one.label == "_k_free_wide@n==1" and one.condition() == "when n == 1"
    assert one.concrete()[0]["v2p_len"] == "i32"
    sig, _, attrs = free_op("n,v2p_len%16").concrete()
    assert sig["n"] == "i32" and attrs == ["vs", "v2p", "p2v", "p_out", "n", "v2p_len"]
    assert free_op("n:i64").concrete()[0]["n"] == "i64" and free_op("base").concrete()[0] == dict(
        pair.split(":") for pair in SIG.split(","))
    assert "target" not in op.to_json()  # the default target is left out of the JSON


def test_a_failure_is_narrowed_to_the_base_then_to_one_name():
    assert [op.spec for op in client.CompileRun._narrower(free_op("n,v2p_len==1"))] == ["base", "n==1", "v2p_len==1"]
    assert [op.spec for op in client.CompileRun._narrower(free_op("n%16"))] == ["base"]
    assert list(client.CompileRun._narrower(free_op("base"))) == []


@pytest.mark.parametrize("bad", [
    {"spec": "SIZE==1"},  # a constexpr cannot be specialized again
    {"spec": "vs==1"},  # a pointer is never 1
    {"spec": "nope%16"},
    {"spec": "n=1"},
    {"constexprs": ""},  # SIZE is a constexpr without a value
    {"constexprs": "SIZE=128,n=1"},  # n is not a constexpr at base
    {"constexprs": "SIZE=(1"},
    {"attrs": "SIZE"},
    {"target": "sm90"},
    {"options": "num_warps=four"},
    {"signature": "vs*i64"},
])
def test_a_malformed_c_compile_op_is_refused_naming_the_field(bad):
    fields = {**dataclasses.asdict(free_op("base")), **bad}
    with pytest.raises(OpError, match="c_compile op"):
        CompileOp(**fields)


# ---- learning from launches ---------------------------------------------------------------------------


@triton.jit
def _learned(x, y, n, big, m: tl.int32, flag, scale, absent, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(x + i, i, mask=i < n)


@triton.jit(do_not_specialize=["n"])
def _unspecialized(x, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(x + i, i, mask=i < n)


@needs_interpreter
def test_the_launch_book_keeps_what_the_launcher_would_specialize():
    book = LaunchBook()
    x, y = torch.zeros(32, dtype=torch.int64), torch.zeros(4, dtype=torch.float32)
    stop = launches.observe(book)
    try:
        _learned[(1,)](x, y, 3, 5, 7, True, 0.5, None, BLOCK=16)
        _learned[(1,)](x[1:], y, 3, 2**33, 7, True, 0.5, None, BLOCK=16)  # an unaligned pointer, an int64
        _learned[(1,)](x, y, 3, 5, 7, True, 0.5, None, BLOCK=32)  # another shape
        _unspecialized[(1,)](x, 3, BLOCK=16)
    finally:
        stop()
    info = book.to_json("cuda:90:32")
    kernels = {k["kernel"]: k for k in info["kernels"]}
    assert set(kernels) == {"_learned", "_unspecialized"} and info["launches"] == 4 and not info["notes"]
    first, second = kernels["_learned"]["shapes"]
    params = {p["name"]: p for p in first["params"]}
    assert params["x"] == {"name": "x", "kind": "ptr", "type": "*i64", "div": True, "aligned": [False, True]}
    assert params["y"]["type"] == "*fp32" and params["big"]["types"] == ["i32", "i64"]
    assert params["m"]["one"] is False and params["m"]["div"] is True  # annotated: never a constexpr 1
    assert (params["flag"]["type"], params["scale"]["type"]) == ("u1", "fp32")
    assert params["absent"] == {"name": "absent", "kind": "const", "value": "None"}
    assert {p["name"]: p.get("value") for p in second["params"]}["BLOCK"] == "32"
    n = {p["name"]: p for p in kernels["_unspecialized"]["shapes"][0]["params"]}["n"]
    assert n["one"] is False and n["div"] is False

    ops = candidates(info, seed=0)
    specs = [(op.kernel, op.spec) for op in ops]
    assert specs[:4] == [("_learned", "n,big==1"), ("_learned", "x,n,big,m%16"), ("_learned", "base"),
                         ("_unspecialized", "base")]  # _unspecialized has nothing to set to 1 or mark
    assert ("_learned", "big:i64") in specs and len(set(ops)) == len(ops)
    assert all(op.target == "cuda:90:32" and op.file == Path(__file__).name for op in ops)
    assert candidates(info, 1)[:4] == ops[:4] and set(candidates(info, 1)) == set(ops)


# ---- on a GPU: a compile error at one input is a crash case, not a setup error ---------------------------


def test_compile_errors_are_named_compile_error():
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import PTXASError

    errors = [CompilationError("src", None, "AttributeError()"), PTXASError("ptxas fatal"),
              RuntimeError("PassManager::run failed")]
    assert all(is_compile_error(e) and crash_field(e) == "compile-error" for e in errors)
    assert not is_compile_error(RuntimeError("boom")) and crash_field(AttributeError()) == "AttributeError"


def test_the_smoke_test_lets_a_compile_error_through_and_the_op_reports_it():
    """A set whose free of one page does not compile (as on a GPU) is a tier, and the free of
    one page is its crash case: ``k_free_unbind/crash/compile-error``."""
    tier = make_tier("torch", FAKE_GPU_SET)  # its smoke test frees one page
    d, _ = replay(kvref.PoolConfig(num_pages=16), [{"op": "k_alloc_bind", "v": [3], "start": 5},
                                                  {"op": "k_free_unbind", "v": [3]}], tier)
    assert str(d.signature) == "k_free_unbind/crash/compile-error" and "has no attribute 'to'" in d.message


# ---- compiling for sm_90 on this CPU -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def fixture_tier():
    tier = make_tier("interpret", str(FOREIGN / "compile_fails_at_1.py"))
    try:
        tracks.get("compile").info(tier)
    except SetupError as exc:
        pytest.skip(f"cannot compile for sm_90 here: {exc}")
    return tier


@needs_interpreter
def test_the_fixture_does_not_compile_when_n_is_1_and_nowhere_else(fixture_tier):
    track = tracks.get("compile")
    info = track.worker_info(fixture_tier)
    seq = track.run_sequence(fixture_tier, 0, track.default_ops)
    d = seq.divergence
    assert str(d.signature) == "c_compile/compile/_k_free_wide@n==1", d
    assert d.op.spec == "n==1" and seq.ops[-1] is d.op and d.step == len(seq.ops) - 1  # narrowed from the screen
    assert "does not compile for cuda:90:32 when n == 1" in d.message and "has no attribute 'to'" in d.message
    assert [op.spec for op in track.regenerate(0, len(seq.ops), info, hostile="spec")[2]][-1] == \
        "n,v2p_len,p2v_len==1"  # a dead worker's ops come back from its hello: the screen it ran
    # the case replays, and only n == 1 fails
    again, _ = replay(kvref.PoolConfig(num_pages=8), [d.op], fixture_tier)
    assert again.signature == d.signature
    for spec in ("base", "n%16", "v2p_len==1", "n:i64"):
        assert replay(kvref.PoolConfig(num_pages=8), [free_op(spec)], fixture_tier)[0] is None, spec
    never = dataclasses.replace(free_op("n,v2p_len==1"), constexprs="SIZE=100")  # tl.arange of 100: never compiles
    d_never, _ = replay(kvref.PoolConfig(num_pages=8), [never], fixture_tier)
    assert str(d_never.signature) == "c_compile/compile/_k_free_wide@base", d_never  # not blamed on n == 1
    # the next sequence goes past the known failure and finds nothing else: every other
    # kernel (indep.py's) compiles at every class
    rest = track.run_sequence(fixture_tier, 1, track.default_ops)
    assert rest.divergence is None and len(rest.ops) == len(candidates(info["compile"], 1))
    assert track.exhausted(fixture_tier)
    idle = track.run_sequence(fixture_tier, 2, track.default_ops)  # nothing left: no ops, at once
    assert idle.ops == [] and idle.divergence is None


@needs_interpreter
@pytest.mark.parametrize("kernels", ["kvkernels", str(FOREIGN / "indep.py")], ids=["kvkernels", "indep"])
def test_our_kernels_and_indep_compile_at_every_specialization(kernels, fixture_tier):
    tier = make_tier("interpret", kernels)
    track = tracks.get("compile")
    info = track.info(tier)
    assert {k["kernel"] for k in info["kernels"]} >= ({"alloc_bind_kernel", "free_unbind_kernel", "read_table_kernel"}
                                                      if kernels == "kvkernels" else {"_k_free", "_k_read_table"})
    seq = track.run_sequence(tier, 0, track.default_ops)
    assert seq.divergence is None, seq.divergence
    assert len(seq.ops) == len(candidates(info, 0)) >= 3 * len(info["kernels"]) and track.exhausted(tier)


@needs_interpreter
def test_a_compiler_that_hangs_or_dies_is_a_verdict(fixture_tier, monkeypatch):
    child = client.CompileChild(client.kernels_ref(fixture_tier))
    try:
        probe = {"op": "probe", "kernels": child.kernels, "target": ["cuda", 90, 32], "find": []}
        with pytest.raises(client.Died) as died:
            child.request(probe, timeout=0.05)  # still importing torch
        assert died.value.timed_out and not child.alive()
        # A fresh child, killed while it answers: at once after the request reaches it (it is still
        # importing torch then), on a runner of any speed. A timer of 0.5 s did it before, and
        # killed nothing when a loaded runner had not started the child by then.
        start = client.CompileChild.start

        def start_and_kill_after_the_request(self):
            start(self)
            proc, stdin = self.proc, self.proc.stdin
            proc.stdin = type("KillAfterFlush", (), {"write": lambda _, data: stdin.write(data),
                                                     "flush": lambda _: (stdin.flush(), proc.kill()),
                                                     "close": lambda _: stdin.close()})()

        monkeypatch.setattr(client.CompileChild, "start", start_and_kill_after_the_request)
        with pytest.raises(client.Died) as died:
            child.request(probe)
        monkeypatch.setattr(client.CompileChild, "start", start)
        assert died.value.reason == "SIGKILL" and "killed by SIGKILL" in str(died.value)
        assert child.request(probe)["ok"]  # and the next request starts another
    finally:
        child.close()
    monkeypatch.setenv("KVFUZZ_COMPILE_TIMEOUT", "0")
    monkeypatch.setitem(client._CHILDREN, client.kernels_ref(fixture_tier), client.CompileChild("x"))
    with pytest.raises(Divergence) as d:
        client.CompileRun(None, fixture_tier).step(free_op("base", target="cuda:80:32"))
    assert str(d.value.signature) == "c_compile/timeout/_k_free_wide@base" and "did not finish" in d.value.message


def test_the_cli_knows_the_compile_track():
    assert build_parser().parse_args(["run", "--scale", "compile"]).scale == "compile"
    with pytest.raises(SetupError, match="--backend interpret"):
        tracks.get("compile").info(make_tier("torch", "kvkernels.torch_path"))


@pytest.mark.slow
@needs_interpreter
def test_a_cpu_run_reports_the_fixture_as_a_case_that_replays(tmp_path, fixture_tier):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "cases"
    run = subprocess.run([sys.executable, "-m", "fuzz", "run", "--scale", "compile", "--backend", "interpret",
                          "--kernels", FIXTURE_REL, "--max-sequences", "1", "--stop-on-first", "--reproduce", "2",
                          "--out", str(out)],
                         cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "FAIL c_compile/compile/_k_free_wide@n==1" in run.stdout
    (path,) = out.glob("*.json")
    case = load_case(path)
    assert str(case.signature) == "c_compile/compile/_k_free_wide@n==1" and len(case.ops) == 1
    assert case.ops[0].spec == "n==1" and case.extra.get("scale") == "compile"
    again = subprocess.run([sys.executable, "-m", "fuzz", "replay", str(path)], cwd=REPO, capture_output=True,
                           text=True, timeout=300, env=env)
    assert again.returncode == 1 and "same signature" in again.stdout, again.stdout + again.stderr


# ---- on a GPU -----------------------------------------------------------------------------------------------


@pytest.mark.cuda
def test_on_a_gpu_the_fixture_is_a_tier_and_its_one_page_free_a_crash_case():
    tier = make_tier("cuda", str(FOREIGN / "compile_fails_at_1.py"))  # once a setup error (exit 2)
    d, _ = replay(kvref.PoolConfig(num_pages=16), [{"op": "k_alloc_bind", "v": [3], "start": 5},
                                                  {"op": "k_free_unbind", "v": [3]}], tier)
    assert str(d.signature) == "k_free_unbind/crash/compile-error", d
    track = tracks.get("compile")
    seq = track.run_sequence(tier, 0, track.default_ops)
    assert str(seq.divergence.signature) == "c_compile/compile/_k_free_wide@n==1", seq.divergence
