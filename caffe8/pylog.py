"""The log of the pycaffe-style API: glog lines written where BVLC's pycaffe writes them.

BVLC's glog writes to file descriptor 2 itself, below Python's ``sys.stderr``: in a terminal
that is the same place, in a notebook the log goes to the kernel's own stderr (the terminal
that started Jupyter) and the cells stay readable. caffe8's pycaffe log does the same.

``GLOG_minloglevel`` (read from the environment as glog does: ``GLOG_minloglevel=1`` drops the
INFO lines, 2 the warnings too) or ``caffe.init_log(level)`` sets the lowest level written;
``caffe.init_log()`` without a level keeps it, as BVLC's ``InitLog``.
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


def min_level():
    """The lowest level written: ``init_log``'s, else ``GLOG_minloglevel``."""
    return env_min_level() if _level is None else _level


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
