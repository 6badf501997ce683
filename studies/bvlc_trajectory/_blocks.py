"""Small nets trained step by step: one per family of layer configurations real nets use, and
blocks built like ResNet, MobileNet, SqueezeNet, Inception and DenseNet. Each is ``(body, inputs,
make)``: the layers after the data, ``{top: shape}``, and a batch drawer. :func:`net_texts` and
:func:`write_batches` turn one into files: the net over an ``HDF5Data`` layer (and over ``Input``
layers of the same shapes), and the HDF5 file of a different batch every step.

Trained by this study (run.py: caffe8 against BVLC Caffe) and by the trajectory oracle
(tests/engine/trajectory.py: the trainer's gradients against a fresh reference Net).
Spatial sizes are chosen so that both of Convolution's layouts run: 24x24 outputs (576
positions) take the per-image path, smaller ones the batch path (layers/conv.py)."""
import os

import h5py
import numpy

BATCH = 4


def _shape_text(shape):
    return " ".join(f"dim: {d}" for d in shape)


def net_texts(body, inputs, batch_file):
    """(trainer's net, reference net): ``body`` after an HDF5Data layer reading the list file
    ``batch_file``, and after ``Input`` layers; ``inputs``: ``{top: shape}`` in top order."""
    tops = " ".join(f'top: "{name}"' for name in inputs)
    batch = next(iter(inputs.values()))[0]
    train = (f'name: "oracle"\nlayer {{ name: "data" type: "HDF5Data" {tops} '
             f'hdf5_data_param {{ source: "{batch_file}" batch_size: {batch} }} }}\n' + body)
    ref = f'name: "oracle"\n' + "".join(
        f'layer {{ name: "in_{name}" type: "Input" top: "{name}" '
        f'input_param {{ shape {{ {_shape_text(shape)} }} }} }}\n'
        for name, shape in inputs.items()) + body
    return train, ref


def write_batches(folder, inputs, steps, make, ranks=1, seed=0):
    """An HDF5 file of ``steps * ranks`` batches (row ``r`` of every ``ranks`` goes to rank ``r``,
    as HDF5Data shards) and its list file; ``make(name, shape, rng)`` draws one batch of input
    ``name``. Returns the list file's path."""
    rng = numpy.random.default_rng(seed)
    data = {name: [] for name in inputs}
    for _ in range(steps):
        per_rank = {name: [make(name, shape, rng) for _ in range(ranks)]
                    for name, shape in inputs.items()}
        for name, shape in inputs.items():
            rows = numpy.empty((shape[0] * ranks,) + tuple(shape[1:]), numpy.float32)
            for r in range(ranks):
                rows[r::ranks] = per_rank[name][r]
            data[name].append(rows)
    path = os.path.join(str(folder), "batches.h5")
    with h5py.File(path, "w") as f:
        for name, parts in data.items():
            f[name] = numpy.concatenate(parts)
    listing = os.path.join(str(folder), "batches.txt")
    with open(listing, "w") as f:
        f.write(path + "\n")
    return listing


def _conv(name, bottom, top, num, k, stride=1, pad=0, group=1, dilation=1, bias=True, kind="Convolution"):
    extra = f" group: {group}" if group > 1 else ""
    extra += f" dilation: {dilation}" if dilation > 1 else ""
    extra += "" if bias else " bias_term: false"
    return (f'layer {{ name: "{name}" type: "{kind}" bottom: "{bottom}" top: "{top}" '
            f'convolution_param {{ num_output: {num} kernel_size: {k} stride: {stride} pad: {pad}'
            f'{extra} weight_filler {{ type: "msra" }} bias_filler {{ type: "uniform" min: -0.1 '
            f'max: 0.1 }} }} }}\n')


def _relu(blob):
    return f'layer {{ name: "relu_{blob}" type: "ReLU" bottom: "{blob}" top: "{blob}" }}\n'


