"""SGD with momentum, and the update skeleton every Caffe solver shares (``SGDSolver``).

``apply_update()`` is Caffe's ``SGDSolver::ApplyUpdate``, in Caffe's order:

1. rate = lr policy at ``iter`` (logged as "Iteration N, lr = r" when ``iter % display == 0``);
2. clip all diffs together by their global L2 norm (before the iter_size normalisation, so the
   *sum* over iter_size passes is what gets clipped);
3. per learnable param i: diff *= 1/iter_size; diff += local_decay * (w | sign(w)) with
   local_decay = weight_decay * decay_mult_i; diff = update value (``compute_update_value``,
   with local_rate = rate * lr_mult_i — the rate sits *inside* the momentum history);
4. w -= diff for every learnable param; 5. iter += 1.

All arithmetic is done in the params' dtype, elementwise and in place (param data/diff are views
into the Net's flat buffers and must never be rebound), on the params' array module; the only
reduction (the clipping norm) runs in a fixed param order, so ranks with identical gradients get
bit-identical weights.
"""
import numpy

from caffe8.engine import backend
from caffe8.engine.errors import SolverError
from caffe8.engine.glog import fmt
from caffe8.solvers import lr_policy, native
from caffe8.engine.solver import register_solver

def _no_log(message):
    """Default logger: drop the message."""


