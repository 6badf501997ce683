"""Blob: an N-d array pair (data, diff), like Caffe's Blob.

Parameter Blobs are views into one contiguous buffer per dtype owned by the Net (see
``engine.net``); ``set_storage`` rebinds a Blob onto such views. Activation Blobs own their arrays.
"""
import numpy

from caffe8.engine import backend


class Blob:
    def __init__(self, shape=(), dtype=numpy.float32, xp=None):
        self._xp = xp or backend.xp
        self.dtype = numpy.dtype(dtype)
        shape = tuple(int(s) for s in shape)
        self.data = self._xp.zeros(shape, dtype=self.dtype)
        self.diff = self._xp.zeros(shape, dtype=self.dtype)
        self._stamp = [0]   # the data's version, shared by the blobs that share the array

    @property
    def version(self):
        """How many times the data was written as far as the Net knows: the Net bumps it after
        each forward of the layer whose top this is (an in-place layer's too), a reshape or a
        rebinding does as well. Blobs sharing one array (``share_data``) share the count. A
        layer's backward that reuses what its forward computed from a bottom checks that the
        bottom's version has not moved since; writes from outside the Net (pycaffe's
        ``blob.data[...] = ...``) are not counted, which is why that reuse also needs the
        trainer's promise (``Layer.forward_work_kept``)."""
        return self._stamp[0]

    def touch(self):
        """Count a write of the data (see :attr:`version`)."""
        self._stamp[0] += 1

    @property
    def shape(self):
        return tuple(self.data.shape)

    @property
    def count(self):
        return int(self.data.size)

    @property
    def num_axes(self):
        return self.data.ndim

    @property
    def xp(self):
        return self._xp

    # Caffe's legacy 4-D accessors (Blob::LegacyShape: missing axes read as 1).
    def _legacy(self, axis):
        if self.num_axes > 4:
            raise ValueError(f"legacy 4-D accessor on a {self.num_axes}-axis blob {self.shape}")
        return self.shape[axis] if axis < self.num_axes else 1

    num = property(lambda self: self._legacy(0))
    channels = property(lambda self: self._legacy(1))
    height = property(lambda self: self._legacy(2))
    width = property(lambda self: self._legacy(3))

    def reshape(self, *shape):
        """Give the blob a shape — ``reshape((2, 3))`` or pycaffe's ``reshape(2, 3)``;
        reallocates (zeroed) only when the element count changes."""
        if len(shape) == 1 and not isinstance(shape[0], (int, numpy.integer)):
            shape = shape[0]
        if shape == self.data.shape:    # every forward reshapes: the common case first
            return
        shape = tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise ValueError(f"negative blob dimension in {shape}")
        if shape == self.shape:
            return
        self.touch()
        if int(numpy.prod(shape, dtype=numpy.int64)) == self.count and self.data.flags.c_contiguous:
            self.data = self.data.reshape(shape)
            self.diff = self.diff.reshape(shape)
        else:
            self.data = self._xp.zeros(shape, dtype=self.dtype)
            self.diff = self._xp.zeros(shape, dtype=self.dtype)

    def set_storage(self, data_view, diff_view):
        """Rebind onto external (contiguous) views of the same shape, keeping current values."""
        data_view[...] = self.data.reshape(data_view.shape)
        diff_view[...] = self.diff.reshape(diff_view.shape)
        self.data, self.diff = data_view, diff_view
        self.touch()

    def share_data(self, other):
        """Make this blob use ``other``'s data array (Split forward, in-place layers)."""
        self.data = other.data
        self._stamp = other._stamp
        self.touch()

    def __repr__(self):
        return f"Blob(shape={self.shape}, dtype={self.dtype})"
