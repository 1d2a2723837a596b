"""Where a result came from: one ``environment()`` for case files, benchmarks, summaries
and the GPU sync ground truth, so every record names its machine the same way.

Imports nothing of kvfuzz and nothing heavy, at import time or when called: the versions
come from the installed packages (a case written on a torch-only box says ``triton: None``).
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path


def kvfuzz_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("kvfuzz")
    except metadata.PackageNotFoundError:
        return None


_HERE = Path(__file__).resolve().parent


def git_sha() -> str | None:
    """The commit of the checkout kvfuzz runs from; None for an installed copy (a wheel in a
    virtual environment inside some other repository is not that repository's code)."""
    if _git(["ls-files", "--error-unmatch", "--", Path(__file__).name]) is None:
        return None
    out = _git(["rev-parse", "HEAD"])
    return (out or "").strip() or None


def git_dirty(where: Path | None = None) -> bool | None:
    """Whether tracked files differ from ``git_sha``'s commit: a tree copied over an older
    ``.git`` (a GPU machine's copy of a working tree) names that commit, and says so here."""
    out = _git(["status", "--porcelain", "--untracked-files=no"], where)
    return None if out is None else bool(out.strip())


@functools.lru_cache(maxsize=1)
def _git_state() -> dict:
    """The checkout's commit and whether the tree differs from it, asked once per process: a
    campaign writes a case per finding, and asking again would run ``git`` three times a case."""
    sha = git_sha()
    return {"git_sha": sha, "git_dirty": git_dirty() if sha else None}


def _git(args: list[str], where: Path | None = None) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=5,
                             cwd=where or _HERE)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def environment() -> dict:
    """kvfuzz, Python, torch (and its CUDA), Triton, the GPU, the host, the git sha (and whether
    the tree differs from it).

    Imports neither torch nor Triton: a campaign's parent writes case files and its summary,
    and importing torch there would cost it 2-3 CPU s (``engine/lazy.py``) and, to name the
    GPU, a CUDA context of its own on a GPU its workers share. The versions are read from the
    packages' own files (``torch/version.py``, ``triton/__init__.py``: what ``__version__``
    would say, whichever distribution installed them), the GPU from torch where this process
    has already initialized CUDA, else from ``nvidia-smi``."""
    env = {"kvfuzz": kvfuzz_version(), "python": platform.python_version(), "platform": platform.platform(),
           "machine": platform.machine(), "cpu_count": os.cpu_count()}
    env.update(_git_state())
    env.update(torch=_declared("torch", "version.py", "__version__"), cuda=_declared("torch", "version.py", "cuda"),
               gpu=_gpu_name(), triton=_declared("triton", "__init__.py", "__version__"))
    return env


def _declared(package: str, filename: str, name: str) -> str | None:
    """``package.name`` as the package's ``filename`` assigns it (a literal), without importing
    the package; from the module itself where this process has imported it already."""
    module = sys.modules.get(package if filename == "__init__.py" else f"{package}.{filename[:-3]}")
    if module is not None and hasattr(module, name):
        return getattr(module, name)
    import ast
    from importlib.util import find_spec

    try:
        spec = find_spec(package)
        source = Path(spec.submodule_search_locations[0], filename).read_text()
    except (ImportError, AttributeError, TypeError, IndexError, OSError, ValueError):
        return None
    for node in ast.parse(source).body:
        target = getattr(node, "target", None) or (node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == name and node.value is not None:
            try:
                return ast.literal_eval(node.value)
            except ValueError:
                return None
    return None


def _gpu_name() -> str | None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return torch.cuda.get_device_name(torch.cuda.current_device())
    if not shutil.which("nvidia-smi"):
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    if visible in ("", "-1"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", visible],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
