"""Data (LMDB of Caffe Datum records): raw, float and encoded records, errors."""
import io

import lmdb
import numpy
import pytest
from PIL import Image

from caffe8.engine.blob import Blob
from caffe8.engine.datum import encode_datum
from caffe8.engine.errors import CaffeError
from caffe8.engine.layer import create_layer
from caffe8.engine.prototxt import parse_layer
from tests.data_layers.small_digits import batches, build, layer_text, small_digits, write_all_forms


def write_lmdb(path, values):
    env = lmdb.open(str(path), map_size=1 << 24)
    with env.begin(write=True) as txn:
        for i, v in enumerate(values):
            txn.put(f"{i:08d}_x".encode(), v)
    env.close()
    return {"lmdb": str(path)}


def test_raw_records_in_key_order_and_wrap(tmp_path):
    imgs, labels = small_digits(5)
    paths = write_all_forms(tmp_path, imgs, labels)
    layer, tops = build(layer_text("Data", paths, 4))
    got = batches(layer, tops, 3)
    order = [i % 5 for i in range(12)]
    numpy.testing.assert_array_equal(numpy.concatenate([b[0] for b in got])[:, 0], imgs[order])
    numpy.testing.assert_array_equal(numpy.concatenate([b[1] for b in got]), labels[order])
    layer.close()


def test_float_data_records_and_legacy_scale(tmp_path):
    vals = numpy.arange(2 * 2 * 3, dtype=numpy.float32).reshape(2, 2, 3) - 4.5
    p = write_lmdb(tmp_path / "f", [encode_datum(2, 2, 3, None, 7, vals.ravel())])
    layer, tops = build(layer_text("Data", p, 2, extra="scale: 0.5"))  # deprecated location
    (data, label), = batches(layer, tops, 1)
    numpy.testing.assert_array_equal(data, [vals * 0.5] * 2)
    assert label.tolist() == [7, 7]


def encoded(img, fmt):
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format=fmt)
    return buf.getvalue()


def test_encoded_png_colour_is_bgr_and_force_gray(tmp_path):
    rgb = numpy.random.default_rng(0).integers(0, 256, (4, 5, 3)).astype(numpy.uint8)
    p = write_lmdb(tmp_path / "e", [encode_datum(label=3, data=encoded(rgb, "PNG"), encoded=True)])
    layer, tops = build(layer_text("Data", p, 1))
    (data, label), = batches(layer, tops, 1)
    numpy.testing.assert_array_equal(data[0], rgb[..., ::-1].transpose(2, 0, 1))
    assert label.tolist() == [3]
    layer, tops = build(layer_text("Data", p, 1, transform="force_gray: true"))
    (data, _), = batches(layer, tops, 1)
    grey = numpy.asarray(Image.fromarray(rgb).convert("L"))
    numpy.testing.assert_array_equal(data[0, 0], grey)


def test_encoded_grey_jpeg_stays_one_channel(tmp_path):
    img = small_digits(1)[0][0]
    jpg = encoded(img, "JPEG")
    p = write_lmdb(tmp_path / "j", [encode_datum(label=1, data=jpg, encoded=True)])
    layer, tops = build(layer_text("Data", p, 1))
    (data, _), = batches(layer, tops, 1)
    numpy.testing.assert_array_equal(data[0, 0], numpy.asarray(Image.open(io.BytesIO(jpg))))


def test_data_only_top(tmp_path):
    p = write_lmdb(tmp_path / "d", [encode_datum(1, 1, 1, b"\x05", 0)])
    text = (f'name: "d" type: "Data" top: "data" '
            f'data_param {{ source: "{p["lmdb"]}" backend: LMDB batch_size: 2 }}')
    layer = create_layer(parse_layer(text))
    top = [Blob()]
    layer.setup([], top)
    layer.forward([], top)
    assert top[0].data.ravel().tolist() == [5, 5]


