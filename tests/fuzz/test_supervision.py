"""Crash-proof campaigns: kernel sets that segfault, hang or raise yield cases, and the
campaign lives on to the end of its work (``--max-sequences``: every sequence it was given,
the faulty one's worker replaced; seed 0 faults in its first sequence); SIGTERM keeps every case; CI sees progress as it
happens; a tier that never launched Triton is refused; kvfuzz's own errors are exit 3.

The foreign fixtures (tests/fixtures/kernels/foreign/, see its README) were written
outside the harness's assumptions: other block sizes, no knobs, kernels that crash."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import kvref
from fuzz.engine import supervise
from fuzz.engine.campaign import CampaignOptions, visible_gpus
from fuzz.engine.case import load_case
from fuzz.engine.generate import regenerate
from fuzz.engine.tiers import make_tier
from fuzz.engine.tracks import get as get_track
from tests.fuzz.test_engine import REPO, cli_env, kvfuzz, show

FOREIGN = REPO / "tests/fixtures/kernels/foreign"
FAKES = REPO / "tests/fuzz/fixtures/kernels"
needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="Triton's interpreter is off (a GPU is present)")

FAULTY = {  # fixture -> the oracle and field of the fault it must yield
    "segfault": ("crash", "SIGSEGV"),
    "hang": ("timeout", "no-progress"),
    "raises": ("crash", "RuntimeError"),
}
# All workers together: the fault in sequence 0, and one more sequence for its worker, which a
# fresh one runs (worker w of W runs w, w + W, ...): W + 1.
def sequences(workers: int) -> int:
    return workers + 1


def _campaign(tmp_path: Path, kernels: Path, workers: int, *extra, op_timeout: float = 3) -> tuple:
    out, summary = tmp_path / "cases", tmp_path / "summary.json"
    r = kvfuzz("run", "--backend", "interpret", "--kernels", kernels, "--max-sequences", sequences(workers),
               "--workers", workers, "--op-timeout", op_timeout, "--no-minimize", "--reproduce", 1, "--out", out,
               "--summary", summary, *extra, timeout=400)
    # No minimizing: with no budget to stop it, each crashing candidate is a fresh child. One
    # reproduction, not five: a hang's each spins its 3 s op-timeout, and rating is test_verdicts'.
    return r, json.loads(summary.read_text()) if summary.exists() else None


@pytest.mark.slow
@needs_interpreter
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("name", sorted(FAULTY))
def test_a_faulty_kernel_set_yields_a_case_and_the_campaign_lives_on(name, workers, tmp_path):
    r, summary = _campaign(tmp_path, FOREIGN / f"{name}.py", workers)
    assert r.returncode == 1, show(r)
    oracle, field = FAULTY[name]
    found = [f for f in summary["failures"] if f["signature"].split("/")[1:] == [oracle, field]]
    assert found, show(r)
    assert all(f["found_after_s"] < summary["elapsed_s"] for f in found), found  # written as found, not at the end
    assert summary["stopped_by"] == "max-sequences" and summary["sequences"] == sequences(workers), summary  # faults did
    assert summary["restarts"] >= 1 or name == "raises", summary  # not end it: a fresh worker ran the rest
    # (raises.py's exception is a finding in a worker that lives on: nothing to replace)
    assert "Traceback" not in r.stderr, show(r)
    case = load_case(found[0]["case"])
    assert case.signature.oracle == oracle and case.ops and (case.fault or oracle == "crash")
    if oracle == "timeout":  # where it hung: asked of the child before it was killed, the kernel's own frame named
        assert any("hang.py:" in frame and frame.endswith(" in _k_read_table_peeled") for frame in case.fault["stack"]), \
            case.fault
        message = case.fault["message"]
        assert "killed in " in message and ("(hang.py:" in message or "(indep.py:" in message), case.fault
    rp = kvfuzz("replay", found[0]["case"], "--op-timeout", 3, timeout=120)
    assert rp.returncode == 1, show(rp)
    assert field in rp.stdout and "same signature" in rp.stdout, show(rp)
    assert ("where the replay hung" in rp.stdout and "_k_read_table_peeled" in rp.stdout) == (oracle == "timeout"), \
        show(rp)


@pytest.mark.slow
@needs_interpreter
@pytest.mark.parametrize("workers", [1, 2])
def test_the_spec_correct_foreign_set_is_clean(workers, tmp_path):
    """indep.py masks every id but leaves output lanes of masked ids unwritten (SPEC
    leaves that open): clean, hostile probes included."""
    # nothing hangs here: a spurious timeout would fail it, and the faulty sets' 3 s is ~10x the
    # longest op (0.32 s of the child's own clock, at 6528fbe), so it gets the replay's default
    r, summary = _campaign(tmp_path, FOREIGN / "indep.py", workers, op_timeout=60)
    assert r.returncode == 0 and summary["stopped_by"] == "max-sequences", show(r)
    assert summary["failures"] == [] and summary["ops"] > 0 and summary["triton_launches"] > 0, summary
    assert sum(summary["hostile_classes"].values()) > 0, summary


DUMP = """{mark}
Thread 0x00007f0000000002 (most recent call first):
  File "{lib}/multiprocessing/queues.py", line 231 in _feed
  File "{lib}/threading.py", line 982 in run

