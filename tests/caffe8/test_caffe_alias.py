"""caffe8.caffe_alias / ``caffe8 pycaffe enable``: ``import caffe`` as caffe8, opt-in, beside a
real pycaffe. Each case runs in a fresh Python whose site folder holds (or not) the .pth file,
as a venv's site-packages does."""
import os
import subprocess
import sys

from caffe8 import caffe_alias
from caffe8.cli import main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BVLC_SCRIPT = """
import sys, site
site.addsitedir(sys.argv[1])
import caffe
from caffe.proto import caffe_pb2
import caffe.io
import caffe.draw
from caffe import layers as L, params as P
import caffe8, caffe8.io, caffe8.draw
assert caffe is caffe8 and caffe.io is caffe8.io and caffe.draw is caffe8.draw
assert caffe_pb2 is caffe8.proto.caffe_pb2 and caffe_pb2.SolverParameter().max_iter == 0
# one module under two names, run once, keeping its own spec
assert sys.modules["caffe.io"] is sys.modules["caffe8.io"]
assert caffe.io.__spec__.name == "caffe8.io" and caffe.__spec__.name == "caffe8"
import caffe.net_spec
assert caffe.net_spec.NetSpec is caffe.NetSpec and P.Pooling.MAX == 0
n = caffe.NetSpec()
n.data = L.Input(shape=dict(dim=[1, 3]))
n.ip = L.InnerProduct(n.data, num_output=2)
assert 'type: "InnerProduct"' in str(n.to_proto())
try:
    import caffe.no_such_module
except ModuleNotFoundError as e:
    assert e.name == "caffe.no_such_module", e.name
print("ok")
"""


def _python(code, *args, cwd, env=None):
    env = dict(os.environ if env is None else env)
    env.pop("PYTHONPATH", None)
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=str(cwd), env=env,
                          capture_output=True, text=True, timeout=120)


def test_enabled_bvlc_imports_work_unchanged(tmp_path, capsys):
    site = tmp_path / "site"
    site.mkdir()
    assert main(["pycaffe", "enable", "--site-dir", str(site)]) == 0
    assert (site / caffe_alias.PTH).read_text() == caffe_alias.PTH_LINE
    assert "Undo: caffe8 pycaffe disable" in capsys.readouterr().out
    r = _python(BVLC_SCRIPT, site, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
    assert main(["pycaffe", "disable", "--site-dir", str(site)]) == 0
    assert not (site / caffe_alias.PTH).exists()


def test_not_there_by_default(tmp_path):
    """Without the step, `import caffe` fails even after caffe8 built a net: a script's
    `try: import caffe` still tells whether pycaffe is installed."""
    (tmp_path / "n.prototxt").write_text(
        'layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 1 } } }')
    code = ("import os; os.environ['GLOG_minloglevel'] = '2'\nimport caffe8\n"
            "caffe8.Net('n.prototxt', caffe8.TEST)\n"
            "try:\n    import caffe\nexcept ModuleNotFoundError:\n    print('no caffe')\n")
    r = _python(code, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "no caffe", r.stderr[-3000:]


def test_a_real_pycaffe_on_the_path_wins(tmp_path):
    site = tmp_path / "site"
    caffe_alias.enable(str(site.mkdir() or site))
    real = tmp_path / "bvlc" / "python" / "caffe"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("WHO = 'BVLC'\n")
    (real / "io.py").write_text("WHO = 'BVLC io'\n")
    code = ("import sys, site; site.addsitedir(sys.argv[1])\n"
            "sys.path.insert(0, sys.argv[2])       # a notebook's caffe_root + 'python'\n"
            "import caffe, caffe.io\nprint(caffe.WHO, '|', caffe.io.WHO)\n")
    r = _python(code, site, real.parent, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "BVLC | BVLC io", r.stderr[-3000:]
    # PYTHONPATH, the way BVLC's install guide puts pycaffe on the path
    env = dict(os.environ, PYTHONPATH=str(real.parent))
    code = code.replace("sys.path.insert(0, sys.argv[2])", "pass")
    r = subprocess.run([sys.executable, "-c", code, str(site)], cwd=str(tmp_path), env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "BVLC | BVLC io", r.stderr[-3000:]


def test_a_bvlc_clone_folder_beside_the_notebook_does_not_hide_it(tmp_path):
    """A folder named caffe without __init__.py (a clone of BVLC's repository) would be an
    empty namespace package; the alias goes before it."""
    site = tmp_path / "site"
    caffe_alias.enable(str(site.mkdir() or site))
    (tmp_path / "caffe" / "examples").mkdir(parents=True)
    r = _python("import sys, site; site.addsitedir(sys.argv[1]); import caffe; "
                "print(caffe.__name__, hasattr(caffe, 'Net'))", site, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "caffe8 True", r.stderr[-3000:]


def test_the_line_left_behind_by_an_uninstalled_caffe8_is_silent(tmp_path):
    """pip uninstall leaves the .pth file; Python still starts without a word."""
    site = tmp_path / "site"
    caffe_alias.enable(str(site.mkdir() or site))
    r = subprocess.run([sys.executable, "-S", "-c", "import sys, site; "
                        "site.addsitedir(sys.argv[1]); print('caffe8' in sys.modules)",
                        str(site)], cwd=str(tmp_path), capture_output=True, text=True,
                       timeout=120, env={"PATH": os.environ.get("PATH", "")})
    assert r.returncode == 0 and r.stdout.strip() == "False" and r.stderr == "", r