def test_missing_leveldb_and_missing_lmdb(tmp_path):
    text = 'name: "d" type: "Data" top: "data" data_param { source: "x" batch_size: 1 }'
    with pytest.raises(CaffeError, match="LevelDB 'x' does not exist"):  # Caffe's default
        build(text)
    with pytest.raises(CaffeError, match="nodb"):
        build(layer_text("Data", {"lmdb": str(tmp_path / "nodb")}, 1))


def test_corrupt_record_names_lmdb_and_key(tmp_path):
    p = write_lmdb(tmp_path / "c", [encode_datum(1, 1, 1, b"\x05", 0), b"\x22\x09abc"])
    layer, tops = build(layer_text("Data", p, 2))
    with pytest.raises(CaffeError, match=r"'c'.*00000001_x.*runs past|c' record '00000001_x'"):
        layer.forward([], tops)
    layer.close()


def test_mean_file_with_centre_crop_in_a_layer(tmp_path):
    from caffe8.engine.datum import write_mean_file
    pix = numpy.arange(2 * 5 * 5, dtype=numpy.uint8).reshape(2, 5, 5) * 2
    mean = numpy.full((2, 5, 5), 10, numpy.float32)
    mean[1] = 20
    mean[0, 2, 2] = 0  # marks the centre: it must line up with the pixel it belongs to
    write_mean_file(str(tmp_path / "m.binaryproto"), mean)
    p = write_lmdb(tmp_path / "db", [encode_datum(2, 5, 5, pix.tobytes(), 1)])
    tp = f'crop_size: 3 mean_file: "{tmp_path}/m.binaryproto" scale: 0.5'
    layer, tops = build(layer_text("Data", p, 1, transform=tp), "TEST")
    (data, _), = batches(layer, tops, 1)
    # centre offset (5-3)//2 = 1; (pixel - mean) * 0.5 with pixel = 2 * (25c + 5h + w)
    expect = numpy.empty((2, 3, 3), numpy.float32)
    for c in range(2):
        for h in range(3):
            for w in range(3):
                expect[c, h, w] = (2 * (25 * c + 5 * (h + 1) + w + 1) - mean[c, h + 1, w + 1]) * 0.5
    numpy.testing.assert_array_equal(data[0], expect)
    assert data[0, 0, 1, 1] == 2 * (5 * 2 + 2) * 0.5  # the centre pixel met the zero mean


def test_legacy_and_new_transform_field_together_is_an_error(tmp_path):
    p = write_lmdb(tmp_path / "db", [encode_datum(1, 1, 1, b"\x01", 0)])
    with pytest.raises(CaffeError, match="scale is set both"):
        build(layer_text("Data", p, 1, transform="scale: 2", extra="scale: 3"))


def test_an_empty_lmdb_is_one_error_naming_it_not_a_cleanup_traceback(tmp_path):
    """An LMDB with no records fails in setup, before the read cursor exists; the Net's cleanup
    of the half-built layer (release) must not hide that error (it raised AttributeError)."""
    from caffe8.engine.net import Net
    from caffe8.engine.prototxt import parse_text
    path = write_lmdb(tmp_path / "empty_lmdb", [])["lmdb"]
    layer = (f'name: "d" type: "Data" top: "x" top: "y" data_param {{ source: "{path}" '
             'backend: LMDB batch_size: 2 }')
    with pytest.raises(CaffeError, match=rf"^layer 'd' \(type Data\) at n\.prototxt:1:\d+: "
                                         rf"LMDB '{path}' has 0 record\(s\)") as err:
        Net(parse_text(f"layer {{ {layer} }}", "n.prototxt"))
    assert not isinstance(err.value.__context__, AttributeError)
    half = create_layer(parse_layer(layer))  # its setup opened the LMDB, then failed
    with pytest.raises(CaffeError, match="has 0 record"):
        half.setup([], [Blob((), numpy.float32), Blob((), numpy.float32)])
    assert half.close() is True and half.db is None  # released, no AttributeError
    create_layer(parse_layer(layer)).close()  # never set up: nothing to release
