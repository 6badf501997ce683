"""pycaffe's log (caffe8.pylog) as BVLC's: glog lines on file descriptor 2 itself, not through
``sys.stderr``; GLOG_minloglevel honoured, and ``caffe.init_log()`` keeps it (only
``init_log(level)`` changes it). In a Jupyter kernel, which forwards file descriptor 2 into the
cells (ipykernel >= 6), the INFO lines are off unless GLOG_minloglevel or init_log asks for
them: checked in a real kernel through nbclient."""
import os
import subprocess
import sys
import textwrap

NET = 'layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 1 } } }'

# a Python-level sys.stderr of its own (IPython's, a test harness's) gets none of the log
PROGRAM = textwrap.dedent('''
    import io, sys
    cell = io.StringIO()
    sys.stderr = cell
    import caffe8 as caffe
    {before}
    open("net.prototxt", "w").write({net!r})
    caffe.Net("net.prototxt", caffe.TEST)
    caffe.log("said by caffe.log")
    sys.__stdout__.write("CELL:" + repr(cell.getvalue()) + "\\n")
''')


def run(tmp_path, before="", env_level=None):
    env = {"PATH": "/usr/bin:/bin"}
    if env_level is not None:
        env["GLOG_minloglevel"] = env_level
    code = PROGRAM.format(before=before, net=NET)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    cell = out.stdout.split("CELL:", 1)[1]
    return cell, out.stderr  # out.stderr: what reached file descriptor 2


def test_the_log_goes_to_fd_2_not_through_sys_stderr(tmp_path):
    cell, fd2 = run(tmp_path)
    assert cell.strip() == "''"
    assert "Initializing net from parameters" in fd2 and "Network initialization done." in fd2
    assert "] said by caffe.log" in fd2
    assert all(line[0] in "IWE" for line in fd2.splitlines())


def test_glog_minloglevel_silences_it_and_init_log_without_a_level_keeps_that(tmp_path):
    _, fd2 = run(tmp_path, env_level="1")
    assert fd2 == ""
    _, fd2 = run(tmp_path, before="caffe.init_log()", env_level="1")  # BVLC's InitLog()
    assert fd2 == ""
    _, fd2 = run(tmp_path, before="caffe.init_log(0)", env_level="1")  # InitLogLevel(0)
    assert "Network initialization done." in fd2
    _, fd2 = run(tmp_path, before="caffe.init_log(1)")
    assert fd2 == ""


# --- in a real Jupyter kernel (nbclient + ipykernel, the `test` extra) ----------------------------
GLOG_LINE = r"^[IWE]\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ [^ ]+:\d+\] "

NOTEBOOK_CELLS = [
    # a notebook as BVLC's: a net written with NetSpec, a solver stepped from Python
    textwrap.dedent('''
        import sys
        import numpy as np
        import caffe                       # as BVLC's notebooks, after `caffe8 pycaffe enable`
        from caffe import layers as L
        from caffe.proto import caffe_pb2
        n = caffe.NetSpec()
        n.data, n.label = L.DummyData(shape=[dict(dim=[8, 6]), dict(dim=[8])],
                                      data_filler=[dict(type="gaussian"), dict(type="constant")],
                                      ntop=2)
        n.ip = L.InnerProduct(n.data, num_output=3, weight_filler=dict(type="xavier"))
        n.loss = L.SoftmaxWithLoss(n.ip, n.label)
        open("net.prototxt", "w").write(str(n.to_proto()))
        open("solver.prototxt", "w").write('net: "net.prototxt" base_lr: 0.1 lr_policy: "fixed" '
                                           'display: 1 max_iter: 20 snapshot_prefix: "snap/s" '
                                           'solver_mode: CPU')
    '''),
    "solver = caffe.SGDSolver('solver.prototxt')\nfor it in range(20):\n    solver.step(1)\n"
    "print('loss', float(solver.net.blobs['loss'].data))",
    "net = caffe.Net('net.prototxt', caffe.TEST)\nprint(sorted(net.blobs))",
    # the command line from a cell: its log is its output, as BVLC's binary's, but no bar
    "!{sys.executable} -m caffe8 train -solver solver.prototxt",
    # GLOG_minloglevel still rules where it is set
    "import os\nos.environ['GLOG_minloglevel'] = '0'\nloud = caffe.Net('net.prototxt', caffe.TEST)",
]
#: ipykernel's thread forwards file descriptor 2 on its own time: what it reads after a cell
#: ended lands in the cell that runs next, so each group of cells is followed by this one
SETTLE = "import time; time.sleep(1)"


def _kernel_spec(folder):
    """A kernel spec of this test's own Python, found through JUPYTER_PATH (not whichever
    `python3` kernel the user's Jupyter would start), whose site folder holds what
    ``caffe8 pycaffe enable`` writes (here a folder of its own, not the venv's)."""
    import json
    from caffe8.cli import main
    site = folder / "site"
    site.mkdir(parents=True)
    assert main(["pycaffe", "enable", "--site-dir", str(site)]) == 0
    spec = folder / "kernels" / "caffe8-test"
    spec.mkdir(parents=True)
    start = (f"import site; site.addsitedir({str(site)!r}); "
             "from ipykernel import kernelapp; kernelapp.launch_new_instance()")
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-c", start, "-f", "{connection_file}"],
        "display_name": "caffe8 test", "language": "python"}))
    return str(folder)


def test_notebook_cells_stay_readable_under_ipykernel(tmp_path, monkeypatch):
    """ipykernel >= 6 forwards file descriptor 2 into the cells: by default a pycaffe session's
    cells (``import caffe`` as BVLC's notebooks say it) hold no INFO lines (a solver stepped 20 times with display 1 wrote ~100), the `!`
    command's cell holds its log but no progress bar, and GLOG_minloglevel=0 brings the log
    back."""
    import re
    import pytest
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("JUPYTER_PATH", _kernel_spec(tmp_path / "jupyter"))
    # ipykernel leaves file descriptor 2 alone under pytest (it looks for PYTEST_CURRENT_TEST):
    # the kernel gets the environment a notebook server would give it
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTEST_CURRENT_TEST", "GLOG_minloglevel")}
    nb = nbformat.v4.new_notebook()
    groups = [NOTEBOOK_CELLS[:3], NOTEBOOK_CELLS[3:4], NOTEBOOK_CELLS[4:]]
    nb.cells = [nbformat.v4.new_code_cell(src) for group in groups for src in group + [SETTLE]]
    work = tmp_path / "work"
    work.mkdir()
    nbclient.NotebookClient(nb, kernel_name="caffe8-test", timeout=300,
                            resources={"metadata": {"path": str(work)}}).execute(env=env)
    texts, at = [], 0
    for group in groups:
        cells = nb.cells[at:at + len(group) + 1]
        texts.append("".join(o.get("text", "") for c in cells for o in c.outputs
                             if o.output_type == "stream"))
        at += len(cells)
    pycaffe, command, loud = texts
    assert len(re.findall(GLOG_LINE, pycaffe, re.M)) <= 5, pycaffe
    assert re.search(r"^loss \d", pycaffe, re.M) and "'ip'" in pycaffe, pycaffe
    assert "Optimization Done." in command and not re.search(r"\d+/20 \[", command), command
    assert len(re.findall(GLOG_LINE, loud, re.M)) > 5 and "Network initialization done." in loud
