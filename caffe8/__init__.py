"""caffe8: an MPI-native, Caffe-style training engine with an 8-bit float gradient exchange.

``import caffe8 as caffe`` is the public entry point (pycaffe's surface). The attributes load
lazily, so that ``caffe8.cli`` can split BLAS threads among MPI ranks before NumPy is imported.

The floors of the design live at the top of the repository (``engine/``, ``layers/``,
``solvers/``, ``comm/``) and install as ``caffe8.engine`` ... ``caffe8.comm`` (setup.cfg's
``package_dir``). Run from a source tree that is not installed, :class:`_SourceTreeFloors` maps
those four names to the repository's folders, and nothing else of its top (``caffe8.scripts``,
``caffe8.studies``, ``caffe8.tests`` do not exist).
"""
import os as _os
import sys as _sys

__version__ = "0.1.0"

#: the floors: folders at the repository's top that install inside caffe8
_FLOORS = ("engine", "layers", "solvers", "comm")
#: the subpackages: the floors and the composition root's own
_SUBPACKAGES = _FLOORS + ("proto",)


class _SourceTreeFloors:
    """Import finder of a source tree (the names setuptools' editable finder maps too):
    ``caffe8.<floor>`` is ``<root>/<floor>`` for the four floors, found for this package only
    (``path``, the parent's ``__path__``, is this package's)."""

    def __init__(self, package_path, root):
        self.package_path, self.root = package_path, root

    def find_spec(self, fullname, path=None, target=None):
        floor = fullname.rpartition(".")[2]
        if path is not self.package_path or floor not in _FLOORS:
            return None
        from importlib.util import spec_from_file_location
        folder = _os.path.join(self.root, floor)
        return spec_from_file_location(fullname, _os.path.join(folder, "__init__.py"),
                                       submodule_search_locations=[folder])


_here = _os.path.dirname(_os.path.abspath(__file__))
_root = _os.path.dirname(_here)
if not _os.path.isdir(_os.path.join(_here, "engine")) and \
        _os.path.isfile(_os.path.join(_root, "engine", "__init__.py")):
    # first, as the path entry it replaces was: this tree's floors, whatever else is installed
    _sys.meta_path.insert(0, _SourceTreeFloors(__path__, _root))


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
