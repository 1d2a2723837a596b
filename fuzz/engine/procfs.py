"""What Linux says of a process (``/proc``) and of the machine: how long a process has lived,
whether it is inside its own exit, how long it sat runnable waiting for a core, whether a core
is free. Each answers a neutral value where the kernel does not say (another OS)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def _stat(pid: int | str) -> list[str]:
    """``/proc/PID/stat``'s fields from the third (its state) on, past the command name, which may
    hold spaces and parentheses. Raises OSError where there is none (off Linux, a pid gone)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _in_exit(fields: list[str]) -> bool:
    """A zombie, or its main thread flagged ``PF_EXITING``."""
    return fields[0] in ("Z", "X", "x") or bool(int(fields[6]) & 0x4)


def process_age(pid: int | str = "self") -> float | None:
    """Seconds since the process started (``/proc/PID/stat``'s start time), or None off Linux."""
    try:
        return time.clock_gettime(time.CLOCK_BOOTTIME) - int(_stat(pid)[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def a_core_is_free() -> bool:
    """Whether the machine is not already oversubscribed (its 1-minute load average below its
    cores): a child started ahead, or a second one doing the same work side by side, only helps
    on a core nobody uses; on a loaded machine it takes its share from the same cores (measured
    on two cores at a load of 4-6: the rate no faster, the worker's finding later by 0.1-2.6 s).
    True where the load cannot be read."""
    try:
        return os.getloadavg()[0] < (os.cpu_count() or 1)
    except OSError:
        return True


def exiting(pid: int) -> bool:
    """Whether the process is inside its exit (Linux ``/proc/PID/stat``: a zombie, or its main
    thread flagged ``PF_EXITING``): it stopped making progress because it is ending, not hung."""
    try:
        return _in_exit(_stat(pid))
    except (OSError, ValueError, IndexError):
        return False


def exit_status(pid: int) -> int | None:
    """The exit status of a process inside its exit, as ``multiprocessing`` gives one (``-SIG``
    or the code), read from ``/proc/PID/stat`` (its 52nd field) before its parent can reap it; None
    for a process not exiting, or where the kernel does not say. The kernel sets it before it
    closes the process's files and tears down its memory, and a CUDA process's teardown on a GPU
    other processes share can take its parent's wait for the status past any short deadline."""
    try:
        fields = _stat(pid)
        if not _in_exit(fields):
            return None
        code = int(fields[49])
    except (OSError, ValueError, IndexError):
        return None
    return -(code & 0x7F) if code & 0x7F else (code >> 8) & 0xFF


def waited_for_cpu(pid: int | None) -> float:
    """Seconds the process's main thread spent runnable but waiting for a CPU (Linux
    ``/proc/PID/schedstat``, its second field); 0 where the kernel does not say."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError, TypeError):
        return 0.0
