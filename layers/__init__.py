"""Layers, one module per Caffe type (or small family); imported here to register them.

Installed as ``caffe8.layers``, this package is also pycaffe's ``caffe.layers`` — NetSpec's layer
factory (``from caffe8 import layers as L; L.Convolution(...)``): a name that is not one of the
(lower-case) modules here is a layer type, built by ``caffe8.engine.net_spec.layers``.
"""
from caffe8.layers import gru  # noqa: F401
from caffe8.layers import conv  # noqa: F401
from caffe8.layers import im2col_layer  # noqa: F401
from caffe8.layers import pooling  # noqa: F401
from caffe8.layers import lrn  # noqa: F401
from caffe8.layers import inner_product  # noqa: F401
from caffe8.layers import emulate  # noqa: F401
from caffe8.layers import accuracy  # noqa: F401
from caffe8.layers import concat  # noqa: F401
from caffe8.layers import dropout  # noqa: F401
from caffe8.layers import dummy_data  # noqa: F401
from caffe8.layers import eltwise  # noqa: F401
from caffe8.layers import euclidean_loss  # noqa: F401
from caffe8.layers import flatten  # noqa: F401
from caffe8.layers import input  # noqa: F401
from caffe8.layers import neuron  # noqa: F401
from caffe8.layers import reshape  # noqa: F401
from caffe8.layers import scale_bias  # noqa: F401
from caffe8.layers import slice  # noqa: F401
from caffe8.layers import softmax  # noqa: F401
from caffe8.layers import softmax_loss  # noqa: F401
from caffe8.layers import split  # noqa: F401
from caffe8.layers import sequence_data  # noqa: F401
from caffe8.layers import image_data  # noqa: F401
from caffe8.layers import hdf5_data  # noqa: F401
from caffe8.layers import data  # noqa: F401
from caffe8.layers import neuron_more  # noqa: F401
from caffe8.layers import prelu  # noqa: F401
from caffe8.layers import batch_norm  # noqa: F401
from caffe8.layers import mvn  # noqa: F401
from caffe8.layers import reduction  # noqa: F401
from caffe8.layers import tile  # noqa: F401
from caffe8.layers import crop  # noqa: F401
from caffe8.layers import silence  # noqa: F401
from caffe8.layers import parameter  # noqa: F401
from caffe8.layers import embed  # noqa: F401
from caffe8.layers import batch_reindex  # noqa: F401
from caffe8.layers import filter  # noqa: F401
from caffe8.layers import argmax  # noqa: F401
from caffe8.layers import spp  # noqa: F401
from caffe8.layers import contrastive_loss  # noqa: F401
from caffe8.layers import hinge_loss  # noqa: F401
from caffe8.layers import infogain_loss  # noqa: F401
from caffe8.layers import multinomial_logistic_loss  # noqa: F401
from caffe8.layers import sigmoid_cross_entropy_loss  # noqa: F401
from caffe8.layers import lstm_unit  # noqa: F401
from caffe8.layers import recurrent  # noqa: F401
from caffe8.layers import python_layer  # noqa: F401
from caffe8.layers import memory_data  # noqa: F401
from caffe8.layers import hdf5_output  # noqa: F401
from caffe8.layers import window_data  # noqa: F401


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    from caffe8.engine.net_spec import layers as factory
    return getattr(factory, name)
