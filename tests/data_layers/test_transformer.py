"""DataTransformer against hand-computed arrays and a loop transcription of Caffe's indexing."""
import numpy
import pytest

from caffe8.engine.datum import write_mean_file
from caffe8.engine.errors import DataError
from caffe8.engine.prototxt import parse_text
from caffe8.engine.transformer import DataTransformer, decode_image

F32 = numpy.float32


def tp(text):
    return parse_text(text, "<test>", "TransformationParameter")


def make(text, phase="TEST", seed=0):
    return DataTransformer(tp(text), phase, numpy.random.default_rng(seed))


def caffe_loops(x, scale, crop, h_off, w_off, mirror, mean=None, mean_values=()):
    """data_transformer.cpp's Transform(Datum) loop, element by element, in float32."""
    C, H, W = x.shape
    h_out, w_out = (crop, crop) if crop else (H, W)
    out = numpy.zeros(C * h_out * w_out, F32)
    flat = x.ravel()
    for c in range(C):
        for h in range(h_out):
            for w in range(w_out):
                data_index = (c * H + h_off + h) * W + w_off + w
                top_index = (c * h_out + h) * w_out + (w_out - 1 - w if mirror else w)
                v = F32(flat[data_index])
                if mean is not None:
                    v = F32(v - mean.ravel()[data_index])
                elif mean_values:
                    v = F32(v - F32(mean_values[c]))
                out[top_index] = F32(v * F32(scale))
    return out.reshape(C, h_out, w_out)


def test_centre_crop_mean_then_scale_by_hand():
    x = numpy.arange(16, dtype=numpy.uint8).reshape(1, 4, 4)
    y = make("crop_size: 2 mean_value: 1 scale: 0.5").transform(x)
    # centre offset (4-2)//2 = 1 → window [[5,6],[9,10]]; (v-1)*0.5
    numpy.testing.assert_array_equal(y, [[[2.0, 2.5], [4.0, 4.5]]])
    assert y.dtype == F32


def test_per_channel_mean_hwc_input_by_hand():
    hwc = numpy.array([[[10, 20, 30], [40, 50, 60]]], dtype=numpy.uint8)  # H=1, W=2, C=3
    y = make("mean_value: 1 mean_value: 2 mean_value: 3 scale: 2").transform(hwc, "HWC")
    numpy.testing.assert_array_equal(y, [[[18, 78]], [[36, 96]], [[54, 114]]])


def test_odd_centre_offset_rounds_down():
    x = numpy.arange(5 * 7, dtype=numpy.uint8).reshape(1, 5, 7)
    y = make("crop_size: 2").transform(x)
    # offsets (5-2)//2 = 1, (7-2)//2 = 2
    numpy.testing.assert_array_equal(y[0], [[9, 10], [16, 17]])


