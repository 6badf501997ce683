"""Error types of caffe8.

Every user-facing error is a ``CaffeError``: one clear message naming the file, line, layer or
field, raised before any collective starts, so every rank fails the same way.
"""


class CaffeError(Exception):
    """Base class: a user-facing error whose message names the place of the problem."""


class PrototxtError(CaffeError):
    """Malformed prototxt or schema violation; message starts with ``file:line:col:``."""


class LayerError(CaffeError):
    """A layer's configuration or shapes are invalid; message names the layer and, when
    known, where the layer is defined (``at file:line:col``)."""

    def __init__(self, layer_name, message, layer_type=None, location=None):
        where = f"layer '{layer_name}'" + (f" (type {layer_type})" if layer_type else "")
        if location:
            where += f" at {location}"
        super().__init__(f"{where}: {message}")
        self.layer_name, self.message = layer_name, message
        self.layer_type, self.location = layer_type, location

    def at(self, location):
        """This error with the layer's definition site added (unchanged if it has one)."""
        if self.location or not location:
            return self
        # its own class: a subclass (layers.python_layer's, of the user's exception) stays one
        located = type(self)(self.layer_name, self.message, self.layer_type, location)
        located.__cause__ = self.__cause__
        return located


class DataError(CaffeError):
    """Missing or corrupt data file; message names the file."""


class SolverError(CaffeError):
    """Bad solver configuration; message names the field."""
