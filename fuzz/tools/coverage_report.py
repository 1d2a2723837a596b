"""``kvfuzz coverage``: what a guided corpus reached, and what it never reached.

Per kernel, the value features a read table or an id kernel is expected to reach (each
trip bucket with a full and with a partial last block, full / partial / empty masks) and
which of them no entry has ("read_table_kernel: no program ever ran 3+ trips with a
partial last block"); per function of the files under test (kvref's allocator, the allocator
and kernel set under test, the launchers, on the interpreter the ``@triton.jit`` bodies), the
lines no sequence ran;
for chains of pools (docs/spec.md §6), which of ``chain_gen.CHAIN_FEATURES`` (the relief
ladder's rungs and the gate they met, the gate at each flush, frontier distances; and
``FLOAT_FEATURES``, what a float did, where the corpus met one) were reached and which never.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from ..engine.chain_gen import CHAIN_FEATURES, FLOAT_FEATURES
from ..engine.corpus import SOURCES, Corpus, merge
from ..engine.features import MASKS, TRIP_BUCKETS  # MASKS[:2] expected: launchers skip empty launches


def _reached(dirs) -> tuple[set[str], int, dict, bool]:
    """(feature names, entries, the measured files' paths, whether kernel bodies can be judged: a
    corpus that says none of its sequences traced them leaves their lines out; one without the note
    is judged on all its lines)."""
    names, entries, noted, bodies = set(), 0, {}, False
    for d in dirs:
        if not Path(d).is_dir():
            raise FileNotFoundError(f"corpus {d}: not a directory")
        corpus = Corpus(d)
        entries += len(corpus.entries)
        kept = corpus.sources()
        noted.update(kept["files"])
        bodies |= kept["kernel_bodies"] or not (Path(d) / SOURCES).is_file()
        for e in corpus.entries:
            names.update(e["features"])
    return names, entries, noted, bodies


def _source(short: str, noted: dict) -> Path | None:
    """A measured file named ``pkg/file.py`` back to its path: kvref's and kvkernels', or where the
    corpus noted it (``Corpus.note_sources``: a team's kernels and allocator), if it is still there."""
    import kvkernels
    import kvref

    for pkg in (kvref, kvkernels):
        base = Path(pkg.__file__).resolve().parent
        if base.name == short.split("/")[0] and (base.parent / short).is_file():
            return base.parent / short
    path = Path(noted[short]) if short in noted else None
    return path if path is not None and path.is_file() else None


def _jit(fn) -> bool:
    """A ``@triton.jit`` (or ``@jit``, ``@triton.jit(...)``) function: run by the interpreter."""
    for d in fn.decorator_list:
        d = d.func if isinstance(d, ast.Call) else d
        if (d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", "")) == "jit":
            return True
    return False


def _functions(path: Path, bodies: bool = True) -> dict[int, str]:
    """line -> the innermost function (``Class.method``) whose body it is in (its ``def`` and
    decorator lines ran at import, before anything was measured: left out); without ``bodies``,
    ``@triton.jit`` functions are left out too (no sequence traced them)."""
    where: dict[int, str] = {}

    def walk(node, prefix=""):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if not bodies and _jit(child):
                    continue
                name = f"{prefix}{child.name}"
                for line in range(child.body[0].lineno, (child.end_lineno or child.lineno) + 1):
                    where[line] = name
                walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    walk(ast.parse(path.read_text()))
    return where


def _statements(path: Path) -> set[int]:
    from coverage.parser import PythonParser

    parser = PythonParser(filename=str(path))
    parser.parse_source()
    return set(parser.statements)


def report(dirs) -> dict:
    """{"entries", "features" (by domain), "kernels": {kernel: {"reached": [...], "never": [...]}},
    "code": {file: {function: {"lines": n, "never": [lines]}}}, "chain": {"reached": [...], "never": [...]},
    "kernel_bodies": whether ``code`` judges the ``@triton.jit`` bodies (a sequence traced them)}."""
    names, entries, noted, bodies = _reached(dirs)
    by_domain = defaultdict(int)
    for n in names:
        by_domain[n.split("|", 1)[0]] += 1
    kernels: dict[str, dict] = defaultdict(lambda: {"reached": [], "never": []})
    trips, masks, ran = defaultdict(set), defaultdict(set), defaultdict(set)
    for n in names:
        parts = n.split("|")
        if parts[0] == "trips":
            trips[parts[1]].add((parts[2], parts[3]))
        elif parts[0] == "mask":
            masks[(parts[1], parts[2])].add(parts[3])
        elif parts[0] == "code":
            a, b = (int(x) for x in parts[2].split(">"))
            ran[parts[1]].update(x for x in (a, b) if x > 0)
    for kernel, seen in sorted(trips.items()):
        kernels[kernel]["reached"] += [f"trips {t} ({e} last block)" for t, e in sorted(seen)]
        for t in TRIP_BUCKETS[1:]:
            for edge in ("full", "partial"):
                if not any(e == edge and (s == t or (t == "3+" and s in ("3+", "4-7", "8+"))) for s, e in seen):
                    kernels[kernel]["never"].append(f"no program ever ran {t} trips with a {edge} last block")
    for (kernel, arg), seen in sorted(masks.items()):
        kernels[kernel]["reached"] += [f"{arg} {m}" for m in sorted(seen)]
        kernels[kernel]["never"] += [f"{arg}: never a {m} last block" for m in MASKS[:2] if m not in seen]
    code: dict[str, dict] = {}
    for short, lines in sorted(ran.items()):
        path = _source(short, noted)
        if path is None:
            continue
        where, stmts = _functions(path, bodies), _statements(path)
        per: dict[str, dict] = defaultdict(lambda: {"lines": 0, "never": []})
        for line in sorted(stmts):
            fn = where.get(line)
            if fn is None:
                continue
            per[fn]["lines"] += 1
            if line not in lines:
                per[fn]["never"].append(line)
        code[short] = dict(per)
    chain_seen = {n.split("|", 1)[1] for n in names if n.startswith("chain|")}
    # a float's features are named only where the corpus met a float (its allocator builds them)
    wanted = CHAIN_FEATURES + (FLOAT_FEATURES if any(f in chain_seen for f in FLOAT_FEATURES) else ())
    chain = {"reached": sorted(chain_seen), "never": [f for f in wanted if f not in chain_seen]}
    return {"entries": entries, "features": dict(by_domain), "kernels": dict(kernels), "code": code, "chain": chain,
            "kernel_bodies": bodies}


SHOWN = 6  # a kernel's reached features named in the text (the JSON has them all)


def text(rep: dict, all_lines: bool = False) -> str:
    out = [f"corpus: {rep['entries']} entries, features by domain: "
           + ", ".join(f"{d} {n}" for d, n in sorted(rep["features"].items()))]
    if not rep.get("kernel_bodies", True):
        out.append("@triton.jit bodies: not listed, no sequence traced them (the interpreter's, one guided sequence in 32)")
    for kernel, k in rep["kernels"].items():
        shown = k["reached"][:SHOWN]
        more = f", and {len(k['reached']) - SHOWN} more" if len(k["reached"]) > SHOWN else ""
        out.append(f"{kernel}: reached {len(k['reached'])}" + (": " + ", ".join(shown) + more if shown else ""))
        out += [f"  never: {kernel}: {why}" for why in k["never"]]
    chain = rep.get("chain") or {"reached": [], "never": []}
    out.append(f"chain: reached {len(chain['reached'])}" + (": " + ", ".join(chain["reached"]) if chain["reached"] else ""))
    out += [f"  never: chain: {f}" for f in chain["never"]]
    for short, per in rep["code"].items():
        never = {fn: v for fn, v in per.items() if v["never"]}
        out.append(f"{short}: {sum(v['lines'] for v in per.values())} lines in functions, "
                   f"{sum(len(v['never']) for v in per.values())} never ran")
        for fn, v in sorted(never.items()):
            if all_lines or len(v["never"]) < v["lines"]:  # a function never entered is one line, not each of its lines
                out.append(f"  {fn}: {len(v['never'])} of {v['lines']} lines never ran: "
                           + ", ".join(map(str, v["never"][:12])) + (" ..." if len(v["never"]) > 12 else ""))
            else:
                out.append(f"  {fn}: never entered")
    return "\n".join(out)


def features_block(root) -> dict:
    """The summary's ``features`` block of a guided run: its corpus, entries, features by domain."""
    rep = report([root])
    return {"corpus": str(root), "entries": rep["entries"], "by_domain": rep["features"]}


def main(corpora, as_json: bool = False) -> int:
    """``kvfuzz coverage``: the report, as text or JSON; a missing directory is a usage error."""
    import json

    from ..engine.tiers import SetupError

    try:
        rep = report(corpora)
    except FileNotFoundError as exc:
        raise SetupError(str(exc)) from None
    print(json.dumps(rep) if as_json else text(rep))
    return 0


def merge_main(inputs, out) -> int:
    """``kvfuzz merge --corpus``: the smallest covering subset of the corpora ``inputs`` into ``out``."""
    from ..engine.tiers import SetupError

    try:
        read, kept, features = merge(inputs, out)
    except FileNotFoundError as exc:
        raise SetupError(str(exc)) from None
    print(f"kvfuzz merge --corpus: {read} entries read, {kept} kept in {out}, covering {features} features")
    return 0
