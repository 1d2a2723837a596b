"""The shape of the tree: no import circle in fuzz/, modules that hold one job, and no
branch on the scale outside the tracks (a third track must not need one)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FUZZ = REPO / "fuzz"
MAX_LINES = 550


def _modules() -> dict[str, Path]:
    mods = {}
    for path in FUZZ.rglob("*.py"):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


def _imports(name: str, path: Path, mods: dict) -> set[str]:
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test)
            for n in ast.walk(node)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            subs = {f"{base}.{a.name}" for a in node.names} & set(mods)
            out |= subs
            if len(subs) < len(node.names):
                out.add(base)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m in mods and m != name}


def test_no_import_circle_in_fuzz():
    mods = _modules()
    graph = {m: _imports(m, p, mods) for m, p in mods.items()}
    index, low, stack, on, circles = {}, {}, [], set(), []

    def visit(v, counter=[0]):  # noqa: B006 - Tarjan's running index
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert not circles, circles


def test_every_module_holds_one_job():
    big = {str(p.relative_to(REPO)): n for p in FUZZ.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not big, big


def test_only_the_tracks_ask_which_scale_runs():
    pattern = re.compile(r"""(==|!=)\s*["']production["']|["']production["']\s*(==|!=)""")
    hits = [f"{p.relative_to(REPO)}:{i}" for p in FUZZ.rglob("*.py") if "track" not in str(p)
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not hits, hits


ENGINE_ROWS = [  # README.md's engine table, leaf modules first
    ["verdict", "gate", "lazy", "budget"], ["oplang", "ops", "raw_ops"],
    ["memory", "boundary", "knobs", "vector_oracle", "signatures", "launches", "spec_features", "features", "sources", "tiers", "allocators",
     "zygote", "supervise", "health"],
    ["spec_side", "shapes", "generate"], ["runner", "strategies"], ["production", "compile_check"],
    ["tracks", "guide", "streams"],
    ["kinds", "dispatch"], ["case", "minimize", "slot"], ["worker", "head_start"], ["options", "confirm", "summary", "campaign"],
]


def test_the_engine_imports_only_downwards():
    """Each engine module imports only the rows above its own (README's table), so the leaf
    modules (verdict, the op records) can be read, and reused, without the rest."""
    rank = {m: i for i, row in enumerate(ENGINE_ROWS) for m in row}
    engine = FUZZ / "engine"
    upward = []
    for path in sorted(engine.rglob("*.py")):
        parts = path.relative_to(engine).with_suffix("").parts
        if parts == ("__init__",):
            continue
        assert parts[0] in rank, f"{path}: a module the README's engine table does not place"
        me = rank[parts[0]]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not node.level or (len(parts) > 1 and node.level == 1):
                continue  # absolute, or a sibling in the same subpackage
            top = (node.module or "").split(".")[0]
            for name in [top] if top else [a.name for a in node.names]:
                if name in rank and rank[name] > me:
                    upward.append(f"{'/'.join(parts)} imports {name} (line {node.lineno})")
    assert not upward, upward
