"""Caffe's recipe for a folder-per-class image set (examples/imagenet: a ``relpath label`` list,
then ``convert_imageset`` and ``compute_image_mean``), read back by the Data layer: labels in
list order, pixels resized and BGR, the mean file the batch's mean, an encoded database decoded
to the file's own pixels."""
import numpy
from PIL import Image

from caffe8.engine.datum import read_mean_file
from tests.caffe8.tools.test_convert_imageset import inter_linear
from tests.caffe8.tools.tool_helpers import cli
from tests.data_layers.small_digits import batches, build


def make_tree(root):
    """Two classes of small colour images of different sizes; returns {relpath: RGB array}."""
    rng = numpy.random.default_rng(4)
    images = {}
    for cls, sizes in (("n02", [(6, 5), (7, 4)]), ("n01", [(5, 6)])):
        (root / cls).mkdir(parents=True)
        for k, (h, w) in enumerate(sizes):
            rgb = rng.integers(0, 256, (h, w, 3)).astype(numpy.uint8)
            Image.fromarray(rgb).save(root / cls / f"{k}.png")
            images[f"{cls}/{k}.png"] = rgb
    return images


def class_list(images, path):
    """The list Caffe's recipe expects: one ``relpath label`` line an image, the label the
    class folder's position in sorted order."""
    classes = sorted({rel.split("/")[0] for rel in images})
    rels = sorted(images)
    path.write_text("".join(f"{rel} {classes.index(rel.split('/')[0])}\n" for rel in rels))
    return rels


def data_layer(db, batch):
    return build(f'name: "d" type: "Data" top: "data" top: "label" data_param {{ '
                 f'source: "{db}" backend: LMDB batch_size: {batch} }}', "TEST")


def test_resized_raw_lmdb_and_its_mean_read_by_the_data_layer(tmp_path):
    images = make_tree(tmp_path / "tree")
    rels = class_list(images, tmp_path / "train.txt")
    assert cli("convert_imageset", "-resize_height", 4, "-resize_width", 4,
               str(tmp_path / "tree") + "/", tmp_path / "train.txt", tmp_path / "db") == 0
    assert cli("compute_image_mean", tmp_path / "db", tmp_path / "mean.binaryproto") == 0
    layer, tops = data_layer(tmp_path / "db", 3)
    (data, label), = batches(layer, tops, 1)
    layer.close()
    assert rels == ["n01/0.png", "n02/0.png", "n02/1.png"] and label.tolist() == [0, 1, 1]
    for row, rel in zip(data, rels):  # Caffe's resize: OpenCV's INTER_LINEAR, BGR planes
        bgr = images[rel][..., ::-1].transpose(2, 0, 1)
        numpy.testing.assert_array_equal(row, inter_linear(bgr, 4, 4))
    numpy.testing.assert_allclose(read_mean_file(str(tmp_path / "mean.binaryproto")),
                                  data.mean(0), rtol=1e-6)


def test_encoded_lmdb_keeps_each_images_own_size_and_pixels(tmp_path):
    images = make_tree(tmp_path / "tree")
    rels = class_list(images, tmp_path / "train.txt")
    assert cli("convert_imageset", "-encoded", str(tmp_path / "tree") + "/",
               tmp_path / "train.txt", tmp_path / "db") == 0
    layer, tops = data_layer(tmp_path / "db", 1)
    (data, label), = batches(layer, tops, 1)
    layer.close()
    assert label.tolist() == [0]
    numpy.testing.assert_array_equal(data[0], images[rels[0]][..., ::-1].transpose(2, 0, 1))
