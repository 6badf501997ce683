"""Issue 23's bad-input and fault corpus: the cases that used to hang, lose a snapshot or end in
a traceback, each run as a new user would (caffe8's command line, one process and under
``mpiexec -n 2``; cases that need no process of their own share one start-up, see
faultutil.run_cases): one error line naming the file/flag/field, rc != 0, no traceback, no
process left, nothing lost. (Integer ranges, empty nets, the watchdog's lower bound and
unreadable HDF5 datasets are rows of tests/faults/test_fault_inputs.py.)"""
import os
import re
import shutil
import sys

import h5py
import numpy
import pytest

from caffe8.engine.snapshot import PrefixLock
from tests.faults.faultutil import Run, case_run, exit_loop, mpiexec, run, run_cases

HERE = os.path.dirname(os.path.abspath(__file__))
LIMIT = 60
mpi = pytest.mark.mpi


def _solver(folder, extra="", iters=4, **replace):
    """A small valid training under ``folder`` (4 HDF5 files of 4 rows), its solver text
    changed by ``replace`` (old -> new) and ``extra`` appended; returns the solver path."""
    solver = exit_loop.make_case(folder, files=4, rows=4, iters=iters)
    text = open(solver).read()
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    with open(solver, "w") as f:
        f.write(text + extra)
    return solver


def _one_error(r, *patterns):
    assert r.rc not in (0, None) and not r.leftover, r
    assert "Traceback" not in r.out, r
    (line,) = r.error_lines()
    for p in patterns:
        assert re.search(p, line), line
    return line


# --- the single-process cases and the mpiexec ones, each set under one start-up -----------------
# faultutil.run_cases runs the command lines one after another through caffe8's main in one
# process (or one ``mpiexec -n 2`` launch): a first batch trains what later cases resume from.
def _cli_cases(tmp):
    """(id, argv, expected text of the one error line) of command-line misuse that every rank
    meets alike, before MPI is initialised."""
    case = os.path.dirname(_solver(tmp / "case"))
    solver = os.path.join(case, "solver.prototxt")
    (tmp / "random.caffemodel").write_bytes(os.urandom(4096))
    return [
        ("unknown-subcommand", ["trian", "--solver", solver], "invalid choice: 'trian'"),
        ("bad-sigint-effect", ["train", "-solver", solver, "-sigint_effect", "halt"], "halt"),
        ("train-without-solver", ["train"], "--solver"),
        ("inspect-missing", ["inspect", str(tmp / "missing.prototxt")], "missing.prototxt"),
        ("convert-random-bytes", ["convert", str(tmp / "random.caffemodel"),
                                  str(tmp / "out.h5")], "random.caffemodel"),
        ("convert-into-missing-folder", ["convert", str(tmp / "random.caffemodel"),
                                         str(tmp / "no" / "such" / "out.h5")],
         r"dst .*no/such/out\.h5: folder .* does not exist"),
        ("log-is-a-directory", ["train", "--solver", solver, "--log", case],
         r"--log .*: is a directory"),
        ("log-through-a-file", ["train", "--solver", solver, "--log", solver + "/x.log"],
         r"--log .*solver\.prototxt is a file"),
        ("log-dir-through-a-file", ["train", "--solver", solver, "-log_dir", solver + "/logs"],
         r"--log-dir .*solver\.prototxt is a file"),
        ("timing-log-is-a-directory", ["train", "--solver", solver, "--timing-log", case],
         r"--timing-log .*: is a directory"),
        ("solver-is-a-directory", ["train", "--solver", case], r"--solver .*: is a directory"),
        ("weights-trailing-comma", ["train", "--solver", solver, "-weights",
                                    f"{solver},{solver},"], "empty file name"),
    ]


def _net_dir_case(tmp):
    """``train`` with a solver whose ``net`` is a directory."""
    case = os.path.dirname(_solver(tmp / "case"))
    solver = tmp / "solver.prototxt"
    solver.write_text(open(os.path.join(case, "solver.prototxt")).read().replace(
        os.path.join(case, "net.prototxt"), case))
    return ["train", "--solver", solver]


