"""Layer base class and the layer registry (keyed by Caffe type string).

The contract is pycaffe's Python layer plus Caffe's one-time setup:

* ``layer_setup(bottom, top)`` — read ``self.layer_param``, create parameter Blobs in
  ``self.blobs`` (filled with ``engine.filler.fill``); called once.
* ``reshape(bottom, top)`` — set top shapes; called before every forward.
* ``forward(bottom, top)`` — write ``top[i].data``.
* ``backward(top, propagate_down, bottom)`` — write ``bottom[i].diff`` where
  ``propagate_down[i]`` (overwrite) and **accumulate** (``+=``) into ``self.blobs[j].diff`` where
  ``self.param_propagate_down[j]``.

Parameter Blobs are rebound by the Net onto one contiguous buffer after setup, so layers must
read ``self.blobs[j].data`` each time rather than keep references to the arrays.
"""
import abc
import functools

import numpy

from caffe8.engine.errors import LayerError, did_you_mean
from caffe8.engine.registry import registrar

LAYERS = {}


#: ``@register_layer("Convolution")``: registers a Layer subclass under its Caffe type string.
register_layer = registrar(LAYERS, "layer type", "type")


def blob_shapes(bottom, top):
    """The shapes of ``bottom`` and ``top``, as ``from_shapes`` records them."""
    return [b.data.shape for b in bottom] + [t.data.shape for t in top]


def from_shapes(reshape):
    """Marks a layer's ``reshape`` that sets its tops (and whatever it keeps for forward) from
    the bottoms' shapes and the layer's parameters alone: called again with bottoms and tops of
    the shapes it last left, it would change nothing. Each call records those shapes
    (``layer.shapes_seen``), and the Net skips the call while they hold
    (``Net.forward_from_to``; Caffe reshapes every layer every pass, which for a small net was a
    quarter of its forward). The mark is the function's: a subclass that overrides ``reshape``
    is reshaped every pass unless it marks its own."""
    @functools.wraps(reshape)
    def recorded(self, bottom, top):
        self.shapes_seen = None            # a reshape that fails leaves nothing to skip by
        reshape(self, bottom, top)
        self.shapes_seen = blob_shapes(bottom, top)
    recorded.from_shapes = True
    return recorded


def create_layer(layer_param, phase="TRAIN", dtype=numpy.float32):
    """Instantiate the registered class for ``layer_param.type``.

    The layer classes live in ``layers/`` and register themselves with ``@register_layer``;
    whoever builds nets imports that package first (``import caffe8`` does).
    """
    cls = LAYERS.get(layer_param.type)
    if cls is None and not LAYERS:
        raise LayerError(layer_param.name, "no layer types are registered: import caffe8 (or the "
                         "layers package) before building a net")
    if cls is None:
        raise unknown_type(layer_param)
    return cls(layer_param, phase, dtype)


def unknown_type(layer_param):
    """The LayerError for a layer whose type is not registered: its place, the closest type."""
    return LayerError(layer_param.name,
                      f"unknown layer type '{layer_param.type}' at "
                      f"{layer_param.location('type')}{did_you_mean(layer_param.type, LAYERS)}; "
                      "known types: " + ", ".join(sorted(LAYERS)))


def check_layer_types(layer_params):
    """Every layer's type registered, checked before a net logs or builds anything (the
    first unknown one raises :func:`unknown_type`'s error)."""
    for layer_param in layer_params:
        if layer_param.type not in LAYERS and LAYERS:
            raise unknown_type(layer_param)


