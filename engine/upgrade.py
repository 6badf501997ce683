"""Caffe's upgrade of old net and solver files (upgrade_proto.cpp), on ``Message`` objects.

Nets, oldest first:

* V0 (``layers { layer { type: "conv" kernelsize: 5 ... } }``): one flat V0LayerParameter per
  layer. Its ``padding`` layers fold into the pad of the convolution/pooling layer they feed; the
  rest become V1 layers with the type as an enum and the flat fields moved into ``*_param``.
* old data layers: ``scale``, ``mean_file``, ``crop_size``, ``mirror`` of ``data_param``,
  ``image_data_param`` and ``window_data_param`` move into ``transform_param``.
* V1 (``layers { type: CONVOLUTION blobs_lr: 1 ... }``): the enum type becomes the type string,
  ``param`` (share names), ``blob_share_mode``, ``blobs_lr`` and ``weight_decay`` become one
  ``ParamSpec`` (name, share_mode, lr_mult, decay_mult) per blob; the rest is copied.

* BatchNorm layers that declare all three params (the old way of keeping the solver off its
  statistics) get lr_mult 0 and decay_mult 0 on each, other ParamSpec fields kept.

The net's ``input``/``input_dim`` fields are turned into an Input layer later, by
``engine.net_graph.upgrade_net_input``, as before.

Solvers: the ``solver_type`` enum becomes the ``type`` string.

The ``comm`` block (caffe8's own): ``rounding: "seed"``, the old name of Oyama et al.'s rounding,
becomes ``rounding: "oyama"``, with a deprecation note once per job (rank 0's log).
Errors are ``PrototxtError`` naming the file, line and layer.
"""
import os

from caffe8.engine import backend
from caffe8.engine.errors import PrototxtError
from caffe8.engine.message import Message
from caffe8.engine.schema import SCHEMA

V1_TYPE_NAMES = {
    "NONE": "", "ABSVAL": "AbsVal", "ACCURACY": "Accuracy", "ARGMAX": "ArgMax", "BNLL": "BNLL",
    "CONCAT": "Concat", "CONTRASTIVE_LOSS": "ContrastiveLoss", "CONVOLUTION": "Convolution",
    "DECONVOLUTION": "Deconvolution", "DATA": "Data", "DROPOUT": "Dropout",
    "DUMMY_DATA": "DummyData", "EUCLIDEAN_LOSS": "EuclideanLoss", "ELTWISE": "Eltwise",
    "EXP": "Exp", "FLATTEN": "Flatten", "HDF5_DATA": "HDF5Data", "HDF5_OUTPUT": "HDF5Output",
    "HINGE_LOSS": "HingeLoss", "IM2COL": "Im2col", "IMAGE_DATA": "ImageData",
    "INFOGAIN_LOSS": "InfogainLoss", "INNER_PRODUCT": "InnerProduct", "LRN": "LRN",
    "MEMORY_DATA": "MemoryData", "MULTINOMIAL_LOGISTIC_LOSS": "MultinomialLogisticLoss",
    "MVN": "MVN", "POOLING": "Pooling", "POWER": "Power", "RELU": "ReLU", "SIGMOID": "Sigmoid",
    "SIGMOID_CROSS_ENTROPY_LOSS": "SigmoidCrossEntropyLoss", "SILENCE": "Silence",
    "SOFTMAX": "Softmax", "SOFTMAX_LOSS": "SoftmaxWithLoss", "SPLIT": "Split", "SLICE": "Slice",
    "TANH": "TanH", "WINDOW_DATA": "WindowData", "THRESHOLD": "Threshold",
}