@register_solver("SGD")
class SGDSolver:
    """Momentum SGD: ``h = momentum*h + local_rate*diff``; ``diff = h``.

    ``net`` needs ``learnable_params`` (Blobs with .data/.diff), ``params_lr`` and
    ``params_weight_decay`` (one float per learnable param). ``history`` holds
    ``history_sets * n`` arrays of the params' shapes (Adam/AdaDelta: first set, then second).
    """
    history_sets = 1

    def __init__(self, solver_param, net, log=None):
        self.param = solver_param
        self.net = net
        self.log = log if log is not None else _no_log
        self.iter = 0
        self.current_step = 0
        lr_policy.validate(solver_param)
        self._check_common_settings()
        self.check_settings()
        self.history, self._flat_history = self._make_history(net)
        self._scratch = {}
        self._together = None    # _Together once the first update decided it applies, else False

    def _make_history(self, net):
        """``history_sets * n`` arrays of the params' shapes, zero; for a net whose params live
        in flat buffers (``Net.param_slices``), views of one buffer per set laid out as
        ``flat_data`` (then one C call can update every param: :meth:`_update_together`)."""
        params = net.learnable_params
        slices = getattr(net, "param_slices", None)
        flat = getattr(net, "flat_data", None)
        if flat is None or slices is None or len(slices) != len(params):
            return [backend.get_array_module(p.data).zeros_like(p.data)
                    for _ in range(self.history_sets) for p in params], None
        xp = backend.get_array_module(flat)
        buffers = [xp.zeros_like(flat) for _ in range(self.history_sets)]
        return [buf[sl].reshape(p.data.shape) for buf in buffers
                for p, sl in zip(params, slices)], buffers

    # --- configuration checks -----------------------------------------------------------------
    def _check_common_settings(self):
        # each field's own range and choices (iter_size, regularization_type ...) are the
        # schema's, checked where the solver was read (engine.validate)
        n = len(self.net.learnable_params)
        if len(self.net.params_lr) != n or len(self.net.params_weight_decay) != n:
            raise SolverError(f"net has {n} learnable params but {len(self.net.params_lr)} "
                              f"lr_mult and {len(self.net.params_weight_decay)} decay_mult values")

    def check_settings(self):
        """Solver-specific sanity checks (Caffe's constructor CHECKs); SGD has none."""

    def _require_no_momentum(self):
        if self.param.momentum != 0:
            raise SolverError(f"{self.param.location('momentum')}: momentum cannot be used with "
                              f"{self.type} (got {self.param.momentum:g})")

    # --- learning rate --------------------------------------------------------------------------
    @property
    def rate_dtype(self):
        """Dtype the rate is held in (Caffe's Dtype): that of the first learnable param."""
        params = self.net.learnable_params
        return numpy.dtype(params[0].data.dtype) if params else numpy.dtype(numpy.float32)

    def learning_rate(self):
        """The rate the next ``apply_update`` will use (pure: changes no state)."""
        r = lr_policy.learning_rate(self.param, self.iter, self.current_step).rate
        return float(self.rate_dtype.type(r))

    def _advance_rate(self):
        r = lr_policy.learning_rate(self.param, self.iter, self.current_step)
        self.current_step = r.current_step
        if r.message is not None:
            self.log(r.message)
        return float(self.rate_dtype.type(r.rate))

    # --- the update -----------------------------------------------------------------------------
    def apply_update(self, done=()):
        """One Caffe update step on the net's accumulated diffs; advances ``iter`` by one.

        ``done``: indices of learnable params whose update :meth:`update_early` already applied
        in this iteration (the pipelined update); they are left alone."""
        rate = self._advance_rate()
        if self.param.display and self.iter % self.param.display == 0:
            self.log(f"Iteration {self.iter}, lr = {fmt(rate)}")
        self.clip_gradients()
        self._update_params([i for i in range(len(self.net.learnable_params)) if i not in done],
                            rate)
        self.iter += 1

    def _update_params(self, indices, rate):
        """Caffe's per-param steps for ``indices``: normalise, regularise, update value, w -= diff."""
        if self._update_together(indices, rate):
            return
        for i in indices:
            self.normalize(i)
            self.regularize(i)
            self.update_param(i, rate)

    def _update_together(self, indices, rate):
        """Plain momentum SGD with L2 (or no) decay on host params in the net's flat buffers:
        the per-param steps of ``indices`` as one C call (``solvers.native.sgd_update``, the
        same float operations per element, so the same bits). False: the caller takes the
        per-param path (another rule, L1 decay, CuPy, no kernels)."""
        together = self._together
        if together is None:
            together = self._together = _Together.of(self)
        if not together:
            return False
        dt = together.dtype.type
        decays = together.decay_mults * self.hyper("weight_decay", dt)
        if self.param.regularization_type != "L2" and decays.any():
            return False
        rates = together.lr_mults * dt(rate)
        size = self.param.iter_size
        starts, counts = together.starts, together.counts
        if len(indices) != len(starts):          # the pipelined update's share of the params
            pick = numpy.asarray(indices, dtype=numpy.int64)
            starts, counts, rates, decays = starts[pick], counts[pick], rates[pick], decays[pick]
        net = self.net
        return native.sgd_update(net.flat_data, net.flat_diff, self._flat_history[0], starts,
                                 counts, rates, decays, dt(1) / dt(size) if size > 1 else None,
                                 self.hyper("momentum", dt))

    def supports_early_update(self):
        """Can params be updated one layer at a time as their gradients become final
        (:meth:`update_early`)? Not with ``clip_gradients``, whose scale needs every gradient."""
        return self.param.clip_gradients < 0

    def update_early(self, indices):
        """Update the learnable params ``indices`` now, with this iteration's rate, exactly as
        the coming :meth:`apply_update` would (it then skips them: pass them as ``done``). Every
        param's update reads only its own data, diff and history, so the order is free."""
        self._update_params(indices, self.learning_rate())

    def update_param(self, i, rate):
        """diff = update value of param i (``compute_update_value``), then w -= diff (param i's
        part of Caffe's Net::Update; no param's update reads another's, so doing both per param
        is Caffe's result). Plain momentum SGD on host arrays runs as one fused C pass
        (solvers/native.py), the same float operations in the same order: the same bits."""
        p = self.net.learnable_params[i]
        if type(self).compute_update_value is SGDSolver.compute_update_value:
            dt = p.data.dtype.type
            if native.sgd_momentum(p.data, p.diff, self.history[i], self.local_rate(i, rate),
                                   self.hyper("momentum", dt)):
                return
        self.compute_update_value(i, rate)
        p.data -= p.diff

    def gradients_finite(self, diff):
        """True when ``diff`` (e.g. the net's flat diff) holds no Inf or NaN."""
        verdict = native.all_finite(diff)
        if verdict is None:
            verdict = bool(backend.get_array_module(diff).isfinite(diff).all())
        return verdict

    def clip_gradients(self):
        """Scale all diffs by clip/norm when their global L2 norm exceeds ``clip_gradients``."""
        params = self.net.learnable_params
        if self.param.clip_gradients < 0 or not params:
            return
        dt = self.rate_dtype.type
        xp = backend.get_array_module(params[0].diff)
        sumsq = None
        for i, p in enumerate(params):  # fixed order: reproducible across ranks and runs
            sq = xp.multiply(p.diff, p.diff, out=self.scratch(i, 0)).sum()
            sumsq = sq if sumsq is None else sumsq + sq
        # The square root runs where the sum lives; reading the norm back is the one host
        # synchronisation clipping costs (the comparison and the log need a host number).
        norm = dt(backend.to_numpy(xp.sqrt(xp.asarray(sumsq, dtype=dt))))
        clip = self.hyper("clip_gradients", dt)
        if norm > clip:
            scale = clip / norm
            self.log(f"Gradient clipping: scaling down gradients (L2 norm {fmt(norm)} > "
                     f"{fmt(clip)}) by scale factor {fmt(scale)}")
            for p in params:
                p.diff *= p.diff.dtype.type(scale)

    def normalize(self, i):
        """diff *= 1/iter_size (Caffe multiplies by the reciprocal, computed in Dtype)."""
        size = self.param.iter_size
        if size > 1:
            diff = self.net.learnable_params[i].diff
            one = diff.dtype.type(1)
            diff *= one / diff.dtype.type(size)

    def regularize(self, i):
        """diff += weight_decay * decay_mult_i * (w for L2 | sign(w) for L1)."""
        p = self.net.learnable_params[i]
        dt = p.data.dtype.type
        local_decay = self.hyper("weight_decay", dt) * dt(numpy.float32(
            self.net.params_weight_decay[i]))
        if not local_decay:
            return
        xp = backend.get_array_module(p.data)
        tmp = self.scratch(i, 0)
        if self.param.regularization_type == "L2":
            xp.multiply(p.data, local_decay, out=tmp)
        else:
            xp.sign(p.data, out=tmp)
            tmp *= local_decay
        p.diff += tmp

    def local_rate(self, i, rate):
        """rate * lr_mult_i in the param's dtype (lr_mult is a proto float, i.e. float32)."""
        dt = self.net.learnable_params[i].data.dtype.type
        return dt(rate) * dt(numpy.float32(self.net.params_lr[i]))

    def compute_update_value(self, i, rate):
        """h = momentum*h + local_rate*diff; diff = h."""
        p = self.net.learnable_params[i]
        dt = p.data.dtype.type
        h = self.history[i]
        tmp = self.scratch(i, 0)
        backend.get_array_module(h).multiply(p.diff, self.local_rate(i, rate), out=tmp)
        h *= self.hyper("momentum", dt)
        h += tmp
        p.diff[...] = h

    # --- helpers --------------------------------------------------------------------------------
    def param_of(self, i):
        """(learnable param i, its array module, its dtype's scalar type): the prologue of every
        ``compute_update_value``."""
        p = self.net.learnable_params[i]
        return p, backend.get_array_module(p.data), p.data.dtype.type

    def hyper(self, name, dtype_type):
        """SolverParameter float ``name`` as Caffe holds it (float32), cast to the param dtype."""
        return dtype_type(lr_policy.proto_float(self.param, name))

    def scratch(self, i, k):
        """Reusable temporary k for param i (Caffe's temp_/update_ blobs), same shape/dtype/xp."""
        buf = self._scratch.get((i, k))
        if buf is None:
            data = self.net.learnable_params[i].data
            buf = backend.get_array_module(data).empty_like(data)
            self._scratch[(i, k)] = buf
        return buf

    # --- snapshot state -------------------------------------------------------------------------
    def state(self):
        """dict(iter, current_step, history=[host numpy copies, in learnable order])."""
        return {"iter": int(self.iter), "current_step": int(self.current_step),
                "history": [backend.to_numpy(h).copy() for h in self.history]}

    def restore(self, state):
        """Load ``state()`` output (or a solverstate read from HDF5) into this solver."""
        hist = state["history"]
        if len(hist) != len(self.history):
            raise SolverError(f"solver state has {len(hist)} history blobs but this {self.type} "
                              f"solver on this net needs {len(self.history)}")
        for k, (h, src) in enumerate(zip(self.history, hist)):
            src = numpy.asarray(src)
            if src.size != h.size:  # legacy 4-D shapes are accepted when the count matches
                raise SolverError(f"solver state history blob {k} has shape {src.shape}, "
                                  f"expected {tuple(h.shape)}")
            h[...] = backend.to_device(src.reshape(h.shape).astype(h.dtype), like=h)
        self.iter = int(state["iter"])
        self.current_step = int(state.get("current_step", 0))


