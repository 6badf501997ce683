"""The rest of pycaffe's surface, each against BVLC's python/caffe (``_caffe.cpp``'s bindings,
``pycaffe.py``, ``net_spec.py``, ``python/train.py``) and Caffe's C++ it binds (Timer,
Net::ForwardFromTo/BackwardFromTo callbacks, ClearParamDiffs, GetLearningRate)."""
import ast
import os
import subprocess
import sys
import threading
import textwrap

import numpy
import pytest

import caffe8 as caffe
from caffe8 import device
from caffe8.engine.errors import CaffeError
from caffe8.proto import caffe_pb2
from tests.engine.trainer_util import write_solver

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BVLC_PYTHON = "/opt/bvlc/src/python"
FAST = dict(display=0, test_interval=0, test_iter=[], snapshot=0, snapshot_after_train=False)

NET = '''
name: "small"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 4 dim: 3 } } }
layer { name: "label" type: "Input" top: "label" input_param { shape { dim: 4 dim: 2 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 1 }
                              bias_filler { type: "constant" value: 0.5 } } }
layer { name: "relu" type: "ReLU" bottom: "ip" top: "ip" }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "label" top: "loss" }
'''


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small.prototxt"
    path.write_text(NET)
    return str(path)


def _run(net):
    rng = numpy.random.default_rng(0)
    net.blobs["data"].data[...] = rng.standard_normal((4, 3))
    net.blobs["label"].data[...] = rng.standard_normal((4, 2))
    net.forward()
    net.backward()


# --- Timer (Caffe's util/benchmark.cpp) ----------------------------------------------------------
def test_timer_follows_caffes_start_stop_rules(monkeypatch):
    clock = iter([1.0, 1.25, 2.0, 3.0, 3.5, 4.0]).__next__
    monkeypatch.setattr(device.Timer, "_now", staticmethod(clock))
    t = caffe.Timer()
    assert t.ms == 0 and t.seconds == 0            # never run: 0 (Caffe logs a warning)
    t.start()                                      # 1.0
    t.start()                                      # running: ignored (no clock read)
    t.stop()                                       # 1.25
    t.stop()                                       # stopped: ignored
    assert t.ms == pytest.approx(250.0) and t.seconds == pytest.approx(0.25)
    t.start()                                      # 2.0
    assert t.ms == pytest.approx(1000.0)           # reading a running timer stops it (3.0)
    assert t.ms == pytest.approx(1000.0)           # ... so it reads the same afterwards
    t.start()                                      # 3.5: a new interval
    t.stop()                                       # 4.0
    assert t.ms == pytest.approx(500.0)
    with pytest.raises(StopIteration):             # the clock was read exactly 6 times
        clock()


def test_timer_measures_wall_time():
    import time
    t = caffe.Timer()
    t.start()
    time.sleep(0.02)
    t.stop()
    assert 19 <= t.ms < 2000 and t.seconds == pytest.approx(t.ms / 1000)


# --- Net ---------------------------------------------------------------------------------------
def test_clear_param_diffs_zeroes_parameter_diffs_only(small):
    net = caffe.Net(small, caffe.TRAIN)
    _run(net)
    assert all(numpy.any(b.diff != 0) for b in net.params["ip"])
    ip_diff = net.blobs["ip"].diff.copy()
    net.clear_param_diffs()
    assert all(numpy.all(b.diff == 0) for b in net.params["ip"])
    numpy.testing.assert_array_equal(net.blobs["ip"].diff, ip_diff)  # blob diffs untouched


def test_net_callbacks_run_with_the_layer_index_in_caffes_order(small):
    net = caffe.Net(small, caffe.TRAIN)
    calls = []
    for kind in ("before_forward", "after_forward", "before_backward", "after_backward"):
        getattr(net, kind)(lambda i, kind=kind: calls.append((kind, i)))
    _run(net)
    n = len(net.layers)
    # Net::ForwardFromTo: before(i), Forward, after(i) for i = 0..n-1; BackwardFromTo: the same
    # from n-1 down to 0, for every layer (also those that need no backward: the Inputs)
    expect = [(k, i) for i in range(n) for k in ("before_forward", "after_forward")]
    expect += [(k, i) for i in reversed(range(n)) for k in ("before_backward", "after_backward")]
    assert calls == expect
    calls.clear()
    net.forward(start="ip", end="relu")
    assert calls == [("before_forward", 2), ("after_forward", 2),
                     ("before_forward", 3), ("after_forward", 3)]