Current thread 0x00007f0000000001 (most recent call first):
  File "{lib}/site-packages/torch/cuda/__init__.py", line 985 in synchronize
  File "{fuzz}/engine/runner.py", line 289 in _step_on
  File "/team/kernels.py", line 12 in free
  File "{fuzz}/engine/supervise.py", line 250 in _child_entry
  File "{fuzz}/engine/zygote/__init__.py", line 179 in _enter
"""


def test_a_hang_is_placed_by_its_main_threads_stack():
    """From faulthandler's dump of every thread, the main thread's frames up to where kvfuzz began
    it; the message names the innermost frame of the code under test (else kvfuzz's own), then
    the innermost."""
    from fuzz.engine import stacks

    lib, fuzz = stacks._LIBRARIES[0], str(Path(stacks.__file__).parents[1])
    frames = stacks.main_frames(DUMP.format(mark=stacks.MARK, lib=lib, fuzz=fuzz))
    assert frames == [f"{lib}/site-packages/torch/cuda/__init__.py:985 in synchronize",
                      f"{fuzz}/engine/runner.py:289 in _step_on", "/team/kernels.py:12 in free",
                      f"{fuzz}/engine/supervise.py:250 in _child_entry"]
    assert stacks.where(frames) == "free (kernels.py:12); innermost synchronize (__init__.py:985)"
    assert stacks.where(frames[1:]) == "free (kernels.py:12); innermost _step_on (runner.py:289)"
    assert stacks.where(frames[2:]) == "free (kernels.py:12)"
    no_team = [frames[0], frames[1], frames[3]]  # kvfuzz's own frame where the code under test has none
    assert stacks.where(no_team) == "_step_on (runner.py:289); innermost synchronize (__init__.py:985)"
    # an interpreted kernel sampled inside a hook of kvfuzz's (the patch tiers.py puts on Triton's
    # interpreter): the kernel's line, not the hook's ("killed in <genexpr> (tiers.py:256)" says nothing of the hang)
    hooked = [f"{lib}/inspect.py:290 in ismodule", f"{fuzz}/engine/tiers.py:256 in <genexpr>",
              f"{lib}/site-packages/triton/runtime/interpreter.py:1 in __call__",
              "/team/hang.py:40 in _k_read_table_peeled", f"{fuzz}/engine/supervise.py:250 in _child_entry"]
    assert stacks.where(hooked) == "_k_read_table_peeled (hang.py:40); innermost ismodule (inspect.py:290)"
    assert stacks.brief(frames, 3) == frames[:3] + ["(1 more frames: the case's fault.stack)"]
    assert stacks.brief([frames[0], f"{lib}/threading.py:1 in run", frames[2]]) == [
        frames[0], frames[2], "(1 more frames: the case's fault.stack)"]  # a library's frame left out
    assert stacks.brief(frames[1:]) == frames[1:]
    no_main = DUMP.split("  File \"{fuzz}/engine/supervise.py")[0]  # the dump cut short: the thread that took it
    assert stacks.main_frames(no_main.format(mark=stacks.MARK, lib=lib, fuzz=fuzz))[0].endswith(" in synchronize")
    assert stacks.main_frames("") == [] and stacks.where([]) == ""


@needs_interpreter
def test_a_kernel_set_that_never_launches_triton_is_refused_on_the_interpreter(tmp_path):
    # --max-sequences, not a 5 s budget: the refusal comes from the worker's smoke test, and a worker
    # still setting up past the budget and its grace is let go (the run then "ran no ops").
    r = kvfuzz("run", "--backend", "interpret", "--kernels", FOREIGN / "cpu_fallback.py", "--max-sequences", 1,
               "--out", tmp_path / "cases")
    assert r.returncode == 2, show(r)
    assert "launched no Triton kernel" in r.stderr and "Traceback" not in r.stderr, show(r)
    assert not (tmp_path / "cases").exists()


def test_sigterm_ends_the_run_cleanly_with_every_case_on_disk(tmp_path):
    out = tmp_path / "cases"
    proc = subprocess.Popen([sys.executable, "-m", "fuzz", "run", "--kernels", str(FAKES / "past_prefix.py"),
                             "--budget-s", "300", "--out", str(out), "--progress-s", "1"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env())
    start = time.monotonic()
    try:
        while not (out.exists() and any(p.suffix == ".json" for p in out.iterdir())):
            assert proc.poll() is None and time.monotonic() - start < 120, "no case written in time"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert time.monotonic() - start < 200
    assert proc.returncode == 1, stdout + stderr
    assert "interrupted=SIGTERM" in stdout and "Traceback" not in stderr, stdout + stderr
    cases = [load_case(p) for p in out.glob("*.json")]
    assert cases and all(c.ops for c in cases)
    assert not list(out.glob(".*.tmp"))  # every write was atomic


def test_progress_and_fail_lines_reach_a_ci_log_before_the_end(tmp_path):
    """stderr is a pipe here, as in CI: plain progress lines every --progress-s, and the
    FAIL line on stdout when the failure is found, not at the end: both are read while the
    campaign still runs, and it is then stopped (SIGTERM), so its output shows it was cut short.
    Lines held until exit would come only after all 5,000 sequences, from a campaign not
    interrupted; no timing margin is assumed (an idle core ran 200 of them in about 2 s)."""
    proc = subprocess.Popen([sys.executable, "-m", "fuzz", "run", "--kernels", str(FAKES / "past_prefix.py"),
                             "--max-sequences", "5000", "--out", str(tmp_path / "cases"), "--progress-s", "1"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env())
    seen, lines, both = set(), {"stdout": [], "stderr": []}, threading.Event()

    def read(stream, key, needle):
        for line in stream:
            lines[key].append(line)
            if needle in line:
                seen.add(key)
                if len(seen) == 2:
                    both.set()

    threads = [threading.Thread(target=read, args=(proc.stdout, "stdout", "FAIL ")),
               threading.Thread(target=read, args=(proc.stderr, "stderr", "[kvfuzz]"))]
    for t in threads:
        t.start()
    try:
        assert both.wait(timeout=150), seen
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    for t in threads:
        t.join()
    out = "".join(lines["stdout"])
    assert proc.returncode == 1, out
    assert "interrupted=SIGTERM" in out, out  # stopped by us: both lines came while it ran


def test_ops_of_a_dead_worker_are_rebuilt_from_its_seed():
    """The supervisor's reconstruction equals what the worker ran, skipped ops included."""
    full = make_tier("torch")
    for seed in range(12):
        seq = get_track("small").run_sequence(full, seed, 150)
        ran, d = seq.ops, seq.divergence
        assert d is None
        config, _, rebuilt = regenerate(seed, len(ran), has=[fn for fn in ("build_kv_read_table_packed",
                                                                           "build_kv_read_table_legacy",
                                                                           "translate_tokens")])
        assert rebuilt == ran, seed
    # A kernel set without the optional functions: its skipped ops still advance the stream alike.
    ran = get_track("small").run_sequence(make_tier("torch", str(FAKES / "past_prefix.py")), 3, 150).ops
    assert regenerate(3, len(ran), has=["translate_tokens"])[2][: len(ran)] == ran


def test_a_child_sees_only_its_gpu(tmp_path):
    marker = tmp_path / "env.txt"
    child = supervise.Child("tests.fuzz.test_supervision:_write_env", (str(marker),), log_dir=tmp_path, gpu="3")
    child.proc.join(timeout=60)
    assert marker.read_text() == "3"
    child.close()


def _write_env(beat, path):  # runs in the child
    Path(path).write_text(os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))


