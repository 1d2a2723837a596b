"""The CI examples (ci/examples/), the CI and GPU-run scripts (ci/*.sh, benchmarks/*.sh) and every command in README.md and the docs stay runnable: every kvfuzz
command line in them parses with ``fuzz.cli.build_parser()`` (subcommand, flags, their
values where the value is literal), every ``--kvfuzz-*`` option is one the pytest plugin
has, and the workflows have the shape GitHub Actions reads (deeply with PyYAML when it
is installed; it is no dependency of kvfuzz)."""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz import pytest_plugin
from fuzz.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "ci/examples"
WORKFLOWS = sorted(EXAMPLES.glob("*.yml"))
SCRIPTS = sorted([*EXAMPLES.glob("*.sh"), *(REPO / "ci").glob("*.sh"), *(REPO / "benchmarks").glob("*.sh")])

VAR = "@VAR@"  # what a shell variable or a GitHub expression stands for here
# A word in capitals stands for a value the reader supplies (CASE, OUT_DIR..., I/N, SET/PHASE).
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*(?:[/.:][A-Z0-9_]+)*(?:\.\.\.)?$")
# Innermost first (so ${A:-${B}} and ${A:-$(cmd)} nest): a GitHub expression, $((...)),
# $(...), ${...}, $NAME, $1.
_EXPANSION = re.compile(r"\$\{\{[^}]*\}\}|\$\(\([^()]*\)\)|\$\([^()]*\)|\$\{[^${}]*\}|\$(?:[A-Za-z_][A-Za-z0-9_]*|[0-9])")
_SHELL_OPS = {";", "&&", "||", "|", "&", ">", ">>", "<", "2>", ">&", "&>", "(", ")"}


def shell_lines(path: Path) -> list[str]:
    """The shell a file runs, one logical line each (backslash continuations joined): a
    script's lines, or a workflow's ``run:`` values (a ``>`` block folded into one line,
    a ``|`` block line by line)."""
    text = path.read_text().replace("\\\n", " ")
    if path.suffix == ".sh":
        return text.splitlines()
    lines, block, fold, indent = [], None, False, 0
    for raw in text.splitlines():
        depth = len(raw) - len(raw.lstrip())
        if block is not None:
            if not raw.strip() or depth >= indent:
                block.append(raw.strip())
                continue
            lines += [" ".join(block)] if fold else block
            block = None
        m = re.match(r"\s*(?:- )?run:\s*(.*)$", raw)
        if m and m.group(1)[:1] in ("|", ">"):
            block, fold, indent = [], m.group(1).startswith(">"), depth + 1
        elif m:
            lines.append(m.group(1))
    if block:
        lines += [" ".join(block)] if fold else block
    return lines


