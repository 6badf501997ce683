"""Snapshots in both of Caffe's formats, written atomically (temporary file, then rename).

``snapshot_format`` picks the names (Caffe's ``Solver::Snapshot``):

* BINARYPROTO (Caffe's default): ``<prefix>_iter_N.caffemodel`` (a binary NetParameter,
  ``engine.model_io``) and ``<prefix>_iter_N.solverstate`` (a binary SolverState: ``iter``,
  ``learned_net``, ``history``, ``current_step``);
* HDF5: ``<prefix>_iter_N.caffemodel.h5`` (``/data/<layer>/<i>``) and
  ``<prefix>_iter_N.solverstate.h5`` with ``iter``, ``learned_net``, ``current_step`` and
  ``history/<i>`` as Caffe writes them.

Either solver state also holds what Caffe does not save but an exact resume needs (random
generator state, data cursors) as JSON: the ``caffe8/extra`` dataset in HDF5, SolverState field
1001 (``c8_extra``) in binary, a field number Caffe does not use, so Caffe skips it on reading.
Reading chooses the format by the name, as Caffe's ``Solver::Restore`` does (``.h5``: HDF5).
"""
import json
import os
import re

import h5py
import numpy

from caffe8.engine import backend
from caffe8.engine.errors import CaffeError
from caffe8.engine.proto import caffe_pb2, read_message
from caffe8.engine.proto.blobs import array_to_blob, blob_to_array

BINARYPROTO, HDF5 = "BINARYPROTO", "HDF5"


def snapshot_names(prefix, iteration, fmt):
    """``(model, solverstate)`` file names of the snapshot at ``iteration`` in format ``fmt``."""
    if fmt not in (BINARYPROTO, HDF5):
        raise ValueError(f"unknown snapshot_format {fmt!r}; valid: BINARYPROTO, HDF5")
    suffix = ".h5" if fmt == HDF5 else ""
    base = f"{prefix}_iter_{iteration}"
    return base + ".caffemodel" + suffix, base + ".solverstate" + suffix


def _is_hdf5(path):
    return str(path).endswith(".h5")


def atomic_write(path, write):
    """Call ``write(tmp_path)`` then rename onto ``path``, so a crash never leaves a torn file."""
    path = str(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, _temporary_name(path))
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)  # the data is on disk before the name points at it
        finally:
            os.close(fd)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _temporary_name(path):
    return f".{os.path.basename(path)}.tmp{os.getpid()}"


def _pid_alive(pid):
    if pid == os.getpid():  # a leftover of an earlier process that had our PID
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def _prefix_pattern(prefix, kinds):
    # binary proto snapshots have no extension after the kind, HDF5 ones end in .h5
    return re.compile(re.escape(os.path.basename(prefix)) + r"_iter_(\d+)\.(" + kinds + r")(\.h5)?")


def stale_temporaries(prefix):
    """Temporary files ``atomic_write`` left behind for snapshots of ``prefix`` (a process
    killed while writing): only this prefix's, only those whose writing process is dead."""
    directory = os.path.dirname(os.path.abspath(prefix))
    pattern = _prefix_pattern(prefix, "caffemodel|solverstate")
    found = []
    try:
        names = os.listdir(directory)
    except OSError:
        return found
    for name in names:
        m = re.fullmatch(r"\.(.+)\.tmp(\d+)", name)
        if m and pattern.fullmatch(m.group(1)) and not _pid_alive(int(m.group(2))):
            found.append(os.path.join(directory, name))
    return sorted(found)


def remove_stale_temporaries(prefix):
    """Remove ``stale_temporaries(prefix)``; returns the paths removed."""
    removed = []
    for path in stale_temporaries(prefix):
        try:
            os.remove(path)
            removed.append(path)
        except FileNotFoundError:
            pass
    return removed


