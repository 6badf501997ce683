"""``cupy.ndarray`` of the stand-in and the array functions of the ``cupy`` namespace.

An array is a NumPy view (``_v``) of device memory (memory.py) with CuPy's ``data`` pointer.
Every operation on it is a device operation on the current stream (ordering.Op): NumPy computes
it at once, and the stand-in checks and records what it read and wrote (a view, a reshape or a
basic slice is no operation). As on CuPy, a device array never turns into a host array by itself
(``numpy.asarray`` of one raises TypeError; ``get()``, ``cupy.asnumpy``, ``float()`` read it,
wait for the current stream and copy), and host arrays do not mix with device arrays in an
operation. Reductions give 0-d device arrays, as CuPy's do.
"""
import numbers

import numpy
from numpy.lib.array_utils import byte_bounds
from numpy.lib.mixins import NDArrayOperatorsMixin

from tests.device_standin import devices, memory, ordering


def span_of(a, op):
    """(region, lo, hi) of the bytes ``a`` covers, reached from ``op``'s GPU."""
    if a.size == 0:
        lo = hi = a.data.ptr
    else:
        lo, hi = byte_bounds(a._v)
    where = memory.span(lo, hi - lo, devices.bus_id(_device_of(op.stream)))
    if where is None:
        raise RuntimeError("stand-in device: an array outside any known memory")
    return where


def _device_of(stream):
    return devices.current() if stream is ordering.Stream.null else stream.device_id


class ndarray(NDArrayOperatorsMixin):
    """``cupy.ndarray(shape, dtype=float, memptr=None, strides=None)``."""

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        shape = (int(shape),) if isinstance(shape, numbers.Integral) else tuple(shape)
        dtype = numpy.dtype(dtype)
        if memptr is None:
            memptr = memory.alloc(int(numpy.prod(shape, dtype=numpy.int64)) * dtype.itemsize)
        self.data = memptr
        self._v = memory.view(memptr.ptr, shape, dtype, strides)

    @classmethod
    def _of(cls, v, memptr):
        a = cls.__new__(cls)
        a._v, a.data = v, memptr
        return a

    # --- what the array is ------------------------------------------------------------------
    shape = property(lambda self: self._v.shape)
    dtype = property(lambda self: self._v.dtype)
    size = property(lambda self: self._v.size)
    ndim = property(lambda self: self._v.ndim)
    nbytes = property(lambda self: self._v.nbytes)
    itemsize = property(lambda self: self._v.itemsize)
    strides = property(lambda self: self._v.strides)
    flags = property(lambda self: self._v.flags)
    T = property(lambda self: self.transpose())

    @property
    def device(self):
        from tests.device_standin.cuda import Device
        return Device(self.data.device_id)

    def __len__(self):
        return len(self._v)

    def __repr__(self):
        return f"<stand-in device array shape={self.shape} dtype={self.dtype}>"

    def __array__(self, dtype=None, copy=None):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use "
                        "`.get()` to construct a NumPy array explicitly.")

    # --- NumPy's protocols: every ufunc and array function runs on the device ----------------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        fn = ufunc if method == "__call__" else getattr(ufunc, method)
        return device_call(fn, inputs, kwargs, f"{ufunc.__name__}.{method}")

    def __array_function__(self, func, types, args, kwargs):
        return device_call(func, args, kwargs, func.__name__)

    # --- views (no operation) and copies ----------------------------------------------------
    def reshape(self, *shape, order="C"):
        shape = shape[0] if len(shape) == 1 and not isinstance(shape[0], numbers.Integral) \
            else shape
        return finish(self._v.reshape(shape, order=order), [self], "reshape", [self])

    def ravel(self, order="C"):
        return finish(self._v.ravel(order), [self], "ravel", [self])

    def view(self, dtype=None):
        return finish(self._v.view(dtype), [self], "view", [self])

    def transpose(self, *axes):
        return finish(self._v.transpose(*axes), [self], "transpose", [self])

    def squeeze(self, axis=None):
        return finish(self._v.squeeze(axis), [self], "squeeze", [self])

    def astype(self, dtype, order="K", casting=None, subok=None, copy=True):
        if not copy and numpy.dtype(dtype) == self.dtype:
            return self
        return finish(self._v.astype(dtype, order=order), [self], "astype", [self])

    def copy(self, order="C"):
        return finish(self._v.copy(order), [self], "copy", [self])

    def flatten(self):
        return self.copy().ravel()

    def fill(self, value):
        op = ordering.Op("fill")
        op.access(writes=[span_of(self, op)])
        self._v.fill(value)

    def __getitem__(self, key):
        k = _unwrap(key)
        res = self._v[k]
        if isinstance(res, numpy.generic):              # CuPy: a 0-d view, not a scalar
            res = self._v[(k if isinstance(k, tuple) else (k,)) + (Ellipsis,)]
        return finish(res, [self], "getitem", [self] + _arrays(key))

    def __setitem__(self, key, value):
        k = _unwrap(key)
        target = self._v[k] if not _arrays(key) else None
        op = ordering.Op("setitem")
        whole = target is None or _view_of(target, [self]) is None
        writes = [span_of(self, op) if whole else span_of(ndarray._of(target, self.data), op)]
        op.access(reads=[span_of(a, op) for a in _arrays(key) + _arrays(value)], writes=writes)
        self._v[k] = _unwrap(value)

    # --- reading on the host ----------------------------------------------------------------
    def get(self, stream=None, order="C", out=None, blocking=True):
        """A host copy: a device-to-host copy on ``stream`` (default the current one), which
        the host waits for."""
        stream = ordering.current_stream() if stream is None else stream
        op = ordering.Op("get (device to host)", stream)
        op.access(reads=[span_of(self, op)])
        data = numpy.array(self._v, order=order)
        ordering.merge_host(stream.position())
        if out is not None:
            out[...] = data
            return out
        return data

    def set(self, arr, stream=None):
        self[...] = numpy.asarray(arr)

    def item(self):
        return self.get().item()

    def tolist(self):
        return self.get().tolist()

    def __float__(self):
        return float(self.get())

    def __int__(self):
        return int(self.get())

    def __bool__(self):
        return bool(self.get())

    def __index__(self):
        return int(self.get())

    def __iter__(self):
        return (self[i] for i in range(len(self)))


