"""The README's examples are real: its comm block parses with the solver schema, its quick start
has exactly two commands, every `caffe8` subcommand it shows exists, and every command and the
Python example run as a new user would run them."""
import hashlib
import os
import re
import shutil
import subprocess
import sys

import pytest

from caffe8.cli import build_parser, translate_caffe_flags
from caffe8.engine.prototxt import parse_text

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, "README.md")


def _text():
    with open(README, encoding="utf-8") as f:
        return f.read()


def test_quick_start_is_two_commands():
    block = re.search(r"## Quick start\s+```\n(.*?)```", _text(), re.S).group(1)
    lines = [l for l in block.splitlines() if l.strip()]
    assert len(lines) == 2
    assert "mpiexec -n 2" in lines[0] and "caffe8 train" in lines[0]
    assert "pytest" in lines[1]


def test_comm_block_parses_as_a_solver_field():
    block = re.search(r"```\n(comm \{.*?\n\})\n```", _text(), re.S).group(1)
    sp = parse_text(block, "README.md", "SolverParameter")
    assert sp.comm.codec == "fp8" and sp.comm.quantile == sp.comm.quantile  # parsed, not NaN
    assert getattr(sp.comm, "async") is True and sp.comm.samples == 1024


def test_subcommands_shown_exist():
    block = re.search(r"## Command line.*?```\n(.*?)```", _text(), re.S).group(1)
    shown = set(re.findall(r"^caffe8 (\w+)", block, re.M))
    sub = build_parser()._subparsers._group_actions[0].choices
    assert shown and shown <= set(sub)


def _block(title_regex, lang=""):
    return re.search(title_regex + r".*?```" + lang + r"\n(.*?)```", _text(), re.S).group(1)


def _argv(line, mpiexec):
    """A README command line as argv: `caffe8` → this Python's `-m caffe8.cli`."""
    words = line.split("#")[0].split()
    out = []
    for w in words:
        if w == "caffe8":
            out += [sys.executable, "-m", "caffe8.cli"]
        elif w == "mpiexec":
            out.append(mpiexec)
        else:
            out.append(w)
    return out


def test_the_walkthrough_says_how_to_reach_the_venvs_commands():
    """Bare `caffe8` / `mpiexec` below the quick start work only with the venv active."""
    text = _text()
    intro = text[text.index("## Quick start"):text.index("## Command line")]
    assert ". .venv/bin/activate" in intro and ".venv/bin/caffe8" in intro
    assert "caffe8 --version" in intro


def test_each_training_example_has_its_own_prefix_and_the_resume_trains_on():
    """The -weights and -snapshot examples use solvers whose snapshot prefixes differ from the
    quick start's, and the resumed solver's max_iter lies past the snapshot's iteration."""
    from caffe8.engine.prototxt import parse_file
    quick = _block(r"## Quick start\s+").splitlines()[0]
    lines = [l.split() for l in _block(r"## Command line").splitlines() if " train " in l]
    solvers = {"quick": quick.split("-solver ")[1].split()[0]}
    for words in lines:
        flag = "weights" if "-weights" in words else "snapshot"
        solvers[flag] = words[words.index("-solver") + 1]
        source = words[words.index("-" + flag) + 1]
        assert source.startswith("runs/digits/digits_iter_1000."), source
    params = {k: parse_file(os.path.join(REPO, v), "SolverParameter") for k, v in solvers.items()}
    prefixes = {k: p.snapshot_prefix for k, p in params.items()}
    assert len(set(prefixes.values())) == 3, prefixes
    assert params["snapshot"].max_iter > params["quick"].max_iter == 1000


