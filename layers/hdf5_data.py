"""HDF5Data: rows of HDF5 datasets named by the tops (Caffe's hdf5_data_layer.cpp), via h5py.

``source`` is a text file listing .h5 files, one per line (relative paths are taken relative to
the working directory, as Caffe does; beside the list file only where that does not exist, with
a warning). Every top ``t`` reads dataset ``t`` of
each file; within a file all those datasets have the same number of rows. Rows are numbered
across the files in list order, and this rank keeps rows ≡ rank (mod world). Batches run on
from one file into the next. With ``shuffle`` the file order is shuffled at every epoch and the
rows of a file each time it is loaded (Caffe's scheme, which keeps one file in memory).
As in Caffe, HDF5Data applies no transformation (a transform_param is rejected, not ignored).
Top shapes: (batch_size, *dataset.shape[1:]).

Threads: files are read on the prefetch thread, but every h5py object lives only inside one
call (``_read_rows``: open, read into NumPy arrays, close), so between batches the thread
holds no h5py object, and the prefetch thread is always joined before the interpreter
finalises (``engine.prefetch``): h5py's global lock is never held by a thread that dies.
"""
import h5py
import numpy

from caffe8.engine.errors import DataError, relative_to_cwd
from caffe8.engine.layer import register_layer
from caffe8.layers.base_data import BaseDataLayer, read_list_file, resolve_listed_path


def _open_h5(path, listed_at):
    try:
        return h5py.File(path, "r")
    except FileNotFoundError:
        raise DataError(f"HDF5 file '{path}' (listed at {listed_at}) does not exist"
                        f"{relative_to_cwd(path)}") from None
    except OSError as e:
        raise DataError(f"HDF5 file '{path}' (listed at {listed_at}) cannot be read: {e}") from None


def _read_rows(path, names, first, step, listed_at):
    """NumPy copies of rows ``first::step`` of datasets ``names``; no h5py object outlives
    the call (a strided hyperslab: each rank reads only its own rows from disk)."""
    with _open_h5(path, listed_at) as f:
        return [numpy.array(_dataset(f, path, n)[first::step]) for n in names]


def _kind(dtype):
    kinds = {"c": "complex numbers", "S": "strings", "U": "strings", "O": "strings or objects",
             "V": "compound records"}
    return f"{kinds.get(dtype.kind, 'values')} ({dtype})"


def _dataset(f, path, name):
    if name not in f or not isinstance(f[name], h5py.Dataset):
        raise DataError(f"HDF5 file '{path}' has no dataset '{name}' (datasets: "
                        + ", ".join(sorted(k for k in f if isinstance(f[k], h5py.Dataset)))
                        + ")")
    return f[name]


@register_layer("HDF5Data")
class HDF5DataLayer(BaseDataLayer):
    min_top = 1

    def data_setup(self, top):
        p = self.layer_param.hdf5_data_param
        if self.layer_param.has("transform_param"):
            raise self.error("HDF5Data does not transform data (as in Caffe); remove "
                             f"transform_param at {self.layer_param.location('transform_param')}")
        self.source = p.source
        self.batch_size = self.batch_size_of(p)
        self.shuffle = bool(p.shuffle)
        self.names = list(self.layer_param.top)
        listed = read_list_file(self.source, "HDF5 list file (source)")
        if not listed:
            raise DataError(f"HDF5 list file (source) '{self.source}' lists no files")
        self.files, trailing, offset = [], None, 0
        for line, entry in listed:
            path = resolve_listed_path(entry, self.source)
            rows, shapes = self._inspect(path, f"{self.source}:{line}")
            if trailing is None:
                trailing = shapes
            elif shapes != trailing:
                raise DataError(f"HDF5 file '{path}' has row shapes {shapes} for {self.names}, "
                                f"but earlier files have {trailing}")
            first = (self.rank - offset) % self.world  # first local row ≡ rank (mod world)
            if first < rows:
                self.files.append((path, first, len(range(first, rows, self.world))))
            offset += rows
        if not self.files:
            raise self.error(f"'{self.source}' has {offset} row(s): none for rank {self.rank} "
                             f"of {self.world}")
        self._start_epoch()
        return [(self.batch_size,) + s for s in trailing]

    def _inspect(self, path, listed_at):
        """(row count, per-top row shapes) of one file, checking the datasets exist."""
        with _open_h5(path, listed_at) as f:
            sets = [_dataset(f, path, n) for n in self.names]
            for name, d in zip(self.names, sets):
                if d.dtype.kind not in "biuf":  # as Caffe's H5LTread_dataset into float/double
                    raise DataError(f"HDF5 file '{path}' (listed at {listed_at}): dataset "
                                    f"'{name}' holds {_kind(d.dtype)}; HDF5Data reads real "
                                    "numbers only")
            if any(d.ndim == 0 for d in sets):
                raise DataError(f"HDF5 file '{path}': datasets {self.names} need at least one axis")
            rows = {d.shape[0] for d in sets}
            if len(rows) != 1:
                raise DataError(f"HDF5 file '{path}': datasets {self.names} have different row "
                                f"counts {[d.shape[0] for d in sets]}")
            return rows.pop(), [tuple(d.shape[1:]) for d in sets]

    def _start_epoch(self):
        self.epoch_rng = self.shuffle_rng.bit_generator.state
        self.order = numpy.arange(len(self.files))
        if self.shuffle:
            self.order = self.shuffle_rng.permutation(len(self.files))
        self.file_pos = 0
        self._load_file()

    def _load_file(self):
        self.file_rng = self.shuffle_rng.bit_generator.state
        path, first, count = self.files[self.order[self.file_pos]]
        self.current = _read_rows(path, self.names, first, self.world, self.source)
        if any(len(c) != count for c in self.current):
            raise DataError(f"HDF5 file '{path}' changed while it was being read")
        self.rows = numpy.arange(count)
        if self.shuffle:
            self.rows = self.shuffle_rng.permutation(count)
        self.row_pos = 0

    def cursor_state(self):
        return {"file_pos": self.file_pos, "row_pos": self.row_pos, "epoch_rng": self.epoch_rng,
                "file_rng": self.file_rng, "shuffle_rng": self.shuffle_rng.bit_generator.state}

    def restore_cursor(self, state):
        """Redraw the epoch's file order and the current file's row order, then continue."""
        self.shuffle_rng.bit_generator.state = state["epoch_rng"]
        self._start_epoch()
        self.file_pos = int(state["file_pos"])
        self.shuffle_rng.bit_generator.state = state["file_rng"]
        self._load_file()
        self.row_pos = int(state["row_pos"])
        self.shuffle_rng.bit_generator.state = state["shuffle_rng"]

    def load_batch(self):
        out = [numpy.empty(s, dtype=self.dtype) for s in self.top_shapes]
        filled = 0
        while filled < self.batch_size:   # runs of rows of the current file, one copy each
            take = min(self.batch_size - filled, len(self.rows) - self.row_pos)
            rows = self.rows[self.row_pos:self.row_pos + take]
            for dst, src in zip(out, self.current):
                dst[filled:filled + take] = src[rows]
            filled += take
            self.row_pos += take
            if self.row_pos == len(self.rows):  # next file, or the next epoch
                self.file_pos += 1
                if self.file_pos == len(self.files):
                    self._start_epoch()
                else:
                    self._load_file()
        return tuple(out)
