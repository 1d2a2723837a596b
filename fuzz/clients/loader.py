"""Loading a server's kernel files by path, without importing the server.

A server's top-level package imports its runtime (SGLang's ``__init__`` reaches
transformers, FlashInfer, its scheduler), none of which a kernel file needs, and none of
which a CPU-only CI machine has. So an adapter locates the installed files instead:

- through the distribution's metadata (``importlib.metadata``, which searches
  ``sys.path``: a ``pip install --target DIR`` on ``PYTHONPATH`` is found like a site
  install), or, for a source checkout without metadata, through ``PathFinder``, which
  finds the package directory on ``sys.path`` without executing its ``__init__``;
- then executes only the files it names, each under a private module name, so a process
  that also runs the server never sees two modules under one name.

While such a file executes, an import of the server's own package is refused with an
``ImportError`` naming it (a release whose kernel file starts to import its package
fails with a clear message rather than pulling in the runtime). An import made later,
inside a function at call time, is not intercepted.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from ..engine.tiers import SetupError


@dataclass(frozen=True)
class Located:
    """Where a server's files are: ``root`` holds its top-level package directory."""

    root: Path
    version: str | None  # from the distribution's metadata; None for a checkout without it
    found_by: str  # "distribution" or "path"

    def file(self, relative: str) -> Path:
        return self.root / relative


def locate(dist: str, package: str, files: tuple[str, ...], hint: str) -> Located:
    """The installed ``dist`` whose tree holds every path of ``files`` (relative to the
    directory above ``package``); SetupError with ``hint`` when there is none."""
    tried = []
    try:
        d = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        d = None
    if d is not None:
        found = Located(Path(d.locate_file("")), d.version, "distribution")
        if all(found.file(f).is_file() for f in files):
            return found
        tried.append(f"distribution {dist} {d.version} at {found.root}")
    spec = importlib.machinery.PathFinder.find_spec(package)  # locates; executes nothing
    if spec is not None and spec.submodule_search_locations:
        for where in spec.submodule_search_locations:
            found = Located(Path(where).parent, None, "path")
            if all(found.file(f).is_file() for f in files):
                return found
            tried.append(f"package {package} at {where}")
    if not tried:
        raise SetupError(f"{dist} is not installed (no distribution, no {package} package on sys.path): {hint}")
    missing = ", ".join(f for f in files)
    raise SetupError(f"{dist}: {'; '.join(tried)} lacks one of {missing}: {hint}")


class _Refuse(importlib.abc.MetaPathFinder):
    def __init__(self, package: str, hint: str):
        self.package, self.hint = package, hint

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.package or fullname.startswith(self.package + "."):
            raise ImportError(f"{fullname}: the adapter loads single kernel files and refuses to import "
                              f"the {self.package} package ({self.hint})", name=fullname)
        return None


@contextlib.contextmanager
def _refusing(package: str, hint: str):
    finder = _Refuse(package, hint)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


def load_file(private_name: str, path: Path, package: str, hint: str) -> ModuleType:
    """Execute ``path`` as module ``private_name`` (once per process), refusing imports
    of ``package`` meanwhile; SetupError when it cannot be executed."""
    if private_name in sys.modules:
        return sys.modules[private_name]
    spec = importlib.util.spec_from_file_location(private_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[private_name] = module  # Triton and dataclasses look a module up by name
    try:
        with _refusing(package, hint):
            spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[private_name]
        raise SetupError(f"loading {path} failed: {type(exc).__name__}: {exc}") from exc
    return module
