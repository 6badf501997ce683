"""engine.snapshot: which pair ``-snapshot latest`` resumes from, and the prefix lock of a run
that was killed."""
import os
import signal
import subprocess
import sys

from caffe8.engine.snapshot import BINARYPROTO, HDF5, PrefixLock, latest_pair, snapshot_names


def _write(path, when):
    """A snapshot file written at ``when`` (seconds, set as the file's modification time)."""
    with open(path, "wb") as f:
        f.write(b"x")
    os.utime(path, ns=(when * 10**9, when * 10**9))


def _pair(prefix, n, model_at, state_at, fmt=HDF5):
    model, state = snapshot_names(prefix, n, fmt)
    if model_at is not None:
        _write(model, model_at)
    if state_at is not None:
        _write(state, state_at)
    return n, model, state


def test_latest_is_the_pair_written_last_not_the_highest_iteration(tmp_path):
    """Two runs on one prefix: an older run's 100 and 197, then a restart from scratch that got
    to 78 (the issue's case): 78 is where a requeued job resumes."""
    prefix = str(tmp_path / "s")
    _pair(prefix, 100, 1000, 1001)
    _pair(prefix, 197, 2000, 2001)
    newest = _pair(prefix, 78, 3000, 3001, fmt=BINARYPROTO)
    assert latest_pair(prefix) == (newest, [])


def test_latest_skips_models_without_their_state(tmp_path):
    prefix = str(tmp_path / "s")
    complete = _pair(prefix, 2, 100, 101)
    _pair(prefix, 4, 200, None)            # killed between the model and its state
    _pair(prefix, 6, 400, 300)             # another run rewrote the model after this state
    assert latest_pair(prefix) == (complete, [4, 6])
    # an incomplete one older than the pair is no news
    _pair(prefix, 8, 500, 501)
    assert latest_pair(prefix) == ((8,) + snapshot_names(prefix, 8, HDF5), [])


def test_latest_of_an_empty_or_missing_prefix(tmp_path):
    assert latest_pair(str(tmp_path / "nothing" / "s")) == (None, [])
    prefix = str(tmp_path / "s")
    _pair(prefix, 3, 100, None)
    assert latest_pair(prefix) == (None, [3])


def test_a_tie_in_time_goes_to_the_higher_iteration(tmp_path):
    prefix = str(tmp_path / "s")
    _pair(prefix, 5, 100, 100)
    high = _pair(prefix, 10, 100, 100)
    assert latest_pair(prefix) == (high, [])


def test_the_lock_of_a_killed_run_is_taken_over_and_named(tmp_path):
    prefix = str(tmp_path / "snap" / "s")
    code = ("import sys, time\nfrom caffe8.engine.snapshot import PrefixLock\n"
            f"PrefixLock({prefix!r}).acquire()\nprint('held', flush=True)\ntime.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
    finally:
        if holder.poll() is None:
            holder.kill()
    assert os.path.exists(prefix + ".lock")          # kill -9: nobody released it
    lock = PrefixLock(prefix).acquire()
    try:
        assert lock.taken_over == str(holder.pid)
    finally:
        lock.release()
    assert not os.path.exists(prefix + ".lock")
    # a lock released as it should be leaves nothing to take over
    again = PrefixLock(prefix).acquire()
    assert again.taken_over is None
    again.release()
