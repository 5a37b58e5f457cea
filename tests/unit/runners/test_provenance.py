"""The commit a results file names (runners.results.code_provenance), against git run here independently."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from runners.results import PACKAGE_ROOT, code_provenance

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(directory: Path, *argv: str) -> str:
    return subprocess.run(["git", "-C", str(directory), *argv], capture_output=True, text=True, check=True).stdout.strip()


def _repository(path: Path) -> Path:
    path.mkdir()
    _git(path, "init", "-q")
    (path / "a.txt").write_text("one\n")
    _git(path, "add", "a.txt")
    _git(path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    return path


def test_a_checkout_names_its_commit_and_whether_tracked_files_changed(tmp_path: Path) -> None:
    repo = _repository(tmp_path / "repo")
    assert code_provenance(repo) == {"commit": _git(repo, "rev-parse", "HEAD"), "modified": False}
    (repo / "untracked.txt").write_text("not the code\n")  # untracked files are not a modification
    assert code_provenance(repo)["modified"] is False
    (repo / "a.txt").write_text("two\n")
    assert code_provenance(repo)["modified"] is True


def test_no_checkout_or_a_folder_inside_one_names_no_commit(tmp_path: Path) -> None:
    assert code_provenance(tmp_path) == {"commit": None, "modified": None}
    # an installed copy inside somebody else's repository (a venv in a project) must not take that one's commit
    inner = _repository(tmp_path / "project") / "venv" / "site-packages"
    inner.mkdir(parents=True)
    assert code_provenance(inner) == {"commit": None, "modified": None}


def test_the_running_code_is_described() -> None:
    described = code_provenance()
    if (PACKAGE_ROOT / ".git").exists():
        assert described["commit"] == _git(PACKAGE_ROOT, "rev-parse", "HEAD")
    else:
        assert described == {"commit": None, "modified": None}
