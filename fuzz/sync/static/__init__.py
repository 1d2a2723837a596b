"""Static no-host-sync check over allocator sources (SPEC.md §5, oracle 5, first of three).

``kvfuzz check-sync [PATH…]`` parses Python files (no import, no execution), finds the
free paths from their entry points, and reports every form of SPEC.md §5 that makes the
host wait for the GPU. Exit 1 on findings, 2 on a usage error or a path that cannot be
read or parsed, 0 when clean. ``docs/check-sync.md`` is the user guide; the rules table
there and in ``--help`` is generated from the registry.

This package is the library (``check_paths``, ``check_file``, ``check_source``); the
command line, ``fuzz.sync.cli``, sits above it and nothing here imports it
(``python -m fuzz.sync.static`` runs it through ``__main__``, the one script).

The package, one job per module:

- ``vocab``: names and torch API facts; the default entry-point patterns.
- ``model``: parsed modules, imports, classes and their MRO across the checked tree.
- ``kinds``: what an expression holds (page table, tensor, mask, host tensor, scalar).
- ``regions``: allowed regions (eager, error path, CPU-only, checked mode, flush).
- ``checker``: one function in one calling context; hands AST events to the rules.
- ``records``: the ``Rule`` and ``Family`` record types (a leaf).
- ``rules/``: one module per rule family, each rule a ``records.Rule``; ``registry`` collects them.
- ``reach``: entry points, call following, one finding per line with its chain.
- ``config``, ``discover``, ``output``: settings, files to check, the four formats.

Why parse and not import: the check runs in CI and pre-commit on code whose
dependencies may not be installed, and must never execute it.

Limits (the calibration corpus, ``fuzz.sync.calibrate``, measures their cost against a
GPU): a helper's result is a tensor only when its return annotation says so; a table
reached only through a container or ``getattr`` is unknown; a Python-scalar store whose
right-hand side is an unannotated parameter is not reported; calls through variables,
decorators or attributes holding modules (``self.kernels.f()``) are not followed;
``table[i] = -1`` on a table that is not 1-D is reported although a row fill would not
synchronise; an entry point the patterns do not name is not checked (``-v`` notes the
unreached functions that tombstone a table).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from .config import Settings
from .discover import default_paths
from .model import ParseError, Project
from .reach import Analysis, FilePlan, Finding, Report
from .registry import all_rules, selected_codes
from .vocab import DEFAULT_ROOTS, matches_root, name_words

__all__ = ["DEFAULT_ROOTS", "FilePlan", "Finding", "ParseError", "Report", "all_rules", "check_file",
           "check_paths", "check_source", "default_paths", "matches_root", "name_words"]


def _analysis(project: Project, roots: Sequence[str], strict: Sequence[str], codes: set[str] | None) -> Analysis:
    return Analysis(project, roots=(*DEFAULT_ROOTS, *roots), strict=frozenset(strict), codes=codes)


def check_source(source: str, path: str = "<string>", *, roots: Sequence[str] = (), strict: Sequence[str] = (),
                 codes: set[str] | None = None) -> FilePlan:
    """Check one module's source on its own. ``roots`` adds entry-point patterns (names or ``Cls.name``)."""
    project = Project()
    project.add_source(source, path)
    return _analysis(project, roots, strict, codes).run().files[path]


def check_file(path: str, *, roots: Sequence[str] = (), strict: Sequence[str] = (),
               codes: set[str] | None = None) -> FilePlan:
    """Check one file, following its imports into the same tree; the plan of that file."""
    project = Project()
    project.add_file(path)
    return _analysis(project, roots, strict, codes).run().files[path]


def check_paths(files: Sequence[str], settings: Settings | None = None) -> Report:
    """Check files together (a base class in one, its subclass in another); unreadable ones become errors."""
    settings = settings or Settings()
    project = Project()
    errors = []
    unique: dict[str, str] = {}
    for f in files:  # a file given twice (by name and under its directory) is checked once
        unique.setdefault(os.path.realpath(f), f)
    files = list(unique.values())
    for path in files:
        try:
            project.add_file(path)
        except ParseError as e:
            errors.append(str(e))
    codes = selected_codes(settings.select, settings.ignore)
    report = Analysis(project, roots=settings.roots, strict=settings.strict, codes=codes).run()
    report.errors = errors
    report.n_files = len(files)
    return report