def _bn_scale(blob):
    return (f'layer {{ name: "bn_{blob}" type: "BatchNorm" bottom: "{blob}" top: "{blob}" }}\n'
            f'layer {{ name: "scale_{blob}" type: "Scale" bottom: "{blob}" top: "{blob}" '
            f'scale_param {{ bias_term: true filler {{ type: "uniform" min: 0.5 max: 1.5 }} '
            f'bias_filler {{ type: "uniform" min: -0.1 max: 0.1 }} }} }}\n')


def _pool(name, bottom, top, method, k=0, stride=1, pad=0, global_pool=False):
    geometry = "global_pooling: true" if global_pool else f"kernel_size: {k} stride: {stride} pad: {pad}"
    return (f'layer {{ name: "{name}" type: "Pooling" bottom: "{bottom}" top: "{top}" '
            f'pooling_param {{ pool: {method} {geometry} }} }}\n')


def _classifier(bottom, classes=5):
    return (f'layer {{ name: "fc" type: "InnerProduct" bottom: "{bottom}" top: "fc" '
            f'inner_product_param {{ num_output: {classes} weight_filler {{ type: "xavier" }} '
            f'bias_filler {{ type: "uniform" min: -0.1 max: 0.1 }} }} }}\n'
            f'layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" '
            f'top: "loss" }}\n')


def _images(channels, size, classes=5):
    inputs = {"data": (BATCH, channels, size, size), "label": (BATCH,)}

    def make(name, shape, rng):
        if name == "label":
            return rng.integers(0, classes, shape).astype(numpy.float32)
        return rng.standard_normal(shape).astype(numpy.float32)
    return inputs, make


def conv_family():
    """1x1 (per-image and batch), 3x3 padded and not, strided, dilated, grouped, depthwise,
    Deconvolution."""
    body = (_conv("c3x3_pad", "data", "a", 8, 3, pad=1) + _relu("a")            # 24x24: per image
            + _conv("c1x1_big", "a", "b", 8, 1) + _relu("b")                     # 24x24 pointwise
            + _conv("c3x3_nopad", "b", "c", 8, 3)                                # 22x22: batch
            + _conv("c3x3_s2", "c", "d", 8, 3, stride=2, pad=1) + _relu("d")     # 11x11
            + _conv("c_dilated", "d", "e", 8, 3, pad=2, dilation=2)
            + _conv("c_grouped", "e", "f", 8, 3, pad=1, group=2) + _relu("f")
            + _conv("c_depthwise", "f", "g", 8, 3, pad=1, group=8)
            + _conv("c1x1_small", "g", "h", 8, 1) + _relu("h")                   # 11x11 pointwise
            + _conv("deconv", "h", "i", 6, 4, stride=2, pad=1, kind="Deconvolution")  # 22x22
            + _conv("c1x1_after", "i", "j", 8, 1)                                # 22x22 pointwise
            + _pool("gap", "j", "k", "AVE", global_pool=True) + _classifier("k"))
    return (body,) + _images(3, 24)


def pool_family():
    """Max, average and global pooling (Caffe's ceil-mode output sizes)."""
    body = (_conv("c1", "data", "a", 6, 3, pad=1) + _relu("a")
            + _pool("maxpool", "a", "b", "MAX", 3, 2) + _conv("c2", "b", "c", 6, 3, pad=1)
            + _pool("avepool", "c", "d", "AVE", 3, 2, pad=1) + _conv("c3", "d", "e", 6, 3, pad=1)
            + _pool("globalmax", "e", "f", "MAX", global_pool=True) + _classifier("f"))
    return (body,) + _images(3, 24)