def _live_case(tmp):
    """(argv of a training, its snapshot_prefix), the prefix free until :func:`_held` holds it."""
    return ["train", "--solver", _solver(tmp / "c", extra=f'snapshot_prefix: "{tmp}/snap/s"\n')
            ], f"{tmp}/snap/s"


def _held(prefix, cases, tmp, **kw):
    """``run_cases`` while this test process holds ``prefix`` (the live run)."""
    lock = PrefixLock(prefix).acquire()
    try:
        return run_cases(cases, tmp, **kw)
    finally:
        lock.release()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The first single-process batch, while the live run holds its prefix: the refused run,
    then the trainings later cases resume from (two runs snapshotting at iterations 2 and 4, in
    HDF5; an Adam run)."""
    tmp = tmp_path_factory.mktemp("corpus")
    live, prefix = _live_case(tmp / "live")
    pair = tmp / "pair"
    solver = _solver(pair / "c", iters=4, extra=f'snapshot_prefix: "{pair}/a/s"\n'
                     "snapshot_format: HDF5\n", **{"snapshot: 0": "snapshot: 2"})
    other = _solver(pair / "d", iters=4, extra=f'snapshot_prefix: "{pair}/b/s"\n'
                    "snapshot_format: HDF5\nbase_lr: 0.5\n", **{"snapshot: 0": "snapshot: 2",
                                                                "base_lr: 0.01\n": ""})
    adam = _solver(tmp / "adam" / "c", iters=2, extra=f'snapshot_prefix: "{tmp}/adam/s/a"\n'
                   'type: "Adam"\n', **{"snapshot_after_train: false":
                                        "snapshot_after_train: true"})
    (refused, *runs), = _held(prefix, [live] + [["train", "--solver", s]
                                                for s in (solver, other, adam)], tmp)
    for r in runs:
        assert r["rc"] == 0, case_run(r)
    return {"tmp": tmp, "live": live, "prefix": prefix, "refused": case_run(refused),
            "left_by_refused": os.listdir(os.path.dirname(prefix)), "pair": (solver, pair),
            "adam": adam}


@pytest.fixture(scope="module")
def one_process(trained):
    """Every other single-process case (by id), in one second batch; ``trained["cli"]``: the
    command-line misuse cases."""
    tmp = trained["tmp"]
    solver, pair = trained["pair"]
    a = pair / "a"
    shutil.copy(pair / "b" / "s_iter_4.caffemodel.h5", a / "s_iter_4.caffemodel.h5")
    # a model without its state (a kill between the two writes) beside a complete older pair
    shutil.copytree(a, pair / "lone")
    os.remove(pair / "lone" / "s_iter_4.solverstate.h5")
    lone = pair / "lone.prototxt"
    lone.write_text(open(solver).read().replace(f'"{a}/s"', f'"{pair}/lone/s"'))
    sgd = tmp / "adam" / "sgd.prototxt"
    sgd.write_text(open(trained["adam"]).read().replace('type: "Adam"', ""))
    trained["cli"] = _cli_cases(tmp / "cli")
    named = {name: argv for name, argv, _ in trained["cli"]}
    named.update({
        "released": trained["live"],
        "net-dir": _net_dir_case(tmp / "netdir"),
        "pair-of-two-runs": ["train", "--solver", solver, "--snapshot",
                             a / "s_iter_4.solverstate.h5"],
        "latest": ["train", "--solver", lone, "--snapshot", "latest"],
        "adam-into-sgd": ["train", "--solver", sgd, "--snapshot",
                          tmp / "adam" / "s" / "a_iter_2.solverstate"],
        "shared-params": ["time", "--model", _shared_net(tmp), "--iterations", "1"],
        "duplicate-names": ["train", "--solver", _duplicate_names_solver(tmp)],
    })
    (results,) = run_cases(list(named.values()), tmp, limit=2 * LIMIT)
    named = dict(zip(named, map(case_run, results)))
    named["left_by_released"] = os.listdir(os.path.dirname(trained["prefix"]))
    return named


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """The ``mpiexec -n 2`` cases, all in one launch: the command-line misuse (every rank meets
    it before MPI is initialised), then a net path of a directory and a run refused a live
    prefix (met after). Per id, both ranks' outcomes."""
    tmp = tmp_path_factory.mktemp("corpus2")
    cli = _cli_cases(tmp / "cli")
    live, prefix = _live_case(tmp / "live")
    named = {name: argv for name, argv, _ in cli}
    named.update({"net-dir": _net_dir_case(tmp / "netdir"), "refused": live})
    ranks = _held(prefix, list(named.values()), tmp, processes=2, initialises_mpi=True,
                  limit=2 * LIMIT)
    out = dict(zip(named, zip(*ranks)))
    return dict(out, cli=cli, left_by_refused=os.listdir(os.path.dirname(prefix)))


