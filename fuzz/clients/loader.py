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

import ast
import builtins
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


# ---- executing a server's file with its imports answered ------------------------------------------


def stand_in_module(name: str, **members) -> ModuleType:
    """A module of the given members, answering one import of a server's file."""
    m = ModuleType(name)
    m.__dict__.update(members)
    return m


def _importer(answers: dict, package: str, note: str):
    real = builtins.__import__

    def imp(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and name in answers:
            return answers[name]
        if level == 0 and (name == package or name.startswith(package + ".")):
            raise ImportError(f"{name}: the adapter answers this file's imports itself and has no stand-in for "
                              f"this one ({note})", name=name)
        return real(name, globals, locals, fromlist, level)

    return imp


def execute(private: str, source, path: str, answers: dict, package: str, note: str) -> ModuleType:
    """Execute ``source`` (a file's text, or an ``ast.Module`` of some of its statements,
    compiled with the file's own line numbers) as module ``private``, each ``import`` of a
    name in ``answers`` answered by it and any other import of ``package`` refused;
    SetupError when it cannot be executed."""
    module = ModuleType(private)
    module.__file__ = path
    module.__dict__["__builtins__"] = dict(builtins.__dict__, __import__=_importer(answers, package, note))
    sys.modules[private] = module  # dataclasses and typing look a module up by name
    try:
        exec(compile(source, path, "exec"), module.__dict__)  # noqa: S102 - the server's own file
    except Exception as exc:
        del sys.modules[private]
        raise SetupError(f"executing {path} failed: {type(exc).__name__}: {exc}") from exc
    return module


def definitions(path: Path, names: tuple[str, ...]) -> ast.Module:
    """The statements of the file at ``path`` that a module of only ``names`` needs: its
    imports, its module-level assignments and the definitions of ``names`` (a class of the
    file that derives from a runtime it cannot load is left out, with what uses it)."""
    tree = ast.parse(path.read_text(), str(path))
    keep = [node for node in tree.body
            if isinstance(node, (ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign))
            or isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names]
    missing = set(names) - {n.name for n in keep if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    if missing:
        raise SetupError(f"{path} defines no {', '.join(sorted(missing))}")
    return ast.Module(body=keep, type_ignores=[])
