"""Error types of caffe8.

Every user-facing error is a ``CaffeError``: one clear message naming the file, line, layer or
field, raised before any collective starts, so every rank fails the same way.
"""


class CaffeError(Exception):
    """Base class: a user-facing error whose message names the place of the problem."""


class PrototxtError(CaffeError):
    """Malformed prototxt or schema violation; message starts with ``file:line:col:``."""


class LayerError(CaffeError):
    """A layer's configuration or shapes are invalid; message names the layer."""

    def __init__(self, layer_name, message, layer_type=None):
        where = f"layer '{layer_name}'" + (f" (type {layer_type})" if layer_type else "")
        super().__init__(f"{where}: {message}")
        self.layer_name = layer_name


class DataError(CaffeError):
    """Missing or corrupt data file; message names the file."""


class SolverError(CaffeError):
    """Bad solver configuration; message names the field."""
