"""Model files in both of Caffe's formats, chosen by file name.

* binary protobuf (``.caffemodel``, Caffe's default ``snapshot_format: BINARYPROTO`` and the Model
  Zoo's format): a NetParameter whose layers carry their ``blobs`` (BlobProto: ``shape`` plus
  packed float ``data``, or ``double_data``; pre-2015 files give the legacy 4-D
  num/channels/height/width instead of ``shape``, and V1/V0 files keep their layers in
  ``layers``);
* HDF5 (``.h5``, ``engine.net_hdf5``): ``/data/<layer>/<i>``.

``load_weights(net, path)`` copies the params of same-named layers (Caffe's
``CopyTrainedLayersFrom``): layers the net lacks are ignored, a shape mismatch is fatal.
``save_model(net, path)`` writes the format the name asks for (Caffe's ``Net::ToProto`` keeps every
layer's parameters beside its blobs). ``convert(src, dst)`` turns one format into the other without
building a net.
"""
import os

import h5py
import numpy

from caffe8.engine import backend, net_hdf5
from caffe8.engine.errors import DataError, relative_to_cwd
from caffe8.engine.proto import caffe_pb2, read_message
from caffe8.engine.proto.blobs import array_to_blob, blob_shape, blob_to_array, shape_matches
from caffe8.engine.proto.convert import to_pb
from caffe8.engine.snapshot import (BINARYPROTO, HDF5, atomic_write, model_record,
                                    save_solverstate, snapshot_names)


def format_of(path):
    """``"HDF5"`` for a ``.h5`` name, else ``"BINARYPROTO"`` (Caffe's rule)."""
    return HDF5 if str(path).endswith(".h5") else BINARYPROTO


# --- binary model files ---------------------------------------------------------------------------
def read_binary_net(path):
    """The NetParameter in binary file ``path`` (DataError when unreadable or not a NetParameter)."""
    return read_message(path, caffe_pb2.NetParameter(), "model",
                        "a binary Caffe model (NetParameter)", DataError)


def source_layers(net_pb):
    """``(name, blobs, param names)`` of every layer of a NetParameter, whichever form it has:
    ``layer`` (current), ``layers`` (V1) or ``layers { layer }`` (V0)."""
    for l in net_pb.layer:
        yield l.name, l.blobs, [p.name for p in l.param]
    for l in net_pb.layers:
        if l.HasField("layer"):
            yield l.layer.name, l.layer.blobs, []
        else:
            yield l.name, l.blobs, list(l.param)


def copy_trained_layers_binary(net, path):
    """Copy params of same-named layers from the binary model at ``path`` into ``net``."""
    index = {}
    for i, name in enumerate(net.layer_names):
        index.setdefault(name, i)  # Caffe searches for the first layer of that name
    for name, blobs, _ in source_layers(read_binary_net(path)):
        i = index.get(name)
        if i is None:
            continue  # Caffe: "Ignoring source layer"
        layer = net.layers[i]
        if len(blobs) > len(layer.blobs):
            raise DataError(f"{path}: layer '{name}': incompatible number of blobs "
                            f"({len(blobs)} in the file, {len(layer.blobs)} in the net)")
        for k, target in enumerate(layer.blobs):
            if k >= len(blobs):
                if net.owns_param(i, k):  # only a shared (non-owner) param may be absent
                    raise DataError(f"{path}: layer '{name}': param {k} missing "
                                    f"(incompatible number of blobs: {len(blobs)} in the file, "
                                    f"{len(layer.blobs)} in the net)")
                continue
            source = blobs[k]
            if not shape_matches(source, target.shape):
                raise DataError(f"{path}: cannot copy param {k} weights from layer '{name}'; "
                                f"shape mismatch: file has {blob_shape(source)}, net has "
                                f"{tuple(target.shape)}")
            values = blob_to_array(source, f"{path}: layer '{name}' param {k}", target.shape)
            target.data[...] = backend.to_device(values.astype(target.dtype), like=target.data)


def net_to_proto(net, write_diff=False):
    """Caffe's ``Net::ToProto``: the net's name, every layer's parameters and its blobs."""
    out = caffe_pb2.NetParameter()
    if net.name:
        out.name = net.name
    for layer in net.layers:
        lp = out.layer.add()
        to_pb(layer.layer_param, lp)
        del lp.blobs[:]
        for blob in layer.blobs:
            array_to_blob(backend.to_numpy(blob.data), lp.blobs.add(),
                          backend.to_numpy(blob.diff) if write_diff else None)
    return out


