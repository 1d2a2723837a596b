"""How a child process starts: forked from a preloaded server (milliseconds), or spawned.

A spawned child is a fresh interpreter that imports torch, Triton and numpy: about 4.5 s
on two loaded cores, paid by every worker, executor, minimizer and fresh-process
reproduction a campaign starts. A child forked from a server that has imported them
already starts in about 0.02 s. So children start from a fork server
(``multiprocessing``'s forkserver protocol), one per *mode*, each started on first use
and kept for the life of this process.

Why one per mode. Triton decides whether a ``@triton.jit`` function is compiled or
interpreted when it decorates it (``triton.runtime.jit.jit`` reads
``knobs.runtime.interpret``, i.e. ``TRITON_INTERPRET``, at that moment; 3.6 through 3.9),
and ``triton.language``'s own ``@jit`` functions (``tl.sum``, ``tl.max``, ``tl.cdiv``,
... in ``triton/language/standard.py``) are decorated when ``triton`` is imported: an
interpreted kernel that calls a compiled ``tl.sum`` fails ("Cannot call @triton.jit'd
outside of the scope of a kernel"). So a server imports Triton with ``TRITON_INTERPRET``
as its children need it (``zygote.interpret`` / ``zygote.compiled``, the modules the
server preloads), and never a kernel set: the set is imported in the child, after its
environment is set, as under spawn.

What a child sees, as under spawn: the parent's ``os.environ`` *at the time the child is
created* (a server keeps the one it started with; tests and users change
``KVFUZZ_LACKS``, fixture knobs, ``CUDA_VISIBLE_DEVICES`` between campaigns), made the
child's whole environment before anything of the child is unpickled (``_Environ``), and
the parent's ``sys.path`` and cwd (multiprocessing's preparation data). Variables that
libraries read when they load (thread pools: ``OMP_*``, ``MKL_*``, ...; ``TORCH_*``,
``PYTHON*``, ``TRITON_DEBUG``) come from the server's start, so they key the server too:
a change starts another server, and a child whose own extra environment sets one is spawned.

Random state: ``random`` reseeds itself in a forked child (``os.register_at_fork``), torch's
default generator starts from its fixed seed in any process, and no server imports
``numpy.random``; forked children share the server's string-hash seed (spawned ones drew one
each), which nothing here relies on.

CUDA is never initialized in a server (torch initializes it lazily, ``import triton``
touches no driver): each child initializes its own context after its
``CUDA_VISIBLE_DEVICES`` and ``CUDA_LAUNCH_BLOCKING`` are set. A child is still its own
process: a segfault, a hang, ``os._exit`` or SIGKILL ends it alone, and its exit code
(a negative signal number when killed) reaches the parent through the server.

Which server. By default (``daemon``) the server outlives the command that started it: a
daemon per server key, reached over a private Unix socket, ending when idle (``daemon.py``
says what it must add: its children die with their client, it holds no client's pipes, it
is keyed by what a child inherits from it). So a command's first worker waits for no import
of torch when an earlier command left a daemon. ``KVFUZZ_START_METHOD=forkserver`` gives
each command a server of its own that ends with it.

``KVFUZZ_START_METHOD=spawn`` restores fresh interpreters; where the forkserver protocol
is unavailable (not Linux, no fd passing) children are spawned and that is said once.
"""

from __future__ import annotations

import atexit
import io
import multiprocessing as mp
import os
import sys
import threading
from multiprocessing import connection, context, forkserver, reduction, spawn, util

from ..verdict import SetupError
from . import daemon as _daemon