def test_private_vectors_build_pycaffes_dictionaries(small):
    """pycaffe.py builds blobs, inputs, outputs, blob_loss_weights and top/bottom names from
    _blob_names, _blobs, _inputs, _outputs, _blob_loss_weights, _top_ids and _bottom_ids."""
    net = caffe.Net(small, caffe.TRAIN)
    assert net._layer_names == ["data", "label", "ip", "relu", "loss"]
    assert net._blob_names == list(net.blobs) == ["data", "label", "ip", "loss"]
    assert [b.data is net.blobs[n].data for n, b in zip(net._blob_names, net._blobs)] == [True] * 4
    keys = list(net.blobs.keys())
    assert [keys[i] for i in net._inputs] == net.inputs == ["data", "label"]
    assert [keys[i] for i in net._outputs] == net.outputs == ["loss"]
    assert dict(zip(net._blob_names, net._blob_loss_weights)) == {
        "data": 0, "label": 0, "ip": 0, "loss": 1}
    assert [keys[i] for i in net._bottom_ids(4)] == net.bottom_names["loss"] == ["ip", "label"]
    assert [keys[i] for i in net._top_ids(3)] == net.top_names["relu"] == ["ip"]


def test_layer_reshape_and_setup_on_blobs(small, tmp_path, monkeypatch):
    net = caffe.Net(small, caffe.TRAIN)
    ip = net.layer_dict["ip"]
    net.blobs["data"].reshape(7, 3)
    ip.reshape([net.blobs["data"]], [net.blobs["ip"]])      # Layer::Reshape
    assert net.blobs["ip"].shape == (7, 2)
    (tmp_path / "counting_layer.py").write_text(textwrap.dedent('''
        import caffe8 as caffe
        class Counting(caffe.Layer):
            setups = 0
            def setup(self, bottom, top):
                type(self).setups += 1
            def reshape(self, bottom, top):
                top[0].reshape(*bottom[0].shape)
            def forward(self, bottom, top):
                top[0].data[...] = bottom[0].data
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    py = tmp_path / "py.prototxt"
    py.write_text('layer { name: "d" type: "Input" top: "d" input_param { shape { dim: 2 } } }\n'
                  'layer { name: "c" type: "Python" bottom: "d" top: "c" '
                  'python_param { module: "counting_layer" layer: "Counting" } }')
    pnet = caffe.Net(str(py), caffe.TEST)
    import counting_layer
    assert counting_layer.Counting.setups == 1
    pnet.layers[1].setup([pnet.blobs["d"]], [pnet.blobs["c"]])  # Layer::LayerSetUp
    assert counting_layer.Counting.setups == 2
    assert pnet.layers[1].type == "Python"


def test_net_keyword_forms_of_net_init_and_net_init_load(small, tmp_path):
    """_caffe.cpp: Net_Init(network_file, phase, level=0, stages=None, weights=None) with
    boost's keywords, and the legacy Net_Init_Load(file, weights, phase)."""
    ref = caffe.Net(small, caffe.TEST)
    weights = str(tmp_path / "w.caffemodel")
    ref.save(weights)
    w = ref.params["ip"][0].data
    forms = [caffe.Net(network_file=small, phase=caffe.TEST, weights=weights),
             caffe.Net(small, caffe.TEST, weights=weights),
             caffe.Net(small, phase=caffe.TEST, level=0, stages=["s"], weights=weights),
             caffe.Net(small, weights, caffe.TEST)]
    for net in forms:
        numpy.testing.assert_array_equal(net.params["ip"][0].data, w)
    assert caffe.Net(network_file=small, phase=caffe.TRAIN).params["ip"][0].data.shape == w.shape
    with pytest.raises(CaffeError, match="give the phase"):
        caffe.Net(network_file=small)
    with pytest.raises(CaffeError, match="given twice"):
        caffe.Net(small, network_file=small, phase=caffe.TEST)


def _threads_but_gemm_workers():
    """Live threads, less the host GEMM's workers (engine/blas.py keeps them for the process)."""
    return sum(not t.name.startswith("caffe8-gemm") for t in threading.enumerate())


def test_close_and_the_context_manager_end_the_data_threads(in_digits_cwd):
    before = _threads_but_gemm_workers()
    with caffe.Net(os.path.join(REPO, "prototxt", "digits", "train_val.prototxt"),
                   caffe.TRAIN) as net:
        net.forward()
        assert _threads_but_gemm_workers() > before     # the Data layer's prefetch thread
    assert _threads_but_gemm_workers() == before
    net.close()                                         # twice is fine


# --- Solver ------------------------------------------------------------------------------------
def test_solver_lr_is_caffes_learning_rate(in_digits_cwd, tmp_path):
    solver = caffe.SGDSolver(write_solver(tmp_path, max_iter=10, **FAST))
    p = solver.param   # the digits file: lr_policy "inv"
    assert p.lr_policy == "inv"

    def inv(it):       # Caffe's SGDSolver::GetLearningRate, "inv", in its float Dtype
        return float(numpy.float32(p.base_lr * (1 + p.gamma * it) ** (-p.power)))
    assert solver.lr == pytest.approx(inv(0), rel=1e-6)
    solver.step(3)
    assert solver.lr == pytest.approx(inv(3), rel=1e-6) and solver.lr < inv(0)
    assert caffe.get_solver(write_solver(tmp_path / "a", type="Adam", **FAST)).lr > 0


# --- multi-GPU names on MPI ---------------------------------------------------------------------
def test_multiprocess_names_on_one_process():
    assert caffe.solver_count() == 1 and caffe.solver_rank() == 0
    assert caffe.has_nccl() is False
    caffe.set_solver_count(1)
    caffe.set_solver_rank(0)
    caffe.set_multiprocess(True)
    with pytest.raises(CaffeError, match="mpiexec -n P"):
        caffe.set_solver_count(2)      # BVLC's train.py --gpus 0 1 would spawn two solvers
    with pytest.raises(CaffeError, match="solver rank"):
        caffe.set_solver_rank(1)
    assert isinstance(caffe.NCCL.new_uid(), bytes)


def _bvlc_train_module(monkeypatch):
    """BVLC's python/train.py imported with ``caffe`` = caffe8."""
    import importlib.util
    path = os.path.join(BVLC_PYTHON, "train.py")
    if not os.path.exists(path):
        pytest.skip("BVLC's python/train.py is not at /opt/bvlc/src")
    monkeypatch.setitem(sys.modules, "caffe", caffe)
    spec = importlib.util.spec_from_file_location("bvlc_train", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bvlc_train_py_timing_and_nccl_calls_run(in_digits_cwd, tmp_path, monkeypatch):
    """train.py's solve() body (minus set_mode_gpu/set_device) and its time() callbacks:
    Timers per layer through before/after_forward/backward, NCCL as callback, solver.param."""
    train = _bvlc_train_module(monkeypatch)
    logged = []
    monkeypatch.setattr(caffe, "log", logged.append)
    caffe.set_solver_count(1)
    caffe.set_solver_rank(0)
    caffe.set_multiprocess(True)
    solver = caffe.SGDSolver(write_solver(tmp_path, max_iter=4, **dict(FAST, display=2)))
    nccl = caffe.NCCL(solver, caffe.NCCL.new_uid())
    nccl.bcast()
    train.time(solver, nccl)
    if solver.param.layer_wise_reduce:
        solver.net.after_backward(nccl)
    solver.step(solver.param.max_iter)
    assert solver.iter == 4 and len(logged) == 2      # show_time at iterations 2 and 4
    assert "forw   0 " in logged[0] and "solver total:" in logged[0] and "allreduce:" in logged[0]
    n = len(solver.net.layers)
    assert logged[0].count("forw") == n and logged[0].count("back") == n


@pytest.mark.mpi
def test_solver_count_and_rank_are_the_mpi_world():
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(mpiexec):
        pytest.skip("no mpiexec beside this Python")
    code = ("import os, caffe8 as caffe; caffe.set_solver_count(2); "   # one write: no mix-up
            "os.write(1, f'count {caffe.solver_count()} rank {caffe.solver_rank()}\\n'.encode())")
    r = subprocess.run([mpiexec, "-n", "2", sys.executable, "-c", code], cwd=REPO,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=REPO))
    assert r.returncode == 0, r.stdout[-2000:]
    assert sorted(l for l in r.stdout.splitlines() if l.startswith("count")) == [
        "count 2 rank 0", "count 2 rank 1"]


# --- the package -------------------------------------------------------------------------------
def _bvlc_init_names():
    """The public names BVLC's python/caffe/__init__.py binds (what `from caffe import *`
    gives there: it has no __all__)."""
    path = os.path.join(BVLC_PYTHON, "caffe", "__init__.py")
    if not os.path.exists(path):
        return {"Net", "SGDSolver", "NesterovSolver", "AdaGradSolver", "RMSPropSolver",
                "AdaDeltaSolver", "AdamSolver", "NCCL", "Timer", "init_log", "log",
                "set_mode_cpu", "set_mode_gpu", "set_device", "Layer", "get_solver",
                "layer_type_list", "set_random_seed", "solver_count", "set_solver_count",
                "solver_rank", "set_solver_rank", "set_multiprocess", "has_nccl", "TRAIN",
                "TEST", "Classifier", "Detector", "io", "layers", "params", "NetSpec", "to_proto"}
    names = set()
    for node in ast.parse(open(path).read()).body:
        if isinstance(node, ast.ImportFrom):
            names.update(a.asname or a.name for a in node.names)
    return {n for n in names if not n.startswith("_")}


def test_star_import_exports_pycaffes_names_and_stays_lazy(tmp_path):
    code = ("import sys; import caffe8; lazy = 'numpy' not in sys.modules; "
            "ns = {}; exec('from caffe8 import *', ns); "
            "print(lazy, ' '.join(sorted(k for k in ns if not k.startswith('__'))))")
    r = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), text=True,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120,
                       env=dict(os.environ, PYTHONPATH=REPO))
    assert r.returncode == 0, r.stderr[-2000:]
    lazy, names = r.stdout.split(" ", 1)
    assert lazy == "True"                                  # `import caffe8` loads no NumPy
    assert _bvlc_init_names() <= set(names.split())
    assert "draw" in names.split()          # caffe.draw, as after BVLC's `import caffe.draw`


def test_draw_resolves_as_an_attribute():
    if not os.path.exists(os.path.join(REPO, "caffe8", "draw.py")):
        pytest.skip("caffe8/draw.py is not written yet")
    import caffe8.draw
    assert caffe.draw is caffe8.draw
    with pytest.raises(AttributeError):
        caffe.no_such_name


# --- NetSpec: a layer without tops -------------------------------------------------------------
def test_netspec_takes_a_silence_layer_as_bvlcs_silent_net():
    from caffe8 import layers as L
    n = caffe.NetSpec()
    n.data, n.data2 = L.DummyData(shape=dict(dim=3), ntop=2)
    n.silence_data = L.Silence(n.data, ntop=0)
    n.silence_data2 = L.Silence(n.data2, ntop=0)
    expect = caffe_pb2.NetParameter()   # what BVLC's net_spec.py builds for silent_net()
    dummy = expect.layer.add(name="data", type="DummyData", top=["data", "data2"])
    dummy.dummy_data_param.shape.add(dim=[3])
    expect.layer.add(name="silence_data", type="Silence", bottom=["data"])
    expect.layer.add(name="silence_data2", type="Silence", bottom=["data2"])
    assert n.to_proto() == expect
    with pytest.raises(CaffeError, match="got int"):
        n.x = 3


# --- solver_mode GPU without the GPU -----------------------------------------------------------
def test_solver_mode_gpu_on_the_cpu_is_noted_once(in_digits_cwd, tmp_path, monkeypatch):
    from caffe8 import pylog
    from caffe8.engine import backend
    monkeypatch.setattr(device, "_noted", set())
    monkeypatch.setattr(backend, "gpu_available", lambda: False)
    notes = []
    real = pylog.logger

    def logger(*a, **k):
        log = real(*a, **k)
        return lambda msg, *x, **y: (notes.append(msg), log(msg, *x, **y))
    monkeypatch.setattr(pylog, "logger", logger)
    path = write_solver(tmp_path, max_iter=1, solver_mode="GPU", **FAST)
    caffe.SGDSolver(path)
    caffe.SGDSolver(path)
    gpu_notes = [m for m in notes if "solver_mode is GPU" in str(m)]
    assert gpu_notes == ["solver_mode is GPU but no CUDA GPU / CuPy is available; running on "
                         "the CPU"]
    # the CLI's select_device logs through the same function (and so, the same once)
    from caffe8.tools._run import select_device
    cli_log = []
    select_device(None, "GPU", 0, None, cli_log.append)
    assert not any("solver_mode" in m for m in cli_log)
    monkeypatch.setattr(device, "_noted", set())
    select_device(None, "GPU", 0, None, cli_log.append)
    assert gpu_notes[0] in cli_log


def test_solver_mode_gpu_with_a_gpu_in_cpu_mode_says_how(monkeypatch):
    from caffe8.engine import backend
    monkeypatch.setattr(device, "_noted", set())
    monkeypatch.setattr(backend, "gpu_available", lambda: True)
    monkeypatch.setattr(backend, "on_gpu", lambda: False)
    log = []
    assert "set_mode_gpu()" in device.note_solver_mode("GPU", log.append)
    assert device.note_solver_mode("GPU", log.append) is None and len(log) == 1
    assert device.note_solver_mode("CPU", log.append) is None


# --- a Python layer importing a `caffe` that cannot load --------------------------------------
def test_python_layer_importing_an_unbuilt_pycaffe_says_what_to_do(tmp_path, monkeypatch):
    bvlc = tmp_path / "bvlc_python"          # BVLC's python/ folder, never built: no _caffe.so
    (bvlc / "caffe").mkdir(parents=True)
    (bvlc / "caffe" / "__init__.py").write_text("from .pycaffe import Net\n")
    (bvlc / "caffe" / "pycaffe.py").write_text("from ._caffe import Net\n")
    (tmp_path / "mylayer.py").write_text("import caffe\n\nclass L(caffe.Layer):\n    pass\n")
    (tmp_path / "net.prototxt").write_text(
        'layer { name: "d" type: "Input" top: "d" input_param { shape { dim: 2 } } }\n'
        'layer { name: "py" type: "Python" bottom: "d" top: "p" '
        'python_param { module: "mylayer" layer: "L" } }')
    monkeypatch.delitem(sys.modules, "caffe", raising=False)   # the alias of earlier tests
    monkeypatch.delitem(sys.modules, "mylayer", raising=False)
    monkeypatch.syspath_prepend(str(bvlc))
    with pytest.raises(CaffeError) as err:
        caffe.Net(str(tmp_path / "net.prototxt"), caffe.TEST)
    text = str(err.value)
    assert "No module named 'caffe._caffe'" in text
    assert str(bvlc / "caffe") in text and "import caffe8 as caffe" in text
    assert "\n" not in text


def test_set_mode_gpu_without_a_gpu_fails_when_the_solver_runs(in_digits_cwd, tmp_path,
                                                               monkeypatch):
    """BVLC's order: set_mode_gpu() and the solver's construction pass; step and solve fail,
    naming the install lines, with no "running on the CPU" note (it would not run there)."""
    from caffe8.engine import backend
    monkeypatch.setattr(device, "_noted", set())
    monkeypatch.setattr(backend, "gpu_available", lambda: False)
    path = write_solver(tmp_path, max_iter=1, solver_mode="GPU", **FAST)
    try:
        caffe.set_mode_gpu()
        solver = caffe.SGDSolver(path)
        assert device.note_solver_mode("GPU", print) is None
        for run in (lambda: solver.step(1), solver.solve):
            with pytest.raises(CaffeError, match=r"in GPU mode .*\[cuda13\]'` .*\[cuda12\]'`"):
                run()
        assert solver.iter == 0
    finally:
        caffe.set_mode_cpu()
    solver.step(1)
    assert solver.iter == 1
