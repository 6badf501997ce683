"""caffe8.io (pycaffe's caffe.io) against hand computations and hand-encoded protobuf bytes."""
import struct

import numpy
import pytest
from PIL import Image

import caffe8 as caffe
from caffe8.proto import caffe_pb2
from caffe8.engine.errors import CaffeError, DataError


def test_transformer_preprocess_and_deprocess_by_hand():
    rng = numpy.random.default_rng(0)
    img = rng.random((5, 6, 3)).astype(numpy.float32)   # H×W×K in [0, 1]
    mean = numpy.array([100.0, 110.0, 120.0])
    t = caffe.io.Transformer({"data": (1, 3, 5, 6)})
    t.set_transpose("data", (2, 0, 1))
    t.set_channel_swap("data", (2, 1, 0))
    t.set_raw_scale("data", 255)
    t.set_mean("data", mean)
    t.set_input_scale("data", 0.5)
    out = t.preprocess("data", img)
    expect = numpy.empty((3, 5, 6))
    for c in range(3):
        for y in range(5):
            for x in range(6):
                expect[c, y, x] = (img[y, x, 2 - c] * 255 - mean[c]) * 0.5
    assert out.dtype == numpy.float32
    numpy.testing.assert_allclose(out, expect, rtol=1e-5, atol=1e-4)
    numpy.testing.assert_allclose(t.deprocess("data", out), img, atol=1e-5)


def test_transformer_resizes_and_checks_its_settings():
    t = caffe.io.Transformer({"data": (1, 1, 4, 4)})
    t.set_transpose("data", (2, 0, 1))
    assert t.preprocess("data", numpy.full((2, 2, 1), 0.25)).shape == (1, 4, 4)
    with pytest.raises(CaffeError, match="not one of the net inputs"):
        t.preprocess("nope", numpy.zeros((4, 4, 1)))
    with pytest.raises(CaffeError, match="per input channel"):
        t.set_channel_swap("data", (1, 0))
    with pytest.raises(CaffeError, match="mean values"):
        t.set_mean("data", numpy.zeros(3))
    t.set_mean("data", numpy.arange(4.0).reshape(1, 2, 2))   # an image mean, resized to 4×4
    assert t.mean["data"].shape == (1, 4, 4)


def test_resize_image_bilinear_centres():
    """pycaffe's formula: scale to [0, 1], scikit-image's resize (mode='constant': pixel
    centres aligned, zeros beyond the edges), scale back."""
    im = numpy.array([[0.0, 1.0]], dtype=numpy.float32).reshape(1, 2, 1)
    out = caffe.io.resize_image(im, (1, 4))
    # centres of 4 pixels over 2: source x = (i + 1/2)/2 − 1/2 = −¼, ¼, ¾, 1¼; beyond x = 1
    # the zero of mode 'constant' blends in: 1·¾ + 0·¼
    numpy.testing.assert_allclose(out[0, :, 0], [0.0, 0.25, 0.75, 0.75], atol=1e-6)
    shifted = caffe.io.resize_image(im * 4 + 2, (1, 4))   # the [0, 1] scaling around it
    numpy.testing.assert_allclose(shifted, out * 4 + 2, atol=1e-6)
    const = caffe.io.resize_image(numpy.full((3, 3, 3), 0.7), (5, 2))
    assert const.shape == (5, 2, 3) and numpy.all(const == numpy.float32(0.7))
    four = numpy.arange(2 * 2 * 4, dtype=numpy.float32).reshape(2, 2, 4)  # scipy's zoom path:
    numpy.testing.assert_allclose(caffe.io.resize_image(four, (3, 3))[1, 1],   # corners aligned
                                  four.mean(axis=(0, 1)), atol=1e-5)


