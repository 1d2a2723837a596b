"""Settings: defaults, then ``[tool.kvfuzz.check-sync]`` of the checked project, then the command line.

Why the checked project's ``pyproject.toml``: the entry points of an allocator are the
project's own vocabulary (``free_group_end``, ``release_req``), and CI, pre-commit and a
developer's shell should all check with the same ones without repeating flags.

Keys (all optional)::

    [tool.kvfuzz.check-sync]
    paths = ["src/pool"]              # what to check when no PATH is given (relative to this file)
    roots = ["free", "free_*"]        # replaces the default entry-point patterns
    extend-roots = ["release_req"]    # adds to them
    select = ["SYNC"]                 # codes or prefixes
    ignore = ["SYNC19"]
    strict = ["error-path"]           # allowed-region kinds to report anyway
    exclude = ["legacy/*"]            # globs on paths found under a directory
    include-tests = false             # check tests and fixtures found under a directory
    output-format = "text"
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from . import vocab
from .model import display_path
from .regions import KINDS

FORMATS = ("text", "json", "github", "sarif")
STRICT_CHOICES = (*KINDS, "all")


class ConfigError(ValueError):
    """A bad setting: exit 2 with the message."""


@dataclass
class Settings:
    paths: tuple[str, ...] = ()
    roots: tuple[str, ...] = vocab.DEFAULT_ROOTS
    strict: frozenset[str] = frozenset()
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    include_tests: bool = False
    output_format: str = "text"
    source: str | None = None  # the pyproject.toml read, if any


_LIST_KEYS = {"paths", "roots", "extend-roots", "select", "ignore", "strict", "exclude"}
_KEYS = _LIST_KEYS | {"include-tests", "output-format"}


def _toml():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            return None
    return tomllib


def find_pyproject(paths: list[str]) -> str | None:
    """The nearest pyproject.toml above the first path (or the working directory)."""
    start = os.path.abspath(paths[0]) if paths else os.getcwd()
    directory = start if os.path.isdir(start) else os.path.dirname(start)
    while True:
        cand = os.path.join(directory, "pyproject.toml")
        if os.path.isfile(cand):
            return cand
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


def strict_kinds(items) -> frozenset[str]:
    out: set[str] = set()
    for raw in items:
        for item in (p.strip() for p in raw.split(",")):
            if not item:
                continue
            if item not in STRICT_CHOICES:
                raise ConfigError(f"strict: {item!r} is not an allowed-region kind (choose from "
                                  f"{', '.join(STRICT_CHOICES)})")
            out |= set(KINDS) if item == "all" else {item}
    return frozenset(out)


def load(path: str | None) -> Settings:
    """Settings from a pyproject.toml (defaults when it has no ``[tool.kvfuzz.check-sync]``)."""
    settings = Settings()
    if path is None:
        return settings
    toml = _toml()
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from e
    if b"check-sync" not in raw:
        return settings
    if toml is None:
        raise ConfigError(f"{path}: reading [tool.kvfuzz.check-sync] on Python < 3.11 needs tomli "
                          "(pip install tomli)")
    try:
        data = toml.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, toml.TOMLDecodeError) as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from e
    section = data.get("tool", {}).get("kvfuzz", {}).get("check-sync")
    if section is None:
        return settings
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: [tool.kvfuzz.check-sync] must be a table")
    settings.source = path
    unknown = set(section) - _KEYS
    if unknown:
        raise ConfigError(f"{path}: [tool.kvfuzz.check-sync]: unknown key(s) {', '.join(sorted(unknown))} "
                          f"(known: {', '.join(sorted(_KEYS))})")
    for key in _LIST_KEYS & set(section):
        value = section[key]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{path}: [tool.kvfuzz.check-sync] {key} must be a list of strings")
    base = os.path.dirname(os.path.abspath(path))
    settings.paths = tuple(display_path(os.path.join(base, p)) for p in section.get("paths", ()))
    if "roots" in section:
        settings.roots = tuple(section["roots"])
    settings.roots += tuple(section.get("extend-roots", ()))
    settings.select = tuple(section.get("select", ()))
    settings.ignore = tuple(section.get("ignore", ()))
    settings.exclude = tuple(section.get("exclude", ()))
    settings.strict = strict_kinds(section.get("strict", ()))
    if "include-tests" in section:
        if not isinstance(section["include-tests"], bool):
            raise ConfigError(f"{path}: [tool.kvfuzz.check-sync] include-tests must be true or false")
        settings.include_tests = section["include-tests"]
    if "output-format" in section:
        if section["output-format"] not in FORMATS:
            raise ConfigError(f"{path}: [tool.kvfuzz.check-sync] output-format must be one of {', '.join(FORMATS)}")
        settings.output_format = section["output-format"]
    return settings
