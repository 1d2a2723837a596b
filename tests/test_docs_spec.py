"""docs/spec.md keeps up with kvref: every name kvref defines has its line there.

The names come from the code (introspection, and the AST where a name only lives in a
``raise``), never from a list kept here, so a new invariant, kernel-level function or
allocator op added to kvref without documentation fails this test, naming what is
missing. A name counts when it appears inside a code span or a fenced block, so an
English word ("data", "span") in prose does not satisfy it.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
import re
import textwrap
from pathlib import Path

import kvref
from kvref import Allocator, PoolConfig, invariants, kernels

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "spec.md"
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SPEC_REF = re.compile(r"SPEC(?:\.md)? §(\d+)(?:\.(\d+))?")
SCANNED = {".py", ".md", ".sh", ".json", ".toml", ".txt"}
NOT_SCANNED = {"venv", "build", "dist", "kvfuzz-out", "nightly-out"}


# ---------------------------------------------------------------- reading the page


def doc_text() -> str:
    assert DOC.is_file(), f"{DOC.relative_to(REPO)} is missing"
    return DOC.read_text(encoding="utf-8")


def code_names(text: str) -> set[str]:
    """Identifiers inside fenced blocks and `inline code` spans."""
    names: set[str] = set()
    fences = re.compile(r"^```.*?^```", re.S | re.M)
    for block in fences.findall(text):
        names |= set(IDENT.findall(block))
    for span in re.findall(r"`([^`\n]+)`", fences.sub("", text)):
        names |= set(IDENT.findall(span))
    return names


def sections(text: str) -> dict[int, str]:
    """{N: body} for every ``## §N`` heading, each body up to the next ``## `` heading."""
    out: dict[int, str] = {}
    parts = re.split(r"^## ", text, flags=re.M)
    for part in parts[1:]:
        m = re.match(r"§(\d+)\b", part)
        if m:
            out[int(m.group(1))] = part
    return out


def section(n: int) -> str:
    found = sections(doc_text())
    assert n in found, f"docs/spec.md has no '## §{n}' heading (found §{sorted(found)})"
    return found[n]


def missing(names, text: str) -> list[str]:
    have = code_names(text)
    return sorted(set(names) - have)


# ---------------------------------------------------------------- reading the code


def public_functions(module) -> list[str]:
    return [name for name, f in inspect.getmembers(module, inspect.isfunction)
            if f.__module__ == module.__name__ and not name.startswith("_")]


