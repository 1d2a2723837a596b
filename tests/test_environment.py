"""Where a record came from (``fuzz/environment.py``): the commit, and whether the tree is it."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

from fuzz import environment

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]


def _repo(path: Path) -> Path:
    path.mkdir(parents=True)
    subprocess.run([*GIT, "init", "-q"], cwd=path, check=True)
    return path


def _commit(repo: Path) -> str:
    subprocess.run([*GIT, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*GIT, "commit", "-qm", "x"], cwd=repo, check=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()


def _copy_of_environment_at(path: Path):
    """fuzz/environment.py loaded from ``path``: what it says of the checkout it sits in."""
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(environment.__file__, path)
    spec = importlib.util.spec_from_file_location(f"kvfuzz_env_copy_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_this_checkout_names_its_commit_and_whether_the_tree_differs():
    env = environment.environment()
    assert re.fullmatch(r"[0-9a-f]{40}", env["git_sha"]) and isinstance(env["git_dirty"], bool), env


def test_a_tree_copied_over_an_older_commit_says_it_differs(tmp_path):
    repo = _repo(tmp_path / "repo")
    module = _copy_of_environment_at(repo / "fuzz" / "environment.py")
    sha = _commit(repo)
    assert module.git_sha() == sha and module.git_dirty() is False
    (repo / "untracked.txt").write_text("x")  # an untracked file is not the tree differing
    assert module.git_dirty() is False
    (repo / "fuzz" / "environment.py").write_text(Path(environment.__file__).read_text() + "\n# changed\n")
    assert module.git_sha() == sha and module.git_dirty() is True  # the sha alone would pass it off as sha's
    env = module.environment()
    assert (env["git_sha"], env["git_dirty"]) == (sha, True)


def test_an_installed_copy_inside_another_repository_names_no_commit(tmp_path):
    repo = _repo(tmp_path / "team")
    (repo / "README").write_text("the team's own code")
    _commit(repo)
    module = _copy_of_environment_at(repo / ".venv" / "site-packages" / "fuzz" / "environment.py")
    assert module.git_sha() is None  # the team's HEAD is not kvfuzz's commit
    env = module.environment()
    assert (env["git_sha"], env["git_dirty"]) == (None, None)
    nowhere = tmp_path / "nowhere"
    nowhere.mkdir()
    assert module.git_dirty(nowhere) is None  # not a checkout at all
