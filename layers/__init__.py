"""Layers, one module per Caffe type (or small family); imported here to register them."""
from layers import gru  # noqa: F401
from layers import conv  # noqa: F401
from layers import pooling  # noqa: F401
from layers import lrn  # noqa: F401
from layers import inner_product  # noqa: F401
from layers import emulate  # noqa: F401
