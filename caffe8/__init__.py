"""caffe8: an MPI-native, Caffe-style training engine with an 8-bit float gradient exchange.

``import caffe8 as caffe`` is the public entry point (pycaffe's surface). The attributes load
lazily, so that ``caffe8.cli`` can split BLAS threads among MPI ranks before NumPy is imported.

The floors of the design live at the top of the repository (``engine/``, ``layers/``,
``solvers/``, ``comm/``) and install as ``caffe8.engine`` ... ``caffe8.comm`` (setup.cfg's
``package_dir``). Run from a source tree that is not installed, this package finds them there.
"""
import os as _os

__version__ = "0.1.0"

#: the subpackages: the floors (at the repository's top) and the composition root's own
_SUBPACKAGES = ("engine", "layers", "solvers", "comm", "proto")

_here = _os.path.dirname(_os.path.abspath(__file__))
_root = _os.path.dirname(_here)
if not _os.path.isdir(_os.path.join(_here, "engine")) and \
        _os.path.isfile(_os.path.join(_root, "engine", "__init__.py")):
    __path__.append(_root)  # a source tree: caffe8.engine is <root>/engine


#: modules of the composition root that ``caffe8.<name>`` imports on first use: ``caffe8.ddp``
#: (PyTorch's DDP hook) needs torch, which ``import caffe8`` must never import
_LAZY_MODULES = ("ddp",)


def __getattr__(name):
    # importlib asks for submodule names (``from caffe8 import x``) before importing them;
    # "api" itself must never recurse into here.
    import importlib
    if name == "__all__":  # ``from caffe8 import *``: pycaffe's names (this loads them)
        return list(importlib.import_module("caffe8.api").__all__)
    if name.startswith("__") or name == "api":
        raise AttributeError(name)
    if name in _SUBPACKAGES or name in _LAZY_MODULES:
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module 'caffe8' has no attribute {name!r}") from None
    api = importlib.import_module("caffe8.api")
    try:
        return getattr(api, name)
    except AttributeError:
        raise AttributeError(f"module 'caffe8' has no attribute {name!r}") from None
