"""Keras layers as ONNX nodes: one handler per layer family, and the graph builder they share.

Rules the handlers follow:

1. A Keras tensor keeps its Keras layout (channels last) at the model's inputs and outputs.
2. Convolutions and pools run in ONNX's channels-first layout. A ``KTensor`` remembers whether its
   ONNX value holds the channels-first permutation of the Keras tensor (``cf=True``). A consumer
   asks for the layout it needs (``GraphBuilder.as_cf`` / ``as_keras``); the Transpose is made
   once per value and cached both ways, so a conv -> relu -> pool -> conv chain has no Transposes
   between its ops (back-to-back pairs cancel by construction).
3. Layout-agnostic layers (activations, Dropout, BatchNormalization on the channel axis, merges
   of tensors in the same layout, padding, cropping) keep the layout they are given.
4. The layer's main node is named after the layer (the call's name for shared layers), helper
   nodes ``<layer>/<part>``; the layer's output value is named after the layer too.
5. Weights are checked against the shapes the layer config implies; a mismatch names the layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from math import ceil

import numpy as np
import onnx
from mconv.errors import InputError
from onnx import TensorProto, helper, numpy_helper

INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min

Shape = tuple  # Keras shape, batch first, None where unknown


@dataclass
class KTensor:
    """One Keras tensor: its ONNX value, its Keras shape and whether the value is channels-first."""

    name: str
    shape: Shape
    cf: bool = False
    dtype: int = TensorProto.FLOAT

    @property
    def rank(self) -> int:
        return len(self.shape)


def to_cf_perm(rank: int) -> list[int]:
    return [0, rank - 1, *range(1, rank - 1)]


def to_cl_perm(rank: int) -> list[int]:
    return [0, *range(2, rank), 1]


@dataclass
class GraphBuilder:
    """Collects nodes and initializers; hands out unique names; converts layouts lazily."""

    nodes: list[onnx.NodeProto] = field(default_factory=list)
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    names: set[str] = field(default_factory=set)
    node_names: set[str] = field(default_factory=set)
    params: dict[tuple[str, str], str] = field(default_factory=dict)
    # value name -> value name of the same tensor in the other layout
    other_layout: dict[str, str] = field(default_factory=dict)

    def fresh(self, base: str, taken: set[str] | None = None) -> str:
        """A name not yet taken (not reserved)."""
        taken = self.names if taken is None else taken
        name, i = base, 1
        while name in taken:
            name = f"{base}_{i}"
            i += 1
        return name

    def unique(self, base: str, taken: set[str] | None = None) -> str:
        taken = self.names if taken is None else taken
        name = self.fresh(base, taken)
        taken.add(name)
        return name

    def node(self, op: str, inputs: list[str], name: str, n_out: int = 1, **attrs) -> list[str]:
        node_name = self.unique(name, self.node_names)
        outs = [self.unique(node_name if n_out == 1 else f"{node_name}/out{i}") for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=node_name, **attrs))
        return outs

    def node1(self, op: str, inputs: list[str], name: str, **attrs) -> str:
        return self.node(op, inputs, name, 1, **attrs)[0]

    def const(self, name: str, array: np.ndarray) -> str:
        value = self.unique(name)
        array = np.asarray(array)
        self.initializers.append(numpy_helper.from_array(array.copy(order="C"), value))
        return value

    def ints(self, name: str, values) -> str:
        return self.const(name, np.asarray(values, dtype=np.int64))

    def f32(self, name: str, values) -> str:
        return self.const(name, np.asarray(values, dtype=np.float32))

    def param(self, layer: str, key: str, array: np.ndarray) -> str:
        """A layer's weight as an initializer, made once per layer (shared layers reuse it)."""
        if (layer, key) not in self.params:
            self.params[(layer, key)] = self.const(f"{layer}/{key}", np.asarray(array, np.float32))
        return self.params[(layer, key)]

    def rename(self, old: str, new: str) -> str:
        """Rename a value made by a node (to name a layer's output after the layer)."""
        if new in self.names:
            return old
        self.names.add(new)
        for n in self.nodes:
            for i, v in enumerate(n.output):
                if v == old:
                    n.output[i] = new
            for i, v in enumerate(n.input):
                if v == old:
                    n.input[i] = new
        for k, v in list(self.other_layout.items()):
            if v == old:
                self.other_layout[k] = new
            if k == old:
                self.other_layout[new] = self.other_layout.pop(k)
        return new

    def as_cf(self, t: KTensor) -> KTensor:
        if t.cf or t.rank <= 2:
            return t
        if t.name not in self.other_layout:
            out = self.node1("Transpose", [t.name], f"{t.name}/to_channels_first", perm=to_cf_perm(t.rank))
            self.other_layout[t.name] = out
            self.other_layout[out] = t.name
        return KTensor(self.other_layout[t.name], t.shape, True, t.dtype)

    def as_keras(self, t: KTensor) -> KTensor:
        if not t.cf or t.rank <= 2:
            return KTensor(t.name, t.shape, False, t.dtype)
        if t.name not in self.other_layout:
            out = self.node1("Transpose", [t.name], f"{t.name}/to_channels_last", perm=to_cl_perm(t.rank))
            self.other_layout[t.name] = out
            self.other_layout[out] = t.name
        return KTensor(self.other_layout[t.name], t.shape, False, t.dtype)


class WeightList:
    """The arrays of one layer, in the layer's own order (Keras ``layer.weights``)."""

    def __init__(self, arrays: list[np.ndarray], layer: str, path: str) -> None:
        self.arrays = arrays
        self.layer = layer
        self.path = path

    def take(self, shapes: list[tuple[int, ...]], what: list[str]) -> list[np.ndarray]:
        if len(self.arrays) != len(shapes):
            raise InputError(
                f"layer has {len(self.arrays)} weight array(s), its config needs {len(shapes)} "
                f"({', '.join(what)})",
                path=self.path,
                where=f"layer '{self.layer}'",
                hint="the weights file does not belong to this architecture",
            )
        out = []
        for arr, shape, name in zip(self.arrays, shapes, what, strict=True):
            if tuple(arr.shape) != tuple(shape):
                raise InputError(
                    f"weight '{name}' has shape {tuple(arr.shape)}, the layer config implies {tuple(shape)}",
                    path=self.path,
                    where=f"layer '{self.layer}'",
                    hint="the weights file does not belong to this architecture",
                )
            out.append(np.asarray(arr, dtype=np.float32))
        return out


@dataclass
class LayerCall:
    """One call of a layer: everything a handler needs."""

    b: GraphBuilder
    name: str  # node name for this call (the layer name, or name_1 ... for shared layers)
    layer: str  # the layer's own name (weights are per layer)
    class_name: str
    config: dict
    weights: WeightList
    keras3: bool
    path: str

    def fail(self, message: str, hint: str | None = None) -> InputError:
        return InputError(
            message,
            path=self.path,
            where=f"layer '{self.layer}' ({self.class_name})",
            hint=hint or "this layer setting is not supported by the Keras importer",
        )

    def cfg(self, key: str, default=None):
        v = self.config.get(key, default)
        return default if v is None else v


Handler = Callable[[LayerCall, list[KTensor]], list[KTensor]]
LAYERS: dict[str, Handler] = {}


def layer(*class_names: str):
    def deco(fn: Handler) -> Handler:
        for c in class_names:
            LAYERS[c] = fn
        return fn

    return deco


# ---------------------------------------------------------------------------------------- helpers


def _tuple(v, n: int) -> tuple[int, ...]:
    if isinstance(v, int):
        return (v,) * n
    v = tuple(int(x) for x in v)
    if len(v) == 1 and n > 1:
        return v * n
    if len(v) != n:
        raise ValueError(f"expected {n} values, got {len(v)}")
    return v