def _command_position(tokens: list[str], i: int) -> bool:
    before = tokens[i - 1] if i else None
    return before is None or before in _SHELL_OPS or before in ("exec", "time", "then", "do") or bool(
        re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", before))


def kvfuzz_commands(path: Path) -> list[list[str]]:
    """The argument lists of every ``kvfuzz ...`` / ``python -m fuzz ...`` call in a file."""
    found = []
    for line in shell_lines(path):
        try:
            found += kvfuzz_commands_in(line)
        except ValueError:
            pytest.fail(f"{path.name}: cannot split {line!r} as shell")
    return found


def shell_tokens(line: str) -> list[str]:
    """One shell line as words and operators, each expansion standing as ``VAR`` (ValueError: it
    does not split as shell)."""
    line = re.sub(r'"?\$(?:@|\{@[^}]*\})"?', "", line)  # a script's "$@": whatever flags its caller adds
    line = re.sub(r"(?<=\s)\d(?=>)", "", line)  # 2>&1, 2>/dev/null: the descriptor is no argument
    while _EXPANSION.search(line):
        line = _EXPANSION.sub(VAR, line)
    lex = shlex.shlex(line, posix=True, punctuation_chars=";&|<>()")
    lex.whitespace_split = True
    lex.commenters = "#"
    return list(lex)


def kvfuzz_commands_in(line: str) -> list[list[str]]:
    """The kvfuzz argument lists of one shell line; a word in capitals (a value the reader
    supplies: CASE, I/N) stands as ``VAR``."""
    tokens = [VAR if PLACEHOLDER.match(t) else t for t in shell_tokens(line)]
    found = []
    for i, tok in enumerate(tokens):
        if Path(tok).name == "kvfuzz" and _command_position(tokens, i):
            start = i + 1
        elif tok == "-m" and tokens[i + 1:i + 2] == ["fuzz"]:
            start = i + 2
        else:
            continue
        end = next((j for j in range(start, len(tokens)) if tokens[j] in _SHELL_OPS), len(tokens))
        found.append(tokens[start:end])
    return found


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def check_command(args: list[str]) -> None:
    """Parse ``args`` as the CLI would: a value standing for a variable passes any type
    and choice check; a literal value must pass them."""
    strict = build_parser()
    relaxed = build_parser()
    for sub in _subparsers(relaxed).values():
        for action in sub._actions:
            action.type, action.choices = None, None
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            ns = relaxed.parse_args(args)
        except SystemExit:
            pytest.fail(f"kvfuzz {shlex.join(args)}: {err.getvalue().strip()}")
    for action in _subparsers(strict)[ns.command]._actions:
        value = getattr(ns, action.dest, None)
        if not isinstance(value, str) or VAR in value:
            continue
        try:
            value = action.type(value) if action.type else value
        except (argparse.ArgumentTypeError, ValueError) as exc:
            pytest.fail(f"kvfuzz {shlex.join(args)}: {action.option_strings or action.dest}: {exc}")
        if action.choices is not None and value not in action.choices:
            pytest.fail(f"kvfuzz {shlex.join(args)}: {value!r} is not one of {sorted(action.choices)}")


# ---- command lines -----------------------------------------------------------------------


@pytest.mark.parametrize("path", [*WORKFLOWS, *SCRIPTS], ids=lambda p: str(p.relative_to(REPO)))
def test_kvfuzz_command_lines_parse(path):
    commands = kvfuzz_commands(path)
    for args in commands:
        check_command(args)
    if path.parent == EXAMPLES:
        assert commands or "ci/fuzz.sh" in path.read_text(), f"{path.name}: no kvfuzz command found"


def test_the_checker_sees_commands_and_catches_mistakes(tmp_path):
    example = tmp_path / "job.yml"
    example.write_text('steps:\n  - run: >-\n      .venv/bin/kvfuzz run --backend interpret\n'
                       '      --budget-s 120 --shard ${{ matrix.shard }}/4 && echo done\n'
                       '  - run: "$PY" -m fuzz replay case.json --backend torch  # a comment\n')
    assert kvfuzz_commands(example) == [["run", "--backend", "interpret", "--budget-s", "120", "--shard", "@VAR@/4"],
                                        ["replay", "case.json", "--backend", "torch"]]
    for bad in (["run", "--budgets", "1"], ["run", "--backend", "gpu"], ["run", "--shard", "4/4"], ["fuzz"]):
        with pytest.raises(pytest.fail.Exception):
            check_command(bad)


def test_pytest_plugin_options_exist():
    class Options:
        names: set[str] = set()

        def getgroup(self, *args, **kwargs):
            return self

        def addoption(self, *names, **kwargs):
            self.names.update(names)

    options = Options()
    pytest_plugin.pytest_addoption(options)
    used = {m for p in [*WORKFLOWS, *SCRIPTS] for m in re.findall(r"--kvfuzz-[a-z-]+", p.read_text())}
    assert used and used <= options.names, used - options.names


# ---- shapes --------------------------------------------------------------------------------


def test_slurm_script_is_valid_bash():
    script = EXAMPLES / "slurm-array.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert script.stat().st_mode & 0o111, "slurm-array.sh should be executable"
    assert '--shard "${SHARD}/${SLURM_ARRAY_TASK_COUNT}"' in script.read_text()


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_shape_without_yaml(path):
    text = path.read_text()
    assert "\t" not in text, "YAML must not be indented with tabs"
    for key in ("name", "on", "jobs"):
        assert re.search(rf"^{key}:", text, re.M), f"{path.name}: no top-level {key}:"
    for action in re.findall(r"uses:\s*(\S+)", text):
        assert re.fullmatch(r"[\w-]+/[\w-]+@v\d+", action), f"{path.name}: unpinned action {action}"


def _nightly_shards(text: str) -> tuple[list[int], int]:
    shards = [int(s) for s in re.search(r"shard:\s*\[([\d,\s]+)\]", text).group(1).split(",")]
    total = int(re.search(r"KVFUZZ_SHARD=\$\{\{ matrix\.shard \}\}/(\d+)", text).group(1))
    return shards, total


def test_nightly_matrix_covers_every_shard():
    shards, total = _nightly_shards((EXAMPLES / "nightly.yml").read_text())
    assert shards == list(range(total))


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_shape_with_yaml(path):
    yaml = pytest.importorskip("yaml")
    data = yaml.safe_load(path.read_text())
    assert isinstance(data.get("name"), str)
    assert data.get("on", data.get(True))  # YAML 1.1 reads the key `on` as true
    for name, job in data["jobs"].items():
        assert job.get("runs-on"), name
        for step in job["steps"]:
            assert ("uses" in step) != ("run" in step), f"{name}: a step needs exactly one of uses/run: {step}"
    steps = [s for job in data["jobs"].values() for s in job["steps"]]
    runs = " ".join(s.get("run", "") for s in steps)
    uploads = " ".join(s["with"]["path"] for s in steps if s.get("uses", "").startswith("actions/upload-artifact"))
    if path.name == "premerge.yml":
        assert "bash ci/test.sh" in runs and "check-sync --output-format github" in runs
        junit = re.search(r"--junit-xml (\S+)", runs).group(1)
        assert junit in uploads and "kvfuzz-out" in uploads
    if path.name == "nightly.yml":
        assert data["jobs"]["fuzz"]["strategy"]["matrix"]["shard"] == _nightly_shards(path.read_text())[0]
        assert "kvfuzz-out" in uploads


def test_nightly_merges_the_shards_against_a_baseline_in_the_repo():
    from fuzz.tools.baseline import load_baseline

    path = EXAMPLES / "nightly.yml"
    text = path.read_text()
    merges = [args for args in kvfuzz_commands(path) if args[:1] == ["merge"]]
    assert len(merges) == 1, merges
    ns = build_parser().parse_args(merges[0])
    assert ns.baseline and (REPO / ns.baseline).is_file() and load_baseline(REPO / ns.baseline).source
    assert re.search(rf"KVFUZZ_BASELINE:\s*{re.escape(ns.baseline)}", text)  # the shards use the same one
    upload = re.search(r"name:\s*(kvfuzz-out-shard-)\$\{\{ matrix\.shard \}\}", text).group(1)
    download = re.search(r"actions/download-artifact@v\d+\s+with:\s+pattern:\s*(\S+)", text)
    assert download and download.group(1) == upload + "*"
    assert re.search(r"^  merge:\n    needs: fuzz\n    if: always\(\)", text, re.M)


# ---- ci/fuzz.sh's guided knob ----------------------------------------------------------------


def _fuzz_sh(tmp_path: Path, out: str, **env) -> subprocess.CompletedProcess:
    """``ci/fuzz.sh`` on the torch tier with this Python (``KVFUZZ_NO_VENV``), 4 sequences."""
    run_env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "KVFUZZ_NO_VENV": "1",
               "KVFUZZ_BACKEND": "torch", "KVFUZZ_MAX_SEQUENCES": "4", "KVFUZZ_WORKERS": "1", "KVFUZZ_SEED": "7",
               "KVFUZZ_OUT": str(tmp_path / out), **env}
    run_env.pop("TRITON_INTERPRET", None)
    return subprocess.run(["bash", str(REPO / "ci/fuzz.sh")], capture_output=True, text=True, timeout=300, env=run_env)


