"""Net: Caffe's net.cpp — builds the layer graph from a NetParameter and runs forward/backward.

Building (``Net.__init__``), in Caffe's order:
  1. FilterNet by phase/level/stages, legacy inputs → Input layer, Split insertion
     (``engine.net_graph``);
  2. per layer: wire bottoms/tops (in-place tops reuse the bottom's Blob), set up the layer,
     record loss weights, decide which bottoms/params need a gradient (lr_mult, propagate_down);
  3. backward pruning from the weighted tops, then force_backward;
  4. named parameter sharing (data and diff), learnable params in Caffe's order;
  5. every owned learnable param moves into one contiguous buffer (``flat_data``/``flat_diff``),
     each Blob rebound as a view, so the exchange reads a layer's gradients as one slice.

Loss: ``sum over weighted tops of w * sum(top.data)``; before backward each weighted top's diff is
filled with ``w`` (Caffe's SetLossWeights), which is where backward starts.
"""
import os
from collections import OrderedDict

import numpy

from caffe8.engine import backend, model_io, net_hdf5
from caffe8.engine.blob import Blob
from caffe8.engine.errors import CaffeError, LayerError
from caffe8.engine.layer import blob_shapes, check_layer_types, create_layer
from caffe8.engine.net_graph import filter_net, insert_splits, upgrade_net_input
from caffe8.engine.message import paused_gc
from caffe8.engine.prototxt import Message, parse_file, to_text
from caffe8.engine.validate import validate

#: Caffe's Phase enum: pycaffe passes the integers (caffe.TRAIN = 0, caffe.TEST = 1)
PHASES = ("TRAIN", "TEST")
#: bytes between the starts of two parameters in the flat buffers: cuDNN and cuBLAS then get
#: pointers aligned as cudaMalloc's own (256), whatever the sizes of the parameters before
PARAM_ALIGN = 256
#: the setup log shows the parameters and the per-layer lines of this many layers; a larger
#: net (a generated tower of 700,000 layers would log 21 million lines) gets one line for the
#: rest instead
LOG_LAYERS = 1000


def phase_name(phase):
    """"TRAIN" / "TEST" from a phase given as its name or as Caffe's enum integer (0 / 1)."""
    if isinstance(phase, str) and phase.upper() in PHASES:
        return phase.upper()
    if isinstance(phase, (int, numpy.integer)) and not isinstance(phase, bool) and 0 <= phase < 2:
        return PHASES[int(phase)]
    raise CaffeError(f"phase must be TRAIN or TEST (or Caffe's integers 0 / 1), got {phase!r}")


