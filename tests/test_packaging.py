"""The built wheel installs under the project's own name: its only top-level package is
``caffe8`` (the floors land as caffe8.engine ... caffe8.comm, never as a generic ``comm`` that
would overwrite Jupyter's), and it carries the C kernels built at install time, their sources
(for the run-time fallback) and caffe.proto.

The wheel is built from a copy of the tracked and unignored files (``pip wheel --no-deps
--no-build-isolation``: offline, with the venv's setuptools), so that the working tree gets no
build/ or egg-info of its own."""
import os
import subprocess
import sys
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: the modules setup.py builds, as their wheel paths without the ABI suffix
KERNELS = ("caffe8/comm/_kernels", "caffe8/layers/_layer_kernels",
           "caffe8/solvers/_solver_kernels", "caffe8/engine/_gemm_pool")
SOURCES = ("caffe8/comm/csrc/kernels.c", "caffe8/layers/csrc/layer_kernels.c",
           "caffe8/solvers/csrc/solver_kernels.c", "caffe8/engine/csrc/gemm_pool.c",
           "caffe8/engine/proto/caffe.proto")


def _source_copy(dest):
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                           stdout=subprocess.PIPE, check=True).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        src = os.path.join(REPO, name)
        if not os.path.isfile(src):
            continue  # deleted in the working tree, still in the index
        os.makedirs(os.path.join(dest, os.path.dirname(name)), exist_ok=True)
        with open(src, "rb") as fi, open(os.path.join(dest, name), "wb") as fo:
            fo.write(fi.read())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """(path of the built wheel, its file names, its .dist-info texts)."""
    if not os.path.exists(os.path.join(REPO, ".git")):   # a folder, or a worktree's file
        pytest.skip("not a git checkout")
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    _source_copy(str(src))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                        "--no-build-isolation", "--no-index", "-w", str(tmp / "dist"), str(src)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]
    (whl,) = [f for f in os.listdir(tmp / "dist") if f.endswith(".whl")]
    with zipfile.ZipFile(tmp / "dist" / whl) as z:
        meta = {n.split("/")[-1]: z.read(n).decode() for n in z.namelist()
                if ".dist-info/" in n and n.endswith((".txt", "RECORD", "METADATA", "LICENSE"))}
        return str(tmp / "dist" / whl), z.namelist(), meta


def test_the_only_top_level_package_is_caffe8(wheel):
    _, names, meta = wheel
    tops = {n.split("/")[0] for n in names}
    dist_info = {t for t in tops if t.endswith(".dist-info")}
    assert len(dist_info) == 1 and tops - dist_info == {"caffe8"}, sorted(tops)
    for floor in ("engine", "layers", "solvers", "comm"):
        assert f"caffe8/{floor}/__init__.py" in names
    # what pip installs (RECORD) and what the metadata says sits at the top agree
    installed = {line.split(",")[0].split("/")[0] for line in meta["RECORD"].splitlines() if line}
    assert installed - dist_info == {"caffe8"}, sorted(installed)
    assert meta["top_level.txt"].split() == ["caffe8"]


def test_the_wheel_says_its_version_and_carries_the_licence(wheel):
    """setup.cfg's version is caffe8.__version__ (one place), and the BSD-2-Clause LICENSE,
    with BVLC Caffe's notice for its caffe.proto, travels in the wheel."""
    import caffe8
    _, _, meta = wheel
    assert f"\nVersion: {caffe8.__version__}\n" in meta["METADATA"]
    assert "License: BSD-2-Clause" in meta["METADATA"] or \
        "License-Expression: BSD-2-Clause" in meta["METADATA"], meta["METADATA"][:2000]
    with open(os.path.join(REPO, "LICENSE")) as f:
        assert meta["LICENSE"] == f.read()
    assert "BSD 2-Clause" in meta["LICENSE"] and "The Regents of the University of California" \
        in meta["LICENSE"]


def test_the_wheel_carries_the_built_kernels_and_their_sources(wheel):
    _, wheel_names, meta = wheel
    for kernel in KERNELS:
        built = [n for n in wheel_names if n.startswith(kernel + ".") and n.endswith(".so")]
        assert len(built) == 1, (kernel, [n for n in wheel_names if n.endswith(".so")])
    for source in SOURCES:
        assert source in wheel_names
    assert "caffe8 = caffe8.cli:main" in meta["entry_points.txt"]


def test_the_installed_package_loads_its_own_kernels(wheel, tmp_path):
    """Installed (pip writes each source a moment after its library), the kernels built at
    install time are the ones loaded: nothing is compiled into the per-user cache."""
    target, cache = tmp_path / "site", tmp_path / "cache"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                        "--target", str(target), wheel[0]], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "from caffe8.comm import kernels; from caffe8.layers import native as ln; "
            "from caffe8.solvers import native as sn; "
            "print(kernels._find_library()[1]); print(ln.__file__, sn.__file__)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["CAFFE8_CACHE_DIR"] = str(cache)
    r = subprocess.run([sys.executable, "-c", code, str(target)], cwd=str(tmp_path), env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:]
    comm_lib, modules = r.stdout.strip().splitlines()[-2:]
    assert comm_lib.startswith(str(target / "caffe8" / "comm" / "_kernels.")), r.stdout
    assert all(m.startswith(str(target)) for m in modules.split()), modules
    assert not cache.exists() or not os.listdir(cache), os.listdir(cache)


def test_test_module_basenames_are_unique():
    """pytest imports test modules by basename (the test folders are not packages): two files
    of one name in different folders stop a whole-suite run at collection."""
    root = os.path.dirname(os.path.abspath(__file__))
    seen = {}
    for folder, _, files in os.walk(root):
        for name in files:
            if name.startswith("test_") and name.endswith(".py"):
                seen.setdefault(name, []).append(os.path.relpath(os.path.join(folder, name), root))
    assert not {n: p for n, p in seen.items() if len(p) > 1}
