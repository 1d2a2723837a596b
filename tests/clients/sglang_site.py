"""SGLang 0.5.23 installed for the client tests: ``pip install --no-deps --target`` into a
temporary directory (never into kvfuzz's environment) from a cached download of its wheel.

The wheel is downloaded once into a cache (``$KVFUZZ_WHEEL_CACHE``, default
``~/.cache/kvfuzz/wheels``) and installed from there with ``--no-index``, once per test
session. Tests that need it skip, saying why, where SGLang 0.5.23 cannot be had: Python
other than 3.11 (its only wheel is cp311) or no route to the package registry.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PIN = "sglang==0.5.23"
INSTALL_HINT = "pip install sglang==0.5.23 --no-deps"
PIP = (sys.executable, "-m", "pip", "--disable-pip-version-check", "--timeout", "15", "--retries", "1")


def _wheel_cache() -> Path:
    if os.environ.get("KVFUZZ_WHEEL_CACHE"):
        return Path(os.environ["KVFUZZ_WHEEL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvfuzz" / "wheels"


def _pip_failure(stderr: str) -> str:
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    offline = any(w in stderr for w in ("NewConnectionError", "Connection refused", "Name or service not known",
                                        "Temporary failure in name resolution", "Network is unreachable"))
    return (lines[-1] if lines else "no output") + (" (no route to the package registry)" if offline else "")


@pytest.fixture(scope="session")
def sglang_site(tmp_path_factory) -> str:
    """A directory holding SGLang 0.5.23 (``pip install --no-deps --target``), for PYTHONPATH."""
    if sys.version_info[:2] != (3, 11):
        pytest.skip(f"{PIN} ships a wheel for CPython 3.11 only; this is {sys.version.split()[0]}")
    cache = _wheel_cache()
    if not any(cache.glob("sglang-0.5.23-*.whl")):
        cache.mkdir(parents=True, exist_ok=True)
        got = subprocess.run([*PIP, "download", PIN, "--no-deps", "--only-binary", ":all:", "-d", str(cache)],
                             capture_output=True, text=True, timeout=600)
        if got.returncode:
            pytest.skip(f"pip cannot download {PIN}: {_pip_failure(got.stderr)}")
    site = tmp_path_factory.mktemp("sglang-site")
    done = subprocess.run([*PIP, "install", PIN, "--no-deps", "--no-compile", "--no-index", "--find-links", str(cache),
                           "--target", str(site), "-q"], capture_output=True, text=True, timeout=600)
    if done.returncode:
        pytest.skip(f"pip cannot install {PIN} from {cache}: {_pip_failure(done.stderr)}")
    return str(site)


def pythonpath(site: str) -> str:
    return os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH")) if p)


def skip_if_sglang_importable() -> None:
    """The setup-error tests need a Python where no SGLang is found (its kernels and its
    allocator both look it up on sys.path)."""
    r = subprocess.run([sys.executable, "-c", "import importlib.machinery as m; "
                        "print(m.PathFinder.find_spec('sglang') is not None)"],
                       capture_output=True, text=True, timeout=60)
    if r.stdout.strip() == "True":
        pytest.skip("sglang is importable in this environment")
