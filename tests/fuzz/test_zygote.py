"""Children forked from a preloaded server (``fuzz.engine.zygote``) keep spawn's semantics:
the parent's environment as it is when the child is created, no kernel set and no CUDA
context inherited, the Triton mode the child asks for whichever mode ran before, faults
that end the child alone. The probes below run in the children (this module stays light:
importing it imports no torch and no kernel set)."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from fuzz.engine import supervise, zygote
from fuzz.engine.tiers import TierSpec


@pytest.fixture(autouse=True, params=["forkserver", "daemon"])
def forked_children(request, monkeypatch):
    """These tests are about the servers children are forked from (the per-process one, the
    default, and the daemon, ``zygote.daemon``), whatever the environment that runs them asks for."""
    monkeypatch.setenv(zygote.START_ENV, request.param)


def _run(tmp_path, entry: str, *args, env: dict | None = None) -> dict:
    out = tmp_path / f"report-{len(list(tmp_path.iterdir()))}.json"
    child = supervise.Child(f"tests.fuzz.test_zygote:{entry}", (str(out), *args), log_dir=tmp_path, env=env)
    child.proc.join(timeout=300)
    try:
        assert child.proc.exitcode == 0, "\n".join(supervise.tail(child.log))
        return json.loads(out.read_text())
    finally:
        child.close()


def _at_entry(beat, out):  # runs in the child
    import torch

    jit_modules = []
    if "triton.runtime.jit" in sys.modules:
        from fuzz.engine.tiers import decorated_as

        jit_modules = decorated_as(True) + decorated_as(False)
    Path(out).write_text(json.dumps({
        "environ": dict(os.environ), "modules": sorted(sys.modules), "jit_modules": jit_modules,
        "cuda_initialized": torch.cuda.is_initialized(), "bad_fork": torch.cuda._is_in_bad_fork(),
        "ppid": os.getppid(), "cwd": os.getcwd(), "sys_path": sys.path}))


def test_a_child_sees_the_environment_cwd_and_sys_path_as_they_are_when_it_is_created(tmp_path, monkeypatch):
    monkeypatch.setenv("KVFUZZ_PROBE_GONE", "before")
    _run(tmp_path, "_at_entry")  # the server (if any) starts with KVFUZZ_PROBE_GONE set
    monkeypatch.delenv("KVFUZZ_PROBE_GONE")
    monkeypatch.setenv("KVFUZZ_LACKS", "translate_tokens")
    (elsewhere := tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.syspath_prepend(str(elsewhere))
    got = _run(tmp_path, "_at_entry", env={"KVFUZZ_PROBE_EXTRA": "1"})
    assert got["environ"] == {**os.environ, "KVFUZZ_PROBE_EXTRA": "1"}
    assert (got["cwd"], got["sys_path"]) == (str(elsewhere), sys.path)


def test_a_server_holds_no_kernel_set_no_jit_function_of_ours_and_no_cuda(tmp_path):
    got = _run(tmp_path, "_at_entry")
    assert not [m for m in got["modules"] if m.startswith(("kvkernels", "kvfuzz_kernels"))], got["modules"]
    assert all(m.startswith("triton.") for m in got["jit_modules"]), got["jit_modules"]
    assert not got["cuda_initialized"] and not got["bad_fork"]
    if zygote.method() == "forkserver":
        assert got["ppid"] != os.getpid(), "forked by the server, not by this process"
        assert "torch" in got["modules"] and "triton.language" in got["modules"], "the server preloaded them"


def _tier_kinds(beat, out, spec):  # runs in the child
    tier = spec.make()
    import triton.language as tl

    import kvkernels.triton_kernels as tk
    from fuzz.engine.tiers import SetupError, select_backend

    other = "cuda" if spec.backend == "interpret" else "interpret"
    os.environ.pop("TRITON_INTERPRET", None)  # past the environment check: to the decorated functions
    try:
        select_backend(other)
        refused = ""
    except SetupError as exc:
        refused = str(exc)
    Path(out).write_text(json.dumps({"backend": tier.backend, "kernel": type(tk.bind_kernel).__name__,
                                     "stdlib": type(tl.standard.cdiv).__name__, "other_refused": refused}))


@pytest.mark.parametrize("order", [("torch", "interpret"), ("interpret", "torch")])
def test_each_child_gets_the_triton_mode_of_its_tier_whatever_ran_before(tmp_path, monkeypatch, order):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the mode comes from the tier alone
    for backend in order:
        kernels = "kvkernels.torch_path" if backend == "torch" else "kvkernels"
        got = _run(tmp_path, "_tier_kinds", TierSpec(backend, kernels))
        want = "InterpretedFunction" if backend == "interpret" else "JITFunction"
        assert (got["kernel"], got["stdlib"]) == (want, want), got
        # What actually matters to select_backend: functions already decorated the other way.
        assert "triton.language.standard" in got["other_refused"], got


def test_select_backend_refuses_the_mode_that_decorated_functions_contradict(monkeypatch):
    import triton.language as tl

    from fuzz.engine.tiers import SetupError, select_backend

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    interpreted = type(tl.standard.cdiv).__name__ == "InterpretedFunction"
    with pytest.raises(SetupError, match="triton.language.standard"):
        select_backend("cuda" if interpreted else "interpret")


def test_a_loaded_kernel_set_counts_among_the_decorated_autotuned_ones_too(monkeypatch):
    import types

    import triton
    import triton.language as tl

    from fuzz.engine.tiers import decorated_as

    @triton.autotune(configs=[triton.Config({})], key=[])
    @triton.jit
    def kernel(x):
        pass

    monkeypatch.setitem(sys.modules, "kvfuzz_probe_set", types.SimpleNamespace(kernel=kernel))
    interpreted = type(tl.standard.cdiv).__name__ == "InterpretedFunction"
    assert "kvfuzz_probe_set" in decorated_as(interpreted) and "kvfuzz_probe_set" not in decorated_as(not interpreted)


def _exit_by(beat, out, how):  # runs in the child
    if how == "exit":
        os._exit(7)
    os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSEGV)


def test_a_forked_child_that_exits_or_is_killed_ends_alone(tmp_path):
    codes = {}
    for how in ("exit", "kill", "segv"):
        child = supervise.Child("tests.fuzz.test_zygote:_exit_by", (str(tmp_path), how), log_dir=tmp_path)
        child.proc.join(timeout=120)
        codes[how] = child.proc.exitcode
        child.close()
    assert codes == {"exit": 7, "kill": -signal.SIGKILL, "segv": -signal.SIGSEGV}
    assert _run(tmp_path, "_at_entry")["environ"] == dict(os.environ)  # the server still forks


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the forkserver protocol is Linux's here")
def test_two_threads_that_poll_one_child_at_once_both_get_its_exit_code(tmp_path, monkeypatch):
    """The exit-255 of a full test run: a campaign's main loop reads a worker's ``exitcode``
    while a confirmation thread starts an executor (``Process.start`` polls every child). Both
    see the sentinel readable; the stdlib lets both read it, and the second meets end-of-file
    (255). The read is slowed here so that both threads are inside it together."""
    import threading
    import time
    from multiprocessing import connection, forkserver

    child = supervise.Child("tests.fuzz.test_zygote:_exit_by", (str(tmp_path), "exit"), log_dir=tmp_path)
    popen = child.proc._popen
    assert connection.wait([popen.sentinel], 120), "the child exits at once"
    read = forkserver.read_signed
    monkeypatch.setattr(forkserver, "read_signed", lambda fd: (time.sleep(0.3), read(fd))[1])
    got = []
    threads = [threading.Thread(target=lambda: got.append(popen.poll())) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [7, 7, 7] and child.proc.exitcode == 7
    child.close()


def test_the_start_method_is_chosen_per_child(monkeypatch):
    def started_by(extra=None):
        return zygote.process(print, (), extra_env=extra or {}, interpret=False)._start_method

    monkeypatch.setenv(zygote.START_ENV, "spawn")
    assert started_by() == "spawn"
    monkeypatch.setenv(zygote.START_ENV, "forkserver")
    forked = "forkserver" if sys.platform.startswith("linux") else "spawn"
    assert started_by() == started_by({"TRITON_CACHE_DIR": "/tmp/c", "KVFUZZ_LACKS": "x"}) == forked
    # What a library reads when it loads cannot be changed in a forked child: spawned.
    assert started_by({"OMP_NUM_THREADS": "1"}) == started_by({"TRITON_DEBUG": "1"}) == "spawn"
    key = zygote.server_key
    assert key({"TRITON_DEBUG": "1"}, True) != key({}, True) == key({"TRITON_CACHE_DIR": "/tmp/c"}, True)
    monkeypatch.setenv(zygote.START_ENV, "fork")
    with pytest.raises(zygote.StartMethodError, match="KVFUZZ_START_METHOD='fork'"):
        started_by()


def _at_exit(beat, out):  # runs in the child
    import atexit

    atexit.register(lambda: Path(out).write_text("ran"))


def test_a_child_runs_its_atexit_handlers_as_a_spawned_one_does(tmp_path):
    """A worker's compile client closes its compiler process from atexit."""
    marker = tmp_path / "atexit.txt"
    child = supervise.Child("tests.fuzz.test_zygote:_at_exit", (str(marker),), log_dir=tmp_path)
    child.proc.join(timeout=120)
    assert child.proc.exitcode == 0 and marker.read_text() == "ran"
    child.close()


