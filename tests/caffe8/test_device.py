"""caffe8's process-wide settings: seed, CPU/GPU mode, device_query (on a stand-in runtime)."""
import os
from types import SimpleNamespace

import numpy
import pytest

import caffe8 as caffe
from caffe8.device import device_query
from caffe8.engine import backend
from caffe8.engine.errors import CaffeError


def test_set_random_seed_makes_fillers_repeatable(tmp_path):
    path = tmp_path / "n.prototxt"
    path.write_text('layer { name: "d" type: "Input" top: "d" input_param { shape { dim: 1 '
                    'dim: 3 } } }\nlayer { name: "ip" type: "InnerProduct" bottom: "d" top: "ip" '
                    'inner_product_param { num_output: 2 weight_filler { type: "gaussian" } } }')
    caffe.set_random_seed(5)
    a = caffe.Net(str(path), caffe.TEST).params["ip"][0].data.copy()
    caffe.set_random_seed(5)
    b = caffe.Net(str(path), caffe.TEST).params["ip"][0].data
    c = caffe.Net(str(path), caffe.TEST).params["ip"][0].data
    numpy.testing.assert_array_equal(a, b)
    assert not numpy.array_equal(b, c)


NET = ('layer { name: "d" type: "Input" top: "d" input_param { shape { dim: 2 dim: 3 } } }\n'
       'layer { name: "ip" type: "InnerProduct" bottom: "d" top: "ip" '
       'inner_product_param { num_output: 2 } }')


def test_gpu_mode_without_a_gpu_sets_the_mode_and_a_run_names_the_install(tmp_path, monkeypatch):
    """As BVLC's pycaffe: set_mode_gpu() only sets the mode (a notebook goes on past it); the
    net builds, and running it fails with the lines that install GPU support."""
    monkeypatch.setattr(backend, "gpu_available", lambda: False)
    path = tmp_path / "n.prototxt"
    path.write_text(NET)
    try:
        caffe.set_mode_gpu()
        net = caffe.Net(str(path), caffe.TEST)
        for run in (net.forward, net.backward):
            with pytest.raises(CaffeError) as info:
                run()
            text = str(info.value)
            assert "in GPU mode (caffe8.set_mode_gpu())" in text and "no CUDA GPU" in text
            for extra in ("cuda13", "cuda12"):
                assert f"[{extra}]'`" in text
    finally:
        caffe.set_mode_cpu()
    assert net.forward()["ip"].shape == (2, 2)  # back in CPU mode, the same net runs


def test_the_no_gpu_message_says_what_is_missing(monkeypatch):
    import importlib.util
    from caffe8 import device
    monkeypatch.setattr(backend, "gpu_available", lambda: True)
    assert device.no_gpu_message("x") is None
    monkeypatch.setattr(backend, "gpu_available", lambda: False)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "cupy" else real(name, *a))
    assert "CuPy is not installed" in device.no_gpu_message("x")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    monkeypatch.setattr(backend, "cupy", None)
    assert "does not import" in device.no_gpu_message("x")
    monkeypatch.setattr(backend, "cupy", SimpleNamespace())
    assert "sees no CUDA device" in device.no_gpu_message("x")


def test_the_install_line_is_the_checkouts_or_the_packages(monkeypatch, tmp_path):
    """From a source checkout (as the README installs it) the line names its folder, which
    holds the setup.cfg whose extras it asks for; installed from a wheel, the package name."""
    import configparser
    from caffe8 import device
    root = device._source_tree()
    if root is not None:
        cfg = configparser.ConfigParser()
        cfg.read(os.path.join(root, "setup.cfg"))
        extras = cfg["options.extras_require"]
        for extra, _ in device.GPU_EXTRAS:
            assert device.install_line(extra) == f"pip install -e '{root}[{extra}]'"
            assert extra in extras
    monkeypatch.setattr(device, "_source_tree", lambda: None)
    assert device.install_line("cuda12") == "pip install 'caffe8[cuda12]'"


def test_device_query_lines(monkeypatch):
    props = {"name": b"Test GPU", "major": 9, "minor": 0, "totalGlobalMem": 80, "warpSize": 32,
             "sharedMemPerBlock": 48, "regsPerBlock": 64, "maxThreadsPerBlock": 1024,
             "clockRate": 1980000, "multiProcessorCount": 132}
    runtime = SimpleNamespace(getDeviceCount=lambda: 2, getDeviceProperties=lambda i: props)
    monkeypatch.setattr(backend, "gpu_available", lambda: True)
    monkeypatch.setattr(backend, "cupy", SimpleNamespace(cuda=SimpleNamespace(runtime=runtime)))
    lines = device_query("1")
    assert lines[0] == "Querying GPUs 1"
    assert "Name:                           Test GPU" in lines
    assert "Number of multiprocessors:      132" in lines
    assert len(device_query("all")) == 2 * len(lines)
    with pytest.raises(CaffeError, match="no such device"):
        device_query("2")
    with pytest.raises(CaffeError, match="device ids"):
        device_query("x")


def test_device_query_without_a_gpu(monkeypatch):
    monkeypatch.setattr(backend, "gpu_available", lambda: False)
    with pytest.raises(CaffeError, match="no CUDA GPU"):
        device_query()


# --- the GPU extras pull only what caffe8 loads -------------------------------------------------
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: CuPy calls that load a CUDA library the extras leave out (CuPy 14 loads each on first use):
#: cuFFT (cupy.fft), cuSOLVER (linalg's decompositions and solvers), cuSPARSE (cupyx.scipy
#: .sparse), cuRAND (cupy.random) and the libraries' own modules
LEFT_OUT = (r"\.fft\b", r"\bcupyx\b", r"\brandom\s*\.\s*\w+",
            r"\blinalg\s*\.\s*(inv|solve|lstsq|pinv|svd|qr|cholesky|eigh|eigvalsh|det|slogdet|"
            r"matrix_rank|tensorinv|tensorsolve|matrix_power)\b",
            r"\b(cufft|cusolver|cusparse|curand)\b")


def _code_of(path):
    """The file's code without its comments and strings (docstrings say what is not used)."""
    import io
    import tokenize
    with open(path, "rb") as f:
        tokens = [t for t in tokenize.tokenize(f.readline)
                  if t.type not in (tokenize.COMMENT, tokenize.STRING, tokenize.ENCODING)]
    out = io.StringIO()
    for t in tokens:
        out.write(t.string + (" " if t.type == tokenize.NAME else ""))
    return out.getvalue()


def test_the_package_never_calls_what_the_gpu_extras_leave_out():
    """setup.cfg's cuda12/cuda13 bring NVRTC, cuBLAS and the runtime but not cuFFT, cuSOLVER,
    cuSPARSE or cuRAND: no module of the package may reach CuPy's calls that load those (a
    numpy.random generator, ``rng.random``, is the host's and fine)."""
    import re
    found = []
    for floor in ("engine", "layers", "solvers", "comm", "caffe8"):
        for folder, _, names in os.walk(os.path.join(REPO, floor)):
            for name in names:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    code = _code_of(path)
                    for pattern in LEFT_OUT:
                        for m in re.finditer(pattern, code):
                            context = code[max(0, m.start() - 40):m.end()]
                            if "numpy" in context or re.search(r"\b_?rng\b", context):
                                continue     # the host's generator
                            found.append((os.path.relpath(path, REPO), m.group(0)))
    assert not found, found

