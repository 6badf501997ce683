"""Common part of the data layers (Caffe's BaseDataLayer + BasePrefetchingDataLayer).

A data layer subclass implements ``data_setup(top) -> list of top shapes`` (open the source, read
one record to learn the shapes) and ``load_batch() -> tuple of host arrays`` (the next batch, in
the layer's dtype). This class adds:

* sharding: the Net sets ``layer.rank`` / ``layer.world`` before setup; a layer keeps
  the records whose index ≡ rank (mod world) and reads the full ``batch_size`` from them, in TRAIN
  *and* TEST (caffe8 averages test results over all ranks, unlike Caffe);
* per-layer random generators seeded once from ``backend.rng()`` at setup — ``self.rng`` (crop,
  mirror) and ``self.shuffle_rng`` (epoch order, rand_skip) — so prefetching never interleaves
  with the main thread's random draws;
* the prefetch thread (``engine.prefetch``) and the copy of each batch into the top Blobs (to the
  GPU when the Blobs live there); ``decode_threads`` > 1 decodes one batch's images in parallel
  (``map_ordered``), still deterministically;
* ``get_state()`` / ``set_state(state)``: the JSON-able reader position after the last batch
  *consumed* (not merely prefetched), which the trainer stores in solver snapshots so a resumed
  run reads exactly the batches an uninterrupted one would;
* ``close()``: joins the prefetch thread (a bounded wait) and only then releases files
  (``release()``), so no reader object is used or freed on a thread that outlives the layer.
  The Net closes its data layers (``Net.close()``); dropping a layer also ends its thread.
"""
import abc
import os
from concurrent.futures import ThreadPoolExecutor

import numpy

from caffe8.engine import backend
from caffe8.engine.errors import DataError, relative_to_cwd
from caffe8.engine.glog import warning
from caffe8.engine.layer import Layer, from_shapes
from caffe8.engine.prefetch import CLOSE_TIMEOUT_S, Prefetcher


def shard(records, rank, world):
    """The records of ``rank`` out of ``world``: indices ≡ rank (mod world), order kept."""
    return records[rank::world]


def resolve_listed_path(entry, list_file):
    """A path read from a list file, as Caffe resolves it: absolute as is, relative to the
    working directory. Only when that does not exist and the same path beside the list file
    does (a convenience Caffe lacks) is that one taken, with a warning saying so."""
    if os.path.isabs(entry) or os.path.exists(entry):
        return entry
    beside = os.path.join(os.path.dirname(list_file), entry)
    if os.path.exists(beside):
        if list_file not in _BESIDE_NOTED:   # once per list, not once per entry
            _BESIDE_NOTED.add(list_file)
            warning(f"{list_file}: '{entry}' is not in the working directory {os.getcwd()}; "
                    f"reading {beside} beside the list file, and so for its other such entries "
                    "(Caffe reads paths relative to the working directory only)")
        return beside
    return entry


_BESIDE_NOTED = set()


def read_list_file(path, what):
    """Non-blank lines of a list file as (line number, stripped text) pairs."""
    if not os.path.isfile(path):
        raise DataError(f"{what} '{path}' does not exist{relative_to_cwd(path)}")
    with open(path, encoding="utf-8") as f:
        return [(n, line.strip()) for n, line in enumerate(f, 1) if line.strip()]