def test_workers_take_the_visible_gpus_round_robin(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert visible_gpus() == ["2", "5"]
    from fuzz.engine.campaign import Campaign

    c = Campaign(CampaignOptions(backend="cuda", workers=4))
    c.gpus = visible_gpus()
    assert [c._gpu(w) for w in range(4)] == ["2", "5", "2", "5"]


def test_a_harness_exception_in_a_worker_is_exit_3(monkeypatch):
    """An exception of the engine itself (not of the code under test) ends the worker with
    exit 3 and its traceback, never as a finding."""
    from fuzz.engine import worker
    from fuzz.engine.chain_gen import ChainGenerator
    from fuzz.engine.generate import OpGenerator

    def broken(self, spec):
        raise KeyError("a bug in the generator")

    monkeypatch.setattr(OpGenerator, "next_op", broken)
    monkeypatch.setattr(ChainGenerator, "next_op", broken)
    sent = []

    class Queue:
        def put(self, msg):
            sent.append(msg)

    beat = supervise.Beat([0] * supervise.SLOTS)
    beat.slots[supervise.HEARD] = 1  # as the parent says once it has the hello
    with pytest.raises(SystemExit) as info:
        worker.fuzz_main(beat, CampaignOptions(), 0, 0, time.time() + 60, Queue())
    assert info.value.code == 3
    harness = [m for m in sent if m[0] == "harness"]
    assert harness and "a bug in the generator" in harness[0][2]
    assert not [m for m in sent if m[0] == "finding"]


def test_the_cli_reports_its_own_bug_as_exit_3(monkeypatch, capsys):
    from fuzz import cli

    monkeypatch.setitem(cli.COMMANDS, "bench", lambda args: {}["boom"])
    assert cli.main(["bench"]) == 3
    assert "internal harness error" in capsys.readouterr().err


def test_a_case_replayed_on_a_kernel_set_without_its_knobs_drops_them_with_a_warning(tmp_path):
    case = {"schema": "kvfuzz-case/1", "config": {"num_pages": 8}, "ops": [{"op": "alloc", "n": 2}],
            "signature": {"op": "alloc", "oracle": "state", "field": "v2p"}, "tier": "torch",
            "kernels": "kvkernels", "knobs": {"BLOCK_COLS": 4}}
    path = tmp_path / "case.json"
    path.write_text(json.dumps(case))
    r = kvfuzz("replay", path, "--kernels", "kvkernels.torch_path")
    assert r.returncode == 0, show(r)
    assert "no launch knob BLOCK_COLS; dropped" in r.stderr, show(r)


def test_executor_answers_a_crash_and_then_works_again(tmp_path):
    """A candidate that kills the executor is an answer, and the next one gets a fresh child."""
    from fuzz.engine.kinds import parse_ops
    from fuzz.engine.tiers import TierSpec

    ex = supervise.Executor(TierSpec("torch", str(FAKES / "past_prefix.py")), op_timeout=30, log_dir=tmp_path)
    config = kvref.PoolConfig(num_pages=8, page_size=2, multiplier=3)
    ops = parse_ops([{"op": "alloc", "n": 6}, {"op": "read_table", "rows": [[2, 3, 4, 5, 6, 7]], "req_idx": [0],
                                                "seq_lens": [3], "max_pages": 3, "width": 6, "legacy": False}])
    try:
        first = ex.run(config, ops)
        assert first is not None and str(first.signature) == "read_table/result/out"
        ex.child.proc.kill()  # as if the last candidate had segfaulted it
        ex.child.proc.join()
        again = ex.run(config, ops[:1])
        assert again is None
    finally:
        ex.close()


def test_a_prestarted_executor_child_is_fresh_for_its_first_job_and_only_for_it(tmp_path):
    """A campaign on CUDA starts its first confirmation's executor early: the child that waited
    idle runs the first "fresh process" try itself; a child that has run a job is replaced."""
    from fuzz.engine.kinds import parse_ops
    from fuzz.engine.tiers import TierSpec

    ex = supervise.Executor(TierSpec("torch", str(FAKES / "past_prefix.py")), op_timeout=30, log_dir=tmp_path)
    config = kvref.PoolConfig(num_pages=8, page_size=2, multiplier=3)
    ops = parse_ops([{"op": "alloc", "n": 2}])
    try:
        ex.prestart()
        waiting = ex.child.proc.pid
        assert ex.run(config, ops, fresh=True) is None
        assert ex.child.proc.pid == waiting  # it had run nothing: fresh
        assert ex.run(config, ops) is None and ex.child.proc.pid == waiting
        assert ex.run(config, ops, fresh=True) is None
        assert ex.child.proc.pid != waiting  # it had run jobs: a new child
    finally:
        ex.close()


def test_a_standby_child_runs_the_next_fresh_job_and_another_is_started_behind_it(tmp_path):
    """A minimized case's rate, and each replay after a fault, starts in a fresh process: the
    one started ahead (``Executor.standby``) takes the job, and one more is started for the next."""
    from fuzz.engine.kinds import parse_ops
    from fuzz.engine.tiers import TierSpec

    ex = supervise.Executor(TierSpec("torch", str(FAKES / "past_prefix.py")), op_timeout=30, log_dir=tmp_path)
    config = kvref.PoolConfig(num_pages=8, page_size=2, multiplier=3)
    ops = parse_ops([{"op": "alloc", "n": 2}])
    try:
        assert ex.run(config, ops) is None
        first = ex.child.proc.pid
        ex.standby()
        ahead = ex._standby[0][0].proc.pid
        assert ex.run(config, ops) is None and ex.child.proc.pid == first  # not fresh: the same child
        assert ex.run(config, ops, fresh=True) is None and ex.child.proc.pid == ahead
        behind = ex._standby[0][0]
        assert behind.proc.pid not in (first, ahead) and behind.alive()
        ex.child.proc.kill()  # as if a replay had segfaulted it: the next job gets the one behind
        ex.child.proc.join()
        assert ex.run(config, ops) is None and ex.child.proc.pid == behind.proc.pid
    finally:
        ex.close()
    assert ex._standby == [] and not behind.alive()


def test_standby_for_a_number_of_fresh_jobs_starts_no_child_they_do_not_take(tmp_path):
    """``standby(fresh=n)``: children started ahead for the next n fresh jobs, none behind the
    last (a minimized case's rate needs one); ``depth``: set up side by side (a crash case's
    replays). A child a fresh job replaced is not waited for then, and is gone after close."""
    from fuzz.engine.kinds import parse_ops
    from fuzz.engine.tiers import TierSpec

    ex = supervise.Executor(TierSpec("torch", str(FAKES / "past_prefix.py")), op_timeout=30, log_dir=tmp_path)
    config = kvref.PoolConfig(num_pages=8, page_size=2, multiplier=3)
    ops = parse_ops([{"op": "alloc", "n": 2}])
    try:
        assert ex.run(config, ops) is None
        first = ex.child
        ex.standby(fresh=1)
        [(ahead, _)] = ex._standby
        assert ex.run(config, ops, fresh=True) is None and ex.child is ahead
        assert ex._standby == [] and ex.children == 2  # nothing started behind the one it took
        ex.standby(fresh=2, depth=2)
        assert len(ex._standby) == 2 and ex.children == 4
        ex.standby(fresh=1)  # fewer fresh jobs left than children ahead: the spare one is closed
        assert len(ex._standby) == 1 and ex.children == 4
    finally:
        ex.close()
    assert not first.alive() and not ahead.alive() and ex._standby == [] and ex._retiring == []


def test_a_helper_executor_takes_some_of_the_rate_replays_side_by_side(tmp_path):
    """The first rate of a divergence (not a crash) is shared with a second executor once its
    child is up: the replays are counted as one rate, each child's first fresh, and the helper's
    child is stopped after it."""
    from fuzz.engine.case import Case
    from fuzz.engine.confirm import Confirmer
    from fuzz.engine.kinds import parse_ops
    from fuzz.engine.tiers import TierSpec

    spec = TierSpec("torch", str(FAKES / "past_prefix.py"))
    ex, helper = (supervise.Executor(spec, op_timeout=30, log_dir=tmp_path) for _ in range(2))
    config = kvref.PoolConfig(num_pages=8, page_size=2, multiplier=3)
    ops = parse_ops([{"op": "alloc", "n": 6}, {"op": "read_table", "rows": [[2, 3, 4, 5, 6, 7]], "req_idx": [0],
                                                "seq_lens": [3], "max_pages": 3, "width": 6, "legacy": False}])
    try:
        found = ex.run(config, ops)
        helper.prestart()
        deadline = time.monotonic() + 120
        while not helper.ready():
            assert time.monotonic() < deadline and helper.child.alive(), "the helper did not set up"
            time.sleep(0.05)
        case = Case.found(config=config, ops=ops, divergence=found, original_len=len(ops))
        done = Confirmer(ex, tries=5, minimize=False, helper=helper).confirm(case)
        assert done.reproduced == {"k": 5, "n": 5, "fresh": 5} and not done.flaky, done.reproduced
        # the executor's own child had run a job: its first replay waited for a fresh one, the helper's did not
        assert helper.jobs >= 1 and ex.jobs - 1 + helper.jobs == 5, (ex.jobs, helper.jobs)
        assert helper.child is None
    finally:
        ex.close()
        helper.close()


def test_a_cuda_fault_has_one_name_however_it_surfaced():
    from fuzz.engine.runner import crash_field, is_cuda_error

    forms = [RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be ..."),
             RuntimeError("Triton Error [CUDA]: an illegal memory access was encountered"),
             type("AcceleratorError", (RuntimeError,), {})("an illegal memory access was encountered")]
    assert all(is_cuda_error(e) for e in forms)
    assert {crash_field(e) for e in forms} == {"cuda-illegal-address"}
    assert crash_field(RuntimeError("CUDA error: device-side assert triggered")) == "cuda-device-assert"
    assert not is_cuda_error(IndexError("index 7 is out of bounds")) and crash_field(IndexError()) == "IndexError"


def test_a_child_starved_of_cpu_is_not_a_hang_but_one_that_blocks_is(tmp_path, monkeypatch):
    """The op-timeout runs on the child's own clock: seconds it sat runnable while other
    processes held the cores (a loaded CI runner) are not charged to its op; nor is a
    sequence's set-up before its op 0 held to the op-timeout."""
    from fuzz.engine.tiers import TierSpec

    ex = supervise.Executor(TierSpec("torch", str(FAKES / "past_prefix.py")), op_timeout=30, log_dir=tmp_path)
    ex.prestart()
    child = ex.child
    try:
        deadline = time.monotonic() + 120
        while child.slots[supervise.PHASE] != supervise.IDLE:  # set up, waiting for a job: it writes no more
            assert time.monotonic() < deadline and child.alive(), "the executor did not set up"
            time.sleep(0.05)
        assert supervise.waited_for_cpu(child.proc.pid) >= 0.0 and supervise.waited_for_cpu(None) == 0.0
        wall = [1000.0]
        waited = [supervise.waited_for_cpu(child.proc.pid) + 1.0]  # ahead of what it really waited so far
        monkeypatch.setattr(supervise, "time", type("Clock", (), {"monotonic": staticmethod(lambda: wall[0])}))
        monkeypatch.setattr(supervise, "waited_for_cpu", lambda pid: waited[0])
        child.slots[supervise.PHASE] = supervise.RUNNING
        assert not child.stalled(5.0)  # first look: the op starts now
        wall[0] += 8.0
        waited[0] += 7.0  # 8 s of wall, 7 of them waiting for a core: 1 s of its own
        assert not child.stalled(5.0) and child.running_for() == pytest.approx(1.0)
        wall[0] += 6.0  # 6 s more, asleep or blocked: 7 s of its own
        assert child.stalled(5.0)
        # A sequence begun, op 0 not yet (its runner being built: an import on a loaded host): as
        # long as setting up, then the op-timeout from op 0 on.
        child.slots[supervise.OP], child.slots[supervise.SEQ] = -1, child.slots[supervise.SEQ] + 1
        assert not child.stalled(5.0)
        wall[0] += 60.0
        assert not child.stalled(5.0)
        wall[0] += 61.0
        assert child.stalled(5.0)
        child.slots[supervise.OP] = 0
        assert not child.stalled(5.0)
        wall[0] += 6.0
        assert child.stalled(5.0)
    finally:
        monkeypatch.setattr(supervise, "time", time)  # the real clock again, for close()
        child.slots[supervise.PHASE] = supervise.IDLE
        ex.close()


def test_a_child_inside_its_own_exit_is_ended_by_it_not_called_hung(tmp_path, monkeypatch):
    """A child found exiting when its op timed out (a kernel set's ``os._exit``, whose CUDA
    teardown a busy GPU makes slow: here a pause before the exit, and the kernel's flag read as
    set) is waited for: the finding is the exit, ``crash/exit-0``, not ``timeout``."""
    from fuzz.engine.kinds import parse_ops
    from fuzz.engine.tiers import TierSpec

    ex = supervise.Executor(TierSpec("torch", str(FAKES / "slow_exit.py")), op_timeout=1, log_dir=tmp_path)
    config = kvref.PoolConfig(num_pages=8, page_size=2, multiplier=3)
    ops = parse_ops([{"op": "alloc", "n": 2}, {"op": "free", "tokens": [0, 1, 2, 3]}])
    monkeypatch.setattr(supervise, "exiting", lambda pid: True)
    try:
        got = ex.run(config, ops)
    finally:
        ex.close()
    assert got is not None and str(got.signature) == "free/crash/exit-0", got


def test_exiting_reads_the_kernels_word_for_a_process():
    """A zombie is exiting; a sleeping process and a pid that is gone are not."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while Path(f"/proc/{done.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert supervise.exiting(done.pid) and not supervise.exiting(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()
        done.wait()
    assert not supervise.exiting(done.pid)


def _zombie(code: str) -> subprocess.Popen:
    """A process that ran ``code`` and is a zombie now (ended, not yet reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 30
    while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return proc


def test_exit_status_is_read_from_the_kernel_before_the_parent_reaps_it():
    """``procfs.exit_status``: a zombie's status as multiprocessing words it (a code, or minus
    the signal); None for a process still running."""
    from fuzz.engine.procfs import exit_status

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    zombies = [_zombie("import sys; sys.exit(3)"), _zombie("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")]
    try:
        assert [exit_status(z.pid) for z in zombies] == [3, -signal.SIGKILL]
        assert exit_status(sleeper.pid) is None
    finally:
        sleeper.kill()
        for p in (sleeper, *zombies):
            p.wait()


def test_a_child_killed_but_not_yet_reaped_is_named_by_its_signal_not_exit_none(tmp_path):
    """A fault case's child SIGKILLed on a GPU host under load: its pipe closed, but the CUDA
    teardown keeps its status from its parent past the short wait. An unknown status would be
    ``crash/exit-None``, another signature, and no replay of a ``crash/SIGKILL`` case would count.
    The status the kernel already holds names it."""
    zombie = _zombie("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")

    class Unreaped:  # the daemon has not relayed the status yet
        pid, exitcode = zombie.pid, None

        def join(self, timeout=None):
            pass

        def is_alive(self):
            return True

    child = object.__new__(supervise.Child)
    child.proc, child.log, child.exited = Unreaped(), tmp_path / "child.log", False
    child.log.write_text("")
    try:
        fault = child.fault()
    finally:
        zombie.wait()
    assert (fault.kind, fault.reason, fault.exitcode) == ("crash", "SIGKILL", -signal.SIGKILL), fault


@pytest.mark.cuda(no_twin="a CPU has no queue of device work to wait for")
def test_a_cuda_sequence_has_its_set_up_done_before_op_0():
    """Op 0's clock is the op-timeout's: the device work a sequence's set-up queued (and any queued
    before it) is finished, and pinned memory made, before its runner returns, so op 0's first read
    of the device does not wait for it (on a GPU shared with many processes, a false timeout at op
    0). Here a ~1 s spin queued first stands for that wait; no interpreter twin: a CPU has no queue."""
    import torch

    from fuzz.engine.runner import PoolRun

    tier = make_tier("cuda")
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e9))
    PoolRun(kvref.PoolConfig(num_pages=8, page_size=2, multiplier=3), tier)
    assert torch.cuda.current_stream().query()