def _reduction(name):
    def method(self, *args, **kwargs):
        return device_call(getattr(numpy, name), (self,) + args, kwargs, name)
    method.__name__ = name
    return method


for _name in ("sum", "max", "min", "mean", "prod", "any", "all", "argmax", "argmin", "cumsum",
              "dot", "clip", "round", "nonzero", "std", "var"):
    setattr(ndarray, _name, _reduction(_name))


# --- wrapping NumPy's results --------------------------------------------------------------------
def _leaves(x):
    if isinstance(x, (list, tuple)):
        for item in x:
            yield from _leaves(item)
    elif isinstance(x, dict):
        for item in x.values():
            yield from _leaves(item)
    else:
        yield x


def _arrays(x):
    return [a for a in _leaves(x) if isinstance(a, ndarray)]


def _unwrap(x):
    if isinstance(x, ndarray):
        return x._v
    if isinstance(x, tuple):
        return tuple(_unwrap(i) for i in x)
    if isinstance(x, list):
        return [_unwrap(i) for i in x]
    if isinstance(x, dict):
        return {k: _unwrap(v) for k, v in x.items()}
    return x


def _view_of(v, bases):
    """The array of ``bases`` whose memory NumPy's result ``v`` lies in, or None (v is new)."""
    if not isinstance(v, numpy.ndarray) or v.size == 0:
        return None
    address = v.__array_interface__["data"][0]
    for b in bases:
        if b.data.mem.ptr <= address < b.data.mem.ptr + max(b.data.mem.size, 1):
            return b
    return None


def finish(result, bases, name, reads, outs=()):
    """Device arrays of NumPy's ``result``: views of ``bases`` stay views (no operation
    when nothing else is new); new arrays are device memory written by one operation that
    read ``reads`` and wrote ``outs``."""
    items = result if isinstance(result, tuple) else (result,)
    fresh = [isinstance(r, (numpy.ndarray, numpy.generic)) and not any(r is o._v for o in outs)
             and _view_of(r, bases) is None for r in items]
    op = None
    if any(fresh) or outs:
        op = ordering.Op(name)
        op.access(reads=[span_of(a, op) for a in reads], writes=[span_of(o, op) for o in outs])
    wrapped = tuple(_wrap(r, bases, outs, op, new) for r, new in zip(items, fresh))
    return wrapped if isinstance(result, tuple) else wrapped[0]


def _wrap(r, bases, outs, op, new):
    for o in outs:
        if r is o._v:
            return o
    if new:
        r = numpy.asarray(r)
        out = ndarray(r.shape, r.dtype)
        out._v[...] = r
        op.access(writes=[span_of(out, op)])
        return out
    if isinstance(r, numpy.ndarray):
        base = _view_of(r, bases)
        address = r.__array_interface__["data"][0]
        return ndarray._of(r, memory.MemoryPointer(base.data.mem, address - base.data.mem.ptr))
    return r


