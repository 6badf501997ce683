"""``import caffe`` as caffe8, for BVLC's scripts and notebooks unchanged: opt-in, one step.

``caffe8 pycaffe enable`` writes :data:`PTH` into the environment's site-packages; from then on
every Python of that environment (a Jupyter kernel too) finds ``caffe`` as caffe8 — ``import
caffe``, ``from caffe.proto import caffe_pb2``, ``import caffe.io``, ``caffe.draw`` — *unless*
another module named ``caffe`` can be found (BVLC's pycaffe on ``PYTHONPATH`` or put on
``sys.path`` by a notebook): a real pycaffe always wins, so the two coexist. ``caffe8 pycaffe
disable`` removes the file. Nothing of this is installed by default.

The mechanism is the one of setuptools' ``distutils-precedence.pth``: the ``.pth`` line puts a
finder on ``sys.meta_path`` (:class:`CaffeAlias`). It answers ``caffe`` with the caffe8 package
itself, and ``caffe.X`` with the module ``caffe8.X`` (``caffe.net_spec``: caffe8.engine.net_spec,
``caffe.pycaffe``: caffe8.api), the same objects under both names: ``caffe.io.Transformer is
caffe8.io.Transformer``, and no module runs twice. It sits first on ``sys.meta_path`` so that a
``caffe.X`` never reaches the path finder, which would load caffe8's file a second time under
the other name; for ``caffe`` itself it first asks the finders behind it.

Python layers written for pycaffe (``import caffe`` in the layer's module) get the same finder
without the opt-in, just before their module is imported (``layers.python_layer``).
"""
import importlib
import importlib.abc
import importlib.machinery
import os
import sys

#: the file ``caffe8 pycaffe enable`` writes into site-packages
PTH = "caffe8-import-caffe.pth"
#: its one line: a guarded import, so that an environment whose caffe8 was uninstalled since
#: starts Python without a word (site runs each ``import`` line of a .pth file at start-up)
PTH_LINE = ("import importlib.util as _u; _u.find_spec('caffe8') and "
            "__import__('caffe8.caffe_alias').caffe_alias.install()\n")

ALIAS = "caffe"
#: pycaffe's module names whose caffe8 module has another name
RENAMED = {"net_spec": "caffe8.engine.net_spec", "pycaffe": "caffe8.api", "_caffe": "caffe8.api"}


def _target(fullname):
    """``caffe.X`` -> the caffe8 module name that stands for it."""
    rest = fullname[len(ALIAS) + 1:]
    head, _, tail = rest.partition(".")
    base = RENAMED.get(head, f"caffe8.{head}")
    return f"{base}.{tail}" if tail else base


class CaffeAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """The finder and loader of ``caffe`` and ``caffe.*`` as caffe8's modules."""

    _asking = False       # within _another_caffe: a finder that asks importlib itself gets None

    def find_spec(self, fullname, path=None, target=None):
        if fullname == ALIAS:
            if self._asking or self._another_caffe():
                return None
            module = importlib.import_module("caffe8")
        elif fullname.startswith(ALIAS + ".") and \
                sys.modules.get(ALIAS) is sys.modules.get("caffe8") is not None:
            try:
                module = importlib.import_module(_target(fullname))
            except ModuleNotFoundError as e:
                if e.name != _target(fullname):
                    raise
                return None
        else:
            return None
        spec = importlib.machinery.ModuleSpec(fullname, self, origin=getattr(module, "__file__",
                                                                             None),
                                              is_package=hasattr(module, "__path__"))
        spec.loader_state = module
        return spec

    def _another_caffe(self):
        """Whether a finder behind this one finds a ``caffe`` of its own (BVLC's pycaffe). A
        folder named ``caffe`` without ``__init__.py`` (a BVLC clone beside the notebook) is a
        namespace package and no pycaffe: caffe8 goes before it."""
        self._asking = True
        try:
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if isinstance(finder, CaffeAlias) or find is None:
                    continue
                spec = find(ALIAS, None)
                if spec is not None and spec.origin is not None:   # not a bare folder
                    return True
            return False
        finally:
            self._asking = False

    def create_module(self, spec):
        module = spec.loader_state
        spec.loader_state = module.__spec__   # the import system sets the alias's spec; kept
        return module

    def exec_module(self, module):
        # the module ran once, under its own name; give it back its own spec
        module.__spec__ = module.__spec__.loader_state


def install():
    """Put the finder first on ``sys.meta_path`` (once per process)."""
    if not any(isinstance(f, CaffeAlias) for f in sys.meta_path):
        sys.meta_path.insert(0, CaffeAlias())


def site_packages():
    """The site-packages folder of the Python running caffe8 (a venv's own)."""
    import sysconfig
    return sysconfig.get_paths()["purelib"]


def enable(folder=None):
    """Write :data:`PTH` into ``folder`` (default :func:`site_packages`); returns its path."""
    path = os.path.join(folder or site_packages(), PTH)
    with open(path, "w") as f:
        f.write(PTH_LINE)
    return path


def disable(folder=None):
    """Remove :data:`PTH` from ``folder``; returns its path, or None when it was not there."""
    path = os.path.join(folder or site_packages(), PTH)
    try:
        os.remove(path)
    except FileNotFoundError:
        return None
    return path
