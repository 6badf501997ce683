"""Layers, one module per Caffe type (or small family); imported here to register them."""
from layers import gru  # noqa: F401
from layers import conv  # noqa: F401
from layers import pooling  # noqa: F401
from layers import lrn  # noqa: F401
from layers import inner_product  # noqa: F401
from layers import emulate  # noqa: F401
import layers.image_data  # noqa: E402,F401
import layers.hdf5_data  # noqa: E402,F401
import layers.data  # noqa: E402,F401
from layers import accuracy  # noqa: F401
from layers import concat  # noqa: F401
from layers import dropout  # noqa: F401
from layers import dummy_data  # noqa: F401
from layers import eltwise  # noqa: F401
from layers import euclidean_loss  # noqa: F401
from layers import flatten  # noqa: F401
from layers import input  # noqa: F401
from layers import neuron  # noqa: F401
from layers import reshape  # noqa: F401
from layers import scale_bias  # noqa: F401
from layers import slice  # noqa: F401
from layers import softmax  # noqa: F401
from layers import softmax_loss  # noqa: F401
from layers import split  # noqa: F401
from layers import sequence_data  # noqa: F401
