"""caffe.proto, its generated caffe_pb2.py and engine.schema agree with each other, with facts of
BVLC Caffe's schema, and with protobuf's own text parser on every prototxt in the repository."""
import os
import re

import pytest
from google.protobuf import json_format, text_format

from caffe8.engine.proto import caffe_pb2
from caffe8.engine.proto.convert import from_pb, to_pb
from caffe8.engine.prototxt import parse_file, to_text
from caffe8.engine.schema import ENUMS, SCHEMA

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PB2 = os.path.join(REPO, "engine", "proto", "caffe_pb2.py")


def _serialized_descriptor(text):
    """The bytes literal protoc embeds (``AddSerializedFile(b'...')``), as written."""
    m = re.search(r"AddSerializedFile\((b'.*?')\)\n", text, re.S)
    assert m, "no serialized descriptor in generated module"
    return m.group(1)


def test_generated_module_is_not_stale(tmp_path):
    pytest.importorskip("grpc_tools")
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "gen_caffe_proto", os.path.join(REPO, "scripts", "gen_caffe_proto.py"))
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    fresh = open(gen.generate(str(tmp_path)), encoding="utf-8").read()
    committed = open(PB2, encoding="utf-8").read()
    assert _serialized_descriptor(fresh) == _serialized_descriptor(committed), \
        "engine/proto/caffe_pb2.py is stale: run scripts/gen_caffe_proto.py"
    version = re.compile(r"^# Protobuf Python Version: .*$", re.M)
    if version.search(fresh).group() == version.search(committed).group():
        assert fresh == committed, "engine/proto/caffe_pb2.py is stale: run scripts/gen_caffe_proto.py"


def test_schema_matches_runtime_descriptors():
    """engine.schema reads a FileDescriptorProto copy; compare with the live descriptors."""
    messages = caffe_pb2.DESCRIPTOR.message_types_by_name
    assert set(SCHEMA) == set(messages)
    for mname, desc in messages.items():
        assert set(SCHEMA[mname]) == set(desc.fields_by_name), mname
        default_pb = getattr(caffe_pb2, mname)()
        for fd in desc.fields:
            spec = SCHEMA[mname][fd.name]
            assert spec.number == fd.number
            assert spec.repeated == fd.is_repeated
            assert spec.is_message == (fd.message_type is not None)
            if fd.message_type is not None:
                assert spec.type == fd.message_type.full_name.split(".", 1)[1]
            elif fd.enum_type is not None:
                assert spec.type == fd.enum_type.full_name.split(".", 1)[1]
                assert ENUMS[spec.type] == {v.name: v.number for v in fd.enum_type.values}
                if not spec.repeated:
                    assert ENUMS[spec.type][spec.default] == getattr(default_pb, fd.name)
            elif not spec.repeated:
                live = getattr(default_pb, fd.name)
                if spec.type == "float":
                    assert spec.default == pytest.approx(live, rel=1e-6), (mname, fd.name)
                elif spec.type == "bytes":
                    assert spec.default.encode() == live
                else:
                    assert spec.default == live, (mname, fd.name)


@pytest.mark.parametrize("message, field, number, type_, default", [
    ("LayerParameter", "clip_param", 148, "ClipParameter", None),
    ("LayerParameter", "swish_param", 147, "SwishParameter", None),
    ("LayerParameter", "recurrent_param", 146, "RecurrentParameter", None),
    ("LayerParameter", "transform_param", 100, "TransformationParameter", None),
    ("LayerParameter", "emulate_param", 1008, "EmulateParameter", None),
    ("LayerParameter", "sequence_data_param", 1009, "SequenceDataParameter", None),
    ("NetParameter", "layer", 100, "LayerParameter", None),
    ("NetParameter", "layers", 2, "V1LayerParameter", None),
    ("SolverParameter", "snapshot_format", 37, "SolverParameter.SnapshotFormat", "BINARYPROTO"),
    ("SolverParameter", "layer_wise_reduce", 41, "bool", True),
    ("SolverParameter", "weights", 42, "string", ""),
    ("SolverParameter", "random_seed", 20, "int64", -1),
    ("SolverParameter", "delta", 31, "float", 1e-8),
    ("SolverParameter", "comm", 1001, "CommParameter", None),
    ("SolverState", "current_step", 4, "int32", 0),
    ("BlobProto", "num", 1, "int32", 0),
    ("BlobShape", "dim", 1, "int64", 0),
    ("V1LayerParameter", "layer", 1, "V0LayerParameter", None),
    ("V1LayerParameter", "blobs_lr", 7, "float", 0.0),
    ("V0LayerParameter", "hdf5_output_param", 1001, "HDF5OutputParameter", None),
    ("V0LayerParameter", "det_crop_mode", 59, "string", "warp"),
    ("PoolingParameter", "round_mode", 13, "PoolingParameter.RoundMode", "CEIL"),
    ("ParamSpec", "share_mode", 2, "ParamSpec.DimCheckMode", "STRICT"),
    ("HingeLossParameter", "norm", 1, "HingeLossParameter.Norm", "L1"),
    ("DataParameter", "prefetch", 10, "uint32", 4),
    ("CommParameter", "stall_timeout", 19, "float", 300.0),
    ("CommParameter", "max_consecutive_skips", 20, "int32", 10),
    ("CommParameter", "quantile", 4, "float", 0.95),
])
def test_facts_of_caffe_and_caffe8_schema(message, field, number, type_, default):
    spec = SCHEMA[message][field]
    assert (spec.number, spec.type, spec.default) == (number, type_, default)


def test_v1_layer_type_enum_and_required_clip():
    assert ENUMS["V1LayerParameter.LayerType"]["DECONVOLUTION"] == 39
    assert ENUMS["V1LayerParameter.LayerType"]["THRESHOLD"] == 31
    assert SCHEMA["ClipParameter"]["min"].required and SCHEMA["ClipParameter"]["max"].required
    assert list(ENUMS["ReductionParameter.ReductionOp"]) == ["SUM", "ASUM", "SUMSQ", "MEAN"]


def _prototxts():
    out = []
    for root in ("tests/data/bvlc", "prototxt"):
        for folder, _, files in os.walk(os.path.join(REPO, root)):
            out += [os.path.join(folder, f) for f in sorted(files) if f.endswith(".prototxt")]
    return sorted(out)


PROTOTXTS = _prototxts()


def test_there_are_prototxts_to_compare():
    assert len(PROTOTXTS) >= 20


@pytest.mark.parametrize("path", PROTOTXTS, ids=lambda p: os.path.relpath(p, REPO))
def test_our_parser_agrees_with_protobuf_text_format(path):
    type_name = "SolverParameter" if "solver" in os.path.basename(path) else "NetParameter"
    theirs = text_format.Parse(open(path, encoding="utf-8").read(), getattr(caffe_pb2, type_name)())
    for layer in getattr(theirs, "layer", ()):   # Caffe's UpgradeNetBatchNorm, which reading a
        if layer.type == "BatchNorm" and len(layer.param) == 3:   # net applies (ours too)
            for spec in layer.param:
                spec.lr_mult, spec.decay_mult = 0.0, 0.0
    ours = parse_file(path, type_name)
    as_dict = lambda m: json_format.MessageToDict(m, preserving_proto_field_name=True)  # noqa: E731
    assert as_dict(to_pb(ours)) == as_dict(theirs)
    # field by field through the other direction too: pb2 -> Message -> text
    assert to_text(from_pb(theirs)) == to_text(from_pb(to_pb(ours)))
