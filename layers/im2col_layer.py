"""Im2col (Caffe's im2col_layer.cpp): a convolution's columns as a layer's output.

``convolution_param`` gives the geometry, read as Convolution reads it (kernel_size or
kernel_h/w, stride, pad, dilation; once or per spatial axis; ``axis`` the channel axis); the
axes before ``axis`` are items of the batch. Top: the bottom's shape with channels × prod(kernel)
and each spatial axis the convolution's output length; channel ``c * prod(kernel) + offset``
holds input channel ``c`` at kernel offset ``offset`` (row-major over the kernel axes), as
Caffe's im2col writes them. Backward is col2im: the top's diff summed back into the bottom's
(overwritten; gradients that land in the padding are dropped), computed always, as Caffe's.
The arithmetic is ``layers.im2col``'s, the convolution's own.
"""
from caffe8.engine.layer import Layer, register_layer
from caffe8.layers.axes import canonical_axis, count
from caffe8.layers.conv import read_geometry
from caffe8.layers.im2col import col2im, conv_out_size, im2col


@register_layer("Im2col")
class Im2colLayer(Layer):
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.convolution_param
        shape = bottom[0].shape
        self.axis = canonical_axis(self, p.axis, len(shape))
        self.num_spatial = len(shape) - self.axis - 1
        if self.num_spatial < 1:
            raise self.error(f"needs at least one spatial axis after the channel axis "
                             f"{self.axis}, got shape {shape}")
        # the convolution's reading of the geometry (Caffe's Im2colLayer::LayerSetUp is a copy
        # of BaseConvolutionLayer's): sets kernel, stride, pad and dilation per spatial axis
        read_geometry(self, p)

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        if top[0] is bottom[0]:
            raise self.error("Im2col does not allow in-place computation")
        spatial = shape[self.axis + 1:]
        out = [conv_out_size(*g) for g in zip(spatial, self.kernel, self.pad, self.stride,
                                               self.dilation)]
        if min(out) < 1:
            raise self.error(f"the kernel {self.kernel} (pad {self.pad}, dilation "
                             f"{self.dilation}) does not fit the input's spatial shape {spatial}")
        self.num = count(shape, 0, self.axis)  # items: the axes before the channel axis
        self.channels = shape[self.axis]
        top[0].reshape(shape[:self.axis] + (self.channels * count(self.kernel),) + tuple(out))

    def _items(self, shape):
        """``shape`` with the axes before the channel axis merged into one (the items)."""
        return (self.num,) + tuple(shape[self.axis:])

    def forward(self, bottom, top):
        x = bottom[0].data.reshape(self._items(bottom[0].shape))
        cols = im2col(x, self.kernel, self.pad, self.stride, self.dilation)  # (C, *k, N, *out)
        k = len(self.kernel)
        items_first = cols.reshape((count(cols.shape, 0, k + 1),) + cols.shape[k + 1:])
        top[0].data[...] = items_first.swapaxes(0, 1).reshape(top[0].shape)

    def backward(self, top, propagate_down, bottom):
        xp_shape = self._items(bottom[0].shape)
        k = len(self.kernel)
        dy = top[0].diff.reshape((self.num, self.channels) + tuple(self.kernel)
                                 + tuple(top[0].shape[self.axis + 1:]))
        cols = dy.transpose(tuple(range(1, k + 2)) + (0,) + tuple(range(k + 2, dy.ndim)))
        col2im(cols, xp_shape, self.kernel, self.pad, self.stride, self.dilation,
               out=bottom[0].diff.reshape(xp_shape))
