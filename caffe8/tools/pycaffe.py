"""``caffe8 pycaffe enable | disable | status``: ``import caffe`` as caffe8 in this environment.

BVLC's scripts and notebooks say ``import caffe``, ``from caffe.proto import caffe_pb2``,
``import caffe.io``; ``caffe8 pycaffe enable`` lets them run unchanged in the Python environment
caffe8 is installed in (its venv, and the Jupyter kernels of that venv): it writes one ``.pth``
file into that environment's site-packages (``caffe8.caffe_alias``). A real pycaffe that Python
can find (``PYTHONPATH``, a notebook's ``sys.path.insert``) still wins. ``disable`` removes the
file; ``status`` says which ``caffe`` an ``import caffe`` gets here.
"""
NAME = "pycaffe"
HELP = "let import caffe mean caffe8 in this Python environment (enable, disable, status)"
GROUP = "python"


def add_arguments(p):
    p.add_argument("action", choices=("enable", "disable", "status"),
                   help="enable: write the .pth file; disable: remove it; status: which "
                   "`caffe` this environment imports")
    p.add_argument("--site-dir", "--site_dir", dest="site_dir",
                   help="the site-packages folder to write to (default: this Python's, "
                   "sysconfig's purelib)")


def run(args):
    from caffe8 import caffe_alias
    from caffe8.engine.errors import CaffeError
    folder = args.site_dir or caffe_alias.site_packages()
    if args.action == "enable":
        try:
            path = caffe_alias.enable(folder)
        except OSError as e:
            raise CaffeError(f"cannot write {e.filename or folder}: {e.strerror or e}; run it "
                             "with the Python of a virtual environment you own, or give "
                             "--site-dir (e.g. python -m site --user-site)") from None
        print(f"`import caffe` is caffe8 in {folder} ({path}); a pycaffe found on the path "
              "still wins. Undo: caffe8 pycaffe disable")
        return 0
    if args.action == "disable":
        path = caffe_alias.disable(folder)
        print(f"removed {path}" if path else f"{folder} has no {caffe_alias.PTH}: nothing to do")
        return 0
    print(status(folder))
    return 0


def status(folder):
    """One line: whether the alias is enabled in ``folder``, and what ``import caffe`` finds
    in a fresh Python of this environment (which sees the .pth files and PYTHONPATH)."""
    import os
    import subprocess
    import sys
    from caffe8 import caffe_alias
    enabled = os.path.isfile(os.path.join(folder, caffe_alias.PTH))
    code = ("import importlib.util as u; s = u.find_spec('caffe'); "
            "print(s.origin if s and s.origin else '-')")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=60).stdout.strip() or "-"
    import caffe8
    if found == caffe8.__file__:
        what = "caffe8"
    elif found == "-":
        what = "nothing (ModuleNotFoundError)"
    else:
        what = f"another pycaffe, {found}"
    return (f"{caffe_alias.PTH} {'present' if enabled else 'absent'} in {folder}; "
            f"`import caffe` gives {what}")
