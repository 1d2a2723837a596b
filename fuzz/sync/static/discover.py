"""Which files a run checks.

Why tests are skipped under a directory: a test suite is full of fake pools whose
``free`` reads tensors back on purpose (the fixtures of this very checker are), and
checking them buries the allocator's findings. A file named on the command line is
always checked; under a directory, ``test_*.py``, ``*_test.py``, ``conftest.py`` and
directories named ``tests``, ``test`` or ``fixtures`` are left out unless
``--include-tests``. Hidden directories, ``__pycache__`` and virtual environments are
never entered.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import os
from collections.abc import Sequence

from .model import ParseError, display_path

TEST_DIRS = {"tests", "test", "fixtures"}


def is_test_file(name: str) -> bool:
    return name == "conftest.py" or (name.startswith("test_") and name.endswith(".py")) or name.endswith("_test.py")


def _excluded(rel: str, patterns: Sequence[str]) -> bool:
    rel = rel.replace(os.sep, "/")
    return any(fnmatch.fnmatchcase(rel, p) or fnmatch.fnmatchcase(os.path.basename(rel), p) for p in patterns)


def expand(paths: Sequence[str], *, include_tests: bool = False, exclude: Sequence[str] = ()) -> list[str]:
    out: list[str] = []
    for p in paths:
        if not os.path.isdir(p):
            out.append(p)  # a missing file is reported when it is read
            continue
        for root, dirs, files in os.walk(p):
            dirs[:] = sorted(
                d for d in dirs
                if not d.startswith(".") and d != "__pycache__"
                and not os.path.exists(os.path.join(root, d, "pyvenv.cfg"))
                and (include_tests or d not in TEST_DIRS)
                and not _excluded(os.path.relpath(os.path.join(root, d), p), exclude))
            for f in sorted(files):
                if not f.endswith(".py") or (not include_tests and is_test_file(f)):
                    continue
                full = os.path.join(root, f)
                if not _excluded(os.path.relpath(full, p), exclude):
                    out.append(full)
    return out


def default_paths() -> list[str]:
    """Our allocator sources, located through the installed (or importable) kvkernels package."""
    spec = importlib.util.find_spec("kvkernels")
    if spec is None or not spec.submodule_search_locations:
        raise ParseError("kvkernels is not importable: cannot locate the default allocator sources")
    base = list(spec.submodule_search_locations)[0]
    return [display_path(os.path.join(base, name)) for name in ("allocator.py", "launchers.py")]
