"""What Caffe's tools share: glog lines on stderr, progress bars, argument checks, writing a
database of records (``engine.db.DBWriter``: a temporary name, renamed when complete)."""
import os

from caffe8.engine.errors import DataError


def logger():
    """Caffe's tools log through glog to stderr (``FLAGS_alsologtostderr``)."""
    from caffe8.engine.glog import GLog
    return GLog()


def watched_terminal(stream):
    """Whether a person watches ``stream``: a terminal, and not one of a Jupyter kernel's
    children. IPython runs a notebook's ``!command`` in a pseudo-terminal, so ``isatty`` is
    true there, yet the output goes into the cell, where every redraw of a bar stays (hundreds
    of lines, megabytes of notebook); jupyter_client sets ``JPY_PARENT_PID`` in a kernel's
    environment (its launcher, for the kernel to watch its parent), which the kernel's children
    inherit, while a terminal of Jupyter's own (started by the server, not by a kernel) has
    none."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):   # no stream, or a closed one
        return False
    return tty and "JPY_PARENT_PID" not in os.environ


def progress(iterable, total=None, desc=None):
    """A tqdm progress bar on stderr where a person watches it (``watched_terminal``);
    nothing elsewhere (logs, tests, notebook cells)."""
    import sys
    from tqdm import tqdm
    return tqdm(iterable, total=total, desc=desc, unit=" records",
                disable=not watched_terminal(sys.stderr), leave=False, dynamic_ncols=True)


def require_file(path, what):
    """DataError naming ``what`` when ``path`` is not a readable file."""
    if not os.path.isfile(path):
        raise DataError(f"{what} '{path}' does not exist or is not a file")
    return path


def add_backend(parser, help_text):
    parser.add_argument("--backend", default="lmdb", help=f"{help_text} (lmdb or leveldb; "
                        "default lmdb)")


def write_records(path, backend, records, total=None, desc=None, log=None, every=None):
    """Write (key, value) ``records`` into a new database; returns the count. ``every``: log
    "Processed N files." after each commit, as convert_imageset does."""
    from caffe8.engine.db import COMMIT_EVERY, DBWriter
    with DBWriter(path, backend) as db:
        for key, value in progress(records, total, desc):
            db.put(key, value)
            if every and log and db.count % COMMIT_EVERY == 0:
                log(f"Processed {db.count} files.")
    return db.count