def _job_error(outcome, pattern):
    """The one error line of a case's ``outcome``: a Run of one process, or (rank 0, rank 1)
    of the mpiexec launch (there: rank 0's line, the job ended cleanly, rank 1 with the same
    status and no error line)."""
    if isinstance(outcome, Run):
        return _one_error(outcome, pattern)
    zero, one = outcome
    line = _one_error(case_run(zero), pattern)
    assert line.startswith("[rank 0] ") and "MPI_Abort" not in zero["out"], zero
    assert one["rc"] == zero["rc"] and not case_run(one).error_lines(), one
    assert "Traceback" not in one["out"], one
    return line


@pytest.fixture
def cases_of(request):
    """``cases_of(processes)``: the batch of that many processes (built on first use)."""
    return lambda processes: request.getfixturevalue(
        "one_process" if processes == 1 else "two_processes")


@pytest.mark.parametrize("processes", [1, pytest.param(2, marks=mpi)])
def test_net_path_of_a_directory_is_one_line(cases_of, processes):
    _job_error(cases_of(processes)["net-dir"], r"solver\.prototxt:1:\d+: solver field "
               "'net': net file .* (does not exist|is a directory)")


def test_cli_misuse_one_process(one_process, trained):
    for name, argv, text in trained["cli"]:
        _one_error(one_process[name], text, r"^caffe8: error: |^usage|error: ")


@mpi
def test_cli_misuse_under_mpiexec_prints_one_line_per_job(two_processes):
    """Per case: exactly one error line, from rank 0, every rank the same status, rank 1
    silent; MPI not yet initialised."""
    for name, _, text in two_processes["cli"]:
        zero, one = two_processes[name]
        assert not zero["mpi"] and not one["mpi"], (name, zero)
        assert zero["rc"] == one["rc"] != 0, (name, zero, one)
        assert one["out"] == "", (name, one)
        (line,) = [l for l in zero["out"].splitlines() if "error:" in l]
        assert re.search(text, line) and "Traceback" not in zero["out"], (name, zero)


def test_unreadable_file_is_one_line(tmp_path, monkeypatch):
    """Mode 000 (root reads anything, so the refusal is simulated where ``open`` is called)."""
    from caffe8 import cli
    net = tmp_path / "net.prototxt"
    net.write_text("name: 'x'\n")
    real_open = open

    def refusing_open(path, *a, **k):
        if str(path) == str(net):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *a, **k)
    monkeypatch.setattr("builtins.open", refusing_open)
    args = cli.build_parser().parse_args(["time", "--model", str(net)])
    with pytest.raises(cli.CaffeError, match=r"--model .*net\.prototxt: cannot be read: "
                                             "Permission denied"):
        cli.check_file_arguments(args)


# --- snapshots: a slow one is no stall; a prefix has one owner; a state names its model ---------
@mpi
def test_snapshot_taking_3x_stall_timeout_completes_with_a_pair(tmp_path):
    solver = _solver(tmp_path / "c", extra=f'snapshot_prefix: "{tmp_path}/snap/s"\n'
                     "comm { stall_timeout: 1 }\n", iters=3,
                     **{"snapshot_after_train: false": "snapshot_after_train: true"})
    # two interpreters start, train and write 3 s of snapshot: 33 s seen beside two busy
    # processes, so the launch's limit is the other mpiexec launches' (a loaded machine)
    r = run([mpiexec(), "-n", "2", sys.executable, os.path.join(HERE, "prog_slow_snapshot.py"),
             "1.5", "train", "--solver", solver], cwd=tmp_path, limit=2 * LIMIT)
    assert r.rc == 0 and not r.leftover and not r.error_lines(), r
    assert re.search(r"\[rank 1\] waiting in the snapshot's broadcast .* for rank 0, which is "
                     "writing a snapshot", r.out), r
    assert sorted(os.listdir(tmp_path / "snap")) == ["s_iter_3.caffemodel", "s_iter_3.solverstate"]


