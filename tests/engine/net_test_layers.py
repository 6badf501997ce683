"""Tiny layers used only by tests/engine/test_net.py, so that the Net's semantics are checked
against closed forms independently of the real layer implementations.

* ``NTData``   — data layer; tops shaped by ``dummy_data_param.shape``, fixed values
  ``0.1 * (index + 1) * (top number + 1)``.
* ``NTLinear`` — ``y = x W^T + b`` on ``x`` viewed as (N, K); W (num_output, K), b (num_output,).
* ``NTDouble`` — ``y = 2 x`` (works in place).
* ``NTHalfSq`` — scalar ``0.5 * sum(x^2)``, a loss layer (default loss weight 1).
* ``NTRows``   — ``y = x * rows``, rows kept by a ``from_shapes`` reshape, reshapes counted.
"""
import numpy

from caffe8.engine import backend

from caffe8 import layers  # noqa: F401  (register the real layers first)
from caffe8.engine.layer import LAYERS, Layer, from_shapes, register_layer


def _register(name):
    def deco(cls):
        if name in LAYERS:
            return LAYERS[name]
        return register_layer(name)(cls)
    return deco


@_register("NTData")
class NTData(Layer):
    is_data = True
    exact_num_bottom = 0

    def layer_setup(self, bottom, top):
        self.values = []
        for t, shape in enumerate(self.layer_param.dummy_data_param.shape):
            dims = tuple(int(d) for d in shape.dim)
            n = int(numpy.prod(dims))
            self.values.append((0.1 * (numpy.arange(n) + 1) * (t + 1)).reshape(dims))

    def reshape(self, bottom, top):
        for t, v in zip(top, self.values):
            t.reshape(v.shape)

    def forward(self, bottom, top):
        for t, v in zip(top, self.values):
            t.data[...] = backend.to_device(v, like=t.data)


@_register("NTLinear")
class NTLinear(Layer):
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.inner_product_param
        self.k = int(numpy.prod(bottom[0].shape[1:]))
        self.make_param((p.num_output, self.k), p.weight_filler)
        self.make_param((p.num_output,), p.bias_filler)

    def reshape(self, bottom, top):
        top[0].reshape((bottom[0].shape[0], self.blobs[0].shape[0]))

    def forward(self, bottom, top):
        x = bottom[0].data.reshape(-1, self.k)
        top[0].data[...] = x @ self.blobs[0].data.T + self.blobs[1].data

    def backward(self, top, propagate_down, bottom):
        dy = top[0].diff
        x = bottom[0].data.reshape(-1, self.k)
        if self.param_propagate_down[0]:
            self.blobs[0].diff += dy.T @ x
        if self.param_propagate_down[1]:
            self.blobs[1].diff += dy.sum(axis=0)
        if propagate_down[0]:
            bottom[0].diff[...] = (dy @ self.blobs[0].data).reshape(bottom[0].shape)


@_register("NTDouble")
class NTDouble(Layer):
    exact_num_bottom = 1
    exact_num_top = 1

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        top[0].data[...] = 2 * bottom[0].data

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = 2 * top[0].diff


@_register("NTHalfSq")
class NTHalfSq(Layer):
    exact_num_bottom = 1
    exact_num_top = 1
    default_loss_weight = 1.0

    def reshape(self, bottom, top):
        top[0].reshape(())

    def forward(self, bottom, top):
        top[0].data[...] = 0.5 * numpy.sum(bottom[0].data ** 2)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = bottom[0].data * top[0].diff


@_register("NTRows")
class NTRows(Layer):
    """``y = x * rows`` with ``rows`` (the bottom's first dimension) kept by a ``from_shapes``
    reshape: a forward after a skipped reshape shows whether what it kept is still right. Counts
    its reshapes in ``reshapes``."""
    exact_num_bottom = 1
    exact_num_top = 1
    reshapes = 0

    @from_shapes
    def reshape(self, bottom, top):
        self.reshapes += 1
        self.rows = bottom[0].shape[0]
        top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data * self.rows
