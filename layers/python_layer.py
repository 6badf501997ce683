"""Python (Caffe's python_layer.hpp): a layer written by the user in Python, as in pycaffe.

``python_param { module: "pyloss" layer: "EuclideanLossLayer" param_str: "..." }`` imports
``module`` (from ``sys.path`` as the process has it, plus the folder of the prototxt that
declared the layer), instantiates ``layer`` — with the LayerParameter as its one argument when its
constructor takes one (pycaffe's ``caffe.Layer`` does), else with none — and sets the attributes
pycaffe sets: ``param_str`` (string), ``phase`` (0 = TRAIN, 1 = TEST, Caffe's enum values) and
``blobs``, a list of caffe8 Blobs with pycaffe's ``add_blob(*shape)``; Blobs added there are the
layer's learnable parameters. Then Caffe's calls, with caffe8 Blobs:

    setup(bottom, top)                       once, at layer setup
    reshape(bottom, top)                     before every forward
    forward(bottom, top)
    backward(top, propagate_down, bottom)

A module or class that cannot be imported, a missing method, or an exception raised by the
user's code becomes one LayerError naming the layer (with the original exception's text). An
exception from the user's own methods keeps its type, as pycaffe lets it through: the error is
of a class derived from both LayerError and the original one (``except RuntimeError`` and
``except CaffeError`` both catch it; see :func:`layer_error_like`).
``share_in_parallel`` is accepted and has no effect: every caffe8 rank is its own process.

Layers written for pycaffe begin with ``import caffe`` and subclass ``caffe.Layer``. Just
before the user's module is imported, :data:`before_import` runs (set by the composition root:
caffe8's ``caffe`` alias, ``caffe8.caffe_alias``, which answers ``import caffe`` with caffe8 when
no other module of that name can be found), so such files run unchanged; a real pycaffe
installation always wins. When that
other ``caffe`` cannot load (BVLC's unbuilt python/ folder on sys.path: "No module named
'caffe._caffe'"), the error says where it was found and that ``import caffe8 as caffe`` is the way.
"""
import importlib
import importlib.util
import inspect
import os
import sys

import numpy

from caffe8.engine.blob import Blob
from caffe8.engine.errors import CaffeError, LayerError
from caffe8.engine.layer import Layer, register_layer

PHASES = {"TRAIN": 0, "TEST": 1}

#: called before a user's layer module is imported: what offers it the modules it imports
#: under pycaffe's names (``import caffe``), set by the composition root
before_import = None


class BlobList(list):
    """The Python layer's ``self.blobs``: a list of Blobs with pycaffe's ``add_blob``."""

    def __init__(self, dtype):
        super().__init__()
        self.dtype = dtype

    def add_blob(self, *shape):
        self.append(Blob(shape, self.dtype))
        return self[-1]


def _prototxt_folder(layer_param):
    where = getattr(layer_param, "_where", "")
    return os.path.dirname(os.path.abspath(where)) if where and os.path.isfile(where) else None


def _import_module(name, folder):
    """Import ``name`` with ``folder`` searched after the process's own sys.path."""
    if before_import is not None:
        before_import()
    if folder is None or folder in sys.path:
        return importlib.import_module(name)
    sys.path.append(folder)
    try:
        return importlib.import_module(name)
    finally:
        try:
            sys.path.remove(folder)
        except ValueError:
            pass


def _foreign_caffe_hint(err):
    """The advice for a user module that failed inside a ``caffe`` package other than caffe8
    (BVLC's unbuilt python/ folder on sys.path: "No module named 'caffe._caffe'"), else ""."""
    try:
        spec = importlib.util.find_spec("caffe")
    except (ImportError, ValueError):
        return ""
    if spec is None or not spec.origin:
        return ""
    folder = os.path.dirname(os.path.abspath(spec.origin))
    if os.path.isfile(os.path.join(folder, "pynet.py")):  # caffe8 itself, offered as caffe
        return ""
    inside = (getattr(err, "name", None) or "").split(".")[0] == "caffe"
    tb = err.__traceback__
    while tb is not None and not inside:
        inside = os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(folder + os.sep)
        tb = tb.tb_next
    if not inside:
        return ""
    return (f". The module imports `caffe`, found at {folder}, which cannot load here (BVLC's "
            f"pycaffe, not built for this Python); caffe8 stands in for `caffe` only when no "
            f"other is importable: take {os.path.dirname(folder)} off sys.path, or write "
            f"`import caffe8 as caffe` in the layer's module")