V0_TYPES = {
    "accuracy": "ACCURACY", "bnll": "BNLL", "concat": "CONCAT", "conv": "CONVOLUTION",
    "data": "DATA", "dropout": "DROPOUT", "euclidean_loss": "EUCLIDEAN_LOSS",
    "flatten": "FLATTEN", "hdf5_data": "HDF5_DATA", "hdf5_output": "HDF5_OUTPUT",
    "im2col": "IM2COL", "images": "IMAGE_DATA", "infogain_loss": "INFOGAIN_LOSS",
    "innerproduct": "INNER_PRODUCT", "lrn": "LRN",
    "multinomial_logistic_loss": "MULTINOMIAL_LOGISTIC_LOSS", "pool": "POOLING", "relu": "RELU",
    "sigmoid": "SIGMOID", "softmax": "SOFTMAX", "softmax_loss": "SOFTMAX_LOSS", "split": "SPLIT",
    "tanh": "TANH", "window_data": "WINDOW_DATA",
}

SOLVER_TYPE_NAMES = {"SGD": "SGD", "NESTEROV": "Nesterov", "ADAGRAD": "AdaGrad",
                     "RMSPROP": "RMSProp", "ADADELTA": "AdaDelta", "ADAM": "Adam"}

# V0 field -> {V0 layer type: (param message field, its field)}; field None: the layer's own
# transform_param (Caffe writes these V0 fields straight into it).
_V0_FIELDS = {
    "num_output": {"conv": ("convolution_param", "num_output"),
                   "innerproduct": ("inner_product_param", "num_output")},
    "biasterm": {"conv": ("convolution_param", "bias_term"),
                 "innerproduct": ("inner_product_param", "bias_term")},
    "weight_filler": {"conv": ("convolution_param", "weight_filler"),
                      "innerproduct": ("inner_product_param", "weight_filler")},
    "bias_filler": {"conv": ("convolution_param", "bias_filler"),
                    "innerproduct": ("inner_product_param", "bias_filler")},
    "pad": {"conv": ("convolution_param", "pad"), "pool": ("pooling_param", "pad")},
    "kernelsize": {"conv": ("convolution_param", "kernel_size"),
                   "pool": ("pooling_param", "kernel_size")},
    "group": {"conv": ("convolution_param", "group")},
    "stride": {"conv": ("convolution_param", "stride"), "pool": ("pooling_param", "stride")},
    "pool": {"pool": ("pooling_param", "pool")},
    "dropout_ratio": {"dropout": ("dropout_param", "dropout_ratio")},
    "local_size": {"lrn": ("lrn_param", "local_size")},
    "alpha": {"lrn": ("lrn_param", "alpha")},
    "beta": {"lrn": ("lrn_param", "beta")},
    "k": {"lrn": ("lrn_param", "k")},
    "source": {"data": ("data_param", "source"), "hdf5_data": ("hdf5_data_param", "source"),
               "images": ("image_data_param", "source"),
               "window_data": ("window_data_param", "source"),
               "infogain_loss": ("infogain_loss_param", "source")},
    "scale": {None: ("transform_param", "scale")},
    "meanfile": {None: ("transform_param", "mean_file")},
    "cropsize": {None: ("transform_param", "crop_size")},
    "mirror": {None: ("transform_param", "mirror")},
    "batchsize": {"data": ("data_param", "batch_size"),
                  "hdf5_data": ("hdf5_data_param", "batch_size"),
                  "images": ("image_data_param", "batch_size"),
                  "window_data": ("window_data_param", "batch_size")},
    "rand_skip": {"data": ("data_param", "rand_skip"),
                  "images": ("image_data_param", "rand_skip")},
    "shuffle_images": {"images": ("image_data_param", "shuffle")},
    "new_height": {"images": ("image_data_param", "new_height")},
    "new_width": {"images": ("image_data_param", "new_width")},
    "concat_dim": {"concat": ("concat_param", "concat_dim")},
    "det_fg_threshold": {"window_data": ("window_data_param", "fg_threshold")},
    "det_bg_threshold": {"window_data": ("window_data_param", "bg_threshold")},
    "det_fg_fraction": {"window_data": ("window_data_param", "fg_fraction")},
    "det_context_pad": {"window_data": ("window_data_param", "context_pad")},
    "det_crop_mode": {"window_data": ("window_data_param", "crop_mode")},
    "hdf5_output_param": {"hdf5_output": (None, "hdf5_output_param")},
}
_COPIED_V0 = ("name", "type", "blobs", "blobs_lr", "weight_decay")
_TRANSFORM_FIELDS = ("scale", "mean_file", "crop_size", "mirror")
_DATA_PARAMS = {"DATA": "data_param", "IMAGE_DATA": "image_data_param",
                "WINDOW_DATA": "window_data_param"}


