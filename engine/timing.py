"""Per-layer timing log: one JSON record per iteration per rank (``--timing-log F.jsonl``).

Also the timeline of the exchange's buckets (each bucket's encode, D2H copy, reduction, H2D copy
and decode, start and end, next to each layer's backward end, in seconds since the iteration's
start), and the readers of the logs: ``mean_wall``, and ``overlap``, the share of the
exchange's cost that the asynchronous exchange hides, (T_sync - T_async) / (T_sync - T_none).

Times come from per-layer hooks: the Net calls a hook right after each layer's forward and
backward, so a layer's time is the interval since the previous hook. On the GPU the marks are
CUDA events (device time, not host clocks); on the CPU they are ``perf_counter`` readings.
The exchange reports its own per-layer phases (encode, D2H, wait for the copy, communication,
H2D, decode, quantile) as an :class:`ExchangeTimes` record in its ``timings``. The record layout is documented in
docs/timing_schema.json and summarised as Oyama et al.'s figure 5/6 split:
ForwardBackward, D2H, Communication, H2D, Quantile, Other (seconds).
"""
import json
import os
import time
from dataclasses import dataclass, field

from caffe8.engine import backend
from caffe8.engine.errors import CaffeError

PHASES = ("encode", "d2h", "wait", "comm", "h2d", "decode", "quantile")


#: the phases of a bucket's timeline, in the order a bucket goes through them
BUCKET_PHASES = ("encode", "d2h", "reduce", "h2d", "decode")


@dataclass
class BucketTimes:
    """One bucket's timeline in one iteration (produced by the exchange): ``layers`` (indices,
    in the order they reached the bucket) and ``marks``, (phase, start, end) for each phase of
    :data:`BUCKET_PHASES` each of its layers went through, a phase possibly several times (a
    layer's tensors encoded in two batches; one per layer). A mark is a host clock reading
    (``time.perf_counter``) or, for a device phase on the GPU, a CUDA event."""
    bucket: int
    layers: list
    marks: list


@dataclass
class ExchangeTimes:
    """What a gradient exchange measured in its last iteration (produced by the exchange).

    ``layers``: {layer index: {phase: seconds}} with every phase of :data:`PHASES`;
    ``quantile_interval``: N, iterations between two range estimates; ``asynchronous``: True when
    the exchange overlapped backward; ``quantile_pass``: seconds of the last full estimate;
    ``buckets``: a :class:`BucketTimes` per bucket exchanged.
    """
    layers: dict = field(default_factory=dict)
    quantile_interval: int = 1
    asynchronous: bool = False
    quantile_pass: float = 0.0
    buckets: list = field(default_factory=list)


def merged(records):
    """One :class:`ExchangeTimes` of several callbacks' ``records`` (each phase of a layer
    summed; asynchronous when one of them overlapped backward); empty for none."""
    if len(records) == 1:
        return records[0]
    out = ExchangeTimes()
    for rec in records:
        for i, phases in rec.layers.items():
            mine = out.layers.setdefault(i, dict.fromkeys(PHASES, 0.0))
            for ph in PHASES:
                mine[ph] += phases.get(ph, 0.0)
        out.asynchronous = out.asynchronous or rec.asynchronous
        out.quantile_interval = max(out.quantile_interval, rec.quantile_interval)
        out.quantile_pass += rec.quantile_pass
        out.buckets += rec.buckets
    return out


class Clock:
    """Marks that can be differenced: CUDA events on the GPU (recorded on ``stream``, default the
    current one), host seconds on the CPU. ``gpu``: default, whether the backend runs on CuPy."""

    def __init__(self, gpu=None):
        self.gpu = backend.on_gpu() if gpu is None else gpu

    def mark(self, stream=None):
        if self.gpu:
            ev = backend.cupy.cuda.Event()
            ev.record(stream)
            return ev
        return time.perf_counter()

    def seconds(self, a, b):
        if self.gpu:
            b.synchronize()
            return backend.cupy.cuda.get_elapsed_time(a, b) / 1000.0
        return b - a


