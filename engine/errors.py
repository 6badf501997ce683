"""Error types of caffe8.

Every user-facing error is a ``CaffeError``: one clear message naming the file, line, layer or
field, raised before any collective starts, so every rank fails the same way.
"""


def relative_to_cwd(path):
    """``" (relative to the working directory /x)"`` for a relative path, else "": what a
    path that is not found was looked up against (Caffe's paths are the working directory's)."""
    import os
    path = os.fspath(path)
    return "" if os.path.isabs(path) else f" (relative to the working directory {os.getcwd()})"


def did_you_mean(name, choices):
    """``" (did you mean 'x'?)"`` naming the choice closest to a misspelt ``name``, else ""."""
    import difflib
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    if not close:  # a case slip ("relu") is too far for difflib's ratio
        close = [c for c in choices if c.lower() == name.lower()][:1]
    return f" (did you mean '{close[0]}'?)" if close else ""


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