def upgrade_net(net):
    """Return ``net`` in today's form (a new Message when it had V0/V1 ``layers``)."""
    if not net.has("layers"):
        _upgrade_batch_norm(net)
        return net
    if net.has("layer"):
        raise PrototxtError(f"{net.location('layers')}: the net has both 'layer' (current) and "
                            f"'layers' (V1) entries; use one form")
    layers = net.layers
    if any(l.has("layer") for l in layers):
        layers = _v0_to_v1(layers)
    for l in layers:
        _move_transform_fields(l)
    out = net.copy()
    out.clear("layers")
    out.layer = [_v1_to_layer(l) for l in layers]
    _upgrade_batch_norm(out)
    return out


def _upgrade_batch_norm(net):
    """Caffe's UpgradeNetBatchNorm (in place)."""
    for layer in net.layer:
        if layer.type == "BatchNorm" and len(layer.param) == 3:
            for spec in layer.param:
                spec.lr_mult = 0.0
                spec.decay_mult = 0.0


def upgrade_solver(solver):
    """Move the old ``solver_type`` enum into the ``type`` string (in place); returns ``solver``."""
    if not solver.has("solver_type"):
        return solver
    if solver.has("type"):
        raise PrototxtError(f"{solver.location('solver_type')}: old 'solver_type' and new 'type' "
                            f"are both given; keep only 'type'")
    loc = solver._locs.get("solver_type")
    solver.type = SOLVER_TYPE_NAMES[solver.solver_type]
    solver.clear("solver_type")
    if loc is not None:
        solver._locs["type"] = loc
    return solver


#: the comm block's old rounding names -> today's
RENAMED_ROUNDINGS = {"seed": "oyama"}
_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


def upgrade_comm(comm):
    """Rename the old spellings of a ``CommParameter`` (in place); returns ``comm``."""
    new = RENAMED_ROUNDINGS.get(comm.rounding) if comm.has("rounding") else None
    if new is not None:
        _note_once(f"{comm.location('rounding')}: comm rounding {comm.rounding!r} is deprecated; "
                   f"read as {new!r} (Oyama et al.'s Algorithm 2: spell it {new!r})")
        comm.rounding = new
    return comm


def _note_once(text):
    """``backend.note_once(text)`` (once per process), from rank 0 only under mpiexec: every
    rank reads the same file, the job notes it once."""
    if all(os.environ.get(var, "0") == "0" for var in _RANK_VARS):
        backend.note_once(text)


# --- V0 -> V1 ------------------------------------------------------------------------------------
def _v0_to_v1(layers):
    """Caffe's UpgradeV0PaddingLayers + UpgradeV0LayerParameter."""
    producer = {}  # blob -> V0 layer that wrote it last
    out = []
    for conn in layers:
        v0 = conn.layer
        where = conn.location()
        if v0.type == "padding":
            for top in conn.top:
                producer[top] = conn
            continue
        bottoms = []
        pad_from = None
        for b in conn.bottom:
            src = producer.get(b)
            if src is not None and src.layer.type == "padding":
                if v0.type not in ("conv", "pool"):
                    raise PrototxtError(f"{where}: V0 layer '{v0.name}' (type {v0.type}) reads "
                                        f"the output of a padding layer; only conv and pool can")
                pad_from = src.layer
                bottoms.append(src.bottom[0])
            else:
                bottoms.append(b)
        for top in conn.top:
            producer[top] = conn
        out.append(_v0_layer(conn, v0, bottoms, pad_from, where))
    return out


