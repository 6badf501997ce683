"""The studies' library: the run helpers every study uses, and scripts/ with them.

* prototxt rewriting: a copy of the solver and its train net with the batch size, the ``comm``
  block and the iteration count changed, written into the output folder;
* running ``mpiexec -n P python -m caffe8.cli train`` with a timeout (the whole process group is
  killed when it runs over, so a hung job never blocks the sweep);
* reading timing logs (docs/timing_schema.json) and reducing them to iteration times;
* CSV rows and matplotlib figures written the same way everywhere.

The scaling sweep built on them is studies/scaling/_sweep.py.

Per-rank logs: ``caffe8 train --timing-log F`` lets every rank append its own records to F. The
runs give each rank its own file instead, with mpiexec's MPMD form,
``mpiexec -n 1 CMD --timing-log r0.jsonl : -n 1 CMD --timing-log r1.jsonl : ...``, which is one
MPI job of P ranks (MPI_COMM_WORLD spans all colons), so a rank's records read back in order.
"""
import csv
import os
import signal
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from caffe8.cluster import default_mpiexec as _default_mpiexec    # noqa: F401 (the studies' name)
from caffe8.engine.errors import CaffeError
from caffe8.engine.prototxt import parse_file, to_text
from caffe8.engine.timing import read_log as read_timing_log    # noqa: F401 (the studies' name)


# --- argument helpers ------------------------------------------------------------------------
def int_list(text):
    """"1,2,4" → [1, 2, 4] (each ≥ 1)."""
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) < 1:
        raise ValueError(f"expected a comma-separated list of integers >= 1, got {text!r}")
    return values


# --- prototxt rewriting ----------------------------------------------------------------------
def _net_field(solver):
    for field in ("train_net", "net", "train_net_param", "net_param"):
        if solver.has(field):
            return field
    raise CaffeError(f"{solver.location()}: solver names no train net (net / train_net / *_param)")


def load_train_net(solver_path):
    """(solver Message, train NetParameter Message) of a solver prototxt."""
    from caffe8.engine.trainer import resolve_path
    solver = parse_file(solver_path, "SolverParameter")
    field = _net_field(solver)
    if field.endswith("_param"):
        return solver, getattr(solver, field).copy()
    return solver, parse_file(resolve_path(getattr(solver, field), solver_path), "NetParameter")


def _batch_slots(net):
    """[(getter, setter, where)] for every batch dimension of the net's data/input layers.

    Covers ``*_param.batch_size`` of data layers, the first dim of Input / DummyData shapes
    and DummyData's legacy ``num``.
    """
    slots = []
    for layer in net.layer:
        for field in layer.fields():
            sub = getattr(layer, field)
            if field.endswith("_param") and hasattr(sub, "fields") and "batch_size" in sub.fields():
                slots.append((lambda s=sub: s.batch_size,
                              lambda v, s=sub: setattr(s, "batch_size", v),
                              f"layer '{layer.name}' {field}.batch_size"))
        if layer.type in ("Input", "DummyData"):
            sub = layer.input_param if layer.type == "Input" else layer.dummy_data_param
            for shape in sub.shape:
                slots.append((lambda s=shape: s.dim[0],
                              lambda v, s=shape: setattr(s, "dim", [v] + list(s.dim[1:])),
                              f"layer '{layer.name}' shape"))
            if layer.type == "DummyData":
                for k in range(len(sub.num)):
                    slots.append((lambda s=sub, k=k: s.num[k],
                                  lambda v, s=sub, k=k: setattr(
                                      s, "num", s.num[:k] + [v] + s.num[k + 1:]),
                                  f"layer '{layer.name}' dummy_data_param.num"))
    return slots


def net_batch_size(net):
    """Per-process batch of the TRAIN net: the first batch dimension found (samples)."""
    slots = _batch_slots(net)
    if not slots:
        raise CaffeError(f"net '{net.name}': no data layer with a batch_size / Input shape found")
    return int(slots[0][0]())


def with_batch_size(net, batch):
    """Copy of ``net`` with every batch dimension of its data/input layers set to ``batch``."""
    net = net.copy()
    for _, setter, _ in _batch_slots(net):
        setter(int(batch))
    return net


def comm_settings(text):
    """"algorithm=flat,quantile_interval=10" → a parsed CommParameter holding those fields.

    Values go through the prototxt parser, so they get the schema's types; a bare word for a
    string field is quoted.
    """
    from caffe8.engine.errors import PrototxtError
    from caffe8.engine.prototxt import parse_text
    lines = []
    for item in (t.strip() for t in (text or "").split(",") if t.strip()):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--comm-set expects FIELD=VALUE, got {item!r}")
        lines.append((key.strip(), value.strip()))
    msg = parse_text("", "--comm-set", "CommParameter")
    for key, value in lines:
        for candidate in (value, '"%s"' % value):
            try:
                one = parse_text(f"{key}: {candidate}", "--comm-set", "CommParameter")
                break
            except PrototxtError as e:
                error = e
        else:
            raise CaffeError(f"--comm-set {key}={value}: {error}")
        setattr(msg, key, getattr(one, key))
    return msg