@pytest.mark.parametrize("processes", [1, pytest.param(2, marks=mpi)])
def test_second_run_on_a_live_prefix_is_refused(trained, cases_of, processes):
    batch = trained if processes == 1 else cases_of(2)
    _job_error(batch["refused"], r"snapshot_prefix .*/snap/s: in use by a live run "
                                 rf"\(process {os.getpid()}")
    assert batch["left_by_refused"] == []
    if processes == 1:                                 # released: the prefix is free again
        released = cases_of(1)
        assert released["released"].rc == 0, released["released"]
        assert "s.lock" not in released["left_by_released"]


def test_pair_of_two_runs_is_refused_and_latest_skips_a_lone_model(one_process, trained):
    _, pair = trained["pair"]
    _one_error(one_process["pair-of-two-runs"], r"s_iter_4\.solverstate\.h5: written with model "
                                                r"s_iter_4\.caffemodel\.h5 .* different runs")
    # a model without its state beside the pair of iteration 2: "latest" is iteration 2
    r = one_process["latest"]
    assert r.rc == 0 and not r.error_lines(), r
    assert re.search(r"Latest complete snapshot of .*lone/s: iteration 2 .*skipped the "
                     r"incomplete one\(s\) of iteration\(s\) 4", r.out), r
    assert "Resuming from " + str(pair / "lone" / "s_iter_2.solverstate.h5") in r.out, r


INPUT = """name: "n"
layer { name: "in" type: "Input" top: "data" top: "label"
  input_param { shape { dim: 4 dim: 6 } shape { dim: 4 } } }
"""
LOSS = 'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "b" bottom: "label" top: "loss" }\n'


def _ip(name, bottom, top, outputs, shared=""):
    param = f' param {{ name: "{shared}" }}' if shared else ""
    return (f'layer {{ name: "{name}" type: "InnerProduct" bottom: "{bottom}" top: "{top}"{param}'
            f" inner_product_param {{ num_output: {outputs} }} }}\n")


def _shared_net(tmp):
    net = tmp / "shared.prototxt"
    net.write_text(INPUT + _ip("ip1", "data", "a", 3, "w") + _ip("ip2", "a", "b", 4, "w") + LOSS)
    return net


def _duplicate_names_solver(tmp):
    net = tmp / "dup.prototxt"
    net.write_text(INPUT + _ip("ip", "data", "a", 3) + _ip("ip", "a", "b", 3) + LOSS)
    solver = tmp / "dup_solver.prototxt"
    solver.write_text(f'net: "{net}"\nbase_lr: 0.1\nlr_policy: "fixed"\nmax_iter: 2\n'
                      f'snapshot_format: HDF5\nsnapshot_prefix: "{tmp}/dup/s"\n')
    return solver


def test_shared_params_of_different_shapes_name_the_line(one_process):
    _one_error(one_process["shared-params"], r"layer 'ip2' at .*shared\.prototxt:5:\d+: cannot "
                                             r"share param 'w' owned by layer 'ip1'.*shape mismatch")


def test_duplicate_layer_names_with_params_under_hdf5_name_both_lines(one_process):
    _one_error(one_process["duplicate-names"], r"layer 'ip' at .*dup\.prototxt:5:\d+: a second "
               r"layer of this name holds params \(the first is at .*dup\.prototxt:4:\d+\); "
               "snapshot_format: HDF5")


def test_adam_state_restored_into_sgd_names_the_file(one_process):
    _one_error(one_process["adam-into-sgd"], r"a_iter_2\.solverstate: written by the Adam "
                                             "solver; this run's solver is SGD")


