"""Rewrites of a parsed NetParameter done before any layer is built (Caffe's net.cpp helpers).

* ``filter_net`` — Caffe's FilterNet: keep the layers whose include/exclude rules match the
  NetState (phase, level, stages).
* ``upgrade_net_input`` — Caffe's UpgradeNetInput: legacy ``input`` / ``input_shape`` /
  ``input_dim`` fields become one Input layer named "input" at the front.
* ``insert_splits`` — Caffe's InsertSplits: a top used by more than one later bottom (a nonzero
  loss_weight counts as one more use) gets a Split layer right after its producer.
* ``swap_data_layers`` — replace data layers by Input layers of given shapes (tests, inspect).

All functions return new messages; the input NetParameter is not modified.
"""
from caffe8.engine.errors import LayerError, PrototxtError
from caffe8.engine.prototxt import Message

DATA_LAYER_TYPES = ("Data", "ImageData", "HDF5Data", "DummyData", "Input", "MemoryData",
                    "WindowData")


# --- phase / level / stage filtering ------------------------------------------------------------
def state_meets_rule(phase, level, stages, rule):
    """Caffe's Net::StateMeetsRule for one NetStateRule message."""
    if rule.has("phase") and rule.phase != phase:
        return False
    if rule.has("min_level") and level < rule.min_level:
        return False
    if rule.has("max_level") and level > rule.max_level:
        return False
    if any(s not in stages for s in rule.stage):
        return False
    return not any(s in stages for s in rule.not_stage)


def layer_included(layer, phase, level, stages):
    """Include rules: kept iff one matches; else exclude rules: kept unless one matches."""
    if layer.include and layer.exclude:
        raise LayerError(layer.name, "specify either include rules or exclude rules, not both "
                         f"(at {layer.location('include')})")
    if layer.include:
        return any(state_meets_rule(phase, level, stages, r) for r in layer.include)
    return not any(state_meets_rule(phase, level, stages, r) for r in layer.exclude)


def _without_layers(net_param):
    """A copy of ``net_param`` with no layers (its layers are about to be replaced: copying
    them first would double the work on nets of 100,000 layers)."""
    layers = net_param.layer
    net_param.layer = []
    try:
        return net_param.copy()
    finally:
        net_param.layer = layers


def filter_net(net_param, phase, level=0, stages=(), copy=True):
    """Copy of ``net_param`` holding only the layers the NetState includes (``copy=False``: the
    same layer messages, for a caller that owns ``net_param``, e.g. one it just parsed)."""
    out = _without_layers(net_param)
    stages = set(stages)
    out.layer = [l.copy() if copy else l for l in net_param.layer
                 if layer_included(l, phase, level, stages)]
    return out


# --- legacy inputs ------------------------------------------------------------------------------
def upgrade_net_input(net_param):
    """Turn NetParameter.input/input_shape/input_dim into a leading Input layer named "input"."""
    out = net_param.copy()
    names = list(out.input)
    if not names and not out.input_shape and not out.input_dim:
        return out
    where = out.location("input")
    shapes = []
    if out.input_shape:
        if len(out.input_shape) != len(names):
            raise PrototxtError(f"{where}: {len(names)} input(s) but {len(out.input_shape)} "
                                "input_shape(s); give exactly one input_shape per input")
        shapes = [s.copy() for s in out.input_shape]
    elif out.input_dim:
        if len(out.input_dim) != 4 * len(names):
            raise PrototxtError(f"{where}: input_dim needs exactly 4 values per input "
                                f"({len(names)} input(s), {len(out.input_dim)} input_dim)")
        for i in range(len(names)):
            shape = Message("BlobShape", where)
            shape.dim = list(out.input_dim[4 * i: 4 * i + 4])
            shapes.append(shape)
    for f in ("input", "input_shape", "input_dim"):
        out.clear(f)
    if not shapes:  # a bare legacy 'input' without shapes only names blobs; Caffe drops it
        return out
    layer = Message("LayerParameter", where)
    layer.name = "input"
    layer.type = "Input"
    layer.top = names
    ip = Message("InputParameter", where)
    ip.shape = shapes
    layer.input_param = ip
    out.layer = [layer] + list(out.layer)
    return out


# --- split insertion ----------------------------------------------------------------------------
def split_layer_name(blob, producer, top_index):
    return f"{blob}_{producer}_{top_index}_split"


