"""Host and device arithmetic of the exchange, from one place: what a step needs to know about
where a wire buffer lies.

``local_sum(wire)``
    ``fn(src, dst)``: dst <- src + dst in the wire format ``wire`` (a ``comm.ops.WireOp``): the
    host's C kernels (``wire.local_sum``), or on the device their twins
    (``comm.ipc.device_sum``: the same arithmetic, bit for bit), launched on the current stream;
``address(a)``
    where an array's first element lies (a step that knows a buffer finds a block's offset);
``array(x)``
    a transport's buffer as an array of this arithmetic (the identity here; caffe8.ddp's sides
    view a torch tensor as NumPy or CuPy);
``on_host(piece)`` / ``back(piece, host)``
    the piece as host memory for the codec's between-stages step (a host table), and its result
    back in place (on the host: the piece itself, nothing to copy);
``on_thread()`` / ``wait(event)``
    for a front door's thread (comm/pieces.py): a context for the thread's life, and the wait
    for an event after which the gradients are ready (on the host: nothing to enter or wait
    for; caffe8.ddp's CUDA side: its stream).

:data:`HOST` serves NumPy arrays; :class:`Device` CuPy arrays (caffe8.ddp's CUDA side; the
trainer's exchange sums on the GPUs through comm/ipc.py's arena, whose sums are the same
twins).
"""
import contextlib

from caffe8.comm.ipc import device_sum


class Host:
    """NumPy arrays."""
    on_device = False

    @staticmethod
    def local_sum(wire):
        return wire.local_sum

    @staticmethod
    def address(a):
        return a.ctypes.data

    @staticmethod
    def array(x):
        return x

    @staticmethod
    def on_host(piece):
        return piece

    @staticmethod
    def back(piece, host):
        pass

    @staticmethod
    def on_thread():
        return contextlib.nullcontext()

    @staticmethod
    def wait(event):
        pass


class Device(Host):
    """CuPy arrays: the device twins of the host sums, on the current stream."""
    on_device = True

    def __init__(self):
        self._sums = {}

    def local_sum(self, wire):
        add = self._sums.get(wire.local_sum)
        if add is None:
            add = self._sums[wire.local_sum] = device_sum(wire.local_sum)
        return add

    @staticmethod
    def address(a):
        return a.data.ptr

    @staticmethod
    def on_host(piece):
        """A host copy of ``piece`` (waits for the current stream): the codec's between-stages
        step is a host table, and a node's piece is small."""
        return piece.get()

    @staticmethod
    def back(piece, host):
        piece.set(host)


HOST = Host()