def norm_family():
    """BatchNorm + Scale, an Eltwise residual sum, Concat, LRN (both regions), Dropout,
    InnerProduct."""
    # no bias before BatchNorm (as ResNet's): its exact gradient is zero, rounding noise only
    body = (_conv("c1", "data", "a", 8, 3, pad=1, bias=False) + _bn_scale("a") + _relu("a")
            + _conv("c2", "a", "b", 8, 3, pad=1, bias=False) + _bn_scale("b")
            + 'layer { name: "res" type: "Eltwise" bottom: "a" bottom: "b" top: "r" }\n'
            + _relu("r")
            + _conv("c3", "r", "s", 4, 1)
            + 'layer { name: "cat" type: "Concat" bottom: "r" bottom: "s" top: "t" }\n'
            + 'layer { name: "lrn1" type: "LRN" bottom: "t" top: "u" lrn_param { local_size: 3 '
              'alpha: 0.1 beta: 0.75 } }\n'
            + 'layer { name: "lrn2" type: "LRN" bottom: "u" top: "v" lrn_param { local_size: 3 '
              'alpha: 0.1 beta: 0.75 norm_region: WITHIN_CHANNEL } }\n'
            + _pool("pool", "v", "w", "MAX", 2, 2)
            + 'layer { name: "ip1" type: "InnerProduct" bottom: "w" top: "x" inner_product_param '
              '{ num_output: 16 weight_filler { type: "xavier" } } }\n'
            + _relu("x")
            + 'layer { name: "drop" type: "Dropout" bottom: "x" top: "x" dropout_param '
              '{ dropout_ratio: 0.3 } }\n'
            + _classifier("x"))
    return (body,) + _images(3, 12)


def recurrent_family():
    """RNN, LSTM and GRU over a sequence with a sequence break (cont = 0 mid-way)."""
    steps, classes = 4, 5

    def rec(name, kind, bottom, top):
        return (f'layer {{ name: "{name}" type: "{kind}" bottom: "{bottom}" bottom: "cont" '
                f'top: "{top}" recurrent_param {{ num_output: 6 weight_filler {{ type: "uniform" '
                f'min: -0.3 max: 0.3 }} bias_filler {{ type: "uniform" min: -0.1 max: 0.1 }} }} }}\n')
    body = (rec("rnn", "RNN", "data", "a") + rec("lstm", "LSTM", "a", "b") + rec("gru", "GRU", "b", "c")
            + f'layer {{ name: "fc" type: "InnerProduct" bottom: "c" top: "fc" inner_product_param '
              f'{{ num_output: {classes} axis: 2 weight_filler {{ type: "xavier" }} }} }}\n'
            + 'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" '
              'softmax_param { axis: 2 } }\n')
    inputs = {"data": (steps, BATCH, 3), "cont": (steps, BATCH), "label": (steps, BATCH)}

    def make(name, shape, rng):
        if name == "label":
            return rng.integers(0, classes, shape).astype(numpy.float32)
        if name == "cont":
            cont = numpy.ones(shape, numpy.float32)
            cont[0] = 0
            cont[2, ::2] = 0
            return cont
        return rng.standard_normal(shape).astype(numpy.float32)
    # HDF5Data batches along axis 0: the sequence layout (T, N) is the file's rows
    return (body, inputs, make)


def resnet_block():
    """A ResNet bottleneck stage: stem, 1x1 -> 3x3 -> 1x1 with BatchNorm + Scale, identity and
    strided projection shortcuts, Eltwise sums."""
    def bottleneck(name, bottom, width, out, stride, project):
        s = (_conv(f"{name}_2a", bottom, f"{name}_2a", width, 1, stride=stride, bias=False)
             + _bn_scale(f"{name}_2a") + _relu(f"{name}_2a")
             + _conv(f"{name}_2b", f"{name}_2a", f"{name}_2b", width, 3, pad=1, bias=False)
             + _bn_scale(f"{name}_2b") + _relu(f"{name}_2b")
             + _conv(f"{name}_2c", f"{name}_2b", f"{name}_2c", out, 1, bias=False)
             + _bn_scale(f"{name}_2c"))
        short = bottom
        if project:
            short = f"{name}_1"
            s += _conv(short, bottom, short, out, 1, stride=stride, bias=False) + _bn_scale(short)
        s += (f'layer {{ name: "{name}" type: "Eltwise" bottom: "{short}" bottom: "{name}_2c" '
              f'top: "{name}" }}\n' + _relu(name))
        return s
    body = (_conv("conv1", "data", "conv1", 8, 3, pad=1, bias=False) + _bn_scale("conv1")
            + _relu("conv1")
            + bottleneck("res2a", "conv1", 4, 16, 1, True) + bottleneck("res2b", "res2a", 4, 16, 1, False)
            + bottleneck("res3a", "res2b", 8, 16, 2, True)
            + _pool("pool5", "res3a", "pool5", "AVE", global_pool=True) + _classifier("pool5"))
    return (body,) + _images(3, 24)