class _Together:
    """What one C call needs to update every param of a solver at once (``_update_together``):
    each param's offset and length in the flat buffers, its lr_mult and decay_mult as Caffe
    holds them (float32, then the params' dtype)."""

    #: the methods whose NumPy sequence the C update restates: a solver that overrides one
    #: (Nesterov, Adam ...) updates param by param
    METHODS = ("compute_update_value", "normalize", "regularize", "update_param", "local_rate")

    def __init__(self, solver, dtype):
        net = solver.net
        self.dtype = dtype
        self.starts = numpy.array([sl.start for sl in net.param_slices], dtype=numpy.int64)
        self.counts = numpy.array([sl.stop - sl.start for sl in net.param_slices],
                                  dtype=numpy.int64)
        self.lr_mults = numpy.array([numpy.float32(v) for v in net.params_lr], dtype=dtype)
        self.decay_mults = numpy.array([numpy.float32(v) for v in net.params_weight_decay],
                                       dtype=dtype)

    @classmethod
    def of(cls, solver):
        """A _Together for ``solver``, or False when its update cannot run as one call."""
        cls_ = type(solver)
        net = solver.net
        if solver._flat_history is None or solver.history_sets != 1 or any(
                getattr(cls_, m) is not getattr(SGDSolver, m) for m in cls.METHODS):
            return False
        flat, diff = net.flat_data, net.flat_diff
        if type(flat) is not numpy.ndarray or not net.learnable_params:
            return False
        item = flat.itemsize
        for p, sl in zip(net.learnable_params, net.param_slices):
            for array, base in ((p.data, flat), (p.diff, diff)):
                # each param a view of its place in the flat buffers (the Net's promise)
                if not (array.flags.c_contiguous and array.size == sl.stop - sl.start and
                        array.ctypes.data == base.ctypes.data + sl.start * item):
                    return False
        return cls(solver, flat.dtype)
