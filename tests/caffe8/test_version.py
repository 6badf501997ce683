"""``caffe8 --version`` names the commit when caffe8 runs from a git clone (``0.1.0+g<sha>``,
``.dirty`` with changed tracked files), and says the release alone elsewhere."""
import os
import shutil
import subprocess
import sys

import pytest

import caffe8
from caffe8.version import describe

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _git(folder, *args):
    return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True,
                          check=True, env=dict(os.environ, GIT_AUTHOR_NAME="t",
                                               GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                                               GIT_COMMITTER_EMAIL="t@t")).stdout.strip()


@pytest.fixture
def clone(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("no git")
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "commit", "-q", "-m", "first")
    return tmp_path


def test_a_clone_names_its_commit_and_its_changes(clone):
    sha = _git(clone, "rev-parse", "HEAD")
    version = describe(str(clone))
    release, _, local = version.partition("+g")
    assert release == caffe8.__version__ and len(local) >= 7 and sha.startswith(local), version
    (clone / "a.txt").write_text("two\n")
    assert describe(str(clone)) == version + ".dirty"
    (clone / "new.txt").write_text("untracked files are no change of the commit's\n")
    (clone / "a.txt").write_text("one\n")
    assert describe(str(clone)) == version


def test_no_clone_no_commit_no_git_is_the_release(tmp_path, clone, monkeypatch):
    assert describe(str(tmp_path / "missing")) == caffe8.__version__       # a wheel's site-packages
    empty = tmp_path / "empty"
    empty.mkdir()
    _git(empty, "init", "-q")
    assert describe(str(empty)) == caffe8.__version__                       # no commit yet
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    assert describe(str(clone)) == caffe8.__version__                       # no git program


def test_the_command_says_it(tmp_path):
    r = subprocess.run([sys.executable, "-m", "caffe8", "--version"], cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=REPO))
    assert r.returncode == 0 and r.stdout == f"caffe8 {describe(REPO)}\n", (r.stdout, r.stderr)
    if os.path.exists(os.path.join(REPO, ".git")) and shutil.which("git"):
        head = _git(REPO, "rev-parse", "HEAD")
        assert head.startswith(r.stdout.split("+g")[1].split(".")[0].strip())
