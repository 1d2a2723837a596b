"""``kvfuzz replay CASE --sanitizer memcheck``: replay a case under NVIDIA's compute-sanitizer.

A CUDA fault case says *that* a kernel touched memory it should not have; the sanitizer
says *which* kernel, at which line of which file (Triton kernels carry line info: the
``.py`` line of the ``tl.store``), which thread of which block, and which address. The replay runs in a
child process (``kvfuzz replay --in-process`` under ``compute-sanitizer``); its first report
is parsed and stored in the case file under ``sanitizer``, so the case carries it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

_PREFIX = re.compile(r"^=+\s?")
_INVALID = re.compile(r"(Invalid .*|.*(?:out of bounds|out-of-range|misaligned|illegal|race|uninitialized).*)",
                      re.IGNORECASE)
_AT = re.compile(r"^\s*at (.+?)\s*$", re.IGNORECASE)
_AT_OFFSET_FIRST = re.compile(r"(0x[0-9a-f]+) in (.+)", re.IGNORECASE)  # at 0x1a0 in KERNEL / in FILE:LINE:KERNEL
_AT_KERNEL_FIRST = re.compile(r"(.+?)\+(0x[0-9a-f]+)(?: in (.+))?", re.IGNORECASE)  # at KERNEL+0x1d0 [in FILE:LINE]
_LOCATION = re.compile(r"(.+?):(\d+)(?::(\d+))?")  # FILE:LINE[:COLUMN]
_THREAD = re.compile(r"by thread \(([\d,\s]+)\) in block \(([\d,\s]+)\)")
_ADDRESS = re.compile(r"(?:Address|Access (?:at|to)) (0x[0-9a-f]+)(.*)", re.IGNORECASE)
_ACCESS = re.compile(r"__(\w+?)__\s+(?:memory\s+)?(read|write|atomic)\w*\s+of size\s+([\d,]+)", re.IGNORECASE)
_ALLOCATION = re.compile(r"and is (?:([\d,]+) bytes (before|after)|(inside)) the nearest allocation at "
                         r"(0x[0-9a-f]+) of size ([\d,]+) bytes", re.IGNORECASE)
_SUMMARY = re.compile(r"ERROR SUMMARY:\s*([\d,]+) error", re.IGNORECASE)


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def parse_location(line: str) -> dict | None:
    """The ``at ...`` line of a report: kernel, offset, file, line (file and line None
    when the kernel has no line info). The forms compute-sanitizer and cuda-memcheck
    print:

    - ``at KERNEL+0x1d0 in /path/file.py:57`` (with line info)
    - ``at KERNEL+0x1d0`` (without)
    - ``at 0x1a0 in KERNEL`` (older, without line info)
    - ``at 0xc8 in /path/file.cu:75:void kernel<double>(double*, int)`` (older, with it)
    """
    m = _AT.match(line)
    if m is None:
        return None
    text = m.group(1)
    out = {"kernel": None, "offset": None, "file": None, "line": None}
    if first := _AT_OFFSET_FIRST.fullmatch(text):
        out["offset"], rest = first.group(1), first.group(2)
        loc = re.fullmatch(r"(.+?):(\d+):(.+)", rest)
        if loc and not loc.group(3).isdigit():
            out.update(file=loc.group(1), line=int(loc.group(2)), kernel=loc.group(3).strip())
        else:
            out["kernel"] = rest.strip()
    elif second := _AT_KERNEL_FIRST.fullmatch(text):
        out["kernel"], out["offset"], where = second.group(1).strip(), second.group(2), second.group(3)
        if where:
            loc = _LOCATION.fullmatch(where.strip())
            out.update(file=loc.group(1), line=int(loc.group(2))) if loc else out.update(file=where.strip())
    else:
        out["kernel"] = text.split(" in ")[0].strip()
    return out


def parse_report(text: str) -> dict | None:
    """The first error compute-sanitizer reported, and its error count; None when it
    reported none. Keys: ``error`` (its first line), ``space``/``access``/``size`` (``global``,
    ``write``, 8), ``kernel``, ``offset``, ``file``, ``line`` (None without line info),
    ``thread``, ``block``, ``address``, ``address_note`` ("is out of bounds"),
    ``allocation`` (the nearest one: base, size, before/after/inside, distance), ``lines``
    (the report as printed) and ``errors``."""
    lines = [_PREFIX.sub("", line) for line in text.splitlines() if line.startswith("=")]
    count = next((int(m.group(1).replace(",", "")) for line in lines if (m := _SUMMARY.search(line))), None)
    for i, line in enumerate(lines):
        if not line.startswith(("Invalid", "Race", "Uninitialized", "Misaligned")) and not (
                line and _INVALID.fullmatch(line.strip()) and "ERROR SUMMARY" not in line and i < len(lines) - 1
                and _AT.match(lines[i + 1])):
            continue
        report = {"error": line.strip(), "space": None, "access": None, "size": None, "kernel": None,
                  "offset": None, "file": None, "line": None, "thread": None, "block": None, "address": None,
                  "address_note": None, "allocation": None, "lines": [x.rstrip() for x in lines[i:i + 8]]}
        if m := _ACCESS.search(line):
            report.update(space=m.group(1).lower(), access=m.group(2).lower(), size=_int(m.group(3)))
        for follow in lines[i + 1:i + 8]:
            if follow and not follow[0].isspace() and not _AT.match(follow) and not _THREAD.search(follow) and \
                    not _ADDRESS.search(follow) and not _ALLOCATION.search(follow):
                break  # the next report (un-indented), not a detail of this one
            if report["kernel"] is None and (loc := parse_location(follow)):
                report.update(loc)
            if m := _THREAD.search(follow):
                report["thread"] = [int(x) for x in m.group(1).split(",")]
                report["block"] = [int(x) for x in m.group(2).split(",")]
            if report["address"] is None and (m := _ADDRESS.search(follow)):
                report["address"] = m.group(1)
                report["address_note"] = m.group(2).strip()
            if report["allocation"] is None and (m := _ALLOCATION.search(follow)):
                report["allocation"] = {"base": m.group(4), "size": _int(m.group(5)),
                                        "where": m.group(2) or m.group(3),
                                        "distance": None if m.group(1) is None else _int(m.group(1))}
        report["errors"] = count
        return report
    return None


def replay_under_sanitizer(case, path: Path, spec, tool: str, timeout_s: float = 600.0) -> int:
    if spec.backend != "cuda":
        from ..engine.tiers import SetupError

        raise SetupError("--sanitizer needs --backend cuda (compute-sanitizer checks GPU kernels)")
    exe = shutil.which("compute-sanitizer") or next(
        (p for p in ("/usr/local/cuda/bin/compute-sanitizer",) if os.path.exists(p)), None)
    if exe is None:
        from ..engine.tiers import SetupError

        raise SetupError("--sanitizer: compute-sanitizer is not on PATH (it ships with the CUDA toolkit)")
    cmd = [exe, "--tool", tool, "--print-limit", "20", sys.executable, "-m", "fuzz", "replay", str(path),
           "--in-process", "--backend", "cuda"]
    if spec.kernels:
        cmd += ["--kernels", spec.kernels]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
        text = proc.stdout + "\n" + proc.stderr
    except subprocess.TimeoutExpired as exc:
        text = (exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(errors="replace")
        proc = None
    report = parse_report(text)
    case.extra["sanitizer"] = {"tool": tool, "report": report,
                               "exit": None if proc is None else proc.returncode}
    case.write(path)
    if report is None:
        print(f"{tool}: no error reported for {path} (replay exit {None if proc is None else proc.returncode})")
        return 0 if proc is not None and proc.returncode == 0 else 1
    at = f" at {report['file']}:{report['line']}" if report.get("file") else " (no line info)"
    where = f"kernel {report['kernel']}{at}, thread {report['thread']} of block {report['block']}, " \
            f"address {report['address']} {report.get('address_note') or ''}".strip()
    print(f"FAIL {path}: {tool}: {report['error']} ({where}); {report['errors']} error(s); stored in the case")
    return 1
