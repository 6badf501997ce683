"""pycaffe's ``caffe.Net``, ``Blob`` and layer views over ``engine.net.Net``.

The surface is that of BVLC's ``_caffe.cpp`` bindings plus ``pycaffe.py``'s additions
(``blobs``, ``params``, ``forward``, ``backward``, ``forward_all`` ...), so scripts written for
``import caffe`` run with ``import caffe8 as caffe``. Arrays are those of the engine: NumPy on
the CPU, CuPy after ``set_mode_gpu()``.
"""
import os
from collections import OrderedDict

import numpy

from caffe8.device import check_mode
from caffe8.engine import backend
from caffe8.engine.errors import CaffeError, DataError, LayerError
from caffe8.engine.net import Net as EngineNet
from caffe8.engine.net import PHASES, phase_name


class Blob:
    """pycaffe's Blob: ``data`` / ``diff`` arrays (write into them with ``[...] =``)."""

    __slots__ = ("_blob",)

    def __init__(self, blob):
        self._blob = blob

    @property
    def data(self):
        return self._blob.data

    @property
    def diff(self):
        return self._blob.diff

    @property
    def shape(self):
        return tuple(self._blob.shape)

    @property
    def count(self):
        return self._blob.count

    def _legacy(self, index):
        """Caffe's Blob::LegacyShape: axes past the blob's own read as 1 (at most 4 axes)."""
        shape = self._blob.shape
        if len(shape) > 4:
            raise CaffeError(f"num/channels/height/width need a blob of at most 4 axes, this one "
                             f"has shape {shape}; use .shape")
        return int(shape[index]) if index < len(shape) else 1

    num = property(lambda self: self._legacy(0))
    channels = property(lambda self: self._legacy(1))
    height = property(lambda self: self._legacy(2))
    width = property(lambda self: self._legacy(3))

    def reshape(self, *shape):
        """``blob.reshape(n, c, h, w)`` (or one tuple); call ``net.reshape()`` afterwards."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        self._blob.reshape(tuple(int(s) for s in shape))

    def __repr__(self):
        return f"<caffe8 Blob {self.shape}>"


class Layer:
    """pycaffe's ``caffe.Layer``: the base class of a ``type: "Python"`` layer.

    Subclasses define ``setup(bottom, top)``, ``reshape(bottom, top)``, ``forward(bottom, top)``
    and ``backward(top, propagate_down, bottom)``; caffe8 sets ``param_str``, ``phase`` (0
    TRAIN, 1 TEST) and ``blobs`` (with ``add_blob(*shape)``) before ``setup``.
    """

    type = "Python"

    def __init__(self, layer_param=None):
        self.layer_param = layer_param
        self.param_str = layer_param.python_param.param_str if layer_param is not None else ""
        self.phase = 0
        self.blobs = []


class LayerView:
    """A net's layer as pycaffe shows it: ``type``, ``name``, ``blobs`` (its parameter Blobs),
    ``phase`` (0 / 1)."""

    def __init__(self, layer):
        self._layer = layer

    type = property(lambda self: self._layer.type)
    name = property(lambda self: self._layer.name)
    phase = property(lambda self: PHASES.index(self._layer.phase))

    @property
    def blobs(self):
        return [Blob(b) for b in self._layer.blobs]

    def setup(self, bottom, top):
        """Caffe's Layer::LayerSetUp on lists of Blobs (pycaffe's ``layer.setup``)."""
        self._layer.layer_setup(_engine_blobs(bottom), _engine_blobs(top))

    def reshape(self, bottom, top):
        """Caffe's Layer::Reshape on lists of Blobs (pycaffe's ``layer.reshape``)."""
        self._layer.reshape(_engine_blobs(bottom), _engine_blobs(top))

    def __repr__(self):
        return f"<caffe8 layer {self.name} ({self.type})>"


def _engine_blobs(blobs):
    return [b._blob if isinstance(b, Blob) else b for b in blobs]


def _parse_net_args(args, kwargs):
    """(model, phase, weights, level, stages) from pycaffe's two signatures (_caffe.cpp's
    Net_Init and Net_Init_Load): ``Net(network_file, phase, level=0, stages=None,
    weights=None)``, every argument also by keyword, and ``Net(file, weights, phase)``."""
    kwargs = dict(kwargs)
    if "network_file" in kwargs:
        if args:
            raise CaffeError("Net(): the network file given twice (positionally and as "
                             "network_file=)")
        args = (kwargs.pop("network_file"),)
    if not args:
        raise CaffeError("Net(network_file, phase, ...): the network file is missing")
    extra = set(kwargs) - {"phase", "weights", "level", "stages"}
    if extra:
        raise CaffeError(f"Net(): unexpected keyword argument(s) {sorted(extra)}; accepted: "
                         "network_file, phase, weights, level, stages")
    model, rest = args[0], list(args[1:])
    weights, phase = kwargs.get("weights"), kwargs.get("phase")
    if len(rest) >= 2 and rest[0] is None and str(rest[1]).upper() in PHASES + ("0", "1"):
        raise CaffeError("Net(network_file, pretrained_file, phase): pretrained_file is None; "
                         "give the weights file, or leave it out: Net(network_file, phase)")
    if rest and isinstance(rest[0], (str, os.PathLike)) and str(rest[0]).upper() not in PHASES:
        weights = rest.pop(0)  # the older Net(file, weights, phase)
    if rest:
        phase = rest.pop(0)
    if len(rest) > 2:
        raise CaffeError(f"Net(): too many positional arguments ({len(args)})")
    level = rest[0] if rest else kwargs.get("level", 0)
    stages = rest[1] if len(rest) > 1 else kwargs.get("stages")
    if phase is None:
        raise CaffeError("Net(network_file, phase): give the phase, caffe8.TRAIN or caffe8.TEST")
    if isinstance(stages, str):
        stages = [stages]
    return model, phase_name(phase), weights, int(level or 0), tuple(stages or ())


def require_weights(who, pretrained_file):
    """Classifier and Detector score with trained weights: a None file is one clear error."""
    if pretrained_file is None:
        raise CaffeError(f"{who}(model_file, pretrained_file): pretrained_file is None; give "
                         "the trained weights (.caffemodel) to score with")


class Net:
    """pycaffe's ``caffe.Net`` (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        from caffe8.wiring import register_all
        from caffe8 import pylog
        register_all()
        model, phase, weights, level, stages = _parse_net_args(args, kwargs)
        if not isinstance(model, (str, os.PathLike)) and hasattr(model, "to_proto"):
            model = model.to_proto()  # a NetSpec
        if hasattr(model, "DESCRIPTOR"):  # a caffe_pb2.NetParameter
            from caffe8.engine.proto.convert import from_pb
            model = from_pb(model, "<NetParameter>")
        net = EngineNet(model, phase=phase, level=level, stages=stages, log=pylog.logger())
        self._attach(net)
        if weights is not None:
            self.copy_from(weights)

    @classmethod
    def _wrap(cls, net):
        """The pycaffe view of an engine net (a solver's train and test nets)."""
        self = cls.__new__(cls)
        self._attach(net)
        return self

    def _attach(self, net):
        self._net = net
        self._blob_views = OrderedDict((n, Blob(b)) for n, b in net.blobs.items())
        self._layer_views = [LayerView(l) for l in net.layers]

    # --- the graph ---------------------------------------------------------------------------
    @property
    def blobs(self):
        """OrderedDict (input to output) of blob name → Blob."""
        return OrderedDict(self._blob_views)

    @property
    def params(self):
        """OrderedDict of layer name → list of its parameter Blobs (layers with parameters)."""
        return OrderedDict((lv.name, lv.blobs) for lv in self._layer_views if lv._layer.blobs)

    @property
    def layers(self):
        return list(self._layer_views)

    @property
    def _layer_names(self):
        return list(self._net.layer_names)

    @property
    def _blob_names(self):
        return list(self._net.blobs)

    # _caffe.cpp's raw vectors, which pycaffe.py's dictionaries are built from
    @property
    def _blobs(self):
        return list(self._blob_views.values())

    @property
    def _blob_loss_weights(self):
        return list(self.blob_loss_weights.values())

    @property
    def _inputs(self):
        """Indices (into ``_blob_names``) of the net's input blobs."""
        names = self._blob_names
        return [names.index(n) for n in self.inputs]

    @property
    def _outputs(self):
        """Indices (into ``_blob_names``) of the net's output blobs."""
        names = self._blob_names
        return [names.index(n) for n in self.outputs]

    def _bottom_ids(self, i):
        names = self._blob_names
        return [names.index(n) for n in self._net.bottom_names[i]]

    def _top_ids(self, i):
        names = self._blob_names
        return [names.index(n) for n in self._net.top_names[i]]

    @property
    def layer_dict(self):
        return OrderedDict(zip(self._net.layer_names, self._layer_views))

    @property
    def top_names(self):
        return OrderedDict(zip(self._net.layer_names, (list(t) for t in self._net.top_names)))

    @property
    def bottom_names(self):
        return OrderedDict(zip(self._net.layer_names, (list(b) for b in self._net.bottom_names)))

    @property
    def inputs(self):
        """The tops of the net's Input layers (Caffe's net input blobs)."""
        return [name for layer, tops in zip(self._net.layers, self._net.top_names)
                if layer.type == "Input" for name in tops]

    @property
    def outputs(self):
        """Blobs no layer consumes, sorted by name (Caffe keeps them in a std::set)."""
        return list(self._net.output_blob_names)

    @property
    def blob_loss_weights(self):
        return OrderedDict((n, self._net.blob_loss_weights.get(n, 0.0)) for n in self._net.blobs)

    @property
    def name(self):
        return self._net.name

    # --- running -----------------------------------------------------------------------------
    def _layer_index(self, name, what):
        try:
            return self._net.layer_names.index(name)
        except ValueError:
            raise LayerError(name, f"{what}: no such layer in net '{self._net.name}' (layers: "
                             f"{', '.join(self._net.layer_names)})") from None

    def _set_arrays(self, kwargs, allowed, attr, what):
        if set(kwargs) != set(allowed):
            raise CaffeError(f"{what} arguments {sorted(kwargs)} do not match the net's "
                             f"{'inputs' if attr == 'data' else 'outputs'} {sorted(allowed)}")
        for name, value in kwargs.items():
            target = getattr(self._net.blobs[name], attr)
            value = numpy.asarray(backend.to_numpy(value))
            if value.shape[:1] != target.shape[:1]:
                raise CaffeError(f"blob '{name}': {what} of batch {value.shape[:1]} for a blob of "
                                 f"shape {target.shape} (not batch sized)")
            try:
                target[...] = backend.to_device(value.astype(target.dtype, copy=False), like=target)
            except ValueError as e:
                raise CaffeError(f"blob '{name}': cannot set an array of shape {value.shape} into "
                                 f"a blob of shape {target.shape}: {e}") from None

    def forward(self, blobs=None, start=None, end=None, **kwargs):
        """Set input blobs from ``kwargs``, run layers ``start``..``end`` (names, inclusive),
        return {blob: data} for the outputs (or ``end``'s tops) plus ``blobs``."""
        check_mode("Net.forward")
        blobs = list(blobs or [])
        start_i = 0 if start is None else self._layer_index(start, "forward start")
        if end is None:
            end_i, outputs = len(self._net.layers) - 1, self.outputs + blobs
        else:
            end_i = self._layer_index(end, "forward end")
            outputs = list(self._net.top_names[end_i]) + blobs
        if kwargs:
            self._set_arrays(kwargs, self.inputs, "data", "input")
        self._net.forward_from_to(start_i, end_i)
        return {name: self._net.blobs[name].data for name in dict.fromkeys(outputs)}

    def backward(self, diffs=None, start=None, end=None, **kwargs):
        """Set output diffs from ``kwargs``, run backward from layer ``start`` down to ``end``,
        return {blob: diff} for the inputs (or ``end``'s bottoms) plus ``diffs``."""
        check_mode("Net.backward")
        diffs = list(diffs or [])
        n = len(self._net.layers)
        start_i = n - 1 if start is None else self._layer_index(start, "backward start")
        if end is None:
            end_i, outputs = 0, self.inputs + diffs
        else:
            end_i = self._layer_index(end, "backward end")
            outputs = list(self._net.bottom_names[end_i]) + diffs
        self._net.seed_loss_diffs()
        if kwargs:
            self._set_arrays(kwargs, self.outputs, "diff", "top diff")
        try:
            self._net.backward_from_to(start_i, end_i)
        except Exception as e:  # as pycaffe, backward may run first; say so when it then fails
            if not self._net.forwards and e.args and isinstance(e.args[0], str):
                e.args = (f"{e.args[0]} (Net.backward() ran before any forward pass: layers "
                          "read what forward computed; call net.forward() first)",) + e.args[1:]
            raise
        return {name: self._net.blobs[name].diff for name in dict.fromkeys(outputs)}

    def _batch(self, arrays):
        """Split ``arrays`` (name → N×...) into the net's batches; the last is zero padded."""
        batch = next(iter(self._net.blobs.values())).shape[0]
        num = len(next(iter(arrays.values())))
        for i in range(0, num - num % batch, batch):
            yield {name: a[i:i + batch] for name, a in arrays.items()}
        rest = num % batch
        if rest:
            yield {name: numpy.concatenate([numpy.asarray(a[num - rest:]),
                                            numpy.zeros((batch - rest,) + tuple(a.shape[1:]),
                                                        dtype=numpy.asarray(a).dtype)])
                   for name, a in arrays.items()}

    def forward_all(self, blobs=None, **kwargs):
        """Forward ``kwargs`` (whole data sets) batch by batch; {blob: all outputs}."""
        if not kwargs:
            return {k: backend.to_numpy(v).copy() for k, v in self.forward(blobs=blobs).items()}
        outs = {name: [] for name in dict.fromkeys(self.outputs + list(blobs or []))}
        per_batch = set()  # outputs without a batch axis (a loss): one value per batch
        for batch in self._batch(kwargs):
            for name, value in self.forward(blobs=blobs, **batch).items():
                value = backend.to_numpy(value).copy()
                if value.ndim == 0:
                    per_batch.add(name)
                    outs[name].append(value)
                else:
                    outs[name].extend(value)
        num = len(next(iter(kwargs.values())))
        return {name: numpy.asarray(v) if name in per_batch else numpy.asarray(v)[:num]
                for name, v in outs.items()}

    def forward_backward_all(self, blobs=None, diffs=None, **kwargs):
        """Forward and backward batch by batch; ({blob: outputs}, {blob: diffs})."""
        fwd = {k: kwargs[k] for k in self.inputs if k in kwargs}
        bwd = {k: kwargs[k] for k in self.outputs if k in kwargs}
        f_batches = list(self._batch(fwd)) if fwd else [{}]
        b_batches = list(self._batch(bwd)) if bwd else [{}]
        outs = {name: [] for name in dict.fromkeys(self.outputs + list(blobs or []))}
        grads = {name: [] for name in dict.fromkeys(self.inputs + list(diffs or []))}
        for k in range(max(len(f_batches), len(b_batches))):
            fb = f_batches[k] if k < len(f_batches) else {}
            bb = b_batches[k] if k < len(b_batches) else {}
            for name, value in self.forward(blobs=blobs, **fb).items():
                value = backend.to_numpy(value).copy()
                outs[name].extend(value if value.ndim else [value])
            for name, value in self.backward(diffs=diffs, **bb).items():
                value = backend.to_numpy(value).copy()
                grads[name].extend(value if value.ndim else [value])
        num = len(next(iter(kwargs.values()))) if kwargs else None
        return ({n: numpy.asarray(v)[:num] for n, v in outs.items()},
                {n: numpy.asarray(v)[:num] for n, v in grads.items()})

    def reshape(self):
        """Caffe's Net::Reshape: propagate input shape changes through every layer."""
        for i, layer in enumerate(self._net.layers):
            self._net._reshape(layer, self._net.bottom_vecs[i], self._net.top_vecs[i])

    def clear_param_diffs(self):
        """Caffe's Net::ClearParamDiffs: zero every parameter's diff."""
        self._net.clear_param_diffs()

    # --- _caffe.cpp's NetCallback: run(layer index) around each layer -------------------------
    def before_forward(self, run):
        """``run(i)`` before layer ``i``'s forward, for every layer a forward runs."""
        self._net.add_before_hooks(forward=lambda i, layer: run(i))

    def after_forward(self, run):
        """``run(i)`` after layer ``i``'s forward."""
        self._net.add_forward_hook(lambda i, layer: run(i))

    def before_backward(self, run):
        """``run(i)`` before layer ``i``'s backward step (layers in reverse order)."""
        self._net.add_before_hooks(backward=lambda i, layer: run(i))

    def after_backward(self, run):
        """``run(i)`` after layer ``i``'s backward step (also for layers that need none).
        ``after_backward(nccl)`` with a :class:`caffe8.NCCL` does nothing (BVLC's layer-wise
        reduce: caffe8's MPI exchange is built in)."""
        from caffe8.device import NCCL
        if not isinstance(run, NCCL):
            self._net.add_backward_hook(lambda i, layer: run(i))

    # --- lifetime ------------------------------------------------------------------------------
    def close(self):
        """Join the data layers' prefetch threads and close their files; the net cannot run
        afterwards. ``with caffe8.Net(...) as net:`` closes on leaving the block."""
        self._net.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # --- weights -----------------------------------------------------------------------------
    def copy_from(self, path):
        """Load weights by layer name from a Caffe model: binary proto or HDF5 (told by content)."""
        path = str(path)
        if not os.path.exists(path):
            raise DataError(f"{path}: weights file not found")
        self._net.copy_trained_layers_from(path)

    def share_with(self, other):
        """Use ``other``'s parameter data for the layers of the same name."""
        self._net.share_trained_layers_with(other._net if isinstance(other, Net) else other)

    def save(self, path):
        """Write the weights: HDF5 for a name ending in ``.h5``, else Caffe's binary proto."""
        from caffe8.engine.model_io import save_model
        save_model(self._net, str(path))

    def save_hdf5(self, path):
        self._net.to_hdf5(str(path))

    def load_hdf5(self, path):
        """Caffe's CopyTrainedLayersFromHDF5: the file is read as HDF5 whatever its name."""
        from caffe8.engine.net_hdf5 import copy_trained_layers
        copy_trained_layers(self._net, str(path))

    # --- MemoryData ----------------------------------------------------------------------------
    def set_input_arrays(self, data, labels):
        """Hand ``data`` (N×C×H×W float32) and ``labels`` (N) to the first layer, a MemoryData."""
        if not self._net.layers or self._net.layers[0].type != "MemoryData":
            raise CaffeError("set_input_arrays needs a net whose first layer is a MemoryData layer")
        layer = self._net.layers[0]
        data = numpy.ascontiguousarray(data, dtype=numpy.float32)
        labels = numpy.ascontiguousarray(labels, dtype=numpy.float32)
        if labels.ndim == 1:
            labels = labels[:, None, None, None]
        if data.ndim != 4 or labels.ndim != 4:
            raise CaffeError(f"set_input_arrays: data must be 4-D (got shape {data.shape}) and "
                             f"labels 1-D or 4-D (got shape {labels.shape})")
        if data.shape[0] != labels.shape[0]:
            raise CaffeError(f"set_input_arrays: {data.shape[0]} data items but "
                             f"{labels.shape[0]} labels")
        layer.reset(data, labels)

    def __repr__(self):
        return f"<caffe8 Net {self.name!r}: {len(self._net.layers)} layers>"
