"""A fork server that outlives the command that started it (``KVFUZZ_START_METHOD=daemon``).

Why. The per-process fork server (``forkserver``) pays its import of torch, Triton and numpy
once per ``kvfuzz`` command: 1.5-2 CPU s on this project's CPU runners, 4.5-5.6 s of wall on a
GPU box, before the first worker can start. A nightly shard, a desk user re-running a case,
or a test suite that starts a hundred commands pays it every time. A daemon keeps the
preloaded interpreter between commands, as build servers (Gradle's daemon, Bazel's server)
keep theirs: the second command's first worker starts in milliseconds.

What it is. A process that preloads what a server of its Triton mode preloads (``preload``),
listens on a Unix socket, and forks a child per request, by the same protocol as the
per-process server (``multiprocessing``'s forkserver: the client sends the child's two pipe
ends, the resource tracker's fd and the fds of the child's arguments; the child unpickles its
preparation data and process object from the data pipe, and its pid, then its exit status,
come back on the status pipe). A client sees the same child as from a per-process server
(``_ServedProcess``): its own environment, cwd, ``sys.path``, stdout and stderr, its exit
code, a negative signal number when killed.

Keyed, so a daemon never serves a client it does not fit: the socket's name is a digest of
the server key (the Triton mode, the variables libraries read when they load), the
interpreter (``sys.executable``, its version), what a forked child inherits from the daemon
and not from its client (cgroup, CPU affinity, nice value, resource limits, umask:
``_context``), and the files the daemon has loaded that a
change would make stale: kvfuzz's own modules it imports (this package, ``verdict``) and the
preloaded libraries' entry files (``pip install`` rewrites them). A checkout edited, a venv
upgraded, or another ``TORCH_*`` setting: another socket, another daemon.

What it adds, once it has forked its first child: kvfuzz's own engine and what Triton imports
at its first launch (``WARM``), one module at a time while no request waits (``_warm_one``),
so a child forked later finds what a worker, an executor and a minimizer import already loaded
(about 0.5 CPU s and 100 modules a child; a test suite or a campaign's confirmation starts hundreds). Not
before the first fork: a cold command's first worker would wait for it (``zygote.PRELOAD``).
Each of those modules is in the key (``_warm_files``: every file of the packages they come
from), so an edited checkout gets a daemon of its own; none of them reads the environment,
touches a device or starts a thread when imported (``test_zygote_daemon`` holds them to that).

What differs from a per-process server, and what is done about it:

- *A child is not in its client's process group*: a campaign killed with its group
  (``killpg``, a CI job cancelled) would leave its workers running. So each child watches its
  client (``watch_client``: the data pipe, whose write end the client holds while it lives)
  and kills itself when the client is gone.
- *Its stdio is nobody's*: it is started with stdin, stdout and stderr on ``/dev/null`` (a
  daemon holding a test's capture pipe would keep ``subprocess.run`` waiting for its end);
  each child gets its client's stdout and stderr (``_Environ``), as from any server.
- *It ends by itself*: after ``KVFUZZ_ZYGOTE_IDLE_S`` seconds (default 300) with no request
  and no live child, or as soon as it is idle once its socket is removed or replaced.
- *Its socket is private*: under ``KVFUZZ_ZYGOTE_DIR`` (default ``$TMPDIR/kvfuzz-zygote-UID``),
  a directory refused unless it is this user's and closed to others.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import importlib
import importlib.util
import os
import resource
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing import connection, forkserver, reduction, resource_tracker, spawn, util

from ..verdict import SetupError

IDLE_ENV = "KVFUZZ_ZYGOTE_IDLE_S"
DIR_ENV = "KVFUZZ_ZYGOTE_DIR"
DEFAULT_IDLE_S = 300.0
MAX_FDS = 256
_SUN_PATH_MAX = 107  # sockaddr_un.sun_path on Linux is 108 bytes, the last one a NUL
# kvfuzz's modules a daemon holds (imported by this module and by the preload modules): a
# child uses the daemon's copies of these, so an edit to any of them must start a new daemon.
OWN_FILES = ("__init__.py", "engine/__init__.py", "engine/verdict.py", "engine/zygote/__init__.py",
             "engine/zygote/daemon.py", "engine/zygote/interpret.py", "engine/zygote/compiled.py")
_RLIMITS = ("RLIMIT_AS", "RLIMIT_DATA", "RLIMIT_RSS", "RLIMIT_CPU", "RLIMIT_NOFILE", "RLIMIT_NPROC",
            "RLIMIT_STACK", "RLIMIT_CORE", "RLIMIT_FSIZE", "RLIMIT_MEMLOCK")
# What a daemon imports once it has forked a child, while idle (``_warm_one``), in this order (each
# pulls in what it imports): kvfuzz's modules that every worker, executor and minimizer child
# imports, and the Triton front-end modules its first launch imports (Triton 3.6-3.9: the code
# generator and ``triton.experimental.gluon``'s 50 modules, about 0.3 CPU s a child; no driver).
WARM = ("kvref", "fuzz.engine.verdict", "fuzz.engine.kinds", "fuzz.engine.runner", "fuzz.engine.tiers",
        "fuzz.engine.production.run", "fuzz.engine.tracks.small", "fuzz.engine.tracks.production",
        "fuzz.engine.minimize", "fuzz.engine.confirm", "fuzz.engine.worker", "triton.compiler.code_generator",
        "triton.experimental.gluon", "triton.language.extra.libdevice")
# And, for a compiled-mode daemon, what the first compile or cache lookup of a child computes:
# Triton's own key (``triton_key``: a hash of its files and libtriton, 0.4-0.7 s on an H200 per
# process; lru-cached, so computed here it is every child's). Its files key the daemon too.
WARM_COMPILED = ("triton.runtime.cache:triton_key",)
WARM_PACKAGES = ("fuzz", "kvref")  # the packages WARM imports from: every file of theirs keys the daemon
_CHILD: list[bool] = []  # set in a child the daemon forked (watch_client reads it)
_STARTED: list[subprocess.Popen] = []  # daemons this process started: reaped, never waited for


class DaemonError(SetupError):
    """The daemon's directory is unsafe or unusable (a usage error: exit 2)."""