def device_call(fn, args, kwargs, name):
    """NumPy's ``fn`` on device arrays, as one device operation (see :func:`finish`)."""
    out = kwargs.get("out")
    outs = [o for o in (out if isinstance(out, tuple) else (out,)) if o is not None]
    if any(not isinstance(o, ndarray) for o in outs):
        raise TypeError(f"{name}: out must be a device array")
    others = {k: v for k, v in kwargs.items() if k != "out"}
    leaves = list(_leaves(args)) + list(_leaves(others))
    if any(isinstance(a, numpy.ndarray) and a.ndim for a in leaves):
        raise TypeError(f"{name}: a host (NumPy) array among device arrays (CuPy does not mix "
                        f"them)")
    reads = [a for a in leaves if isinstance(a, ndarray)]
    result = fn(*_unwrap(args), **_unwrap(kwargs))
    return finish(result, reads + outs, name, reads, outs)


# --- the cupy namespace's array functions ------------------------------------------------------
def empty(shape, dtype=float, order="C"):
    return ndarray(shape, dtype)


def full(shape, fill_value, dtype=None, order="C"):
    a = ndarray(shape, numpy.dtype(dtype) if dtype is not None else
                numpy.asarray(fill_value).dtype)
    a.fill(fill_value)
    return a


def zeros(shape, dtype=float, order="C"):
    return full(shape, 0, dtype)


def ones(shape, dtype=float, order="C"):
    return full(shape, 1, dtype)


def empty_like(a, dtype=None, order="K", subok=None, shape=None):
    return empty(a.shape if shape is None else shape, a.dtype if dtype is None else dtype)


def zeros_like(a, dtype=None, order="K", subok=None, shape=None):
    return zeros(a.shape if shape is None else shape, a.dtype if dtype is None else dtype)


def ones_like(a, dtype=None, order="K", subok=None, shape=None):
    return ones(a.shape if shape is None else shape, a.dtype if dtype is None else dtype)


def full_like(a, fill_value, dtype=None, order="K", subok=None, shape=None):
    return full(a.shape if shape is None else shape, fill_value,
                a.dtype if dtype is None else dtype)


def asarray(a, dtype=None, order=None, blocking=False):
    """A device array of ``a``: itself (cast when ``dtype`` differs), or a host-to-device copy
    on the current stream."""
    if isinstance(a, ndarray):
        return a if dtype is None else a.astype(dtype, copy=False)
    host = numpy.asarray(a, dtype=dtype, order=order)
    out = ndarray(host.shape, host.dtype)
    op = ordering.Op("asarray (host to device)")
    op.access(writes=[span_of(out, op)])
    out._v[...] = host
    return out


def array(obj, dtype=None, copy=True, order="K", subok=False, ndmin=0, blocking=False):
    if isinstance(obj, ndarray):
        out = obj.astype(obj.dtype if dtype is None else dtype, copy=copy)
    else:
        out = asarray(obj, dtype)
    return out.reshape((1,) * (ndmin - out.ndim) + out.shape) if ndmin > out.ndim else out


def ascontiguousarray(a, dtype=None):
    a = asarray(a)
    if a.flags.c_contiguous and (dtype is None or numpy.dtype(dtype) == a.dtype):
        return a
    return finish(numpy.ascontiguousarray(a._v, dtype), [a], "ascontiguousarray", [a])


def arange(*args, **kwargs):
    return asarray(numpy.arange(*args, **kwargs))


def asnumpy(a, stream=None, order="C", out=None, blocking=True):
    if isinstance(a, ndarray):
        return a.get(stream=stream, order=order, out=out)
    return numpy.asarray(a, order=order)


def from_dlpack(x):
    """A device array over ``x``'s memory, as CuPy's ``from_dlpack`` of a CUDA tensor. The
    stand-in takes host tensors (a CPU torch tensor standing for a CUDA one): their memory is
    adopted as device memory of the current GPU (memory.adopt)."""
    v = numpy.from_dlpack(x)
    if v.size == 0:
        return ndarray(v.shape, v.dtype)
    lo, hi = byte_bounds(v)
    mem = memory.adopt(lo, hi - lo)
    return ndarray._of(v, memory.MemoryPointer(mem, v.__array_interface__["data"][0] - mem.ptr))


def get_array_module(*args):
    from tests.device_standin import module
    return module() if any(isinstance(a, ndarray) for a in args) else numpy


def numpy_function(name):
    """NumPy's ``name`` in the cupy namespace: types and constants as they are, functions on
    device arrays (device_call)."""
    obj = getattr(numpy, name)
    if not callable(obj) or isinstance(obj, type):
        return obj

    def fn(*args, **kwargs):
        return device_call(obj, args, kwargs, name)
    fn.__name__ = name
    return fn