def comm_block(solver, codec, asynchronous, processes_per_node, extra=None):
    """The solver's ``comm`` block (kept settings) with codec/async/processes_per_node set and
    the fields of ``extra`` (a CommParameter from :func:`comm_settings`) on top."""
    from caffe8.engine.prototxt import Message
    comm = solver.comm.copy() if solver.has("comm") else Message("CommParameter", solver.location())
    comm.codec = codec
    setattr(comm, "async", bool(asynchronous))
    comm.processes_per_node = int(processes_per_node)
    for field in (extra.fields() if extra is not None else []):
        setattr(comm, field, getattr(extra, field))
    return comm


def write_run_prototxts(solver_path, run_dir, batch, codec, asynchronous, processes_per_node,
                        max_iter, emulate=None, comm_extra=None, transform=None):
    """Write ``run_dir``/net.prototxt and solver.prototxt for one run; return the solver path.

    The copy trains only (no test nets, no snapshots, one display line at the end) so the
    timing is the training loop alone. ``transform``: a function of the train NetParameter
    applied first (e.g. data layers swapped for inputs).
    """
    from caffe8.layers.emulate import emulate_layer_times
    solver, net = load_train_net(solver_path)
    if transform is not None:
        net = transform(net)
    net = with_batch_size(net, batch)
    if emulate:
        net = emulate_layer_times(net, emulate)
    os.makedirs(run_dir, exist_ok=True)
    net_path = os.path.join(os.path.abspath(run_dir), "net.prototxt")
    with open(net_path, "w", encoding="utf-8") as f:
        f.write(to_text(net))
    for field in ("train_net", "net", "train_net_param", "net_param", "test_net",
                  "test_net_param", "test_iter", "test_state"):
        solver.clear(field)
    solver.net = net_path
    solver.test_interval = 0
    solver.test_initialization = False
    solver.snapshot = 0
    solver.snapshot_after_train = False
    solver.max_iter = int(max_iter)
    solver.display = int(max_iter)
    solver.comm = comm_block(solver, codec, asynchronous, processes_per_node, comm_extra)
    solver_out = os.path.join(os.path.abspath(run_dir), "solver.prototxt")
    with open(solver_out, "w", encoding="utf-8") as f:
        f.write(to_text(solver))
    return solver_out


# --- running ---------------------------------------------------------------------------------
def train_command(p, solver, log_paths, python=sys.executable, mpiexec="mpiexec"):
    """argv of one P-rank training job, one timing log per rank (MPMD form, see the docstring)."""
    cmd = [mpiexec]
    for rank in range(p):
        if rank:
            cmd.append(":")
        cmd += ["-n", "1", python, "-m", "caffe8.cli", "train", "--solver", solver,
                "--timing-log", log_paths[rank]]
    return cmd


def run_job(cmd, timeout, log_file):
    """Run ``cmd`` with stdout+stderr to ``log_file``; kill its process group after ``timeout`` s.

    Raises CaffeError naming the command and showing the log's tail on failure or timeout.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with open(log_file, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            # mpiexec and its ranks share the new session's process group.
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
    if rc != 0:
        with open(log_file, encoding="utf-8", errors="replace") as f:
            tail = "".join(f.readlines()[-15:])
        what = f"timed out after {timeout} s" if rc is None else f"exited with status {rc}"
        raise CaffeError(f"{' '.join(cmd)}\n{what}; last lines of {log_file}:\n{tail}")


def iteration_walls(records, skip):
    """{iteration: slowest rank's wall seconds} for iterations ≥ ``skip`` (warm-up dropped).

    The ranks meet in the gradient sum every iteration, so the job advances at the pace of the
    slowest rank.
    """
    walls = {}
    for r in records:
        if r["iteration"] >= skip:
            walls[r["iteration"]] = max(walls.get(r["iteration"], 0.0), r["wall"])
    return walls


def write_rows(rows, fields, path, digits=6):
    """``rows`` (dicts) as CSV with columns ``fields``, floats to ``digits`` significant
    digits."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(fields))
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{r[k]:.{digits}g}" if isinstance(r.get(k), float) else r.get(k, ""))
                        for k in fields})


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend: the studies write image files, never a window."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path, dpi=110):
    """Lay ``fig`` out, write it to ``path``, close it."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)


def label_axes(ax, xlabel=None, ylabel=None, title=None, title_size=None, legend_size=None):
    """The studies' plot tail: axis labels and title where given, a light grid, the legend."""
    if xlabel is not None:
        ax.set_xlabel(xlabel)
    if ylabel is not None:
        ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title, **({"fontsize": title_size} if title_size else {}))
    ax.grid(alpha=0.3)
    ax.legend(**({"fontsize": legend_size} if legend_size else {}))