# --- the stall verdict: once, naming the rank ---------------------------------------------------
@mpi
def test_stalled_rank_is_reported_once(tmp_path):
    solver = _solver(tmp_path / "c", iters=6, extra="comm { stall_timeout: 1 }\n")
    r = run([mpiexec(), "-n", "2", sys.executable, os.path.join(HERE, "prog_stall.py"),
             "train", "--solver", solver], cwd=tmp_path, limit=LIMIT)
    line = _one_error(r, r"^\[rank 0\] caffe8: error: rank 0 waited \d+ s \(comm.stall_timeout "
                         r"1 s\) in .* at iteration \d+; waiting for rank 1 does not answer")
    assert "exchange of the exchange" not in line and "no rank identified" not in line


# --- HDF5 list entries: Caffe's rule -------------------------------------------------------------
def test_hdf5_list_entries_resolve_against_the_working_directory(tmp_path, monkeypatch, capfd):
    from caffe8.layers.base_data import resolve_listed_path
    lists, cwd = tmp_path / "lists", tmp_path / "cwd"
    for folder in (lists, cwd):
        (folder / "h5").mkdir(parents=True)
        with h5py.File(folder / "h5" / "part.h5", "w") as f:
            f["data"] = numpy.zeros((1, 1), numpy.float32)
    (lists / "h5" / "only_beside.h5").write_bytes(b"")
    monkeypatch.chdir(cwd)
    listing = str(lists / "list.txt")
    # both exist: Caffe reads the working directory's, silently
    assert resolve_listed_path("h5/part.h5", listing) == "h5/part.h5"
    assert capfd.readouterr().err == ""
    # only beside the list: taken, with one warning naming both places
    assert resolve_listed_path("h5/only_beside.h5", listing) == str(lists / "h5" /
                                                                     "only_beside.h5")
    err = capfd.readouterr().err
    assert err.startswith("W") and "list.txt" in err and str(cwd) in err, err
    assert resolve_listed_path("h5/nowhere.h5", listing) == "h5/nowhere.h5"


# --- a net of many layers ------------------------------------------------------------------------
def test_net_of_many_layers_parses_and_builds_in_linear_time(tmp_path):
    """30,000 layers of studies.host.big_net's tower (14 MB), parsed, built and logged in one go.
    A guard against quadratic work, not a speed target (studies/host/big_net.py measures that):
    ~7 s here; before issue 23's fix a learnable parameter's linear search alone made this
    a minute, and the 100,000-layer case never finished."""
    import io
    import time
    from caffe8.engine.glog import GLog
    from caffe8.engine.net import Net
    from caffe8.wiring import register_all
    from studies.host.big_net import write_net
    register_all()
    n = 30000
    path = tmp_path / "big.prototxt"
    write_net(path, n)
    stream = io.StringIO()
    start = time.perf_counter()
    net = Net(str(path), phase="TRAIN", log=GLog(stream=stream))
    assert time.perf_counter() - start < 40
    assert len(net.layers) == n + 1 and net.layer_names[-1] == f"layer_{n - 1:06d}_scale"
    assert len(net.learnable_params) == n // 4 * 7   # conv 2, batch norm 3, scale 2
    assert stream.getvalue().count("Initializing net from parameters") == 1


@pytest.mark.parametrize("processes", [1, pytest.param(2, marks=mpi)])
def test_a_net_of_more_layers_than_caffe8_builds_is_refused_before_parsing(tmp_path, processes):
    """A net of ~700,000 layers ran past the corpus' 300 s limit before its first iteration
    (each process parsing 330 MB); one over the limit is refused in one line instead, at once.
    The limit is lowered here (CAFFE8_MAX_LAYERS) so that the net stays small; the line names
    the file, the count and the way to lift it."""
    from studies.host.big_net import write_net
    net = tmp_path / "big.prototxt"
    write_net(net, 1500)
    solver = tmp_path / "solver.prototxt"
    solver.write_text(f'net: "{net}"\nbase_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 1\n')
    cmd = [sys.executable, "-m", "caffe8.cli", "train", "-solver", str(solver)]
    if processes > 1:
        cmd = [mpiexec(), "-n", str(processes)] + cmd
    r = run(cmd, tmp_path, limit=LIMIT, env=dict(os.environ, CAFFE8_MAX_LAYERS="1000"))
    _one_error(r, rf"{re.escape(str(net))}: a net of 1,501 layers, "
               r"more than caffe8 builds \(1,000; .*CAFFE8_MAX_LAYERS=1501\)")
    assert "Initializing net from parameters" not in r.out