def snapshot_files(prefix):
    """``[(N, path)]`` of the ``<prefix>_iter_N`` snapshot files (model or solver state)."""
    directory = os.path.dirname(os.path.abspath(prefix))
    pattern = _prefix_pattern(prefix, "caffemodel|solverstate")
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted((int(m.group(1)), os.path.join(directory, name))
                  for name, m in zip(names, map(pattern.fullmatch, names)) if m)


def snapshot_iters(prefix):
    """Sorted iterations N of the ``<prefix>_iter_N`` snapshot files (model or solver state)."""
    return sorted({n for n, _ in snapshot_files(prefix)})


#: absolute paths of the snapshot files this process wrote (``written_here``)
_WRITTEN_HERE = set()


def written_here(*paths):
    """Record snapshot files as this process's own; returns the set of them. A run that meets
    them later in its prefix (a notebook solving again, pycaffe's solve() in a loop) meets its
    own earlier work, not another run's."""
    _WRITTEN_HERE.update(os.path.abspath(p) for p in paths)
    return _WRITTEN_HERE


def save_solverstate(path, state, learned_net, extra=None):
    """Write ``state`` (``iter``, ``current_step``, ``history``): HDF5 for a ``.h5`` name, else a
    binary SolverState."""
    if not _is_hdf5(path):
        return save_solverstate_binary(path, state, learned_net, extra)

    def write(tmp):
        with h5py.File(tmp, "w") as f:
            f.create_dataset("iter", data=numpy.array([state["iter"]], dtype=numpy.int32))
            f.create_dataset("learned_net", data=numpy.bytes_(learned_net))
            f.create_dataset("current_step", data=numpy.array([state["current_step"]], dtype=numpy.int32))
            hist = f.create_group("history")
            for i, h in enumerate(state["history"]):
                hist.create_dataset(str(i), data=backend.to_numpy(h))
            if extra:
                f.create_dataset("caffe8/extra", data=numpy.bytes_(json.dumps(extra)))
    atomic_write(path, write)


def load_solverstate(path):
    """Read a solverstate file written by ``save_solverstate`` (or by Caffe), HDF5 for a ``.h5``
    name, else binary; returns ``(state, extra)``."""
    if not _is_hdf5(path):
        return load_solverstate_binary(path)
    try:
        with h5py.File(path, "r") as f:
            n = len(f["history"])
            state = {
                "iter": int(f["iter"][0]),
                "current_step": int(f["current_step"][0]) if "current_step" in f else 0,
                "history": [numpy.array(f["history"][str(i)]) for i in range(n)],
                "learned_net": f["learned_net"][()].decode() if "learned_net" in f else "",
            }
            extra = json.loads(f["caffe8/extra"][()].decode()) if "caffe8/extra" in f else {}
    except (OSError, KeyError) as e:
        raise CaffeError(f"{path}: cannot read solver state: {e}") from None
    return state, extra


def save_solverstate_binary(path, state, learned_net, extra=None):
    """Write a binary SolverState (Caffe's ``SnapshotSolverStateToBinaryProto``)."""
    msg = caffe_pb2.SolverState(iter=int(state["iter"]), learned_net=str(learned_net),
                                current_step=int(state["current_step"]))
    for h in state["history"]:
        array_to_blob(backend.to_numpy(h), msg.history.add())
    if extra:
        msg.c8_extra = json.dumps(extra).encode()
    data = msg.SerializeToString()

    def write(tmp):
        with open(tmp, "wb") as f:
            f.write(data)
    atomic_write(path, write)


def load_solverstate_binary(path):
    """Read a binary SolverState; ``(state, extra)`` as ``load_solverstate`` returns them."""
    msg = read_message(path, caffe_pb2.SolverState(), "solver state",
                       "a binary solver state (SolverState)", CaffeError)
    if not msg.HasField("iter"):
        raise CaffeError(f"{path}: not a binary solver state (no iter field)")
    state = {"iter": msg.iter, "current_step": msg.current_step, "learned_net": msg.learned_net,
             "history": [blob_to_array(h, f"{path}: history {i}")
                         for i, h in enumerate(msg.history)]}
    extra = json.loads(msg.c8_extra.decode()) if msg.HasField("c8_extra") else {}
    return state, extra