def idle_s() -> float:
    raw = os.environ.get(IDLE_ENV, "").strip()
    try:
        value = float(raw) if raw else DEFAULT_IDLE_S
    except ValueError:
        raise DaemonError(f"{IDLE_ENV}={raw!r}: give the seconds a daemon waits idle before it exits") from None
    if value <= 0:
        raise DaemonError(f"{IDLE_ENV}={raw!r}: must be positive")
    return value


def directory() -> str:
    """Where the sockets live: created 0700 if missing; refused if another user owns it or
    others may write to it (they could plant a socket that forks our children)."""
    path = os.environ.get(DIR_ENV, "").strip()
    if not path:
        path = os.path.join(tempfile.gettempdir(), f"kvfuzz-zygote-{os.getuid()}")
        if not _fits(path):  # a long TMPDIR: the default must still work
            path = f"/tmp/kvfuzz-zygote-{os.getuid()}"
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
    except OSError as exc:
        raise DaemonError(f"{DIR_ENV}: cannot use {path!r} for the fork daemon's socket: {exc}") from None
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise DaemonError(f"{DIR_ENV}: {path!r} is not private to this user (owner uid {st.st_uid}, mode "
                          f"{st.st_mode & 0o777:o}); the fork daemon needs a directory only you can enter")
    if not _fits(path):
        raise DaemonError(f"{DIR_ENV}: {path!r} is too long for a Unix socket's path ({_SUN_PATH_MAX} bytes with "
                          f"the socket's name); set {DIR_ENV} to a shorter directory")
    return path


def _fits(directory_: str) -> bool:
    return len(os.path.join(directory_, "x" * 24 + ".sock").encode()) <= _SUN_PATH_MAX


def _stamp(path: str | None) -> tuple:
    try:
        st = os.stat(path)  # type: ignore[arg-type]
    except (OSError, TypeError):
        return (path, None)
    return (path, st.st_mtime_ns, st.st_size)


def _library_entry(name: str) -> str | None:
    try:
        spec = importlib.util.find_spec(name)  # a top-level name: located, not imported
    except (ImportError, ValueError):
        return None
    return spec.origin if spec else None


def _context() -> tuple:
    """What a forked child inherits from the daemon rather than from its client, and a client
    may differ in: its cgroup (a batch job's CPU, memory and device limits: another job's
    workers must not run inside this one's), CPU affinity, nice value, resource limits, umask."""
    try:
        with open("/proc/self/cgroup") as f:
            cgroup = f.read()
    except OSError:
        cgroup = None
    limits = tuple(resource.getrlimit(getattr(resource, n)) for n in _RLIMITS if hasattr(resource, n))
    mask = os.umask(0o022)
    os.umask(mask)
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return (cgroup, affinity, os.getpriority(os.PRIO_PROCESS, 0), limits, mask, os.getuid(), os.getgid())


