"""caffe8: an MPI-native, Caffe-style training engine with an 8-bit float gradient exchange.

``import caffe8 as caffe`` is the public entry point (pycaffe's surface). The attributes load
lazily, so that ``caffe8.cli`` can split BLAS threads among MPI ranks before NumPy is imported.
"""
__version__ = "0.1.0"


def __getattr__(name):
    # importlib asks for submodule names (``from caffe8 import x``) before importing them;
    # "api" itself must never recurse into here.
    if name.startswith("__") or name == "api":
        raise AttributeError(name)
    import importlib
    api = importlib.import_module("caffe8.api")
    try:
        return getattr(api, name)
    except AttributeError:
        raise AttributeError(f"module 'caffe8' has no attribute {name!r}") from None
