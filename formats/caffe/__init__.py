"""Caffe: ``.prototxt`` (net text) + ``.caffemodel`` (binary NetParameter with weights), no Caffe.

Messages come from :mod:`mconv.formats.caffe.pb` (caffe.proto's field numbers, built in Python).
Each Caffe layer becomes standard ONNX ops; the layer name becomes the node name (a layer that
needs several ops names them ``layer``, ``layer/1``, ...).

Rules
1. Structure: the prototxt when given (a deploy net), else the caffemodel's own layers. Weights:
   the caffemodel's blobs, matched to layers by name (as Caffe's CopyTrainedLayersFrom does).
   Old V1 nets (``layers`` with enum types) are upgraded to ``layer`` first.
2. Layers are filtered as Caffe's TEST phase does (include/exclude NetStateRules), except data
   layers, which are always read: their first top becomes the net input.
3. Net inputs, first match wins: ``options["input_shape"]``; ``input`` + ``input_shape`` /
   ``input_dim``; Input layers; MemoryData / DummyData shapes. A Data / ImageData / HDF5Data /
   WindowData layer has no shape: pass ``input_shape`` (or give the deploy prototxt). Its
   transform scale and mean are recorded in metadata (``mconv.input_scale``,
   ``mconv.input_mean``) and NOT baked into the graph: feed pixels already scaled.
4. The batch dimension of every input is symbolic (``N``) unless ``options["batch"]`` is an int.
5. Train-time layers (Dropout, Accuracy, losses, Silence) are skipped and named in
   ``mconv.import_notes`` (one note per line). A SoftmaxWithLoss is not turned into Softmax: the net's
   output is then the scores that fed it.
6. In-place layers (top == bottom) get a fresh SSA value name; Caffe's net outputs (blobs that
   no later layer reads) become the graph outputs.
7. Every layer no rule maps is collected; one UnsupportedError names all of them.
8. Pooling follows Caffe exactly: ceil-mode output size, the last window must start inside the
   image (pooled -= 1 when ``(pooled-1)*stride >= H + pad``, only when pad > 0), AVE divides by
   the window clipped to the PADDED image. ONNX gets explicit end padding and floor mode; AVE
   with pad > 0 becomes Pad(0) + AveragePool(count_include_pad=0), which has the same divisor.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import numpy as np
import onnx
import onnx_ir as ir
from google.protobuf import text_format
from google.protobuf.message import Message
from mconv.errors import InputError, UnsupportedError, show
from mconv.fileio import atomic_write_bytes
from mconv.formats import Format
from mconv.formats.caffe import pb
from mconv.irio import from_proto
from onnx import TensorProto, helper

OPSET = 17
IR_VERSION = 9
# No blob or activation may hold more elements than this (2**31: Caffe's own int32 count limit).
MAX_ELEMENTS = 1 << 31
# Caffe's kMaxBlobAxes: no blob, input or reshape target has more axes.
MAX_AXES = 32
FLT_MAX = float(np.finfo(np.float32).max)

DATA_LAYERS = {"Data", "ImageData", "HDF5Data", "WindowData", "MemoryData", "DummyData", "AnnotatedData"}
TRAIN_ONLY_LAYERS = {
    "Dropout",
    "Accuracy",
    "Silence",
    "SoftmaxWithLoss",
    "EuclideanLoss",
    "SigmoidCrossEntropyLoss",
    "HingeLoss",
    "InfogainLoss",
    "MultinomialLogisticLoss",
    "ContrastiveLoss",
    "HDF5Output",
}

V1_TYPES = {
    "ABSVAL": "AbsVal",
    "ACCURACY": "Accuracy",
    "ARGMAX": "ArgMax",
    "BNLL": "BNLL",
    "CONCAT": "Concat",
    "CONTRASTIVE_LOSS": "ContrastiveLoss",
    "CONVOLUTION": "Convolution",
    "DATA": "Data",
    "DECONVOLUTION": "Deconvolution",
    "DROPOUT": "Dropout",
    "DUMMY_DATA": "DummyData",
    "EUCLIDEAN_LOSS": "EuclideanLoss",
    "ELTWISE": "Eltwise",
    "EXP": "Exp",
    "FLATTEN": "Flatten",
    "HDF5_DATA": "HDF5Data",
    "HDF5_OUTPUT": "HDF5Output",
    "HINGE_LOSS": "HingeLoss",
    "IM2COL": "Im2col",
    "IMAGE_DATA": "ImageData",
    "INFOGAIN_LOSS": "InfogainLoss",
    "INNER_PRODUCT": "InnerProduct",
    "LRN": "LRN",
    "MEMORY_DATA": "MemoryData",
    "MULTINOMIAL_LOGISTIC_LOSS": "MultinomialLogisticLoss",
    "MVN": "MVN",
    "POOLING": "Pooling",
    "POWER": "Power",
    "RELU": "ReLU",
    "SIGMOID": "Sigmoid",
    "SIGMOID_CROSS_ENTROPY_LOSS": "SigmoidCrossEntropyLoss",
    "SILENCE": "Silence",
    "SOFTMAX": "Softmax",
    "SOFTMAX_LOSS": "SoftmaxWithLoss",
    "SPLIT": "Split",
    "SLICE": "Slice",
    "TANH": "TanH",
    "WINDOW_DATA": "WindowData",
    "THRESHOLD": "Threshold",
}


# ----------------------------------------------------------------------------------------------
# Reading files


def _is_text(data: bytes, path: Path) -> bool:
    name = path.name.lower()
    if name.endswith((".prototxt", ".pbtxt", ".txt")):
        return True
    if name.endswith((".caffemodel", ".binaryproto")):
        return False
    try:
        head = data[:4096].decode("utf-8")
    except UnicodeDecodeError:
        return False
    return "layer" in head or "input" in head or "name:" in head


def parse_prototxt(text: str, path: str = "<prototxt>", notes: list[str] | None = None):
    """Parse a text NetParameter. Unknown fields are skipped (noted) after a strict attempt fails."""
    _check_nesting(text, path)
    net = pb.NetParameter()
    try:
        text_format.Parse(text, net)
        return net
    except text_format.ParseError as exc:
        strict_error = exc
    except RecursionError:
        raise _too_deep(path) from None
    if "has no field named" not in str(strict_error):
        raise _text_error(strict_error, path)
    net = pb.NetParameter()
    try:
        text_format.Parse(text, net, allow_unknown_field=True)
    except text_format.ParseError as exc:
        raise _text_error(exc, path) from None
    except RecursionError:
        raise _too_deep(path) from None
    if notes is not None:
        notes.append(
            f"prototxt fields unknown to caffe.proto were ignored (first: {show(strict_error, 200)})"
        )
    return net


# caffe.proto nests messages a few levels deep (net > layer > param > filler); a prototxt nested
# deeper than this is not a Caffe net, and protobuf's recursive text parser would overflow the stack.
MAX_NESTING = 64
# Braces, angle brackets, quoted strings (skipped: they may hold braces) and # comments.
_NESTING_TOKENS = re.compile(r"""[{}<>]|"(?:[^"\\\n]|\\.)*"?|'(?:[^'\\\n]|\\.)*'?|#[^\n]*""")