def digest(key: tuple) -> str:
    """The socket's name for a server key: see the module's docstring for what it covers."""
    own = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the ``fuzz`` package
    stamps = [_stamp(os.path.join(own, f)) for f in OWN_FILES] + _warm_files(os.path.dirname(own))
    stamps += [_stamp(_library_entry(n)) for n in ("torch", "triton", "numpy")]
    text = repr((key, sys.executable, sys.version, util._args_from_interpreter_flags(), stamps, _context()))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _warm_files(root: str) -> list[tuple]:
    """The stamps of every Python file of ``WARM_PACKAGES`` as this client would import them
    (``root``: the folder holding this ``fuzz``; ``kvref`` wherever it is found from here)."""
    stamps = []
    for name in WARM_PACKAGES:
        folder = os.path.join(root, name) if name == "fuzz" else os.path.dirname(_library_entry(name) or "")
        if not folder or not os.path.isdir(folder):
            stamps.append((name, None))
            continue
        for where, dirs, files in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            stamps += [_stamp(os.path.join(where, f)) for f in sorted(files) if f.endswith(".py")]
    return stamps


def _warm_one(warm: list[str]) -> None:
    """Import the next module of ``warm`` (removed from it; ``module:function``: then call it).
    What fails here is left to the child, which meets the error itself; once the list is done,
    the new objects are frozen with the rest (their pages stay shared)."""
    name, _, call = warm.pop(0).partition(":")
    try:
        module = importlib.import_module(name)
        if call:
            getattr(module, call)()
    except Exception:  # noqa: BLE001, S110 - a cache only
        pass
    if not warm:
        import gc

        gc.collect()
        gc.freeze()


class DaemonServer:
    """The client side: what ``zygote._Popen`` asks of a server (``connect_to_new_process``,
    ``ensure_running``, ``_stop``), for the daemon of one server key."""

    def __init__(self, key: tuple):
        self.key = key
        self.path = os.path.join(directory(), digest(key) + ".sock")
        self._lock = threading.Lock()

    def ensure_running(self) -> None:
        """Start the daemon unless one answers; does not wait for its preload (requests queue
        on its socket meanwhile)."""
        with self._lock:
            self._connected().close()

    def _stop(self) -> None:
        """Nothing: the daemon outlives its clients and ends when idle."""

    def connect_to_new_process(self, fds: list[int]) -> tuple[int, int]:
        if len(fds) + 3 >= MAX_FDS:
            raise ValueError("too many fds")
        with self._lock:
            client = self._connected()
        with client:
            parent_r, child_w = os.pipe()
            child_r, parent_w = os.pipe()
            try:
                reduction.sendfds(client, [child_r, child_w, resource_tracker.getfd(), *fds])
            except BaseException:
                os.close(parent_r)
                os.close(parent_w)
                raise
            finally:
                os.close(child_r)
                os.close(child_w)
        return parent_r, parent_w

    def _connected(self) -> socket.socket:
        sock = _try_connect(self.path)
        if sock is not None:
            return sock
        with open(self.path + ".lock", "a") as lock:  # one client starts it; the others wait here
            fcntl.flock(lock, fcntl.LOCK_EX)
            sock = _try_connect(self.path)
            if sock is None:
                _start_daemon(self.path, interpret=self.key[0])
                sock = _try_connect(self.path)
            if sock is None:
                raise OSError(errno.ECONNREFUSED, f"the fork daemon at {self.path} did not answer")
            return sock


def _try_connect(path: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.connect(path)
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    except BaseException:
        sock.close()
        raise
    return sock


def _start_daemon(path: str, *, interpret: bool) -> None:
    """Bind its socket here (so a client may connect at once), then start the daemon on it in
    a session of its own, stdio on ``/dev/null``, cwd ``/``, this process's environment."""
    try:
        os.unlink(path)  # a socket no daemon answers any more
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX)
    try:
        old = os.umask(0o177)
        try:
            listener.bind(path)
        finally:
            os.umask(old)
        listener.listen(128)
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        code = (f"import sys; sys.path.insert(0, {package_root!r}); from fuzz.engine.zygote import daemon; "
                f"daemon.main({listener.fileno()}, {interpret!r}, {idle_s()!r}, {path!r})")
        env = dict(os.environ)
        if interpret:
            env["TRITON_INTERPRET"] = "1"
        else:
            env.pop("TRITON_INTERPRET", None)
        _STARTED[:] = [p for p in _STARTED if p.poll() is None]
        _STARTED.append(subprocess.Popen(
            [spawn.get_executable(), *util._args_from_interpreter_flags(), "-c", code],
            pass_fds=(listener.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, cwd="/", env=env, start_new_session=True))
    finally:
        listener.close()


def watch_client() -> None:
    """In a child the daemon forked: end this process when its client is gone. The client
    holds the data pipe's write end while it lives (``parent_process().sentinel`` is its read
    end, empty once the child has unpickled itself), so end-of-file there means the client
    died. The per-process server's children died with the client's process group instead."""
    if not _CHILD:
        return
    import multiprocessing as mp

    parent = mp.parent_process()
    if parent is None or parent.sentinel is None:
        return

    def wait() -> None:
        connection.wait([parent.sentinel])
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=wait, name="kvfuzz-client-watch", daemon=True).start()