def test_mean_file_is_cropped_at_the_same_offset(tmp_path):
    rng = numpy.random.default_rng(1)
    x = rng.integers(0, 256, (3, 6, 5)).astype(numpy.uint8)
    mean = rng.normal(100, 20, (3, 6, 5)).astype(F32)
    path = str(tmp_path / "m.binaryproto")
    write_mean_file(path, mean)
    y = make(f'crop_size: 3 scale: 0.0078125 mean_file: "{path}"').transform(x)
    ref = caffe_loops(x, 0.0078125, 3, (6 - 3) // 2, (5 - 3) // 2, False, mean=mean)
    numpy.testing.assert_array_equal(y, ref)


def test_train_random_crop_and_mirror_follow_caffe_draw_order():
    x = numpy.random.default_rng(2).integers(0, 256, (2, 7, 9)).astype(numpy.uint8)
    t = make("crop_size: 4 mirror: true mean_value: 3 mean_value: 5 scale: 0.25", "TRAIN", 7)
    draws = numpy.random.default_rng(7)
    seen_offsets, mirrors = set(), 0
    for _ in range(300):
        mirror = bool(draws.integers(2))  # Caffe: Rand(2) for mirror, then h_off, then w_off
        h_off, w_off = int(draws.integers(4)), int(draws.integers(6))
        ref = caffe_loops(x, 0.25, 4, h_off, w_off, mirror, mean_values=(3, 5))
        numpy.testing.assert_array_equal(t.transform(x), ref)
        seen_offsets.add((h_off, w_off))
        mirrors += mirror
    assert len(seen_offsets) == 4 * 6  # every window is reachable
    assert 100 < mirrors < 200  # probability 1/2


def test_mirror_applies_in_test_phase_too():
    x = numpy.arange(6, dtype=numpy.uint8).reshape(1, 2, 3)
    t = make("mirror: true", "TEST", 3)
    outs = {tuple(t.transform(x).ravel()) for _ in range(50)}
    assert outs == {(0, 1, 2, 3, 4, 5), (2, 1, 0, 5, 4, 3)}


def test_float_input_and_output_buffer():
    x = numpy.linspace(-1, 1, 12, dtype=numpy.float64).reshape(3, 2, 2)
    out = numpy.empty((3, 2, 2), F32)
    make("scale: 3 mean_value: 0.5").transform(x, out=out)
    numpy.testing.assert_array_equal(out, caffe_loops(x.astype(F32), 3, 0, 0, 0, False,
                                                      mean_values=(0.5, 0.5, 0.5)))


def test_output_shape():
    assert make("crop_size: 3").output_shape((3, 8, 9)) == (3, 3, 3)
    assert make("").output_shape((1, 8, 9)) == (1, 8, 9)


@pytest.mark.parametrize("text,shape,message", [
    ("mean_value: 1 mean_value: 2", (3, 4, 4), "mean_value has 2 values"),
    ("crop_size: 5", (1, 4, 6), "crop_size 5 is larger"),
    ("force_color: true force_gray: true", (1, 2, 2), "force_color and force_gray"),
])
def test_bad_settings(text, shape, message):
    with pytest.raises(DataError, match=message):
        make(text).transform(numpy.zeros(shape, numpy.uint8))


def test_mean_file_and_mean_value_together(tmp_path):
    path = str(tmp_path / "m.binaryproto")
    write_mean_file(path, numpy.zeros((1, 2, 2), F32))
    with pytest.raises(DataError, match="mean_file and mean_value"):
        make(f'mean_file: "{path}" mean_value: 1')


def test_mean_file_shape_must_match(tmp_path):
    path = str(tmp_path / "m.binaryproto")
    write_mean_file(path, numpy.zeros((1, 3, 3), F32))
    with pytest.raises(DataError, match="m.binaryproto"):
        make(f'mean_file: "{path}"').transform(numpy.zeros((1, 4, 4), numpy.uint8))


def test_decode_image_is_bgr_and_resizes_bilinear(tmp_path):
    from PIL import Image
    rgb = numpy.zeros((4, 6, 3), numpy.uint8)
    rgb[..., 0], rgb[..., 1], rgb[..., 2] = 200, 100, 7  # R, G, B
    path = str(tmp_path / "c.png")
    Image.fromarray(rgb).save(path)
    bgr = decode_image(path, color=True)
    assert bgr.shape == (4, 6, 3) and bgr[0, 0].tolist() == [7, 100, 200]
    grey = decode_image(path, color=False)
    assert grey.shape == (4, 6, 1)
    ramp = numpy.tile(numpy.arange(0, 240, 40, dtype=numpy.uint8), (4, 1))
    Image.fromarray(ramp).save(path)
    small = decode_image(path, color=False, size=(2, 3))
    expect = numpy.asarray(Image.fromarray(ramp).resize((3, 2), Image.BILINEAR))
    numpy.testing.assert_array_equal(small[..., 0], expect)


def test_a_missing_image_names_the_working_directory_of_a_relative_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as e:
        decode_image("images/cat.jpg", where="image 'images/cat.jpg' (listed at l.txt:1)")
    assert str(e.value) == ("image 'images/cat.jpg' (listed at l.txt:1): image file not found "
                            f"(relative to the working directory {tmp_path})")
    with pytest.raises(DataError) as e:      # an absolute path needs no working directory
        decode_image(str(tmp_path / "cat.jpg"), where="image")
    assert str(e.value) == "image: image file not found"