def _check_nesting(text: str, path: str) -> None:
    """Refuse a prototxt whose messages nest deeper than ``MAX_NESTING`` (one linear scan)."""
    depth = 0
    for m in _NESTING_TOKENS.finditer(text):
        ch = m.group()[0]
        if ch in "{<":
            depth += 1
            if depth > MAX_NESTING:
                line = text.count("\n", 0, m.start()) + 1
                raise _too_deep(path, f"line {line}")
        elif ch in "}>":
            depth -= 1


def _too_deep(path: str, where: str | None = None) -> InputError:
    return InputError(
        f"prototxt messages nest more than {MAX_NESTING} levels deep",
        path=path,
        where=where,
        hint="a Caffe net nests a few levels (net, layer, parameter); the file is damaged or not a prototxt",
    )


def _text_error(exc: text_format.ParseError, path: str) -> InputError:
    line, col = exc.GetLine(), exc.GetColumn()
    where = f"line {line}, column {col}" if line is not None else None
    msg = str(exc).split(" : ", 1)[-1] if line is not None else str(exc)
    return InputError(
        f"prototxt syntax error: {show(msg, 200)}",
        path=path,
        where=where,
        hint="fix the prototxt text (caffe.proto field names and braces)",
    )


def parse_caffemodel(data: bytes, path: str = "<caffemodel>"):
    """Parse a binary NetParameter (a ``.caffemodel``)."""
    if data.startswith(b"\x89HDF"):
        raise InputError(
            "HDF5 caffemodel (.caffemodel.h5) is not supported",
            path=path,
            where="byte 0: HDF5 signature",
            hint="save the net as a binary proto caffemodel",
        )
    net = pb.NetParameter()
    try:
        net.ParseFromString(data)
    except Exception as exc:  # DecodeError, or RuntimeError from upb on deep nesting
        raise InputError(
            f"not a valid caffemodel ({type(exc).__name__}: {show(exc, 100)})",
            path=path,
            where=f"{len(data)} bytes",
            hint="the file is truncated or corrupt",
        ) from None
    if not net.layer and not net.layers:
        raise InputError(
            "caffemodel holds no layers",
            path=path,
            where=f"{len(data)} bytes",
            hint="is this a Caffe NetParameter (.caffemodel)?",
        )
    return net


def read_net(path: str | Path, notes: list[str] | None = None):
    """Read a prototxt or caffemodel (by extension, then content) into a NetParameter."""
    p = Path(path)
    data = p.read_bytes()
    if _is_text(data, p):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(
                "prototxt is not UTF-8 text",
                path=str(p),
                where=f"byte {exc.start}",
                hint="give the .prototxt text file",
            ) from None
        return parse_prototxt(text, str(p), notes), "text"
    return parse_caffemodel(data, str(p)), "binary"


def upgrade_v1(net, path: str | None = None) -> None:
    """Move V1 ``layers`` (enum types) into ``layer`` in place, as Caffe's UpgradeV1Net does."""
    if not net.layers:
        return
    if net.layer:
        raise InputError(
            "net mixes V1 'layers' and new 'layer' fields",
            path=path,
            hint="upgrade the net with Caffe's tools",
        )
    for v1 in net.layers:
        layer = net.layer.add()
        layer.name = v1.name
        enum_name = pb.V1LayerParameter.LayerType.Name(v1.type) if v1.type in _V1_NUMBERS else "NONE"
        layer.type = V1_TYPES.get(enum_name, enum_name)
        layer.bottom.extend(v1.bottom)
        layer.top.extend(v1.top)
        layer.blobs.extend(v1.blobs)
        layer.include.extend(v1.include)
        layer.exclude.extend(v1.exclude)
        for fd, value in v1.ListFields():
            if fd.name.endswith("_param") and fd.name in _LAYER_FIELDS:
                getattr(layer, fd.name).CopyFrom(value)
    del net.layers[:]


_V1_NUMBERS = set(pb.V1LayerParameter.LayerType.values())
_LAYER_FIELDS = set(pb.LayerParameter.DESCRIPTOR.fields_by_name)


# ----------------------------------------------------------------------------------------------
# Writing (fixtures, tests, round trips)


def make_blob(array: np.ndarray):
    """A BlobProto with ``shape`` and float ``data`` (what current Caffe writes)."""
    a = np.asarray(array, dtype=np.float32)
    blob = pb.BlobProto()
    blob.shape.dim.extend(int(d) for d in a.shape)
    blob.data.extend(a.ravel().tolist())
    return blob


def write_caffemodel(net, dest: str | Path) -> Path:
    """Serialize a NetParameter as a binary ``.caffemodel`` (atomically)."""
    atomic_write_bytes(dest, net.SerializeToString())
    return Path(dest)


def write_prototxt(net, dest: str | Path) -> Path:
    """Write a NetParameter as prototxt text without blobs (a deploy net), atomically."""
    copy = pb.NetParameter()
    copy.CopyFrom(net)
    for layer in copy.layer:
        del layer.blobs[:]
    atomic_write_bytes(dest, text_format.MessageToString(copy).encode())
    return Path(dest)


# ----------------------------------------------------------------------------------------------
# Graph building


@dataclass
class Blob:
    """A Caffe blob as it flows through the graph: its current ONNX value name and static shape."""

    value: str
    shape: tuple[int, ...]


@dataclass
class _Builder:
    path: str
    nodes: list = field(default_factory=list)
    initializers: list = field(default_factory=list)
    used: set = field(default_factory=set)
    notes: list = field(default_factory=list)

    # The next suffix to try for each base: a base taken N times costs O(1) per new name, not O(N).
    _next: dict = field(default_factory=dict)

    def fresh(self, base: str) -> str:
        return _fresh_name(base, self.used, self._next)

    def const(self, base: str, array: np.ndarray | np.generic) -> str:
        name = self.fresh(base)
        self.initializers.append(onnx.numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def ints(self, base: str, values) -> str:
        return self.const(base, np.asarray(list(values), dtype=np.int64))

    def node(
        self, op: str, inputs: list[str], node_name: str, *, outputs: int = 1, out_names=None, **attrs
    ) -> list[str]:
        outs = list(out_names) if out_names else [self.fresh(f"{node_name}:{op}") for _ in range(outputs)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=self.fresh_node(node_name), **attrs))
        return outs

    _node_names: set = field(default_factory=set)
    _node_next: dict = field(default_factory=dict)

    def fresh_node(self, layer: str) -> str:
        return _fresh_name(layer, self._node_names, self._node_next)


def _fresh_name(base: str, used: set, next_suffix: dict) -> str:
    """``base`` if free, else the first free ``base/1``, ``base/2``, ... (added to ``used``).

    ``next_suffix`` remembers where the search for each base stopped, so a base asked for N times
    (N in-place layers writing one blob) costs N probes in all, not N**2 / 2."""
    if base not in used:
        used.add(base)
        return base
    i = next_suffix.get(base, 1)
    name = f"{base}/{i}"
    while name in used:
        i += 1
        name = f"{base}/{i}"
    next_suffix[base] = i + 1
    used.add(name)
    return name