def test_fuzz_sh_keeps_and_resumes_a_corpus_where_kvfuzz_corpus_names_one(tmp_path):
    """What ci/nightly.sh relies on to keep a corpus between nights: KVFUZZ_CORPUS makes the campaign
    guided from that directory, the next run resumes what the last left, and without it nothing is
    guided (no corpus written)."""
    corpus = tmp_path / "corpus"
    first = _fuzz_sh(tmp_path, "night1", KVFUZZ_CORPUS=str(corpus))
    assert first.returncode == 0, first.stdout + first.stderr
    kept = sorted(p.name for p in corpus.glob("*.json"))
    assert kept, first.stdout + first.stderr
    second = _fuzz_sh(tmp_path, "night2", KVFUZZ_CORPUS=str(corpus))
    assert second.returncode == 0, second.stdout + second.stderr
    entries = [int(n) for n in re.findall(rf"corpus {re.escape(str(corpus))}: (\d+) entries", second.stdout + second.stderr)]
    assert entries and entries[-1] >= len(kept), second.stdout + second.stderr
    assert set(kept) <= {p.name for p in corpus.glob("*.json")}  # resumed from, not started over
    blind = _fuzz_sh(tmp_path, "blind")
    assert blind.returncode == 0, blind.stdout + blind.stderr
    assert not (tmp_path / "blind/corpus").exists() and "corpus" not in blind.stdout + blind.stderr


# ---- commands in README.md and the docs ------------------------------------------------------
# Every command a reader copies from README.md, docs/*.md or benchmarks/README.md runs as written:
# a kvfuzz command parses (its flags exist, literal values pass their types); a benchmark's flags
# are ones its parser declares; a script or a file it names exists; a gpu_runs.sh part exists;
# a `--kvfuzz-*` option is the plugin's. The cheap ones are also run.