def main(listener_fd: int, interpret: bool, idle: float, path: str) -> None:
    """The daemon: preload (the module a per-process server of this mode preloads; by name,
    this package importing this module), then fork a child per request until idle."""
    importlib.import_module(f"{__package__}.{'interpret' if interpret else 'compiled'}")
    mine = os.stat(path).st_ino
    sig_r, sig_w = os.pipe()
    os.set_blocking(sig_r, False)
    os.set_blocking(sig_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.set_wakeup_fd(sig_w)
    status: dict[int, int] = {}  # live child's pid -> its client's status pipe
    listener = socket.socket(fileno=listener_fd)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(sig_r, selectors.EVENT_READ)
    last = time.monotonic()
    warm, forked = list(WARM) + ([] if interpret else list(WARM_COMPILED)), False
    while True:
        busy = warm and forked  # the engine to import: look for requests often, import between them
        ready = {key.fileobj for key, _ in selector.select(timeout=0.0 if busy else min(idle, 5.0))}
        if sig_r in ready:
            _reap(sig_r, status)
        if listener in ready:
            forked = _serve(listener, status, closing=(selector, listener, sig_r, sig_w)) or forked
            last = time.monotonic()
        elif busy:
            _warm_one(warm)
        if not status and (time.monotonic() - last > idle or not _still_ours(path, mine)):
            break
    if _still_ours(path, mine):
        os.unlink(path)
    listener.setblocking(False)
    while True:  # a client that connected just before the unlink is still served
        try:
            _serve(listener, status, closing=(selector, listener, sig_r, sig_w))
        except BlockingIOError:
            break
    while status:
        time.sleep(0.05)
        _reap(sig_r, status)


def _still_ours(path: str, inode: int) -> bool:
    try:
        return os.stat(path).st_ino == inode
    except OSError:
        return False


def _reap(sig_r: int, status: dict[int, int]) -> None:
    try:
        os.read(sig_r, 4096)
    except BlockingIOError:
        pass
    while status:
        try:
            pid, sts = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        fd = status.pop(pid, None)
        if fd is None:
            continue
        try:
            forkserver.write_signed(fd, os.waitstatus_to_exitcode(sts))
        except OSError:  # the client is gone
            pass
        os.close(fd)


def _serve(listener: socket.socket, status: dict[int, int], *, closing: tuple) -> bool:
    """Fork the child a connection asks for; whether it did (a client that only checked the
    daemon answers sends nothing)."""
    conn, _ = listener.accept()
    with conn:
        conn.setblocking(True)
        try:
            fds = reduction.recvfds(conn, MAX_FDS + 1)
        except (OSError, EOFError, RuntimeError):  # a client that gave up halfway
            return False
    if len(fds) < 3:
        for fd in fds:
            os.close(fd)
        return False
    child_r, child_w, tracker, *inherited = fds
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            for held in (*closing, child_w, *status.values()):
                held.close() if hasattr(held, "close") else os.close(held)
            forkserver._forkserver._forkserver_alive_fd = None
            forkserver._forkserver._inherited_fds = inherited
            resource_tracker._resource_tracker._fd = tracker
            _CHILD.append(True)
            code = spawn._main(child_r, os.dup(child_r))
        except BaseException:  # noqa: BLE001 - reported like the stdlib's server does, then exit 1
            sys.excepthook(*sys.exc_info())
        finally:
            os._exit(code)
    try:
        forkserver.write_signed(child_w, pid)
    except OSError:
        pass
    status[pid] = child_w
    for fd in (child_r, tracker, *inherited):
        os.close(fd)
    return True