class Layer(abc.ABC):
    type = None
    # Blob-count hints, checked by setup(); None means "no constraint".
    exact_num_bottom = None
    min_bottom = None
    max_bottom = None
    exact_num_top = None
    min_top = None
    max_top = None
    #: loss layers weight top[0] by 1 unless the prototxt says otherwise
    default_loss_weight = 0.0
    #: data layers never backpropagate and never take bottoms
    is_data = False
    #: True while the Net runs a forward and then its backward with nothing writing this
    #: layer's bottoms in between (the trainer's step, ``Net.keep_forward_work``): backward may
    #: then reuse what forward computed from them (Convolution's columns) instead of redoing it
    forward_work_kept = False
    #: indices of the blobs this layer's forward writes itself (BatchNorm's running statistics,
    #: learnable with lr_mult 0 as in Caffe): no exchange sums them, so under data parallelism the
    #: trainer gives every rank rank 0's after each iteration (what Caffe's root solver holds
    #: and snapshots; PyTorch DDP's broadcast_buffers), keeping the ranks' parameters identical
    forward_state_blobs = ()
    #: the bottom and top shapes a ``from_shapes`` reshape last left (None: reshape next pass)
    shapes_seen = None

    @property
    def auto_top_blobs(self):
        """Caffe's AutoTopBlobs, true for its loss layers (those weighted by default): the Net
        adds the tops the prototxt leaves out (old nets often give a loss layer none)."""
        return self.default_loss_weight != 0

    def __init__(self, layer_param, phase="TRAIN", dtype=numpy.float32):
        self.layer_param = layer_param
        self.name = layer_param.name
        self.phase = layer_param.phase if layer_param.has("phase") else phase
        self.dtype = numpy.dtype(dtype)
        self.blobs = []
        self.param_propagate_down = []

    # --- the contract ------------------------------------------------------------------------
    def layer_setup(self, bottom, top):
        """One-time setup; default: nothing."""

    @abc.abstractmethod
    def reshape(self, bottom, top):
        """Set top shapes (every layer defines it)."""

    @abc.abstractmethod
    def forward(self, bottom, top):
        """Write ``top[i].data`` (every layer defines it)."""

    def backward(self, top, propagate_down, bottom):
        """Default: no gradient (data, accuracy)."""

    def allow_force_backward(self, bottom_index):
        """False for inputs that can never take a gradient (labels)."""
        return True

    #: where ``defer_check`` leaves its checks: a Net's list (set when the Net is built)
    check_sink = None

    def defer_check(self, fn):
        """Run ``fn`` (it reads values on the device and raises this layer's error) when the
        Net next reads its loss or starts a forward pass, so that checking data on a GPU does
        not stall the device queue in the middle of the forward pass. Outside a Net: now."""
        if self.check_sink is None:
            fn()
        else:
            self.check_sink.append(fn)

    # --- helpers -----------------------------------------------------------------------------
    def setup(self, bottom, top):
        """Check blob counts, run layer_setup and the first reshape (Caffe's SetUp)."""
        self._check_counts(bottom, top)
        self.layer_setup(bottom, top)
        if not self.param_propagate_down:
            self.param_propagate_down = [True] * len(self.blobs)
        self.reshape(bottom, top)

    def error(self, message):
        """A LayerError naming this layer; ``raise self.error(...)``."""
        return LayerError(self.name, message, self.type)

    def _check_counts(self, bottom, top):
        nb, nt = len(bottom), len(top)
        for limit, ok, what, got in (
                (self.exact_num_bottom, lambda l: nb == l, "takes exactly {} bottom blob(s)", nb),
                (self.min_bottom, lambda l: nb >= l, "takes at least {} bottom blob(s)", nb),
                (self.max_bottom, lambda l: nb <= l, "takes at most {} bottom blob(s)", nb),
                (self.exact_num_top, lambda l: nt == l, "produces exactly {} top blob(s)", nt),
                (self.min_top, lambda l: nt >= l, "produces at least {} top blob(s)", nt),
                (self.max_top, lambda l: nt <= l, "produces at most {} top blob(s)", nt)):
            if limit is not None and not ok(limit):
                raise self.error(f"{what.format(limit)}, got {got}")

    def make_param(self, shape, filler_param):
        """Append a parameter Blob of ``shape`` filled by ``filler_param``; returns it."""
        from caffe8.engine.blob import Blob
        from caffe8.engine.filler import fill
        blob = Blob(shape, self.dtype)
        fill(blob.data, filler_param)
        self.blobs.append(blob)
        return blob