@dataclass
class LayerCtx:
    """What one layer converter sees."""

    b: _Builder
    layer: Message  # a caffe LayerParameter (its class is built at run time: caffe_pb)
    weights: list  # BlobProto list
    bottoms: list[Blob]
    top_names: list[str]  # fresh ONNX value names for the tops, in order
    weights_path: str | None = None  # the file the weight blobs came from (the caffemodel, if given)

    @property
    def name(self) -> str:
        return self.layer.name

    @property
    def where(self) -> str:
        return f"layer '{show(self.name)}' ({show(self.layer.type)})"

    def fail(self, message: str, hint: str = "check the layer's parameters") -> InputError:
        return InputError(message, path=self.b.path, where=self.where, hint=hint)

    def blob_fail(self, message: str, hint: str) -> InputError:
        """A weight blob that does not fit the layer: the error names the file the blobs came from."""
        return InputError(message, path=self.weights_path or self.b.path, where=self.where, hint=hint)

    def blob(self, i: int, shape: tuple[int, ...], what: str) -> np.ndarray:
        """Weight blob ``i`` reshaped to ``shape`` (its element count must match)."""
        if i >= len(self.weights):
            raise self.blob_fail(
                f"missing weight blob {i} ({what}): the layer has {len(self.weights)} blob(s)",
                hint="give the trained .caffemodel that matches this net",
            )
        arr = self.weights[i]
        expected = math.prod(shape)
        if arr.size != expected:
            raise self.blob_fail(
                f"blob {i} ({what}) has {arr.size} values with shape {list(arr.shape)}, "
                f"expected shape {list(shape)} ({expected} values)",
                hint="the caffemodel does not match the prototxt",
            )
        return arr.reshape(shape)

    def out(self, i: int = 0) -> str:
        return self.top_names[i]

    def node(self, op: str, inputs: list[str], *, last: bool = True, index: int = 0, **attrs) -> str:
        """Add a node; ``last`` makes its output the layer's top ``index``."""
        # The node that writes a top carries the layer's name; helper nodes get "layer/op".
        names = [self.top_names[index]] if last else None
        node_name = self.name if last else f"{self.name}/{op.lower()}"
        return self.b.node(op, inputs, node_name, out_names=names, **attrs)[0]


Converter = Callable[[LayerCtx], list[tuple[int, ...]]]
CONVERTERS: dict[str, Converter] = {}


def converts(*types: str) -> Callable[[Converter], Converter]:
    def deco(fn: Converter) -> Converter:
        for t in types:
            CONVERTERS[t] = fn
        return fn

    return deco


def _axis(ctx: LayerCtx, axis: int, rank: int) -> int:
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < rank:
        raise ctx.fail(f"axis {axis} out of range for a {rank}-D input")
    return a


def _one_bottom(ctx: LayerCtx) -> Blob:
    if len(ctx.bottoms) != 1:
        raise ctx.fail(f"expects 1 bottom, got {len(ctx.bottoms)}")
    return ctx.bottoms[0]


# --- convolution -------------------------------------------------------------------------------


def _spatial(ctx: LayerCtx, p, n: int) -> tuple[list[int], list[int], list[int], list[int]]:
    """Kernel, pad, stride, dilation of a ConvolutionParameter, each with ``n`` entries."""

    def expand(values, default, what):
        values = list(values)
        if not values:
            return [default] * n
        if len(values) == 1:
            return values * n
        if len(values) != n:
            raise ctx.fail(f"{what} has {len(values)} values for {n} spatial axes")
        return values

    if p.HasField("kernel_h") or p.HasField("kernel_w"):
        if n != 2:
            raise ctx.fail("kernel_h/kernel_w need 2 spatial axes")
        kernel = [p.kernel_h, p.kernel_w]
    else:
        if not p.kernel_size:
            raise ctx.fail("no kernel_size", hint="set kernel_size or kernel_h/kernel_w")
        kernel = expand(p.kernel_size, 1, "kernel_size")
    if p.HasField("pad_h") or p.HasField("pad_w"):
        pad = [p.pad_h, p.pad_w]
    else:
        pad = expand(p.pad, 0, "pad")
    if p.HasField("stride_h") or p.HasField("stride_w"):
        stride = [p.stride_h, p.stride_w]
    else:
        stride = expand(p.stride, 1, "stride")
    dilation = expand(p.dilation, 1, "dilation")
    if min(kernel) < 1 or min(stride) < 1 or min(dilation) < 1:
        raise ctx.fail(f"kernel {kernel}, stride {stride} and dilation {dilation} must be >= 1")
    return kernel, pad, stride, dilation


def _conv_common(ctx: LayerCtx):
    x = _one_bottom(ctx)
    p = ctx.layer.convolution_param
    if p.axis != 1:
        raise ctx.fail(f"convolution axis {p.axis} is not supported (only 1, channels)")
    if len(x.shape) < 3:
        raise ctx.fail(f"input {list(x.shape)} has no spatial axes")
    n = len(x.shape) - 2
    kernel, pad, stride, dilation = _spatial(ctx, p, n)
    group, num_output, channels = p.group, p.num_output, x.shape[1]
    if num_output < 1 or group < 1 or channels % group or num_output % group:
        raise ctx.fail(
            f"num_output {num_output} and channels {channels} must be positive multiples of group {group}"
        )
    return x, p, kernel, pad, stride, dilation, group, num_output, channels