# --- a run owns its prefix; a state names its model ------------------------------------------------
class PrefixLock:
    """``<prefix>.lock``, held (``fcntl.flock``) by the process that trains into ``prefix`` for
    as long as it trains, so that two live runs never write one prefix: the second is refused
    with one line naming the first (its process id is in the file). A lock of a dead process
    is free again (the kernel drops it with the process); ``taken_over`` then names that
    process (its file stays behind only when it ended without ``release``: killed), for the
    log to say so."""

    def __init__(self, prefix):
        self.path = f"{prefix}.lock"
        self._fd = None
        self.taken_over = None

    def acquire(self):
        import fcntl
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise CaffeError(f"snapshot_prefix {self.path[:-5]}: in use by a live run "
                                 f"(process {holder}, lock {self.path}); give this run another "
                                 "snapshot_prefix, or wait for that one to end") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:    # not a file its previous holder removed meanwhile
                break
            os.close(fd)
        left = os.pread(fd, 32, 0)
        if left:    # release() removes the file: its holder ended without it
            self.taken_over = left.decode(errors="replace").strip() or "unknown"
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self):
        """Remove the lock file and let it go (idempotent)."""
        if self._fd is None:
            return
        try:
            os.remove(self.path)
        except OSError:
            pass
        os.close(self._fd)     # closing drops the flock
        self._fd = None


def file_sha256(path):
    """Hex SHA-256 of the file at ``path``."""
    import hashlib
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def model_record(model):
    """What a solver state stores about its model (in caffe8's extra state, which Caffe skips):
    the file's name and checksum."""
    return {"file": os.path.basename(str(model)), "sha256": file_sha256(model)}


def check_pair(state_path, model_path, extra):
    """Refuse a model + solver state pair from two runs: the state's recorded model checksum
    (when it has one: Caffe's states have none) must be the model file's."""
    record = extra.get("model")
    if not record:
        return
    if not os.path.isfile(model_path):
        raise CaffeError(f"{state_path}: its model {model_path} does not exist (an incomplete "
                         "snapshot: resume from an earlier one)")
    if file_sha256(model_path) != record.get("sha256"):
        raise CaffeError(f"{state_path}: written with model {record.get('file')} of checksum "
                         f"sha256:{str(record.get('sha256'))[:16]}..., but {model_path} has "
                         "another: model and state come from different runs; resume from a "
                         "pair of one run")


def _mtime(path):
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def latest_pair(prefix):
    """``(pair, skipped)`` for ``-snapshot latest``: ``pair`` is ``(iteration, model, state)``,
    the complete snapshot of ``prefix`` written last, or None when there is none; ``skipped``
    the iterations of snapshot files written after it that belong to no complete pair.

    Newest by time, not by iteration: two runs on one prefix (a restart from scratch beside an
    older run's higher iterations) resume from the run that wrote last. A pair is complete when
    both files exist and the state is not older than its model (``write_snapshot`` writes the
    model, then the state): a model alone, or a model rewritten by another run after the
    state, is not a place to resume from. Ties of time go to the higher iteration."""
    pairs, loose = [], []
    for n in snapshot_iters(prefix):
        for fmt in (HDF5, BINARYPROTO):
            model, state = snapshot_names(prefix, n, fmt)
            m, s = _mtime(model), _mtime(state)
            if m is not None and s is not None and s >= m:
                pairs.append((s, n, model, state))
            else:
                loose.extend((t, n) for t in (m, s) if t is not None)
    if not pairs:
        return None, sorted({n for _, n in loose})
    written, n, model, state = max(pairs)
    return (n, model, state), sorted({i for t, i in loose if t > written})