def test_a_server_that_cannot_fork_a_child_is_replaced_by_spawn(tmp_path, monkeypatch, capsys):
    class Broken:
        def connect_to_new_process(self, fds):
            raise OSError("the server's socket is gone")

    monkeypatch.setattr(zygote, "_SAID", [])  # said once per process: the other server's run said it
    monkeypatch.setattr(zygote, "_server", lambda key, daemon=False: Broken())
    child = supervise.Child("tests.fuzz.test_zygote:_exit_by", (str(tmp_path), "exit"), log_dir=tmp_path)
    child.proc.join(timeout=300)
    assert (child.proc._start_method, child.proc.exitcode) == ("spawn", 7)
    child.close()
    if sys.platform.startswith("linux"):
        assert "the server's socket is gone); spawning instead" in capsys.readouterr().err


def _say(text):  # runs in the child, before any log is opened
    os.write(1, text.encode())


def test_a_child_writes_where_the_parent_writes_now(tmp_path, capfd):
    with capfd.disabled():  # a server started now holds the real stdout
        zygote.start(_say, ("",), extra_env={}, interpret=True).join(timeout=120)
    zygote.start(_say, ("said in the child",), extra_env={}, interpret=True).join(timeout=120)
    assert "said in the child" in capfd.readouterr().out
