"""Caffe's protobuf messages, defined in the project: no ``protoc``, no Caffe, no generated code.

The schema below is a subset of BVLC Caffe's ``src/caffe/proto/caffe.proto`` written in the same
syntax, with the REAL field numbers and defaults, so binary ``.caffemodel`` files and text
``.prototxt`` files parse exactly as Caffe reads them. At import time the text is turned into a
``FileDescriptorProto`` (a tiny parser for this restricted syntax: one field per line, enums on
one line), added to a private ``DescriptorPool`` and message classes are made with
``message_factory.GetMessageClass``. A private pool keeps our ``caffe.*`` names from clashing
with any other copy of caffe.proto loaded in the same process.

Rules for editing the schema:
1. Field numbers and defaults must be copied from caffe.proto, never invented.
2. Fields the importer does not read may still be listed so that text prototxts using them
   parse strictly (unknown fields are retried leniently; see ``mconv.formats.caffe``).
3. ``syntax = proto2`` semantics: ``optional`` fields have presence and defaults.
"""

from __future__ import annotations

import re

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_SCHEMA = """
message BlobShape {
  repeated int64 dim = 1 [packed = true];
}
message BlobProto {
  optional BlobShape shape = 7;
  repeated float data = 5 [packed = true];
  repeated float diff = 6 [packed = true];
  repeated double double_data = 8 [packed = true];
  repeated double double_diff = 9 [packed = true];
  optional int32 num = 1 [default = 0];
  optional int32 channels = 2 [default = 0];
  optional int32 height = 3 [default = 0];
  optional int32 width = 4 [default = 0];
}
message BlobProtoVector {
  repeated BlobProto blobs = 1;
}
message FillerParameter {
  optional string type = 1 [default = "constant"];
  optional float value = 2 [default = 0];
  optional float min = 3 [default = 0];
  optional float max = 4 [default = 1];
  optional float mean = 5 [default = 0];
  optional float std = 6 [default = 1];
  optional int32 sparse = 7 [default = -1];
  enum VarianceNorm { FAN_IN = 0; FAN_OUT = 1; AVERAGE = 2; }
  optional VarianceNorm variance_norm = 8 [default = FAN_IN];
}
message NetParameter {
  optional string name = 1;
  repeated string input = 3;
  repeated BlobShape input_shape = 8;
  repeated int32 input_dim = 4;
  optional bool force_backward = 5 [default = false];
  optional NetState state = 6;
  optional bool debug_info = 7 [default = false];
  repeated LayerParameter layer = 100;
  repeated V1LayerParameter layers = 2;
}
enum Phase { TRAIN = 0; TEST = 1; }
message NetState {
  optional Phase phase = 1 [default = TEST];
  optional int32 level = 2 [default = 0];
  repeated string stage = 3;
}
message NetStateRule {
  optional Phase phase = 1;
  optional int32 min_level = 2;
  optional int32 max_level = 3;
  repeated string stage = 4;
  repeated string not_stage = 5;
}
message ParamSpec {
  optional string name = 1;
  enum DimCheckMode { STRICT = 0; PERMISSIVE = 1; }
  optional DimCheckMode share_mode = 2;
  optional float lr_mult = 3 [default = 1.0];
  optional float decay_mult = 4 [default = 1.0];
}
message LayerParameter {
  optional string name = 1;
  optional string type = 2;
  repeated string bottom = 3;
  repeated string top = 4;
  optional Phase phase = 10;
  repeated float loss_weight = 5;
  repeated ParamSpec param = 6;
  repeated BlobProto blobs = 7;
  repeated bool propagate_down = 11;
  repeated NetStateRule include = 8;
  repeated NetStateRule exclude = 9;
  optional TransformationParameter transform_param = 100;
  optional LossParameter loss_param = 101;
  optional AccuracyParameter accuracy_param = 102;
  optional ArgMaxParameter argmax_param = 103;
  optional BatchNormParameter batch_norm_param = 139;
  optional BiasParameter bias_param = 141;
  optional ConcatParameter concat_param = 104;
  optional ConvolutionParameter convolution_param = 106;
  optional CropParameter crop_param = 144;
  optional DataParameter data_param = 107;
  optional DropoutParameter dropout_param = 108;
  optional DummyDataParameter dummy_data_param = 109;
  optional EltwiseParameter eltwise_param = 110;
  optional ELUParameter elu_param = 140;
  optional ExpParameter exp_param = 111;
  optional FlattenParameter flatten_param = 135;
  optional HDF5DataParameter hdf5_data_param = 112;
  optional ImageDataParameter image_data_param = 115;
  optional InnerProductParameter inner_product_param = 117;
  optional InputParameter input_param = 143;
  optional LogParameter log_param = 134;
  optional LRNParameter lrn_param = 118;
  optional MemoryDataParameter memory_data_param = 119;
  optional MVNParameter mvn_param = 120;
  optional PoolingParameter pooling_param = 121;
  optional PowerParameter power_param = 122;
  optional PReLUParameter prelu_param = 131;
  optional PythonParameter python_param = 130;
  optional ReductionParameter reduction_param = 136;
  optional ReLUParameter relu_param = 123;
  optional ReshapeParameter reshape_param = 133;
  optional ScaleParameter scale_param = 142;
  optional SigmoidParameter sigmoid_param = 124;
  optional SoftmaxParameter softmax_param = 125;
  optional SliceParameter slice_param = 126;
  optional TanHParameter tanh_param = 127;
  optional ThresholdParameter threshold_param = 128;
  optional TileParameter tile_param = 138;
  optional WindowDataParameter window_data_param = 129;
}
message TransformationParameter {
  optional float scale = 1 [default = 1];
  optional bool mirror = 2 [default = false];
  optional uint32 crop_size = 3 [default = 0];
  optional string mean_file = 4;
  repeated float mean_value = 5;
  optional bool force_color = 6 [default = false];
  optional bool force_gray = 7 [default = false];
}
message LossParameter {
  optional int32 ignore_label = 1;
  enum NormalizationMode { FULL = 0; VALID = 1; BATCH_SIZE = 2; NONE = 3; }
  optional NormalizationMode normalization = 3 [default = VALID];
  optional bool normalize = 2;
}
message AccuracyParameter {
  optional uint32 top_k = 1 [default = 1];
  optional int32 axis = 2 [default = 1];
  optional int32 ignore_label = 3;
}
message ArgMaxParameter {
  optional bool out_max_val = 1 [default = false];
  optional uint32 top_k = 2 [default = 1];
  optional int32 axis = 3;
}
message ConcatParameter {
  optional int32 axis = 2 [default = 1];
  optional uint32 concat_dim = 1 [default = 1];
}
message BatchNormParameter {
  optional bool use_global_stats = 1;
  optional float moving_average_fraction = 2 [default = .999];
  optional float eps = 3 [default = 1e-5];
}
message BiasParameter {
  optional int32 axis = 1 [default = 1];
  optional int32 num_axes = 2 [default = 1];
  optional FillerParameter filler = 3;
}
message ConvolutionParameter {
  optional uint32 num_output = 1;
  optional bool bias_term = 2 [default = true];
  repeated uint32 pad = 3;
  repeated uint32 kernel_size = 4;
  repeated uint32 stride = 6;
  repeated uint32 dilation = 18;
  optional uint32 pad_h = 9 [default = 0];
  optional uint32 pad_w = 10 [default = 0];
  optional uint32 kernel_h = 11;
  optional uint32 kernel_w = 12;
  optional uint32 stride_h = 13;
  optional uint32 stride_w = 14;
  optional uint32 group = 5 [default = 1];
  optional FillerParameter weight_filler = 7;
  optional FillerParameter bias_filler = 8;
  enum Engine { DEFAULT = 0; CAFFE = 1; CUDNN = 2; }
  optional Engine engine = 15 [default = DEFAULT];
  optional int32 axis = 16 [default = 1];
  optional bool force_nd_im2col = 17 [default = false];
}
message CropParameter {
  optional int32 axis = 1 [default = 2];
  repeated uint32 offset = 2;
}
message DataParameter {
  enum DB { LEVELDB = 0; LMDB = 1; }
  optional string source = 1;
  optional uint32 batch_size = 4;
  optional uint32 rand_skip = 7 [default = 0];
  optional DB backend = 8 [default = LEVELDB];
  optional float scale = 2 [default = 1];
  optional string mean_file = 3;
  optional uint32 crop_size = 5 [default = 0];
  optional bool mirror = 6 [default = false];
  optional bool force_encoded_color = 9 [default = false];
  optional uint32 prefetch = 10 [default = 4];
}
message DropoutParameter {
  optional float dropout_ratio = 1 [default = 0.5];
}
message DummyDataParameter {
  repeated FillerParameter data_filler = 1;
  repeated BlobShape shape = 6;
  repeated uint32 num = 2;
  repeated uint32 channels = 3;
  repeated uint32 height = 4;
  repeated uint32 width = 5;
}
message EltwiseParameter {
  enum EltwiseOp { PROD = 0; SUM = 1; MAX = 2; }
  optional EltwiseOp operation = 1 [default = SUM];
  repeated float coeff = 2;
  optional bool stable_prod_grad = 3 [default = true];
}
message ELUParameter {
  optional float alpha = 1 [default = 1];
}
message ExpParameter {
  optional float base = 1 [default = -1.0];
  optional float scale = 2 [default = 1.0];
  optional float shift = 3 [default = 0.0];
}
message FlattenParameter {
  optional int32 axis = 1 [default = 1];
  optional int32 end_axis = 2 [default = -1];
}
message HDF5DataParameter {
  optional string source = 1;
  optional uint32 batch_size = 2;
  optional bool shuffle = 3 [default = false];
}
message ImageDataParameter {
  optional string source = 1;
  optional uint32 batch_size = 4 [default = 1];
  optional uint32 rand_skip = 7 [default = 0];
  optional bool shuffle = 8 [default = false];
  optional uint32 new_height = 9 [default = 0];
  optional uint32 new_width = 10 [default = 0];
  optional bool is_color = 11 [default = true];
  optional float scale = 2 [default = 1];
  optional string mean_file = 3;
  optional uint32 crop_size = 5 [default = 0];
  optional bool mirror = 6 [default = false];
  optional string root_folder = 12 [default = ""];
}
message InnerProductParameter {
  optional uint32 num_output = 1;
  optional bool bias_term = 2 [default = true];
  optional FillerParameter weight_filler = 3;
  optional FillerParameter bias_filler = 4;
  optional int32 axis = 5 [default = 1];
  optional bool transpose = 6 [default = false];
}
message InputParameter {
  repeated BlobShape shape = 1;
}
message LogParameter {
  optional float base = 1 [default = -1.0];
  optional float scale = 2 [default = 1.0];
  optional float shift = 3 [default = 0.0];
}
message LRNParameter {
  optional uint32 local_size = 1 [default = 5];
  optional float alpha = 2 [default = 1.];
  optional float beta = 3 [default = 0.75];
  enum NormRegion { ACROSS_CHANNELS = 0; WITHIN_CHANNEL = 1; }
  optional NormRegion norm_region = 4 [default = ACROSS_CHANNELS];
  optional float k = 5 [default = 1.];
  enum Engine { DEFAULT = 0; CAFFE = 1; CUDNN = 2; }
  optional Engine engine = 6 [default = DEFAULT];
}
message MemoryDataParameter {
  optional uint32 batch_size = 1;
  optional uint32 channels = 2;
  optional uint32 height = 3;
  optional uint32 width = 4;
}
message MVNParameter {
  optional bool normalize_variance = 1 [default = true];
  optional bool across_channels = 2 [default = false];
  optional float eps = 3 [default = 1e-9];
}
message PoolingParameter {
  enum PoolMethod { MAX = 0; AVE = 1; STOCHASTIC = 2; }
  optional PoolMethod pool = 1 [default = MAX];
  optional uint32 pad = 4 [default = 0];
  optional uint32 pad_h = 9 [default = 0];
  optional uint32 pad_w = 10 [default = 0];
  optional uint32 kernel_size = 2;
  optional uint32 kernel_h = 5;
  optional uint32 kernel_w = 6;
  optional uint32 stride = 3 [default = 1];
  optional uint32 stride_h = 7;
  optional uint32 stride_w = 8;
  enum Engine { DEFAULT = 0; CAFFE = 1; CUDNN = 2; }
  optional Engine engine = 11 [default = DEFAULT];
  optional bool global_pooling = 12 [default = false];
  enum RoundMode { CEIL = 0; FLOOR = 1; }
  optional RoundMode round_mode = 13 [default = CEIL];
}
message PowerParameter {
  optional float power = 1 [default = 1.0];
  optional float scale = 2 [default = 1.0];
  optional float shift = 3 [default = 0.0];
}
message PythonParameter {
  optional string module = 1;
  optional string layer = 2;
  optional string param_str = 3 [default = ""];
  optional bool share_in_parallel = 4 [default = false];
}
message ReductionParameter {
  enum ReductionOp { SUM = 1; ASUM = 2; SUMSQ = 3; MEAN = 4; }
  optional ReductionOp operation = 1 [default = SUM];
  optional int32 axis = 2 [default = 0];
  optional float coeff = 3 [default = 1.0];
}
message ReLUParameter {
  optional float negative_slope = 1 [default = 0];
  enum Engine { DEFAULT = 0; CAFFE = 1; CUDNN = 2; }
  optional Engine engine = 2 [default = DEFAULT];
}
message ReshapeParameter {
  optional BlobShape shape = 1;
  optional int32 axis = 2 [default = 0];
  optional int32 num_axes = 3 [default = -1];
}
message ScaleParameter {
  optional int32 axis = 1 [default = 1];
  optional int32 num_axes = 2 [default = 1];
  optional FillerParameter filler = 3;
  optional bool bias_term = 4 [default = false];
  optional FillerParameter bias_filler = 5;
}
message SigmoidParameter {
  enum Engine { DEFAULT = 0; CAFFE = 1; CUDNN = 2; }
  optional Engine engine = 1 [default = DEFAULT];
}
message SliceParameter {
  optional int32 axis = 3 [default = 1];
  repeated uint32 slice_point = 2;
  optional uint32 slice_dim = 1 [default = 1];
}
message SoftmaxParameter {
  enum Engine { DEFAULT = 0; CAFFE = 1; CUDNN = 2; }
  optional Engine engine = 1 [default = DEFAULT];
  optional int32 axis = 2 [default = 1];
}
message TanHParameter {
  enum Engine { DEFAULT = 0; CAFFE = 1; CUDNN = 2; }
  optional Engine engine = 1 [default = DEFAULT];
}
message TileParameter {
  optional int32 axis = 1 [default = 1];
  optional int32 tiles = 2;
}
message ThresholdParameter {
  optional float threshold = 1 [default = 0];
}
message WindowDataParameter {
  optional string source = 1;
  optional float scale = 2 [default = 1];
  optional string mean_file = 3;
  optional uint32 batch_size = 4;
  optional uint32 crop_size = 5 [default = 0];
  optional bool mirror = 6 [default = false];
}
message PReLUParameter {
  optional FillerParameter filler = 1;
  optional bool channel_shared = 2 [default = false];
}
message V1LayerParameter {
  repeated string bottom = 2;
  repeated string top = 3;
  optional string name = 4;
  repeated NetStateRule include = 32;
  repeated NetStateRule exclude = 33;
  enum LayerType { NONE = 0; ABSVAL = 35; ACCURACY = 1; ARGMAX = 30; BNLL = 2; CONCAT = 3; CONTRASTIVE_LOSS = 37; CONVOLUTION = 4; DATA = 5; DECONVOLUTION = 39; DROPOUT = 6; DUMMY_DATA = 32; EUCLIDEAN_LOSS = 7; ELTWISE = 25; EXP = 38; FLATTEN = 8; HDF5_DATA = 9; HDF5_OUTPUT = 10; HINGE_LOSS = 28; IM2COL = 11; IMAGE_DATA = 12; INFOGAIN_LOSS = 13; INNER_PRODUCT = 14; LRN = 15; MEMORY_DATA = 29; MULTINOMIAL_LOGISTIC_LOSS = 16; MVN = 34; POOLING = 17; POWER = 26; RELU = 18; SIGMOID = 19; SIGMOID_CROSS_ENTROPY_LOSS = 27; SILENCE = 36; SOFTMAX = 20; SOFTMAX_LOSS = 21; SPLIT = 22; SLICE = 33; TANH = 23; WINDOW_DATA = 24; THRESHOLD = 31; }
  optional LayerType type = 5;
  repeated BlobProto blobs = 6;
  repeated string param = 1001;
  repeated float blobs_lr = 7;
  repeated float weight_decay = 8;
  repeated float loss_weight = 35;
  optional AccuracyParameter accuracy_param = 27;
  optional ArgMaxParameter argmax_param = 23;
  optional ConcatParameter concat_param = 9;
  optional ConvolutionParameter convolution_param = 10;
  optional DataParameter data_param = 11;
  optional DropoutParameter dropout_param = 12;
  optional DummyDataParameter dummy_data_param = 26;
  optional EltwiseParameter eltwise_param = 24;
  optional ExpParameter exp_param = 41;
  optional HDF5DataParameter hdf5_data_param = 13;
  optional ImageDataParameter image_data_param = 15;
  optional InnerProductParameter inner_product_param = 17;
  optional LRNParameter lrn_param = 18;
  optional MemoryDataParameter memory_data_param = 22;
  optional MVNParameter mvn_param = 34;
  optional PoolingParameter pooling_param = 19;
  optional PowerParameter power_param = 21;
  optional ReLUParameter relu_param = 30;
  optional SigmoidParameter sigmoid_param = 38;
  optional SoftmaxParameter softmax_param = 39;
  optional SliceParameter slice_param = 31;
  optional TanHParameter tanh_param = 37;
  optional ThresholdParameter threshold_param = 25;
  optional WindowDataParameter window_data_param = 20;
  optional TransformationParameter transform_param = 36;
  optional LossParameter loss_param = 42;
}
"""

