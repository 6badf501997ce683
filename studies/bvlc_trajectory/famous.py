"""Famous Caffe nets as their authors published them (KaimingHe's ResNet-50 deploy file,
forresti's SqueezeNet train_val, shicai's MobileNet and DenseNet deploy files, BVLC's GoogLeNet
train_val...) made trainable from an HDF5 file, for the step-by-step comparison with BVLC Caffe.

The net is read by caffe8's parser and changed only where a comparison needs it:

* its input (``input``/``input_dim``, an ``Input`` layer, or the TRAIN ``Data``/``ImageData``
  layer and its ``crop_size``) becomes one ``HDF5Data`` layer with the same top names and the
  image shape at ``batch`` images (a data layer's label top keeps its name, so the net's own
  losses read it);
* the TEST-phase layers go (the net is filtered for TRAIN as Caffe's solver filters it);
* Dropout layers go (their random masks differ between the two programs); a Dropout that is not
  in place is bridged (its consumers read its bottom);
* a deploy net's closing ``Softmax`` becomes ``SoftmaxWithLoss`` against the label; a net with a
  loss of its own keeps it.

Everything else (BatchNorm's ``use_global_stats``, engines, groups, ``param`` multipliers) is
left as written. Weights are drawn here, by layer type, the same for both programs (the deploy
files carry no fillers): He-scaled Gaussians for convolution and inner-product weights, small
uniform biases, Scale γ in [0.8, 1.2], BatchNorm statistics as a trained net has them: the
statistics of the first batch (the net run once with ``use_global_stats`` off, every BatchNorm
accumulating from zero), so that ``use_global_stats: true`` normalises as in fine-tuning.
"""
import argparse
import os

import numpy

from caffe8 import wiring
from caffe8.engine import model_io
from caffe8.engine.net import Net
from caffe8.engine.net_graph import filter_net, upgrade_net_input
from caffe8.engine.prototxt import Message, parse_file, parse_text, to_text

#: label values drawn for the batches (every famous net classifies into at least this many)
CLASSES = 10
_DATA_TYPES = ("Data", "ImageData", "Input", "HDF5Data", "MemoryData", "WindowData")


def _input(net, path):
    """(image top, label top or None, per-image shape) of ``net``'s TRAIN input."""
    for layer in net.layer:
        if layer.type == "Input":
            dims = list(layer.input_param.shape[0].dim)
            return layer.top[0], None, tuple(dims[1:])
        if layer.type in ("Data", "ImageData"):
            crop = layer.transform_param.crop_size
            if not crop:
                raise ValueError(f"{path}: layer {layer.name!r} ({layer.type}) has no "
                                 f"crop_size; the image size is unknown")
            return layer.top[0], layer.top[1] if len(layer.top) > 1 else None, (3, crop, crop)
    raise ValueError(f"{path}: no input found (input fields, an Input layer or a Data layer)")


