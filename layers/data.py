"""Data: Caffe Datum records from an LMDB or a LevelDB (Caffe's data_layer.cpp).

The database is read through ``engine.db`` (py-lmdb or plyvel; one cursor interface for both).
Records are read in key order and wrap around at the end (Caffe's "Restarting data prefetching
from start"). Record k (0-based, key order) belongs to rank k mod world. A Datum holds raw uint8
pixels (``data``), float pixels (``float_data``), or an encoded JPEG/PNG (``encoded: true``,
decoded with Pillow to BGR or grey — ``force_color`` / ``force_gray`` of transform_param apply).
Tops: data (N, C, H, W) and, optionally, label (N,). ``backend`` is LEVELDB (Caffe's default when
unset) or LMDB.
"""
import numpy

from caffe8.engine.datum import datum_to_array, decode_datum
from caffe8.engine.db import open_db
from caffe8.engine.errors import DataError
from caffe8.engine.layer import register_layer
from caffe8.engine.transformer import DataTransformer, decode_image, transform_param_with_legacy
from caffe8.layers.base_data import BaseDataLayer


@register_layer("Data")
class DataLayer(BaseDataLayer):
    min_top = 1
    max_top = 2
    #: the database and the read cursor, None until data_setup opens them (so that release(),
    #: which a failed setup's cleanup calls too, finds them whatever setup reached)
    db = None
    cursor = None

    def data_setup(self, top):
        p = self.layer_param.data_param
        if p.has("prefetch"):
            self.prefetch = int(p.prefetch)
        self.source = p.source
        self.batch_size = self.batch_size_of(p)
        tp = transform_param_with_legacy(self.layer_param, p)
        self.color = True if tp.force_color else (False if tp.force_gray else None)
        self.transformer = DataTransformer(tp, self.phase, self.rng, where=f"layer '{self.name}'")
        self.db = open_db(self.source, p.backend)
        self.what = f"{self.db.label} '{self.source}'"  # names the database in errors
        self.count = self.db.count
        if self.count <= self.rank:
            raise self.error(f"{self.what} has {self.count} record(s): none for rank "
                             f"{self.rank} of {self.world}")
        self.index = -1  # key-order index of the record under the cursor
        if p.rand_skip:  # skip whole records of this rank, as Caffe's rand_skip does
            for _ in range(int(self.shuffle_rng.integers(p.rand_skip))):
                self._next_record()
        # shapes from the first record of this shard, read on a separate transaction
        cur = self.db.cursor()
        try:
            cur.first()
            for _ in range(self.rank):
                cur.next()
            first = self._pixels(cur.key(), cur.value())
        finally:
            cur.close()
        self.in_shape = first[0].shape
        shape = self.transformer.output_shape(first[0].shape)
        tops = [(self.batch_size,) + shape, (self.batch_size,)]
        return tops[:len(self.layer_param.top)]

    def _next_record(self):
        """(key, value) of the next record of this rank, wrapping at the end."""
        if self.cursor is None:
            self.cursor = self.db.cursor()
        if self.index < 0 or self.index + self.world >= self.count:  # (re)start an epoch
            self.cursor.first()
            steps, self.index = self.rank, self.rank
        else:
            steps = self.world
            self.index += self.world
        for _ in range(steps):
            if not self.cursor.next():
                raise DataError(f"{self.what} ended before record {self.index} "
                                f"(it reported {self.count} entries)")
        return self.cursor.key(), self.cursor.value()

    def cursor_state(self):
        key = self.cursor.key().hex() if self.index >= 0 else None
        return {"index": self.index, "key": key}

    def restore_cursor(self, state):
        self.index = int(state["index"])
        if self.index < 0:
            return
        if self.cursor is None:
            self.cursor = self.db.cursor()
        if not self.cursor.seek(bytes.fromhex(state["key"])):
            raise DataError(f"{self.what} no longer holds record "
                            f"{bytes.fromhex(state['key'])!r} of the saved data state")

    def _pixels(self, key, value):
        """(C×H×W array, label) of one record; errors name the database and the key."""
        where = f"{self.what} record {key.decode(errors='replace')!r}"
        d = decode_datum(value, where)
        if d.encoded:
            hwc = decode_image(d.data, color=self.color, where=where)
            return hwc.transpose(2, 0, 1), d.label
        return datum_to_array(d, where), d.label

    def load_batch(self):
        data = numpy.empty(self.top_shapes[0], dtype=self.dtype)
        label = numpy.empty((self.batch_size,), dtype=self.dtype)
        jobs = []
        for i in range(self.batch_size):  # cursor and random draws in record order
            key, value = self._next_record()
            jobs.append((i, key, value, self.transformer.draw(*self.in_shape[1:])))
        for i, lab in enumerate(self.map_ordered(lambda job: self._decode_into(data, *job), jobs)):
            label[i] = lab
        return (data, label)[:len(self.top_shapes)]

    def _decode_into(self, data, i, key, value, choices):
        pixels, lab = self._pixels(key, value)
        if pixels.shape != self.in_shape:
            raise DataError(f"{self.what} record {key.decode(errors='replace')!r} "
                            f"is {pixels.shape} (C×H×W) but the batch is {self.in_shape}")
        self.transformer.transform(pixels, "CHW", out=data[i], choices=choices)
        return lab

    def release(self):
        if self.cursor is not None:
            self.cursor.close()
            self.cursor = None
        if self.db is not None:
            self.db.release()
            self.db = None
