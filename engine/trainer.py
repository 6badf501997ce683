"""The training loop: Caffe's Solver::Solve / Step / Test / Snapshot, data parallel over MPI.

Order per iteration (as Caffe): clear diffs → test if due → forward/backward ``iter_size`` times
→ smoothed loss → display → gradients ready (the exchange averages gradients over all ranks) →
ApplyUpdate → snapshot if due. Only rank 0 logs and writes snapshots; test results are averaged
over all ranks (each rank tests its own share of the test data).
"""
import contextlib
import math
import os
import time

import numpy

from caffe8.engine import backend, blas, model_io
from caffe8.engine.errors import CaffeError, SolverError, relative_to_cwd
from caffe8.engine.glog import fmt
from caffe8.engine.net import Net
from caffe8.engine.pipelined import PipelinedUpdate
from caffe8.engine.prototxt import parse_file, to_text
from caffe8.engine.snapshot import (PrefixLock, check_pair, latest_pair, load_solverstate,
                                    remove_stale_temporaries, snapshot_files, snapshot_names,
                                    written_here)
from caffe8.engine.solver import create_solver
from caffe8.engine.tester import average_outputs, output_values
from caffe8.engine.validate import place, validate
from caffe8.engine.world import SingleProcessWorld


_NONFINITE, _STOP, _SNAPSHOT = 1, 2, 4
_REQUEST_BITS = {"stop": _STOP, "snapshot": _SNAPSHOT}


def resolve_path(path, solver_path):
    """Caffe resolves paths against the CWD; fall back to the solver file's folder."""
    if os.path.exists(path) or os.path.isabs(path):
        return path
    alt = os.path.join(os.path.dirname(os.path.abspath(solver_path)), path)
    return alt if os.path.exists(alt) else path