def _files(root):
    """{path: (mtime_ns, sha256)} of the files under ``root`` (not through the prototxt link)."""
    state = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                with open(path, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                state[os.path.relpath(path, root)] = (os.stat(path).st_mtime_ns, digest)
    return state


def _unchanged(before, after, step):
    changed = sorted(p for p, v in before.items() if after.get(p) != v)
    assert not changed, f"{step!r} overwrote or removed the output of an earlier step: {changed}"


@pytest.mark.mpi
def test_every_readme_command_and_the_python_example_run(tmp_path):
    """As a new user: the quick start's training under mpiexec, then every line of the
    command-line block, then the Python example, in a fresh working directory, in order; no
    step changes a file an earlier step wrote."""
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(mpiexec):
        mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("no mpiexec")
    os.symlink(os.path.join(REPO, "prototxt"), tmp_path / "prototxt")
    env = dict(os.environ, PYTHONPATH=REPO)
    quick = _block(r"## Quick start\s+").splitlines()[0]
    train = quick[quick.index("mpiexec"):].replace(".venv/bin/", "")
    commands = [train] + [l for l in _block(r"## Command line").splitlines() if l.strip()]
    outputs = {}
    for line in commands:
        before = _files(tmp_path)
        r = subprocess.run(_argv(line, mpiexec), cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=600)
        assert r.returncode == 0, f"{line}\n{r.stdout[-3000:]}"
        assert "Traceback" not in r.stdout, line
        _unchanged(before, _files(tmp_path), line)
        outputs[line] = r.stdout
    assert (tmp_path / "runs" / "digits" / "digits.caffemodel.h5").exists()
    version = next(out for line, out in outputs.items() if "--version" in line)
    assert version.strip() == f"caffe8 {_version()}"
    resume = next(out for line, out in outputs.items() if "-snapshot" in line)
    assert re.search(r"Iteration 1200, loss", resume), resume[-2000:]   # it trained on
    for prefix in ("finetune_iter_100", "resumed_iter_1200"):
        assert (tmp_path / "runs" / "digits" / f"{prefix}.caffemodel").exists()
    example = _block(r"## Python API", "python")
    before = _files(tmp_path)
    r = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    _unchanged(before, _files(tmp_path), "the Python example")
    accuracy = float(re.search(r"accuracy ([\d.]+)", r.stdout).group(1))
    assert accuracy > 0.8, r.stdout


def _version():
    """The package's release (setup.cfg reads caffe8.__version__), with this clone's commit."""
    import configparser
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(REPO, "setup.cfg"))
    assert cfg["metadata"]["version"] == "attr: caffe8.__version__"
    from caffe8.version import describe
    return describe(REPO)


def test_version_is_the_packages():
    r = subprocess.run([sys.executable, "-m", "caffe8.cli", "--version"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=REPO))
    assert r.returncode == 0 and r.stdout.strip() == f"caffe8 {_version()}"


@pytest.mark.mpi
def test_the_across_nodes_command_runs(tmp_path):
    """The "On a cluster" command as a new user runs it (as root, from a fresh folder with the
    quick start's venv): digits trained on 2 emulated nodes. Under a namespace prefix of its own,
    so that a cluster the user has up is left alone; skipped where namespaces cannot be made."""
    from caffe8.cluster import EmulatedCluster, available
    ok, why = available()
    if not ok:
        pytest.skip(why)
    line = _block(r"## On a cluster").splitlines()[0].split("#")[0]
    words = line.split()
    assert words[:3] == [".venv/bin/caffe8", "cluster", "run"], line
    argv = [sys.executable, "-m", "caffe8.cli", "cluster", "run", "--prefix", "c8r"]
    for w in words[3:]:
        argv += [sys.executable, "-m", "caffe8.cli"] if w == ".venv/bin/caffe8" else [w]
    os.symlink(os.path.join(REPO, "prototxt"), tmp_path / "prototxt")
    env = dict(os.environ, PYTHONPATH=REPO)
    try:
        r = subprocess.run(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=600)
    finally:
        EmulatedCluster(prefix="c8r").down()
    if r.returncode != 0 and re.search(r"caffe8: error: 'ip [^\n]*' failed", r.stdout):
        pytest.skip(f"namespaces cannot be made here: {r.stdout.strip()[-300:]}")
    assert r.returncode == 0, r.stdout[-3000:]
    assert "2 processes on 2 nodes" in r.stdout, r.stdout[-3000:]
    accuracy = float(re.findall(r"Test net output #0: accuracy = ([\d.]+)", r.stdout)[-1])
    assert accuracy > 0.9, r.stdout[-2000:]