def mobilenet_block():
    """MobileNet v1 separable blocks: depthwise 3x3 (group = channels, one strided) and
    pointwise 1x1, each with BatchNorm + Scale + ReLU."""
    def separable(name, bottom, channels, out, stride):
        return (_conv(f"{name}_dw", bottom, f"{name}_dw", channels, 3, stride=stride, pad=1,
                      group=channels, bias=False) + _bn_scale(f"{name}_dw") + _relu(f"{name}_dw")
                + _conv(f"{name}_sep", f"{name}_dw", f"{name}_sep", out, 1, bias=False)
                + _bn_scale(f"{name}_sep") + _relu(f"{name}_sep"))
    body = (_conv("conv1", "data", "conv1", 8, 3, pad=1, bias=False) + _bn_scale("conv1")
            + _relu("conv1") + separable("conv2_1", "conv1", 8, 16, 1)
            + separable("conv2_2", "conv2_1_sep", 16, 16, 2)
            + _pool("pool6", "conv2_2_sep", "pool6", "AVE", global_pool=True) + _classifier("pool6"))
    return (body,) + _images(3, 24)


def squeezenet_block():
    """SqueezeNet fire modules: squeeze 1x1, expand 1x1 and 3x3 concatenated, Dropout, a 1x1
    convolution as classifier and global average pooling (no InnerProduct)."""
    def fire(name, bottom, squeeze, expand):
        return (_conv(f"{name}/squeeze1x1", bottom, f"{name}/squeeze1x1", squeeze, 1)
                + _relu(f"{name}/squeeze1x1")
                + _conv(f"{name}/expand1x1", f"{name}/squeeze1x1", f"{name}/expand1x1", expand, 1)
                + _relu(f"{name}/expand1x1")
                + _conv(f"{name}/expand3x3", f"{name}/squeeze1x1", f"{name}/expand3x3", expand, 3,
                        pad=1) + _relu(f"{name}/expand3x3")
                + f'layer {{ name: "{name}/concat" type: "Concat" bottom: "{name}/expand1x1" '
                  f'bottom: "{name}/expand3x3" top: "{name}/concat" }}\n')
    body = (_conv("conv1", "data", "conv1", 8, 3, pad=1) + _relu("conv1")
            + fire("fire2", "conv1", 4, 8) + fire("fire3", "fire2/concat", 4, 8)
            + _pool("pool3", "fire3/concat", "pool3", "MAX", 3, 2)
            + fire("fire4", "pool3", 4, 8)
            + 'layer { name: "drop9" type: "Dropout" bottom: "fire4/concat" top: "fire4/concat" '
              'dropout_param { dropout_ratio: 0.5 } }\n'
            + _conv("conv10", "fire4/concat", "conv10", 5, 1) + _relu("conv10")
            + _pool("pool10", "conv10", "pool10", "AVE", global_pool=True)
            + 'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "pool10" bottom: "label" '
              'top: "loss" }\n')
    return (body,) + _images(3, 24)