START_ENV = "KVFUZZ_START_METHOD"
METHODS = ("forkserver", "daemon", "spawn")
# Read by a library when it loads (so in the server, not the child): the server's key. Triton
# reads TRITON_DEBUG and TRITON_INSTRUMENTATION_MODE at import (knobs.py, 3.6-3.9); of its
# variables only these two are read when used: the cache (set per campaign) and the mode.
LOADED_ENV = ("OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "TORCH_", "PYTHON", "TRITON_")
READ_WHEN_USED = ("TRITON_CACHE_DIR", "TRITON_INTERPRET")
PRELOAD = ("numpy", "torch", "triton", "triton.language")
# Not kvfuzz's own engine: preloading it here (tried) made the first worker later by 0.5-1 s
# (the server imports it all before it can fork; a worker imports only what its track needs),
# and the first worker is what the time to a first case waits for.
SPAWN = mp.get_context("spawn")  # shared objects (Array, Pipe, Queue) work with either kind of child
_SERVERS: dict[tuple, forkserver.ForkServer] = {}
_DAEMONS: dict[tuple, _daemon.DaemonServer] = {}
_LOCK = threading.Lock()
_SAID: list[str] = []


class StartMethodError(SetupError):
    """``KVFUZZ_START_METHOD`` names no start method (a usage error: exit 2)."""


def method() -> str:
    """``daemon`` (the default: a fork server that outlives the command, ``daemon.py``),
    ``forkserver`` (one per command) or ``spawn``: ``KVFUZZ_START_METHOD`` (read at each child,
    so it can change between campaigns). Two threads may poll one child at once: ``_Popen.poll``
    reads its one status message under a lock, or one of them would see a lost exit status
    (``crash/exit-255``)."""
    asked = os.environ.get(START_ENV, "").strip() or "daemon"
    if asked not in METHODS:
        raise StartMethodError(f"{START_ENV}={asked!r}: choose one of {', '.join(METHODS)}")
    if asked in ("forkserver", "daemon") and not _forkserver_available():
        _say_once(f"kvfuzz: the forkserver start method is unavailable on {sys.platform}; "
                  f"children start as fresh interpreters (spawn), a few seconds each")
        return "spawn"
    return asked


def _forkserver_available() -> bool:
    if not sys.platform.startswith("linux") or "forkserver" not in mp.get_all_start_methods():
        return False
    try:
        from multiprocessing import popen_forkserver  # noqa: F401 - raises without fd passing
    except ImportError:
        return False
    return True


def _say_once(text: str) -> None:
    if text not in _SAID:
        _SAID.append(text)
        print(text, file=sys.stderr)


def server_key(environ: dict, interpret: bool) -> tuple:
    """Which server may fork a child: its Triton mode and what libraries read when they load."""
    return (interpret, tuple(sorted((k, v) for k, v in environ.items() if _loaded(k))))


def _loaded(name: str) -> bool:
    return name.startswith(LOADED_ENV) and name not in READ_WHEN_USED


def process(target, args: tuple, *, extra_env: dict, interpret: bool):
    """A ``multiprocessing`` process (not started) that runs ``target(*args)`` with
    ``os.environ`` as it is now plus ``extra_env`` as its whole environment, from the server
    of its Triton mode (``interpret``: ``TRITON_INTERPRET=1`` when triton is imported), or
    spawned (``method()``; or when ``extra_env`` sets a variable libraries read at load)."""
    environ = {**os.environ, **extra_env}
    packed = (_Environ(environ), target, args)
    if method() == "spawn" or any(_loaded(k) for k in extra_env):
        return SPAWN.Process(target=_enter, args=packed, daemon=True)
    proc = _ServedProcess(target=_enter, args=packed, daemon=True)
    proc._kvfuzz_server = server_key(environ, interpret)  # extra_env sets none of its variables
    proc._kvfuzz_daemon = method() == "daemon"
    return proc


def start(target, args: tuple, *, extra_env: dict, interpret: bool):
    """``process(...)``, started. A server that cannot fork it (it died, its socket is gone)
    is not a campaign's failure: the child is spawned instead, and that is said once."""
    proc = process(target, args, extra_env=extra_env, interpret=interpret)
    try:
        proc.start()
    except (OSError, EOFError) as exc:
        if proc._start_method == "spawn":
            raise
        _say_once(f"kvfuzz: the fork server failed to start a child ({type(exc).__name__}: {exc}); spawning instead")
        proc = SPAWN.Process(target=_enter, args=proc._args, daemon=True)
        proc.start()
    return proc


def warm(interpret: bool) -> None:
    """Start the server a child of this Triton mode will be forked from, now, without waiting
    for it: it imports torch and Triton on another core while this process imports the
    engine (the command line calls it first thing), so the first child does not wait for
    two imports of torch in a row. Nothing under ``KVFUZZ_START_METHOD=spawn``."""
    if method() == "spawn":
        return
    try:
        _server(server_key(dict(os.environ), interpret), daemon=method() == "daemon").ensure_running()
    except OSError:  # no server now: the first child starts one, or is spawned (start)
        pass


def _enter(environ, target, args) -> None:
    # ``environ`` was applied when it was unpickled, before ``target`` and ``args`` were.
    if mp.current_process()._start_method == "forkserver":
        _daemon.watch_client()  # a daemon's child: it ends with its client
        # A forked child leaves by os._exit; a spawned one runs its atexit handlers (a worker's
        # compile client closes its compiler there) after multiprocessing's exit handler: so here.
        atexit.unregister(_quiet_exit)
        util.Finalize(None, atexit._run_exitfuncs, exitpriority=-100)
    target(*args)


class _Environ:
    """The child's whole environment, applied while the child unpickles it: first of the
    process's arguments, so before the modules that the rest of them bring in are imported.
    With it go the parent's current stdout and stderr (a server holds those it started with:
    under pytest, an earlier test's capture), where a child writes until it opens its log."""

    def __init__(self, environ: dict):
        self.environ = environ

    def __reduce__(self):
        return _apply_environ, (self.environ, *(reduction.DupFd(fd) if _is_open(fd) else None for fd in (1, 2)))


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _apply_environ(environ: dict, *streams) -> None:
    os.environ.clear()
    os.environ.update(environ)
    for fd, passed in zip((1, 2), streams):
        got = passed.detach() if passed is not None else fd
        if got != fd:  # forked: a new descriptor; spawned: the same number, already in place
            os.dup2(got, fd)
            os.close(got)


def _server(key: tuple, *, daemon: bool = False):
    """The server for ``key``, started (in the background: it preloads while the parent goes
    on) on first use; stopped when this process exits. With ``daemon``, the daemon of that
    key (``daemon.py``), started if none answers, and left running when this process exits."""
    if daemon:
        with _LOCK:
            found = _DAEMONS.get(key)
            if found is None:
                found = _DAEMONS[key] = _daemon.DaemonServer(key)
            return found
    with _LOCK:
        server = _SERVERS.get(key)
        if server is None:
            server = _SERVERS[key] = forkserver.ForkServer()
            mode = "interpret" if key[0] else "compiled"
            server.set_forkserver_preload([f"{__name__}.{mode}"])
            if len(_SERVERS) == 1:
                # After multiprocessing's own exit handler has terminated and joined the
                # children (its last pass runs negative priorities), so a server exits having
                # reaped them all and its CPU time is counted in this process's.
                util.Finalize(None, _stop_all, exitpriority=-10)
        return server


def _stop_all() -> None:
    with _LOCK:
        servers = list(_SERVERS.values())
        _SERVERS.clear()
    for server in servers:
        try:
            server._stop()  # closes its "alive" fd and waits for it to exit
        except OSError:  # already gone (killed with its process group)
            pass


def preload(interpret: bool) -> None:
    """What a server imports (``zygote.interpret`` / ``zygote.compiled``): torch, numpy and
    Triton with ``TRITON_INTERPRET`` set or unset; no kernel set, no ``@triton.jit`` of ours.
    Never raises: a module that fails to import here is imported (and fails) in the child."""
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.pop("TRITON_INTERPRET", None)
    import importlib

    for name in PRELOAD + (("triton.runtime.interpreter",) if interpret else ()):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001, S112 - a cache only; the child meets the error itself
            continue
    import gc

    # A server's stderr is its parent's; at its exit libtriton's nanobind teardown prints a
    # known leak report there. Its children leave by os._exit and never run this.
    atexit.register(_quiet_exit)
    gc.collect()
    gc.freeze()  # the preloaded objects: never traversed by a child's collector, their pages stay shared


def _quiet_exit() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)