def training_net(path, batch, listing):
    """The text of the net at ``path`` made trainable from the HDF5 list file ``listing`` at
    ``batch`` images (None: from ``Input`` layers, whose blobs stay zero, for timing), and
    ``{top: shape}`` of the batches it reads."""
    net = filter_net(upgrade_net_input(parse_file(path)), "TRAIN")
    image, label, shape = _input(net, path)
    label = label or "label"
    renamed = {}                          # a bridged Dropout's top -> its bottom
    layers = []
    for layer in net.layer:
        layer.bottom = [renamed.get(b, b) for b in layer.bottom]
        if layer.type in _DATA_TYPES:
            continue
        if layer.type == "Dropout":
            if layer.top[0] != layer.bottom[0]:
                renamed[layer.top[0]] = layer.bottom[0]
            continue
        layers.append(layer)
    consumed = {b for layer in layers for b in layer.bottom}
    if not any(layer.type.endswith("Loss") for layer in layers):
        last = layers[-1]
        if last.type == "Softmax" and last.top[0] not in consumed:
            logits = last.bottom[0]
            layers.pop()
        else:
            logits = last.top[0]
        loss = Message("LayerParameter")
        loss.name, loss.type = "famous_loss", "SoftmaxWithLoss"
        loss.bottom, loss.top = [logits, label], ["famous_loss"]
        layers.append(loss)
    inputs = {image: (batch,) + tuple(shape), label: (batch,)}
    if listing is None:
        data = []
        for top, dims in inputs.items():
            layer = Message("LayerParameter")
            layer.name, layer.type, layer.top = f"famous_{top}", "Input", [top]
            layer.input_param.shape = [Message("BlobShape")]
            layer.input_param.shape[0].dim = list(dims)
            data.append(layer)
    else:
        data = [Message("LayerParameter")]
        data[0].name, data[0].type, data[0].top = "famous_data", "HDF5Data", [image, label]
        data[0].hdf5_data_param.source = os.path.abspath(listing)
        data[0].hdf5_data_param.batch_size = batch
    net.layer = data + layers
    return to_text(net), inputs


def make_batch(name, shape, rng):
    """One batch: labels in [0, CLASSES), images ~ N(0, 1) (mean-subtracted pixels' scale)."""
    if len(shape) == 1:
        return rng.integers(0, CLASSES, size=shape).astype(numpy.float32)
    return rng.standard_normal(shape).astype(numpy.float32)


def _fill(layer, rng):
    blobs = layer.blobs
    if layer.type == "BatchNorm":                # accumulated from zero by the first batch
        for b in blobs:
            b.data[...] = 0.0
        return
    if layer.type == "Scale":
        blobs[0].data[...] = rng.uniform(0.8, 1.2, blobs[0].data.shape)
        for b in blobs[1:]:
            b.data[...] = rng.uniform(-0.1, 0.1, b.data.shape)
        return
    if layer.type == "PReLU":
        blobs[0].data[...] = 0.25
        return
    for i, b in enumerate(blobs):
        w = b.data
        if i == 0 and w.ndim >= 2:
            fan_in = int(numpy.prod(w.shape[1:]))
            w[...] = rng.normal(0.0, numpy.sqrt(2.0 / fan_in), w.shape)
        else:
            w[...] = rng.uniform(-0.1, 0.1, w.shape)


def write_initial_model(text, path, seed=0):
    """Draw the weights of the net ``text`` (see the module's text), take BatchNorm's statistics
    from its first batch (its HDF5 file must exist) and write them to ``path`` as a binary
    caffemodel."""
    param = parse_text(text, path + ".prototxt")
    for layer in param.layer:
        if layer.type == "BatchNorm":
            layer.batch_norm_param.use_global_stats = False
    net = Net(param, phase="TRAIN")
    rng = numpy.random.default_rng(seed)
    for layer in net.layers:
        if layer.blobs:
            _fill(layer, rng)
    net.forward()
    model_io.write_binary_model(net, path)


def main(argv=None):
    """``python -m studies.bvlc_trajectory.famous FILE --out NET [--batch 2] [--hdf5 LIST]``:
    write the trainable net of FILE (reading the HDF5 list file LIST, or from Input layers)."""
    ap = argparse.ArgumentParser(description="a published Caffe net made trainable "
                                             "(studies/bvlc_trajectory/famous.py)")
    ap.add_argument("prototxt", help="the net as published (deploy or train_val)")
    ap.add_argument("--out", required=True, help="where to write the trainable net")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--hdf5", default=None,
                    help="HDF5Data list file to read (default: Input layers, for timing)")
    args = ap.parse_args(argv)
    wiring.register_all()
    text, inputs = training_net(args.prototxt, args.batch, args.hdf5)
    with open(args.out, "w") as f:
        f.write(text)
    print(f"wrote {args.out}: " + ", ".join(f"{top} {shape}" for top, shape in inputs.items()))


if __name__ == "__main__":
    main()