def test_resize_image_equals_pycaffes_with_scikit_image():
    """BVLC's io.resize_image, run with scikit-image where it is installed, to 1e-6."""
    resize = pytest.importorskip("skimage.transform").resize
    rng = numpy.random.default_rng(3)

    def pycaffe_resize(im, new_dims, interp_order=1):   # BVLC python/caffe/io.py, K in {1, 3}
        im_min, im_max = im.min(), im.max()
        im_std = (im - im_min) / (im_max - im_min)
        resized_std = resize(im_std, new_dims, order=interp_order, mode="constant")
        return (resized_std * (im_max - im_min) + im_min).astype(numpy.float32)

    for shape, dims in (((20, 30, 3), (7, 11)), ((5, 6, 1), (13, 9)), ((10, 10, 3), (4, 25))):
        for order in (0, 1, 2):
            im = rng.random(shape).astype(numpy.float32) * 3 - 1
            numpy.testing.assert_allclose(caffe.io.resize_image(im, dims, order),
                                          pycaffe_resize(im, dims, order), atol=1e-6)
        im8 = (rng.random(shape) * 255).astype(numpy.uint8)
        numpy.testing.assert_allclose(caffe.io.resize_image(im8, dims),
                                      pycaffe_resize(im8, dims), atol=1e-4)


def test_oversample_corners_centre_and_mirrors():
    im = numpy.arange(5 * 6 * 2, dtype=numpy.float32).reshape(5, 6, 2)
    crops = caffe.io.oversample([im, im + 1], (3, 4))
    assert crops.shape == (20, 3, 4, 2)
    expect = [im[0:3, 0:4], im[0:3, 2:6], im[2:5, 0:4], im[2:5, 2:6], im[1:4, 1:5]]
    for j, e in enumerate(expect):
        numpy.testing.assert_array_equal(crops[j], e)
        numpy.testing.assert_array_equal(crops[5 + j], e[:, ::-1])
        numpy.testing.assert_array_equal(crops[10 + j], e + 1)


def test_load_image(tmp_path):
    rgb = numpy.random.default_rng(1).integers(0, 256, (4, 5, 3), dtype=numpy.uint8)
    Image.fromarray(rgb).save(tmp_path / "c.png")
    img = caffe.io.load_image(str(tmp_path / "c.png"))
    assert img.shape == (4, 5, 3) and img.dtype == numpy.float32
    numpy.testing.assert_allclose(img, rgb / 255.0, atol=1e-7)
    grey = caffe.io.load_image(str(tmp_path / "c.png"), color=False)
    weights = numpy.array([0.2125, 0.7154, 0.0721])
    numpy.testing.assert_allclose(grey[:, :, 0], (rgb / 255.0) @ weights, atol=1e-6)
    Image.fromarray(rgb[:, :, 0]).save(tmp_path / "g.png")
    tiled = caffe.io.load_image(str(tmp_path / "g.png"))
    assert tiled.shape == (4, 5, 3) and numpy.all(tiled[:, :, 2] == tiled[:, :, 0])


