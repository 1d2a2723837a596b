"""Where a kernel set's or an allocator's source is, found without importing it, and its hash.

The supervisor never imports the code under test, yet a case must say which code it was
found on (``environment.kernels_sha256``) and find that code again from wherever the case
is replayed (a file named relative to where the campaign ran, or to the case file).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def resolve_kernels(kernels: str | None, case_path: str | Path | None, kernels_file: str | None = None) -> str | None:
    """The kernel set of a case, wherever it is replayed from: a file named relative to
    where the campaign ran is looked for there (the current directory), then where the
    case file says it is (``kernels_file``, relative to the case), then in each folder
    above the case (a case moved into a repo's tests)."""
    if not kernels or not kernels.endswith(".py") or Path(kernels).is_file() or not case_path:
        return kernels
    here = Path(case_path).resolve().parent
    if kernels_file and (here / kernels_file).is_file():
        return str((here / kernels_file).resolve())
    for folder in (here, *here.parents):
        if (folder / kernels).is_file():
            return str(folder / kernels)
    return kernels


def source_hash(kernels: str | None) -> str | None:
    """sha256 of a kernel set's source: its file, or every .py file of its package; found
    without importing it (the supervisor never imports a kernel set)."""
    import hashlib
    from importlib.machinery import PathFinder

    if not kernels:
        return None
    if kernels.endswith(".py"):
        files = [Path(kernels)] if Path(kernels).is_file() else []
    else:
        parts = kernels.split(".")
        spec = PathFinder.find_spec(parts[0])
        base = Path(spec.origin).parent if spec and spec.origin and spec.origin.endswith("__init__.py") else None
        target = None
        if base is not None:
            target = base.joinpath(*parts[1:])
            target = target if target.is_dir() else target.with_suffix(".py")
        elif spec and spec.origin and len(parts) == 1:
            target = Path(spec.origin)
        files = sorted(target.rglob("*.py")) if target and target.is_dir() else [target] if target and target.is_file() else []
    if not files:
        return None
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.read_bytes())
    return digest.hexdigest()


def load_file(path: Path, what: str, flag: str, name: str) -> ModuleType:
    """The module in a ``.py`` file, imported once per process under a private name
    (``kvfuzz_WHAT_HASH``); an import that fails is a SetupError naming ``flag NAME``."""
    from .verdict import SetupError

    mod_name = f"kvfuzz_{what}_{abs(hash(str(path.resolve())))}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[mod_name]
        raise SetupError(f"{flag} {name}: importing it failed: {type(exc).__name__}: {exc}") from exc
    return module
