"""``caffe8 train -snapshot latest`` as a requeued Slurm job runs it: a first start with nothing
to resume trains from scratch and says so; with two runs' snapshots on one prefix it resumes
from the pair written last (not the highest iteration); a lock left by a killed run is taken
over with a warning."""
import os
import re
import subprocess
import sys

from caffe8.cli import main
from tests.faults import exit_loop


def _solver(folder, prefix, max_iter, snapshot):
    solver = exit_loop.make_case(folder, files=2, rows=8, iters=max_iter)
    with open(solver, "a") as f:
        f.write(f'snapshot: {snapshot}\nsnapshot_after_train: true\nsnapshot_format: HDF5\n'
                f'snapshot_prefix: "{prefix}"\n')
    text = open(solver).read().replace("snapshot: 0\n", "").replace(
        "snapshot_after_train: false\n", "")
    with open(solver, "w") as f:
        f.write(text)
    return solver


def test_latest_on_an_empty_prefix_trains_from_scratch(tmp_path, capsys):
    prefix = str(tmp_path / "snap" / "s")
    solver = _solver(tmp_path / "a", prefix, max_iter=3, snapshot=0)
    assert main(["train", "-solver", solver, "-snapshot", "latest"]) == 0
    err = capsys.readouterr().err
    assert (f"--snapshot latest: snapshot prefix {prefix} holds no complete snapshot (model and "
            "solver state); training from scratch") in err, err
    assert "Resuming from" not in err
    assert os.path.exists(prefix + "_iter_3.solverstate.h5")
    # the requeue: the same command again resumes from what the first start wrote
    assert main(["train", "-solver", solver, "-snapshot", "latest"]) == 0
    err = capsys.readouterr().err
    assert f"Resuming from {prefix}_iter_3.solverstate.h5" in err, err


def test_latest_takes_the_newest_pair_of_two_runs(tmp_path, capsys):
    prefix = str(tmp_path / "snap" / "s")
    older = _solver(tmp_path / "older", prefix, max_iter=6, snapshot=3)
    assert main(["train", "-solver", older]) == 0          # pairs 3 and 6
    newer = _solver(tmp_path / "newer", prefix, max_iter=2, snapshot=2)
    assert main(["train", "-solver", newer]) == 0          # a restart from scratch: pair 2
    capsys.readouterr()
    resume = _solver(tmp_path / "resume", prefix, max_iter=4, snapshot=0)
    assert main(["train", "-solver", resume, "-snapshot", "latest"]) == 0
    err = capsys.readouterr().err
    assert re.search(rf"Latest complete snapshot of {re.escape(prefix)}: iteration 2 ", err), err
    assert f"Resuming from {prefix}_iter_2.solverstate.h5" in err
    assert f"Snapshotting to HDF5 file {prefix}_iter_4.caffemodel.h5" in err


def test_a_stale_lock_is_taken_over_with_a_warning(tmp_path, capsys):
    prefix = str(tmp_path / "snap" / "s")
    solver = _solver(tmp_path / "a", prefix, max_iter=1, snapshot=0)
    os.makedirs(os.path.dirname(prefix))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(prefix + ".lock", "w") as f:
        f.write(f"{dead}\n")
    assert main(["train", "-solver", solver]) == 0
    err = capsys.readouterr().err
    assert re.search(rf"^W.*snapshot_prefix {re.escape(prefix)}: took over the lock "
                     rf"{re.escape(prefix)}\.lock of process {dead}, which ended without "
                     r"releasing it", err, re.M), err
    assert not os.path.exists(prefix + ".lock")


def _on_a_terminal(argv, env, timeout=120):
    """What ``argv`` writes to a pseudo-terminal (its stdout and stderr), as in a shell or in
    IPython's ``!command``, which runs commands in a pty."""
    import fcntl
    import pty
    import select
    import struct
    import termios
    import time
    master, slave = pty.openpty()
    # 24 x 80, as pexpect opens IPython's (a new pty has 0 columns, where tqdm draws nothing)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = subprocess.Popen(argv, stdout=slave, stderr=slave, stdin=subprocess.DEVNULL, env=env)
    os.close(slave)
    out, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 1)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:           # EIO: the child closed its side
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
    finally:
        os.close(master)
        proc.kill() if proc.poll() is None else None
        proc.wait(timeout=30)
    assert proc.returncode == 0, out.decode(errors="replace")[-3000:]
    return out.decode(errors="replace")


def test_the_bar_is_drawn_for_a_person_and_not_into_a_notebook_cell(tmp_path):
    solver = _solver(tmp_path / "a", str(tmp_path / "snap" / "s"), max_iter=20, snapshot=0)
    env = {k: v for k, v in os.environ.items() if k != "JPY_PARENT_PID"}
    argv = [sys.executable, "-m", "caffe8", "train", "-solver", solver]
    shell = _on_a_terminal(argv, env)
    assert re.search(r"\d+/20 \[", shell), shell[-2000:]       # tqdm's "n/total [" on a terminal
    # a Jupyter kernel's child (jupyter_client's launcher sets JPY_PARENT_PID for the kernel)
    cell = _on_a_terminal(argv, dict(env, JPY_PARENT_PID=str(os.getpid())))
    assert "Optimization Done." in cell and not re.search(r"\d+/20 \[", cell), cell[-2000:]


def test_a_shipped_solver_run_from_another_folder_names_the_working_directory(tmp_path, capsys,
                                                                              monkeypatch):
    """The shipped solvers' paths are the repository's (as Caffe's are its root's): from
    elsewhere the one error line says where the path was looked up, both places."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    solver = os.path.join(repo, "prototxt", "digits", "solver.prototxt")
    monkeypatch.chdir(tmp_path)
    assert main(["train", "-solver", solver]) == 1
    lines = [l for l in capsys.readouterr().err.splitlines() if "error" in l]
    assert lines == [f"caffe8: error: {solver}:4:1: solver field 'net': net file "
                     "'prototxt/digits/train_val.prototxt' does not exist (relative to the "
                     f"working directory {tmp_path}), nor in the solver's folder "
                     f"{os.path.dirname(solver)}"], lines


def test_newer_snapshots_of_another_run_are_warned_of_but_not_this_processs_own(tmp_path,
                                                                                capsys):
    """A prefix holding another run's newer snapshots gets a warning (this run would overwrite
    or mix with them); a process that solves again into its own prefix (a notebook's %%timeit
    around solver.solve(): BVLC's brewing-logreg) meets its own earlier snapshots, no warning."""
    prefix = str(tmp_path / "snap" / "s")
    solver = _solver(tmp_path / "a", prefix, max_iter=3, snapshot=0)
    os.makedirs(os.path.dirname(prefix))
    with open(prefix + "_iter_9.caffemodel.h5", "wb") as f:     # another run's, by hand
        f.write(b"x")
    assert main(["train", "-solver", solver]) == 0
    warned = re.findall(r"^W.*already holds snapshots of iteration\(s\) (.*), newer than",
                        capsys.readouterr().err, re.M)
    assert warned == ["9"], warned
    os.remove(prefix + "_iter_9.caffemodel.h5")
    assert main(["train", "-solver", solver]) == 0       # meets its own iteration-3 pair
    assert main(["train", "-solver", solver]) == 0
    assert "already holds snapshots" not in capsys.readouterr().err
