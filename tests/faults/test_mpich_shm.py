"""The suite's cleanup of MPICH shared-memory files left by its aborted jobs: a new file that
no process uses is removed; one that existed before the session, or one a live process still
maps, stays."""
import os
import subprocess
import sys
import textwrap

from tests.faults import mpich_shm


def test_new_unused_files_go_and_the_others_stay(tmp_path):
    old = tmp_path / "mpich_shm_before_0"
    old.write_bytes(b"x" * 4096)
    before = mpich_shm.mpich_files(str(tmp_path))
    left = tmp_path / "mpich_shm_aborted_0"
    left.write_bytes(b"x" * 4096)
    live = tmp_path / "mpich_shm_live_0"
    live.write_bytes(b"x" * 4096)
    other = tmp_path / "not_mpich"
    other.write_bytes(b"x")
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import mmap, sys, time
        f = open({str(live)!r}, "r+b")
        m = mmap.mmap(f.fileno(), 4096)
        f.close()                          # mapped, no longer open: as MPICH's ranks hold it
        print("mapped", flush=True)
        time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "mapped"
        assert mpich_shm.in_use([str(live), str(left)]) == {str(live)}
        assert mpich_shm.remove_left(before, str(tmp_path)) == [str(left)]
    finally:
        holder.kill()
        holder.wait()
    assert old.exists() and live.exists() and other.exists() and not left.exists()
    assert mpich_shm.remove_left(before, str(tmp_path)) == [str(live)]  # its user has gone


def test_a_session_removes_what_its_aborted_jobs_left(tmp_path):
    """The root conftest lists the files at the session's start and removes, at its end, the
    new ones nobody uses: a session whose test leaves one (as an aborted job does) ends
    without it, and a file from before the session stays."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    tag = f"mpich_shm_caffe8test_{os.getpid()}"
    before = os.path.join(mpich_shm.SHM, f"{tag}_before")
    left = os.path.join(mpich_shm.SHM, f"{tag}_left")
    (tmp_path / "test_leaves.py").write_text(
        f"def test_leaves():\n    open({left!r}, 'wb').write(b'x' * 4096)\n")
    open(before, "wb").close()
    try:
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest",
                              "--rootdir", str(tmp_path), "-p", "no:cacheprovider",
                              str(tmp_path / "test_leaves.py")],
                             cwd=root, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        assert not os.path.exists(left) and os.path.exists(before)
    finally:
        for path in (before, left):
            if os.path.exists(path):
                os.unlink(path)
