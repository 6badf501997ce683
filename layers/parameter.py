"""Parameter (Caffe's parameter_layer.hpp): a learned blob of ``parameter_param.shape`` as top.

The blob starts at zero, as in Caffe (load or share it to set values). Forward copies it into the
top; backward accumulates the top's diff into the blob's diff (Caffe instead shares the diff
array, which a consumer's overwrite would reset; accumulation keeps the layer contract, and both
agree for one backward per update).
"""
from engine.layer import Layer, register_layer
from engine.prototxt import Message


@register_layer("Parameter")
class ParameterLayer(Layer):
    exact_num_bottom = 0
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.parameter_param
        shape = tuple(int(d) for d in p.shape.dim)
        if any(d < 0 for d in shape):
            raise self.error(f"parameter_param.shape has a negative dimension: {shape}")
        self.make_param(shape, Message("FillerParameter"))

    def reshape(self, bottom, top):
        top[0].reshape(self.blobs[0].shape)

    def forward(self, bottom, top):
        top[0].data[...] = self.blobs[0].data

    def backward(self, top, propagate_down, bottom):
        if self.param_propagate_down[0]:
            self.blobs[0].diff += top[0].diff
