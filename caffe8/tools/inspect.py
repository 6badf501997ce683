"""``caffe8 inspect MODEL``: build a net and print one line per layer.

    caffe8 inspect prototxt/caffenet/deploy.prototxt --phase TEST
    caffe8 inspect prototxt/caffenet/train_val.prototxt
    caffe8 inspect prototxt/digits/train_val.prototxt --data-shape data=32,1,8,8 --data-shape label=32

Each line: layer name, type, top shapes and parameter shapes; the last line is
``Total parameters: N`` (learnable parameters, shared ones counted once). A train_val net is
inspected without its data files: each data layer becomes an Input layer with the shape its
own parameters give (batch_size with crop_size, or ImageData's new_height/new_width, channels
from is_color, three mean_values or force_color/force_gray). ``--data-shape`` gives the shapes
the parameters do not tell; a data layer with neither reads its data, as the net would.
"""
import argparse
import os
import sys

from caffe8.engine.errors import CaffeError, LayerError
from caffe8.engine.net_graph import DATA_LAYER_TYPES
from caffe8.engine.schema import SCHEMA

NAME = "inspect"
HELP = "print layers, shapes and the parameter count"
GROUP = "models"
FILES = {"model": "in"}


def shape_arg(text):
    """``NAME=d0,d1,...`` of ``--data-shape`` → (NAME, shape)."""
    name, _, dims = text.partition("=")
    try:
        shape = tuple(int(d) for d in dims.split(",") if d.strip())
    except ValueError:
        shape = None
    if not name or not shape:
        raise argparse.ArgumentTypeError(f"expected NAME=d0,d1,..., got {text!r}")
    return name, shape


def add_data_shape(p, help_text="shape of a data layer's top (repeatable)"):
    """``--data-shape TOP=d0,d1,...`` (repeatable), as inspect, time and perf_model take it."""
    p.add_argument("--data-shape", "--data_shape", dest="data_shape", action="append",
                   type=shape_arg, default=[], metavar="TOP=d0,d1,...", help=help_text)


def add_arguments(ap):
    """The options of ``caffe8 inspect``."""
    ap.description = ("Print a net's layers, top shapes and parameter shapes; data layers take "
                      "their shapes from their own parameters or --data-shape.")
    ap.add_argument("model", help="net prototxt")
    ap.add_argument("--phase", default="TRAIN", choices=("TRAIN", "TEST"))
    ap.add_argument("--level", type=int, default=0)
    ap.add_argument("--stage", action="append", default=[], help="NetState stage (repeatable)")
    add_data_shape(ap)


def _channels(tp):
    """Channels a Data layer's transform_param tells (mean values, force_gray/force_color, or
    the mean file when it is there), or None."""
    if len(tp.mean_value) > 1:
        return len(tp.mean_value)
    if tp.force_gray:
        return 1
    if tp.force_color:
        return 3
    if tp.mean_file and os.path.isfile(tp.mean_file):
        from caffe8.proto import caffe_pb2
        mean = caffe_pb2.BlobProto()
        try:
            with open(tp.mean_file, "rb") as f:
                mean.ParseFromString(f.read())
        except Exception:  # not a BlobProto: the layer itself will say so when it is built
            return None
        dims = list(mean.shape.dim)
        return int(dims[-3]) if len(dims) >= 3 else (mean.channels or None)
    return None


def _message(layer, field):
    """``layer.<field>`` when the schema has the field (other branches add data layer types)."""
    return getattr(layer, field) if field in SCHEMA["LayerParameter"] else None


def data_shapes(layer):
    """{top: shape} a data layer's own parameters give, or None when they do not tell all."""
    shapes = known_shapes(layer)
    return shapes if shapes and all(t in shapes for t in layer.top) else None


def known_shapes(layer):
    """{top: shape} of the tops a data layer's own parameters tell: the label's (batch,) as
    soon as the batch size is known, the data's when channels and size are too."""
    tp = layer.transform_param
    crop = tp.crop_size
    if layer.type == "Data":
        dp = layer.data_param
        crop = crop or dp.crop_size
        c, batch = _channels(tp), dp.batch_size
        image = (c, crop, crop) if crop and c else None
    elif layer.type == "ImageData":
        ip = layer.image_data_param
        crop = crop or ip.crop_size
        c, batch = (3 if ip.is_color else 1), ip.batch_size
        hw = (crop, crop) if crop else (ip.new_height, ip.new_width)
        image = (c,) + hw if all(hw) else None
    elif layer.type == "WindowData" and _message(layer, "window_data_param") is not None:
        wp = layer.window_data_param
        crop = crop or wp.crop_size
        batch, image = wp.batch_size, ((3, crop, crop) if crop else None)
    elif layer.type == "MemoryData" and _message(layer, "memory_data_param") is not None:
        mp = layer.memory_data_param
        batch = mp.batch_size
        image = (mp.channels, crop or mp.height, crop or mp.width)
    else:
        return {}
    if not batch or len(layer.top) > 2:
        return {}
    shapes = {layer.top[0]: (batch,) + tuple(image)} if image is not None else {}
    if len(layer.top) == 2:
        shapes[layer.top[1]] = (batch,)
    return shapes


