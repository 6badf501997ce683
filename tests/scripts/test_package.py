"""scripts/ and studies/ are packages run from the repository root as ``python -m
scripts.<name>`` and ``python -m studies.<folder>.<name>``: every module imports under that name
(no ``sys.path`` changes anywhere in them), every command has a ``main``, ``-m`` runs one (its
--help), and every study folder has its README naming the commands of its modules. Neither is
part of the package: from a source tree ``caffe8.scripts`` and ``caffe8.studies`` do not import
(caffe8/__init__.py maps the four floors alone), and studies/ and scripts/ import nothing from
tests/."""
import ast
import importlib
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(REPO, "scripts")
STUDIES = os.path.join(REPO, "studies")
#: scripts that also run as files (``python scripts/x.py``) by a guarded path fix of their own
FILE_MODE = ("gpu_check",)
MODULES = sorted(f[:-3] for f in os.listdir(SCRIPTS) if f.endswith(".py") and f != "__init__.py")
FOLDERS = sorted(d for d in os.listdir(STUDIES) if os.path.isdir(os.path.join(STUDIES, d))
                 and not d.startswith("__"))
#: the studies' commands (a module whose name starts with "_" is a helper of its folder's)
STUDY_MODULES = sorted(f"{d}.{f[:-3]}" for d in FOLDERS for f in os.listdir(os.path.join(STUDIES, d))
                       if f.endswith(".py") and not f.startswith("_"))


def path_changes(source):
    """Lines of ``sys.path.insert(...)`` / ``sys.path[...] = ...`` in ``source``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr == "insert" and ast.unparse(node.func.value) == "sys.path":
            out.append(node.lineno)
        if isinstance(node, ast.Assign) and any(ast.unparse(t).startswith("sys.path[")
                                                for t in node.targets):
            out.append(node.lineno)
    return out


def test_path_changes_are_found():
    assert path_changes("import sys\nsys.path.insert(0, 'x')\ndef f():\n"
                        "    sys.path[:0] = ['y']\n") == [2, 4]
    assert path_changes("import sys\nsys.path.append('x')\n") == []


@pytest.mark.parametrize("name", MODULES)
def test_module_imports_from_the_package_without_path_changes(name):
    with open(os.path.join(SCRIPTS, name + ".py"), encoding="utf-8") as f:
        changes = path_changes(f.read())
    assert len(changes) == (name in FILE_MODE), f"scripts/{name}.py changes sys.path: {changes}"
    module = importlib.import_module(f"scripts.{name}")
    assert callable(getattr(module, "main", None)), f"scripts/{name}.py has no main()"


@pytest.mark.parametrize("name", STUDY_MODULES)
def test_study_imports_as_a_module_with_a_main(name):
    folder, module = name.split(".")
    with open(os.path.join(STUDIES, folder, module + ".py"), encoding="utf-8") as f:
        assert path_changes(f.read()) == [], f"studies/{folder}/{module}.py changes sys.path"
    assert callable(getattr(importlib.import_module(f"studies.{name}"), "main", None))


@pytest.mark.parametrize("folder", FOLDERS)
def test_each_study_folder_has_a_readme_with_its_commands(folder):
    with open(os.path.join(STUDIES, folder, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    shown = set(re.findall(rf"python -m studies\.{folder}\.(\w+)", readme))
    modules = {m.split(".")[1] for m in STUDY_MODULES if m.startswith(folder + ".")}
    assert modules and shown == modules, (sorted(shown), sorted(modules))


@pytest.mark.parametrize("name", ["scripts.cluster_bench", "studies.scaling.weak_scaling",
                                  "studies.perf_model.validate"])
def test_python_m_runs_a_script(name):
    res = subprocess.run([sys.executable, "-m", name, "--help"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.startswith("usage: ")


def _python(code, isolated):
    """Run ``code`` from the repository root; ``isolated``: with ``-S`` and the libraries' folders
    on PYTHONPATH, so that no .pth file runs (setuptools' editable finder is one) and only the
    source tree maps caffe8's names."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if isolated:
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and
                                            os.path.abspath(p) != REPO)
    return subprocess.run([sys.executable] + ["-S"] * isolated + ["-c", code], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("isolated", [True, False], ids=["without-site", "with-site"])
@pytest.mark.parametrize("name", ["scripts", "studies", "tests"])
def test_the_harness_does_not_import_as_part_of_caffe8(name, isolated):
    out = _python(f"import caffe8.{name}", isolated)
    assert out.returncode != 0 and \
        f"ModuleNotFoundError: No module named 'caffe8.{name}'" in out.stderr, out.stderr[-2000:]


@pytest.mark.parametrize("isolated", [True, False], ids=["without-site", "with-site"])
def test_the_floors_import_from_the_source_tree(isolated):
    code = ("import caffe8.engine.net, caffe8.layers.conv, caffe8.solvers.sgd, caffe8.comm.codecs\n"
            "import caffe8, scripts, studies\n"
            "print(caffe8.engine.net.__file__, caffe8.layers.__file__, caffe8.solvers.__file__, "
            "caffe8.comm.codecs.__file__, caffe8.__file__)")
    out = _python(code, isolated)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [os.path.join(REPO, f) for f in (
        "engine/net.py", "layers/__init__.py", "solvers/__init__.py", "comm/codecs.py",
        "caffe8/__init__.py")]


def test_studies_and_scripts_import_nothing_from_tests():
    for folder in (SCRIPTS, STUDIES):
        for dirpath, _, files in os.walk(folder):
            for name in (f for f in files if f.endswith(".py")):
                with open(os.path.join(dirpath, name), encoding="utf-8") as f:
                    tree = ast.parse(f.read())
                for node in ast.walk(tree):
                    modules = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                               [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                    assert not [m for m in modules if m.split(".")[0] == "tests"], \
                        f"{os.path.join(dirpath, name)}:{node.lineno} imports tests/"