def test_seconds_inside_compiled_launches_are_not_the_ops_own(tmp_path, monkeypatch):
    """A compile inside an op (or its wait for the head start's) is not the op's work: with an
    op-timeout of seconds, a cold compile on a GPU host crowded with other campaigns' compiles would
    be a hang that never replays, and so would a smoke test waiting for its head start while the
    worker sets up. A child blocked outside any launch is still a hang, and one stuck inside a
    launch past the setting-up limit too."""
    from fuzz.engine.tiers import TierSpec

    ex = supervise.Executor(TierSpec("torch", str(FAKES / "past_prefix.py")), op_timeout=30, log_dir=tmp_path)
    ex.prestart()
    child = ex.child
    try:
        deadline = time.monotonic() + 120
        while child.slots[supervise.PHASE] != supervise.IDLE:
            assert time.monotonic() < deadline and child.alive(), "the executor did not set up"
            time.sleep(0.05)
        wall = [1000.0]
        monkeypatch.setattr(supervise, "time", type("Clock", (), {"monotonic": staticmethod(lambda: wall[0])}))
        monkeypatch.setattr(supervise, "waited_for_cpu", lambda pid: 0.0)
        child.slots[supervise.PHASE] = supervise.RUNNING
        assert not child.stalled(5.0)  # the op starts
        wall[0] += 1.0
        child.slots[supervise.PHASE] = supervise.LAUNCHING  # a launch that compiles for 30 s
        wall[0] += 30.0
        assert not child.stalled(5.0)
        child.slots[supervise.LAUNCH_MS] += 30_000
        child.slots[supervise.PHASE] = supervise.RUNNING  # it returned: 31 s of wall, 1 s of the op's own
        assert not child.stalled(5.0) and child.running_for() == pytest.approx(1.0)
        wall[0] += 3.0
        assert not child.stalled(5.0)
        wall[0] += 2.0  # 6 s of its own, blocked outside any launch: a hang
        assert child.stalled(5.0)
        child.slots[supervise.OP] += 1  # the next op, stuck inside one launch
        assert not child.stalled(5.0)
        child.slots[supervise.PHASE] = supervise.LAUNCHING
        wall[0] += 119.0
        assert not child.stalled(5.0)
        wall[0] += 2.0
        assert child.stalled(5.0)
        # Setting up (a smoke test whose launches wait for a head start's compiles on a loaded GPU
        # host): 200 s of launches and 100 s of its own are no hang; past 120 s of its own, one.
        child.slots[supervise.PHASE] = supervise.SETUP
        assert not child.stalled(5.0)
        wall[0] += 200.0
        child.slots[supervise.LAUNCH_MS] += 200_000
        wall[0] += 100.0
        assert not child.stalled(5.0)
        wall[0] += 21.0
        assert child.stalled(5.0)
    finally:
        monkeypatch.setattr(supervise, "time", time)
        child.slots[supervise.PHASE] = supervise.IDLE
        ex.close()


