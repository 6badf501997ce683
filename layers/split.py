"""Split (Caffe's split_layer.cpp): every top shares bottom's data; backward sums top diffs.

The Net inserts it for blobs used by several layers. It never runs in place.
"""
from caffe8.engine.layer import Layer, from_shapes, register_layer


@register_layer("Split")
class SplitLayer(Layer):
    exact_num_bottom = 1
    min_top = 1

    @from_shapes
    def reshape(self, bottom, top):
        for i, t in enumerate(top):
            if t is bottom[0]:
                raise self.error(f"top[{i}] is bottom[0]: Split does not allow in-place "
                                 "computation")
            t.reshape(bottom[0].shape)
            t.share_data(bottom[0])

    def forward(self, bottom, top):
        # Re-share every time: the producer may have rebound its data array since reshape.
        for t in top:
            t.share_data(bottom[0])

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        acc = bottom[0].diff
        acc[...] = top[0].diff
        for t in top[1:]:
            acc += t.diff
