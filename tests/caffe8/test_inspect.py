"""Data layer shapes read from the layers' own parameters (inspect without the data files)."""
import pytest

from caffe8.tools.inspect import data_shapes
from caffe8.engine.prototxt import parse_layer


@pytest.mark.parametrize("text, shapes", [
    ('type: "Data" top: "d" top: "l" data_param { batch_size: 8 } '
     'transform_param { crop_size: 5 mean_value: 1 mean_value: 2 mean_value: 3 }',
     {"d": (8, 3, 5, 5), "l": (8,)}),
    ('type: "Data" top: "d" data_param { batch_size: 8 crop_size: 4 } '
     'transform_param { force_gray: true }', {"d": (8, 1, 4, 4)}),
    ('type: "Data" top: "d" top: "l" data_param { batch_size: 8 } '
     'transform_param { crop_size: 5 }', None),                     # channels unknown
    ('type: "Data" top: "d" data_param { batch_size: 8 }', None),   # size unknown
    ('type: "ImageData" top: "d" top: "l" image_data_param { batch_size: 2 new_height: 6 '
     'new_width: 7 is_color: false }', {"d": (2, 1, 6, 7), "l": (2,)}),
    ('type: "ImageData" top: "d" top: "l" image_data_param { batch_size: 2 new_height: 6 '
     'new_width: 7 } transform_param { crop_size: 3 }', {"d": (2, 3, 3, 3), "l": (2,)}),
    ('type: "MemoryData" top: "d" top: "l" memory_data_param { batch_size: 4 channels: 2 '
     'height: 3 width: 5 }', {"d": (4, 2, 3, 5), "l": (4,)}),
    ('type: "HDF5Data" top: "d" hdf5_data_param { batch_size: 4 }', None),
])
def test_data_shapes_from_layer_parameters(text, shapes):
    assert data_shapes(parse_layer('name: "x" ' + text)) == shapes


MEAN_FILE_NET = '''
layer { name: "data" type: "Data" top: "data" top: "label"
  transform_param { crop_size: 9 mean_file: "MEAN" }
  data_param { source: "no/such_lmdb" batch_size: 4 backend: LMDB } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 2 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
'''


def test_inspect_names_the_data_layer_and_takes_what_crop_size_fixes(tmp_path, capsys):
    """BVLC's ImageNet layout: a Data layer with crop_size and a mean_file. The label's shape
    comes from batch_size, so --data-shape for the data alone suffices while the mean file is
    absent, and the data layer is shown as the Data layer it is, not as the Input it becomes."""
    from caffe8.tools.inspect import inspect_main
    from caffe8.proto import caffe_pb2
    model = tmp_path / "m.prototxt"
    model.write_text(MEAN_FILE_NET.replace("MEAN", str(tmp_path / "mean.binaryproto")))
    assert inspect_main([str(model)]) == 1
    err = capsys.readouterr().err
    assert "--data-shape data=..." in err and "label=" not in err   # the label is known
    assert inspect_main([str(model), "--data-shape", "data=4,3,9,9"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["data", "Data", "top", "4x3x9x9"] and lines[0].split()[4] == "4"
    assert lines[1].split()[5] == "2x243"               # ip's weights: 3·9·9 inputs
    mean = caffe_pb2.BlobProto()                        # with the mean file there: no flag at all
    mean.shape.dim.extend([1, 3, 12, 12])
    mean.data.extend([0.0] * 432)
    (tmp_path / "mean.binaryproto").write_bytes(mean.SerializeToString())
    assert inspect_main([str(model)]) == 0
    assert capsys.readouterr().out.splitlines()[0].split()[:4] == ["data", "Data", "top", "4x3x9x9"]
