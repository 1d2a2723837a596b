"""The fork daemon (``KVFUZZ_START_METHOD=daemon``, ``fuzz.engine.zygote.daemon``): one
preloaded server that outlives the commands it serves. What it must keep of a per-process
server: a child's environment, exit code and stdio are its client's; what it must add: it
serves the next command without a new preload, a child dies with its client even when the
client's whole process group is killed, it never holds a client's pipes, it ends when idle,
and it refuses a socket directory others could write to.

Each test gets a private socket directory (``KVFUZZ_ZYGOTE_DIR``), so the daemons here are
their own; the clients are separate Python processes (``_client``), as commands are."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from fuzz.engine.zygote import daemon

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the forkserver protocol is Linux's here")

# A command that starts one child from the daemon: the child writes what it sees to argv[1]
# and then does argv[2] ("exit" with code 3, or "sleep" until killed); the client waits for it
# and prints its exit code.
CLIENT = """
import json, os, sys, time
from fuzz.engine import zygote

def probe(out, then):
    json.dump({"pid": os.getpid(), "ppid": os.getppid(), "probe": os.environ.get("KVFUZZ_PROBE"),
               "torch_loaded": "torch" in sys.modules, "cwd": os.getcwd()}, open(out, "w"))
    if then == "sleep":
        time.sleep(600)
    os._exit(3)

if __name__ == "__main__":
    child = zygote.start(probe, (sys.argv[1], sys.argv[2]), extra_env={}, interpret=True)
    child.join(600)
    print("exitcode", child.exitcode, flush=True)
"""


@pytest.fixture
def sockets(monkeypatch):
    where = Path(tempfile.mkdtemp(prefix="kvfz-", dir="/tmp")) / "s"  # short: a socket's path has 107 bytes
    monkeypatch.setenv(daemon.DIR_ENV, str(where))
    monkeypatch.setenv("KVFUZZ_START_METHOD", "daemon")
    monkeypatch.setenv(daemon.IDLE_ENV, "60")
    yield where
    for pid in _daemon_pids(where):  # end this test's daemons now, not after their idle time
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(where.parent, ignore_errors=True)


def _daemon_pids(where: Path) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"daemon.main.*{where}"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _client(tmp_path, name: str, then: str = "exit", **popen):
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    env = {**os.environ, "KVFUZZ_PROBE": name, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, str(script), str(tmp_path / f"{name}.json"), then], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def _seen(tmp_path, name: str, timeout: float = 120) -> dict:
    path = tmp_path / f"{name}.json"
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and path.stat().st_size:
            return json.loads(path.read_text())
        time.sleep(0.05)
    raise AssertionError(f"the child of {name} wrote nothing in {timeout} s")


def test_one_daemon_serves_successive_commands_with_each_ones_environment(tmp_path, sockets):
    first = _client(tmp_path, "first")
    out, err = first.communicate(timeout=300)  # returns: the daemon holds none of the client's pipes
    assert "exitcode 3" in out, err
    second = _client(tmp_path, "second")
    out2, err2 = second.communicate(timeout=300)
    assert "exitcode 3" in out2, err2
    a, b = _seen(tmp_path, "first"), _seen(tmp_path, "second")
    assert (a["probe"], b["probe"]) == ("first", "second")  # each child has its own client's environment
    assert a["ppid"] == b["ppid"] not in (first.pid, second.pid), "both forked by one daemon, not by a client"
    assert a["torch_loaded"] and b["torch_loaded"], "forked from a preloaded server"
    assert a["cwd"] == str(tmp_path)
    assert _daemon_pids(sockets) == [a["ppid"]], "the daemon outlives its first client and is the only one"


def test_a_child_dies_with_its_client_when_the_clients_process_group_is_killed(tmp_path, sockets):
    client = _client(tmp_path, "victim", then="sleep", start_new_session=True)
    child = _seen(tmp_path, "victim")["pid"]
    os.killpg(client.pid, signal.SIGKILL)  # as a cancelled CI job: the child is not in that group
    client.wait(timeout=60)
    end = time.monotonic() + 30
    while time.monotonic() < end and _alive(child):
        time.sleep(0.05)
    assert not _alive(child), "the daemon's child outlived its client"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_an_idle_daemon_exits_and_removes_its_socket_and_the_next_command_starts_another(tmp_path, sockets,
                                                                                         monkeypatch):
    monkeypatch.setenv(daemon.IDLE_ENV, "0.5")
    assert "exitcode 3" in _client(tmp_path, "early").communicate(timeout=300)[0]
    first = _seen(tmp_path, "early")["ppid"]
    end = time.monotonic() + 60
    while time.monotonic() < end and (_alive(first) or list(sockets.glob("*.sock"))):
        time.sleep(0.1)
    assert not _alive(first) and not list(sockets.glob("*.sock")), "the idle daemon is still there"
    assert "exitcode 3" in _client(tmp_path, "late").communicate(timeout=300)[0]
    assert _seen(tmp_path, "late")["ppid"] != first


def test_a_stale_socket_that_no_daemon_answers_is_replaced(tmp_path, sockets):
    import socket

    from fuzz.engine import zygote

    sockets.mkdir(mode=0o700)
    key = zygote.server_key(dict(os.environ), True)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(daemon.DaemonServer(key).path)
    stale.close()  # the file stays, nobody listens: a daemon killed with -9
    assert "exitcode 3" in _client(tmp_path, "after").communicate(timeout=300)[0]


def test_the_digest_covers_the_server_key_and_the_daemons_own_files(monkeypatch):
    from fuzz.engine import zygote

    key = zygote.server_key
    assert daemon.digest(key({}, True)) == daemon.digest(key({}, True))
    assert len({daemon.digest(key({}, True)), daemon.digest(key({}, False)),
                daemon.digest(key({"TORCH_SHOW_CPP_STACKTRACES": "1"}, True))}) == 3
    before = daemon.digest(key({}, True))
    real = daemon._stamp
    monkeypatch.setattr(daemon, "_stamp", lambda p: (p, 0, 0) if str(p).endswith("verdict.py") else real(p))
    assert daemon.digest(key({}, True)) != before, "an edited module the daemon holds must start a new daemon"
    for warmed in ("tracks/small.py", "kvref/allocator.py"):  # imported once it forked a child (WARM)
        monkeypatch.setattr(daemon, "_stamp", lambda p, w=warmed: (p, 0, 0) if str(p).endswith(w) else real(p))
        assert daemon.digest(key({}, True)) != before, warmed


# Children until one finds the engine loaded (the daemon imports it once it has forked one, while idle).
WARM_CLIENT = """
import json, sys, time
from fuzz.engine import zygote
def probe(q):
    loaded = all(m in sys.modules for m in ("fuzz.engine.worker", "fuzz.engine.confirm", "kvref"))
    if loaded and sys.argv[-1] == "compiled":  # Triton's key computed by the daemon: cached in the child
        from triton.runtime.cache import triton_key
        loaded = triton_key.cache_info().currsize == 1
    q.put(loaded)
