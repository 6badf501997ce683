"""Layers, one module per Caffe type (or small family); imported here to register them."""
from layers import gru  # noqa: F401