class _Popen:
    """Placeholder replaced below where the forkserver protocol exists."""


try:
    from multiprocessing import popen_forkserver
except ImportError:  # no fd passing: method() answers spawn
    popen_forkserver = None
else:
    class _Popen(popen_forkserver.Popen):  # type: ignore[no-redef]
        """``popen_forkserver.Popen`` talking to the server named by the process
        (``_kvfuzz_server``); the stdlib's talks to its one module-level server. The protocol
        is the stdlib's: the preparation data and the pickled process go down a pipe whose
        other end the server gave the forked child; the child's pid, then its exit code, come
        back on the sentinel."""

        def __init__(self, process_obj):
            self._read_lock = threading.Lock()
            super().__init__(process_obj)

        def _launch(self, process_obj):
            payload = io.BytesIO()
            context.set_spawning_popen(self)  # fds in the arguments are queued in self._fds
            try:
                reduction.dump(spawn.get_preparation_data(process_obj._name), payload)
                reduction.dump(process_obj, payload)
            finally:
                context.set_spawning_popen(None)
            server = _server(process_obj._kvfuzz_server, daemon=getattr(process_obj, "_kvfuzz_daemon", False))
            self.sentinel, data_w = server.connect_to_new_process(self._fds)
            parent_alive = os.dup(data_w)  # the child's parent_process() sentinel, open while we live
            self.finalizer = util.Finalize(self, util.close_fds, (parent_alive, self.sentinel))
            with open(data_w, "wb", closefd=True) as f:
                f.write(payload.getbuffer())
            self.pid = forkserver.read_signed(self.sentinel)

        def poll(self, flag=os.WNOHANG):
            """The stdlib's poll, made safe for threads. Its exit status is one read of the
            sentinel, after which the server closes it: two threads that both see the sentinel
            readable both read, and the second meets end-of-file, which the stdlib answers as
            exit code 255 ("perhaps the forkserver itself got killed"). A campaign polls from
            two threads at once: its main loop reads a worker's ``exitcode`` while a
            confirmation thread starts an executor (``Process.start`` polls every child of the
            process, ``multiprocessing.process._cleanup``). So the wait is shared, the read is
            done once, under a lock, and every later caller gets what it read."""
            if self.returncode is None:
                if not connection.wait([self.sentinel], 0 if flag == os.WNOHANG else None):
                    return None
                with self._read_lock:
                    if self.returncode is None:
                        try:
                            self.returncode = forkserver.read_signed(self.sentinel)
                        except (OSError, EOFError):  # the server itself died (killed with its group)
                            self.returncode = 255
            return self.returncode


class _ServedProcess(context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj):  # noqa: N802 - multiprocessing's name
        return _Popen(process_obj)
