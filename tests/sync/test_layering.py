"""fuzz/sync has no import circle: the rule families sit under the registry, the command line above the library.

Every import counts (inside functions too), except those under ``if TYPE_CHECKING:``.
An import of a module's name pulls in that module (a package: its ``__init__``).
"""

from __future__ import annotations

import ast
import os

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
TOP = os.path.join(REPO, "fuzz", "sync")


def _modules() -> dict[str, str]:
    out = {}
    for root, _dirs, files in os.walk(TOP):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(root, f)
                name = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
                out[name.removesuffix(".__init__")] = path
    return out


def _edges(mods: dict[str, str]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        tree = ast.parse(open(path).read())
        typing_only = {id(n) for node in ast.walk(tree)
                       if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                       for n in ast.walk(node)}
        package = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*parts, *([node.module] if node.module else [])])
                subs = {f"{base}.{a.name}" for a in node.names} & set(mods)
                targets = subs | ({base} if len(subs) < len(node.names) else set())
            elif isinstance(node, ast.Import):
                targets = {a.name for a in node.names}
            else:
                continue
            edges[mod] |= {t for t in targets if t in mods and t != mod}
    return edges


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each circle once, as the path from its first module back to it."""
    out, done = [], set()

    def visit(m: str, path: list[str]) -> None:
        for n in sorted(edges[m]):
            if n in path:
                out.append(path[path.index(n):] + [n])
            elif n not in done:
                visit(n, [*path, n])
        done.add(m)

    for m in sorted(edges):
        if m not in done:
            visit(m, [m])
    return out


def test_fuzz_sync_has_no_import_circle():
    assert _circles(_edges(_modules())) == []


def test_the_rule_families_import_the_records_and_not_the_registry():
    edges = _edges(_modules())
    families = [m for m in edges if m.startswith("fuzz.sync.static.rules.")]
    assert len(families) >= 5
    for fam in families:
        assert "fuzz.sync.static.records" in edges[fam] and "fuzz.sync.static.registry" not in edges[fam], fam
    assert set(families) <= edges["fuzz.sync.static.registry"]  # collected by name, in one place
    assert edges["fuzz.sync.static.records"] == set()  # a leaf


def test_the_library_never_imports_the_command_line():
    edges = _edges(_modules())
    library = [m for m in edges if m.startswith("fuzz.sync.static") and m != "fuzz.sync.static.__main__"]
    assert [m for m in library if "fuzz.sync.cli" in edges[m]] == []
    assert "fuzz.sync.static" in edges["fuzz.sync.cli"]


def test_the_circle_finder_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