class Net:
    """A Caffe net; see the module docstring and docs/ARCHITECTURE.md for the attributes."""

    @paused_gc()
    def __init__(self, model, phase="TRAIN", weights=None, level=None, stages=(),
                 dtype=numpy.float32, rank=0, world=1, log=None):
        parsed = isinstance(model, (str, os.PathLike))  # then the message is ours: no copy
        param = parse_file(model) if parsed else validate(model)
        phase = self.phase = phase_name(phase)
        self.dtype = numpy.dtype(dtype)
        self.rank, self.world = rank, world
        self._log = log
        # as Caffe's Net(file, phase, level, stages): the file's NetState stages plus ours; the
        # level is ours when given, else the file's (what a solver's train_state/test_state sets)
        stages = list(param.state.stage) + list(stages)
        level = param.state.level if level is None else level
        param = filter_net(param, phase, level, stages, copy=not parsed)  # ours to change
        if param.input or param.input_shape or param.input_dim:
            param = upgrade_net_input(param)
        if not param.layer:  # an empty file, or only comments: nothing to run
            raise CaffeError(f"{param.location()}: net '{param.name}' has no layers "
                             f"(in phase {phase}); a net needs at least one")
        check_layer_types(param.layer)  # before the log: a misspelt type is the one line shown
        self.param = insert_splits(param)
        self.name = self.param.name
        self._forward_hooks, self._backward_hooks = [], []
        self._before_forward_hooks, self._before_backward_hooks = [], []  # pycaffe's before_*
        if self._log:
            self._log_parameters()
        self._memory_used = 0
        self.layers = []
        self.forwards = 0             # forward passes run (forward_from_to calls)
        self._pending_checks = []     # the layers' deferred checks of device data (defer_check)
        try:
            self._build(weights)
        except BaseException:
            try:
                self.close()  # the data layers built so far hold files (and maybe threads)
            except Exception:  # noqa: BLE001  a layer whose setup failed half-way: the
                pass           # build's own error is the one to report
            raise

    def _build(self, weights):
        self._build_layers()
        self._prune_backward()
        if self.param.force_backward:
            self._force_backward()
        if self._log:
            self._log_setup_end()
        self._collect_params()
        self._flatten_params()
        if weights is not None:
            self.copy_trained_layers_from(weights)

    # --- lifetime ------------------------------------------------------------------------------
    def close(self, timeout=None):
        """Close every layer that holds threads or files (the data layers): their prefetch
        threads are joined (each waits up to ``timeout`` s, the layer's default when None)
        before their files are released. Returns the names of layers whose thread was still
        busy (their files are left open); safe to call twice, and the net cannot run after."""
        busy = []
        for layer in self.layers:
            close = getattr(layer, "close", None)
            if close is None:
                continue
            ended = close() if timeout is None else close(timeout)
            if ended is False:
                busy.append(layer.name)
        return busy

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # --- building ------------------------------------------------------------------------------
    def _build_layers(self):
        self.layers, self.layer_names = [], []
        self.blobs = OrderedDict()
        self.bottom_vecs, self.top_vecs = [], []
        self.bottom_names, self.top_names = [], []
        self.bottom_need_backward, self.layer_need_backward = [], []
        self.layer_loss_weights = []            # per layer: weight of each top
        self._blob_need_backward = {}           # blob name → needs a gradient
        self._producer = {}                     # blob name → name of the layer that made it
        available = OrderedDict()               # produced and not yet consumed (→ outputs)
        # Caffe does not require unique layer names (BVLC's mnist_autoencoder has two "loss"
        # layers); lookups by name take the first layer of that name, as Caffe's do.
        for layer_param in self.param.layer:
            self._build_layer(layer_param, available)
        self.output_blob_names = sorted(available)
        self.blob_loss_weights = OrderedDict()
        for i, names in enumerate(self.top_names):
            for name, w in zip(names, self.layer_loss_weights[i]):
                if w:
                    self.blob_loss_weights[name] = w
        # per layer, its weighted tops as (blob, weight): what each pass sums and seeds
        self._weighted_tops = [[(blob, w) for blob, w in zip(top, weights) if w]
                               for top, weights in zip(self.top_vecs, self.layer_loss_weights)]

    def _build_layer(self, layer_param, available):
        if not layer_param.has("phase"):
            layer_param.phase = self.phase
        layer = create_layer(layer_param, self.phase, self.dtype)
        layer.check_sink = self._pending_checks
        i = len(self.layers)
        self.layers.append(layer)
        self.layer_names.append(layer.name)
        bottoms = list(layer_param.bottom)
        prop = list(layer_param.propagate_down)
        if prop and len(prop) != len(bottoms):
            raise LayerError(layer.name, f"propagate_down must be given 0 or {len(bottoms)} "
                             f"times, got {len(prop)} (at {layer_param.location('propagate_down')})")
        need_backward = False
        bottom_vec, bottom_need = [], []
        for j, name in enumerate(bottoms):
            if name not in self.blobs:
                raise LayerError(layer.name, f"unknown bottom blob '{name}' "
                                 f"(at {layer_param.location('bottom')})")
            bottom_vec.append(self.blobs[name])
            bottom_need.append(bool(prop[j]) if prop else self._blob_need_backward[name])
            need_backward |= self._blob_need_backward[name]
            available.pop(name, None)
        top_vec = [self._append_top(layer, layer_param, j, name, bottoms, available)
                   for j, name in enumerate(layer_param.top)]
        top_names = list(layer_param.top)
        if layer.auto_top_blobs:
            # anonymous, as in Caffe: no other layer can use them and they are not net outputs
            needed = max(layer.min_top or 0, layer.exact_num_top or 0)
            for _ in range(len(top_vec), needed):
                top_vec.append(Blob((), self.dtype))
                top_names.append("(automatic)")
        if layer.is_data:
            layer.rank, layer.world = self.rank, self.world
        shown = self._log and i < LOG_LAYERS
        if self._log and i == LOG_LAYERS:
            self._log(f"... the setup of layers {LOG_LAYERS + 1} to {len(self.param.layer)} is "
                      f"not logged layer by layer (the log shows the first {LOG_LAYERS})")
        if shown:  # layer_factory's line, then net.cpp's (one write: 100,000-layer nets)
            self._log("\n".join([f"Creating layer {layer.name}", f"Creating Layer {layer.name}"]
                                + [f"{layer.name} <- {name}" for name in bottoms]
                                + [f"{layer.name} -> {name}" for name in layer_param.top]
                                + [f"Setting up {layer.name}"]))
        self._setup_layer(layer, bottom_vec, top_vec)
        self.layer_loss_weights.append(self._loss_weights(layer, layer_param, top_vec))
        need_backward |= self._param_needs(layer, layer_param)
        self.bottom_vecs.append(bottom_vec)
        self.top_vecs.append(top_vec)
        self.bottom_names.append(bottoms)
        self.top_names.append(top_names)
        self.bottom_need_backward.append(bottom_need)
        self.layer_need_backward.append(need_backward)
        for name in layer_param.top:
            self._blob_need_backward[name] = self._blob_need_backward.get(name, False) or need_backward
        if self._log:  # Caffe's setup section, so a Caffe user reads the shapes as usual
            self._memory_used += sum(blob.count for blob in top_vec[:len(layer_param.top)])
        if shown:
            lines = [f"Top shape: {''.join(f'{d} ' for d in blob.shape)}({blob.count})"
                     for blob in top_vec[:len(layer_param.top)]]  # Blob::shape_string
            lines.append(f"Memory required for data: {self._memory_used * self.dtype.itemsize}")
            self._log("\n".join(lines))
        return i

    def _log_parameters(self):
        """Caffe's "Initializing net from parameters" with the net's text (its first
        ``LOG_LAYERS`` layers and a count of the rest, for a larger net)."""
        layers = self.param.layer
        if len(layers) <= LOG_LAYERS:
            self._log("Initializing net from parameters: \n" + to_text(self.param))
            return
        self.param.layer = layers[:LOG_LAYERS]  # the text of the first ones, then put back
        try:
            text = to_text(self.param)
        finally:
            self.param.layer = layers
        self._log(f"Initializing net from parameters: \n{text}\n... and {len(layers) - LOG_LAYERS} "
                  "more layers")

    def _log_setup_end(self):
        """Caffe's closing lines of Net::Init: backward needs (last layer first; for a net of
        more than ``LOG_LAYERS`` layers a count of those not shown), outputs."""
        n = len(self.layers)
        if n > LOG_LAYERS:
            needs = sum(self.layer_need_backward[LOG_LAYERS:])
            self._log(f"... of layers {LOG_LAYERS + 1} to {n}, {needs} need backward "
                      "computation")
        for i in reversed(range(min(n, LOG_LAYERS))):
            need = "needs" if self.layer_need_backward[i] else "does not need"
            self._log(f"{self.layer_names[i]} {need} backward computation.")
        for name in self.output_blob_names:
            self._log(f"This network produces output {name}")
        self._log("Network initialization done.")

    def _append_top(self, layer, layer_param, j, name, bottoms, available):
        if j < len(bottoms) and bottoms[j] == name:
            blob = self.blobs[name]  # in place: the same Blob
        elif name in self.blobs:
            raise LayerError(layer.name, f"top blob '{name}' produced by multiple sources "
                             f"(already produced by layer '{self._producer[name]}'; at "
                             f"{layer_param.location('top')})", layer.type)
        else:
            blob = Blob((), self.dtype)
            self.blobs[name] = blob
            self._blob_need_backward[name] = False
        self._producer[name] = layer.name
        available[name] = True
        return blob

    def _setup_layer(self, layer, bottom_vec, top_vec):
        def where():  # the layer's place in its file (None when not read from one)
            place = layer.layer_param.location()
            return None if place.startswith("<") else place
        try:
            layer.setup(bottom_vec, top_vec)
        except LayerError as e:
            if e.layer_name != layer.name:
                raise
            raise e.at(where()) from e.__cause__
        except CaffeError:
            raise
        except Exception as e:  # a layer's own shape check failing deep inside NumPy
            raise LayerError(layer.name, f"setup failed: {type(e).__name__}: {e}",
                             layer.type, where()) from e

    def _loss_weights(self, layer, layer_param, top_vec):
        given = list(layer_param.loss_weight)
        if given and len(given) != len(top_vec):
            raise LayerError(layer.name, f"loss_weight must be unspecified or given once per top "
                             f"blob ({len(top_vec)} tops, {len(given)} loss_weight; at "
                             f"{layer_param.location('loss_weight')})", layer.type)
        if not given:
            given = [layer.default_loss_weight] + [0.0] * (len(top_vec) - 1) if top_vec else []
        return [float(w) for w in given]

    def _param_needs(self, layer, layer_param):
        """Set param_propagate_down from lr_mult; True when some param learns."""
        specs = list(layer_param.param)
        if len(specs) > len(layer.blobs):
            raise LayerError(layer.name, f"too many params specified: {len(specs)} param blocks "
                             f"for {len(layer.blobs)} parameter blob(s) (at "
                             f"{layer_param.location('param')})", layer.type)
        if len(layer.param_propagate_down) != len(layer.blobs):
            layer.param_propagate_down = [True] * len(layer.blobs)
        any_needs = False
        for k in range(len(layer.blobs)):
            lr = specs[k].lr_mult if k < len(specs) else 1.0
            layer.param_propagate_down[k] = lr != 0
            any_needs |= lr != 0
        return any_needs

    def _prune_backward(self):
        """Caffe: a layer backprops only if it contributes to a loss and something needs it."""
        under_loss, skip_backp = set(), set()
        for i in reversed(range(len(self.layers))):
            contributes, skip_prop = False, True
            for name, w in zip(self.top_names[i], self.layer_loss_weights[i]):
                if w or name in under_loss:
                    contributes = True
                if name not in skip_backp:
                    skip_prop = False
                if contributes and not skip_prop:
                    break
            if self.layer_need_backward[i] and skip_prop:
                self.layer_need_backward[i] = False
                self.bottom_need_backward[i] = [False] * len(self.bottom_names[i])
            if not contributes:
                self.layer_need_backward[i] = False
            for j, name in enumerate(self.bottom_names[i]):
                if contributes:
                    under_loss.add(name)
                else:
                    self.bottom_need_backward[i][j] = False
                if not self.bottom_need_backward[i][j]:
                    skip_backp.add(name)

    def _force_backward(self):
        for i, layer in enumerate(self.layers):
            self.layer_need_backward[i] = True
            for j in range(len(self.bottom_names[i])):
                self.bottom_need_backward[i][j] = (self.bottom_need_backward[i][j]
                                                   or layer.allow_force_backward(j))
            layer.param_propagate_down = [True] * len(layer.blobs)

    # --- parameters ----------------------------------------------------------------------------
    def _collect_params(self):
        """Caffe's AppendParam + ShareWeights bookkeeping (owners, learnable order, lr/decay)."""
        self.params = OrderedDict()
        self.learnable_params, self.params_lr, self.params_weight_decay = [], [], []
        self.param_owners = []          # per net param: (layer, index) of its owner, or None
        self.param_layer_indices = []   # per net param: (layer index, param index)
        self._owner_by_name = {}        # param name → index into param_layer_indices
        self.learnable_param_ids = []   # per net param: index into learnable_params (Caffe's)
        self._lr_given, self._decay_given = [], []
        for i, layer in enumerate(self.layers):
            if layer.blobs:
                self.params[layer.name] = list(layer.blobs)
            specs = list(self.param.layer[i].param)
            for k in range(len(layer.blobs)):
                spec = specs[k] if k < len(specs) else Message("ParamSpec")
                self._append_param(i, k, spec)

    def _append_param(self, i, k, spec):
        net_id = len(self.param_layer_indices)
        self.param_layer_indices.append((i, k))
        name = spec.name
        if not name or name not in self._owner_by_name:
            if name:
                self._owner_by_name[name] = net_id
            self.param_owners.append(None)
            self.learnable_param_ids.append(len(self.learnable_params))
            self.learnable_params.append(self.layers[i].blobs[k])
            self.params_lr.append(float(spec.lr_mult))
            self.params_weight_decay.append(float(spec.decay_mult))
            self._lr_given.append(spec.has("lr_mult"))
            self._decay_given.append(spec.has("decay_mult"))
            return
        owner_i, owner_k = self.param_layer_indices[self._owner_by_name[name]]
        self._check_share(i, k, owner_i, owner_k, spec)
        self.param_owners.append((owner_i, owner_k))
        learn_id = self.learnable_param_ids[self._owner_by_name[name]]
        self.learnable_param_ids.append(learn_id)
        for field, values, given in (("lr_mult", self.params_lr, self._lr_given),
                                     ("decay_mult", self.params_weight_decay, self._decay_given)):
            if not spec.has(field):
                continue
            value = float(getattr(spec, field))
            if given[learn_id] and values[learn_id] != value:
                raise LayerError(self.layer_names[i], f"shared param '{name}' has mismatched "
                                 f"{field} ({value} here, {values[learn_id]} in owner layer "
                                 f"'{self.layer_names[owner_i]}')",
                                 location=self.param.layer[i].location("param"))
            values[learn_id], given[learn_id] = value, True

    def check_unique_param_layer_names(self, why):
        """Raise, naming where both are defined, when two layers that hold params share a name
        (Caffe allows it; ``why`` says what needs the names unique, e.g. the HDF5 format)."""
        seen = {}
        for i, layer in enumerate(self.layers):
            if not layer.blobs:
                continue
            where = self.param.layer[i].location()
            if layer.name in seen:
                raise LayerError(layer.name, f"a second layer of this name holds params (the "
                                 f"first is at {seen[layer.name]}); {why}", location=where)
            seen[layer.name] = where

    def _check_share(self, i, k, owner_i, owner_k, spec):
        mine, owner = self.layers[i].blobs[k], self.layers[owner_i].blobs[owner_k]
        what = (f"cannot share param '{spec.name}' owned by layer '{self.layer_names[owner_i]}' "
                f"with layer '{self.layer_names[i]}'")
        where = self.param.layer[i].location("param")
        if spec.share_mode == "PERMISSIVE":
            if mine.count != owner.count:
                raise LayerError(self.layer_names[i], f"{what}; count mismatch: owner shape "
                                 f"{owner.shape}, this shape {mine.shape}", location=where)
        elif mine.shape != owner.shape:
            raise LayerError(self.layer_names[i], f"{what}; shape mismatch: owner shape "
                             f"{owner.shape}, this shape {mine.shape}", location=where)

    def _flatten_params(self):
        """Move owned learnable params into flat_data/flat_diff (learnable order) as views, each
        starting on a PARAM_ALIGN-byte boundary (zero gaps between them: never exchanged, never
        updated, since the exchange and the solvers go by ``param_slices``)."""
        step = max(1, PARAM_ALIGN // numpy.dtype(self.dtype).itemsize)
        starts = []
        total = 0
        for b in self.learnable_params:
            starts.append(-(-total // step) * step)
            total = starts[-1] + b.count
        for i, k in self.param_layer_indices:
            if self.layers[i].blobs[k].dtype != self.dtype:
                raise LayerError(self.layer_names[i], f"param {k} has dtype "
                                 f"{self.layers[i].blobs[k].dtype} in a {self.dtype} net")
        xp = (backend.get_array_module(self.learnable_params[0].data)
              if self.learnable_params else backend.xp)
        self.flat_data = xp.zeros(total, dtype=self.dtype)
        self.flat_diff = xp.zeros(total, dtype=self.dtype)
        self.param_slices = []  # per learnable param: slice into the flat buffers
        for b, start in zip(self.learnable_params, starts):
            sl = slice(start, start + b.count)
            b.set_storage(self.flat_data[sl].reshape(b.shape), self.flat_diff[sl].reshape(b.shape))
            self.param_slices.append(sl)
        self.layer_param_slices = OrderedDict((i, []) for i in range(len(self.layers)))
        for net_id, (i, k) in enumerate(self.param_layer_indices):
            owner = self.param_owners[net_id]
            blob = self.layers[i].blobs[k]
            if owner is None:
                sl = self.param_slices[self.learnable_param_ids[net_id]]
                self.layer_param_slices[i].append((k, sl))
            else:  # Caffe's ShareData + ShareDiff: the owner's memory under this blob's shape
                src = self.layers[owner[0]].blobs[owner[1]]
                blob.data = src.data.reshape(blob.shape)
                blob.diff = src.diff.reshape(blob.shape)
        # owned params that their layer's forward writes (BatchNorm's running statistics)
        self.forward_state_slices = [
            self.param_slices[self.learnable_param_ids[net_id]]
            for net_id, (i, k) in enumerate(self.param_layer_indices)
            if self.param_owners[net_id] is None and k in self.layers[i].forward_state_blobs]

    # --- running -------------------------------------------------------------------------------
    def add_forward_hook(self, fn):
        """``fn(layer_index, layer)`` runs right after each layer's forward."""
        self._forward_hooks.append(fn)

    def add_before_hooks(self, forward=None, backward=None):
        """``fn(layer_index, layer)`` runs right before each layer's reshape + forward
        (``forward``), or before each layer's backward step, for every layer (``backward``)."""
        if forward is not None:
            self._before_forward_hooks.append(forward)
        if backward is not None:
            self._before_backward_hooks.append(backward)

    def add_backward_hook(self, fn):
        """``fn(layer_index, layer)`` runs after each layer's backward step, in reverse layer
        order, for every layer (also those that skip backward, as Caffe's after_backward)."""
        self._backward_hooks.append(fn)

    def forward_loss(self, as_float=True):
        """Run every layer's reshape + forward; return the weighted loss: a Python float, or with
        ``as_float=False`` the float64 0-d array on the layers' device (0.0 without weighted tops).

        The sum stays on the device while the layers run (a ``float()`` per loss layer would stall
        the GPU queue once per layer); only a caller that needs the number reads it back, once:
        ``self.loss`` converts on first access and keeps the float.
        """
        return self.forward_from_to(0, len(self.layers) - 1, as_float)

    def _layer_range(self, start, end):
        n = len(self.layers)
        for what, i in (("start", start), ("end", end)):
            if not 0 <= i < n:
                raise CaffeError(f"{what} layer index {i} is out of range (the net has {n} layers)")

    def forward_from_to(self, start, end, as_float=True):
        """Caffe's ForwardFromTo: reshape + forward layers ``start``..``end`` (inclusive); the
        weighted loss of the tops produced in that range (as :meth:`forward_loss`)."""
        if self.layers:
            self._layer_range(start, end)
        self.run_pending_checks()
        self.forwards += 1
        loss = 0.0
        before, after = self._before_forward_hooks, self._forward_hooks
        layers, bottoms, tops, weighted = (self.layers, self.bottom_vecs, self.top_vecs,
                                           self._weighted_tops)
        for i in range(start, end + 1):
            layer, bottom, top = layers[i], bottoms[i], tops[i]
            for fn in before:
                fn(i, layer)
            seen = layer.shapes_seen
            if seen is None or seen != blob_shapes(bottom, top) or \
                    not getattr(layer.reshape, "from_shapes", False):
                self._reshape(layer, bottom, top)
            layer.forward(bottom, top)
            for blob in top:
                blob.touch()
            for blob, w in weighted[i]:
                loss = loss + w * blob.data.sum(dtype=numpy.float64)
            for fn in after:
                fn(i, layer)
        self._loss = loss
        return self.loss if as_float else loss

    @property
    def loss(self):
        """The last forward's weighted loss as a Python float (one device read, then cached)."""
        if type(self._loss) is not float:
            self._loss = float(self._loss)
        self.run_pending_checks()
        return self._loss

    def run_pending_checks(self):
        """Run the checks the layers left for later (``Layer.defer_check``: values on the
        device, read once the device has them); the first that fails raises."""
        checks = self._pending_checks
        while checks:
            checks.pop(0)()

    @staticmethod
    def _reshape(layer, bottom, top):
        try:
            layer.reshape(bottom, top)
        except CaffeError:
            raise
        except Exception as e:  # e.g. a data batch of another shape reaching a fixed layer
            raise LayerError(layer.name, f"reshape failed: {type(e).__name__}: {e}",
                             layer.type) from e

    def forward(self):
        """Forward pass; returns {output blob name: data array} (pycaffe's ``net.forward()``)."""
        self.forward_loss()
        return OrderedDict((n, self.blobs[n].data) for n in self.output_blob_names)

    def backward(self):
        """Backward pass from the weighted tops; param diffs accumulate."""
        self.seed_loss_diffs()
        self.backward_from_to(len(self.layers) - 1, 0)

    def seed_loss_diffs(self):
        """Each weighted top's diff = its loss weight (Caffe sets it once, in SetLossWeights)."""
        for weighted in self._weighted_tops:
            for blob, w in weighted:
                blob.diff[...] = w

    def backward_from_to(self, start, end):
        """Caffe's BackwardFromTo: backward layers ``start`` down to ``end`` (inclusive), from
        the top diffs as they stand (see :meth:`seed_loss_diffs`)."""
        if self.layers:
            self._layer_range(start, end)
        before, after = self._before_backward_hooks, self._backward_hooks
        layers, need, bottoms, tops, down = (self.layers, self.layer_need_backward,
                                             self.bottom_vecs, self.top_vecs,
                                             self.bottom_need_backward)
        for i in range(start, end - 1, -1):
            layer = layers[i]
            for fn in before:
                fn(i, layer)
            if need[i]:
                layer.backward(tops[i], down[i], bottoms[i])
            for fn in after:
                fn(i, layer)

    def keep_forward_work(self, on):
        """Tell the layers whether their bottoms stay as forward left them until their backward
        (``Layer.forward_work_kept``). The trainer turns it on for its forward + backward; pycaffe's
        separate ``forward()`` / ``backward()`` leave it off, as a user may change a blob between
        them. Within one forward + backward no layer writes a blob that a layer before it read:
        an in-place layer must take the latest producer's blob, and a blob read twice goes
        through a Split whose tops cannot be named in place (Caffe's rules, ``engine.net_graph``)."""
        for layer in self.layers:
            layer.forward_work_kept = bool(on)

    def forward_backward(self, as_float=True):
        """Forward then backward; returns the loss (as ``forward_loss(as_float)``)."""
        loss = self.forward_loss(as_float)
        self.backward()
        return loss

    def clear_param_diffs(self):
        self.flat_diff[...] = 0

    # --- sharing and files ---------------------------------------------------------------------
    def share_trained_layers_with(self, other):
        """Use ``other``'s parameter data (not diff) for layers of the same name (test nets)."""
        # Caffe's ShareTrainedLayersWith: each source layer goes to the first layer of its name
        targets = {}
        for layer in self.layers:
            targets.setdefault(layer.name, layer)
        for src in other.layers:
            layer = targets.get(src.name)
            if layer is None:
                continue
            if len(src.blobs) != len(layer.blobs):
                raise LayerError(layer.name, f"incompatible number of blobs: {len(src.blobs)} in "
                                 f"the source net, {len(layer.blobs)} here"
                                 f"{other.name_used_twice(src.name)}")
            for k, (mine, s) in enumerate(zip(layer.blobs, src.blobs)):
                if mine.shape != s.shape:
                    raise LayerError(layer.name, f"cannot share param {k}: source shape "
                                     f"{s.shape}, target shape {mine.shape}"
                                     f"{other.name_used_twice(src.name)}")
                mine.data = s.data

    def name_used_twice(self, name):
        """``"; the layer name 'x' is used 2 times (f:3:1, f:9:1) ..."`` when several layers of
        this net share ``name`` (Caffe allows it, but weights go by name), else ""."""
        places = [layer.layer_param.location() for layer in self.layers if layer.name == name]
        if len(places) < 2:
            return ""
        return (f"; the layer name '{name}' is used {len(places)} times ({', '.join(places)}) "
                "and weights are matched by name: give each layer its own")

    def owns_param(self, i, k):
        """True unless param ``k`` of layer ``i`` is shared from another layer's param."""
        return self.param_owners[self.param_layer_indices.index((i, k))] is None

    def copy_trained_layers_from(self, path):
        """Load trained params by layer name from a binary ``.caffemodel`` or an HDF5 ``.h5``
        model (``engine.model_io.load_weights``)."""
        model_io.load_weights(self, path)

    def to_hdf5(self, path, write_diff=False):
        """Write Caffe's HDF5 model layout (``engine.net_hdf5``)."""
        net_hdf5.write_model(self, path, write_diff)

    def to_proto(self, write_diff=False):
        """Caffe's ``Net::ToProto``: a caffe_pb2.NetParameter with every layer's blobs."""
        return model_io.net_to_proto(self, write_diff)
