"""check-sync on layouts without ``__init__.py``: a flat folder of modules, a namespace package.

Calls across modules must be followed there exactly as in a regular package: each
fixture's findings are held to its markers as it is, and again once ``__init__.py``
files are added to a copy of it.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import sys

import pytest

from fuzz.sync import static
from fuzz.sync.runtime import record_host_syncs

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(os.path.dirname(HERE), "fixtures", "sync")
LAYOUTS = {"flat_pool": "allocator.py", "ns_pool": os.path.join("core", "allocator.py")}
MARKER = re.compile(r"# (expect: (?P<code>SYNC\d\d) from (?P<entry>\S+)|quiet)")


def _markers(top: str) -> tuple[dict, set]:
    """(path relative to ``top``, line) -> (code, entry), and the quiet lines."""
    expect, quiet = {}, set()
    for root, _dirs, files in os.walk(top):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(root, name), top)
            for i, line in enumerate(open(os.path.join(root, name)), 1):
                m = MARKER.search(line)
                if m and m.group("code"):
                    expect[(rel, i)] = (m.group("code"), m.group("entry"))
                elif m:
                    quiet.add((rel, i))
    return expect, quiet


def _found(report, top: str) -> dict:
    return {(os.path.relpath(f.path, top), f.line): (f.code, f.entry) for f in report.findings}


def _copy(tmp_path, layout: str, with_init: bool) -> str:
    top = str(tmp_path / layout)
    shutil.copytree(os.path.join(FIXTURES, layout), top, ignore=shutil.ignore_patterns("__pycache__"))
    if with_init:
        for root, _dirs, _files in os.walk(top):
            open(os.path.join(root, "__init__.py"), "w").close()
    return top


@pytest.mark.parametrize("with_init", [False, True], ids=["no-init", "with-init"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_calls_across_modules_are_followed_with_or_without_init_files(tmp_path, layout, with_init):
    expect, quiet = _markers(os.path.join(FIXTURES, layout))
    assert len(expect) >= 3 and quiet  # the fixture still has its traps
    top = _copy(tmp_path, layout, with_init)
    report = static.check_paths(static.discover.expand([top]))
    assert not report.errors
    assert _found(report, top) == expect
    assert not {k for k in _found(report, top)} & quiet


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_one_file_given_follows_its_imports_without_init_files(layout):
    """Only the allocator named: its imports into the namespace package are loaded on demand."""
    top = os.path.join(FIXTURES, layout)
    expect, _ = _markers(top)
    report = static.check_paths([os.path.join(top, LAYOUTS[layout])])
    assert _found(report, top) == expect


def test_the_chain_names_the_module_of_each_hop():
    top = os.path.join(FIXTURES, "ns_pool")
    report = static.check_paths(static.discover.expand([top]))
    chains = {os.path.relpath(f.path, top): f.chain_text for f in report.findings}
    assert chains[os.path.join("util", "_tables.py")] == (
        "NsPool.free → count_live (helpers.py) → live_pages (_tables.py)")


def test_a_relative_import_finds_its_own_sibling_not_a_namesake():
    """``core/_tables.py`` and ``util/_tables.py`` share a name; each subpackage's import finds its own."""
    top = os.path.join(FIXTURES, "ns_pool")
    report = static.check_paths(static.discover.expand([top]))
    core = report.files[os.path.join(top, "core", "_tables.py")]
    assert "mark_dead" in core.reached and "live_pages" in core.unreached
    util = report.files[os.path.join(top, "util", "_tables.py")]
    assert "live_pages" in util.reached


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_fixtures_are_real_namespace_packages_and_sync_where_marked(monkeypatch, layout):
    """Imported as Python imports them (no ``__init__.py``), each planted line syncs at run time."""
    import torch

    monkeypatch.syspath_prepend(FIXTURES)
    ours = lambda: [m for m in sys.modules if m == layout or m.startswith(layout + ".")]  # noqa: E731
    assert ours() == []
    try:
        mod = importlib.import_module(f"{layout}.{LAYOUTS[layout][:-3].replace(os.sep, '.')}")
        assert getattr(sys.modules[layout], "__file__", None) is None  # a namespace package indeed
        pool = next(getattr(mod, n) for n in dir(mod) if n.endswith("Pool"))()
        pages = torch.tensor([1, 2, 3])
        with record_host_syncs() as events:
            pool.free(pages)
    finally:
        for name in ours():
            del sys.modules[name]
    top = os.path.join(FIXTURES, layout)
    got = {(os.path.relpath(e.filename, top), e.lineno) for e in events}
    expect, _ = _markers(top)
    assert got == set(expect)


def test_a_flat_folder_imports_its_own_neighbour_before_a_namesake_elsewhere(tmp_path):
    """Two flat folders checked together, each with its own ``helpers.py``: ``import helpers`` is the neighbour."""
    for name, body in (("a", "    return pages.numel()\n"), ("b", "    return pages.max().item()\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "helpers.py").write_text("import torch\n\ndef count(pages: torch.Tensor):\n" + body)
        (tmp_path / name / "pool.py").write_text(
            "import torch\nimport helpers\n\ndef free(pages: torch.Tensor):\n    return helpers.count(pages)\n")
    report = static.check_paths(static.discover.expand([str(tmp_path / "a"), str(tmp_path / "b")]))
    assert [(os.path.relpath(f.path, tmp_path), f.code, f.chain_text) for f in report.findings] == [
        (os.path.join("b", "helpers.py"), "SYNC01", "free → count (helpers.py)")]
