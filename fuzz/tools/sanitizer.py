"""``kvfuzz replay CASE --sanitizer memcheck``: replay a case under NVIDIA's compute-sanitizer.

A CUDA fault case says *that* a kernel touched memory it should not have; the sanitizer
says *which* kernel, which thread of which block, and which address. The replay runs in a
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
_INVALID = re.compile(r"(Invalid .*|.*(?:out of bounds|misaligned|race|uninitialized).*)", re.IGNORECASE)
_AT = re.compile(r"^\s*at (?:0x[0-9a-f]+ in )?([^\s+(]+)(?:\+0x[0-9a-f]+)?", re.IGNORECASE)
_THREAD = re.compile(r"by thread \(([\d,\s]+)\) in block \(([\d,\s]+)\)")
_ADDRESS = re.compile(r"(?:Address|Access at) (0x[0-9a-f]+)(.*)", re.IGNORECASE)
_SUMMARY = re.compile(r"ERROR SUMMARY:\s*([\d,]+) error", re.IGNORECASE)


def parse_report(text: str) -> dict | None:
    """The first error compute-sanitizer reported (what, kernel, thread, block, address),
    and its error count; None when it reported none."""
    lines = [_PREFIX.sub("", line) for line in text.splitlines() if line.startswith("=")]
    count = next((int(m.group(1).replace(",", "")) for line in lines if (m := _SUMMARY.search(line))), None)
    for i, line in enumerate(lines):
        if not line.startswith(("Invalid", "Race", "Uninitialized", "Misaligned")) and not (
                line and _INVALID.fullmatch(line.strip()) and "ERROR SUMMARY" not in line and i < len(lines) - 1
                and _AT.match(lines[i + 1])):
            continue
        report = {"error": line.strip(), "kernel": None, "thread": None, "block": None, "address": None,
                  "lines": [x.rstrip() for x in lines[i:i + 8]]}
        for follow in lines[i + 1:i + 8]:
            if report["kernel"] is None and (m := _AT.match(follow)):
                report["kernel"] = m.group(1)
            if m := _THREAD.search(follow):
                report["thread"] = [int(x) for x in m.group(1).split(",")]
                report["block"] = [int(x) for x in m.group(2).split(",")]
            if report["address"] is None and (m := _ADDRESS.search(follow)):
                report["address"] = m.group(1)
                report["address_note"] = m.group(2).strip()
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
    where = f"kernel {report['kernel']}, thread {report['thread']} of block {report['block']}, " \
            f"address {report['address']} {report.get('address_note', '')}".strip()
    print(f"FAIL {path}: {tool}: {report['error']} ({where}); {report['errors']} error(s); stored in the case")
    return 1