def write_binary_model(net, path, write_diff=False):
    with open(path, "wb") as f:
        f.write(net_to_proto(net, write_diff).SerializeToString())


# --- dispatch -------------------------------------------------------------------------------------
def load_weights(net, path):
    """Copy trained params into ``net`` from an HDF5 or binary model file, told apart by its
    content (HDF5's signature), whatever its name."""
    path = str(path)
    if not os.path.isfile(path):
        raise DataError(f"{path}: model file does not exist{relative_to_cwd(path)}")
    try:
        if net_hdf5.is_hdf5(path):
            net_hdf5.copy_trained_layers(net, path)
        else:
            copy_trained_layers_binary(net, path)
    except DataError as e:  # a layer name used twice is the likely cause: say so
        twice = next((note for name in dict.fromkeys(net.layer_names) if f"'{name}'" in str(e)
                      for note in [net.name_used_twice(name)] if note), "")
        if not twice:
            raise
        raise DataError(f"{e}{twice}") from None


def save_model(net, path, fmt=None, write_diff=False):
    """Write ``net``'s params to ``path`` atomically, as ``fmt`` ("BINARYPROTO" or "HDF5";
    default: by the file name, ``.h5`` meaning HDF5)."""
    fmt = fmt or format_of(path)
    if fmt == HDF5:
        atomic_write(path, lambda tmp: net_hdf5.write_model(net, tmp, write_diff))
    elif fmt == BINARYPROTO:
        atomic_write(path, lambda tmp: write_binary_model(net, tmp, write_diff))
    else:
        raise ValueError(f"unknown model format {fmt!r}; valid: BINARYPROTO, HDF5")
    return path


def write_snapshot(net, solver_state, prefix, iteration, fmt=BINARYPROTO, write_diff=False,
                   extra=None, log=None):
    """Caffe's ``Solver::Snapshot``: the model, then the solver state naming it, in ``fmt``
    (``snapshot_format``), with Caffe's log lines. Returns ``(model, solverstate)`` paths. The
    state records the model's name and checksum (``engine.snapshot.model_record``), so that a
    resume refuses a model of another run beside it."""
    model, state = snapshot_names(prefix, iteration, fmt)
    kind = "HDF5" if fmt == HDF5 else "binary proto"
    if log:
        log(f"Snapshotting to {kind} file {model}")
    save_model(net, model, fmt, write_diff)
    if log:
        log(f"Snapshotting solver state to {kind} file {state}")
    extra = dict(extra or {}, model=model_record(model))
    save_solverstate(state, solver_state, model, extra=extra)
    return model, state


# --- conversion -----------------------------------------------------------------------------------
def convert(src, dst):
    """Convert a model between binary (``.caffemodel``) and HDF5 (``.h5``), by the names' suffixes.

    Binary to HDF5 drops the layers' parameters (HDF5 models hold only blobs) and, as Caffe's
    ``ToHDF5`` does, the blobs of a shared param except in its first (owner) layer. HDF5 to
    binary writes one layer per /data group, with only its name and blobs: enough for
    ``load_weights`` and Caffe's ``CopyTrainedLayersFrom``, which match layers by name.
    """
    src, dst = str(src), str(dst)
    if format_of(src) == BINARYPROTO and format_of(dst) == HDF5:
        net = read_binary_net(src)
        seen = set()

        def write(tmp):
            with h5py.File(tmp, "w") as f:
                root = f.create_group("data")
                for name, blobs, param_names in source_layers(net):
                    group = root.require_group(name)
                    for k, blob in enumerate(blobs):
                        shared = param_names[k] if k < len(param_names) else ""
                        if shared and shared in seen:
                            continue
                        if shared:
                            seen.add(shared)
                        group.create_dataset(str(k), data=blob_to_array(
                            blob, f"{src}: layer '{name}' param {k}"))
        atomic_write(dst, write)
    elif format_of(src) == HDF5 and format_of(dst) == BINARYPROTO:
        out = caffe_pb2.NetParameter()
        for name, sets in net_hdf5.layer_groups(src):
            lp = out.layer.add()
            lp.name = name
            for k in sorted(sets):
                array_to_blob(numpy.array(sets[k]), lp.blobs.add())
        data = out.SerializeToString()

        def write(tmp):
            with open(tmp, "wb") as f:
                f.write(data)
        atomic_write(dst, write)
    else:
        raise DataError(f"convert {src} -> {dst}: one file must be HDF5 (.h5) and the other "
                        f"binary (e.g. .caffemodel)")
    return dst
