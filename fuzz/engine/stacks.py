"""A hung child's Python stacks: where it was when its op ran out of time.

Every child registers ``SIGNAL`` with faulthandler as it starts (``arm``). Before the parent
kills a child that made no progress for the op-timeout, it asks for its stacks (``dump``):
faulthandler writes every thread's from a C signal handler, which runs even while the thread
is blocked inside C (a CUDA synchronize, a kernel that never completes) or spinning in
Python (an interpreted kernel's loop). The dump goes to the child's log after a line of the
parent's (``MARK``); the main thread's frames, innermost first, go into the case
(``Fault.stack``) and its innermost into the message, so a hang case says where it hung the
way a crash case's faulthandler report says where it crashed. A child that cannot answer
(stopped, or in uninterruptible sleep) is killed after ``WAIT_S`` without a stack.
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import sysconfig
import time
from pathlib import Path

SIGNAL = signal.SIGUSR2
WAIT_S = 1.0  # the longest the parent waits for the dump before it kills the child anyway
MARK = "kvfuzz: no progress within the op-timeout; the child's Python stacks (faulthandler), innermost call first:"
OUTERMOST = "_child_entry"  # every child's main thread starts there (supervise._child_entry)

_HEADER = re.compile(r"^(Current thread|Thread) 0x[0-9a-fA-F]+ .*\(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.+)$')


def arm(stream) -> None:
    """In the child: dump every thread's stack to ``stream`` on ``SIGNAL``."""
    faulthandler.register(SIGNAL, file=stream, all_threads=True)


def dump(pid: int, log: Path, wait_s: float = WAIT_S) -> tuple[list[str], int | None]:
    """Ask child ``pid`` for its stacks. Returns its main thread's frames (``path:line in
    function``, innermost first; empty when it did not answer) and the size of its log before
    the dump (what a fault's stderr tail ends at), None when the log cannot be read."""
    try:
        start = log.stat().st_size
        with open(log, "a") as f:
            f.write(f"\n{MARK}\n")
        os.kill(pid, SIGNAL)
    except OSError:
        return [], None
    deadline, size, still = time.monotonic() + wait_s, -1, 0
    text = ""
    while time.monotonic() < deadline:
        text = _read(log, start)
        frames = main_frames(text)
        if frames and frames[-1].endswith(f" in {OUTERMOST}"):  # the main thread's, up to where kvfuzz began it
            return frames, start
        # no main thread seen (a child not started by _child_entry): a dump that stopped growing
        still = still + 1 if frames and len(text) == size else 0
        if still >= 5:
            break
        size = len(text)
        time.sleep(0.02)
    return main_frames(text), start


def _read(log: Path, start: int) -> str:
    try:
        with open(log, "rb") as f:
            f.seek(start)
            return f.read(1 << 20).decode(errors="replace")
    except OSError:
        return ""


def main_frames(text: str) -> list[str]:
    """From a faulthandler dump of every thread, the main thread's frames up to ``OUTERMOST``
    (the thread that has one: what started the child below it is not the case's); else the
    thread that took the signal; else the first."""
    blocks = []
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            blocks.append((header.group(1) == "Current thread", []))
            continue
        frame = _FRAME.match(line)
        if frame and blocks:
            path, lineno, func = frame.groups()
            blocks[-1][1].append(f"{path}:{lineno} in {func.strip()}")
    if not blocks:
        return []
    for _, frames in blocks:
        ends = [i for i, frame in enumerate(frames) if frame.endswith(f" in {OUTERMOST}")]
        if ends:
            return frames[: ends[0] + 1]
    current = next((frames for is_current, frames in blocks if is_current), None)
    return current if current is not None else blocks[0][1]


def where(frames: list[str]) -> str:
    """For a message: the innermost frame of the code under test (outside installed libraries,
    the standard library and kvfuzz's harness), else kvfuzz's own, ``function (file:line)``, and
    the innermost one where that is another (Triton's, torch's, kvfuzz's). A hang sampled while
    an interpreted kernel is inside a hook of kvfuzz's still names the kernel's line."""
    if not frames:
        return ""
    outside = [frame for frame in frames if not _library(frame)]
    own = next((frame for frame in outside if not _harness(frame)), outside[0] if outside else None)
    if own is None or own == frames[0]:
        return _short(frames[0])
    return f"{_short(own)}; innermost {_short(frames[0])}"


def brief(frames: list[str], n: int = 12) -> list[str]:
    """For a terminal: the innermost frame, then up to ``n - 1`` outside libraries (the kernel
    set's, kvfuzz's), and how many were left out (all of them are in the case)."""
    if not frames:
        return []
    own = [frame for frame in frames[1:] if not _library(frame)][: n - 1]
    left = len(frames) - 1 - len(own)
    return [frames[0], *own] + ([f"({left} more frames: the case's fault.stack)"] if left else [])


def _short(frame: str) -> str:
    place, _, func = frame.rpartition(" in ")
    path, _, line = place.rpartition(":")
    return f"{func} ({Path(path).name}:{line})"


_LIBRARIES = tuple({sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")})
# the fuzz package, as imported and with links resolved: kvfuzz's own frames
_HARNESS = tuple({str(path.parents[1]) + os.sep for path in (Path(os.path.abspath(__file__)), Path(__file__).resolve())})


def _harness(frame: str) -> bool:
    return frame.startswith(_HARNESS)


def _library(frame: str) -> bool:
    path = frame.rpartition(" in ")[0].rpartition(":")[0]
    return (path.startswith("<") or "/site-packages/" in path or "/dist-packages/" in path
            or path.startswith(_LIBRARIES))