def inception_block():
    """A GoogLeNet inception module: 1x1, 1x1 -> 3x3, 1x1 -> 5x5, 3x3 max pool -> 1x1,
    concatenated, after a stem with LRN."""
    def inception(name, bottom):
        return (_conv(f"{name}/1x1", bottom, f"{name}/1x1", 4, 1) + _relu(f"{name}/1x1")
                + _conv(f"{name}/3x3_reduce", bottom, f"{name}/3x3_reduce", 4, 1)
                + _relu(f"{name}/3x3_reduce")
                + _conv(f"{name}/3x3", f"{name}/3x3_reduce", f"{name}/3x3", 6, 3, pad=1)
                + _relu(f"{name}/3x3")
                + _conv(f"{name}/5x5_reduce", bottom, f"{name}/5x5_reduce", 2, 1)
                + _relu(f"{name}/5x5_reduce")
                + _conv(f"{name}/5x5", f"{name}/5x5_reduce", f"{name}/5x5", 3, 5, pad=2)
                + _relu(f"{name}/5x5")
                + _pool(f"{name}/pool", bottom, f"{name}/pool", "MAX", 3, 1, pad=1)
                + _conv(f"{name}/pool_proj", f"{name}/pool", f"{name}/pool_proj", 3, 1)
                + _relu(f"{name}/pool_proj")
                + f'layer {{ name: "{name}/output" type: "Concat" bottom: "{name}/1x1" '
                  f'bottom: "{name}/3x3" bottom: "{name}/5x5" bottom: "{name}/pool_proj" '
                  f'top: "{name}/output" }}\n')
    body = (_conv("conv1", "data", "conv1", 8, 3, pad=1) + _relu("conv1")
            + 'layer { name: "norm1" type: "LRN" bottom: "conv1" top: "norm1" lrn_param { '
              'local_size: 5 alpha: 0.0001 beta: 0.75 } }\n'
            + inception("inception_3a", "norm1") + inception("inception_3b", "inception_3a/output")
            + _pool("pool5", "inception_3b/output", "pool5", "AVE", global_pool=True)
            + _classifier("pool5"))
    return (body,) + _images(3, 24)


def densenet_block():
    """DenseNet-BC as shicai's DenseNet-121 prototxt writes it: each dense layer is BatchNorm +
    Scale + ReLU into a new blob (its input also feeds the Concat: a split), 1x1 bottleneck
    convolution, BatchNorm + Scale + ReLU, 3x3 convolution, then Concat of input and output; a
    transition (BatchNorm + Scale + ReLU, 1x1, 2x2 average pooling); global average pooling and a
    1x1 convolution as classifier."""
    def bn_scale_relu(bottom, top):
        return (f'layer {{ name: "{top}/bn" type: "BatchNorm" bottom: "{bottom}" top: "{top}" '
                f'batch_norm_param {{ eps: 1e-5 }} }}\n'
                f'layer {{ name: "{top}/scale" type: "Scale" bottom: "{top}" top: "{top}" '
                f'scale_param {{ bias_term: true filler {{ type: "uniform" min: 0.5 max: 1.5 }} '
                f'bias_filler {{ type: "uniform" min: -0.1 max: 0.1 }} }} }}\n' + _relu(top))

    def dense(name, bottom):
        return (bn_scale_relu(bottom, f"conv{name}/x1/bn")
                + _conv(f"conv{name}/x1", f"conv{name}/x1/bn", f"conv{name}/x1", 8, 1, bias=False)
                + bn_scale_relu(f"conv{name}/x1", f"conv{name}/x2/bn")
                + _conv(f"conv{name}/x2", f"conv{name}/x2/bn", f"conv{name}/x2", 4, 3, pad=1,
                        bias=False)
                + f'layer {{ name: "concat_{name}" type: "Concat" bottom: "{bottom}" '
                  f'bottom: "conv{name}/x2" top: "concat_{name}" }}\n')
    body = (_conv("conv1", "data", "conv1", 8, 3, pad=1, bias=False) + _bn_scale("conv1")
            + _relu("conv1") + dense("2_1", "conv1") + dense("2_2", "concat_2_1")
            + bn_scale_relu("concat_2_2", "conv2_blk/bn")
            + _conv("conv2_blk", "conv2_blk/bn", "conv2_blk", 8, 1, bias=False)
            + _pool("pool2", "conv2_blk", "pool2", "AVE", 2, 2)
            + dense("3_1", "pool2") + bn_scale_relu("concat_3_1", "conv5_blk/bn")
            + _pool("pool5", "conv5_blk/bn", "pool5", "AVE", global_pool=True)
            + _conv("fc6", "pool5", "fc6", 5, 1)
            + 'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc6" bottom: "label" '
              'top: "loss" }\n')
    return (body,) + _images(3, 24)


FAMILIES = {"conv": conv_family, "pool": pool_family, "norm": norm_family,
            "recurrent": recurrent_family}
BLOCKS = {"resnet": resnet_block, "mobilenet": mobilenet_block, "squeezenet": squeezenet_block,
          "inception": inception_block, "densenet": densenet_block}