class Trainer:
    """Runs a solver prototxt.

    ``world``: the job (``engine.world``; a single process by default). Gradient exchange and
    other per-iteration work attach through :meth:`add_callback` (``engine.callbacks``), as
    Caffe's ``Solver::add_callback``; the loop itself never communicates gradients.
    """

    def __init__(self, solver_path, world=None, log=None, param=None):
        """``param``: the solver file already parsed (the CLI reads it first to pick the device).
        A per-layer timing log hooks itself in afterwards (``engine.timing.TimingLog.attach``)."""
        self.solver_path = str(solver_path)
        self.param = param if param is not None else parse_file(self.solver_path, "SolverParameter")
        self.world = world or SingleProcessWorld()
        self.log = log or (lambda msg: None)
        self.timing = None
        self._validate()
        p = self.param
        self.log("Initializing solver from parameters: \n" + to_text(p))
        if p.random_seed >= 0:
            backend.seed(int(p.random_seed) + self.world.rank)
        self.net, self.test_nets, self.callbacks = None, [], []
        try:
            self.net = self._build_train_net()
            self.test_nets = self._build_test_nets()
            self.solver = create_solver(p, self.net, log=self.log)
            if p.snapshot_format == "HDF5":
                self.net.check_unique_param_layer_names(
                    "snapshot_format: HDF5 keys a model's params by layer name: rename one")
        except BaseException:
            self.close()  # the nets built so far hold files and prefetch threads
            raise
        self._last_pass = True
        self.pipelined = None       # the PipelinedUpdate a callback took (add_callback)
        self.net.add_backward_hook(self._after_backward)
        self.losses = []
        self.smoothed_loss = 0.0
        self._display_mark = None       # (time, iteration) of the last "Iteration N (R iter/s" line
        self.last_snapshot_iter = None
        self._requests = 0
        self.skipped_in_a_row = 0
        self.stopped_early = False
        self._broadcast_weights()

    # --- setup -----------------------------------------------------------------------------------
    def _validate(self):
        """Each field against the schema (a solver built in Python meets it here), then what
        the schema cannot say: max_iter must be given, and exactly one train net."""
        p = validate(self.param)
        if not p.has("max_iter"):
            raise SolverError(f"{place(p, None)}: solver field 'max_iter' must be set")
        nets = [f for f in ("net", "net_param", "train_net", "train_net_param") if p.has(f)]
        if len(nets) != 1:
            raise SolverError(f"{self.solver_path}: exactly one of net, net_param, train_net, "
                              f"train_net_param must be given (got {nets or 'none'})")

    def _net_source(self, field):
        value = getattr(self.param, field)
        if field.endswith("_param"):
            return value
        return self._existing_net(value, field)

    def _existing_net(self, value, field):
        """The resolved path of a net file named by solver field ``field``; an error naming
        the solver line when it does not exist."""
        path = resolve_path(value, self.solver_path)
        if not os.path.isfile(path):
            beside = "" if os.path.isabs(value) else \
                f", nor in the solver's folder {os.path.dirname(os.path.abspath(self.solver_path))}"
            raise SolverError(f"{self.param.location(field)}: solver field '{field}': net file "
                              f"'{value}' does not exist{relative_to_cwd(value)}{beside}")
        return path

    def _build_train_net(self):
        p = self.param
        field = next(f for f in ("train_net_param", "train_net", "net_param", "net") if p.has(f))
        st = p.train_state
        self.log(f"Creating training net specified in {field}" if field.endswith("_param") else
                 f"Creating training net from {field} file: {self._net_source(field)}")
        return Net(self._net_source(field), phase="TRAIN", level=st.level, stages=tuple(st.stage),
                   rank=self.world.rank, world=self.world.size, log=self.log)

    def _build_test_nets(self):
        p = self.param
        sources = [p.test_net_param[i] for i in range(len(p.test_net_param))]
        sources += [self._existing_net(t, "test_net") for t in p.test_net]
        generic = p.has("net") or p.has("net_param")
        if len(p.test_iter) < len(sources) or (not generic and len(p.test_iter) != len(sources)):
            raise SolverError(f"{p.location('test_iter')}: {len(p.test_iter)} test_iter value(s) "
                              f"for {len(sources)} test net(s); give one test_iter per test net")
        if generic:
            # Caffe: the remaining test_iter values are TEST instances of the train net.
            extra = len(p.test_iter) - len(sources)
            sources += [self._net_source("net" if p.has("net") else "net_param")] * extra
        if p.test_state and len(p.test_state) != len(sources):
            raise SolverError(f"{p.location('test_state')}: {len(p.test_state)} test_state(s) for "
                              f"{len(sources)} test net(s); give none or one per test net")
        for i, src in enumerate(sources):  # appended one by one, so close() sees every net built
            st = p.test_state[i] if i < len(p.test_state) else None
            self.log(f"Creating test net (#{i}) specified by "
                     + (f"file: {src}" if isinstance(src, str) else "a net parameter"))
            net = Net(src, phase="TEST", level=st.level if st else 0,
                      stages=tuple(st.stage) if st else (), rank=self.world.rank,
                      world=self.world.size, log=self.log)
            self.test_nets.append(net)
            net.share_trained_layers_with(self.net)
        return self.test_nets

    def _broadcast_weights(self):
        """Every rank starts from rank 0's weights (bit-identical parameters from iteration 0)."""
        if self.world.size > 1:
            flat = self.net.flat_data
            host = backend.to_numpy(flat)
            self.world.bcast_array(host, root=0)
            flat[...] = backend.to_device(host, like=flat)

    def _share_forward_state(self):
        """Every rank takes rank 0's forward-written params (``Layer.forward_state_blobs``:
        BatchNorm's statistics, which each rank's forward moved with its own batch; no exchange
        sums them), so that the ranks hold bit-identical parameters after every iteration. One
        small broadcast per iteration, only for nets that have such params."""
        slices = self.net.forward_state_slices
        if self.world.size == 1 or not slices:
            return
        flat = self.net.flat_data
        host = numpy.concatenate([backend.to_numpy(flat[sl]) for sl in slices])
        self._next_collective("forward state broadcast")
        self.world.bcast_array(host, root=0)
        at = 0
        for sl in slices:
            n = sl.stop - sl.start
            flat[sl] = backend.to_device(host[at:at + n], like=flat)
            at += n

    # --- callbacks (Caffe's Solver::Callback) -----------------------------------------------------
    def add_callback(self, callback):
        """Attach an ``engine.callbacks.SolverCallback`` (e.g. the gradient exchange). The
        first callback that takes it (``callback.pipeline``) gets the trainer's pipelined
        update (``engine.pipelined``), when the solver can update one param at a time."""
        self.callbacks.append(callback)
        if self.pipelined is None and self.solver.supports_early_update():
            update = PipelinedUpdate(self.solver, self.net)
            if callback.pipeline(update):
                self.pipelined = update

    def _after_backward(self, layer_index, layer):
        if self._last_pass:
            for cb in self.callbacks:
                cb.on_backward(layer_index)

    def close(self):
        """End the callbacks' threads, then close the train and test nets (their data layers'
        prefetch threads are joined before files are released). Idempotent; the CLI calls it
        in ``finally``, and ``with Trainer(...) as trainer:`` does too."""
        callbacks, self.callbacks = self.callbacks, []
        try:
            for cb in callbacks:
                cb.close()
        finally:
            nets = [n for n in [self.net, *self.test_nets] if n is not None]
            busy = [name for net in nets for name in net.close()]
            if busy:
                self._warn(f"data layer(s) {', '.join(busy)}: prefetch thread still reading "
                           "after the close timeout; their files stay open until it ends")

    def _warn(self, message):
        getattr(self.log, "warning", self.log)(message)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- the loop --------------------------------------------------------------------------------
    @property
    def iter(self):
        return self.solver.iter

    def solve(self, resume_file=None, weights=None, progress=None):
        """Caffe's Solver::Solve: optional restore, Step to max_iter, final snapshot/display/test.
        The run owns its snapshot prefix meanwhile (``engine.snapshot.PrefixLock``).
        ``resume_file`` "latest": the newest complete model + state pair of the prefix, or a
        fresh start when it holds none."""
        lock = self._own_prefix()
        try:
            self._solve(resume_file, weights, progress)
        finally:
            if lock is not None:
                lock.release()

    def _own_prefix(self):
        """Rank 0 locks the snapshot prefix for the run; a refusal reaches every rank, so the
        job ends alike everywhere."""
        lock, refusal = None, None
        if self.world.rank == 0:
            try:
                lock = PrefixLock(self.snapshot_prefix()).acquire()
            except (CaffeError, OSError) as e:
                refusal = str(e)
            if lock is not None and lock.taken_over:
                self._warn(f"snapshot_prefix {self.snapshot_prefix()}: took over the lock "
                           f"{lock.path} of process {lock.taken_over}, which ended without "
                           "releasing it (killed?)")
        if self.world.size > 1:
            refusal = self.world.bcast(refusal, root=0)
        if refusal:
            if lock is not None:
                lock.release()
            raise CaffeError(refusal)
        return lock

    def _latest_state(self):
        """``-snapshot latest``: the solver state of the newest complete snapshot pair of the
        prefix (``engine.snapshot.latest_pair``, chosen by rank 0 for every rank), logged; None
        when the prefix holds none, and the run trains from scratch, saying so (a requeued job
        script's first start: "resume if there is something to resume")."""
        prefix = self.snapshot_prefix()
        found = latest_pair(prefix) if self.world.rank == 0 else None
        if self.world.size > 1:
            found = self.world.bcast(found, root=0)
        pair, skipped = found
        note = (f"; skipped the incomplete one(s) of iteration(s) {', '.join(map(str, skipped))}"
                if skipped else "")
        if pair is None:
            self.log(f"--snapshot latest: snapshot prefix {prefix} holds no complete snapshot "
                     f"(model and solver state){note}; training from scratch")
            return None
        n, model, state = pair
        self.log(f"Latest complete snapshot of {prefix}: iteration {n} ({model} + {state}){note}")
        return state

    def _solve(self, resume_file, weights, progress):
        p = self.param
        if resume_file == "latest":
            resume_file = self._latest_state()
        if weights:
            names = str(weights).split(",")
            if not all(names):
                raise CaffeError(f"weights {weights}: empty file name in the comma-separated list")
            for w in names:
                self.log(f"Finetuning from {w}")  # Caffe's wording for loaded weights
                self.net.copy_trained_layers_from(w)
            self._broadcast_weights()
        self.log(f"Solving {self.net.name}")
        self.log(f"Learning Rate Policy: {p.lr_policy}")
        if resume_file:
            self.log(f"Resuming from {resume_file}")
            self.restore(resume_file)
        if self.world.rank == 0:
            self._check_snapshot_prefix()
        self.step(p.max_iter - self.iter, progress)
        if self.stopped_early:
            if p.snapshot_after_train and self.last_snapshot_iter != self.iter:
                self.snapshot()
            self.log("Optimization stopped early.")
            return
        if p.snapshot_after_train and (not p.snapshot or self.iter % p.snapshot != 0):
            self.snapshot()
        if p.display and self.iter % p.display == 0:
            self.net.forward()
            self._update_smoothed_loss(self.net.loss, self.iter)
            self.log(f"Iteration {self.iter}, loss = {fmt(self._displayed_loss(self.net.loss))}")
        if p.test_interval and self.iter % p.test_interval == 0:
            self.test_all()
        self.log("Optimization Done.")

    def step(self, iters, progress=None):
        p = self.param
        start_iter, stop_iter = self.iter, self.iter + iters
        self.losses, self.smoothed_loss = [], 0.0
        if self._display_mark is None:   # kept across calls, so pycaffe's step(1) loops show
            self._display_mark = (time.perf_counter(), self.iter)   # a rate (Caffe's iterations_last_)
        while self.iter < stop_iter:
            blas.adapt_threads()  # the cores free now (a busy neighbour costs its share)
            t_clear = time.perf_counter()
            self.net.clear_param_diffs()
            cleared = time.perf_counter() - t_clear
            if p.test_interval and self.iter % p.test_interval == 0 and \
                    (self.iter > 0 or p.test_initialization):
                self.test_all()
            # the iteration's wall time includes the clearing (Caffe's Step begins with it), not
            # the test phase in between
            t0 = time.perf_counter() - cleared
            if self.timing is not None:
                self.timing.begin_iteration()
            for cb in self.callbacks:
                cb.on_start()
            # the passes' losses stay on the device; one host read per iteration
            total, agreed = self._forward_backward(p.iter_size)
            loss = float(total) / p.iter_size
            self.net.run_pending_checks()     # the layers' checks of device data (labels)
            self._update_smoothed_loss(loss, start_iter)
            if p.display and self.iter % p.display == 0:
                now = time.perf_counter()
                last_time, last_iter = self._display_mark
                elapsed = max(now - last_time, 1e-9)
                rate = (self.iter - last_iter) / elapsed
                self.log(f"Iteration {self.iter} ({fmt(rate)} iter/s, {fmt(elapsed)}s/{p.display} iters), "
                         f"loss = {fmt(self._displayed_loss(loss))}")
                self._display_mark = (now, self.iter)
                self._log_outputs("Train", output_values(self.net))
            t_wait = time.perf_counter()
            for cb in self.callbacks:
                cb.on_gradients_ready()  # async exchange: waits for the thread that ran in backward
            wait = time.perf_counter() - t_wait
            if agreed is not None:              # the pipelined update ran during backward
                finite, done = self.pipelined.finish()
                flags = agreed | (0 if finite else _NONFINITE)
            else:
                flags, done = self._agreed_flags(loss), ()
            if self._gradients_finite(flags):
                self.solver.apply_update(done=done)
            self._share_forward_state()
            if self.timing is not None:
                self.timing.end_iteration(self.iter - 1, time.perf_counter() - t0, wait)
            if progress is not None:
                progress.update(1)
            self._consistency_check()
            if (p.snapshot and self.iter % p.snapshot == 0) or flags & _SNAPSHOT:
                self.snapshot()
            if flags & _STOP:
                self.stopped_early = True
                break

    def _forward_backward(self, passes):
        """``passes`` forward/backward passes (iter_size): (their summed loss, on the device;
        the flags agreed before the last backward, or None). With the pipelined update the last
        pass's loss verdict and the pending requests are agreed on before its backward (one
        tiny allreduce, while no exchange is in flight), so that layers can be updated as soon
        as their exchanged gradients arrive."""
        total, agreed = 0.0, None
        self.net.keep_forward_work(True)  # nothing here writes a bottom between the two passes
        try:
            for k in range(passes):
                self._last_pass = k == passes - 1
                if self._first_read:       # opening the data may keep this rank long: say so
                    with self._busy("reading its first data"):
                        total = total + self.net.forward_loss(as_float=False)
                    self._first_read = False
                else:
                    total = total + self.net.forward_loss(as_float=False)
                if self._last_pass and self.pipelined is not None:
                    self.net.run_pending_checks()
                    agreed = self._agree(math.isfinite(float(total) / passes))
                    self.pipelined.begin(not agreed & _NONFINITE)
                self.net.backward()
        finally:
            self.net.keep_forward_work(False)
        return total, agreed

    _first_read = True

    # --- the watchdog: phases that keep one rank away from collectives ----------------------------
    def _busy(self, phase):
        """``with self._busy(phase):`` tells the world's stall watchdog (when it has one) that
        this rank is busy in ``phase`` (the block makes no collective), so the other ranks
        wait for it instead of declaring a stall."""
        watchdog = getattr(self.world, "watchdog", None)
        return watchdog.busy(phase) if watchdog is not None else contextlib.nullcontext()

    def _next_collective(self, what):
        """Name the collective the ranks meet in next, for the watchdog's messages."""
        watchdog = getattr(self.world, "watchdog", None)
        if watchdog is not None:
            watchdog.collective(self.iter, what)

    def _consistency_check(self):
        """Every K iterations all ranks compare a checksum of their parameters."""
        k = self.param.comm.consistency_check_interval
        if not k or not self.callbacks or self.iter % k:
            return
        if all([cb.consistency_check() for cb in self.callbacks]):
            self.log(f"Iteration {self.iter}, consistency check: parameters bit-identical "
                     f"on all {self.world.size} ranks")
        else:
            raise CaffeError(f"iteration {self.iter}: consistency check failed: parameters "
                             f"differ between ranks")

    def _update_smoothed_loss(self, loss, start_iter):
        if not math.isfinite(loss):
            return  # a skipped NaN iteration must not poison every later display
        n = self.param.average_loss
        if len(self.losses) < n:
            self.losses.append(loss)
            size = len(self.losses)
            self.smoothed_loss = (self.smoothed_loss * (size - 1) + loss) / size
        else:
            idx = (self.iter - start_iter) % n
            self.smoothed_loss += (loss - self.losses[idx]) / n
            self.losses[idx] = loss

    def _displayed_loss(self, loss):
        """The smoothed loss, or this iteration's own loss when that is NaN/Inf: Caffe prints
        ``nan`` then, and a frozen average would hide that training has diverged."""
        return self.smoothed_loss if math.isfinite(loss) else loss

    def request(self, action):
        """Ask the loop to "stop" (snapshot, then end, as Caffe's SIGINT) or "snapshot" (SIGHUP)
        after the current iteration; safe to call from a signal handler."""
        self._requests |= _REQUEST_BITS[action]

    def _agreed_flags(self, loss):
        """This iteration's NaN/Inf verdict and pending requests, OR-ed over all ranks.

        The loss is checked too because fp8 saturates an infinite gradient to ±57344, so an Inf
        on one rank would otherwise pass unseen. One tiny allreduce per iteration, made after
        the exchange, when no other thread is in MPI; every rank then acts alike.
        """
        return self._agree(math.isfinite(loss) and self.solver.gradients_finite(self.net.flat_diff))

    def _agree(self, finite):
        """This rank's verdict (``finite``) and pending requests, OR-ed over all ranks (one tiny
        allreduce); the requests are then taken."""
        flags, self._requests = self._requests | (0 if finite else _NONFINITE), 0
        return self.world.allreduce_or(flags)

    def _gradients_finite(self, flags):
        """NaN/Inf policy: True to update; skip, or snapshot and stop (comm.nonfinite)."""
        if not flags & _NONFINITE:
            self.skipped_in_a_row = 0
            return True
        comm = self.param.comm
        if comm.nonfinite == "skip":
            limit = int(comm.max_consecutive_skips)
            if self.skipped_in_a_row < limit:
                self.skipped_in_a_row += 1
                self.log(f"Iteration {self.iter}: non-finite gradient, update skipped "
                         f"({self.skipped_in_a_row} of at most {limit} in a row)")
                self.solver.iter += 1
                return False
            self.snapshot()
            raise CaffeError(f"{comm.location('max_consecutive_skips')}: iteration {self.iter}: "
                             f"non-finite loss or gradient after {limit} consecutive skipped "
                             f"updates (comm {{ max_consecutive_skips: {limit} }}); snapshot "
                             "written; training diverges: lower base_lr")
        self.snapshot()
        raise CaffeError(f"iteration {self.iter}: non-finite loss or gradient; snapshot written "
                         f"(set comm {{ nonfinite: \"skip\" }} in the solver to skip such updates)")

    # --- outputs and testing ---------------------------------------------------------------------
    def _log_outputs(self, kind, outputs, means=None):
        k = 0
        for name, values, weight in outputs:
            vals = means[k:k + values.size] if means is not None else values
            for v in vals:
                suffix = f" (* {fmt(weight)} = {fmt(weight * v)} loss)" if weight else ""
                self.log(f"    {kind} net output #{k}: {name} = {fmt(v)}{suffix}")
                k += 1

    def test_all(self):
        for i in range(len(self.test_nets)):
            self.test(i)

    def test(self, i):
        """Run test_iter[i] forward passes, spread over the ranks, each on its own share of the
        data (``tester.average_outputs``); average over passes and ranks."""
        self.log(f"Iteration {self.iter}, Testing net (#{i})")
        self._next_collective(f"the average of test net #{i}")
        outputs, means, loss = average_outputs(self.test_nets[i], self.param.test_iter[i],
                                               self.world, busy=self._busy("testing"))
        if self.param.test_compute_loss:
            self.log(f"Test loss: {fmt(loss)}")
        self._log_outputs("Test", outputs, means)
        self.last_test = {name: float(means[k]) for k, (name, _, _) in enumerate(outputs)}
        return self.last_test

    # --- snapshots -------------------------------------------------------------------------------
    def snapshot_prefix(self):
        p = self.param
        if p.has("snapshot_prefix"):
            prefix = p.snapshot_prefix
            if prefix.endswith(os.sep) or os.path.isdir(prefix):
                prefix = os.path.join(prefix, os.path.splitext(os.path.basename(self.solver_path))[0])
            return prefix
        return os.path.splitext(self.solver_path)[0]

    def _check_snapshot_prefix(self):
        """Before training (rank 0): remove the temporaries a killed run of this prefix left
        behind, and warn when the prefix holds snapshots newer than where this run starts —
        another run's, which this one would overwrite or mix with (not those this process
        wrote itself: a notebook solving again, ``%%timeit`` around ``solver.solve()``)."""
        prefix = self.snapshot_prefix()
        for path in remove_stale_temporaries(prefix):
            self.log(f"Removed a stale snapshot temporary of a killed run: {path}")
        mine = written_here()
        newer = sorted({n for n, path in snapshot_files(prefix)
                        if n > self.iter and path not in mine})
        if newer:
            self._warn(f"snapshot prefix {prefix} already holds snapshots of iteration(s) "
                       f"{', '.join(map(str, newer))}, newer than this run's start (iteration "
                       f"{self.iter}): they come from another run and will be overwritten or "
                       "mixed with this run's; use another snapshot_prefix to keep them apart")

    def snapshot(self):
        """Rank 0 writes model and solver state atomically, in ``snapshot_format`` (Caffe's
        default: binary proto). Collective: all ranks call it."""
        self.last_snapshot_iter = self.iter
        extra = self._extra_state()
        p = self.param
        model, state = snapshot_names(self.snapshot_prefix(), self.iter, p.snapshot_format)
        failure = None
        self._next_collective("the snapshot's broadcast (rank 0 writes the snapshot)")
        if self.world.rank == 0:
            try:
                with self._busy("writing a snapshot"):
                    model, state = model_io.write_snapshot(
                        self.net, self.solver.state(), self.snapshot_prefix(), self.iter,
                        p.snapshot_format, p.snapshot_diff, extra=extra, log=self.log)
                written_here(model, state)
            except (OSError, CaffeError) as e:
                failure = f"snapshot {model}: {e}"
        # Every rank waits until rank 0 has written (or failed): nobody aborts the job while
        # the files are half written, and a failure is reported on every rank.
        failure = self.world.bcast(failure, root=0)
        if failure:
            raise CaffeError(failure)
        return model, state

    def _extra_state(self):
        """Per-rank state Caffe does not save but an exact resume needs, gathered on rank 0."""
        local = {"rng": backend.rng_state(),
                 "gemm_partition": blas.partition(),    # how host products were split: the bits
                 "layers": self._layer_states(self.net),
                 "test_layers": [self._layer_states(net) for net in self.test_nets],
                 "callbacks": [cb.state() for cb in self.callbacks]}
        ranks = self.world.gather(local, root=0)
        return {"world": self.world.size, "ranks": ranks, "solver": self.param.type}

    @staticmethod
    def _layer_states(net):
        return {l.name: l.get_state() for l in net.layers if hasattr(l, "get_state")}

    @staticmethod
    def _set_layer_states(net, states):
        for layer in net.layers:
            if hasattr(layer, "set_state") and layer.name in states:
                layer.set_state(states[layer.name])

    def restore(self, path):
        """Resume from a solverstate (its learned_net is loaded too), Caffe's Solver::Restore."""
        state, extra = load_solverstate(path)
        saved = extra.get("solver")
        if saved and saved != self.param.type:
            raise SolverError(f"{path}: written by the {saved} solver; this run's solver is "
                              f"{self.param.type} ({self.param.location('type')}): resume with "
                              f"type: \"{saved}\"")
        model = state["learned_net"]
        if model and not os.path.exists(model):
            alt = os.path.join(os.path.dirname(str(path)), os.path.basename(model))
            model = alt if os.path.exists(alt) else model
        if model:
            check_pair(path, model, extra)
            self.net.copy_trained_layers_from(model)
        try:
            self.solver.restore(state)
        except SolverError as e:
            raise SolverError(f"{path}: {e}") from None
        ranks = extra.get("ranks", [])
        if extra.get("world") == self.world.size and self.world.rank < len(ranks):
            mine = ranks[self.world.rank]
            backend.set_rng_state(mine["rng"])
            if "gemm_partition" in mine:        # split products as the saved run did
                blas.set_partition(mine["gemm_partition"])
            self._set_layer_states(self.net, mine["layers"])
            for net, states in zip(self.test_nets, mine.get("test_layers", [])):
                self._set_layer_states(net, states)
            saved = mine.get("callbacks") or [mine.get("exchange")]  # older snapshots: one
            for cb, state in zip(self.callbacks, saved):
                if state:
                    cb.restore(state)
        elif ranks:
            self.log(f"{path}: written by {extra.get('world')} process(es), resumed by "
                     f"{self.world.size}: random and data state restart, weights and history are exact")
        self._broadcast_weights()
