"""Caffe's key-value databases (util/db.cpp): LMDB through py-lmdb and LevelDB through plyvel.

One interface for both backends, as Caffe's ``db::DB`` / ``db::Cursor`` / ``db::Transaction``:

* ``open_db(path, backend)`` — a shared read-only ``Database`` (``count``, ``cursor()``); give it
  back with ``db.release()``. A ``Cursor`` walks the records in key order: ``first()``,
  ``next()`` (False at the end), ``key()``, ``value()``, ``seek(key)`` (True when that key is
  held), ``close()``.
* ``DBWriter(path, backend)`` — a new database, committed every 1000 records as Caffe's tools
  do. It is written under a temporary name beside ``path`` and renamed into place only when
  complete; an existing ``path`` is refused (Caffe opens it with ``db::NEW``: LMDB's mkdir fails,
  LevelDB's ``error_if_exists``), and a failure leaves nothing behind.

LevelDB is opened with Caffe's options (db_leveldb.cpp): block_size 64 KiB, write buffer 256 MiB,
at most 100 open files. A LevelDB directory can be open in one process at a time (its LOCK
file); when another process (an MPI rank on the same node) holds it, this process reads a
private clone instead: hard links to LevelDB's immutable table files in a temporary folder.
"""
import os
import shutil
import tempfile
import threading

from caffe8.engine.errors import DataError, relative_to_cwd

#: backend names as the tools spell them (``-backend``); data_param.backend is upper case
BACKENDS = ("lmdb", "leveldb")
LABELS = {"lmdb": "LMDB", "leveldb": "LevelDB"}
#: Caffe's LevelDB options (db_leveldb.cpp)
LEVELDB_OPTIONS = {"block_size": 65536, "write_buffer_size": 268435456, "max_open_files": 100}
COMMIT_EVERY = 1000


def backend_name(name, where="backend"):
    """``"lmdb"`` or ``"leveldb"`` for any spelling of Caffe's backend names; else a DataError."""
    key = str(name).lower()
    if key not in BACKENDS:
        raise DataError(f"{where}: unknown backend '{name}'; use lmdb or leveldb")
    return key


def _plyvel():
    try:
        import plyvel
    except ImportError:
        raise DataError("LevelDB needs the plyvel package (a caffe8 requirement): "
                        "pip install plyvel") from None
    return plyvel


# --- cursors --------------------------------------------------------------------------------------
class _LmdbCursor:
    def __init__(self, env):
        self.txn = env.begin(buffers=False)
        self.cur = self.txn.cursor()

    def first(self):
        return self.cur.first()

    def next(self):
        return self.cur.next()

    def key(self):
        return self.cur.key()

    def value(self):
        return self.cur.value()

    def seek(self, key):
        return self.cur.set_key(key)

    def close(self):
        self.txn.abort()


class _LevelDBCursor:
    def __init__(self, db):
        self.it = db.raw_iterator()

    def first(self):
        self.it.seek_to_first()
        return self.it.valid()

    def next(self):
        if not self.it.valid():
            return False
        self.it.next()
        return self.it.valid()

    def key(self):
        return self.it.key()

    def value(self):
        return self.it.value()

    def seek(self, key):
        self.it.seek(key)
        return self.it.valid() and self.it.key() == key

    def close(self):
        self.it.close()


# --- read-only databases, shared within a process -----------------------------------------------
# py-lmdb allows one Environment per database per process and LevelDB one open handle: layers
# share it (a TRAIN and a TEST net reading the same database); the last to release it closes it.
_OPEN = {}
_OPEN_LOCK = threading.Lock()


class Database:
    """A read-only database: ``count`` records, ``cursor()`` over them in key order."""

    def __init__(self, path, backend):
        self.path, self.backend, self.label = path, backend, LABELS[backend]
        self.clone = None  # the private LevelDB clone's folder, when one was needed
        if backend == "lmdb":
            self.handle = self._open_lmdb(path)
            self.count = self.handle.stat()["entries"]
        else:
            self.handle = self._open_leveldb(path)
            self.count = sum(1 for _ in self.handle.iterator(include_value=False))

    def _open_lmdb(self, path):
        import lmdb
        try:
            # lock=False: readers never write the lock file, so read-only media and many ranks work
            return lmdb.open(path, readonly=True, lock=False, readahead=False,
                             subdir=os.path.isdir(path), max_readers=512)
        except lmdb.Error as e:
            raise DataError(f"LMDB '{path}' cannot be opened: {e}") from None

    def _open_leveldb(self, path):
        plyvel = _plyvel()
        try:
            return plyvel.DB(path, create_if_missing=False, **LEVELDB_OPTIONS)
        except Exception as e:  # plyvel's IOError, Corruption, InvalidArgument ...
            if "lock" not in str(e).lower():
                raise DataError(f"LevelDB '{path}' cannot be opened: {e}") from None
        self.clone = _clone_leveldb(path)  # another process holds the LOCK
        try:
            return plyvel.DB(self.clone, create_if_missing=False, **LEVELDB_OPTIONS)
        except Exception as e:
            shutil.rmtree(self.clone, ignore_errors=True)
            raise DataError(f"LevelDB '{path}' cannot be opened: {e}") from None

    def cursor(self):
        return (_LmdbCursor if self.backend == "lmdb" else _LevelDBCursor)(self.handle)

    def release(self):
        release_db(self)

    def _close(self):
        self.handle.close()
        if self.clone:
            shutil.rmtree(self.clone, ignore_errors=True)