def split_blob_name(blob, producer, top_index, j):
    return f"{split_layer_name(blob, producer, top_index)}_{j}"


def _count_uses(layers):
    """(bottom (i, j) → source top (i, j), top (i, j) → use count, top → loss weight)."""
    last_top, source, uses, weights = {}, {}, {}, {}
    for i, layer in enumerate(layers):
        for j, name in enumerate(layer.bottom):
            if name not in last_top:
                raise LayerError(layer.name, f"unknown bottom blob '{name}' "
                                 f"(at {layer.location('bottom')})")
            source[(i, j)] = last_top[name]
            uses[last_top[name]] = uses.get(last_top[name], 0) + 1
        for j, name in enumerate(layer.top):
            last_top[name] = (i, j)
        for j, w in enumerate(layer.loss_weight):
            weights[(i, j)] = w
            if w:
                uses[(i, j)] = uses.get((i, j), 0) + 1
    return source, uses, weights


def _split_layer(blob, producer, top_index, count, loss_weight, where):
    split = Message("LayerParameter", where)
    split.name = split_layer_name(blob, producer, top_index)
    split.type = "Split"
    split.bottom = [blob]
    split.top = [split_blob_name(blob, producer, top_index, j) for j in range(count)]
    if loss_weight:
        split.loss_weight = [loss_weight] + [0.0] * (count - 1)
    return split


def insert_splits(net_param):
    """Caffe's InsertSplits on a filtered NetParameter (names as insert_splits.cpp). A new
    NetParameter: the layers it changes are copies, the others are ``net_param``'s own."""
    layers = list(net_param.layer)
    source, uses, weights = _count_uses(layers)
    next_split = {}
    out_layers = []
    for i, layer in enumerate(layers):
        bottoms = list(layer.bottom)
        changed = False
        for j, name in enumerate(bottoms):
            src = source[(i, j)]
            if uses.get(src, 0) > 1:
                k = next_split.get(src, 0)
                bottoms[j] = split_blob_name(name, layers[src[0]].name, src[1], k)
                next_split[src] = k + 1
                changed = True
        split_tops = [j for j in range(len(layer.top)) if uses.get((i, j), 0) > 1]
        if changed or any(weights.get((i, j)) for j in split_tops):
            layer = layer.copy()
            layer.bottom = bottoms
        out_layers.append(layer)
        for j in split_tops:
            w = weights.get((i, j), 0.0)
            out_layers.append(_split_layer(layer.top[j], layer.name, j, uses[(i, j)], w,
                                           layer.location()))
            if w:
                # the loss moves to split top 0; the producer's top is no longer weighted
                lw = list(layer.loss_weight)
                lw[j] = 0.0
                layer.loss_weight = lw
                next_split[(i, j)] = 1  # consumers take split tops 1, 2, ...
    out = _without_layers(net_param)
    out.layer = out_layers
    return out


# --- data-layer swap (tests and `caffe8 inspect`) ------------------------------------------------
def swap_data_layers(net_param, shapes):
    """Replace each data layer by an Input layer.

    ``shapes`` maps a data layer's top name to its full shape, e.g.
    ``{"data": (2, 3, 227, 227), "label": (2,)}``; every top of a swapped layer must be listed.
    Layers of other types are kept unchanged, and so is a DummyData layer none of whose tops is
    listed: it reads no files (pycaffe's linreg example feeds its net that way).
    """
    out = net_param.copy()
    new_layers = []
    for layer in out.layer:
        if layer.type not in DATA_LAYER_TYPES or layer.type == "Input" or (
                layer.type == "DummyData" and not any(t in shapes for t in layer.top)):
            new_layers.append(layer)
            continue
        missing = [t for t in layer.top if t not in shapes]
        if missing:
            raise LayerError(layer.name, f"no shape given for data top(s) {missing}")
        swapped = Message("LayerParameter", layer.location())
        swapped.name = layer.name
        swapped.type = "Input"
        swapped.top = list(layer.top)
        for f in ("include", "exclude"):
            if layer.has(f):
                setattr(swapped, f, [r.copy() for r in getattr(layer, f)])
        blob_shapes = []
        for t in layer.top:
            s = Message("BlobShape", layer.location())
            s.dim = [int(d) for d in shapes[t]]
            blob_shapes.append(s)
        ip = Message("InputParameter", layer.location())
        ip.shape = blob_shapes
        swapped.input_param = ip
        new_layers.append(swapped)
    out.layer = new_layers
    return out
