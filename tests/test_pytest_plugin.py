"""The pytest plugin (fuzz/pytest_plugin.py), used the way a kernel team uses it: pytest
runs in a scratch project outside this repository, in a subprocess without
``TRITON_INTERPRET`` in its environment.

Two ways to load it. By module name (``-p fuzz.pytest_plugin``, this tree on PYTHONPATH,
in the current environment): fast, so most tests use it. Entry-point autoloading is off
there (PYTEST_DISABLE_PLUGIN_AUTOLOAD), because an installed kvfuzz registers the same
module as ``kvfuzz`` and pytest refuses one module under two names. By entry point
(``-p kvfuzz``): only after ``pip install -e .``, so the slow test builds a fresh
virtual environment (no system site packages: the current one has an editable kvfuzz
of its own) and installs this tree into it; it sees this environment's dependencies through
links that leave kvfuzz out, so pip installs kvfuzz alone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz.engine.case import load_case

REPO = Path(__file__).resolve().parents[1]
PLANTED = REPO / "tests/fixtures/kernels/forget_p2v_tombstone.py"
CORPUS = REPO / "tests/corpus"

OWN_TEST = '''
import os


def test_own_suite():
    import kvkernels.launchers as launchers

    # Triton decided at import time whether it interprets: the plugin must have been first.
    assert launchers.INTERPRET == (os.environ.get("TRITON_INTERPRET") == "1")
'''


def scratch(tmp_path: Path, *, cases: int = 0) -> Path:
    """A project of a kernel team: its own test, a conftest that imports Triton first
    thing, and optionally a corpus of case files."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    (project / "conftest.py").write_text("import triton  # noqa: F401 - before the kvfuzz items exist\n")
    (project / "test_own.py").write_text(OWN_TEST)
    if cases:
        (project / "cases").mkdir()
        for path in sorted(CORPUS.glob("*.json"))[:cases]:
            shutil.copy(path, project / "cases" / path.name)
    return project