def _clone_leveldb(path):
    """A private copy of LevelDB ``path`` (hard links to its table files where possible)."""
    clone = tempfile.mkdtemp(prefix="caffe8-leveldb-")
    for name in os.listdir(path):
        src, dst = os.path.join(path, name), os.path.join(clone, name)
        if name == "LOCK" or not os.path.isfile(src):
            continue
        if name.endswith((".ldb", ".sst")):  # immutable once written
            try:
                os.link(src, dst)
                continue
            except OSError:
                pass
        shutil.copyfile(src, dst)
    return clone


def open_db(path, backend):
    """The shared read-only database at ``path``; ``backend`` is lmdb or leveldb (any case)."""
    backend = backend_name(backend, f"database '{path}'")
    if not os.path.exists(path):
        raise DataError(f"{LABELS[backend]} '{path}' does not exist{relative_to_cwd(path)}")
    key = (backend, os.path.realpath(path))
    with _OPEN_LOCK:
        if key in _OPEN:
            db, users = _OPEN[key]
            _OPEN[key] = (db, users + 1)
            return db
        db = Database(path, backend)
        _OPEN[key] = (db, 1)
        return db


def release_db(db):
    key = (db.backend, os.path.realpath(db.path))
    with _OPEN_LOCK:
        _, users = _OPEN[key]
        if users > 1:
            _OPEN[key] = (db, users - 1)
        else:
            del _OPEN[key]
            db._close()


# --- writing ------------------------------------------------------------------------------------
class DBWriter:
    """A new database at ``path``, written beside it and renamed into place by ``close()``.

    ``put(key, value)`` commits every ``COMMIT_EVERY`` records; ``abort()`` (or leaving a
    ``with`` block by an exception) removes the partial database. ``map_size`` is LMDB's."""

    def __init__(self, path, backend, map_size=1 << 40):
        self.backend = backend_name(backend, f"database '{path}'")
        self.path = os.fspath(path)
        if os.path.lexists(self.path):
            raise DataError(f"{LABELS[self.backend]} '{self.path}' already exists (Caffe's tools "
                            "never overwrite a database); remove it or choose another name")
        parent = os.path.dirname(os.path.abspath(self.path))
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as e:
            raise DataError(f"cannot create '{self.path}': {e.strerror}") from None
        self.tmp = os.path.join(parent, f".{os.path.basename(self.path)}.partial-{os.getpid()}")
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.count = 0
        if self.backend == "lmdb":
            import lmdb
            self.db = lmdb.open(self.tmp, map_size=map_size, subdir=True)
            self.txn = self.db.begin(write=True)
        else:
            self.db = _plyvel().DB(self.tmp, create_if_missing=True, error_if_exists=True,
                                   **LEVELDB_OPTIONS)
            self.txn = self.db.write_batch()

    def put(self, key, value):
        self.txn.put(key, value)
        self.count += 1
        if self.count % COMMIT_EVERY == 0:
            self._commit(reopen=True)

    def _commit(self, reopen):
        if self.backend == "lmdb":
            self.txn.commit()
            self.txn = self.db.begin(write=True) if reopen else None
        else:
            self.txn.write()
            self.txn = self.db.write_batch() if reopen else None

    def close(self):
        """Commit the last records and move the database to its name."""
        try:
            self._commit(reopen=False)
            self.db.close()
            if os.path.lexists(self.path):
                raise DataError(f"'{self.path}' appeared while it was being written; the new "
                                "database is not moved over it")
            os.rename(self.tmp, self.path)
        except BaseException:
            self.abort()
            raise

    def abort(self):
        """Drop the partial database."""
        if self.txn is not None and self.backend == "lmdb":
            self.txn.abort()
        self.txn = None
        self.db.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is None:
            self.close()
        else:
            self.abort()
        return False
