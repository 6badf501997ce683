"""caffe8 engine: backend, prototxt, Blob, Layer, Net, training loop, log, snapshots, CLI.

``from engine import Net`` works as in pycaffe (``caffe.Net``). The import is lazy so that
``engine.cli`` can set thread counts before NumPy loads.
"""


def __getattr__(name):
    if name == "Net":
        from engine.net import Net
        return Net
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