def _ints(call: LayerCall, key: str, n: int, default) -> tuple[int, ...]:
    try:
        vals = _tuple(call.cfg(key, default), n)
    except (TypeError, ValueError) as exc:
        raise call.fail(f"config '{key}' is not {n} integer(s): {exc}") from None
    if any(x <= 0 or x > 1 << 20 for x in vals):
        raise call.fail(f"config '{key}' = {vals} is out of range", hint="values must be positive")
    return vals


def _channels_last(call: LayerCall) -> bool:
    fmt = call.config.get("data_format") or "channels_last"
    if fmt not in ("channels_last", "channels_first"):
        raise call.fail(f"unknown data_format '{fmt}'")
    return fmt == "channels_last"


def _same_pads(spatial, k, s, d) -> list[int] | None:
    """TensorFlow 'same' padding: out = ceil(in/s); the odd pixel goes at the end."""
    if any(x is None for x in spatial):
        return None
    begin, end = [], []
    for n, kk, ss, dd in zip(spatial, k, s, d, strict=True):
        eff = (kk - 1) * dd + 1
        out = ceil(n / ss)
        total = max((out - 1) * ss + eff - n, 0)
        begin.append(total // 2)
        end.append(total - total // 2)
    return begin + end


def _conv_out(n, k, s, d, padding) -> int | None:
    if n is None:
        return None
    eff = (k - 1) * d + 1
    if padding == "same":
        return ceil(n / s)
    if padding == "causal":
        return ceil(n / s)
    return (n - eff) // s + 1 if n >= eff else 0


def _spatial_attrs(spatial, k, s, d, padding, call: LayerCall) -> dict:
    attrs: dict = {"kernel_shape": list(k), "strides": list(s)}
    if padding == "valid":
        attrs["pads"] = [0] * (2 * len(k))
    elif padding == "same":
        pads = _same_pads(spatial, k, s, d)
        if pads is None:
            attrs["auto_pad"] = "SAME_UPPER"  # same rule as TF when the size is only known at run time
        else:
            attrs["pads"] = pads
    elif padding == "causal":
        attrs["pads"] = [(k[0] - 1) * d[0], 0]
    else:
        raise call.fail(f"unknown padding '{padding}'")
    return attrs


def _finish(call: LayerCall, out: KTensor, activation=None) -> list[KTensor]:
    if activation is not None:
        out = apply_activation(call, out, activation)
    return [out]


# ------------------------------------------------------------------------------------ activations

SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


def activation_name(call: LayerCall, spec) -> str:
    if spec is None:
        return "linear"
    if isinstance(spec, dict):  # keras 3 may serialize {"class_name": "function", "config": "relu"}
        inner = spec.get("config")
        if isinstance(inner, str):
            return inner
        raise call.fail(
            f"custom activation {spec.get('class_name')!r}",
            hint="only the standard Keras activations are supported",
        )
    if not isinstance(spec, str):
        raise call.fail(f"activation {spec!r} is not a name")
    return spec


def hard_sigmoid_params(keras3: bool) -> tuple[float, float]:
    """Keras 2: clip(0.2x + 0.5); Keras 3: relu6(x + 3) / 6 = clip(x/6 + 0.5)."""
    return (1.0 / 6.0, 0.5) if keras3 else (0.2, 0.5)


def apply_activation(call: LayerCall, t: KTensor, spec, part: str | None = None) -> KTensor:
    """Append the named activation; layout is kept except for softmax (needs the channel axis)."""
    b = call.b
    act = activation_name(call, spec)
    nm = f"{call.name}/{part or act}"
    x = t.name
    if act == "linear":
        return t
    if act in ("softmax", "log_softmax"):
        t = b.as_keras(t)
        op = "Softmax" if act == "softmax" else "LogSoftmax"
        return KTensor(b.node1(op, [t.name], nm, axis=-1), t.shape, False)
    simple = {
        "relu": "Relu",
        "sigmoid": "Sigmoid",
        "tanh": "Tanh",
        "softplus": "Softplus",
        "softsign": "Softsign",
        "exponential": "Exp",
        "mish": "Mish",
        "hard_silu": "HardSwish",
        "hard_swish": "HardSwish",
    }
    if act in simple:
        y = b.node1(simple[act], [x], nm)
    elif act == "elu":
        y = b.node1("Elu", [x], nm, alpha=1.0)
    elif act == "selu":
        y = b.node1("Selu", [x], nm, alpha=SELU_ALPHA, gamma=SELU_SCALE)
    elif act in ("gelu",):
        y = b.node1("Gelu", [x], nm, approximate="none")
    elif act in ("swish", "silu"):
        s = b.node1("Sigmoid", [x], f"{nm}/sigmoid")
        y = b.node1("Mul", [x, s], nm)
    elif act == "hard_sigmoid":
        alpha, beta = hard_sigmoid_params(call.keras3)
        y = b.node1("HardSigmoid", [x], nm, alpha=alpha, beta=beta)
    elif act == "relu6":
        y = b.node1("Clip", [x, b.f32(f"{nm}/min", 0.0), b.f32(f"{nm}/max", 6.0)], nm)
    elif act == "leaky_relu":
        y = b.node1("LeakyRelu", [x], nm, alpha=0.2)
    else:
        raise call.fail(
            f"unknown activation '{act}'", hint="only the standard Keras activations are supported"
        )
    return KTensor(y, t.shape, t.cf, t.dtype)


@layer("Activation")
def activation_layer(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    call.weights.take([], [])
    return [apply_activation(call, inputs[0], call.config.get("activation"))]


@layer("ReLU")
def relu_layer(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    """Keras ReLU: x >= max_value -> max_value; threshold <= x -> x; else slope * (x - threshold)."""
    call.weights.take([], [])
    b, t = call.b, inputs[0]
    max_value = call.config.get("max_value")
    slope = float(call.cfg("negative_slope", 0.0))
    threshold = float(call.cfg("threshold", 0.0))
    x = t.name
    if threshold == 0.0 and slope == 0.0:
        y = b.node1("Relu", [x], call.name)
    elif threshold == 0.0:
        y = b.node1("LeakyRelu", [x], call.name, alpha=slope)
    else:
        thr = b.f32(f"{call.name}/threshold", threshold)
        below = b.node1("Less", [x, thr], f"{call.name}/below")
        shifted = b.node1("Sub", [x, thr], f"{call.name}/shift")
        neg = b.node1("Mul", [shifted, b.f32(f"{call.name}/slope", slope)], f"{call.name}/slope")
        y = b.node1("Where", [below, neg, x], call.name)
    if max_value is not None:
        y = b.node1("Min", [y, b.f32(f"{call.name}/max_value", float(max_value))], f"{call.name}/max")
    return [KTensor(y, t.shape, t.cf)]


@layer("LeakyReLU")
def leaky_relu_layer(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    call.weights.take([], [])
    t = inputs[0]
    slope = call.config.get("negative_slope", call.config.get("alpha", 0.3))
    return [KTensor(call.b.node1("LeakyRelu", [t.name], call.name, alpha=float(slope)), t.shape, t.cf)]


@layer("ELU")
def elu_layer(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    call.weights.take([], [])
    t = inputs[0]
    return [
        KTensor(call.b.node1("Elu", [t.name], call.name, alpha=float(call.cfg("alpha", 1.0))), t.shape, t.cf)
    ]


@layer("Softmax")
def softmax_layer(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    call.weights.take([], [])
    t = call.b.as_keras(inputs[0])
    axis = call.cfg("axis", -1)
    if isinstance(axis, list):
        if len(axis) != 1:
            raise call.fail("softmax over several axes")
        axis = axis[0]
    return [KTensor(call.b.node1("Softmax", [t.name], call.name, axis=int(axis)), t.shape)]


@layer(
    "Dropout",
    "SpatialDropout1D",
    "SpatialDropout2D",
    "SpatialDropout3D",
    "GaussianNoise",
    "GaussianDropout",
    "AlphaDropout",
    "ActivityRegularization",
)
def identity_layer(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    """Training-only layers are the identity at inference; kept as an Identity node, never dropped."""
    call.weights.take([], [])
    t = inputs[0]
    return [KTensor(call.b.node1("Identity", [t.name], call.name), t.shape, t.cf, t.dtype)]


# ------------------------------------------------------------------------------------------ dense


@layer("Dense")
def dense(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    b, t = call.b, call.b.as_keras(inputs[0])
    units = int(call.config["units"])
    fan_in = t.shape[-1]
    if fan_in is None:
        raise call.fail("the last input dimension is unknown", hint="give the model a fixed input size")
    use_bias = call.cfg("use_bias", True)
    shapes: list[tuple[int, ...]] = [(fan_in, units)]
    what = ["kernel"]
    if use_bias:
        shapes.append((units,))
        what.append("bias")
    ws = call.weights.take(shapes, what)
    kernel = b.param(call.layer, "kernel", ws[0])
    shape = (*t.shape[:-1], units)
    if t.rank == 2 and use_bias:
        y = b.node1("Gemm", [t.name, kernel, b.param(call.layer, "bias", ws[1])], call.name)
    else:
        y = b.node1("MatMul", [t.name, kernel], call.name if not use_bias else f"{call.name}/matmul")
        if use_bias:
            y = b.node1("Add", [y, b.param(call.layer, "bias", ws[1])], call.name)
    return _finish(call, KTensor(y, shape), call.config.get("activation"))


# ------------------------------------------------------------------------------------ convolution

_CONV_ND = {
    "Conv1D": 1,
    "Conv2D": 2,
    "Conv3D": 3,
    "Convolution1D": 1,
    "Convolution2D": 2,
    "Convolution3D": 3,
    "DepthwiseConv2D": 2,
    "DepthwiseConv1D": 1,
    "SeparableConv2D": 2,
    "SeparableConv1D": 1,
    "Conv2DTranspose": 2,
    "Conv1DTranspose": 1,
    "Conv3DTranspose": 3,
    "Deconvolution2D": 2,
}


def _conv_setup(call: LayerCall, t: KTensor):
    nd = _CONV_ND[call.class_name]
    cl = _channels_last(call)
    if t.rank != nd + 2:
        raise call.fail(f"input has rank {t.rank}, a {nd}-D convolution needs rank {nd + 2}")
    x = call.b.as_cf(t) if cl else call.b.as_keras(t)
    spatial = t.shape[1:-1] if cl else t.shape[2:]
    cin = t.shape[-1] if cl else t.shape[1]
    if cin is None:
        raise call.fail("the channel count is unknown", hint="give the model a fixed input shape")
    k = _ints(call, "kernel_size", nd, None)
    s = _ints(call, "strides", nd, 1)
    d = _ints(call, "dilation_rate", nd, 1)
    padding = str(call.cfg("padding", "valid")).lower()
    return nd, cl, x, spatial, cin, k, s, d, padding


def _kernel_to_onnx(kernel: np.ndarray, nd: int) -> np.ndarray:
    """Keras (*k, cin, cout) -> ONNX (cout, cin, *k)."""
    return np.transpose(kernel, (nd + 1, nd, *range(nd)))


def _conv_result(call: LayerCall, y: str, t: KTensor, cl: bool, spatial_out, cout: int) -> KTensor:
    shape = (t.shape[0], *spatial_out, cout) if cl else (t.shape[0], cout, *spatial_out)
    return KTensor(y, shape, cf=cl)


@layer("Conv1D", "Conv2D", "Conv3D", "Convolution1D", "Convolution2D", "Convolution3D")
def conv(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    b, t = call.b, inputs[0]
    nd, cl, x, spatial, cin, k, s, d, padding = _conv_setup(call, t)
    filters = int(call.config["filters"])
    groups = int(call.cfg("groups", 1))
    if groups < 1 or cin % groups or filters % groups:
        raise call.fail(f"groups={groups} does not divide channels {cin} / filters {filters}")
    use_bias = call.cfg("use_bias", True)
    shapes, what = [(*k, cin // groups, filters)], ["kernel"]
    if use_bias:
        shapes.append((filters,))
        what.append("bias")
    ws = call.weights.take(shapes, what)
    ins = [x.name, b.param(call.layer, "kernel", _kernel_to_onnx(ws[0], nd))]
    if use_bias:
        ins.append(b.param(call.layer, "bias", ws[1]))
    attrs = _spatial_attrs(spatial, k, s, d, padding, call)
    y = b.node1("Conv", ins, call.name, dilations=list(d), group=groups, **attrs)
    out = [_conv_out(n, kk, ss, dd, padding) for n, kk, ss, dd in zip(spatial, k, s, d, strict=True)]
    return _finish(call, _conv_result(call, y, t, cl, out, filters), call.config.get("activation"))


@layer("DepthwiseConv2D", "DepthwiseConv1D")
def depthwise_conv(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    b, t = call.b, inputs[0]
    nd, cl, x, spatial, cin, k, s, d, padding = _conv_setup(call, t)
    mult = int(call.cfg("depth_multiplier", 1))
    use_bias = call.cfg("use_bias", True)
    shapes, what = [(*k, cin, mult)], ["depthwise_kernel"]
    if use_bias:
        shapes.append((cin * mult,))
        what.append("bias")
    ws = call.weights.take(shapes, what)
    # output channel c * mult + m, as Keras orders them
    kernel = _kernel_to_onnx(ws[0].reshape(*k, 1, cin * mult), nd)
    ins = [x.name, b.param(call.layer, "depthwise_kernel", kernel)]
    if use_bias:
        ins.append(b.param(call.layer, "bias", ws[1]))
    attrs = _spatial_attrs(spatial, k, s, d, padding, call)
    y = b.node1("Conv", ins, call.name, dilations=list(d), group=cin, **attrs)
    out = [_conv_out(n, kk, ss, dd, padding) for n, kk, ss, dd in zip(spatial, k, s, d, strict=True)]
    return _finish(call, _conv_result(call, y, t, cl, out, cin * mult), call.config.get("activation"))


@layer("SeparableConv2D", "SeparableConv1D")
def separable_conv(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    """Depthwise conv (node ``<layer>/depthwise``) then 1x1 pointwise conv with the bias (``<layer>``)."""
    b, t = call.b, inputs[0]
    nd, cl, x, spatial, cin, k, s, d, padding = _conv_setup(call, t)
    mult = int(call.cfg("depth_multiplier", 1))
    filters = int(call.config["filters"])
    use_bias = call.cfg("use_bias", True)
    shapes = [(*k, cin, mult), (*(1,) * nd, cin * mult, filters)]
    what = ["depthwise_kernel", "pointwise_kernel"]
    if use_bias:
        shapes.append((filters,))
        what.append("bias")
    ws = call.weights.take(shapes, what)
    dw = _kernel_to_onnx(ws[0].reshape(*k, 1, cin * mult), nd)
    attrs = _spatial_attrs(spatial, k, s, d, padding, call)
    h = b.node1(
        "Conv",
        [x.name, b.param(call.layer, "depthwise_kernel", dw)],
        f"{call.name}/depthwise",
        dilations=list(d),
        group=cin,
        **attrs,
    )
    ins = [h, b.param(call.layer, "pointwise_kernel", _kernel_to_onnx(ws[1], nd))]
    if use_bias:
        ins.append(b.param(call.layer, "bias", ws[2]))
    y = b.node1("Conv", ins, call.name, kernel_shape=[1] * nd)
    out = [_conv_out(n, kk, ss, dd, padding) for n, kk, ss, dd in zip(spatial, k, s, d, strict=True)]
    return _finish(call, _conv_result(call, y, t, cl, out, filters), call.config.get("activation"))


@layer("Conv2DTranspose", "Conv1DTranspose", "Conv3DTranspose", "Deconvolution2D")
def conv_transpose(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    """Without output_padding: valid gives in*s + max(k-s, 0), same gives in*s. With output_padding
    p: valid gives (in-1)*s + k + p, same gives (in-1)*s + k%2 + p."""
    b, t = call.b, inputs[0]
    nd, cl, x, spatial, cin, k, s, d, padding = _conv_setup(call, t)
    if any(v != 1 for v in d):
        raise call.fail("dilated transposed convolution")
    filters = int(call.config["filters"])
    use_bias = call.cfg("use_bias", True)
    shapes, what = [(*k, filters, cin)], ["kernel"]
    if use_bias:
        shapes.append((filters,))
        what.append("bias")
    ws = call.weights.take(shapes, what)
    # Keras (*k, cout, cin) -> ONNX ConvTranspose (cin, cout, *k)
    kernel = np.transpose(ws[0], (nd + 1, nd, *range(nd)))
    ins = [x.name, b.param(call.layer, "kernel", kernel)]
    if use_bias:
        ins.append(b.param(call.layer, "bias", ws[1]))
    op_cfg = call.config.get("output_padding")
    begin, end, out_pad, out = [], [], [], []
    for i in range(nd):
        kk, ss, n = k[i], s[i], spatial[i]
        if op_cfg is not None and padding == "same":
            # Keras 3 (and TF): the full-conv padding is split left = min(ceil(len/2), k-1)
            p = _tuple(op_cfg, nd)[i]
            pad_len = kk + kk % 2 - 2 + p
            left = min(pad_len // 2 + pad_len % 2, kk - 1)
            b0, e0 = kk - 1 - left, kk - 1 - (pad_len - left)
            begin.append(b0)
            end.append(max(e0, 0))
            out_pad.append(max(-e0, 0))
            out.append(None if n is None else (n - 1) * ss + kk % 2 + p)
        elif op_cfg is not None:
            p = _tuple(op_cfg, nd)[i]
            begin.append(0)
            end.append(0)
            out_pad.append(p)
            out.append(None if n is None else (n - 1) * ss + kk + p)
        elif padding == "valid":
            begin.append(0)
            end.append(0)
            out_pad.append(max(ss - kk, 0))
            out.append(None if n is None else n * ss + max(kk - ss, 0))
        elif padding == "same":
            total = kk - ss
            if total >= 0:
                begin.append(total // 2)
                end.append(total - total // 2)
                out_pad.append(0)
            else:
                begin.append(0)
                end.append(0)
                out_pad.append(-total)
            out.append(None if n is None else n * ss)
        else:
            raise call.fail(f"unknown padding '{padding}'")
    y = b.node1(
        "ConvTranspose",
        ins,
        call.name,
        kernel_shape=list(k),
        strides=list(s),
        pads=begin + end,
        output_padding=out_pad,
    )
    return _finish(call, _conv_result(call, y, t, cl, out, filters), call.config.get("activation"))


# ---------------------------------------------------------------------------------------- pooling

_POOL = {
    "MaxPooling1D": ("MaxPool", 1),
    "MaxPooling2D": ("MaxPool", 2),
    "MaxPooling3D": ("MaxPool", 3),
    "AveragePooling1D": ("AveragePool", 1),
    "AveragePooling2D": ("AveragePool", 2),
    "AveragePooling3D": ("AveragePool", 3),
    "MaxPool1D": ("MaxPool", 1),
    "MaxPool2D": ("MaxPool", 2),
    "AvgPool1D": ("AveragePool", 1),
    "AvgPool2D": ("AveragePool", 2),
}


@layer(*_POOL)
def pool(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    """TF 'same' averages only over real pixels: ONNX count_include_pad=0 (the default)."""
    call.weights.take([], [])
    b, t = call.b, inputs[0]
    op, nd = _POOL[call.class_name]
    cl = _channels_last(call)
    if t.rank != nd + 2:
        raise call.fail(f"input has rank {t.rank}, a {nd}-D pool needs rank {nd + 2}")
    x = b.as_cf(t) if cl else b.as_keras(t)
    k = _ints(call, "pool_size", nd, 2)
    s = _ints(call, "strides", nd, k) if call.config.get("strides") is not None else k
    padding = str(call.cfg("padding", "valid")).lower()
    attrs = _spatial_attrs(t.shape[1:-1] if cl else t.shape[2:], k, s, (1,) * nd, padding, call)
    y = b.node1(op, [x.name], call.name, **attrs)
    spatial = t.shape[1:-1] if cl else t.shape[2:]
    out = [_conv_out(n, kk, ss, 1, padding) for n, kk, ss in zip(spatial, k, s, strict=True)]
    c = t.shape[-1] if cl else t.shape[1]
    return [_conv_result(call, y, t, cl, out, c)]


@layer(
    "GlobalAveragePooling1D",
    "GlobalAveragePooling2D",
    "GlobalAveragePooling3D",
    "GlobalMaxPooling1D",
    "GlobalMaxPooling2D",
    "GlobalMaxPooling3D",
    "GlobalAvgPool1D",
    "GlobalAvgPool2D",
    "GlobalMaxPool1D",
    "GlobalMaxPool2D",
)
def global_pool(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    call.weights.take([], [])
    b, t = call.b, inputs[0]
    op = "GlobalMaxPool" if "Max" in call.class_name else "GlobalAveragePool"
    cl = _channels_last(call)
    x = b.as_cf(t) if cl else b.as_keras(t)
    c = t.shape[-1] if cl else t.shape[1]
    y = b.node1(op, [x.name], call.name if call.cfg("keepdims", False) else f"{call.name}/pool")
    if call.cfg("keepdims", False):
        ones = (1,) * (t.rank - 2)
        return [_conv_result(call, y, t, cl, ones, c)]
    return [KTensor(b.node1("Flatten", [y], call.name, axis=1), (t.shape[0], c))]


# ---------------------------------------------------------------------------------- normalization


def _axes(call: LayerCall, t: KTensor, key: str, default) -> list[int]:
    axis = call.config.get(key, default)
    axes = axis if isinstance(axis, list | tuple) else [axis]
    try:
        out = sorted({int(a) % t.rank for a in axes})
    except (TypeError, ValueError):
        raise call.fail(f"config '{key}' = {axis!r} is not a list of axes") from None
    if any(a == 0 for a in out):
        raise call.fail("normalizing over the batch axis")
    return out


@layer("BatchNormalization")
def batch_norm(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    """Channel axis last on a rank >= 3 tensor: BatchNormalization on the channels-first value (keeps
    conv chains Transpose-free). Other axes: Mul/Add with the folded scale and shift."""
    b, t = call.b, inputs[0]
    axes = _axes(call, t, "axis", -1)
    if len(axes) != 1:
        raise call.fail("BatchNormalization over several axes")
    axis = axes[0]
    c = t.shape[axis]
    if c is None:
        raise call.fail("the normalized axis has unknown size")
    scale, center = call.cfg("scale", True), call.cfg("center", True)
    what = (["gamma"] if scale else []) + (["beta"] if center else []) + ["moving_mean", "moving_variance"]
    ws = dict(zip(what, call.weights.take([(c,)] * len(what), what), strict=True))
    gamma = ws.get("gamma", np.ones(c, np.float32))
    beta = ws.get("beta", np.zeros(c, np.float32))
    eps = float(call.cfg("epsilon", 1e-3))
    ins_w = [
        b.param(call.layer, k, v)
        for k, v in (
            ("gamma", gamma),
            ("beta", beta),
            ("moving_mean", ws["moving_mean"]),
            ("moving_variance", ws["moving_variance"]),
        )
    ]
    if axis == t.rank - 1 and t.rank >= 3:
        x = b.as_cf(t)
        return [
            KTensor(b.node1("BatchNormalization", [x.name, *ins_w], call.name, epsilon=eps), t.shape, True)
        ]
    if axis == 1:
        x = b.as_keras(t)
        return [KTensor(b.node1("BatchNormalization", [x.name, *ins_w], call.name, epsilon=eps), t.shape)]
    x = b.as_keras(t)
    s = gamma / np.sqrt(ws["moving_variance"] + eps)
    shift = beta - ws["moving_mean"] * s
    bshape = [1] * t.rank
    bshape[axis] = c
    m = b.node1(
        "Mul",
        [x.name, b.const(f"{call.layer}/scale", s.reshape(bshape).astype(np.float32))],
        f"{call.name}/scale",
    )
    y = b.node1(
        "Add", [m, b.const(f"{call.layer}/shift", shift.reshape(bshape).astype(np.float32))], call.name
    )
    return [KTensor(y, t.shape)]


@layer("LayerNormalization")
def layer_norm(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    b, t = call.b, call.b.as_keras(inputs[0])
    axes = _axes(call, t, "axis", -1)
    if axes != list(range(axes[0], t.rank)):
        raise call.fail(f"LayerNormalization over axes {axes} (only trailing axes map to ONNX)")
    if call.cfg("rms_scaling", False):
        raise call.fail("rms_scaling=True")
    norm_shape = tuple(t.shape[a] for a in axes)
    if any(v is None for v in norm_shape):
        raise call.fail("the normalized axes have unknown size")
    scale, center = call.cfg("scale", True), call.cfg("center", True)
    what = (["gamma"] if scale else []) + (["beta"] if center else [])
    ws = dict(zip(what, call.weights.take([norm_shape] * len(what), what), strict=True))
    gamma = ws.get("gamma", np.ones(norm_shape, np.float32))
    beta = ws.get("beta", np.zeros(norm_shape, np.float32))
    y = b.node1(
        "LayerNormalization",
        [t.name, b.param(call.layer, "gamma", gamma), b.param(call.layer, "beta", beta)],
        call.name,
        axis=axes[0],
        epsilon=float(call.cfg("epsilon", 1e-3)),
    )
    return [KTensor(y, t.shape)]


@layer("Rescaling")
def rescaling(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    call.weights.take([], [])
    b, t = call.b, call.b.as_keras(inputs[0])
    scale = np.asarray(call.cfg("scale", 1.0), np.float32)
    offset = np.asarray(call.cfg("offset", 0.0), np.float32)
    m = b.node1("Mul", [t.name, b.const(f"{call.layer}/scale", scale)], f"{call.name}/scale")
    return [KTensor(b.node1("Add", [m, b.const(f"{call.layer}/offset", offset)], call.name), t.shape)]


@layer("Normalization")
def normalization(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    """(x - mean) / max(sqrt(variance), 1e-7); invert: mean + x * max(sqrt(variance), 1e-7)."""
    b, t = call.b, call.b.as_keras(inputs[0])
    axes = _axes(call, t, "axis", -1) if call.config.get("axis", -1) is not None else []
    bshape = [1] * t.rank
    for a in axes:
        bshape[a] = t.shape[a]
    if call.config.get("mean") is not None:
        call.weights.take([], [])
        mean = np.asarray(call.config["mean"], np.float32)
        var = np.asarray(call.config["variance"], np.float32)
        try:
            mean = np.broadcast_to(
                mean.reshape(
                    mean.shape if mean.ndim == 0 else [*([1] * (len(bshape) - mean.ndim)), *mean.shape]
                ),
                bshape,
            )
            var = np.broadcast_to(
                var.reshape(var.shape if var.ndim == 0 else [*([1] * (len(bshape) - var.ndim)), *var.shape]),
                bshape,
            )
        except ValueError:
            raise call.fail("mean/variance do not fit the normalized axes") from None
    else:
        kept = tuple(t.shape[a] for a in axes)
        arrays = call.weights.arrays
        if len(arrays) not in (2, 3):
            raise call.fail(f"expected mean, variance (and count) weights, found {len(arrays)} array(s)")
        wl = WeightList(arrays[:2], call.layer, call.path)
        mean, var = wl.take([kept, kept], ["mean", "variance"])
        mean, var = mean.reshape(bshape), var.reshape(bshape)
    std = np.maximum(np.sqrt(var), 1e-7).astype(np.float32)
    mean_v = b.const(f"{call.layer}/mean", mean.astype(np.float32))
    std_v = b.const(f"{call.layer}/std", std)
    if call.cfg("invert", False):
        m = b.node1("Mul", [t.name, std_v], f"{call.name}/scale")
        y = b.node1("Add", [m, mean_v], call.name)
    else:
        d = b.node1("Sub", [t.name, mean_v], f"{call.name}/center")
        y = b.node1("Div", [d, std_v], call.name)
    return [KTensor(y, t.shape)]


# ------------------------------------------------------------------------------------------ shape


@layer("Flatten")
def flatten(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    """Flatten in Keras (channels-last) order: the channels-first value is transposed back first."""
    call.weights.take([], [])
    b, t = call.b, call.b.as_keras(inputs[0])
    x = t.name
    if call.config.get("data_format") == "channels_first" and t.rank > 2:
        x = b.node1("Transpose", [x], f"{call.name}/to_channels_last", perm=to_cl_perm(t.rank))
    rest = t.shape[1:]
    n = None if any(v is None for v in rest) else int(np.prod(rest, dtype=np.int64))
    return [KTensor(b.node1("Flatten", [x], call.name, axis=1), (t.shape[0], n))]


@layer("Reshape")
def reshape(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    call.weights.take([], [])
    b, t = call.b, call.b.as_keras(inputs[0])
    target = [int(v) for v in call.config["target_shape"]]
    known = [v for v in t.shape[1:] if v is not None]
    total = int(np.prod(known, dtype=np.int64)) if len(known) == t.rank - 1 else None
    out = list(target)
    if -1 in out and total is not None:
        rest = int(np.prod([v for v in out if v != -1], dtype=np.int64))
        out[out.index(-1)] = total // rest if rest else 0
    if total is not None and -1 not in out and int(np.prod(out, dtype=np.int64)) != total:
        raise call.fail(
            f"target_shape {tuple(target)} does not hold the {total} values of {t.shape[1:]}",
            hint="the architecture is inconsistent",
        )
    shape_v = b.ints(f"{call.name}/shape", [-1, *target] if -1 not in target else [0, *target])
    return [
        KTensor(
            b.node1("Reshape", [t.name, shape_v], call.name),
            (t.shape[0], *[None if v == -1 else v for v in out]),
        )
    ]


@layer("Permute")
def permute(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    call.weights.take([], [])
    b, t = call.b, call.b.as_keras(inputs[0])
    dims = [int(v) for v in call.config["dims"]]
    if sorted(dims) != list(range(1, t.rank)):
        raise call.fail(f"dims {dims} is not a permutation of 1..{t.rank - 1}")
    perm = [0, *dims]
    return [KTensor(b.node1("Transpose", [t.name], call.name, perm=perm), tuple(t.shape[p] for p in perm))]


@layer("RepeatVector")
def repeat_vector(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    call.weights.take([], [])
    b, t = call.b, call.b.as_keras(inputs[0])
    n = int(call.config["n"])
    u = b.node1("Unsqueeze", [t.name, b.ints(f"{call.name}/axes", [1])], f"{call.name}/unsqueeze")
    y = b.node1("Tile", [u, b.ints(f"{call.name}/repeats", [1, n, 1])], call.name)
    return [KTensor(y, (t.shape[0], n, t.shape[1]))]


def _pairs(call: LayerCall, key: str, nd: int) -> list[tuple[int, int]]:
    v = call.config.get(key)
    if v is None:  # as len(None) below would refuse it
        raise call.fail(f"config '{key}' = {v!r} is not a padding spec")
    try:
        if isinstance(v, int):
            pairs = [(v, v)] * nd
        elif nd == 1 and len(v) == 2 and all(isinstance(x, int) for x in v):
            pairs = [(int(v[0]), int(v[1]))]
        else:
            pairs = [(x, x) if isinstance(x, int) else (int(x[0]), int(x[1])) for x in v]
    except (TypeError, ValueError, IndexError):
        raise call.fail(f"config '{key}' = {v!r} is not a padding spec") from None
    if len(pairs) != nd or any(p < 0 or p > 1 << 20 for pr in pairs for p in pr):
        raise call.fail(f"config '{key}' = {v!r} does not fit a {nd}-D layer")
    return pairs


def _spatial_axes(t: KTensor, cl: bool, nd: int) -> list[int]:
    """Axes of the spatial dims in the ONNX value (channels-first value or Keras value)."""
    if t.cf or not cl:
        return list(range(2, 2 + nd))
    return list(range(1, 1 + nd))


@layer("ZeroPadding1D", "ZeroPadding2D", "ZeroPadding3D")
def zero_padding(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    call.weights.take([], [])
    b, t = call.b, inputs[0]
    nd = int(call.class_name[-2])
    cl = _channels_last(call)
    pairs = _pairs(call, "padding", nd)
    if not cl:
        t = b.as_keras(t)
    axes = _spatial_axes(t, cl, nd)
    pads = [0] * (2 * t.rank)
    for a, (lo, hi) in zip(axes, pairs, strict=True):
        pads[a], pads[a + t.rank] = lo, hi
    y = b.node1("Pad", [t.name, b.ints(f"{call.name}/pads", pads)], call.name, mode="constant")
    kaxes = list(range(1, 1 + nd)) if cl else list(range(2, 2 + nd))
    shape = list(t.shape)
    for a, (lo, hi) in zip(kaxes, pairs, strict=True):
        shape[a] = None if shape[a] is None else shape[a] + lo + hi
    return [KTensor(y, tuple(shape), t.cf)]


@layer("Cropping1D", "Cropping2D", "Cropping3D")
def cropping(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    call.weights.take([], [])
    b, t = call.b, inputs[0]
    nd = int(call.class_name[-2])
    cl = _channels_last(call)
    pairs = _pairs(call, "cropping", nd)
    if not cl:
        t = b.as_keras(t)
    axes = _spatial_axes(t, cl, nd)
    starts = [lo for lo, _ in pairs]
    ends = [-hi if hi else INT64_MAX for _, hi in pairs]
    y = b.node1(
        "Slice",
        [
            t.name,
            b.ints(f"{call.name}/starts", starts),
            b.ints(f"{call.name}/ends", ends),
            b.ints(f"{call.name}/axes", axes),
        ],
        call.name,
    )
    kaxes = list(range(1, 1 + nd)) if cl else list(range(2, 2 + nd))
    shape = list(t.shape)
    for a, (lo, hi) in zip(kaxes, pairs, strict=True):
        if shape[a] is not None:
            if lo + hi >= shape[a]:
                raise call.fail(f"cropping {lo}+{hi} leaves nothing of size {shape[a]}")
            shape[a] = shape[a] - lo - hi
    return [KTensor(y, tuple(shape), t.cf)]


@layer("UpSampling1D", "UpSampling2D", "UpSampling3D")
def upsampling(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    """nearest: repeat (Resize asymmetric/floor); bilinear: half-pixel centres, edges clamped."""
    call.weights.take([], [])
    b, t = call.b, inputs[0]
    nd = int(call.class_name[-2])
    cl = _channels_last(call) if nd > 1 else True
    size = _ints(call, "size", nd, 2)
    interp = call.cfg("interpolation", "nearest")
    x = b.as_cf(t) if cl else b.as_keras(t)
    scales = b.f32(f"{call.name}/scales", [1.0, 1.0, *[float(v) for v in size]])
    if interp == "nearest":
        attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    elif interp == "bilinear":
        attrs = {"mode": "linear", "coordinate_transformation_mode": "half_pixel"}
    else:
        raise call.fail(f"interpolation '{interp}'")
    y = b.node1("Resize", [x.name, "", scales], call.name, **attrs)
    kaxes = list(range(1, 1 + nd)) if cl else list(range(2, 2 + nd))
    shape = list(t.shape)
    for a, s in zip(kaxes, size, strict=True):
        shape[a] = None if shape[a] is None else shape[a] * s
    return [KTensor(y, tuple(shape), cl)]


# ----------------------------------------------------------------------------------------- merges

_MERGE = {
    "Add": "Add",
    "Subtract": "Sub",
    "Multiply": "Mul",
    "Maximum": "Max",
    "Minimum": "Min",
    "Average": "Mean",
}


def _broadcast(call: LayerCall, shapes: list[Shape]) -> Shape:
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = {s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0}
        dims.discard(1)
        known = {d for d in dims if d is not None}
        if len(known) > 1:
            raise call.fail(
                f"inputs of shapes {shapes} do not broadcast", hint="the architecture is inconsistent"
            )
        out.append(known.pop() if known else (None if None in dims else 1))
    return tuple(out)


def _same_layout(b: GraphBuilder, inputs: list[KTensor]) -> list[KTensor]:
    """The inputs in one layout; a 0-d constant (a Python number given to a Keras op) fits any."""
    shaped = [t for t in inputs if t.rank > 0]
    rank = shaped[0].rank if shaped else 0
    if shaped and all(t.cf and t.rank == rank for t in shaped):
        return inputs
    return [b.as_keras(t) if t.rank > 0 else t for t in inputs]


@layer(*_MERGE)
def merge(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    call.weights.take([], [])
    b = call.b
    if len(inputs) < 2 or (call.class_name == "Subtract" and len(inputs) != 2):
        raise call.fail(f"{call.class_name} got {len(inputs)} input(s)")
    ts = _same_layout(b, inputs)
    shape = _broadcast(call, [t.shape for t in inputs])
    op = _MERGE[call.class_name]
    if op in ("Add", "Mul", "Sub") and len(ts) > 2:
        y = ts[0].name
        for i, t in enumerate(ts[1:], 1):
            y = b.node1(op, [y, t.name], call.name if i == len(ts) - 1 else f"{call.name}/{i}")
    else:
        y = b.node1(op, [t.name for t in ts], call.name)
    return [KTensor(y, shape, any(t.cf for t in ts if t.rank > 0))]


@layer("Concatenate")
def concatenate(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    call.weights.take([], [])
    b = call.b
    ts = _same_layout(b, inputs)
    rank = inputs[0].rank
    if any(t.rank != rank for t in inputs):
        raise call.fail("inputs of different ranks")
    axis = int(call.cfg("axis", -1)) % rank
    if axis == 0:
        raise call.fail("concatenation along the batch axis")
    onnx_axis = to_cf_perm(rank).index(axis) if ts[0].cf else axis
    shape = list(inputs[0].shape)
    sizes = [t.shape[axis] for t in inputs]
    shape[axis] = None if None in sizes else sum(sizes)
    return [
        KTensor(b.node1("Concat", [t.name for t in ts], call.name, axis=onnx_axis), tuple(shape), ts[0].cf)
    ]


# -------------------------------------------------------------------------------------- embedding


@layer("Embedding")
def embedding(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    b, t = call.b, call.b.as_keras(inputs[0])
    if call.cfg("mask_zero", False):
        raise call.fail("mask_zero=True (masks are not carried into the ONNX graph)")
    n, dim = int(call.config["input_dim"]), int(call.config["output_dim"])
    (table,) = call.weights.take([(n, dim)], ["embeddings"])
    idx = t.name
    if t.dtype not in (TensorProto.INT32, TensorProto.INT64):
        idx = b.node1("Cast", [idx], f"{call.name}/to_int", to=TensorProto.INT64)
    y = b.node1("Gather", [b.param(call.layer, "embeddings", table), idx], call.name, axis=0)
    return [KTensor(y, (*t.shape, dim))]


# ------------------------------------------------------------------------------------- recurrent

_RNN_ACT = {"sigmoid": "Sigmoid", "tanh": "Tanh", "relu": "Relu", "hard_sigmoid": "HardSigmoid"}
_GATES = {"LSTM": 4, "GRU": 3, "SimpleRNN": 1}


@dataclass
class _RnnSpec:
    kind: str  # LSTM / GRU / SimpleRNN
    config: dict


def _rnn_spec(call: LayerCall, class_name: str, config: dict) -> _RnnSpec:
    kind = {"CuDNNLSTM": "LSTM", "CuDNNGRU": "GRU"}.get(class_name, class_name)
    if kind not in _GATES:
        raise call.fail(f"recurrent layer '{class_name}' inside {call.class_name}")
    for key in ("stateful", "time_major"):
        if config.get(key):
            raise call.fail(f"{key}=True")
    return _RnnSpec(kind, config)


def _rnn_acts(call: LayerCall, spec: _RnnSpec) -> tuple[list[str], list[float], list[float]]:
    cfg = spec.config
    names = [cfg.get("activation") or "linear"]
    if spec.kind != "SimpleRNN":
        names = [cfg.get("recurrent_activation") or "linear", names[0]]
    if spec.kind == "LSTM":
        names.append(names[1])
    acts, alphas, betas = [], [], []
    for n in names:
        n = activation_name(call, n)
        if n not in _RNN_ACT:
            raise call.fail(f"recurrent activation '{n}'")
        acts.append(_RNN_ACT[n])
        if n == "hard_sigmoid":
            a, bb = hard_sigmoid_params(call.keras3)
            alphas.append(a)
            betas.append(bb)
    return acts, alphas, betas


def _rnn_weights(call: LayerCall, spec: _RnnSpec, arrays: list[np.ndarray], fan_in: int):
    """Keras kernel (F, G*H), recurrent (H, G*H), bias -> ONNX W (G*H, F), R (G*H, H), B (2*G*H)."""
    h = int(spec.config["units"])
    g = _GATES[spec.kind]
    use_bias = spec.config.get("use_bias", True)
    shapes: list[tuple[int, ...]] = [(fan_in, g * h), (h, g * h)]
    what = ["kernel", "recurrent_kernel"]
    reset_after = spec.kind == "GRU" and spec.config.get("reset_after", False)
    if use_bias:
        shapes.append((2, g * h) if reset_after else (g * h,))
        what.append("bias")
    ws = WeightList(arrays, call.layer, call.path).take(shapes, what)
    w, r = ws[0].T, ws[1].T
    if use_bias:
        bias = ws[2].reshape(-1) if reset_after else np.concatenate([ws[2], np.zeros(g * h, np.float32)])
    else:
        bias = np.zeros(2 * g * h, np.float32)
    if spec.kind == "LSTM":  # Keras gates i f c o -> ONNX i o f c
        order = [0, 3, 1, 2]

        def regate(m):
            parts = np.split(m, 4, axis=0)
            return np.concatenate([parts[i] for i in order], axis=0)

        w, r = regate(w), regate(r)
        bias = np.concatenate([regate(bias[: 4 * h]), regate(bias[4 * h :])])
    return w, r, bias


def _rnn_node(
    call: LayerCall,
    x_tm: str,
    specs: list[_RnnSpec],
    arrays: list[list[np.ndarray]],
    fan_in: int,
    direction: str,
) -> list[str]:
    b = call.b
    spec = specs[0]
    h = int(spec.config["units"])
    if any(int(s.config["units"]) != h or s.kind != spec.kind for s in specs):
        raise call.fail("forward and backward layers differ in kind or units")
    packed = [_rnn_weights(call, s, a, fan_in) for s, a in zip(specs, arrays, strict=True)]
    acts, alphas, betas = [], [], []
    for s in specs:
        a, al, be = _rnn_acts(call, s)
        acts += a
        alphas += al
        betas += be
    w = b.param(call.layer, "W", np.stack([p[0] for p in packed]))
    r = b.param(call.layer, "R", np.stack([p[1] for p in packed]))
    bias = b.param(call.layer, "B", np.stack([p[2] for p in packed]))
    attrs: dict = {"hidden_size": h, "direction": direction, "activations": acts}
    if alphas:
        attrs["activation_alpha"] = alphas
        attrs["activation_beta"] = betas
    if spec.kind == "GRU":
        attrs["linear_before_reset"] = int(bool(spec.config.get("reset_after", False)))
    op = {"LSTM": "LSTM", "GRU": "GRU", "SimpleRNN": "RNN"}[spec.kind]
    n_out = 3 if op == "LSTM" else 2
    return b.node(op, [x_tm, w, r, bias], call.name, n_out, **attrs)


def _time_major(call: LayerCall, t: KTensor) -> tuple[str, int]:
    if t.rank != 3 or t.shape[2] is None:
        raise call.fail(f"input shape {t.shape} is not (batch, time, features) with known features")
    x = call.b.node1("Transpose", [t.name], f"{call.name}/to_time_major", perm=[1, 0, 2])
    return x, int(t.shape[2])


def _seq_out(call: LayerCall, y: str, d: int, part: str) -> str:
    """ONNX Y (T, D, N, H) direction d -> Keras (N, T, H)."""
    b = call.b
    sl = b.node1(
        "Slice",
        [
            y,
            b.ints(f"{call.name}/{part}/d0", [d]),
            b.ints(f"{call.name}/{part}/d1", [d + 1]),
            b.ints(f"{call.name}/{part}/axes", [1]),
        ],
        f"{call.name}/{part}/direction",
    )
    sq = b.node1("Squeeze", [sl, b.ints(f"{call.name}/{part}/sq", [1])], f"{call.name}/{part}/squeeze")
    return b.node1("Transpose", [sq], f"{call.name}/{part}/batch_major", perm=[1, 0, 2])


def _state_out(call: LayerCall, s: str, d: int, part: str) -> str:
    """ONNX state (D, N, H) direction d -> (N, H)."""
    b = call.b
    g = b.node1(
        "Gather",
        [s, b.const(f"{call.name}/{part}/d", np.asarray(d, np.int64))],
        f"{call.name}/{part}",
        axis=0,
    )
    return g


def _reverse_time(call: LayerCall, y: str) -> str:
    b = call.b
    return b.node1(
        "Slice",
        [
            y,
            b.ints(f"{call.name}/rev/s", [-1]),
            b.ints(f"{call.name}/rev/e", [INT64_MIN]),
            b.ints(f"{call.name}/rev/a", [1]),
            b.ints(f"{call.name}/rev/st", [-1]),
        ],
        f"{call.name}/reverse_time",
    )


@layer("LSTM", "GRU", "SimpleRNN", "CuDNNLSTM", "CuDNNGRU")
def rnn(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    """go_backwards: ONNX 'reverse' aligns Y with the input's time steps, Keras returns them reversed."""
    t = call.b.as_keras(inputs[0])
    spec = _rnn_spec(call, call.class_name, call.config)
    x, fan_in = _time_major(call, t)
    back = bool(spec.config.get("go_backwards", False))
    outs = _rnn_node(call, x, [spec], [call.weights.arrays], fan_in, "reverse" if back else "forward")
    h = int(spec.config["units"])
    n, steps = t.shape[0], t.shape[1]
    if spec.config.get("return_sequences", False):
        y = _seq_out(call, outs[0], 0, "seq")
        if back:
            y = _reverse_time(call, y)
        result = [KTensor(y, (n, steps, h))]
    else:
        result = [KTensor(_state_out(call, outs[1], 0, "last"), (n, h))]
    if spec.config.get("return_state", False):
        result.append(KTensor(_state_out(call, outs[1], 0, "state_h"), (n, h)))
        if spec.kind == "LSTM":
            result.append(KTensor(_state_out(call, outs[2], 0, "state_c"), (n, h)))
    return result


@layer("Bidirectional")
def bidirectional(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    b, t = call.b, call.b.as_keras(inputs[0])
    fwd_cfg = call.config.get("layer") or {}
    bwd_cfg = call.config.get("backward_layer") or fwd_cfg
    specs = [
        _rnn_spec(call, fwd_cfg.get("class_name", "?"), fwd_cfg.get("config") or {}),
        _rnn_spec(call, bwd_cfg.get("class_name", "?"), bwd_cfg.get("config") or {}),
    ]
    x, fan_in = _time_major(call, t)
    arrays = call.weights.arrays
    half = len(arrays) // 2
    outs = _rnn_node(call, x, specs, [arrays[:half], arrays[half:]], fan_in, "bidirectional")
    h = int(specs[0].config["units"])
    n, steps = t.shape[0], t.shape[1]
    seq = bool(specs[0].config.get("return_sequences", False))
    shape: Shape
    if seq:
        parts = [_seq_out(call, outs[0], d, p) for d, p in ((0, "forward"), (1, "backward"))]
        shape = (n, steps, h)
    else:
        parts = [_state_out(call, outs[1], d, p) for d, p in ((0, "forward"), (1, "backward"))]
        shape = (n, h)
    mode = call.config.get("merge_mode", "concat")
    if mode is None:
        result = [KTensor(p, shape) for p in parts]
    elif mode == "concat":
        result = [KTensor(b.node1("Concat", parts, call.name + "/merge", axis=-1), (*shape[:-1], 2 * h))]
    elif mode in ("sum", "mul", "ave"):
        op = {"sum": "Add", "mul": "Mul", "ave": "Mean"}[mode]
        result = [KTensor(b.node1(op, parts, call.name + "/merge"), shape)]
    else:
        raise call.fail(f"merge_mode '{mode}'")
    if specs[0].config.get("return_state", False):
        for d, p in ((0, "forward"), (1, "backward")):
            result.append(KTensor(_state_out(call, outs[1], d, f"{p}_h"), (n, h)))
            if specs[0].kind == "LSTM":
                result.append(KTensor(_state_out(call, outs[2], d, f"{p}_c"), (n, h)))
    return result


# ------------------------------------------------------------------------------- TimeDistributed


@layer("TimeDistributed")
def time_distributed(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    """Fold time into batch (``<layer>/merge_time``), run the inner layer, unfold (``<layer>/split_time``)."""
    b, t = call.b, call.b.as_keras(inputs[0])
    inner = call.config.get("layer") or {}
    cls = inner.get("class_name")
    handler = LAYERS.get(cls or "")
    if (
        handler is None
        or cls is None
        or not known_layer(cls, inner)
        or cls in ("TimeDistributed", "Bidirectional", "LSTM", "GRU", "SimpleRNN")
    ):
        raise call.fail(f"TimeDistributed over '{cls}'")
    sub = LayerCall(
        b, call.name, call.layer, cls, inner.get("config") or {}, call.weights, call.keras3, call.path
    )
    if t.rank < 3 or any(v is None for v in t.shape[2:]):
        raise call.fail(f"input shape {t.shape} needs known per-step dims")
    if cls == "Dense":  # Dense already maps over leading axes
        return handler(sub, [t])
    folded = b.node1(
        "Reshape", [t.name, b.ints(f"{call.name}/merge_shape", [-1, *t.shape[2:]])], f"{call.name}/merge_time"
    )
    (y,) = handler(sub, [KTensor(folded, (None, *t.shape[2:]))])
    y = b.as_keras(y)
    if any(v is None for v in y.shape[1:]):
        raise call.fail("inner layer output has unknown dims")
    lead = b.node1("Shape", [t.name], f"{call.name}/shape", start=0, end=2)
    shp = b.node1(
        "Concat",
        [lead, b.ints(f"{call.name}/inner_shape", list(y.shape[1:]))],
        f"{call.name}/out_shape",
        axis=0,
    )
    out = b.node1("Reshape", [y.name, shp], f"{call.name}/split_time")
    return [KTensor(out, (t.shape[0], t.shape[1], *y.shape[1:]))]


# ------------------------------------------------------------------------- application layers

# Layers that ``keras.applications`` defines in its own modules (not in ``keras.layers``). A file
# names them by class name only, so a user's own class of the same name would be taken for them:
# each is recognized only from its application module (or with no module: legacy HDF5 drops it)
# and with the config keys it writes; any other is an unknown (custom) layer.
APPLICATION_LAYERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "LayerScale": (("convnext",), ("projection_dim",)),
    "StochasticDepth": (("convnext",), ("drop_path_rate",)),
    "CustomScaleLayer": (("inception_resnet_v2",), ("scale",)),
}


def known_layer(class_name: str, layer: dict) -> bool:
    """Whether ``layer`` (a config entry of class ``class_name``) has a handler that means it."""
    if class_name not in LAYERS:
        return False
    spec = APPLICATION_LAYERS.get(class_name)
    if spec is None:
        return True
    modules, keys = spec
    module = layer.get("module")
    if module is not None and module not in {
        f"{root}.{m}" for root in ("keras.src.applications", "keras.applications") for m in modules
    }:
        return False
    cfg = layer.get("config")
    return isinstance(cfg, dict) and all(k in cfg for k in keys)


def _channel_const(b: GraphBuilder, t: KTensor, name: str, vec: np.ndarray) -> str:
    """A per-channel vector (the Keras tensor's last axis) shaped to broadcast in ``t``'s layout."""
    shape = [1] * t.rank
    shape[1 if t.cf else t.rank - 1] = vec.size
    return b.const(name, vec.astype(np.float32).reshape(shape))


@layer("LayerScale")
def layer_scale(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    """ConvNeXt's LayerScale: ``x * gamma``, gamma one value per channel (the last axis)."""
    b, t = call.b, inputs[0]
    dim = int(call.config["projection_dim"])
    if t.rank < 2 or t.shape[-1] != dim:
        raise call.fail(f"input shape {t.shape} does not end in projection_dim {dim}")
    (gamma,) = call.weights.take([(dim,)], ["gamma"])
    g = _channel_const(b, t, f"{call.layer}/gamma", gamma) if t.cf else b.param(call.layer, "gamma", gamma)
    return [KTensor(b.node1("Mul", [t.name, g], call.name), t.shape, t.cf, t.dtype)]


@layer("StochasticDepth")
def stochastic_depth(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    """ConvNeXt's StochasticDepth drops residual paths in training only: the identity at inference."""
    rate = float(call.config["drop_path_rate"])
    if not 0.0 <= rate < 1.0:
        raise call.fail(f"drop_path_rate {rate} is outside [0, 1)")
    return identity_layer(call, inputs)


@layer("CustomScaleLayer")
def custom_scale(call: LayerCall, inputs: list[KTensor]) -> list[KTensor]:
    """InceptionResNetV2's residual sum: ``inputs[0] + inputs[1] * scale``."""
    call.weights.take([], [])
    b = call.b
    if len(inputs) != 2:
        raise call.fail(f"CustomScaleLayer got {len(inputs)} input(s), it takes 2")
    scale = float(call.config["scale"])
    x, r = _same_layout(b, inputs)
    shape = _broadcast(call, [t.shape for t in inputs])
    m = b.node1("Mul", [r.name, b.f32(f"{call.layer}/scale", scale)], f"{call.name}/scale")
    return [KTensor(b.node1("Add", [x.name, m], call.name), shape, x.cf)]