PACKAGE = "caffe"

_SCALARS = {
    "double": descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE,
    "float": descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT,
    "int64": descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
    "uint64": descriptor_pb2.FieldDescriptorProto.TYPE_UINT64,
    "int32": descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
    "uint32": descriptor_pb2.FieldDescriptorProto.TYPE_UINT32,
    "bool": descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
    "string": descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
    "bytes": descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
}
_LABELS = {
    "optional": descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
    "repeated": descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
}
_FIELD = re.compile(r"^(optional|repeated)\s+([\w.]+)\s+(\w+)\s*=\s*(\d+)\s*(?:\[(.*)\])?\s*;$")
_ENUM = re.compile(r"^enum\s+(\w+)\s*\{(.*)\}$")
_OPTION = re.compile(r"(\w+)\s*=\s*(\"[^\"]*\"|[^,\s]+)")


def _enum_proto(name: str, body: str) -> descriptor_pb2.EnumDescriptorProto:
    enum = descriptor_pb2.EnumDescriptorProto(name=name)
    for item in filter(None, (s.strip() for s in body.split(";"))):
        key, num = (t.strip() for t in item.split("="))
        enum.value.add(name=key, number=int(num))
    return enum


def _file_proto() -> descriptor_pb2.FileDescriptorProto:
    """Turn ``_SCHEMA`` into a FileDescriptorProto (the work protoc would do)."""
    fdp = descriptor_pb2.FileDescriptorProto(name="mconv_caffe.proto", package=PACKAGE, syntax="proto2")
    # First pass: every message and enum name, so field types can be resolved in any order.
    top_enums: set[str] = set()
    nested_enums: dict[str, set[str]] = {}
    messages: set[str] = set()
    current = None
    for raw in _SCHEMA.splitlines():
        line = raw.strip()
        if line.startswith("message "):
            current = line.split()[1]
            messages.add(current)
            nested_enums[current] = set()
        elif line.startswith("enum "):
            m = _ENUM.match(line)
            if m is None:  # as the second pass says of a line it cannot read
                raise ValueError(f"caffe schema: cannot read line {line!r}")
            name = m.group(1)
            (nested_enums[current] if current else top_enums).add(name)
        elif line == "}":
            current = None
    msg = None
    for raw in _SCHEMA.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("message "):
            msg = fdp.message_type.add(name=line.split()[1])
            continue
        if line == "}":
            msg = None
            continue
        m = _ENUM.match(line)
        if m:
            enum = _enum_proto(m.group(1), m.group(2))
            (msg.enum_type if msg is not None else fdp.enum_type).append(enum)
            continue
        m = _FIELD.match(line)
        if m is None or msg is None:
            raise ValueError(f"caffe schema: cannot read line {line!r}")
        label, type_name, name, number, opts = m.groups()
        field = msg.field.add(name=name, number=int(number), label=_LABELS[label])
        if type_name in _SCALARS:
            field.type = _SCALARS[type_name]
        elif type_name in nested_enums.get(msg.name, ()):
            field.type = descriptor_pb2.FieldDescriptorProto.TYPE_ENUM
            field.type_name = f".{PACKAGE}.{msg.name}.{type_name}"
        elif type_name in top_enums:
            field.type = descriptor_pb2.FieldDescriptorProto.TYPE_ENUM
            field.type_name = f".{PACKAGE}.{type_name}"
        elif type_name in messages:
            field.type = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
            field.type_name = f".{PACKAGE}.{type_name}"
        else:
            raise ValueError(f"caffe schema: unknown type {type_name!r} in {msg.name}.{name}")
        for key, value in _OPTION.findall(opts or ""):
            if key == "packed":
                field.options.packed = value == "true"
            elif key == "default":
                value = value.strip('"')
                if field.type == descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT and value.endswith("."):
                    value += "0"
                field.default_value = value
    return fdp


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file_proto())


def _message(name: str):
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{PACKAGE}.{name}"))


NetParameter = _message("NetParameter")
LayerParameter = _message("LayerParameter")
V1LayerParameter = _message("V1LayerParameter")
BlobProto = _message("BlobProto")
BlobShape = _message("BlobShape")
NetStateRule = _message("NetStateRule")

__all__ = ["NetParameter", "LayerParameter", "V1LayerParameter", "BlobProto", "BlobShape", "NetStateRule"]
