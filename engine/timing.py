"""Per-layer timing log: one JSON record per iteration per rank (``--timing-log F.jsonl``).

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

PHASES = ("encode", "d2h", "wait", "comm", "h2d", "decode", "quantile")


@dataclass
class ExchangeTimes:
    """What a gradient exchange measured in its last iteration (produced by the exchange).

    ``layers``: {layer index: {phase: seconds}} with every phase of :data:`PHASES`;
    ``quantile_interval``: N, iterations between two range estimates; ``asynchronous``: True when
    the exchange overlapped backward; ``quantile_pass``: seconds of the last full estimate.
    """
    layers: dict = field(default_factory=dict)
    quantile_interval: int = 1
    asynchronous: bool = False
    quantile_pass: float = 0.0


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
        layers = []
        for i, layer in enumerate(self.net.layers):
            rec = {"name": layer.name, "type": layer.type,
                   "forward": fwd.get(i, 0.0), "backward": bwd.get(i, 0.0)}
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
                  "split": split, "layers": layers}
        os.write(self.file, (json.dumps(record) + "\n").encode())

    def close(self):
        if self.file is not None:
            os.close(self.file)
            self.file = None