def raised_invariant_names(fn) -> set[str]:
    """The first argument of every ``InvariantViolation("name", ...)`` in fn's body."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    names = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "InvariantViolation" and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names.add(node.args[0].value)
    return names


def numbered_invariants() -> dict[int, tuple[set[str], str]]:
    """{§4 number: (kvref names, check function)} for every function raising InvariantViolation.

    INVARIANTS holds invariants 1..7 in SPEC order; a check outside it (two-state
    invariants) carries its number in its docstring ("Invariant 8: ...").
    """
    table: dict[int, tuple[set[str], str]] = {}
    registered = list(invariants.INVARIANTS.items())
    for number, (name, fn) in enumerate(registered, start=1):
        table[number] = ({name} | raised_invariant_names(fn), fn.__name__)
    in_registry = {fn.__name__ for _, fn in registered}
    for name in public_functions(invariants):
        fn = getattr(invariants, name)
        raised = raised_invariant_names(fn)
        if name in in_registry or not raised:
            continue
        m = re.search(r"\bInvariant (\d+)\b", inspect.getdoc(fn) or "")
        assert m, f"kvref.invariants.{name} raises InvariantViolation {sorted(raised)} but its docstring names no 'Invariant N'"
        number = int(m.group(1))
        assert number not in table, (
            f"invariant {number} is both {table[number][1]} (entry {number} of INVARIANTS) and {name} "
            f"(its docstring): §4 numbers INVARIANTS in order, then the docstrings' 'Invariant N'; renumber one"
        )
        table[number] = (raised, name)
    return table


def allocator_members() -> list[str]:
    """Public methods and properties defined on kvref.Allocator: its ops and its helpers."""
    return sorted(name for name, value in vars(Allocator).items()
                  if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property)))


def kernel_set_names() -> list[str]:
    """``kvkernels.__all__``, read from the source so this test does not import torch."""
    tree = ast.parse((REPO / "kvkernels" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError("kvkernels/__init__.py defines no __all__")


def spec_references() -> dict[tuple[int, int | None], str]:
    """Every "SPEC.md §N" / "SPEC §N.M" written in the repository, with one place it occurs."""
    refs: dict[tuple[int, int | None], str] = {}
    for root, dirs, files in os.walk(REPO):
        dirs[:] = sorted(d for d in dirs if not (d.startswith(".") or d in NOT_SCANNED or d.endswith(".egg-info")))
        for name in sorted(files):
            path = Path(root) / name
            if path.suffix not in SCANNED or path == DOC:
                continue
            for m in SPEC_REF.finditer(path.read_text(encoding="utf-8", errors="replace")):
                key = (int(m.group(1)), int(m.group(2)) if m.group(2) else None)
                refs.setdefault(key, str(path.relative_to(REPO)))
    return refs


# ---------------------------------------------------------------- the checks


def test_code_names_ignore_prose():
    text = "The data lives in a span.\n\n`check_data(cfg)` and\n```\nout[b][c] = v2p[page]\n```\n"
    assert missing(["data", "span", "check_data", "cfg", "v2p", "page"], text) == ["data", "span"]


def test_every_invariant_is_numbered_and_named_in_section_4():
    body = section(4)
    rows = {int(m.group(1)): m.group(2) for m in re.finditer(r"^\|\s*4\.(\d+)\s*\|(.*)$", body, flags=re.M)}
    problems = []
    for number, (names, check) in sorted(numbered_invariants().items()):
        if number not in rows:
            problems.append(f"no row '| 4.{number} |' for invariant {number} ({sorted(names)}, {check})")
            continue
        absent = missing(names | {check}, rows[number])
        if absent:
            problems.append(f"row 4.{number} lacks {absent}")
    assert not problems, "docs/spec.md §4 is behind kvref.invariants:\n  " + "\n  ".join(problems)


def test_every_public_function_of_kvref_invariants_is_in_section_4():
    absent = missing(public_functions(invariants), section(4))
    assert not absent, f"docs/spec.md §4 does not mention kvref.invariants functions {absent}"


def test_every_kernel_level_function_is_in_section_2():
    absent = missing(public_functions(kernels), section(2))
    assert not absent, f"docs/spec.md §2 does not mention kvref.kernels functions {absent}"


def test_every_kernel_set_function_is_documented():
    absent = missing(kernel_set_names(), doc_text())
    assert not absent, f"docs/spec.md does not mention kvkernels exports {absent}"


def test_every_allocator_op_and_helper_is_documented():
    absent = missing(allocator_members(), section(2) + section(3))
    assert not absent, f"docs/spec.md §2/§3 do not mention kvref.Allocator members {absent}"


def test_config_and_state_are_in_section_1():
    fields = [f.name for f in dataclasses.fields(PoolConfig)]
    state = list(Allocator(PoolConfig(num_pages=4)).snapshot())
    problems = []
    for what, names in (("PoolConfig fields", fields), ("snapshot keys", state)):
        absent = missing(names, section(1))
        if absent:
            problems.append(f"{what} {absent}")
    assert not problems, "docs/spec.md §1 does not mention " + "; ".join(problems)


def test_kvref_exports_are_documented():
    absent = missing(kvref.__all__, doc_text())
    assert not absent, f"docs/spec.md does not mention kvref exports {absent}"


def test_every_spec_reference_in_the_repository_resolves():
    found = sections(doc_text())
    problems = []
    for (sec, sub), where in sorted(spec_references().items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        if sec not in found:
            problems.append(f"§{sec} (cited in {where}) has no '## §{sec}' heading")
        elif sub is not None and not re.search(rf"^\|\s*{sec}\.{sub}\s*\|", found[sec], flags=re.M):
            problems.append(f"§{sec}.{sub} (cited in {where}) has no '| {sec}.{sub} |' row")
    assert not problems, "docs/spec.md cannot answer references made elsewhere:\n  " + "\n  ".join(problems)


def test_every_precondition_is_named_in_section_2():
    """A clause registered in kvref.preconditions (a check the generators, kvref and the vector
    oracle run) has its name in §2, in code, so docs and refusals speak of the same rule."""
    from kvref import preconditions

    assert preconditions.CLAUSES, "kvref.preconditions registers no clause"
    spans = set(re.findall(r"`([^`\n]+)`", section(2)))
    absent = sorted(set(preconditions.CLAUSES) - spans)
    assert not absent, f"docs/spec.md §2 does not name the preconditions {absent} (as `FUNCTION.RULE`)"