def _takes_argument(cls):
    try:
        params = list(inspect.signature(cls).parameters.values())
    except (TypeError, ValueError):
        return True  # a builtin-backed base (such as pycaffe's) takes the LayerParameter
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
               for p in params)


_LIKE = {}


def layer_error_like(original):
    """The LayerError class that is also of ``original``'s type (``LayerError`` itself when the
    two cannot be combined: a type whose constructor needs fixed arguments, a final builtin)."""
    kind = type(original)
    if kind not in _LIKE:
        try:
            derived = type(kind.__name__, (LayerError, kind),
                           {"__module__": kind.__module__, "__qualname__": kind.__qualname__,
                            "__str__": BaseException.__str__})  # KeyError's would quote it
            # LayerError's constructor must reach the original's and give its message
            usable = str(derived("layer", "probe")) == "layer 'layer': probe"
        except TypeError:
            usable = False
        _LIKE[kind] = derived if usable else LayerError
    return _LIKE[kind]


@register_layer("Python")
class PythonLayer(Layer):
    def __init__(self, layer_param, phase="TRAIN", dtype=numpy.float32):
        super().__init__(layer_param, phase, dtype)
        self.user = self._instantiate()
        self.blobs = BlobList(self.dtype)
        self.user.param_str = self.layer_param.python_param.param_str
        self.user.phase = PHASES[self.phase]
        self.user.blobs = self.blobs

    def _instantiate(self):
        pp = self.layer_param.python_param
        if not pp.module or not pp.layer:
            raise self.error(f"python_param needs both module and layer "
                             f"(got module {pp.module!r}, layer {pp.layer!r})")
        try:
            module = _import_module(pp.module, _prototxt_folder(self.layer_param))
        except Exception as e:  # ImportError, or an error raised while the module runs
            raise self._error_like(e, f"cannot import python_param.module '{pp.module}': "
                                   f"{type(e).__name__}: {e}{_foreign_caffe_hint(e)}") from e
        cls = getattr(module, pp.layer, None)
        if cls is None or not callable(cls):
            raise self.error(f"module '{pp.module}' ({getattr(module, '__file__', '?')}) has no "
                             f"class '{pp.layer}' (python_param.layer)")
        try:
            return cls(self.layer_param) if _takes_argument(cls) else cls()
        except Exception as e:
            raise self._error_like(e, f"cannot instantiate {pp.module}.{pp.layer}: "
                                   f"{type(e).__name__}: {e}") from e

    def _call(self, method, *args):
        fn = getattr(self.user, method, None)
        if fn is None:
            raise self.error(f"the Python layer class {type(self.user).__name__} has no "
                             f"{method}() method")
        try:
            return fn(*args)
        except CaffeError:
            raise
        except Exception as e:
            raise self._error_like(e, f"{type(self.user).__name__}.{method}() raised "
                                   f"{type(e).__name__}: {e}") from e

    def _error_like(self, original, message):
        """``self.error(message)``, also of ``original``'s type (pycaffe lets it through)."""
        return layer_error_like(original)(self.name, message, self.type)

    def layer_setup(self, bottom, top):
        self._call("setup", bottom, top)
        if self.blobs is not self.user.blobs:  # the user replaced the list: adopt it
            self.blobs = BlobList(self.dtype)
            self.blobs.extend(self.user.blobs)
            self.user.blobs = self.blobs

    def reshape(self, bottom, top):
        self._call("reshape", bottom, top)

    def forward(self, bottom, top):
        self._call("forward", bottom, top)

    def backward(self, top, propagate_down, bottom):
        self._call("backward", top, propagate_down, bottom)