class TimingLog:
    """Collects per-layer times through Net hooks and writes JSON lines."""

    def __init__(self, path, rank=0, truncate=True):
        """All ranks may share one file: each record is one ``write`` on an O_APPEND descriptor,
        so records never interleave. Only the first opener truncates (the CLI lets rank 0 open
        the file before the others)."""
        self.path = path
        self.rank = rank
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_TRUNC if truncate else 0)
        self.file = os.open(path, flags, 0o644)
        self.clock = None
        self.marks = []          # (kind, layer index, mark) in call order
        self.host_start = 0.0    # time.perf_counter() at the iteration's start
        self.net = None
        self.callbacks = ()

    def attach(self, trainer):
        """Record ``trainer``'s iterations (it calls :meth:`begin_iteration` and
        :meth:`end_iteration`): hooks into its train net, and reads the per-layer records of its
        callbacks (``timings``: the exchange's) whenever an iteration ends. Called once, by the
        wiring; an exchange times its device phases with CUDA events when the wiring makes it
        with ``timed`` for a logged run."""
        self.net = trainer.net
        self.callbacks = trainer.callbacks
        self.clock = Clock()
        self.net.add_forward_hook(lambda i, layer: self.marks.append(("f", i, self.clock.mark())))
        self.net.add_backward_hook(lambda i, layer: self.marks.append(("b", i, self.clock.mark())))
        trainer.timing = self

    def begin_iteration(self):
        self.marks = [("start", -1, self.clock.mark())]
        self.host_start = time.perf_counter()

    def since_start(self, mark):
        """Seconds from this iteration's start to ``mark``: a host clock reading
        (``time.perf_counter``) or a CUDA event. On the GPU an event is placed by device time
        from the start event, a host reading by host time from the start: the two clocks are
        aligned at the iteration's start, as far as the device has caught up with the host
        there (it usually has: the iteration begins after the update's host synchronisation)."""
        if isinstance(mark, float):
            return mark - self.host_start
        return self.clock.seconds(self.marks[0][2], mark)

    def _timeline(self, buckets):
        """The record's ``buckets``: each bucket's layers (names) and, per phase it went
        through, [first start, last end] in seconds since the iteration's start."""
        out = []
        for bt in buckets:
            rec = {"bucket": bt.bucket, "layers": [self.net.layers[i].name for i in bt.layers]}
            spans = {}
            for phase, start, end in bt.marks:
                a, b = self.since_start(start), self.since_start(end)
                lo, hi = spans.get(phase, (a, b))
                spans[phase] = (min(lo, a), max(hi, b))
            rec.update({ph: list(spans[ph]) for ph in BUCKET_PHASES if ph in spans})
            out.append(rec)
        return out

    def _layer_times(self):
        fwd, bwd = {}, {}
        for (_, _, prev), (kind, i, cur) in zip(self.marks, self.marks[1:]):
            if kind == "start":
                continue
            target = fwd if kind == "f" else bwd
            target[i] = target.get(i, 0.0) + self.clock.seconds(prev, cur)
        return fwd, bwd

    def end_iteration(self, iteration, wall_seconds, wait_seconds=0.0):
        """Write the record of the iteration that just finished (``iteration`` = its number)."""
        if self.clock is None or len(self.marks) < 2:
            return
        fwd, bwd = self._layer_times()
        ex = merged([cb.timings for cb in self.callbacks if cb.timings is not None])
        backward_end = {i: mark for kind, i, mark in self.marks if kind == "b"}   # last pass's
        layers = []
        for i, layer in enumerate(self.net.layers):
            rec = {"name": layer.name, "type": layer.type,
                   "forward": fwd.get(i, 0.0), "backward": bwd.get(i, 0.0),
                   "backward_end": self.since_start(backward_end[i]) if i in backward_end
                   else None}
            rec.update({ph: ex.layers.get(i, {}).get(ph, 0.0) for ph in PHASES})
            layers.append(rec)
        fb = sum(fwd.values()) + sum(bwd.values())
        total = {ph: sum(r[ph] for r in layers) for ph in PHASES}
        # Oyama et al.'s figures 5-6: the quantile pass runs every N iterations, so it is charged 1/N.
        quantile = ex.quantile_pass / max(1, ex.quantile_interval)
        split = {"ForwardBackward": fb, "D2H": total["d2h"],
                 "Communication": total["comm"] + total["encode"] + total["decode"],
                 "H2D": total["h2d"], "Quantile": quantile}
        if ex.asynchronous:
            # Overlapped: only the time the compute thread waited after backward is exposed; the
            # thread's copies are part of that wait (per-layer records keep their own times).
            split.update(Communication=wait_seconds, D2H=0.0, H2D=0.0)
        # Other is what the measured parts leave of the wall time; the quantile pass counts with
        # the time it took in *this* iteration (its amortised share is what the split reports),
        # so the split's mean over N iterations adds up to the mean wall time.
        spent = sum(split.values()) - split["Quantile"] + total["quantile"]
        split["Other"] = max(0.0, wall_seconds - spent)
        record = {"iteration": iteration, "rank": self.rank,
                  "start": time.time() - wall_seconds, "wall": wall_seconds,
                  "split": split, "layers": layers, "buckets": self._timeline(ex.buckets)}
        os.write(self.file, (json.dumps(record) + "\n").encode())

    def close(self):
        if self.file is not None:
            os.close(self.file)
            self.file = None


# --- reading timing logs --------------------------------------------------------------------
def read_log(path):
    """The records of a timing log (JSON lines), in file order; a line that is not JSON is one
    error naming the file and line."""
    records = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise CaffeError(f"{path}:{lineno}: not a JSON timing record: "
                                     f"{e.msg}") from None
    return records


def mean_wall(records, skip=1, rank=None):
    """Mean wall time of ``records`` (a timing log's, or its path) over the iterations from
    ``skip`` on (the first ones pay for first use: page faults, the data's first read), of one
    ``rank`` or of every rank's records."""
    if isinstance(records, (str, os.PathLike)):
        records = read_log(records)
    walls = [r["wall"] for r in records
             if r["iteration"] >= skip and (rank is None or r["rank"] == rank)]
    if not walls:
        raise ValueError(f"no timing record from iteration {skip} on"
                         + (f" of rank {rank}" if rank is not None else ""))
    return sum(walls) / len(walls)


def overlap(t_sync, t_async, t_none):
    """The share of the exchange's cost that the asynchronous exchange hides behind backward:
    (T_sync - T_async) / (T_sync - T_none), with the iteration times of the same net run with
    the synchronous exchange, the asynchronous one, and no exchange (as many processes on the
    same devices, each training alone: a second process on a GPU slows the first, with or
    without an exchange; the same batch per process). 1: all of it hidden; 0: none; below 0:
    the asynchronous exchange is slower.
    The denominator is the exchange's whole cost as the iteration sees it, measured, not a sum
    of per-phase intervals (which count concurrent copies several times)."""
    cost = t_sync - t_none
    if not cost > 0:
        raise ValueError(f"the synchronous run ({t_sync:.6g} s) is not slower than the run "
                         f"without an exchange ({t_none:.6g} s): no exchange cost to hide")
    return (t_sync - t_async) / cost


def overlap_of_logs(sync, asynchronous, none, skip=1):
    """:func:`overlap` of three timing logs (paths or records; every rank's records)."""
    return overlap(mean_wall(sync, skip), mean_wall(asynchronous, skip), mean_wall(none, skip))
