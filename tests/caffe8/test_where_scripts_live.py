"""Where scripts and notebooks may live beside an editable install (README, "Where scripts and
notebooks live"): inside the clone, in a folder beside it, or beside a clone under another name,
``import caffe8`` is the package. The folder that holds a clone named ``caffe8`` is the one place
where Python sees the clone itself as an empty namespace package ``caffe8``; the README says so."""
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(REPO, "README.md")
PROBE = "import caffe8 as c; c.set_mode_cpu(); print(c.__file__)"


def _import_from(folder):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", PROBE], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def holder(tmp_path):
    """A folder that holds the clone: ``holder/caffe8`` is this repository (a link)."""
    os.symlink(REPO, tmp_path / "caffe8")
    return tmp_path


@pytest.mark.parametrize("where", ["caffe8", "caffe8/prototxt", "notebooks", "caffe8-src-side"])
def test_import_caffe8_finds_the_package_from_the_places_the_readme_names(holder, where):
    if where == "caffe8-src-side":  # beside a clone under another name
        os.rename(holder / "caffe8", holder / "caffe8-src")
        where = "."
    (holder / "notebooks").mkdir()
    out = _import_from(holder / where)
    assert out.returncode == 0, out.stderr
    assert os.path.samefile(out.stdout.strip(), os.path.join(REPO, "caffe8", "__init__.py"))


def test_the_readme_says_where_scripts_go():
    text = open(README, encoding="utf-8").read()
    assert "### Where scripts and notebooks live" in text
    section = text.split("### Where scripts and notebooks live", 1)[1].split("\n#", 1)[0]
    section = " ".join(section.split())
    assert "namespace package" in section and "git clone" in section