if __name__ == "__main__":
    import multiprocessing as mp
    q, seen = mp.get_context("spawn").Queue(), []
    while len(seen) < 100 and not any(seen):
        child = zygote.start(probe, (q,), extra_env={}, interpret=sys.argv[1] == "interpret")
        seen.append(q.get(timeout=120))
        child.join(60)
        time.sleep(0.05)
    print(json.dumps(seen))
"""


@pytest.mark.parametrize("mode", ["interpret", "compiled"])
def test_children_forked_after_the_first_find_the_engine_imported(tmp_path, sockets, mode):
    script = tmp_path / "warm.py"
    script.write_text(WARM_CLIENT)
    r = subprocess.run([sys.executable, str(script), mode], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)},
                       capture_output=True, text=True, timeout=300)
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert not seen[0], "the first child is forked before the engine is imported (a cold first worker waits for nothing)"
    assert seen[-1], f"no child of {len(seen)} found the engine imported"


def test_what_a_daemon_imports_of_kvfuzz_reads_nothing_at_import_that_a_client_sets():
    """A module the daemon imports for many commands must not fix, at import, what a command
    may set: the environment, the device, a thread, the time (read them at use)."""
    import ast

    found = []
    for package in daemon.WARM_PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(_module_level(ast.parse(path.read_text()))):
                text = ast.unparse(node) if isinstance(node, (ast.Attribute, ast.Call)) else ""
                if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") or (
                        isinstance(node, ast.Call) and any(w in text.split("(")[0] for w in ("cuda", "Thread", "time."))):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: {text[:80]}")
    assert not found, found


def _module_level(tree):
    """``tree`` without its function bodies (what runs when the module is imported)."""
    import ast

    class Strip(ast.NodeTransformer):
        def visit_FunctionDef(self, node):
            return None
        visit_AsyncFunctionDef = visit_Lambda = visit_FunctionDef

    return Strip().visit(tree)


def test_a_socket_directory_others_can_write_to_is_refused(tmp_path, monkeypatch):
    open_dir = tmp_path / "shared"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    monkeypatch.setenv(daemon.DIR_ENV, str(open_dir))
    with pytest.raises(daemon.DaemonError, match="not private to this user"):
        daemon.directory()
    deep = tmp_path / ("d" * 90)
    monkeypatch.setenv(daemon.DIR_ENV, str(deep))
    with pytest.raises(daemon.DaemonError, match="too long for a Unix socket's path"):
        daemon.directory()
    monkeypatch.delenv(daemon.DIR_ENV)
    monkeypatch.setenv("TMPDIR", str(deep))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    assert daemon.directory() == f"/tmp/kvfuzz-zygote-{os.getuid()}", "a long TMPDIR: the default still works"
    monkeypatch.setenv(daemon.IDLE_ENV, "soon")
    with pytest.raises(daemon.DaemonError, match="KVFUZZ_ZYGOTE_IDLE_S='soon'"):
        daemon.idle_s()


def test_a_client_that_differs_in_what_children_inherit_gets_a_daemon_of_its_own(tmp_path, sockets):
    """A forked child takes its cgroup, affinity, nice value and limits from the daemon: a
    client running under other ones (another batch job, ``nice``) must not share it."""
    assert "exitcode 3" in _client(tmp_path, "plain").communicate(timeout=300)[0]
    niced = _client(tmp_path, "niced", preexec_fn=lambda: os.nice(1))
    assert "exitcode 3" in niced.communicate(timeout=300)[0]
    assert _seen(tmp_path, "plain")["ppid"] != _seen(tmp_path, "niced")["ppid"]
    assert len(_daemon_pids(sockets)) == 2
