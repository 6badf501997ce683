"""Caffe's message schema (field names, types, defaults), written in a proto2 subset.

``SCHEMA[message][field]`` is a ``FieldSpec``; ``ENUMS[enum]`` maps value names to numbers.
Defaults follow caffe.proto (BVLC master). ``CommParameter`` (the exchange block of a solver) is
caffe8's own addition.
"""
import re
from dataclasses import dataclass

_PROTO = r"""
enum Phase { TRAIN = 0; TEST = 1; }
enum DimCheckMode { STRICT = 0; PERMISSIVE = 1; }
enum VarianceNorm { FAN_IN = 0; FAN_OUT = 1; AVERAGE = 2; }
enum Engine { DEFAULT = 0; CAFFE = 1; CUDNN = 2; }
enum PoolMethod { MAX = 0; AVE = 1; STOCHASTIC = 2; }
enum RoundMode { CEIL = 0; FLOOR = 1; }
enum NormRegion { ACROSS_CHANNELS = 0; WITHIN_CHANNEL = 1; }
enum NormalizationMode { FULL = 0; VALID = 1; BATCH_SIZE = 2; NONE = 3; }
enum EltwiseOp { PROD = 0; SUM = 1; MAX = 2; }
enum DB { LEVELDB = 0; LMDB = 1; }
enum SolverMode { CPU = 0; GPU = 1; }
enum SnapshotFormat { HDF5 = 0; BINARYPROTO = 1; }
enum SolverType { SGD = 0; NESTEROV = 1; ADAGRAD = 2; RMSPROP = 3; ADADELTA = 4; ADAM = 5; }
enum ReductionOp { SUM = 1; ASUM = 2; SUMSQ = 3; MEAN = 4; }
enum Norm { L1 = 1; L2 = 2; }

message BlobShape { repeated int64 dim = 1; }
message BlobProto {
  optional BlobShape shape = 7; repeated float data = 5; repeated float diff = 6;
  repeated double double_data = 8; repeated double double_diff = 9;
  optional int32 num = 1 [default = 0]; optional int32 channels = 2 [default = 0];
  optional int32 height = 3 [default = 0]; optional int32 width = 4 [default = 0];
}
message NetState { optional Phase phase = 1 [default = TEST]; optional int32 level = 2 [default = 0];
  repeated string stage = 3; }
message NetStateRule { optional Phase phase = 1; optional int32 min_level = 2; optional int32 max_level = 3;
  repeated string stage = 4; repeated string not_stage = 5; }
message ParamSpec { optional string name = 1; optional DimCheckMode share_mode = 2 [default = STRICT];
  optional float lr_mult = 3 [default = 1.0]; optional float decay_mult = 4 [default = 1.0]; }
message FillerParameter {
  optional string type = 1 [default = "constant"]; optional float value = 2 [default = 0];
  optional float min = 3 [default = 0]; optional float max = 4 [default = 1];
  optional float mean = 5 [default = 0]; optional float std = 6 [default = 1];
  optional int32 sparse = 7 [default = -1];
  optional VarianceNorm variance_norm = 8 [default = FAN_IN]; }

message NetParameter {
  optional string name = 1; repeated string input = 3; repeated BlobShape input_shape = 8;
  repeated int32 input_dim = 4; optional bool force_backward = 5 [default = false];
  optional NetState state = 6; optional bool debug_info = 7 [default = false];
  repeated LayerParameter layer = 100; }

message LayerParameter {
  optional string name = 1; optional string type = 2; repeated string bottom = 3; repeated string top = 4;
  optional Phase phase = 10; repeated float loss_weight = 5; repeated ParamSpec param = 6;
  repeated BlobProto blobs = 7; repeated bool propagate_down = 11;
  repeated NetStateRule include = 8; repeated NetStateRule exclude = 9;
  optional TransformationParameter transform_param = 100; optional LossParameter loss_param = 101;
  optional AccuracyParameter accuracy_param = 102; optional ArgMaxParameter argmax_param = 103;
  optional ConcatParameter concat_param = 104; optional ConvolutionParameter convolution_param = 106;
  optional DataParameter data_param = 107; optional DropoutParameter dropout_param = 108;
  optional DummyDataParameter dummy_data_param = 109; optional EltwiseParameter eltwise_param = 110;
  optional ExpParameter exp_param = 111; optional HDF5DataParameter hdf5_data_param = 112;
  optional HDF5OutputParameter hdf5_output_param = 113;
  optional ImageDataParameter image_data_param = 115; optional InnerProductParameter inner_product_param = 117;
  optional LRNParameter lrn_param = 118; optional PoolingParameter pooling_param = 121;
  optional PowerParameter power_param = 122; optional ReLUParameter relu_param = 123;
  optional SigmoidParameter sigmoid_param = 124; optional SoftmaxParameter softmax_param = 125;
  optional SliceParameter slice_param = 126; optional TanHParameter tanh_param = 127;
  optional ReshapeParameter reshape_param = 133; optional LogParameter log_param = 134;
  optional FlattenParameter flatten_param = 135; optional BiasParameter bias_param = 141;
  optional ScaleParameter scale_param = 142; optional InputParameter input_param = 143;
  optional RecurrentParameter recurrent_param = 146; optional EmulateParameter emulate_param = 1008;
  optional SequenceDataParameter sequence_data_param = 1009;
  optional MVNParameter mvn_param = 120; optional ThresholdParameter threshold_param = 128;
  optional PReLUParameter prelu_param = 131; optional SPPParameter spp_param = 132;
  optional ReductionParameter reduction_param = 136; optional EmbedParameter embed_param = 137;
  optional TileParameter tile_param = 138; optional BatchNormParameter batch_norm_param = 139;
  optional ELUParameter elu_param = 140; optional CropParameter crop_param = 144;
  optional ParameterParameter parameter_param = 145; optional SwishParameter swish_param = 147;
  optional ClipParameter clip_param = 148;
  optional ContrastiveLossParameter contrastive_loss_param = 105;
  optional HingeLossParameter hinge_loss_param = 114; optional InfogainLossParameter infogain_loss_param = 116;
  optional MemoryDataParameter memory_data_param = 119; optional WindowDataParameter window_data_param = 129;
  optional PythonParameter python_param = 130; }

message TransformationParameter { optional float scale = 1 [default = 1]; optional bool mirror = 2 [default = false];
  optional uint32 crop_size = 3 [default = 0]; optional string mean_file = 4; repeated float mean_value = 5;
  optional bool force_color = 6 [default = false]; optional bool force_gray = 7 [default = false]; }
message LossParameter { optional int32 ignore_label = 1; optional NormalizationMode normalization = 3 [default = VALID];
  optional bool normalize = 2; }
message AccuracyParameter { optional uint32 top_k = 1 [default = 1]; optional int32 axis = 2 [default = 1];
  optional int32 ignore_label = 3; }
message ArgMaxParameter { optional bool out_max_val = 1 [default = false]; optional uint32 top_k = 2 [default = 1];
  optional int32 axis = 3; }
message ConcatParameter { optional int32 axis = 2 [default = 1]; optional uint32 concat_dim = 1 [default = 1]; }
message ConvolutionParameter {
  optional uint32 num_output = 1; optional bool bias_term = 2 [default = true];
  repeated uint32 pad = 3; repeated uint32 kernel_size = 4; repeated uint32 stride = 6; repeated uint32 dilation = 18;
  optional uint32 pad_h = 9 [default = 0]; optional uint32 pad_w = 10 [default = 0];
  optional uint32 kernel_h = 11; optional uint32 kernel_w = 12; optional uint32 stride_h = 13; optional uint32 stride_w = 14;
  optional uint32 group = 5 [default = 1]; optional FillerParameter weight_filler = 7; optional FillerParameter bias_filler = 8;
  optional Engine engine = 15 [default = DEFAULT]; optional int32 axis = 16 [default = 1];
  optional bool force_nd_im2col = 17 [default = false]; }
message DataParameter { optional string source = 1; optional uint32 batch_size = 4; optional uint32 rand_skip = 7 [default = 0];
  optional DB backend = 8 [default = LEVELDB]; optional float scale = 2 [default = 1]; optional string mean_file = 3;
  optional uint32 crop_size = 5 [default = 0]; optional bool mirror = 6 [default = false];
  optional bool force_encoded_color = 9 [default = false]; optional uint32 prefetch = 10 [default = 4]; }
message DropoutParameter { optional float dropout_ratio = 1 [default = 0.5]; }
message DummyDataParameter { repeated FillerParameter data_filler = 1; repeated BlobShape shape = 6;
  repeated uint32 num = 2; repeated uint32 channels = 3; repeated uint32 height = 4; repeated uint32 width = 5; }
message EltwiseParameter { optional EltwiseOp operation = 1 [default = SUM]; repeated float coeff = 2;
  optional bool stable_prod_grad = 3 [default = true]; }
message ExpParameter { optional float base = 1 [default = -1.0]; optional float scale = 2 [default = 1.0];
  optional float shift = 3 [default = 0.0]; }
message FlattenParameter { optional int32 axis = 1 [default = 1]; optional int32 end_axis = 2 [default = -1]; }
message HDF5DataParameter { optional string source = 1; optional uint32 batch_size = 2;
  optional bool shuffle = 3 [default = false]; }
message HDF5OutputParameter { optional string file_name = 1; }
message ImageDataParameter { optional string source = 1; optional uint32 batch_size = 4 [default = 1];
  optional uint32 rand_skip = 7 [default = 0]; optional bool shuffle = 8 [default = false];
  optional uint32 new_height = 9 [default = 0]; optional uint32 new_width = 10 [default = 0];
  optional bool is_color = 11 [default = true]; optional float scale = 2 [default = 1]; optional string mean_file = 3;
  optional uint32 crop_size = 5 [default = 0]; optional bool mirror = 6 [default = false];
  optional string root_folder = 12 [default = ""]; }
message InnerProductParameter { optional uint32 num_output = 1; optional bool bias_term = 2 [default = true];
  optional FillerParameter weight_filler = 3; optional FillerParameter bias_filler = 4;
  optional int32 axis = 5 [default = 1]; optional bool transpose = 6 [default = false]; }
message InputParameter { repeated BlobShape shape = 1; }
message LogParameter { optional float base = 1 [default = -1.0]; optional float scale = 2 [default = 1.0];
  optional float shift = 3 [default = 0.0]; }
message LRNParameter { optional uint32 local_size = 1 [default = 5]; optional float alpha = 2 [default = 1.];
  optional float beta = 3 [default = 0.75]; optional NormRegion norm_region = 4 [default = ACROSS_CHANNELS];
  optional float k = 5 [default = 1.]; optional Engine engine = 6 [default = DEFAULT]; }
message PoolingParameter { optional PoolMethod pool = 1 [default = MAX];
  optional uint32 pad = 4 [default = 0]; optional uint32 pad_h = 9 [default = 0]; optional uint32 pad_w = 10 [default = 0];
  optional uint32 kernel_size = 2; optional uint32 kernel_h = 5; optional uint32 kernel_w = 6;
  optional uint32 stride = 3 [default = 1]; optional uint32 stride_h = 7; optional uint32 stride_w = 8;
  optional Engine engine = 11 [default = DEFAULT]; optional bool global_pooling = 12 [default = false];
  optional RoundMode round_mode = 13 [default = CEIL]; }
message PowerParameter { optional float power = 1 [default = 1.0]; optional float scale = 2 [default = 1.0];
  optional float shift = 3 [default = 0.0]; }
message ReLUParameter { optional float negative_slope = 1 [default = 0]; optional Engine engine = 2 [default = DEFAULT]; }
message ReshapeParameter { optional BlobShape shape = 1; optional int32 axis = 2 [default = 0];
  optional int32 num_axes = 3 [default = -1]; }
message SigmoidParameter { optional Engine engine = 1 [default = DEFAULT]; }
message SliceParameter { optional int32 axis = 3 [default = 1]; repeated uint32 slice_point = 2;
  optional uint32 slice_dim = 1 [default = 1]; }
message SoftmaxParameter { optional Engine engine = 1 [default = DEFAULT]; optional int32 axis = 2 [default = 1]; }
message TanHParameter { optional Engine engine = 1 [default = DEFAULT]; }
message BiasParameter { optional int32 axis = 1 [default = 1]; optional int32 num_axes = 2 [default = 1];
  optional FillerParameter filler = 3; }
message ScaleParameter { optional int32 axis = 1 [default = 1]; optional int32 num_axes = 2 [default = 1];
  optional FillerParameter filler = 3; optional bool bias_term = 4 [default = false];
  optional FillerParameter bias_filler = 5; }
message RecurrentParameter { optional uint32 num_output = 1 [default = 0]; optional FillerParameter weight_filler = 2;
  optional FillerParameter bias_filler = 3; optional bool debug_info = 4 [default = false];
  optional bool expose_hidden = 5 [default = false]; }
message EmulateParameter { optional float forward_ms = 1 [default = 0]; optional float backward_ms = 2 [default = 0]; }
message SequenceDataParameter { optional uint32 batch_size = 1; optional uint32 time_steps = 2;
  optional uint32 vocab_size = 3 [default = 8]; optional uint32 delay = 4 [default = 1];
  optional uint32 input_dim = 5 [default = 0]; optional uint32 sequence_length = 6 [default = 0];
  optional int64 seed = 7 [default = 1]; optional int32 ignore_label = 8 [default = -1]; }
message BatchNormParameter { optional bool use_global_stats = 1;
  optional float moving_average_fraction = 2 [default = .999]; optional float eps = 3 [default = 1e-5]; }
message ClipParameter { optional float min = 1; optional float max = 2; }
message CropParameter { optional int32 axis = 1 [default = 2]; repeated uint32 offset = 2; }
message ELUParameter { optional float alpha = 1 [default = 1]; }
message EmbedParameter { optional uint32 num_output = 1; optional uint32 input_dim = 2;
  optional bool bias_term = 3 [default = true]; optional FillerParameter weight_filler = 4;
  optional FillerParameter bias_filler = 5; }
message MVNParameter { optional bool normalize_variance = 1 [default = true];
  optional bool across_channels = 2 [default = false]; optional float eps = 3 [default = 1e-9]; }
message ParameterParameter { optional BlobShape shape = 1; }
message PReLUParameter { optional FillerParameter filler = 1; optional bool channel_shared = 2 [default = false]; }
message ReductionParameter { optional ReductionOp operation = 1 [default = SUM]; optional int32 axis = 2 [default = 0];
  optional float coeff = 3 [default = 1.0]; }
message SPPParameter { optional uint32 pyramid_height = 1; optional PoolMethod pool = 2 [default = MAX];
  optional Engine engine = 6 [default = DEFAULT]; }
message SwishParameter { optional float beta = 1 [default = 1]; }
message ThresholdParameter { optional float threshold = 1 [default = 0]; }
message TileParameter { optional int32 axis = 1 [default = 1]; optional int32 tiles = 2; }
message ContrastiveLossParameter { optional float margin = 1 [default = 1.0];
  optional bool legacy_version = 2 [default = false]; }
message HingeLossParameter { optional Norm norm = 1 [default = L1]; }
message InfogainLossParameter { optional string source = 1; optional int32 axis = 2 [default = 1]; }
message MemoryDataParameter { optional uint32 batch_size = 1; optional uint32 channels = 2;
  optional uint32 height = 3; optional uint32 width = 4; }
message WindowDataParameter { optional string source = 1; optional float scale = 2 [default = 1];
  optional string mean_file = 3; optional uint32 batch_size = 4; optional uint32 crop_size = 5 [default = 0];
  optional bool mirror = 6 [default = false]; optional float fg_threshold = 7 [default = 0.5];
  optional float bg_threshold = 8 [default = 0.5]; optional float fg_fraction = 9 [default = 0.25];
  optional uint32 context_pad = 10 [default = 0]; optional string crop_mode = 11 [default = "warp"];
  optional bool cache_images = 12 [default = false]; optional string root_folder = 13 [default = ""]; }
message PythonParameter { optional string module = 1; optional string layer = 2;
  optional string param_str = 3 [default = ""]; optional bool share_in_parallel = 4 [default = false]; }

message CommParameter {
  optional string codec = 1 [default = "fp8"]; optional bool relative = 2 [default = true];
  optional bool hierarchical = 3 [default = true]; optional float quantile = 4 [default = 0.95];
  optional int32 quantile_interval = 5 [default = 100]; optional int32 samples = 6 [default = 1024];
  optional float epsilon = 7 [default = 1e-5]; optional bool async = 8 [default = true];
  optional int32 processes_per_node = 9 [default = 0]; optional int32 warmup_fp32_iters = 10 [default = 0];
  optional string rounding = 11 [default = "nearest"]; optional int32 consistency_check_interval = 12 [default = 0];
  optional string algorithm = 13 [default = ""]; optional string nonfinite = 14 [default = "stop"];
  optional string aps_format = 15 [default = "E5M2"]; optional bool kahan = 16 [default = false];
  optional float strom_tau = 17 [default = 0]; optional string dettmers_type = 18 [default = "dynamic_tree"];
  optional float stall_timeout = 19 [default = 300]; optional int32 max_consecutive_skips = 20 [default = 10]; }

message SolverParameter {
  optional string net = 24; optional NetParameter net_param = 25;
  optional string train_net = 1; repeated string test_net = 2;
  optional NetParameter train_net_param = 21; repeated NetParameter test_net_param = 22;
  optional NetState train_state = 26; repeated NetState test_state = 27;
  repeated int32 test_iter = 3; optional int32 test_interval = 4 [default = 0];
  optional bool test_compute_loss = 19 [default = false]; optional bool test_initialization = 32 [default = true];
  optional float base_lr = 5; optional int32 display = 6; optional int32 average_loss = 33 [default = 1];
  optional int32 max_iter = 7; optional int32 iter_size = 36 [default = 1]; optional string lr_policy = 8;
  optional float gamma = 9; optional float power = 10; optional float momentum = 11;
  optional float weight_decay = 12; optional string regularization_type = 29 [default = "L2"];
  optional int32 stepsize = 13; repeated int32 stepvalue = 34; optional float clip_gradients = 35 [default = -1];
  optional int32 snapshot = 14 [default = 0]; optional string snapshot_prefix = 15;
  optional bool snapshot_diff = 16 [default = false];
  optional SnapshotFormat snapshot_format = 37 [default = HDF5];
  optional SolverMode solver_mode = 17 [default = GPU]; optional int32 device_id = 18 [default = 0];
  optional int64 random_seed = 20 [default = -1]; optional string type = 40 [default = "SGD"];
  optional float delta = 31 [default = 1e-8]; optional float momentum2 = 39 [default = 0.999];
  optional float rms_decay = 38 [default = 0.99]; optional bool debug_info = 23 [default = false];
  optional bool snapshot_after_train = 28 [default = true];
  optional SolverType solver_type = 30 [default = SGD]; optional bool layer_wise_reduce = 41 [default = true];
  repeated string weights = 42; optional CommParameter comm = 1001; }

message SolverState { optional int32 iter = 1; optional string learned_net = 2; repeated BlobProto history = 3;
  optional int32 current_step = 4 [default = 0]; }
message Datum { optional int32 channels = 1; optional int32 height = 2; optional int32 width = 3;
  optional bytes data = 4; optional int32 label = 5; repeated float float_data = 6;
  optional bool encoded = 7 [default = false]; }
"""