def _v0_layer(conn, v0, bottoms, pad_from, where):
    v1 = Message("V1LayerParameter", conn._where)
    v1._locs.update(conn._locs)
    v1.bottom = list(bottoms)
    v1.top = list(conn.top)
    if v0.has("name"):
        v1.name = v0.name
    kind = v0.type
    if v0.has("type"):
        if kind not in V0_TYPES:
            raise PrototxtError(f"{v0.location('type')}: unknown V0 layer type '{kind}'; known: "
                                + ", ".join(sorted(V0_TYPES)))
        v1.type = V0_TYPES[kind]
    for f in ("blobs", "blobs_lr", "weight_decay"):
        if v0.has(f):
            setattr(v1, f, [x.copy() if isinstance(x, Message) else x for x in getattr(v0, f)])
    sets = [(f, getattr(v0, f)) for f in v0.fields() if f not in _COPIED_V0]
    if pad_from is not None:
        sets.append(("pad", pad_from.pad))
    for field, value in sets:
        targets = _V0_FIELDS[field]
        target = targets.get(kind, targets.get(None))
        if target is None:
            raise PrototxtError(f"{v0.location(field)}: V0 field '{field}' does not apply to a "
                                f"'{kind}' layer ('{v0.name}')")
        param_name, sub_field = target
        holder = v1 if param_name is None else getattr(v1, param_name)
        if isinstance(value, Message):
            value = value.copy()
        spec = SCHEMA[holder.type_name][sub_field]
        setattr(holder, sub_field, [value] if spec.repeated else value)
    return v1


# --- old data-layer fields -----------------------------------------------------------------------
def _move_transform_fields(v1):
    """Caffe's UpgradeNetDataTransformation, for one V1 layer."""
    param_name = _DATA_PARAMS.get(v1.type)
    if param_name is None or not v1.has(param_name):
        return
    param = getattr(v1, param_name)
    for f in _TRANSFORM_FIELDS:
        if param.has(f):
            setattr(v1.transform_param, f, getattr(param, f))
            param.clear(f)


# --- V1 -> current ------------------------------------------------------------------------------
_V1_PARAM_FIELDS = [f for f, spec in SCHEMA["V1LayerParameter"].items()
                    if spec.is_message and f.endswith("_param") and f in SCHEMA["LayerParameter"]]


def _v1_to_layer(v1):
    """Caffe's UpgradeV1LayerParameter."""
    layer = Message("LayerParameter", v1._where)
    layer._locs.update({k: v for k, v in v1._locs.items()
                        if k is None or k in SCHEMA["LayerParameter"]})
    for f in ("name", "bottom", "top", "include", "exclude", "loss_weight"):
        if v1.has(f):
            value = getattr(v1, f)
            setattr(layer, f, [x.copy() if isinstance(x, Message) else x for x in value]
                    if isinstance(value, list) else value)
    if v1.has("type"):
        layer.type = V1_TYPE_NAMES[v1.type]
        if "type" in v1._locs:
            layer._locs["type"] = v1._locs["type"]
    if v1.has("blobs"):
        layer.blobs = [b.copy() for b in v1.blobs]
    n = max(len(v1.param), len(v1.blob_share_mode), len(v1.blobs_lr), len(v1.weight_decay))
    specs = [Message("ParamSpec", v1._where) for _ in range(n)]
    for i, name in enumerate(v1.param):
        specs[i].name = name
    for i, mode in enumerate(v1.blob_share_mode):
        specs[i].share_mode = mode
    for i, lr in enumerate(v1.blobs_lr):
        specs[i].lr_mult = lr
    for i, decay in enumerate(v1.weight_decay):
        specs[i].decay_mult = decay
    if specs:
        layer.param = specs
    for f in _V1_PARAM_FIELDS:
        if v1.has(f):
            setattr(layer, f, getattr(v1, f).copy())
            if f in v1._locs:
                layer._locs[f] = v1._locs[f]
    if v1.has("layer"):
        raise PrototxtError(f"{v1.location('layer')}: V1 layer '{v1.name}' still holds a V0 "
                            f"'layer' after the V0 upgrade")
    return layer