# --- "On GPUs": the install lines name wheel extras, the commands parse, and without a GPU the
# first one stops with the install line (nothing here runs on a GPU) --------------------------
def _gpu_lines():
    return [l for l in _block(r"## On GPUs").splitlines() if l.strip()]


def _extras():
    import configparser
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(REPO, "setup.cfg"))
    return {name: [r for r in value.split("\n") if r.strip()]
            for name, value in cfg["options.extras_require"].items()}


def test_the_gpu_install_lines_name_extras_of_wheels_for_each_cuda_major():
    """Each pip line asks for setup.cfg extras; the CUDA ones pull CuPy's wheel for that CUDA
    major (cupy-cudaNNx), the CUDA libraries caffe8 loads (cuda-toolkit's wheels) and cuDNN's
    (nvidia-cudnn-cuNN), never the `cupy` source package. Whether pip resolves them to wheels
    needs the package index: `pip install --dry-run --report R.json '.[cuda13]'` (by hand)."""
    from caffe8.device import GPU_EXTRAS
    extras = _extras()
    pips = [l for l in _gpu_lines() if " install " in l]
    asked = set()
    for line in pips:
        words = line.split("#")[0].split()
        assert words[:2] == [".venv/bin/pip", "install"] and "-e" in words, line
        spec = re.fullmatch(r"'\.\[([\w,]+)\]'", words[-1])
        assert spec, line
        names = spec.group(1).split(",")
        assert set(names) <= set(extras), (line, sorted(extras))
        asked |= set(names)
    assert {extra for extra, _ in GPU_EXTRAS} <= asked and "gpu" not in extras
    for extra, driver in GPU_EXTRAS:
        major = extra[len("cuda"):]
        reqs = [re.split(r"[<>=\[;\s]", r, 1)[0] for r in extras[extra]]
        assert reqs == [f"cupy-cuda{major}x", "cuda-toolkit", f"nvidia-cudnn-cu{major}"], reqs
        # the CUDA libraries as wheels, no toolkit: those caffe8 loads (tests/caffe8/test_device)
        assert extras[extra][1] == f"cuda-toolkit[cublas,cudart,nvrtc]=={major}.*"
        line = next(l for l in pips if f"{extra}]" in l)
        assert f"driver {driver}" in line and f"CUDA {major}" in line


def test_the_gpu_commands_parse_as_the_cli_reads_them():
    parser = build_parser()
    commands = [l for l in _gpu_lines() if "caffe8 " in l]
    assert any("-gpu all" in l for l in commands) and any("--tf32" in l for l in commands)
    for line in commands:
        words = line.split("#")[0].split()
        argv = words[words.index("caffe8") + 1:]
        args = parser.parse_args(translate_caffe_flags(argv, parser))
        if args.command == "train":
            assert args.gpu in ("0", "all")
            assert os.path.exists(os.path.join(REPO, args.solver)), args.solver


def test_the_gpu_command_without_a_gpu_names_the_readmes_install(tmp_path):
    from caffe8.engine import backend
    if backend.gpu_available():
        pytest.skip("a GPU is here: the command would run")
    line = next(l for l in _gpu_lines() if " -gpu 0" in l)
    os.symlink(os.path.join(REPO, "prototxt"), tmp_path / "prototxt")
    r = subprocess.run(_argv(line, "mpiexec"), cwd=tmp_path, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=REPO))
    assert r.returncode == 1 and "Traceback" not in r.stdout, r.stdout[-2000:]
    assert "caffe8: error: --gpu 0: no CUDA GPU can be used" in r.stdout
    for extra in ("cuda13", "cuda12"):   # the README's extras, for this checkout's folder
        assert f"pip install -e '{REPO}[{extra}]'" in r.stdout, r.stdout