DOCS = sorted([REPO / "README.md", REPO / "benchmarks/README.md", *(REPO / "docs").glob("*.md")])
_REPO_ROOTS = ("tests/", "ci/", "benchmarks/", "fuzz/", "kvkernels/", "kvref/", "docs/", ".ci/")


def doc_commands(path: Path) -> tuple[list[str], list[str]]:
    """The shell lines of a Markdown file's ```bash blocks (continuations joined), and its inline
    code spans that name a kvfuzz command (prose: ``kvfuzz replay CASE --tries N``), apart."""
    text = path.read_text()
    lines = []
    for block in re.findall(r"^```(?:bash|sh|console)\n(.*?)^```", text, re.M | re.S):
        lines += [ln for ln in block.replace("\\\n", " ").splitlines() if ln.strip()]
    spans = [span for span in re.findall(r"`([^`\n]+)`", text) if re.match(r"(?:\.venv/bin/)?kvfuzz [a-z][a-z-]*(?: |$)", span)]
    return lines, spans


def _declared_flags(script: Path) -> set[str]:
    """The option strings a benchmark's argparse parser declares (read from its source)."""
    flags = {"-h", "--help"}
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            flags |= {a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("-")}
    return flags


def check_doc_line(line: str) -> list[str]:
    """What is wrong with one documented command line (nothing: an empty list)."""
    problems = []
    try:
        tokens = [VAR if PLACEHOLDER.match(t) else t for t in shell_tokens(line)]
    except ValueError:
        return [f"cannot split {line!r} as shell"]
    for i, tok in enumerate(tokens):  # an input in this repository: a script run, a kernel set, an allocator
        before = tokens[i - 1] if i else ""
        if before in ("bash", "python", "python3", "--kernels", "--allocator") or tok.startswith(
                ("--kernels=", "--allocator=", "--kvfuzz-kernels=", "--kvfuzz-allocator=")):
            path = tok.split("=")[-1].split(":")[0]
            if path.startswith(_REPO_ROOTS) and VAR not in path and not (REPO / path).exists():
                problems.append(f"{path}: no such file")
    for i, tok in enumerate(tokens):
        if tok.endswith(".py") and tok.startswith("benchmarks/") or (tok == "-m" and tokens[i + 1:i + 2]
                                                                     and tokens[i + 1].startswith("benchmarks.")):
            script = REPO / (tok if tok.endswith(".py") else tokens[i + 1].replace(".", "/") + ".py")
            start = i + 1 if tok.endswith(".py") else i + 2
            end = next((j for j in range(start, len(tokens)) if tokens[j] in _SHELL_OPS), len(tokens))
            if script.exists():
                used = {t.split("=")[0] for t in tokens[start:end] if t.startswith("-")}
                problems += [f"{script.name}: no flag {f}" for f in sorted(used - _declared_flags(script))]
        if tok.endswith("gpu_runs.sh"):
            parts = subprocess.run(["bash", str(REPO / "benchmarks/gpu_runs.sh"), "--list"], capture_output=True,
                                   text=True).stdout.split("\n")[1:]
            names = {p.split()[0] for p in parts if p.strip()}
            end = next((j for j in range(i + 1, len(tokens)) if tokens[j] in _SHELL_OPS), len(tokens))
            problems += [f"gpu_runs.sh: no part {p}" for p in tokens[i + 1:end] if not p.startswith("-") and p not in names]
    return problems


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_documented_command_runs_as_written(path):
    lines, spans = doc_commands(path)
    problems = []
    for line in lines:
        problems += [f"{line.strip()[:100]}: {p}" for p in check_doc_line(line)]
        for args in kvfuzz_commands_in(line):
            try:
                check_command(args)
            except pytest.fail.Exception as exc:
                problems.append(str(exc))
    for span in spans:  # prose names a command and some of its flags: each flag must exist
        problems += [f"`{span}`: {p}" for p in span_flags_unknown(span)]
    for opt in {o for text in [*lines, *spans] for o in re.findall(r"--kvfuzz-[a-z-]+", text)} - _plugin_options():
        problems.append(f"the pytest plugin has no {opt}")
    assert not problems, f"{path.relative_to(REPO)}:\n  " + "\n  ".join(problems)


