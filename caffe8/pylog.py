"""The log of the pycaffe-style API: glog lines written where BVLC's pycaffe writes them.

BVLC's glog writes to file descriptor 2 itself, below Python's ``sys.stderr``, and caffe8's
pycaffe log does the same. In a terminal that is stderr. In a Jupyter notebook it used to be
the kernel's own stderr (the terminal that started Jupyter), but ipykernel 6 and later forwards
file descriptor 2 into the cells as well (its ``capture_fd_output``, on by default), where a
training loop's INFO lines would bury the cell's output: hundreds to thousands of lines in
BVLC's own example notebooks. So in such a kernel the INFO lines are off unless asked for, and
warnings and errors still show.

The lowest level written: ``caffe.init_log(level)`` when it was called with one; else glog's
``GLOG_minloglevel`` when it is set (1 drops the INFO lines, 2 the warnings too; 0 keeps
everything, in a notebook too); else 1 in a Jupyter kernel that forwards file descriptor 2 into
its cells and 0 elsewhere. ``caffe.init_log()`` without a level keeps it, as BVLC's ``InitLog``.
"""
import os
import sys

from caffe8.engine.glog import GLog, env_min_level

_level = None


class _Fd2:
    """glog's sink: file descriptor 2, written directly (what Python wrote to ``sys.stderr``
    before is flushed first, so the two keep their order)."""

    def write(self, text):
        try:
            sys.stderr.flush()
        except (AttributeError, ValueError, OSError):  # a closed or absent sys.stderr
            pass
        data = text.encode("utf-8", "replace")
        while data:
            data = data[os.write(2, data):]

    def flush(self):
        pass


FD2 = _Fd2()


def cells_show_fd2():
    """True in a Jupyter (IPython) kernel that forwards file descriptor 2 into the cells:
    ipykernel's ``IPKernelApp.capture_fd_output`` (ipykernel 6 and later, on by default)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if getattr(shell, "kernel", None) is None:
        return False      # a terminal's IPython, or plain Python
    app = sys.modules.get("ipykernel.kernelapp")
    kernel_app = getattr(app, "IPKernelApp", None)
    if kernel_app is None or not kernel_app.initialized():
        return True       # another kernel: assume it shows what fd 2 gets
    return bool(getattr(kernel_app.instance(), "capture_fd_output", False))


def min_level():
    """The lowest level written: ``init_log``'s, else ``GLOG_minloglevel``, else 1 (warnings)
    where notebook cells show file descriptor 2 and 0 (everything) elsewhere."""
    if _level is not None:
        return _level
    if os.environ.get("GLOG_minloglevel"):
        return env_min_level()
    return 1 if cells_show_fd2() else 0


def logger(rank=0):
    """A GLog on file descriptor 2; INFO lines only on rank 0, as the command line tool."""
    return GLog(stream=FD2, enabled=rank == 0, min_level=min_level())


def init_log(level=None):
    """pycaffe's ``caffe.init_log``: with ``level`` (0 INFO, 1 WARNING, 2 ERROR, 3 nothing),
    the lowest level written from now on; without, the level stays (``GLOG_minloglevel``)."""
    global _level
    if level is not None:
        _level = int(level)


def log(message):
    """pycaffe's ``caffe.log``: one INFO line."""
    logger().info(message, _depth=3)
