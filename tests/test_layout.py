"""The shape of the tree: no import circle in fuzz/ (imports under TYPE_CHECKING count: a reader
still meets both modules), modules that hold one job, no branch on the scale outside the tracks
(a third track must not need one), and no name or text that dates a change or names past work
(git keeps the when; the tree says what holds and why)."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

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
    out = set()
    for node in ast.walk(tree):  # every import, those under TYPE_CHECKING and inside functions too
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


def import_circles(mods: dict[str, Path]) -> list[list[str]]:
    """The strongly connected components of more than one module in the import graph (Tarjan)."""
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
    return circles


def test_no_import_circle_in_fuzz():
    circles = import_circles(_modules())
    assert not circles, "import circles in fuzz/: " + "; ".join(" <-> ".join(c) for c in circles)


def test_an_import_under_type_checking_still_closes_a_circle(tmp_path):
    pkg = tmp_path / "fuzz" / "p"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import X\n")
    mods = {".".join(p.relative_to(tmp_path).with_suffix("").parts).removesuffix(".__init__"): p
            for p in (tmp_path / "fuzz").rglob("*.py")}
    assert import_circles(mods) == [["fuzz.p.a", "fuzz.p.b"]]


def test_every_module_holds_one_job():
    big = {str(p.relative_to(REPO)): n for p in FUZZ.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not big, big


def test_only_the_tracks_ask_which_scale_runs():
    pattern = re.compile(r"""(==|!=)\s*["']production["']|["']production["']\s*(==|!=)""")
    hits = [f"{p.relative_to(REPO)}:{i}" for p in FUZZ.rglob("*.py") if "track" not in str(p)
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not hits, hits


ENGINE_ROWS = [  # docs/architecture.md's engine table, leaf modules first
    ["verdict", "gate", "lazy", "budget", "compile_tally", "stacks", "procfs"], ["oplang", "ops", "raw_ops", "chain_ops"],
    ["memory", "boundary", "knobs", "vector_oracle", "signatures", "launches", "spec_features", "features", "sources", "tiers", "allocators",
     "zygote", "supervise", "health"],
    ["spec_side", "shapes", "generate", "chain_gen"], ["runner", "strategies"], ["production", "compile_check"],
    ["tracks", "guide", "streams", "mutations", "aim", "corpus"],
    ["kinds", "dispatch", "scout"], ["case", "minimize", "lanes", "slot"], ["worker", "head_start"], ["options", "confirm", "summary", "campaign"],
]


def test_the_engine_imports_only_downwards():
    """Each engine module imports only the rows above its own (docs/architecture.md's table), so the leaf
    modules (verdict, the op records) can be read, and reused, without the rest."""
    rank = {m: i for i, row in enumerate(ENGINE_ROWS) for m in row}
    engine = FUZZ / "engine"
    upward = []
    for path in sorted(engine.rglob("*.py")):
        parts = path.relative_to(engine).with_suffix("").parts
        if parts == ("__init__",):
            continue
        assert parts[0] in rank, f"{path}: a module docs/architecture.md's engine table does not place"
        me = rank[parts[0]]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not node.level or (len(parts) > 1 and node.level == 1):
                continue  # absolute, or a sibling in the same subpackage
            top = (node.module or "").split(".")[0]
            for name in [top] if top else [a.name for a in node.names]:
                if name in rank and rank[name] > me:
                    upward.append(f"{'/'.join(parts)} imports {name} (line {node.lineno})")
    assert not upward, upward


# ---- no history in the tree ------------------------------------------------------------------
# A past work session is named "s" and its number ("s17"); these are the ways such a label is
# written. Each pattern needs the label's context (a session word, a parenthesis, a date before
# it), so hex digits, units ("5 s"), variables (`s0 = ...`) and "ops" do not match.
PAST_WORK = [
    re.compile(r"\b(?:session|sessions|before|after|since|until|from|as in)\s+s\d{1,2}\b", re.I),  # before s12
    re.compile(r"(?<![\w.\]])\(s\d{1,2}(?:\)|[,;:]\s+(?:one|two|the|an?|H\d+|\d)\b|\s+[a-z])"),  # (s17), (s10, one H200); not a call f(s1)
    re.compile(r"\bs\d{1,2}(?::\s+\d|\s+(?:did|measured|found|gave|had|ran|without|took)\b)"),  # s17: 1.7, s14 did
    re.compile(r"\d{4}-\d{2}-\d{2}-s\d{1,2}\b"),  # a results name after its date: ...-2026-12-02-s9
    re.compile(r"\b(?:for|in|of|during)\s+(?:one|an earlier|the last|a previous|the previous)\s+session\b", re.I),
    re.compile(r"\bearlier session\b", re.I),
    re.compile(r"\bissue \d+'s (?:session|fix|work|changes)\b", re.I),  # issue 25's session
    re.compile(r"\b(?:before|after|since) issue \d+\b", re.I),
    re.compile(r"\bgpu_session\w*", re.I),  # a run list named after the session that ran it
    re.compile(r"\bstops? \d{1,3}\b", re.I),  # a work session's own name for itself: "the CI flake of stop 36"
    re.compile(r"\b(?:as measured|as seen) today\b|\btoday's (?:tree|machine)\b", re.I),
    re.compile(r"\bmeasured\W{1,3}(?:on\s+)?20\d\d-\d\d-\d\d|\b20\d\d-\d\d-\d\d's\b", re.I),  # measured 2026-12-03
    re.compile(r"(?<![\w\"'])\(issues? \d+(?:[:;,)]|'s| item)", re.I),  # (issue 26), (issue 22: ...)
]
# What may keep a dated trail: the benchmark records' own text (their names are checked), and
# this file, whose patterns and examples would match themselves.
HISTORY_KEPT = ("benchmarks/results/",)


def past_work_labels(path: str, text: str) -> list[str]:
    """'path:line: text' for each line of a file that names past work."""
    return [f"{path}:{i}: {line.strip()[:160]}" for i, line in enumerate(text.splitlines(), 1)
            if any(p.search(line) for p in PAST_WORK)]


def _tree_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout
        return [f for f in out.splitlines() if (REPO / f).is_file()]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file but the usual caches
        skip = {".git", ".venv", "__pycache__", "kvfuzz-out", ".pytest_cache"}
        return [str(p.relative_to(REPO)) for p in REPO.rglob("*") if p.is_file() and not skip & set(p.parts)]


def test_no_name_or_text_in_the_tree_names_past_work():
    me = str(Path(__file__).relative_to(REPO))
    hits = []
    for rel in _tree_files():
        hits += past_work_labels(rel, rel)  # the name itself: benchmarks/results/h200-2026-12-02-s9/
        if rel == me or rel.startswith(HISTORY_KEPT):
            continue
        try:
            text = (REPO / rel).read_text()
        except (UnicodeDecodeError, OSError):
            continue
        hits += past_work_labels(rel, text)
    assert not hits, ("say what holds and why, not when it changed or which session did it:\n  "
                      + "\n  ".join(hits[:60]) + (f"\n  ... and {len(hits) - 60} more" if len(hits) > 60 else ""))


@pytest.mark.parametrize("line", [
    "One H200 (s17): 4.1 s of a cold first case", "pipelined between ops only (as before s12)",
    "benchmarks/results/guided-vs-blind-2026-12-02-s9.md", "the figure of session s18", "s10 measured it last",
    "The CI flake of stop 36: a case of rate 1/3", "(CI, stop 57: killed in <genexpr>)",
    "(s17: 1.7 / 9.5)", "It was opt-in for one session, after a test run", "Issue 25's session measured it",
    "bash benchmarks/gpu_session_17.sh b", "47 replays (measured 2026-12-03)", "on 2026-12-04's slower machine",
    "Guided generation (issue 26): features", "a false finding (issue 22: the far packed read table)",
])
def test_the_label_patterns_catch_past_work(line):
    assert past_work_labels("x.py", line)


@pytest.mark.parametrize("line", [
    "n0, s0 = launches.compiles(), launches.compile_seconds()", "0x5f3759df and 0xs1", "ran 31,875 ops in 120 s",
    "--budget-s 120", "a 5 s window", "signature read_table/result/out  [issue 41]", "sm_90 or cuda:80:32",
    "@pytest.fixture(scope=\"session\")", "in a test session the plugin is loaded once", "cdiv(s1, s2)", "x = (s1, s2)",
    "your other Triton tests in that session are interpreted", '(READ, "issue 12: the off-by-one")',
    "a record dated 2026-12-04 in its README",
])
def test_the_label_patterns_leave_ordinary_text_alone(line):
    assert not past_work_labels("x.py", line)


def test_the_architecture_doc_places_every_engine_module_where_the_rows_do():
    """docs/architecture.md's engine table is ENGINE_ROWS, row for row, so the doc a maintainer
    reads first says the order the code keeps."""
    text = (REPO / "docs/architecture.md").read_text()
    section = text[text.index("## The engine, leaf modules first"):]
    section = section[:section.index("\n## ", 1)]
    rows = [[m.strip("/") for m in re.findall(r"`([\w/]+)`", line.split("|")[1])]
            for line in section.splitlines() if line.startswith("| `")]
    assert [sorted(r) for r in rows] == [sorted(r) for r in ENGINE_ROWS]