def span_flags_unknown(span: str) -> list[str]:
    """The flags an inline ``kvfuzz SUBCOMMAND ...`` names that the subcommand does not have."""
    words = span.split()
    subs = _subparsers(build_parser())
    sub = subs.get(words[1]) if len(words) > 1 else None
    if sub is None:
        return [f"no subcommand {words[1:2]}"]
    known = {o for a in sub._actions for o in a.option_strings}
    return [f"kvfuzz {words[1]} has no {w}" for w in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", span) if w not in known]


def _plugin_options() -> set[str]:
    names: set[str] = set()

    class Options:
        def getgroup(self, *args, **kwargs):
            return self

        def addoption(self, *opts, **kwargs):
            names.update(opts)

    pytest_plugin.pytest_addoption(Options())
    return names


def test_the_doc_checker_catches_what_a_reader_would_trip_on(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("Run `kvfuzz replay CASE --tries 3`, or `kvfuzz run [--seed N]` (a synopsis).\n\n```bash\n"
                   "kvfuzz run --backend interpret \\\n  --shard I/N --budget-s 60   # a comment\n"
                   "python benchmarks/first_case.py --cold --warm\n```\n")
    lines, spans = doc_commands(doc)
    assert lines == ["kvfuzz run --backend interpret    --shard I/N --budget-s 60   # a comment",
                     "python benchmarks/first_case.py --cold --warm"]
    assert spans == ["kvfuzz replay CASE --tries 3", "kvfuzz run [--seed N]"]
    assert kvfuzz_commands_in(lines[0]) == [["run", "--backend", "interpret", "--shard", VAR, "--budget-s", "60"]]
    assert check_doc_line(lines[1]) == [] and not any(span_flags_unknown(s) for s in spans)
    assert check_doc_line("python benchmarks/first_case.py --cold --frozen") == ["first_case.py: no flag --frozen"]
    assert check_doc_line("kvfuzz run --kernels tests/fixtures/kernels/foreign/gone.py") == [
        "tests/fixtures/kernels/foreign/gone.py: no such file"]
    assert check_doc_line("bash benchmarks/gpu_runs.sh cuda-tests warp-speed") == ["gpu_runs.sh: no part warp-speed"]
    assert span_flags_unknown("kvfuzz replay CASE --retries 3") == ["kvfuzz replay has no --retries"]
    with pytest.raises(pytest.fail.Exception):
        check_command(kvfuzz_commands_in("kvfuzz replay CASE --retries 3")[0])


def test_every_record_the_docs_cite_exists():
    """A figure names where it is recorded: every benchmarks/results/ path in README.md and the docs
    (and in the code's comments) is there."""
    cited = set()
    for path in [*DOCS, *REPO.glob("fuzz/**/*.py"), *REPO.glob("kvkernels/*.py"), *REPO.glob("benchmarks/*.py")]:
        for ref in re.findall(r"(?:benchmarks/)?results/[\w./*-]*[\w*/]", path.read_text()):
            ref = ref if ref.startswith("benchmarks/") else "benchmarks/" + ref
            if "gpu-run" not in ref and "FILE" not in ref:
                cited.add((path.relative_to(REPO), ref.rstrip("/.")))
    missing = [f"{src}: {ref}" for src, ref in sorted(cited) if not list(REPO.glob(ref))]
    assert cited and not missing, missing


def test_ci_runs_the_test_command_the_readme_gives():
    readme = (REPO / "README.md").read_text()
    first = re.search(r"^```bash\n(.*?)^```", readme, re.M | re.S).group(1)
    commands = [ln.split("#")[0].strip() for ln in first.splitlines()]
    assert "bash ci/fuzz.sh" in commands and "bash ci/test.sh" in commands
    run = (REPO / ".ci/run").read_text()
    assert re.search(r"^bash ci/test\.sh\s*$", run, re.M) and "README" in run  # and its comment says why


def test_the_cheap_documented_commands_run():
    """The documented commands that only list or explain (``--list``, ``--help``, ``--version``) are
    run as written, with this Python standing for ``kvfuzz`` and ``python``: each exits 0 and says
    something."""
    cheap = [ln.split("#")[0].strip() for p in DOCS for ln in doc_commands(p)[0]
             if re.search(r"--(?:list|list-rules|help|version)\b", ln)]
    assert cheap  # benchmarks/README.md lists gpu_runs.sh's parts
    for line in cheap:
        args = shlex.split(line)
        if Path(args[0]).name == "kvfuzz":
            args = [sys.executable, "-m", "fuzz", *args[1:]]
        elif args[0] in ("python", "python3"):
            args[0] = sys.executable
        r = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
        assert r.returncode == 0 and r.stdout.strip(), f"{line}: exit {r.returncode}\n{r.stdout}{r.stderr}"
