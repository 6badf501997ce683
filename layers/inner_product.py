"""InnerProduct (Caffe's ``inner_product_layer.cpp``): ``y = x W^T + b`` after flattening.

Shapes: bottom ``(d0, ..., d_{axis-1}, d_axis, ...)`` viewed as ``(M, K)`` with
``M = prod(d0..d_{axis-1})``, ``K = prod(d_axis..)``; weight ``(N, K)`` (``(K, N)`` when
``transpose: true``); bias ``(N,)``; top ``(d0, ..., d_{axis-1}, N)``.

The GEMMs write through ``out=``: the product goes straight into the top and the bottom diff,
and the weight gradient is accumulated by the GEMM itself (BLAS's beta = 1, as Caffe's
``caffe_cpu_gemm`` call does) — no weight-sized temporary, which for CaffeNet's fc6 cost more in
page faults than the GEMM.
"""

from caffe8.engine import backend
from caffe8.engine.layer import Layer, from_shapes, register_layer
from caffe8.layers.axes import canonical_axis, count


@register_layer("InnerProduct")
class InnerProductLayer(Layer):
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.inner_product_param
        if not p.has("num_output") or p.num_output <= 0:
            raise self.error("inner_product_param.num_output must be given and > 0")
        self.num_output = p.num_output
        self.transpose = p.transpose
        self.axis = canonical_axis(self, p.axis, len(bottom[0].shape))
        self.k = count(bottom[0].shape, self.axis)
        shape = (self.k, self.num_output) if self.transpose else (self.num_output, self.k)
        self.make_param(shape, p.weight_filler)
        if p.bias_term:
            self.make_param((self.num_output,), p.bias_filler)

    @from_shapes
    def reshape(self, bottom, top):
        shape = bottom[0].shape
        k = count(shape, self.axis)
        if k != self.k:
            raise self.error(f"input size incompatible with inner product parameters: input "
                             f"{shape} flattens to K={k} from axis {self.axis}, weights expect K={self.k}")
        top[0].reshape(tuple(shape[:self.axis]) + (self.num_output,))

    def _x2d(self, blob_array):
        return blob_array.reshape(-1, self.k)

    def forward(self, bottom, top):
        x = self._x2d(bottom[0].data)
        w = self.blobs[0].data
        y = top[0].data.reshape(-1, self.num_output)
        backend.matmul(x, w if self.transpose else w.T, out=y)
        if len(self.blobs) > 1:
            y += self.blobs[1].data

    def backward(self, top, propagate_down, bottom):
        dy = top[0].diff.reshape(-1, self.num_output)
        x = self._x2d(bottom[0].data)
        w = self.blobs[0].data
        if self.param_propagate_down[0]:
            if self.transpose:
                backend.matmul(x.T, dy, out=self.blobs[0].diff, accumulate=True)
            else:
                backend.matmul(dy.T, x, out=self.blobs[0].diff, accumulate=True)
        if len(self.blobs) > 1 and self.param_propagate_down[1]:
            self.blobs[1].diff += dy.sum(axis=0)
        if propagate_down[0]:
            backend.matmul(dy, w.T if self.transpose else w, out=self._x2d(bottom[0].diff))
