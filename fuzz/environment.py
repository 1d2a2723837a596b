"""Where a result came from: one ``environment()`` for case files, benchmarks, summaries
and the GPU sync ground truth, so every record names its machine the same way.

Imports nothing of kvfuzz and nothing heavy at import time: torch and Triton are read
only if the caller already could import them (a case written on a torch-only box says
``triton: None`` rather than failing).
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path


def kvfuzz_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("kvfuzz")
    except metadata.PackageNotFoundError:
        return None


def git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def environment() -> dict:
    """kvfuzz, Python, torch (and its CUDA), Triton, the GPU, the host, the git sha."""
    env = {"kvfuzz": kvfuzz_version(), "python": platform.python_version(), "platform": platform.platform(),
           "machine": platform.machine(), "cpu_count": os.cpu_count(), "git_sha": git_sha()}
    try:
        import torch

        env["torch"] = torch.__version__
        env["cuda"] = torch.version.cuda
        env["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        env.update(torch=None, cuda=None, gpu=None)
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    return env