def resolve_data_layers(model, given):
    """The NetParameter with each data layer whose tops all have shapes (``given``, else its
    own parameters; a label not given is one per item of the given data) swapped for an Input
    layer; the others stay and read their data."""
    from caffe8.engine.net_graph import swap_data_layers
    out = model.copy()
    layers = []
    for layer in out.layer:
        if layer.type in DATA_LAYER_TYPES and layer.type not in ("Input", "DummyData"):
            shapes = known_shapes(layer)
            shapes.update({t: s for t, s in given.items() if t in layer.top})
            if len(layer.top) == 2 and layer.top[0] in given and layer.top[1] not in given:
                shapes[layer.top[1]] = given[layer.top[0]][:1]  # the label: one per item
            if all(t in shapes for t in layer.top):
                single = out.copy()
                single.layer = [layer]
                layer = swap_data_layers(single, shapes).layer[0]
        layers.append(layer)
    out.layer = layers
    return out


def describe(net, types=None):
    """Lines for ``net``: one per layer, then the parameter total. ``types``: {layer name:
    type} of the data layers that were inspected as Input layers (their own type is shown)."""
    types = types or {}
    rows = []
    for i, layer in enumerate(net.layers):
        tops = _fmt([b.shape for b in net.top_vecs[i]])
        params = _fmt([b.shape for b in layer.blobs])
        shown = types.get(layer.name, layer.type) if layer.type == "Input" else layer.type
        rows.append((layer.name, shown, tops, params))
    width = max((len(r[0]) for r in rows), default=4)
    lines = [f"{name:<{width}}  {typ:<16}  top {tops:<24}  params {params}"
             for name, typ, tops, params in rows]
    lines.append(f"Total parameters: {sum(b.count for b in net.learnable_params)}")
    return lines


def _fmt(shapes):
    return " ".join("x".join(str(d) for d in s) if s else "scalar" for s in shapes) or "-"


def _data_error(model, error):
    """A failed data layer → the error plus what to give (--data-shape for its tops)."""
    name = getattr(error, "layer_name", None)
    for layer in model.layer:
        if layer.type in DATA_LAYER_TYPES and (name is None or layer.name == name):
            known = known_shapes(layer)
            tops = " ".join(f"--data-shape {t}=..." for t in layer.top if t not in known)
            return (f"{error}\n  data layer '{layer.name}' ({layer.type}) could not be set up "
                    f"and its parameters do not give its shapes; give them: {tops}")
    return str(error)


def run(args, out=None):
    """``caffe8 inspect`` on parsed arguments; returns the exit status (0, or 1 on an error)."""
    from caffe8.wiring import register_all
    from caffe8.engine.net import Net
    from caffe8.engine.prototxt import parse_file
    register_all()
    out = out or sys.stdout
    model = None
    try:
        model = parse_file(args.model)
        resolved = resolve_data_layers(model, dict(args.data_shape))
        net = Net(resolved, phase=args.phase, level=args.level, stages=args.stage)
    except CaffeError as e:
        message = _data_error(model, e) if model is not None and _from_data(model, e) else e
        print(f"caffe8 inspect: error: {message}", file=sys.stderr)
        return 1
    types = {l.name: l.type for l in model.layer if l.type in DATA_LAYER_TYPES}
    for line in describe(net, types):
        print(line, file=out)
    return 0


def _from_data(model, error):
    if not isinstance(error, LayerError):
        return "data" in str(error).lower() or "source" in str(error).lower()
    return any(l.name == error.layer_name and l.type in DATA_LAYER_TYPES for l in model.layer)


def inspect_main(argv=None, out=None):
    """Run ``caffe8 inspect`` with ``argv``, its lines to ``out``; returns the exit status."""
    p = argparse.ArgumentParser(prog="caffe8 inspect")
    add_arguments(p)
    return run(p.parse_args(argv), out)