def env_without_interpreter(**extra) -> dict:
    """This environment, less what would decide for the child what the test is about."""
    unset = ("TRITON_INTERPRET", "PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update(extra)
    return env


def pytest_in(project: Path, *args, python: str = sys.executable, module_path: bool = True,
              timeout: float = 300) -> subprocess.CompletedProcess:
    extra = {"PYTHONPATH": str(REPO), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"} if module_path else {}
    plugin = ["-p", "fuzz.pytest_plugin"] if module_path else []
    return subprocess.run([python, "-m", "pytest", *plugin, *map(str, args)], cwd=project, capture_output=True,
                          text=True, timeout=timeout, env=env_without_interpreter(**extra))


def show(r: subprocess.CompletedProcess) -> str:
    return f"exit {r.returncode}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"


def collected(r: subprocess.CompletedProcess) -> list[str]:
    return sorted(line for line in r.stdout.splitlines() if "::" in line)


# ---- loaded by module name ----------------------------------------------------------------


def test_adds_nothing_without_kernels(tmp_path):
    project = scratch(tmp_path, cases=1)
    r = pytest_in(project, "--collect-only", "-q")
    assert r.returncode == 0, show(r)
    assert collected(r) == ["test_own.py::test_own_suite"], show(r)


def test_collects_the_machine_and_one_item_per_case(tmp_path):
    project = scratch(tmp_path, cases=2)
    names = sorted(p.name for p in (project / "cases").iterdir())
    r = pytest_in(project, "--kvfuzz-kernels=kvkernels", "--kvfuzz-corpus", "cases", "--collect-only", "-q")
    assert r.returncode == 0, show(r)
    assert collected(r) == sorted(["test_own.py::test_own_suite", "kvfuzz::state_machine",
                                   *(f"kvfuzz::case[{n}]" for n in names)]), show(r)
    only = pytest_in(project, "--kvfuzz-kernels=kvkernels", "--collect-only", "-q", "-m", "kvfuzz")
    assert collected(only) == ["kvfuzz::state_machine"], show(only)


def test_interpreter_tier_from_a_clean_environment(tmp_path):
    """TRITON_INTERPRET is not set and the project's conftest imports Triton: the plugin
    must turn the interpreter on before that, and the corpus must pass on real kernels."""
    project = scratch(tmp_path, cases=4)
    r = pytest_in(project, "--kvfuzz-kernels=kvkernels", "--kvfuzz-backend", "interpret", "--kvfuzz-corpus",
                  "cases", "-v")
    assert r.returncode == 0, show(r)
    assert "6 passed" in r.stdout, show(r)
    assert "kvfuzz: kernels=kvkernels backend=interpret profile=dev, 4 case files in cases" in r.stdout, show(r)


def test_a_planted_bug_fails_the_machine_and_the_corpus_and_leaves_a_case(tmp_path):
    project = scratch(tmp_path, cases=4)
    r = pytest_in(project, f"--kvfuzz-kernels={PLANTED}", "--kvfuzz-backend", "interpret", "--kvfuzz-corpus",
                  "cases", "--kvfuzz-out", "found", "-k", "kvfuzz")
    assert r.returncode == 1, show(r)
    assert "FAILED kvfuzz::state_machine" in r.stdout, show(r)
    assert "FAILED kvfuzz::case[" in r.stdout, show(r)
    written = sorted((project / "found").iterdir())
    assert len(written) == 1 and f"case file: {written[0]}" in r.stdout, show(r)
    case = load_case(written[0])
    assert case.tier == "interpret" and case.kernels == str(PLANTED)
    assert case.signature.op in ("free", "k_free_unbind"), case.signature
    replayed = subprocess.run([sys.executable, "-m", "fuzz", "replay", str(written[0])], cwd=project,
                              capture_output=True, text=True, timeout=300,
                              env=env_without_interpreter(PYTHONPATH=str(REPO)))
    assert replayed.returncode == 1 and "same signature" in replayed.stdout, show(replayed)


@pytest.mark.parametrize("args, message", [
    (["--kvfuzz-kernels=kvkernels", "--kvfuzz-backend", "gpu"], "invalid choice: 'gpu'"),
    (["--kvfuzz-kernels=no_such_kernels"], "--kvfuzz-kernels=no_such_kernels: cannot import"),
    (["--kvfuzz-kernels=json"], "--kvfuzz-kernels=json: not a kernel set, missing alloc_bind_inplace"),
    (["--kvfuzz-kernels=absent/kernels.py"], "--kvfuzz-kernels=absent/kernels.py: no such file"),
    (["--kvfuzz-kernels=kvkernels", "--kvfuzz-corpus", "absent"], "--kvfuzz-corpus absent: not a directory"),
    (["--kvfuzz-backend", "interpret"], "--kvfuzz-backend given without --kvfuzz-kernels"),
    ([f"--kvfuzz-kernels={REPO / 'tests/fixtures/kernels/foreign/indep.py'}"],
     "cannot run on the torch tier"),  # a Triton-only set: the hint names --kvfuzz-backend interpret
], ids=["backend", "unimportable", "not-a-kernel-set", "no-file", "corpus", "stray-option", "wrong-tier"])
def test_bad_options_are_usage_errors(tmp_path, args, message):
    r = pytest_in(scratch(tmp_path), *args)
    assert r.returncode == pytest.ExitCode.USAGE_ERROR, show(r)
    assert message in r.stderr, show(r)


def test_profiles_apply_to_the_machine_only():
    from hypothesis import settings

    from fuzz import pytest_plugin

    before = settings().max_examples
    pytest_plugin._register_profiles()
    assert settings().max_examples == before  # registered, not loaded: the suite's own tests keep theirs
    dev, ci, nightly = (settings.get_profile(f"kvfuzz-{n}") for n in ("dev", "ci", "nightly"))
    assert ci.database is None and ci.derandomize and nightly.database is None
    assert all(p.deadline is None for p in (dev, ci, nightly))
    assert dev.max_examples < ci.max_examples < nightly.max_examples
    assert dev.stateful_step_count < nightly.stateful_step_count


# ---- loaded by entry point, after pip install -e . -----------------------------------------


def _dependencies_of_this_environment(where: Path) -> Path:
    """A folder of links to this environment's installed packages, kvfuzz's own left out (its
    dist-info, its editable finder and every ``.pth``): what the fresh venv sees of torch,
    Triton, Hypothesis and pytest, already installed, so ``pip install -e`` installs kvfuzz
    alone (unpacking torch and Triton again took minutes on a loaded runner)."""
    import torch

    site = Path(torch.__file__).resolve().parents[1]
    # Named site-packages, as an installed environment's are: Hypothesis takes a module outside
    # one for the project's own and parses its source for constants (all of torch's: 17 CPU s
    # of this test's state machine, where a kernel team's site-packages costs it nothing).
    where.mkdir(parents=True)
    for entry in site.iterdir():
        name = entry.name.lower()
        if name.startswith(("kvfuzz", "__editable__", "fuzz", "kvref", "kvkernels")) or name.endswith(".pth"):
            continue
        (where / entry.name).symlink_to(entry)
    return where


def _fresh_venv(where: Path, tree: Path) -> Path:
    """A virtual environment with kvfuzz's dependencies and ``tree`` installed editable: no
    kvfuzz in it but the one installed here."""
    # No pip of its own (ensurepip is 5 of this test's CPU seconds): this environment's pip
    # installs into it (``pip --python``, pip >= 22.3), with this environment's setuptools as
    # the build backend (``--no-build-isolation``: no build environment to populate).
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    python = where / "bin" / "python"
    deps = _dependencies_of_this_environment(where.parent / "deps" / "site-packages")
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    (Path(purelib) / "kvfuzz_test_deps.pth").write_text(f"{deps}\n")
    own = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                          "--no-build-isolation", "-e", str(tree)], capture_output=True, text=True, timeout=300)
    if own.returncode and "No matching distribution" in own.stderr:
        pytest.skip(f"cannot install kvfuzz's build requirements into a fresh venv here: {own.stderr[-400:]}")
    assert own.returncode == 0, own.stderr[-2000:]
    found = subprocess.run([str(python), "-c", "import importlib.metadata as m, json; print(json.dumps([str(d._path) "
                            "for d in m.distributions() if d.metadata['Name'] == 'kvfuzz']))"],
                           capture_output=True, text=True, timeout=60)
    where = json.loads(found.stdout)
    assert where and not [w for w in where if w.startswith(str(deps))], where  # ours only: none through the links
    return python


