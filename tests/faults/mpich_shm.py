"""MPICH's shared-memory files (``/dev/shm/mpich_shm_*``) that jobs of the test suite leave
behind when they end in MPI_Abort or kill -9 (MPICH removes them only in MPI_Finalize).

The root conftest lists them when the session starts and, when it ends, removes those that
appeared during the session and that no live process maps or holds open (a job of another
session still running keeps its own)."""
import os

SHM = "/dev/shm"
PREFIX = "mpich_shm_"


def mpich_files(folder=SHM):
    """The MPICH shared-memory files in ``folder`` now."""
    try:
        names = os.listdir(folder)
    except OSError:
        return set()
    return {os.path.join(folder, n) for n in names if n.startswith(PREFIX)}


def in_use(paths):
    """Those of ``paths`` that a live process maps or has open (read from /proc)."""
    paths, used = set(paths), set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
                maps = f.read()
            fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:  # the process ended meanwhile, or is not ours to read
            continue
        used.update(p for p in paths - used if p in maps or p in fds)
    return used


def remove_left(before, folder=SHM):
    """Remove the MPICH files of ``folder`` that are not in ``before`` and not in use;
    returns the paths removed."""
    new = mpich_files(folder) - set(before)
    gone = sorted(new - in_use(new))
    for path in gone:
        try:
            os.unlink(path)
        except OSError:
            pass
    return gone