def test_a_compiled_launch_is_clocked_and_an_interpreted_one_is_not():
    import triton
    import triton.language as tl

    from fuzz.engine import launches

    @triton.jit
    def _one(x_ptr):
        tl.store(x_ptr, 1)

    seen = []
    launches.clock(lambda: seen.append("enter"), lambda token: seen.append("leave"))
    try:
        import torch

        x = torch.zeros(1, dtype=torch.int32)
        _one[(1,)](x)
        assert x.item() == 1
        interpreted = type(_one).__name__ == "InterpretedFunction"
        assert seen == ([] if interpreted else ["enter", "leave"])
    finally:
        launches._CLOCKS.clear()


def test_past_the_budget_the_campaign_says_once_which_op_it_still_waits_for(monkeypatch):
    """A run that waits past its budget for an op in progress (a late hang is a case, so it is
    waited for up to the op timeout) says so once, in the progress stream and the summary; and
    so does one still confirming findings made late (they get their floors past the budget)."""
    import io
    from types import SimpleNamespace

    from fuzz.engine.campaign import Campaign
    from fuzz.engine.summary import Summary

    def slot(index, running_s, step=3, done=False):
        child = SimpleNamespace(slots={supervise.OP: step}, running_for=lambda: running_s)
        return SimpleNamespace(index=index, done=done, child=child)

    progress = io.StringIO()
    camp = Campaign.__new__(Campaign)
    camp.opts, camp.progress, camp.summary = CampaignOptions(op_timeout=60.0), progress, Summary()
    camp._overrun_said = False
    camp.slots = [slot(0, 0.0), slot(1, 41.0, step=7), slot(2, 50.0, done=True)]
    camp._say_overrun()
    camp._say_overrun()
    lines = [ln for ln in progress.getvalue().splitlines() if ln]
    assert lines == ["[kvfuzz] budget over: waiting for worker 1's op 7, running for 41 s, up to the op timeout "
                     "(60 s): a hang is a case"]
    assert camp.summary.notes == [lines[0].removeprefix("[kvfuzz] ")]
    # ... and, once the workers are done, that it still confirms what was found late (and until when).
    # On a clock of the test's own: "30 s more" is exact, however long a loaded runner takes between
    # setting the deadlines and saying them (the real clock's 29-or-30 had a second of slack).
    import threading

    from fuzz.engine import campaign

    now = 1000.0
    monkeypatch.setattr(campaign, "time", type("Clock", (), {"monotonic": staticmethod(lambda: now)}))
    done = threading.Event()
    t = threading.Thread(target=done.wait)
    t.start()
    try:
        camp.deadline, camp.threads = now - 1, [(t, now + 30)]
        camp._say_confirming()
    finally:
        done.set()
        t.join()
    last = progress.getvalue().splitlines()[-1]
    assert last.startswith("[kvfuzz] budget over: confirming 1 finding(s) made late"), last
    assert int(last.rsplit("up to ", 1)[1].split(" s more")[0]) == 30, last
    camp._say_confirming()  # none alive now: nothing more said
    assert progress.getvalue().splitlines()[-1] == last and len(camp.summary.notes) == 2
    quiet = Campaign.__new__(Campaign)  # nothing running past the budget: nothing said
    quiet.opts, quiet.progress, quiet.summary, quiet._overrun_said = CampaignOptions(), io.StringIO(), Summary(), False
    quiet.slots = [slot(0, 0.0)]
    quiet._say_overrun()
    assert quiet.progress.getvalue() == "" and not quiet._overrun_said