@pytest.mark.slow
def test_entry_point_after_pip_install(tmp_path):
    # A copy of this tree: an editable install writes kvfuzz.egg-info into the tree it installs.
    tree = shutil.copytree(REPO, tmp_path / "kvfuzz", ignore=shutil.ignore_patterns(
        ".git", ".venv", "*.egg-info", "__pycache__", ".hypothesis", ".pytest_cache", "kvfuzz-out", "nightly-out"))
    python = str(_fresh_venv(tmp_path / "venv", tree))
    project = scratch(tmp_path, cases=1)
    # The torch tier: this test is about loading by entry point, not about the tier; the
    # interpreter tier through the plugin is test_interpreter_tier_from_a_clean_environment's.
    r = pytest_in(project, "-p", "kvfuzz", "--kvfuzz-kernels=kvkernels", "--kvfuzz-backend", "torch",
                  "--kvfuzz-corpus", "cases", "-v", python=python, module_path=False)
    assert r.returncode == 0 and "3 passed" in r.stdout, show(r)
    assert "kvfuzz::state_machine PASSED" in r.stdout, show(r)
    # Installed, pytest loads it in every session: the option alone is enough ...
    r = pytest_in(project, "--kvfuzz-kernels=kvkernels", "--collect-only", "-q", python=python, module_path=False)
    assert collected(r) == ["kvfuzz::state_machine", "test_own.py::test_own_suite"], show(r)
    # ... and a session without it gets no kvfuzz tests.
    r = pytest_in(project, "--collect-only", "-q", python=python, module_path=False)
    assert collected(r) == ["test_own.py::test_own_suite"], show(r)
    meta = subprocess.run([python, "-c", "import importlib.metadata as m, json; d = m.distribution('kvfuzz'); "
                           "print(json.dumps([d.metadata.get('License'), sorted(d.metadata.get_all('Provides-Extra'))]))"],
                          capture_output=True, text=True, timeout=60)
    license_, extras = json.loads(meta.stdout)
    assert license_ == "Apache-2.0" and "plots" in extras, meta.stdout