def test_load_image_of_a_bad_file_is_an_ioerror_as_in_pycaffe(tmp_path):
    """pycaffe's scikit-image raises OSError (IOError) for a missing or unreadable file; a
    script's ``except IOError`` must catch caffe8's, which is also its one-line DataError."""
    import errno
    (tmp_path / "not_an_image.jpg").write_bytes(b"this is no JPEG")
    Image.fromarray(numpy.zeros((8, 8, 3), numpy.uint8)).save(tmp_path / "whole.png")
    whole = (tmp_path / "whole.png").read_bytes()
    (tmp_path / "truncated.png").write_bytes(whole[:len(whole) // 2])
    cases = {"missing.jpg": errno.ENOENT, "not_an_image.jpg": None, "truncated.png": None}
    for name, code in cases.items():
        path = str(tmp_path / name)
        try:
            caffe.io.load_image(path)
        except IOError as e:          # what a pycaffe script writes
            assert isinstance(e, DataError), type(e).__mro__
            assert str(e).startswith(f"{path}: cannot read image: "), str(e)
            assert e.errno == code, (name, e.errno)
        else:
            raise AssertionError(f"{name} loaded")


def test_blobproto_from_hand_encoded_bytes():
    # BlobProto { shape { dim: 2 dim: 1 } data: 1.5 data: -2 } as protobuf writes it
    shape = b"\x0a\x02\x02\x01"                       # BlobShape: packed dim [2, 1]
    data = struct.pack("<2f", 1.5, -2.0)
    buf = b"\x3a" + bytes([len(shape)]) + shape + b"\x2a" + bytes([len(data)]) + data
    blob = caffe_pb2.BlobProto()
    blob.ParseFromString(buf)
    arr = caffe.io.blobproto_to_array(blob)
    numpy.testing.assert_array_equal(arr, [[1.5], [-2.0]])
    again = caffe_pb2.BlobProto()
    again.ParseFromString(caffe.io.array_to_blobproto(arr).SerializeToString())
    numpy.testing.assert_array_equal(caffe.io.blobproto_to_array(again), arr)
    legacy = caffe_pb2.BlobProto()  # a mean file of old: num/channels/height/width
    legacy.num, legacy.channels, legacy.height, legacy.width = 1, 1, 1, 2
    legacy.data.extend([3.0, 4.0])
    assert caffe.io.blobproto_to_array(legacy).shape == (1, 1, 1, 2)


def test_blobproto_without_shape_is_a_scalar_or_a_value_error():
    """pycaffe reshapes a BlobProto with no shape to ``()``: one value is a scalar, more raise
    ValueError (BVLC's test_io test_no_shape / test_scalar); the diff follows the same rule."""
    blob = caffe_pb2.BlobProto()
    blob.data.extend([0.0] * 100)
    with pytest.raises(ValueError, match="no shape.*100 data values"):
        caffe.io.blobproto_to_array(blob)
    one = caffe_pb2.BlobProto()
    one.data.append(123.0)
    one.diff.extend([1.0, 2.0])
    assert caffe.io.blobproto_to_array(one).shape == () and caffe.io.blobproto_to_array(one) == 123
    with pytest.raises(ValueError, match="2 diff values"):
        caffe.io.blobproto_to_array(one, return_diff=True)
    one.shape.dim.append(2)  # a shape that the data does not fill
    with pytest.raises(ValueError, match=r"shape \(2,\) but 1 data values"):
        caffe.io.blobproto_to_array(one)
    numpy.testing.assert_array_equal(caffe.io.blobproto_to_array(one, return_diff=True), [1, 2])


def test_datum_bytes_match_protobuf():
    datum = caffe.io.array_to_datum(numpy.array([[[97, 98]]], dtype=numpy.uint8), label=3)
    # channels 1, height 1, width 2, data "ab", label 3 in field order
    assert datum.SerializeToString() == b"\x08\x01\x10\x01\x18\x02\x22\x02ab\x28\x03"
    back = caffe_pb2.Datum()
    back.ParseFromString(datum.SerializeToString())
    numpy.testing.assert_array_equal(caffe.io.datum_to_array(back), [[[97, 98]]])
    assert back.label == 3
    f = caffe.io.array_to_datum(numpy.full((2, 1, 1), 0.5))
    assert list(f.float_data) == [0.5, 0.5] and caffe.io.datum_to_array(f).shape == (2, 1, 1)
    with pytest.raises(CaffeError, match="C×H×W"):
        caffe.io.array_to_datum(numpy.zeros((2, 2)))


def test_blobprotovector_round_trip():
    arrays = [numpy.arange(6.0).reshape(2, 3), numpy.ones((1, 2, 2))]
    text = caffe.io.arraylist_to_blobprotovector_str(arrays)
    back = caffe.io.blobprotovector_str_to_arraylist(text)
    assert [b.shape for b in back] == [(2, 3), (1, 2, 2)]
    for a, b in zip(arrays, back):
        numpy.testing.assert_array_equal(a, b)