def test_a_worker_stuck_setting_up_is_a_setup_error_never_a_case_of_op_0():
    """A worker killed before its first sequence (importing the set, its smoke test) ran no op of
    any seed: its heartbeat's zeros would make a case of op 0 of seed 0 that never replays. The
    first worker's is a setup error naming where it was; a restarted worker's position ends. A
    stall while running ops is still a case of the op it was on."""
    from types import SimpleNamespace

    from fuzz.engine.campaign import Campaign
    from fuzz.engine.slot import Slot
    from fuzz.engine.tiers import SetupError
    from fuzz.engine.verdict import Fault

    stack = ["/team/kernels.py:7 in _load_tables", "/repo/fuzz/engine/supervise.py:250 in _child_entry"]

    def watch(phase: int, restarts: int = 0):
        slots = [0] * supervise.SLOTS
        slots[supervise.PHASE], slots[supervise.OP] = phase, 3
        child = SimpleNamespace(slots=slots, alive=lambda: True, stalled=lambda t: True, running_for=lambda: 9.0,
                                kill_hung=lambda: None,
                                fault=lambda timed_out, t: Fault("timeout", "no-progress", "no progress", None, [], stack))
        faults = []
        campaign = SimpleNamespace(op_timeout=lambda: 1.5, _drain=lambda s: None, spec=SimpleNamespace(name="k.py"),
                                   _fault=lambda slot, fault, step: faults.append(step))
        campaign._setup_failed = lambda *a: Campaign._setup_failed(campaign, *a)
        slot = Slot(0)
        slot.child, slot.restarts = child, restarts
        Campaign._watch(campaign, slot)
        return slot, faults

    with pytest.raises(SetupError, match=r"made no progress while loading the kernel set(.|\n)*_load_tables"):
        watch(supervise.SETUP)
    slot, faults = watch(supervise.SETUP, restarts=1)
    assert slot.done and faults == []
    slot, faults = watch(supervise.RUNNING)
    assert not slot.done and faults == [3]


def test_a_worker_runs_no_op_before_its_parent_has_its_hello():
    """The hello goes through the queue's feeder thread; a worker that crashes in its first op
    before that thread runs takes it along, and the parent, without what rebuilds its ops, could
    only call the crash a set-up failure. The worker waits for the parent's word (``HEARD``)."""
    from fuzz.engine import worker

    beat = supervise.Beat([0] * supervise.SLOTS)
    threading.Timer(0.3, beat.slots.__setitem__, (supervise.HEARD, 1)).start()
    t0 = time.monotonic()
    worker._heard(beat)
    assert 0.25 <= time.monotonic() - t0 < 5 and beat.slots[supervise.HEARD] == 1