class BaseDataLayer(Layer):
    is_data = True
    exact_num_bottom = 0
    #: set by the Net before setup
    rank = 0
    world = 1
    #: batches prepared ahead on the prefetch thread; 0 reads inline on the calling thread
    prefetch = 4
    #: threads decoding the images of one batch (Pillow releases the GIL while decoding);
    #: 1 is Caffe's single prefetch thread. Default from the environment: CAFFE8_DATA_THREADS.
    decode_threads = int(os.environ.get("CAFFE8_DATA_THREADS", "1") or 1)

    # --- subclass hooks ------------------------------------------------------------------------
    @abc.abstractmethod
    def data_setup(self, top):
        """Open the source; return the list of top shapes."""

    @abc.abstractmethod
    def load_batch(self):
        """Read and transform the next batch (runs on the prefetch thread)."""

    @abc.abstractmethod
    def cursor_state(self):
        """JSON-able position of the reader (after the batches produced so far)."""

    @abc.abstractmethod
    def restore_cursor(self, state):
        """Go back to a position returned by ``cursor_state``."""

    # --- Layer contract ------------------------------------------------------------------------
    def layer_setup(self, bottom, top):
        self.rank, self.world = int(self.rank), int(self.world)
        if not (self.world >= 1 and 0 <= self.rank < self.world):
            raise self.error(f"invalid shard rank {self.rank} of world {self.world}")
        # one draw from the process generator, on the main thread, in layer order: reproducible.
        # Two streams, as Caffe has: crop/mirror coins, and shuffling (kept apart so that a
        # resumed run can redraw an epoch's order without replaying every transform).
        seq = numpy.random.SeedSequence(int(backend.rng().integers(1 << 63)))
        transform_seq, shuffle_seq = seq.spawn(2)
        self.rng = numpy.random.default_rng(transform_seq)
        self.shuffle_rng = numpy.random.default_rng(shuffle_seq)
        try:
            self.top_shapes = [tuple(s) for s in self.data_setup(top)]
        except DataError as e:
            if f"'{self.name}'" in str(e):
                raise
            where = self.layer_param.location()
            where = "" if where.startswith("<") else f" at {where}"  # "<memory>": not from a file
            raise DataError(f"layer '{self.name}' (type {self.type}){where}: {e}") from None
        self._consumed = self._state()
        self._prefetcher = Prefetcher(self._produce, self.name, self.prefetch)

    @from_shapes
    def reshape(self, bottom, top):
        for blob, shape in zip(top, self.top_shapes):
            blob.reshape(shape)

    def forward(self, bottom, top):
        batch, self._consumed = self._prefetcher.next()
        for blob, host in zip(top, batch):
            if blob.shape != host.shape:
                blob.reshape(host.shape)
            blob.data[...] = backend.to_device(host, like=blob.data)

    # --- exact resume (saved in solver snapshots by the trainer) -------------------------------
    def _state(self):
        return {"type": self.type, "rank": self.rank, "world": self.world,
                "rng": self.rng.bit_generator.state, **self.cursor_state()}

    def _produce(self):
        """Runs on the prefetch thread: a batch and the reader state right after it."""
        batch = self.load_batch()
        return batch, self._state()

    def get_state(self):
        """JSON-able reader state after the last batch handed to ``forward``."""
        return self._consumed

    def set_state(self, state):
        """Continue exactly after the batch at which ``state`` was taken (same data, same shard)."""
        mine = (self.type, self.rank, self.world)
        theirs = (state.get("type"), state.get("rank"), state.get("world"))
        if theirs != mine:
            raise self.error(f"saved data state is for {theirs} (type, rank, world), not {mine}")
        if not self._prefetcher.close():
            raise self.error(f"prefetch thread still busy after {CLOSE_TIMEOUT_S:g}s; "
                             "cannot restore the saved data state")
        self.rng.bit_generator.state = state["rng"]
        self.restore_cursor(state)
        self._consumed = state
        self._prefetcher = Prefetcher(self._produce, self.name, self.prefetch)

    def release(self):
        """Release files and readers; called by ``close()`` once no thread uses them."""

    def close(self, timeout=CLOSE_TIMEOUT_S):
        """Join the prefetch and decode threads (waiting up to ``timeout`` s for the batch in
        progress), then ``release()``. Returns False, releasing nothing, when the prefetch
        thread is still busy after ``timeout`` (a later call tries again); safe to call twice."""
        ended = True
        if getattr(self, "_prefetcher", None) is not None:
            ended = self._prefetcher.close(timeout)
        if not ended:
            return False
        if getattr(self, "_pool", None) is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if not getattr(self, "_released", False):
            self._released = True
            self.release()
        return True

    def map_ordered(self, fn, items):
        """``[fn(x) for x in items]``, on ``decode_threads`` threads when more than one. Results
        (and the first error) come in item order, so batches never depend on thread timing;
        ``fn`` must not draw random numbers (draw them in order beforehand)."""
        if self.decode_threads <= 1 or len(items) <= 1:
            return [fn(x) for x in items]
        if getattr(self, "_pool", None) is None:
            self._pool = ThreadPoolExecutor(self.decode_threads,
                                            thread_name_prefix=f"decode[{self.name}]")
        return list(self._pool.map(fn, items))

    # --- helpers -------------------------------------------------------------------------------
    def shard_or_fail(self, records, source):
        """This rank's share of ``records``; an error when the share is empty."""
        mine = shard(records, self.rank, self.world)
        if not mine:
            raise self.error(f"'{source}' has {len(records)} record(s): none for rank "
                             f"{self.rank} of {self.world}")
        return mine

    def batch_size_of(self, param):
        if param.batch_size <= 0:
            raise self.error(f"batch_size must be positive, got {param.batch_size}")
        return int(param.batch_size)
