"""Caffe's HDF5 model layout for a Net (``Net::ToHDF5`` / ``CopyTrainedLayersFromHDF5``).

``/data/<layer name>/<i>``: one group per layer (also layers without params), dataset ``i`` per
param Blob with the Blob's N-d shape; shared (non-owner) params are not written under /data.
``write_diff`` adds ``/diff/<layer>/<i>`` for every param, shared ones included. Layer names with
'/' (GoogLeNet) become nested groups; h5py reads them back by path, so they round-trip (Caffe
itself fails there, BVLC/caffe#4267). Loading copies by layer name and ignores unknown layers.
"""
import h5py

from caffe8.engine import backend
from caffe8.engine.errors import DataError


def is_hdf5(path):
    """True when the file at ``path`` is HDF5 (by its signature, not its name)."""
    try:
        return h5py.is_hdf5(path)
    except OSError:
        return False


def layer_groups(path):
    """Yield ``(layer name, {param index: h5py Dataset})`` for every layer group under /data of
    the HDF5 model at ``path``, in file order, while the file is open (a dataset is read only
    when asked: ``ds[...]``). Names with '/' nest as groups; a group is a layer when it holds
    datasets or nothing at all."""
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise DataError(f"{path}: cannot open HDF5 model: {e}") from None
    with f:
        if "data" not in f:
            raise DataError(f"{path}: no /data group (not a Caffe HDF5 model)")
        yield from _visit(f["data"], "")


def _visit(group, prefix):
    keys = list(group.keys())
    sets = {int(k): group[k] for k in keys if k.isdigit() and isinstance(group[k], h5py.Dataset)}
    if prefix and (sets or not keys):
        yield prefix, sets
    for k in keys:
        if isinstance(group[k], h5py.Group):
            yield from _visit(group[k], f"{prefix}/{k}" if prefix else k)


def copy_trained_layers(net, path):
    """Copy params of same-named layers from the HDF5 model at ``path`` (any name, as Caffe's
    CopyTrainedLayersFromHDF5) into ``net``."""
    by_name = {}
    for i, layer in enumerate(net.layers):
        by_name.setdefault(layer.name, []).append(i)
    for name, sets in layer_groups(path):
        for i in by_name.get(name, ()):
            _copy_layer(net, path, i, net.layers[i], sets)


def _copy_layer(net, path, i, layer, sets):
    present = set(sets)
    if present and max(present) >= len(layer.blobs):
        raise DataError(f"{path}: layer '{layer.name}': incompatible number of blobs "
                        f"({max(present) + 1} in the file, {len(layer.blobs)} in the net)")
    for k, blob in enumerate(layer.blobs):
        if k not in present:
            if net.owns_param(i, k):  # only a shared (non-owner) param may be absent
                raise DataError(f"{path}: layer '{layer.name}': param {k} missing "
                                f"(incompatible number of blobs)")
            continue
        values = sets[k][...]
        if tuple(values.shape) != blob.shape:
            raise DataError(f"{path}: layer '{layer.name}' param {k}: shape mismatch, file "
                            f"has {tuple(values.shape)}, net has {blob.shape}")
        blob.data[...] = backend.to_device(values.astype(blob.dtype), like=blob.data)


def write_model(net, path, write_diff=False):
    """Write ``net``'s params (and optionally diffs) to ``path`` in Caffe's HDF5 layout."""
    with h5py.File(path, "w") as f:
        trees = [("data", False)] + ([("diff", True)] if write_diff else [])
        for tree, is_diff in trees:
            root = f.create_group(tree)
            for i, layer in enumerate(net.layers):
                group = root.require_group(layer.name)
                for k, blob in enumerate(layer.blobs):
                    if not is_diff and not net.owns_param(i, k):
                        continue
                    if str(k) in group:  # a second layer of the same name: one group each
                        raise DataError(f"{path}: two layers named '{layer.name}' hold params; "
                                        "the HDF5 model format needs unique names")
                    arr = blob.diff if is_diff else blob.data
                    group.create_dataset(str(k), data=backend.to_numpy(arr))
