"""BatchNorm (Caffe's batch_norm_layer.cpp), from Batch Normalization: Accelerating Deep Network
Training by Reducing Internal Covariate Shift — the normalisation only; the learned scale and
shift are a following Scale layer with ``bias_term: true``, as in Caffe.

Channels are axis 1 (a 1-D bottom is one channel); statistics run over every other axis.
Three blobs, laid out as in a BVLC caffemodel so one loads unchanged: the running mean sum (C,),
the running variance sum (C,) and the scale factor (1,). The stored sums are divided by the
scale factor when used (0 means "no statistics yet": mean and variance read as 0).

* ``use_global_stats`` (default: true in the TEST phase, false in TRAIN): normalise with the
  stored statistics; backward is dy / sqrt(var + eps).
* otherwise: normalise with the batch mean and biased variance, and update the stored sums
  (s = s * f + 1, mean_sum = mean_sum * f + mean, var_sum = var_sum * f + m/(m-1) var with
  f = ``moving_average_fraction`` and m = count / C); backward is
  (dy - mean(dy) - y mean(dy y)) / sqrt(var + eps) with means per channel.

Caffe masks the three blobs from the solver: it appends ``param { lr_mult: 0 }`` for each one the
prototxt does not configure, and refuses a nonzero lr_mult. This layer does the same to its
LayerParameter, so the net gives the statistics learning rate 0 and no gradient.
"""
from caffe8.engine import backend
from caffe8.engine.prototxt import Message
from caffe8.engine.layer import Layer, register_layer
from caffe8.layers.axes import reshape_like


@register_layer("BatchNorm")
class BatchNormLayer(Layer):
    exact_num_bottom = 1
    exact_num_top = 1
    forward_state_blobs = (0, 1, 2)   # mean, variance, the moving-average factor

    def layer_setup(self, bottom, top):
        p = self.layer_param.batch_norm_param
        self.use_global_stats = (bool(p.use_global_stats) if p.has("use_global_stats")
                                 else self.phase == "TEST")
        self.fraction = float(p.moving_average_fraction)
        self.eps = float(p.eps)
        shape = bottom[0].shape
        if len(shape) < 1:
            raise self.error("bottom must have at least 1 axis")
        self.channels = 1 if len(shape) == 1 else shape[1]
        zero = Message("FillerParameter")
        for s in ((self.channels,), (self.channels,), (1,)):
            self.make_param(s, zero)
        specs = self.layer_param.param
        for k in range(len(self.blobs)):
            if k == len(specs):
                spec = Message("ParamSpec")
                spec.lr_mult = 0.0
                specs.append(spec)
            elif specs[k].lr_mult != 0:
                raise self.error("cannot configure batch normalization statistics as layer "
                                 f"parameters: param {k} has lr_mult {specs[k].lr_mult}, "
                                 "it must be 0 (or leave the param block out)")
        self.param_propagate_down = [False] * len(self.blobs)

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        channels = 1 if len(shape) == 1 else shape[1]
        if channels != self.channels:
            raise self.error(f"bottom has {channels} channels, the statistics {self.channels}")
        reshape_like(bottom, top)

    def _view(self, a):
        """(N, C, S) view: statistics run over axes 0 and 2."""
        return a.reshape(a.shape[0], self.channels, -1)

    def forward(self, bottom, top):
        x = self._view(bottom[0].data)
        xp = backend.get_array_module(x)
        dt = x.dtype.type
        if self.use_global_stats:
            s = self.blobs[2].data
            factor = (s != 0) / xp.where(s == 0, dt(1), s)  # 1/s, and 0 for s = 0
            mean = self.blobs[0].data * factor.astype(x.dtype)
            var = self.blobs[1].data * factor.astype(x.dtype)
        else:
            mean = x.mean(axis=(0, 2))
            centred = x - mean.reshape(1, -1, 1)
            var = (centred * centred).mean(axis=(0, 2))
            m = x.size // self.channels
            correction = m / (m - 1) if m > 1 else 1.0
            f = dt(self.fraction)
            self.blobs[2].data[...] = self.blobs[2].data * f + dt(1)
            self.blobs[0].data[...] = self.blobs[0].data * f + mean
            self.blobs[1].data[...] = self.blobs[1].data * f + var * dt(correction)
        self._std = xp.sqrt(var + dt(self.eps))
        if self.use_global_stats:
            centred = x - mean.reshape(1, -1, 1)
        # y = (x - mean) / std in the buffer of x - mean: the same operations, one pass and one
        # array fewer (these layers are memory-bound: every pass over the blob counts)
        y = xp.divide(centred, self._std.reshape(1, -1, 1), out=centred)
        # kept for backward: an in-place layer after this one (Scale) may overwrite top data
        self._y = y
        top[0].data[...] = y.reshape(top[0].shape)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy = self._view(top[0].diff)
        std = self._std.reshape(1, -1, 1)
        xp = backend.get_array_module(dy)
        dx = self._view(bottom[0].diff)          # may be dy itself (in place): each step below
        if self.use_global_stats:                # reads dy only before writing dx
            xp.divide(dy, std, out=dx)
            return
        # dx = (dy - mean(dy) - y * mean(dy * y)) / std, operation for operation, in two arrays
        y = self._y
        t = dy * y
        mean_dy_y = t.mean(axis=(0, 2), keepdims=True)
        xp.subtract(dy, dy.mean(axis=(0, 2), keepdims=True), out=t)
        xp.multiply(y, mean_dy_y, out=dx)
        xp.subtract(t, dx, out=dx)
        xp.divide(dx, std, out=dx)
