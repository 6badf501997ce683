"""comm/codecs.py: one registry of six codecs; each codec's encode/decode on one process
against closed forms or the pure pieces of comm/aps.py, dettmers.py, strom.py. (The fp8 codec's
host bits on every kernel path: tests/comm/test_kernels.py.)"""
import numpy
import pytest

from caffe8.comm.codecs import CODECS, Tensor, create_codec
from caffe8.comm.config import parse_comm
from caffe8.engine.errors import CaffeError

ALL = ["aps", "dettmers", "fp16", "fp32", "fp8", "strom"]


def tensor(weight, key=(0, 1), iteration=0, processes=1, stages=(1, 1), dtype=numpy.uint8):
    """A Tensor whose output buffer is a zero-padded host array (padding 3 elements)."""
    return Tensor(key, weight, iteration, processes, stages,
                  numpy.zeros(weight.size + 3, dtype)[:weight.size])


def round_trip(codec, grad, t):
    """One process: encode, the reduction of one addend (itself), decode."""
    stat = codec.local_stat(grad, t)
    if stat is not None:
        codec.agree(t, stat)
    if codec.reduction == "sum":            # the output buffer in the codec's wire dtype
        t.out = numpy.zeros(grad.size + 3, codec.wire.dtype)[:grad.size]
    payload, ctx = codec.encode(grad, t)
    out = numpy.empty_like(grad)
    codec.decode(payload.copy() if codec.reduction == "sum" else [payload.copy()], ctx, out)
    return out


def test_registry_holds_all_six_codecs_and_names_them_in_the_error():
    assert sorted(CODECS) == ALL
    assert {c.reduction for c in CODECS.values()} == {"sum", "gather"}
    with pytest.raises(CaffeError, match="Unrecognized codec: 'int4', valid: " + ", ".join(ALL)):
        create_codec("int4", parse_comm())


def test_fp32_is_the_identity_and_fp16_the_half_cast():
    g = numpy.random.default_rng(1).standard_normal((13, 7)).astype(numpy.float32)
    t = tensor(numpy.ones_like(g))
    assert numpy.array_equal(round_trip(create_codec("fp32", parse_comm()), g, t), g)
    half = round_trip(create_codec("fp16", parse_comm()), g, t)
    assert numpy.array_equal(half, g.astype(numpy.float16).astype(numpy.float32))


def test_fp8_quantile_is_agreed_only_when_due():
    codec = create_codec("fp8", parse_comm("quantile_interval: 3"))
    g = numpy.random.default_rng(2).standard_normal(500).astype(numpy.float32)
    t = tensor(numpy.ones_like(g), iteration=0)
    assert codec.local_stat(g, t) is not None
    codec.agree(t, 0.0)                                    # an all-zero tensor: q = 1
    assert codec.tracker.get(t.key) == 1.0
    assert [codec.local_stat(g, tensor(g, iteration=i)) is None for i in (1, 2, 3)] == \
        [True, True, False]


def test_aps_dettmers_strom_one_process_equal_their_pure_round_trip():
    from caffe8.comm.aps import ApsCompressor, local_exponent
    from caffe8.comm.dettmers import DettmersCompressor
    from caffe8.comm.strom import StromCompressor
    g = numpy.random.default_rng(3).standard_normal((6, 7)).astype(numpy.float32)
    t = tensor(numpy.ones_like(g), key="k")
    aps = round_trip(create_codec("aps", parse_comm('aps_format: "E4M3"')), g, t)
    pure = ApsCompressor("E4M3")
    assert numpy.array_equal(aps, pure.decompress(*pure.compress(g, local_exponent(g), 1)))
    det = round_trip(create_codec("dettmers", parse_comm('dettmers_type: "linear"')), g, t)
    pure = DettmersCompressor("linear")
    assert numpy.array_equal(det, pure.decompress(*pure.compress(g)))
    codec = create_codec("strom", parse_comm("strom_tau: 0.5"))
    twin = StromCompressor(0.5)
    for _ in range(2):                                     # the residual carries over
        assert numpy.array_equal(round_trip(codec, g, t),
                                 twin.decompress(*twin.compress(g, key="k")))
    assert numpy.array_equal(codec.impl.residuals["k"], twin.residuals["k"])


def test_fp8_state_round_trips():
    codec = create_codec("fp8", parse_comm())
    codec.tracker.values = {(0, 5): 0.25, (5, 9): 3.0}
    other = create_codec("fp8", parse_comm())
    other.restore(codec.state())
    assert other.tracker.values == codec.tracker.values


def test_fp8_divides_by_the_node_count_in_the_encode_with_one_process_per_node():
    """Stages (1, N): no intra-node sum, so the encode's scale is 57344 / q / N and nothing is
    left between the stages; stages (P', N) keep Oyama et al.'s rescale between them, which is
    the decode, x float32(1/N) and re-encode of every code (the tabulated pass)."""
    from caffe8.comm import kernels
    codec = create_codec("fp8", parse_comm("relative: false"))
    g = numpy.random.default_rng(4).standard_normal(4000).astype(numpy.float32)
    w = numpy.ones_like(g)
    one = tensor(w, stages=(1, 4))
    codec.agree(one, codec.local_stat(g, one))
    q = codec.tracker.get(one.key)
    payload, ctx = codec.encode(g, one)
    want = kernels.encode_fp8(g, numpy.empty(g.size, numpy.uint8),
                              float(numpy.float32(kernels.FP8_MAX / q / 4)))
    numpy.testing.assert_array_equal(payload, want)
    before = payload.copy()
    codec.between_stages(payload, ctx)
    numpy.testing.assert_array_equal(payload, before)            # nothing between the stages
    two = tensor(w, stages=(2, 4))
    payload, ctx = codec.encode(g, two)
    want = kernels.encode_fp8(g, numpy.empty(g.size, numpy.uint8),
                              float(numpy.float32(kernels.FP8_MAX / q / 2)))
    numpy.testing.assert_array_equal(payload, want)
    values = kernels.decode_fp8(payload, numpy.empty(g.size, numpy.float32))
    rescaled = kernels.encode_fp8(values, numpy.empty(g.size, numpy.uint8),
                                  float(numpy.float32(1 / 4)))
    codec.between_stages(payload, ctx)
    numpy.testing.assert_array_equal(payload, rescaled)


@pytest.mark.parametrize("text, details", [
    ("", ["ratio", "q=0.95"]),
    ('relative: false quantile: 0.99 rounding: "oyama"', ["absolute", "q=0.99", "oyama rounding"]),
    ('codec: "fp32"', []),
    ('codec: "fp16"', []),
    ('codec: "aps" aps_format: "E4M3" kahan: true', ["E4M3, Kahan"]),
    ('codec: "aps"', ["E5M2"]),
    ('codec: "dettmers" dettmers_type: "linear"', ["linear"]),
    ('codec: "strom" strom_tau: 0.05', ["tau=0.05"]),
])
def test_a_codec_names_the_settings_it_was_made_with(text, details):
    comm = parse_comm(text)
    assert create_codec(comm.codec, comm).details() == details