@converts("Convolution")
def _convolution(ctx: LayerCtx):
    x, p, kernel, pad, stride, dilation, group, num_output, channels = _conv_common(ctx)
    out_sp = [
        (h + 2 * pd - (d * (k - 1) + 1)) // s + 1
        for h, k, pd, s, d in zip(x.shape[2:], kernel, pad, stride, dilation)
    ]
    if min(out_sp) < 1:
        raise ctx.fail(f"kernel {kernel} does not fit the input {list(x.shape)}")
    w = ctx.blob(0, (num_output, channels // group, *kernel), "weights")
    inputs = [x.value, ctx.b.const(f"{ctx.name}.weight", w)]
    if p.bias_term:
        inputs.append(ctx.b.const(f"{ctx.name}.bias", ctx.blob(1, (num_output,), "bias")))
    ctx.node(
        "Conv", inputs, kernel_shape=kernel, pads=pad + pad, strides=stride, dilations=dilation, group=group
    )
    return [(x.shape[0], num_output, *out_sp)]


@converts("Deconvolution")
def _deconvolution(ctx: LayerCtx):
    x, p, kernel, pad, stride, dilation, group, num_output, channels = _conv_common(ctx)
    out_sp = [
        s * (h - 1) + d * (k - 1) + 1 - 2 * pd
        for h, k, pd, s, d in zip(x.shape[2:], kernel, pad, stride, dilation)
    ]
    if min(out_sp) < 1:
        raise ctx.fail(f"output size {out_sp} is not positive")
    # Caffe stores deconvolution weights as (C_in, num_output/group, k...), ONNX ConvTranspose's layout.
    w = ctx.blob(0, (channels, num_output // group, *kernel), "weights")
    inputs = [x.value, ctx.b.const(f"{ctx.name}.weight", w)]
    if p.bias_term:
        inputs.append(ctx.b.const(f"{ctx.name}.bias", ctx.blob(1, (num_output,), "bias")))
    ctx.node(
        "ConvTranspose",
        inputs,
        kernel_shape=kernel,
        pads=pad + pad,
        strides=stride,
        dilations=dilation,
        group=group,
    )
    return [(x.shape[0], num_output, *out_sp)]


@converts("InnerProduct")
def _inner_product(ctx: LayerCtx):
    x = _one_bottom(ctx)
    p = ctx.layer.inner_product_param
    axis = _axis(ctx, p.axis, len(x.shape))
    k = math.prod(x.shape[axis:])
    n = p.num_output
    if n < 1:
        raise ctx.fail("num_output must be >= 1")
    w_shape = (k, n) if p.transpose else (n, k)
    w = ctx.blob(0, w_shape, "weights")
    bias = ctx.blob(1, (n,), "bias") if p.bias_term else None
    if axis == 1 or len(x.shape) == 2:
        flat = x.value
        if len(x.shape) != 2:
            flat = ctx.node("Flatten", [x.value], last=False, axis=1)
        inputs = [flat, ctx.b.const(f"{ctx.name}.weight", w)]
        if bias is not None:
            inputs.append(ctx.b.const(f"{ctx.name}.bias", bias))
        ctx.node("Gemm", inputs, transB=0 if p.transpose else 1)
        return [(x.shape[0], n)]
    flat = ctx.node("Reshape", [x.value, ctx.b.ints(f"{ctx.name}.shape", [0] * axis + [k])], last=False)
    w_kn = w if p.transpose else w.T
    y = ctx.node(
        "MatMul", [flat, ctx.b.const(f"{ctx.name}.weight", np.ascontiguousarray(w_kn))], last=bias is None
    )
    if bias is not None:
        ctx.node("Add", [y, ctx.b.const(f"{ctx.name}.bias", bias)])
    return [(*x.shape[:axis], n)]


# --- pooling -----------------------------------------------------------------------------------


def caffe_pooled_size(size: int, kernel: int, pad: int, stride: int, ceil_mode: bool = True) -> int:
    """Caffe's PoolingLayer::Reshape output size for one spatial axis."""
    span = size + 2 * pad - kernel
    pooled = (-(-span // stride) if ceil_mode else span // stride) + 1
    if pad and (pooled - 1) * stride >= size + pad:
        pooled -= 1  # the last window must start inside the image (or its begin padding)
    return pooled


class _PoolAttrs(TypedDict, total=False):
    """A pooling node's attributes."""

    kernel_shape: list[int]
    strides: list[int]
    pads: list[int]


@converts("Pooling")
def _pooling(ctx: LayerCtx):
    x = _one_bottom(ctx)
    p = ctx.layer.pooling_param
    if len(x.shape) != 4:
        raise ctx.fail(f"pooling needs a 4-D input, got {list(x.shape)}")
    n, c, h, w = x.shape
    if p.pool not in (0, 1):
        raise UnsupportedError([(show(ctx.name), "Pooling(STOCHASTIC)")], what="layer", path=ctx.b.path)
    is_max = p.pool == 0
    if p.global_pooling:
        ctx.node("GlobalMaxPool" if is_max else "GlobalAveragePool", [x.value])
        return [(n, c, 1, 1)]
    if p.HasField("kernel_h") or p.HasField("kernel_w"):
        kernel = [p.kernel_h, p.kernel_w]
    elif p.HasField("kernel_size"):
        kernel = [p.kernel_size] * 2
    else:
        raise ctx.fail("no kernel_size", hint="set kernel_size, kernel_h/kernel_w or global_pooling")
    pad = [p.pad_h, p.pad_w] if (p.HasField("pad_h") or p.HasField("pad_w")) else [p.pad] * 2
    stride = (
        [p.stride_h, p.stride_w] if (p.HasField("stride_h") or p.HasField("stride_w")) else [p.stride] * 2
    )
    if min(kernel) < 1 or min(stride) < 1:
        raise ctx.fail(f"kernel {kernel} and stride {stride} must be >= 1")
    if pad[0] >= kernel[0] or pad[1] >= kernel[1]:
        raise ctx.fail(f"pad {pad} must be smaller than kernel {kernel} (Caffe checks this too)")
    ceil_mode = p.round_mode == 0
    out = [caffe_pooled_size(s, k, pd, st, ceil_mode) for s, k, pd, st in zip((h, w), kernel, pad, stride)]
    if min(out) < 1:
        raise ctx.fail(f"kernel {kernel} does not fit the input {list(x.shape)}")
    # Floor-mode ONNX pooling gives ``out`` windows when the input is extended to (out-1)*s + k.
    end = [(o - 1) * st + k - s - pd for o, st, k, s, pd in zip(out, stride, kernel, (h, w), pad)]
    if min(end) < 0:
        raise ctx.fail("pooling windows end before the padded image ends; cannot express this in ONNX")
    attrs: _PoolAttrs = {"kernel_shape": kernel, "strides": stride}
    if is_max:
        if max(pad) or max(end):
            if all(e < k for e, k in zip(end, kernel)):
                attrs["pads"] = [pad[0], pad[1], end[0], end[1]]
                ctx.node("MaxPool", [x.value], **attrs)
            else:  # a window entirely in the padding: Caffe outputs -FLT_MAX there
                padded = ctx.node(
                    "Pad",
                    [
                        x.value,
                        ctx.b.ints(f"{ctx.name}.pads", [0, 0, pad[0], pad[1], 0, 0, end[0], end[1]]),
                        ctx.b.const(f"{ctx.name}.pad_value", np.float32(-FLT_MAX)),
                    ],
                    last=False,
                    mode="constant",
                )
                ctx.node("MaxPool", [padded], **attrs)
        else:
            ctx.node("MaxPool", [x.value], **attrs)
        return [(n, c, *out)]
    # Windows reach ``end`` past the image: the first min(pad, end) of it is Caffe's padding (counted
    # in the divisor), the rest is ceil-mode overhang (not counted).
    zero_end = [min(pd, e) for pd, e in zip(pad, end)]
    extra = [max(e - pd, 0) for e, pd in zip(end, pad)]
    if extra[0] >= kernel[0] or extra[1] >= kernel[1]:
        raise ctx.fail("average pooling windows that lie outside the padded image are not supported")
    src = x.value
    if max(pad):
        # Zeros that count in the divisor (Caffe counts the padded image) ...
        src = ctx.node(
            "Pad",
            [x.value, ctx.b.ints(f"{ctx.name}.pads", [0, 0, pad[0], pad[1], 0, 0, *zero_end])],
            last=False,
            mode="constant",
        )
    if max(extra):
        # ... and an overhang that does not (count_include_pad=0 skips ONNX's own padding).
        attrs["pads"] = [0, 0, extra[0], extra[1]]
    ctx.node("AveragePool", [src], count_include_pad=0, **attrs)
    return [(n, c, *out)]


# --- normalization -----------------------------------------------------------------------------


@converts("LRN")
def _lrn(ctx: LayerCtx):
    x = _one_bottom(ctx)
    p = ctx.layer.lrn_param
    size = p.local_size
    if size < 1 or size % 2 == 0:
        raise ctx.fail(f"local_size {size} must be odd (Caffe requires it)")
    if len(x.shape) != 4:
        raise ctx.fail(f"LRN needs a 4-D input, got {list(x.shape)}")
    if p.norm_region == 0:  # ACROSS_CHANNELS: ONNX LRN is the same formula
        ctx.node("LRN", [x.value], size=size, alpha=p.alpha, beta=p.beta, bias=p.k)
        return [x.shape]
    # WITHIN_CHANNEL: y = x * (1 + alpha * avg_{size x size, zero pad}(x^2)) ^ -beta  (k unused by Caffe)
    half = (size - 1) // 2
    sq = ctx.node("Mul", [x.value, x.value], last=False)
    avg = ctx.node(
        "AveragePool",
        [sq],
        last=False,
        kernel_shape=[size, size],
        pads=[half] * 4,
        count_include_pad=1,
        strides=[1, 1],
    )
    scaled = ctx.node("Mul", [avg, ctx.b.const(f"{ctx.name}.alpha", np.float32(p.alpha))], last=False)
    shifted = ctx.node("Add", [scaled, ctx.b.const(f"{ctx.name}.one", np.float32(1.0))], last=False)
    powered = ctx.node("Pow", [shifted, ctx.b.const(f"{ctx.name}.neg_beta", np.float32(-p.beta))], last=False)
    ctx.node("Mul", [x.value, powered])
    return [x.shape]


@converts("BatchNorm")
def _batch_norm(ctx: LayerCtx):
    x = _one_bottom(ctx)
    if len(x.shape) < 2:
        raise ctx.fail(f"BatchNorm needs a channel axis, input is {list(x.shape)}")
    c = x.shape[1]
    mean = ctx.blob(0, (c,), "mean")
    var = ctx.blob(1, (c,), "variance")
    factor = float(ctx.blob(2, (1,), "moving-average scale factor")[0])
    # Caffe divides the stored sums by the scale factor (0 means "no statistics": use zeros).
    inv = 0.0 if factor == 0 else 1.0 / factor
    eps = ctx.layer.batch_norm_param.eps
    ctx.node(
        "BatchNormalization",
        [
            x.value,
            ctx.b.const(f"{ctx.name}.scale", np.ones(c, np.float32)),
            ctx.b.const(f"{ctx.name}.bias", np.zeros(c, np.float32)),
            ctx.b.const(f"{ctx.name}.mean", (mean * inv).astype(np.float32)),
            ctx.b.const(f"{ctx.name}.var", (var * inv).astype(np.float32)),
        ],
        epsilon=eps,
    )
    return [x.shape]


def _param_shape(ctx: LayerCtx, x: Blob, axis: int, num_axes: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shape of a Scale/Bias parameter and the shape it broadcasts as against ``x``."""
    a = _axis(ctx, axis, len(x.shape)) if len(x.shape) else 0
    end = len(x.shape) if num_axes == -1 else a + num_axes
    if num_axes < -1 or end > len(x.shape):
        raise ctx.fail(f"num_axes {num_axes} does not fit the input {list(x.shape)}")
    shape = tuple(x.shape[a:end])
    return shape, shape + (1,) * (len(x.shape) - end)


def _scale_or_bias(ctx: LayerCtx, op: str, param, with_bias: bool):
    x = ctx.bottoms[0]
    if len(ctx.bottoms) == 2:  # the factor is the second bottom
        other = ctx.bottoms[1]
        a = _axis(ctx, param.axis, len(x.shape)) if other.shape else 0
        if tuple(x.shape[a : a + len(other.shape)]) != tuple(other.shape):
            raise ctx.fail(
                f"second bottom {list(other.shape)} does not match input {list(x.shape)} at axis {a}"
            )
        target = tuple(other.shape) + (1,) * (len(x.shape) - a - len(other.shape))
        factor = ctx.node("Reshape", [other.value, ctx.b.ints(f"{ctx.name}.shape", target)], last=False)
        weights_from = 0
    elif len(ctx.bottoms) == 1:
        shape, target = _param_shape(ctx, x, param.axis, param.num_axes)
        factor = ctx.b.const(
            f"{ctx.name}.{'scale' if op == 'Mul' else 'bias'}",
            ctx.blob(0, shape, op == "Mul" and "scale" or "bias").reshape(target),
        )
        weights_from = 1
    else:
        raise ctx.fail(f"expects 1 or 2 bottoms, got {len(ctx.bottoms)}")
    y = ctx.node(op, [x.value, factor], last=not with_bias)
    if with_bias:
        shape, target = _param_shape(
            ctx, x, param.axis, param.num_axes if len(ctx.bottoms) == 1 else len(ctx.bottoms[1].shape)
        )
        bias = ctx.blob(weights_from, shape, "bias").reshape(target)
        ctx.node("Add", [y, ctx.b.const(f"{ctx.name}.bias", bias)])
    return [x.shape]


@converts("Scale")
def _scale(ctx: LayerCtx):
    p = ctx.layer.scale_param
    return _scale_or_bias(ctx, "Mul", p, p.bias_term)


@converts("Bias")
def _bias(ctx: LayerCtx):
    return _scale_or_bias(ctx, "Add", ctx.layer.bias_param, False)


# --- activations -------------------------------------------------------------------------------


@converts("ReLU")
def _relu(ctx: LayerCtx):
    x = _one_bottom(ctx)
    slope = ctx.layer.relu_param.negative_slope
    if slope:
        ctx.node("LeakyRelu", [x.value], alpha=slope)
    else:
        ctx.node("Relu", [x.value])
    return [x.shape]


@converts("PReLU")
def _prelu(ctx: LayerCtx):
    x = _one_bottom(ctx)
    if len(x.shape) < 2:
        raise ctx.fail(f"PReLU needs a channel axis, input is {list(x.shape)}")
    n = 1 if ctx.layer.prelu_param.channel_shared else x.shape[1]
    slope = ctx.blob(0, (n,), "slopes").reshape((n,) + (1,) * (len(x.shape) - 2))
    ctx.node("PRelu", [x.value, ctx.b.const(f"{ctx.name}.slope", slope)])
    return [x.shape]


_UNARY = {"Sigmoid": "Sigmoid", "TanH": "Tanh", "AbsVal": "Abs", "BNLL": "Softplus"}


@converts(*_UNARY)
def _unary(ctx: LayerCtx):
    x = _one_bottom(ctx)
    ctx.node(_UNARY[ctx.layer.type], [x.value])
    return [x.shape]


@converts("ELU")
def _elu(ctx: LayerCtx):
    x = _one_bottom(ctx)
    ctx.node("Elu", [x.value], alpha=ctx.layer.elu_param.alpha)
    return [x.shape]


def _affine(ctx: LayerCtx, src: str, scale: float, shift: float, last: bool) -> str:
    """``shift + scale * src`` with only the ops that change anything."""
    y = src
    if scale != 1.0:
        y = ctx.node(
            "Mul", [y, ctx.b.const(f"{ctx.name}.scale", np.float32(scale))], last=last and shift == 0.0
        )
    if shift != 0.0:
        y = ctx.node("Add", [y, ctx.b.const(f"{ctx.name}.shift", np.float32(shift))], last=last)
    return y


@converts("Power")
def _power(ctx: LayerCtx):
    x = _one_bottom(ctx)
    p = ctx.layer.power_param
    if p.power == 1.0 and p.scale == 1.0 and p.shift == 0.0:
        ctx.node("Identity", [x.value])
        return [x.shape]
    y = _affine(ctx, x.value, p.scale, p.shift, last=p.power == 1.0)
    if p.power != 1.0:
        ctx.node("Pow", [y, ctx.b.const(f"{ctx.name}.power", np.float32(p.power))])
    return [x.shape]


@converts("Exp")
def _exp(ctx: LayerCtx):
    # y = base ^ (shift + scale * x) = exp(ln(base) * (shift + scale * x)); base -1 means e.
    x = _one_bottom(ctx)
    p = ctx.layer.exp_param
    if p.base != -1 and p.base <= 0:
        raise ctx.fail(f"base {p.base} must be positive (or -1 for e)")
    ln_base = 1.0 if p.base == -1 else math.log(p.base)
    y = _affine(ctx, x.value, p.scale * ln_base, p.shift * ln_base, last=False)
    ctx.node("Exp", [y])
    return [x.shape]


# --- shape, combine, split ---------------------------------------------------------------------


@converts("Softmax")
def _softmax(ctx: LayerCtx):
    x = _one_bottom(ctx)
    ctx.node("Softmax", [x.value], axis=_axis(ctx, ctx.layer.softmax_param.axis, len(x.shape)))
    return [x.shape]


@converts("Flatten")
def _flatten(ctx: LayerCtx):
    x = _one_bottom(ctx)
    p = ctx.layer.flatten_param
    rank = len(x.shape)
    start, end = _axis(ctx, p.axis, rank), _axis(ctx, p.end_axis, rank)
    if end < start:
        raise ctx.fail(f"end_axis {p.end_axis} comes before axis {p.axis}")
    out = (*x.shape[:start], math.prod(x.shape[start : end + 1]), *x.shape[end + 1 :])
    # Keep the batch axis symbolic: copy leading axes (0), infer the flattened one (-1).
    spec = [0] * start + [-1] + list(x.shape[end + 1 :])
    ctx.node("Reshape", [x.value, ctx.b.ints(f"{ctx.name}.shape", spec)])
    return [out]


@converts("Reshape")
def _reshape(ctx: LayerCtx):
    x = _one_bottom(ctx)
    p = ctx.layer.reshape_param
    rank = len(x.shape)
    axis = p.axis + rank + 1 if p.axis < 0 else p.axis
    end = rank if p.num_axes == -1 else axis + p.num_axes
    if not 0 <= axis <= rank or p.num_axes < -1 or end > rank:
        raise ctx.fail(f"axis {p.axis} / num_axes {p.num_axes} do not fit the input {list(x.shape)}")
    dims = list(p.shape.dim)
    if len(dims) > MAX_AXES:
        raise ctx.fail(f"shape has {len(dims)} axes (Caffe allows {MAX_AXES})")
    if dims.count(-1) > 1 or any(d < -1 for d in dims):
        raise ctx.fail(f"shape {dims}: at most one -1 and no other negative dims")
    spec = [0] * axis + dims + list(x.shape[end:])
    out = [x.shape[axis + i] if d == 0 and axis + i < rank else d for i, d in enumerate(dims)]
    if any(d == 0 and axis + i >= rank for i, d in enumerate(dims)):
        raise ctx.fail(f"shape {dims} copies an axis the input does not have")
    out = list(x.shape[:axis]) + out + list(x.shape[end:])
    total = math.prod(x.shape)
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        if known == 0 or total % known:
            raise ctx.fail(f"cannot reshape {list(x.shape)} to {dims}")
        out[out.index(-1)] = total // known
    if math.prod(out) != total:
        raise ctx.fail(f"cannot reshape {list(x.shape)} ({total} values) to {out}")
    ctx.node("Reshape", [x.value, ctx.b.ints(f"{ctx.name}.shape", spec)])
    return [tuple(out)]


@converts("Concat")
def _concat(ctx: LayerCtx):
    if not ctx.bottoms:
        raise ctx.fail("Concat needs at least one bottom")
    p = ctx.layer.concat_param
    axis_value = p.concat_dim if p.HasField("concat_dim") and not p.HasField("axis") else p.axis
    rank = len(ctx.bottoms[0].shape)
    axis = _axis(ctx, axis_value, rank)
    for b in ctx.bottoms:
        if len(b.shape) != rank or any(
            b.shape[i] != ctx.bottoms[0].shape[i] for i in range(rank) if i != axis
        ):
            raise ctx.fail(f"bottom shapes {[list(b.shape) for b in ctx.bottoms]} differ off axis {axis}")
    ctx.node("Concat", [b.value for b in ctx.bottoms], axis=axis)
    shape = list(ctx.bottoms[0].shape)
    shape[axis] = sum(b.shape[axis] for b in ctx.bottoms)
    return [tuple(shape)]


@converts("Eltwise")
def _eltwise(ctx: LayerCtx):
    if len(ctx.bottoms) < 2:
        raise ctx.fail(f"Eltwise needs at least 2 bottoms, got {len(ctx.bottoms)}")
    shape = ctx.bottoms[0].shape
    if any(b.shape != shape for b in ctx.bottoms):
        raise ctx.fail(f"bottom shapes {[list(b.shape) for b in ctx.bottoms]} differ")
    p = ctx.layer.eltwise_param
    values = [b.value for b in ctx.bottoms]
    if p.operation == 1:  # SUM
        coeffs = list(p.coeff)
        if coeffs and len(coeffs) != len(values):
            raise ctx.fail(f"{len(coeffs)} coeff for {len(values)} bottoms")
        if coeffs and any(c != 1.0 for c in coeffs):
            values = [
                v
                if c == 1.0
                else ctx.node("Mul", [v, ctx.b.const(f"{ctx.name}.coeff{i}", np.float32(c))], last=False)
                for i, (v, c) in enumerate(zip(values, coeffs))
            ]
        ctx.node("Sum", values)
    elif p.operation == 0:  # PROD
        ctx.node("Mul", values) if len(values) == 2 else _chain(ctx, "Mul", values)
    else:
        ctx.node("Max", values)
    return [shape]


def _chain(ctx: LayerCtx, op: str, values: list[str]) -> None:
    acc = values[0]
    for i, v in enumerate(values[1:], start=2):
        acc = ctx.node(op, [acc, v], last=i == len(values))


@converts("Split")
def _split(ctx: LayerCtx):
    x = _one_bottom(ctx)
    for i in range(len(ctx.top_names)):
        ctx.node("Identity", [x.value], index=i)
    return [x.shape] * len(ctx.top_names)


@converts("Slice")
def _slice(ctx: LayerCtx):
    x = _one_bottom(ctx)
    p = ctx.layer.slice_param
    axis_value = p.slice_dim if p.HasField("slice_dim") and not p.HasField("axis") else p.axis
    axis = _axis(ctx, axis_value, len(x.shape))
    size, count = x.shape[axis], len(ctx.top_names)
    points = list(p.slice_point)
    if points:
        if len(points) != count - 1 or points != sorted(points) or points[0] <= 0 or points[-1] >= size:
            shown = points[:8] + (["..."] if len(points) > 8 else [])
            raise ctx.fail(f"slice_point {shown} does not split {size} into {count} parts")
        sizes = [b - a for a, b in zip([0] + points, points + [size])]
    else:
        if count < 1 or size % count:
            raise ctx.fail(f"axis size {size} does not split evenly into {count} tops")
        sizes = [size // count] * count
    outs = ctx.b.node(
        "Split",
        [x.value, ctx.b.ints(f"{ctx.name}.split", sizes)],
        ctx.name,
        out_names=ctx.top_names,
        axis=axis,
    )
    shapes = []
    for s in sizes:
        shape = list(x.shape)
        shape[axis] = s
        shapes.append(tuple(shape))
    del outs
    return shapes


# ----------------------------------------------------------------------------------------------
# The net


def _rule_meets_test(rule) -> bool:
    """Caffe's StateMeetsRule for the TEST state (phase TEST, level 0, no stages)."""
    if rule.HasField("phase") and rule.phase != 1:
        return False
    if rule.HasField("min_level") and rule.min_level > 0:
        return False
    if rule.HasField("max_level") and rule.max_level < 0:
        return False
    return not rule.stage


def _in_test_net(layer) -> bool:
    if layer.include:
        return any(_rule_meets_test(r) for r in layer.include)
    return not any(_rule_meets_test(r) for r in layer.exclude)


def _blob_array(blob, path: str, where: str, limit: int) -> np.ndarray:
    """A BlobProto's values as float32 with its shape, checked against its element count."""
    if blob.HasField("shape"):
        shape = [int(d) for d in blob.shape.dim]
    elif blob.num or blob.channels or blob.height or blob.width:
        shape = [blob.num, blob.channels, blob.height, blob.width]
    else:
        shape = [len(blob.data) or len(blob.double_data)]
    if len(shape) > MAX_AXES:
        raise InputError(
            f"blob shape has {len(shape)} axes (Caffe allows {MAX_AXES})",
            path=path,
            where=where,
            hint="the caffemodel is corrupt",
        )
    if any(d < 0 for d in shape):
        raise InputError(
            f"blob shape {shape} has a negative dimension",
            path=path,
            where=where,
            hint="the caffemodel is corrupt",
        )
    count = math.prod(shape)
    if count > limit:
        raise InputError(
            f"blob shape {shape} claims {count} values, more than the file can hold",
            path=path,
            where=where,
            hint="the caffemodel is corrupt",
        )
    values = blob.data if len(blob.data) else blob.double_data
    if len(values) != count:
        raise InputError(
            f"blob holds {len(values)} values but its shape {shape} needs {count}",
            path=path,
            where=where,
            hint="the caffemodel is truncated or corrupt",
        )
    return np.asarray(values, dtype=np.float32).reshape(shape)


def _parse_shape_option(value) -> dict[str | None, list[int]]:
    """``options["input_shape"]``: "1,3,224,224", [1,3,224,224] or {"data": [...]}."""

    def one(v):
        if isinstance(v, str):
            try:
                return [int(t) for t in v.replace("x", ",").split(",") if t.strip()]
            except ValueError:
                raise InputError(
                    f"input shape '{v}' is not a list of integers", hint="e.g. --input-shape 1,3,224,224"
                ) from None
        return [int(t) for t in v]

    if isinstance(value, dict):
        return {k: one(v) for k, v in value.items()}
    return {None: one(value)}


def _names(names, limit: int = 4) -> str:
    """A few names from the file, escaped, for a message: 'a', 'b', ... (N in all)."""
    names = list(names)
    shown = ", ".join(f"'{show(n)}'" for n in names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def _check_input_shape(name: str, shape: list[int], path: str) -> tuple[int, ...]:
    # The rank first: math.prod over a million huge dims would run for minutes.
    if not shape or len(shape) > MAX_AXES or any(d < 1 for d in shape) or math.prod(shape) > MAX_ELEMENTS:
        raise InputError(
            f"input '{show(name)}' has an unusable shape {shape[:12]}",
            path=path,
            hint="every dimension must be >= 1 and the total below 2**31",
        )
    return tuple(shape)


def net_to_model(
    net,
    weights: dict[str, list] | None,
    options: dict,
    *,
    path: str = "<caffe>",
    notes: list[str] | None = None,
    size_limit: int = MAX_ELEMENTS,
    weights_path: str | None = None,
) -> ir.Model:
    """Convert a NetParameter (structure) plus weight blobs by layer name into an ``ir.Model``.

    ``path`` is the file of the structure, ``weights_path`` the file of ``weights`` (the
    caffemodel; default ``path``): a blob that does not fit its layer is reported against it."""
    upgrade_v1(net, path)
    notes = list(notes or [])
    b = _Builder(path=path, notes=notes)
    weights_path = weights_path or path
    blobs: dict[str, Blob] = {}
    inputs: list[tuple[str, tuple[int, ...]]] = []
    metadata: dict[str, str] = {}
    override = _parse_shape_option(options["input_shape"]) if options.get("input_shape") else {}
    # The CLI's --input-shape NAME=dims arrives as options["input_shapes"] = {name: dims}.
    override.update({k: [int(d) for d in v] for k, v in (options.get("input_shapes") or {}).items()})
    batch = options.get("batch")

    def add_input(name: str, shape: list[int] | None, source: str) -> None:
        if name in blobs:
            return
        chosen = override.get(name) or (override.get(None) if not inputs else None) or shape
        if chosen is None:
            raise InputError(
                f"input '{show(name)}' of {source} has no shape",
                path=path,
                hint="pass input_shape (e.g. --input-shape 1,1,28,28) or give the deploy prototxt",
            )
        shp = _check_input_shape(name, list(chosen), path)
        value = b.fresh(name)
        blobs[name] = Blob(value, shp)
        inputs.append((value, shp))

    legacy_dims = list(net.input_dim)
    for i, name in enumerate(net.input):
        if i < len(net.input_shape):
            shape = list(net.input_shape[i].dim)
        elif len(legacy_dims) >= 4 * (i + 1):
            shape = legacy_dims[4 * i : 4 * i + 4]
        else:
            shape = None
        add_input(name, shape, "the net")

    unsupported: list[tuple[str, str]] = []
    consumed: set[str] = set()
    produced: list[str] = []
    seen_layers: set[str] = set()
    for index, layer in enumerate(net.layer):
        _check_utf8(layer, index, path)
        ltype = layer.type
        lname = layer.name or f"layer{index}"
        if ltype in DATA_LAYERS or ltype == "Input":
            _data_layer(layer, ltype, lname, add_input, notes, metadata)
            continue
        if not _in_test_net(layer):
            continue
        if ltype in TRAIN_ONLY_LAYERS:
            if ltype == "Dropout" and layer.bottom and layer.top and layer.bottom[0] in blobs:
                blobs[layer.top[0]] = blobs[layer.bottom[0]]  # identity at test time
            notes.append(f"skipped train-time layer '{show(lname)}' ({show(ltype)})")
            continue
        if ltype not in CONVERTERS:
            unsupported.append((show(lname), show(ltype) if ltype else "<no type>"))
            continue
        if unsupported:
            continue  # keep collecting names; the graph will not be built
        missing = [bt for bt in layer.bottom if bt not in blobs]
        if missing:
            raise InputError(
                f"bottom blob(s) {_names(missing)} are produced by no earlier layer",
                path=path,
                where=f"layer '{show(lname)}' ({show(ltype)})",
                hint="check the layer order and top names",
            )
        if lname in seen_layers:
            notes.append(f"layer name '{show(lname)}' repeats; weights are matched by name")
        seen_layers.add(lname)
        layer_blobs, blob_path = _weights_for(layer, lname, weights, path, weights_path)
        arrays = [
            _blob_array(blob, blob_path, f"layer '{show(lname)}' blob {i}", size_limit)
            for i, blob in enumerate(layer_blobs)
        ]
        bottoms = [blobs[bt] for bt in layer.bottom]
        tops = [b.fresh(t) for t in layer.top]
        ctx = LayerCtx(b, layer, arrays, bottoms, tops, blob_path)
        if not tops:
            raise ctx.fail("layer has no top")
        try:
            shapes = CONVERTERS[ltype](ctx)
        except (ValueError, ZeroDivisionError, OverflowError, IndexError) as exc:
            raise ctx.fail(f"cannot convert: {show(exc, 200)}") from None
        for bt in bottoms:
            consumed.add(bt.value)
        for t, value, top_shape in zip(layer.top, tops, shapes):
            if (
                len(top_shape) > MAX_AXES
                or math.prod(top_shape) > MAX_ELEMENTS
                or min(top_shape, default=1) < 1
            ):
                raise ctx.fail(f"top '{show(t)}' would have shape {list(top_shape)}")
            blobs[t] = Blob(value, tuple(top_shape))
            produced.append(value)
    if unsupported:
        raise UnsupportedError(
            unsupported, what="layer", path=path, hint="no ONNX mapping for these Caffe layer types"
        )
    if not inputs:
        raise InputError("the net has no input", path=path, hint="add an Input layer or input/input_shape")
    outputs = [v for v in produced if v not in consumed]
    if not outputs:
        raise InputError(
            "the net computes nothing (no layer after the inputs)",
            path=path,
            hint="give a net with at least one computing layer",
        )
    return _make_model(net, b, inputs, outputs, batch, notes, metadata)


def _check_utf8(layer, index: int, path: str) -> None:
    """proto2 strings are not validated on parse: a corrupt name arrives as bytes."""
    for value in [layer.name, layer.type, *layer.bottom, *layer.top]:
        if not isinstance(value, str):
            raise InputError(
                f"layer name, type or blob name '{show(value)}' is not UTF-8 text",
                path=path,
                where=f"layer #{index}",
                hint="the file is corrupt",
            )


def _weights_for(layer, lname: str, weights: dict[str, list] | None, path: str, weights_path: str):
    """The layer's blobs and the file they come from: the caffemodel's blobs by layer name, else
    the structure's own (a caffemodel alone, a DLK JSON, or a prototxt with blobs in it)."""
    if weights is None:
        return list(layer.blobs), path
    if lname in weights or not layer.blobs:
        return list(weights.get(lname, ())), weights_path
    return list(layer.blobs), path


def _data_layer(layer, ltype: str, lname: str, add_input, notes: list[str], metadata: dict) -> None:
    if not layer.top:
        return
    if ltype == "Input":
        shapes = list(layer.input_param.shape)
        for i, top in enumerate(layer.top):
            dims = (
                list(shapes[i].dim)
                if i < len(shapes)
                else (list(shapes[0].dim) if len(shapes) == 1 else None)
            )
            add_input(top, dims, f"Input layer '{show(lname)}'")
        return
    shape = None
    if ltype == "MemoryData":
        p = layer.memory_data_param
        shape = [p.batch_size, p.channels, p.height, p.width]
    elif ltype == "DummyData" and layer.dummy_data_param.shape:
        shape = list(layer.dummy_data_param.shape[0].dim)
    add_input(layer.top[0], shape, f"{ltype} layer '{show(lname)}'")
    notes.append(
        f"data layer '{show(lname)}' ({ltype}) skipped; its top '{show(layer.top[0])}' is the net input"
        + (f"; top(s) {_names(layer.top[1:])} (labels) are not produced" if len(layer.top) > 1 else "")
    )
    tp = layer.transform_param
    if layer.HasField("transform_param"):
        if tp.scale != 1.0:
            metadata["mconv.input_scale"] = repr(float(np.float32(tp.scale)))
        if tp.mean_value:
            metadata["mconv.input_mean"] = json.dumps([float(np.float32(v)) for v in tp.mean_value])
        elif tp.mean_file:
            metadata["mconv.input_mean"] = f"file:{tp.mean_file}"
        if tp.scale != 1.0 or tp.mean_value or tp.mean_file:
            notes.append(
                f"'{show(lname)}' transform (mean subtracted, then scale {float(np.float32(tp.scale))}) "
                "is NOT in the graph: preprocess inputs the same way"
            )


def _make_model(net, b: _Builder, inputs, outputs, batch, notes, metadata) -> ir.Model:
    def dims(shape):
        first = batch if isinstance(batch, int) else "N"
        return [first, *shape[1:]]

    graph = helper.make_graph(
        b.nodes,
        net.name or "caffe_net",
        [helper.make_tensor_value_info(v, TensorProto.FLOAT, dims(s)) for v, s in inputs],
        [helper.make_tensor_value_info(v, TensorProto.FLOAT, None) for v in outputs],
        initializer=b.initializers,
    )
    proto = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="mconv", ir_version=IR_VERSION
    )
    try:
        proto = onnx.shape_inference.infer_shapes(proto)
    except Exception as exc:  # shapes are an annotation; a failure here is reported, not fatal
        notes.append(f"ONNX shape inference failed: {str(exc)[:200]}")
    model = from_proto(proto)
    if notes:
        model.metadata_props["mconv.import_notes"] = "\n".join(notes)
    model.metadata_props.update(metadata)
    return model


# ----------------------------------------------------------------------------------------------
# The format


def load_caffe(paths: list[Path], options: dict) -> ir.Model:
    """Import ``[net.prototxt] [weights.caffemodel]`` (either order, either alone)."""
    notes: list[str] = []
    texts: list[tuple[Path, Message]] = []
    binaries: list[tuple[Path, Message]] = []
    for p in paths:
        net, kind = read_net(p, notes)
        (texts if kind == "text" else binaries).append((p, net))
    if len(texts) > 1 or len(binaries) > 1:
        raise InputError(
            "give at most one .prototxt and one .caffemodel",
            path=", ".join(str(p) for p in paths),
            hint="mconv import net.prototxt net.caffemodel",
        )
    size_limit = MAX_ELEMENTS
    weights = None
    if binaries:
        bin_path, model_net = binaries[0]
        size_limit = max(1, Path(bin_path).stat().st_size // 4)
        upgrade_v1(model_net, str(bin_path))
        weights = {layer.name: list(layer.blobs) for layer in model_net.layer if layer.blobs}
    if texts:
        path, net = texts[0]
        if weights is not None:
            for layer in net.layer:
                del layer.blobs[:]
        else:
            weights = {}
            notes.append("no caffemodel given: the net has no trained weights")
    else:
        path, net = binaries[0]
        weights = None
    return net_to_model(
        net,
        weights,
        options,
        path=str(path),
        notes=notes,
        size_limit=size_limit,
        weights_path=str(binaries[0][0]) if binaries else None,
    )


def _sniff(head: bytes, path: Path) -> bool:
    text = head.lstrip()
    if text.startswith((b"name:", b"layer {", b"layers {", b"input:", b"layer{", b"layers{")):
        return True
    # Binary NetParameter: field 1 (name) then field 100 (layer, tag a2 06) or 2 (V1 layers).
    if len(head) > 4 and head[0] == 0x0A and head[1] < 0x80:
        rest = head[2 + head[1] :]
        return rest[:2] == b"\xa2\x06" or rest[:1] == b"\x12"
    return head[:2] == b"\xa2\x06"


FORMAT = Format(
    name="caffe",
    description="Caffe net (.prototxt) + trained weights (.caffemodel)",
    extensions=(".prototxt", ".caffemodel"),
    load=load_caffe,
    sniff=_sniff,
    max_files=2,
)
