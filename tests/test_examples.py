"""The CI examples (ci/examples/) and the CI scripts (ci/*.sh) stay runnable: every kvfuzz
command line in them parses with ``fuzz.cli.build_parser()`` (subcommand, flags, their
values where the value is literal), every ``--kvfuzz-*`` option is one the pytest plugin
has, and the workflows have the shape GitHub Actions reads (deeply with PyYAML when it
is installed; it is no dependency of kvfuzz)."""

from __future__ import annotations

import argparse
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
SCRIPTS = sorted([*EXAMPLES.glob("*.sh"), *(REPO / "ci").glob("*.sh")])

VAR = "@VAR@"  # what a shell variable or a GitHub expression stands for here
# Innermost first (so ${A:-${B}} and ${A:-$(cmd)} nest): a GitHub expression, $((...)),
# $(...), ${...}, $NAME.
_EXPANSION = re.compile(r"\$\{\{[^}]*\}\}|\$\(\([^()]*\)\)|\$\([^()]*\)|\$\{[^${}]*\}|\$[A-Za-z_][A-Za-z0-9_]*")
_SHELL_OPS = {";", "&&", "||", "|", "&", ">", ">>", "<", "2>", "(", ")"}


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
        while _EXPANSION.search(line):
            line = _EXPANSION.sub(VAR, line)
        lex = shlex.shlex(line, posix=True, punctuation_chars=";&|<>()")
        lex.whitespace_split = True
        lex.commenters = "#"
        try:
            tokens = list(lex)
        except ValueError:
            pytest.fail(f"{path.name}: cannot split {line!r} as shell")
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