_SCALARS = {"string", "bytes", "bool", "float", "double", "int32", "int64", "uint32", "uint64"}


@dataclass(frozen=True)
class FieldSpec:
    name: str
    type: str          # scalar type name, enum name or message name
    number: int
    repeated: bool
    default: object    # Python value; None where proto2 has no default and the type is a message
    is_message: bool


def _default_for(t, text, enums):
    if text is not None:
        text = text.strip()
        if t in ("string", "bytes"):
            return text.strip('"')
        if t == "bool":
            return text == "true"
        if t in ("float", "double"):
            return float(text)
        if t in enums:
            return text
        return int(text)
    if t in ("string", "bytes"):
        return ""
    if t == "bool":
        return False
    if t in ("float", "double"):
        return 0.0
    if t in enums:
        return next(iter(enums[t]))  # proto2: the first listed value
    return 0


def _build(proto):
    enums = {}
    for name, body in re.findall(r"enum\s+(\w+)\s*\{([^}]*)\}", proto):
        enums[name] = {k: int(v) for k, v in re.findall(r"(\w+)\s*=\s*(-?\d+)", body)}
    schema = {}
    msg_bodies = re.findall(r"message\s+(\w+)\s*\{(.*?)\}\s*(?=message|\Z)", proto, re.S)
    msg_names = {m for m, _ in msg_bodies}
    field_re = re.compile(
        r"(optional|repeated)\s+(\w+)\s+(\w+)\s*=\s*(\d+)\s*(?:\[\s*default\s*=\s*([^\]]+)\])?\s*;")
    for mname, body in msg_bodies:
        fields = {}
        for label, t, fname, num, dflt in field_re.findall(body):
            if t not in _SCALARS and t not in enums and t not in msg_names:
                raise AssertionError(f"schema: unknown type {t} for {mname}.{fname}")
            is_msg = t in msg_names
            fields[fname] = FieldSpec(fname, t, int(num), label == "repeated",
                                      None if is_msg else _default_for(t, dflt or None, enums),
                                      is_msg)
        schema[mname] = fields
    return schema, enums


SCHEMA, ENUMS = _build(_PROTO)
