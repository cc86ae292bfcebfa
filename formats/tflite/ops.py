"""TFLite op lowerings: one function per op family, registered in :data:`mconv.formats.tflite.reader.OPS`.

Each lowering reads its op's tensors through the converter (``c.value``, ``c.need_const``), emits
ONNX nodes (``c.one``/``c.emit``) and binds the op's outputs (``c.bind``), which applies the fused
activation and the fake-quant rounding. Rules of layout, padding and quantization are stated in
:mod:`mconv.formats.tflite`.
"""

from __future__ import annotations

import numpy as np
from mconv.formats.tflite import lstm_int as _lstm_int
from mconv.formats.tflite.reader import (
    _QUANT_TYPES,
    ACT_RELU,
    ACT_RELU6,
    ACT_RELU_N1_TO_1,
    ACT_TANH,
    MAX_UNROLL_STEPS,
    SAME,
    VALID,
    TflOp,
    _Converter,
    _Unsupported,
    lowering,
    tf_same_pads,
)
from onnx import TensorProto, helper

# ------------------------------------------------------------------------------ convolution


def _spatial_pads(
    c: _Converter, op: TflOp, x: int, kh: int, kw: int, sh: int, sw: int, dh: int = 1, dw: int = 1
) -> list[int]:
    if min(kh, kw, sh, sw, dh, dw) < 1:
        raise ValueError(f"window {kh}x{kw}, stride {sh}x{sw}, dilation {dh}x{dw} must be positive")
    padding = c.opt(op, "Padding", SAME)
    if padding == VALID:
        return [0, 0, 0, 0]
    if padding != SAME:
        raise _Unsupported(f"padding {padding}")
    shape = c.T(x).shape
    if len(shape) != 4:
        raise _Unsupported(f"input of rank {len(shape)}, expected NHWC")
    (t, b), (left, r) = tf_same_pads(shape[1], kh, sh, dh), tf_same_pads(shape[2], kw, sw, dw)
    return [t, left, b, r]


def _bias(c: _Converter, op: TflOp, k: int, n: int) -> list[str]:
    if len(op.inputs) > k and op.inputs[k] >= 0:
        b = c.need_const(op.inputs[k], "bias").astype(np.float32).reshape(-1)
        if b.size != n:
            raise _Unsupported(f"bias of {b.size} values for {n} output channels")
        q = c.qweight(op.inputs[k], lambda a: a.reshape(-1), 0, 0)
        return [q if q is not None else c.init(f"{c.tname[op.inputs[k]]}", b)]
    return []


def _weight(c: _Converter, i: int, w: np.ndarray, fn, qdim: int, axis: int) -> str:
    """The filter ``fn(w)`` as an initializer, or its codes and a DequantizeLinear (Q/DQ mode)."""
    q = c.qweight(i, fn, qdim, axis)
    return q if q is not None else c.init(c.tname[i], fn(w))


def _hybrid(c: _Converter, x: int, w_i: int) -> bool:
    """Whether an op on float input ``x`` with filter ``w_i`` runs LiteRT's hybrid kernel (int8 or
    uint8 weights, float activations) and the import follows it (Q/DQ mode, rule 4b)."""
    t, w = c.T(x), c.T(w_i)
    return c.fake_quant and t.type == 0 and w.type in (3, 9) and w.quantized and w.data is not None


def _per_channel(c: _Converter, w_i: int) -> bool:
    """conv.cc's is_hybrid_per_channel: int8 filter scales that are not all equal."""
    t = c.T(w_i)
    return t.type == 9 and t.scale is not None and t.scale.size > 1 and bool(np.any(t.scale != t.scale[0]))


def _dynamic_quantize(c: _Converter, v: str, axes_list: list[int], asymmetric: bool) -> str:
    """``v`` quantized to int8 per row and back, as LiteRT's hybrid kernels quantize their input on
    the fly (tensor_utils: SymmetricQuantizeFloats / AsymmetricQuantizeFloats, and XNNPACK's
    qd8 convert, over the elements of each row: ``axes_list`` are the axes reduced): symmetric ``scale = max|x| / 127``, codes
    ``clip(round(x / scale), -127, 127)``; asymmetric over ``[min(x, 0), max(x, 0)]``, ``scale =
    range / 255``, zero point ``round(-128 - min / scale)`` clipped to int8, codes
    ``clip(round(x / scale) + zp, -128, 127)``. An all-zero row quantizes to zeros (scale 1). The
    value returned is ``(codes - zp) * scale``: the product with the integer filter codes then is
    the kernel's integer accumulator times its two scales."""
    axes = c.ints("row_axes", axes_list)
    zero = c.init("zero", np.array(0.0, np.float32))
    one = c.init("one", np.array(1.0, np.float32))
    if asymmetric:
        lo = c.one("Min", [c.one("ReduceMin", [v, axes], keepdims=1), zero])
        hi = c.one("Max", [c.one("ReduceMax", [v, axes], keepdims=1), zero])
        span = c.one("Sub", [hi, lo])
        scale = c.one("Div", [span, c.init("levels", np.array(255.0, np.float32))])
        scale = c.one("Where", [c.one("Equal", [span, zero]), one, scale])
        zp = c.one(
            "Round", [c.one("Sub", [c.init("qmin", np.array(-128.0, np.float32)), c.one("Div", [lo, scale])])]
        )
        lo_q, hi_q = (
            c.init("code_min", np.array(-128.0, np.float32)),
            c.init("code_max", np.array(127.0, np.float32)),
        )
        zp = c.one("Clip", [zp, lo_q, hi_q])
        q = c.one("Clip", [c.one("Add", [c.one("Round", [c.one("Div", [v, scale])]), zp]), lo_q, hi_q])
        return c.one("Mul", [c.one("Sub", [q, zp]), scale])
    rng = c.one("ReduceMax", [c.one("Abs", [v]), axes], keepdims=1)
    scale = c.one("Div", [rng, c.init("levels", np.array(127.0, np.float32))])
    scale = c.one("Where", [c.one("Equal", [rng, zero]), one, scale])
    lo_q, hi_q = (
        c.init("code_min", np.array(-127.0, np.float32)),
        c.init("code_max", np.array(127.0, np.float32)),
    )
    q = c.one("Clip", [c.one("Round", [c.one("Div", [v, scale])]), lo_q, hi_q])
    return c.one("Mul", [q, scale])


def _conv_input(c: _Converter, x: int, w_i: int, rows: str, asymmetric: bool) -> str:
    """The NCHW input of a conv, dynamically quantized where the op is hybrid: one row per image
    (``rows="image"``) or per pixel (``"pixel"``: over the channels)."""
    v = c.to_nchw(x)
    if _hybrid(c, x, w_i):
        v = _dynamic_quantize(c, v, [1] if rows == "pixel" else [1, 2, 3], asymmetric)
    return v


@lowering("CONV_2D")
def conv_2d(c: _Converter, op: TflOp) -> None:
    x, w_i = op.inputs[0], op.inputs[1]
    w = c.need_const(w_i, "filter").astype(np.float32)  # [Cout, KH, KW, Cin/groups]
    if w.ndim != 4:
        raise _Unsupported(f"filter of rank {w.ndim}")
    cin = c.T(x).shape[3] if len(c.T(x).shape) == 4 else w.shape[3]
    if cin % w.shape[3]:
        raise _Unsupported(f"{cin} input channels do not split into groups of {w.shape[3]}")
    sh, sw = c.opt(op, "StrideH", 1), c.opt(op, "StrideW", 1)
    dh, dw = c.opt(op, "DilationHFactor", 1) or 1, c.opt(op, "DilationWFactor", 1) or 1
    pads = _spatial_pads(c, op, x, w.shape[1], w.shape[2], sh, sw, dh, dw)
    wn = _weight(c, w_i, w, lambda a: a.transpose(0, 3, 1, 2), 0, 0)
    # Hybrid (rule 4b). LiteRT's default interpreter runs it in XNNPACK (qd8: asymmetric; a 1x1
    # stride-1 conv as a fully connected layer, one row per pixel, else one per image); its builtin
    # kernel quantizes per image, asymmetrically in EvalHybridPerChannel, else symmetrically.
    if c.hybrid == "xnnpack":
        pointwise = w.shape[1] == w.shape[2] == 1 and sh == sw == 1
        xv = _conv_input(c, x, w_i, "pixel" if pointwise else "image", True)
    else:
        xv = _conv_input(c, x, w_i, "image", _per_channel(c, w_i))
    y = c.one(
        "Conv",
        [xv, wn, *_bias(c, op, 2, w.shape[0])],
        strides=[sh, sw],
        pads=pads,
        dilations=[dh, dw],
        group=cin // w.shape[3],
        kernel_shape=[w.shape[1], w.shape[2]],
    )
    c.bind(op.outputs[0], y, c.opt(op, "FusedActivationFunction"), nchw=True)


@lowering("DEPTHWISE_CONV_2D")
def depthwise_conv_2d(c: _Converter, op: TflOp) -> None:
    x, w_i = op.inputs[0], op.inputs[1]
    w = c.need_const(w_i, "filter").astype(np.float32)  # [1, KH, KW, Cin*M]
    xs = c.T(x).shape
    if w.ndim != 4 or w.shape[0] != 1 or len(xs) != 4 or w.shape[3] % xs[3]:
        raise _Unsupported(f"filter {list(w.shape)} does not fit input {list(xs)}")
    cin = xs[3]
    sh, sw = c.opt(op, "StrideH", 1), c.opt(op, "StrideW", 1)
    dh, dw = c.opt(op, "DilationHFactor", 1) or 1, c.opt(op, "DilationWFactor", 1) or 1
    pads = _spatial_pads(c, op, x, w.shape[1], w.shape[2], sh, sw, dh, dw)
    # Output channel c*M + m reads input channel c: exactly ONNX's grouped conv with group = Cin.
    wn = _weight(c, w_i, w, lambda a: a[0].transpose(2, 0, 1)[:, None], 3, 0)
    # XNNPACK refuses a hybrid depthwise conv: both modes run depthwise_conv.cc's only hybrid path,
    # EvalHybridPerChannel (asymmetric, per image).
    xv = _conv_input(c, x, w_i, "image", True)
    y = c.one(
        "Conv",
        [xv, wn, *_bias(c, op, 2, w.shape[3])],
        strides=[sh, sw],
        pads=pads,
        dilations=[dh, dw],
        group=cin,
        kernel_shape=[w.shape[1], w.shape[2]],
    )
    c.bind(op.outputs[0], y, c.opt(op, "FusedActivationFunction"), nchw=True)


@lowering("TRANSPOSE_CONV")
def transpose_conv(c: _Converter, op: TflOp) -> None:
    out_shape = c.need_const(op.inputs[0], "output_shape").astype(np.int64).reshape(-1)
    w_i, x = op.inputs[1], op.inputs[2]
    w = c.need_const(w_i, "filter").astype(np.float32)  # [Cout, KH, KW, Cin]
    xs = c.T(x).shape
    if w.ndim != 4 or len(xs) != 4 or out_shape.size != 4 or xs[3] != w.shape[3]:
        raise _Unsupported(f"filter {list(w.shape)} / input {list(xs)} / output_shape {out_shape.tolist()}")
    sh, sw = c.opt(op, "StrideH", 1), c.opt(op, "StrideW", 1)
    kh, kw = w.shape[1], w.shape[2]
    pads, out_pad = [0, 0, 0, 0], [0, 0]
    for d, (size_in, size_out, k, s) in enumerate(
        ((xs[1], out_shape[1], kh, sh), (xs[2], out_shape[2], kw, sw))
    ):
        total = max((size_in - 1) * s + k - int(size_out), 0) if c.opt(op, "Padding", SAME) == SAME else 0
        before, after = total // 2, total - total // 2
        extra = int(size_out) - ((size_in - 1) * s + k - before - after)
        if extra < 0:
            after -= extra
            extra = 0
        pads[d], pads[d + 2], out_pad[d] = before, after, extra
    if out_pad[0] >= sh and sh > 0 or out_pad[1] >= sw and sw > 0:
        raise _Unsupported(f"output_shape {out_shape.tolist()} is not reachable with stride {sh}x{sw}")
    wn = _weight(c, w_i, w, lambda a: a.transpose(3, 0, 1, 2), 0, 1)  # ONNX: [Cin, Cout, KH, KW]
    y = c.one(
        "ConvTranspose",
        [c.to_nchw(x), wn, *_bias(c, op, 3, w.shape[0])],
        strides=[sh, sw],
        pads=pads,
        output_padding=out_pad,
        kernel_shape=[kh, kw],
    )
    c.bind(op.outputs[0], y, c.opt(op, "FusedActivationFunction"), nchw=True)


@lowering("AVERAGE_POOL_2D", "MAX_POOL_2D")
def pool_2d(c: _Converter, op: TflOp) -> None:
    x = op.inputs[0]
    kh, kw = c.opt(op, "FilterHeight", 1), c.opt(op, "FilterWidth", 1)
    sh, sw = c.opt(op, "StrideH", 1), c.opt(op, "StrideW", 1)
    pads = _spatial_pads(c, op, x, kh, kw, sh, sw)
    kind = "AveragePool" if op.code == "AVERAGE_POOL_2D" else "MaxPool"
    extra = {"count_include_pad": 0} if kind == "AveragePool" else {}
    y = c.one(kind, [c.to_nchw(x)], kernel_shape=[kh, kw], strides=[sh, sw], pads=pads, **extra)
    c.bind(op.outputs[0], y, c.opt(op, "FusedActivationFunction"), nchw=True)


# ------------------------------------------------------------------------------ dense


@lowering("FULLY_CONNECTED")
def fully_connected(c: _Converter, op: TflOp) -> None:
    if c.opt(op, "WeightsFormat", 0) != 0:
        raise _Unsupported("shuffled weights format")
    x, w_i = op.inputs[0], op.inputs[1]
    w = c.need_const(w_i, "weights").astype(np.float32)  # [units, K]
    if w.ndim != 2:
        raise _Unsupported(f"weights of rank {w.ndim}")
    units, k = w.shape
    xv = c.value(x)
    if len(c.T(x).shape) != 2:
        xv = c.one("Reshape", [xv, c.ints("flat", [-1, k])])
    if _hybrid(c, x, w_i):  # per row of [batch, K]: XNNPACK's qd8 is asymmetric; the builtin
        # kernel is symmetric unless the op asks for asymmetric_quantize_inputs
        asym = c.hybrid == "xnnpack" or bool(c.opt(op, "AsymmetricQuantizeInputs", False))
        xv = _dynamic_quantize(c, xv, [1], asym)
    wn = _weight(c, w_i, w, lambda a: a, 0, 0)
    y = c.one("Gemm", [xv, wn, *_bias(c, op, 2, units)], transB=1)
    out = c.T(op.outputs[0])
    if len(out.shape) != 2:
        y = c.one("Reshape", [y, c.ints("shape", _target_shape(out))])
    c.bind(op.outputs[0], y, c.opt(op, "FusedActivationFunction"))


def _target_shape(t) -> list[int]:
    """A Reshape target for tensor ``t``: its shape, with one dynamic (-1) dimension kept."""
    sig = t.signature
    if sig is not None and sum(d == -1 for d in sig) == 1:
        return list(sig)
    return list(t.shape)


# ------------------------------------------------------------------------------ elementwise

_BINARY = {"ADD": "Add", "SUB": "Sub", "MUL": "Mul", "DIV": "Div", "MAXIMUM": "Max", "MINIMUM": "Min"}


@lowering(*_BINARY)
def binary(c: _Converter, op: TflOp) -> None:
    a, b = (c.value(i) for i in op.inputs[:2])
    y = c.one(_BINARY[op.code], [a, b])
    c.bind(op.outputs[0], y, c.opt(op, "FusedActivationFunction"))


_ACTIVATIONS = {"RELU": ACT_RELU, "RELU6": ACT_RELU6, "RELU_N1_TO_1": ACT_RELU_N1_TO_1, "TANH": ACT_TANH}


@lowering(*_ACTIVATIONS)
def activation(c: _Converter, op: TflOp) -> None:
    c.bind(op.outputs[0], c.activation(c.value(op.inputs[0]), _ACTIVATIONS[op.code]))


@lowering("LOGISTIC")
def logistic(c: _Converter, op: TflOp) -> None:
    c.bind(op.outputs[0], c.one("Sigmoid", [c.value(op.inputs[0])]))


@lowering("SOFTMAX")
def softmax(c: _Converter, op: TflOp) -> None:
    x = c.value(op.inputs[0])
    beta = float(c.opt(op, "Beta", 1.0))
    if beta != 1.0:
        x = c.one("Mul", [x, c.init("beta", np.float32(beta))])
    c.bind(op.outputs[0], c.one("Softmax", [x], axis=-1))


@lowering("QUANTIZE")
def quantize(c: _Converter, op: TflOp) -> None:
    # The graph holds real values: quantizing is rounding to the output's grid (rule 4).
    c.bind(op.outputs[0], c.value(op.inputs[0]))


@lowering("DENSIFY")
def densify(c: _Converter, op: TflOp) -> None:
    # The sparse constant was made dense when the file was read (tflite.py rule 1b): fold.
    a = c.need_const(op.inputs[0], "sparse input")
    c.folded[op.outputs[0]] = a
    c.vals[op.outputs[0]] = c.init(c.tname[op.outputs[0]], a)


@lowering("DEQUANTIZE")
def dequantize_op(c: _Converter, op: TflOp) -> None:
    x = op.inputs[0]
    a = c.const_array(x)
    if a is not None:  # fp16 / int8 weights dequantized for a float kernel: fold
        a = a.astype(np.float32)
        c.folded[op.outputs[0]] = a  # a later op may need it as a constant (a filter)
        c.vals[op.outputs[0]] = c.init(c.tname[op.outputs[0]], a)
        return
    c.bind(op.outputs[0], c.value(x), quantize=False)


# ------------------------------------------------------------------------------ shape


@lowering("RESHAPE")
def reshape(c: _Converter, op: TflOp) -> None:
    out = c.T(op.outputs[0])
    c.bind(op.outputs[0], c.one("Reshape", [c.value(op.inputs[0]), c.ints("shape", _target_shape(out))]))


@lowering("CONCATENATION")
def concatenation(c: _Converter, op: TflOp) -> None:
    axis = int(c.opt(op, "Axis", 0))
    y = c.one("Concat", [c.value(i) for i in op.inputs], axis=axis)
    c.bind(op.outputs[0], y, c.opt(op, "FusedActivationFunction"))


@lowering("PAD", "PADV2")
def pad(c: _Converter, op: TflOp) -> None:
    p = c.need_const(op.inputs[1], "paddings").astype(np.int64).reshape(-1, 2)
    inputs = [c.value(op.inputs[0]), c.ints("pads", np.concatenate([p[:, 0], p[:, 1]]))]
    if op.code == "PADV2" and len(op.inputs) > 2 and op.inputs[2] >= 0:
        v = c.need_const(op.inputs[2], "constant_values").astype(np.float32).reshape(-1)[:1].reshape(())
        inputs.append(c.init("constant_value", v))
    c.bind(op.outputs[0], c.one("Pad", inputs))


@lowering("TRANSPOSE")
def transpose(c: _Converter, op: TflOp) -> None:
    perm = c.need_const(op.inputs[1], "perm").astype(np.int64).reshape(-1).tolist()
    c.bind(op.outputs[0], c.one("Transpose", [c.value(op.inputs[0])], perm=perm))


@lowering("MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN")
def reduce(c: _Converter, op: TflOp) -> None:
    axes = c.need_const(op.inputs[1], "axis").astype(np.int64).reshape(-1)
    kind = {"MEAN": "ReduceMean", "SUM": "ReduceSum", "REDUCE_MAX": "ReduceMax", "REDUCE_MIN": "ReduceMin"}[
        op.code
    ]
    y = c.one(
        kind, [c.value(op.inputs[0]), c.ints("axes", axes)], keepdims=int(bool(c.opt(op, "KeepDims", 0)))
    )
    c.bind(op.outputs[0], y)


# ------------------------------------------------------------------------------ recurrent

# TFLite UNIDIRECTIONAL_SEQUENCE_LSTM input slots.
_X, _WI, _WF, _WC, _WO, _RI, _RF, _RC, _RO, _PI, _PF, _PO, _BI, _BF, _BC, _BO, _PROJ_W, _PROJ_B, _H0, _C0 = (
    range(20)
)
_ONNX_ACT = {ACT_TANH: "Tanh", ACT_RELU: "Relu"}


@lowering("UNIDIRECTIONAL_SEQUENCE_LSTM")
def unidirectional_sequence_lstm(c: _Converter, op: TflOp) -> None:
    ins = list(op.inputs) + [-1] * (24 - len(op.inputs))

    def w(k: int, what: str) -> np.ndarray | None:
        return None if ins[k] < 0 else c.need_const(ins[k], what).astype(np.float32)

    if any(k >= 0 for k in ins[20:24]):
        raise _Unsupported("layer-norm LSTM")
    if op.options.get("DiagonalRecurrentTensors"):
        raise _Unsupported("diagonal recurrent tensors")
    wx = [w(k, "input weights") for k in (_WI, _WF, _WC, _WO)]
    wr = [w(k, "recurrent weights") for k in (_RI, _RF, _RC, _RO)]
    b = [w(k, "gate bias") for k in (_BI, _BF, _BC, _BO)]
    peep = [w(k, "peephole weights") for k in (_PI, _PF, _PO)]
    forget_in = wx[1]
    if forget_in is None or any(a is None for a in wx[1:] + wr[1:]):
        raise _Unsupported("missing gate weights")
    hidden = forget_in.shape[0]
    cifg = wx[0] is None
    b = [np.zeros(hidden, np.float32) if a is None else a.reshape(-1) for a in b]
    proj_w, proj_b = w(_PROJ_W, "projection weights"), w(_PROJ_B, "projection bias")
    act = int(c.opt(op, "FusedActivationFunction", ACT_TANH))
    cell_clip, proj_clip = float(c.opt(op, "CellClip", 0.0)), float(c.opt(op, "ProjClip", 0.0))
    time_major = bool(c.opt(op, "TimeMajor", False))
    xs = c.T(ins[_X]).shape
    if len(xs) != 3:
        raise _Unsupported(f"input of rank {len(xs)}")
    x = c.value(ins[_X])
    if not time_major:
        x = c.one("Transpose", [x], perm=[1, 0, 2])  # -> [T, B, I]
    steps = xs[0] if time_major else xs[1]
    simple = not (cifg or proj_w is not None or cell_clip > 0 or proj_clip > 0) and act in _ONNX_ACT
    if act == ACT_TANH and _lstm_int.integer_kernel_applies(c, ins, op.outputs[0]):
        if steps > MAX_UNROLL_STEPS:
            raise _Unsupported(f"{steps} time steps to unroll (limit {MAX_UNROLL_STEPS})")
        y = _lstm_int.lower(c, ins, x, steps, op.outputs[0], cell_clip)  # LiteRT's integer kernel, exactly
    elif simple:
        y = _onnx_lstm(c, ins, x, wx, wr, b, peep, hidden, act)
    else:
        if steps > MAX_UNROLL_STEPS:
            raise _Unsupported(f"{steps} time steps to unroll (limit {MAX_UNROLL_STEPS})")
        y = _unrolled_lstm(c, ins, x, steps, wx, wr, b, peep, proj_w, proj_b, act, cell_clip, proj_clip)
    if not time_major:
        y = c.one("Transpose", [y], perm=[1, 0, 2])
    c.bind(op.outputs[0], y)


def _state(c: _Converter, k: int) -> str | None:
    return None if k < 0 else c.value(k)


def _onnx_lstm(c, ins, x, wx, wr, b, peep, hidden, act) -> str:
    # ONNX gate order is i, o, f, c; TFLite's is i, f, c, o.
    order = (0, 3, 1, 2)
    W = np.concatenate([wx[g] for g in order])[None]
    R = np.concatenate([wr[g] for g in order])[None]
    B = np.concatenate([np.concatenate([b[g] for g in order]), np.zeros(4 * hidden, np.float32)])[None]
    inputs = [
        x,
        c.init(f"{c.node_base}/W", W),
        c.init(f"{c.node_base}/R", R),
        c.init(f"{c.node_base}/B", B),
        "",
    ]
    for k in (_H0, _C0):
        s = _state(c, ins[k])
        inputs.append("" if s is None else c.one("Unsqueeze", [s, c.ints("axes", [0])]))
    if any(p is not None for p in peep):
        z = np.zeros(hidden, np.float32)
        pi, pf, po = (z if p is None else p.reshape(-1) for p in peep)
        inputs.append(c.init(f"{c.node_base}/P", np.concatenate([pi, po, pf])[None]))
    a = _ONNX_ACT[act]
    y, _, _ = c.emit("LSTM", inputs, 3, hidden_size=hidden, activations=["Sigmoid", a, a])
    return c.one("Squeeze", [y, c.ints("axes", [1])])  # [T, 1, B, H] -> [T, B, H]


def _unrolled_lstm(c, ins, x, steps, wx, wr, b, peep, proj_w, proj_b, act, cell_clip, proj_clip) -> str:
    """TFLite's LSTM cell, step by step (lstm_eval.cc): gates from x_t W + h_{t-1} R + b,
    peepholes read c_{t-1} for i and f and c_t for o, c_t clipped to +-cell_clip, the output
    projected and clipped to +-proj_clip; CIFG sets i = 1 - f."""
    gates = [g for g in range(4) if wx[g] is not None]  # i (unless CIFG), f, c, o
    sizes = [wx[g].shape[0] for g in gates]
    Wx = c.init(f"{c.node_base}/input_weights", np.concatenate([wx[g] for g in gates]).T.copy())
    Wr = c.init(f"{c.node_base}/recurrent_weights", np.concatenate([wr[g] for g in gates]).T.copy())
    bias = c.init(f"{c.node_base}/bias", np.concatenate([b[g] for g in gates]))
    xw = c.one("Add", [c.one("MatMul", [x, Wx]), bias])  # [T, B, nG*H]
    split = c.ints("split", sizes)

    def clip(v: str, limit: float) -> str:
        if limit <= 0:
            return v
        return c.one("Clip", [v, c.init("lo", np.float32(-limit)), c.init("hi", np.float32(limit))])

    h, cell = _state(c, ins[_H0]), _state(c, ins[_C0])
    peep_names = [None if p is None else c.init(f"{c.node_base}/peephole", p.reshape(-1)) for p in peep]
    one = c.init("one", np.float32(1.0)) if wx[0] is None else None
    outs = []
    for t in range(steps):
        xt = c.one("Gather", [xw, c.ints("t", np.int64(t))], axis=0)
        pre = c.one("Add", [xt, c.one("MatMul", [h, Wr])]) if h is not None else xt
        parts = dict(zip(gates, c.emit("Split", [pre, split], len(gates), axis=1), strict=True))
        f_pre = parts[1]
        if peep_names[1] is not None and cell is not None:
            f_pre = c.one("Add", [f_pre, c.one("Mul", [cell, peep_names[1]])])
        f = c.one("Sigmoid", [f_pre])
        if wx[0] is None:
            i = c.one("Sub", [one, f])
        else:
            i_pre = parts[0]
            if peep_names[0] is not None and cell is not None:
                i_pre = c.one("Add", [i_pre, c.one("Mul", [cell, peep_names[0]])])
            i = c.one("Sigmoid", [i_pre])
        g = c.activation(parts[2], act)
        ig = c.one("Mul", [i, g])
        new_c = c.one("Add", [c.one("Mul", [f, cell]), ig]) if cell is not None else ig
        cell = clip(new_c, cell_clip)
        o_pre = parts[3]
        if peep_names[2] is not None:
            o_pre = c.one("Add", [o_pre, c.one("Mul", [cell, peep_names[2]])])
        h = c.one("Mul", [c.one("Sigmoid", [o_pre]), c.activation(cell, act)])
        if proj_w is not None:
            h = c.one("MatMul", [h, c.init(f"{c.node_base}/projection", proj_w.T.copy())])
            if proj_b is not None:
                h = c.one("Add", [h, c.init(f"{c.node_base}/projection_bias", proj_b.reshape(-1))])
            h = clip(h, proj_clip)
        outs.append(c.one("Unsqueeze", [h, c.ints("axes", [0])]))
    return outs[0] if len(outs) == 1 else c.one("Concat", outs, axis=0)


# ------------------------------------------------------------------------------ helpers

_INT_MAX, _INT_MIN = (1 << 63) - 1, -(1 << 63)


def _axis(a: int, rank: int) -> int:
    if not -rank <= a < rank:
        raise ValueError(f"axis {a} is outside a tensor of rank {rank}")
    return a + rank if a < 0 else a


def _scalar_int(c: _Converter, i: int, what: str) -> int:
    a = c.const_ints(i, what).reshape(-1)
    if a.size != 1:
        raise ValueError(f"{what} holds {a.size} values, expected one")
    return int(a[0])


def _int64(c: _Converter, i: int) -> str:
    """Tensor ``i`` as int64 (a constant is converted at import, a computed value is Cast)."""
    a = c.const_array(i)
    if a is not None:
        if a.dtype.kind not in "iub":
            raise _Unsupported(f"tensor '{c.tname[i]}' of type {a.dtype} used as indices/shape")
        return c.ints("i64", a.astype(np.int64))
    return c.one("Cast", [c.value(i)], to=TensorProto.INT64)


def _cast_to(c: _Converter, x: str, i: int, have: int = TensorProto.INT64) -> str:
    """``x`` (of ONNX type ``have``) cast to tensor ``i``'s type when that differs."""
    want = c.onnx_type(i)
    return x if want == have else c.one("Cast", [x], to=want)


def _np_dtype(c: _Converter, i: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(c.onnx_type(i)))


# ------------------------------------------------------------------------------ unary / binary

_UNARY = {
    "NEG": "Neg",
    "ABS": "Abs",
    "EXP": "Exp",
    "LOG": "Log",
    "SQRT": "Sqrt",
    "SIN": "Sin",
    "COS": "Cos",
    "FLOOR": "Floor",
    "CEIL": "Ceil",
    "ROUND": "Round",  # TFLite rounds half to even, as ONNX does
    "SIGN": "Sign",
    "HARD_SWISH": "HardSwish",
    "ELU": "Elu",
    "LOGICAL_NOT": "Not",
}


@lowering(*_UNARY)
def unary(c: _Converter, op: TflOp) -> None:
    c.bind(op.outputs[0], c.one(_UNARY[op.code], [c.value(op.inputs[0])]))


@lowering("RSQRT")
def rsqrt(c: _Converter, op: TflOp) -> None:
    c.bind(op.outputs[0], c.one("Reciprocal", [c.one("Sqrt", [c.value(op.inputs[0])])]))


@lowering("SQUARE")
def square(c: _Converter, op: TflOp) -> None:
    x = c.value(op.inputs[0])
    c.bind(op.outputs[0], c.one("Mul", [x, x]))


@lowering("LEAKY_RELU")
def leaky_relu(c: _Converter, op: TflOp) -> None:
    alpha = float(c.opt(op, "Alpha", 0.2))
    c.bind(op.outputs[0], c.one("LeakyRelu", [c.value(op.inputs[0])], alpha=alpha))


@lowering("PRELU")
def prelu(c: _Converter, op: TflOp) -> None:
    c.bind(op.outputs[0], c.one("PRelu", [c.value(op.inputs[0]), c.value(op.inputs[1])]))


@lowering("GELU")
def gelu(c: _Converter, op: TflOp) -> None:
    approx = "tanh" if c.opt(op, "Approximate", False) else "none"
    c.bind(op.outputs[0], c.one("Gelu", [c.value(op.inputs[0])], approximate=approx))


@lowering("LOG_SOFTMAX")
def log_softmax(c: _Converter, op: TflOp) -> None:
    c.bind(op.outputs[0], c.one("LogSoftmax", [c.value(op.inputs[0])], axis=-1))


@lowering("L2_NORMALIZATION")
def l2_normalization(c: _Converter, op: TflOp) -> None:
    # TFLite: x / max(sqrt(sum(x^2, last axis)), 1e-6)
    x = c.value(op.inputs[0])
    ss = c.one("ReduceSum", [c.one("Mul", [x, x]), c.ints("axes", [-1])], keepdims=1)
    norm = c.one("Max", [c.one("Sqrt", [ss]), c.init("epsilon", np.float32(1e-6))])
    c.bind(op.outputs[0], c.one("Div", [x, norm]), c.opt(op, "FusedActivationFunction"))


@lowering("LOCAL_RESPONSE_NORMALIZATION")
def local_response_normalization(c: _Converter, op: TflOp) -> None:
    # TF: x / (bias + alpha * sum_{c-r..c+r} x^2) ^ beta; ONNX LRN divides alpha by size = 2r+1.
    r = int(c.opt(op, "Radius", 5))
    size = 2 * r + 1
    y = c.one(
        "LRN",
        [c.to_nchw(op.inputs[0])],
        size=size,
        alpha=float(c.opt(op, "Alpha", 1.0)) * size,
        beta=float(c.opt(op, "Beta", 0.5)),
        bias=float(c.opt(op, "Bias", 1.0)),
    )
    c.bind(op.outputs[0], y, nchw=True)


_BINARY_MORE = {
    "POW": "Pow",
    "EQUAL": "Equal",
    "LESS": "Less",
    "LESS_EQUAL": "LessOrEqual",
    "GREATER": "Greater",
    "GREATER_EQUAL": "GreaterOrEqual",
    "LOGICAL_AND": "And",
    "LOGICAL_OR": "Or",
}


@lowering(*_BINARY_MORE)
def binary_more(c: _Converter, op: TflOp) -> None:
    a, b = (c.value(i) for i in op.inputs[:2])
    c.bind(op.outputs[0], c.one(_BINARY_MORE[op.code], [a, b]))


@lowering("NOT_EQUAL")
def not_equal(c: _Converter, op: TflOp) -> None:
    a, b = (c.value(i) for i in op.inputs[:2])
    c.bind(op.outputs[0], c.one("Not", [c.one("Equal", [a, b])]))


@lowering("SQUARED_DIFFERENCE")
def squared_difference(c: _Converter, op: TflOp) -> None:
    d = c.one("Sub", [c.value(op.inputs[0]), c.value(op.inputs[1])])
    c.bind(op.outputs[0], c.one("Mul", [d, d]))


@lowering("FLOOR_DIV")
def floor_div(c: _Converter, op: TflOp) -> None:
    a, b = (c.value(i) for i in op.inputs[:2])
    t = c.onnx_type(op.outputs[0])
    if t == TensorProto.FLOAT:
        c.bind(op.outputs[0], c.one("Floor", [c.one("Div", [a, b])]))
        return
    # Integers: floor(a / b) in float64 (exact for 32-bit integers), cast back.
    a64, b64 = (c.one("Cast", [v], to=TensorProto.DOUBLE) for v in (a, b))
    q = c.one("Floor", [c.one("Div", [a64, b64])])
    c.bind(op.outputs[0], c.one("Cast", [q], to=t))


@lowering("FLOOR_MOD")
def floor_mod(c: _Converter, op: TflOp) -> None:
    a, b = (c.value(i) for i in op.inputs[:2])
    if c.onnx_type(op.outputs[0]) != TensorProto.FLOAT:
        c.bind(op.outputs[0], c.one("Mod", [a, b], fmod=0))  # integer Mod: the divisor's sign
        return
    # TFLite: r = fmod(a, b); r + b where r != 0 and r, b differ in sign.
    r = c.one("Mod", [a, b], fmod=1)
    zero = c.init("zero", np.float32(0))
    fix = c.one(
        "And",
        [
            c.one("Not", [c.one("Equal", [r, zero])]),
            c.one("Xor", [c.one("Less", [b, zero]), c.one("Less", [r, zero])]),
        ],
    )
    c.bind(op.outputs[0], c.one("Where", [fix, c.one("Add", [r, b]), r]))


@lowering("ADD_N")
def add_n(c: _Converter, op: TflOp) -> None:
    c.bind(op.outputs[0], c.one("Sum", [c.value(i) for i in op.inputs]))


@lowering("SELECT", "SELECT_V2")
def select(c: _Converter, op: TflOp) -> None:
    cond, x, y = op.inputs[:3]
    cv = c.value(cond)
    cs, xs = c.shape(cond), c.shape(x)
    if op.code == "SELECT" and len(cs) == 1 and len(xs) > 1:
        # SELECT (v1) with a vector condition picks whole rows along dimension 0.
        cv = c.one("Reshape", [cv, c.ints("shape", [-1] + [1] * (len(xs) - 1))])
    c.bind(op.outputs[0], c.one("Where", [cv, c.value(x), c.value(y)]))


@lowering("CAST")
def cast(c: _Converter, op: TflOp) -> None:
    src, dst = c.T(op.inputs[0]), c.T(op.outputs[0])
    if (src.quantized and src.type in _QUANT_TYPES) or (dst.quantized and dst.type in _QUANT_TYPES):
        raise _Unsupported("CAST of quantized codes")
    c.bind(op.outputs[0], c.one("Cast", [c.value(op.inputs[0])], to=c.onnx_type(op.outputs[0])))


# ------------------------------------------------------------------------------ reductions


@lowering("REDUCE_PROD")
def reduce_prod(c: _Converter, op: TflOp) -> None:
    axes = c.const_ints(op.inputs[1], "axis").reshape(-1)
    y = c.one(
        "ReduceProd",
        [c.value(op.inputs[0]), c.ints("axes", axes)],
        keepdims=int(bool(c.opt(op, "KeepDims", 0))),
    )
    c.bind(op.outputs[0], y)


@lowering("REDUCE_ANY", "REDUCE_ALL")
def reduce_bool(c: _Converter, op: TflOp) -> None:
    axes = c.const_ints(op.inputs[1], "axis").reshape(-1)
    x = c.one("Cast", [c.value(op.inputs[0])], to=TensorProto.INT32)
    kind = "ReduceMax" if op.code == "REDUCE_ANY" else "ReduceMin"
    y = c.one(kind, [x, c.ints("axes", axes)], keepdims=int(bool(c.opt(op, "KeepDims", 0))))
    c.bind(op.outputs[0], c.one("Cast", [y], to=TensorProto.BOOL))


@lowering("ARG_MAX", "ARG_MIN")
def arg_max_min(c: _Converter, op: TflOp) -> None:
    axis = _scalar_int(c, op.inputs[1], "axis")
    kind = "ArgMax" if op.code == "ARG_MAX" else "ArgMin"
    y = c.one(kind, [c.value(op.inputs[0])], axis=axis, keepdims=0)
    c.bind(op.outputs[0], _cast_to(c, y, op.outputs[0]))


@lowering("CUMSUM")
def cumsum(c: _Converter, op: TflOp) -> None:
    axis = c.ints("axis", np.int64(_scalar_int(c, op.inputs[1], "axis")))
    y = c.one(
        "CumSum",
        [c.value(op.inputs[0]), axis],
        exclusive=int(bool(c.opt(op, "Exclusive", False))),
        reverse=int(bool(c.opt(op, "Reverse", False))),
    )
    c.bind(op.outputs[0], y)


@lowering("TOPK_V2")
def topk_v2(c: _Converter, op: TflOp) -> None:
    k = _scalar_int(c, op.inputs[1], "k")
    vals, idx = c.emit("TopK", [c.value(op.inputs[0]), c.ints("k", [k])], 2, axis=-1, largest=1, sorted=1)
    c.bind(op.outputs[0], vals)
    if len(op.outputs) > 1:
        c.bind(op.outputs[1], _cast_to(c, idx, op.outputs[1]))


# ------------------------------------------------------------------------------ shape and layout


@lowering("SHAPE")
def shape_op(c: _Converter, op: TflOp) -> None:
    c.bind(op.outputs[0], _cast_to(c, c.one("Shape", [c.value(op.inputs[0])]), op.outputs[0]))


@lowering("RANK")
def rank_op(c: _Converter, op: TflOp) -> None:
    r = np.asarray(len(c.shape(op.inputs[0])), dtype=_np_dtype(c, op.outputs[0]))
    c.vals[op.outputs[0]] = c.init(c.tname[op.outputs[0]], r.reshape(c.shape(op.outputs[0])))


@lowering("EXPAND_DIMS")
def expand_dims(c: _Converter, op: TflOp) -> None:
    axis = _scalar_int(c, op.inputs[1], "axis")
    _axis(axis, len(c.shape(op.inputs[0])) + 1)
    c.bind(op.outputs[0], c.one("Unsqueeze", [c.value(op.inputs[0]), c.ints("axes", [axis])]))


@lowering("SQUEEZE")
def squeeze_op(c: _Converter, op: TflOp) -> None:
    t = c.T(op.inputs[0])
    rank = len(t.shape)
    dims = [int(d) for d in np.asarray(c.opt(op, "SqueezeDims", np.zeros(0))).reshape(-1)]
    if not dims:  # every dimension of size 1 (a dynamic dimension is never squeezed)
        sig = t.signature or t.shape
        dims = [k for k, d in enumerate(sig) if d == 1]
    axes = sorted({_axis(d, rank) for d in dims})
    x = c.value(op.inputs[0])
    c.bind(op.outputs[0], c.one("Squeeze", [x, c.ints("axes", axes)]) if axes else c.one("Identity", [x]))


@lowering("BROADCAST_TO")
def broadcast_to(c: _Converter, op: TflOp) -> None:
    c.bind(op.outputs[0], c.one("Expand", [c.value(op.inputs[0]), _int64(c, op.inputs[1])]))


@lowering("TILE")
def tile(c: _Converter, op: TflOp) -> None:
    c.bind(op.outputs[0], c.one("Tile", [c.value(op.inputs[0]), _int64(c, op.inputs[1])]))


@lowering("FILL")
def fill(c: _Converter, op: TflOp) -> None:
    value = c.value(op.inputs[1])
    if len(c.shape(op.inputs[1])) != 0:
        value = c.one("Reshape", [value, c.ints("scalar", np.zeros(0, np.int64))])
    c.bind(op.outputs[0], c.one("Expand", [value, _int64(c, op.inputs[0])]))


@lowering("ZEROS_LIKE")
def zeros_like(c: _Converter, op: TflOp) -> None:
    x = op.inputs[0]
    v = np.zeros((), dtype=_np_dtype(c, op.outputs[0]))
    shape = c.one("Shape", [c.value(x)])
    c.bind(op.outputs[0], c.one("Expand", [c.init("value", v), shape]))


@lowering("RANGE")
def range_op(c: _Converter, op: TflOp) -> None:
    start, limit, delta = (c.value(i) for i in op.inputs[:3])
    c.bind(op.outputs[0], c.one("Range", [start, limit, delta]))


@lowering("SLICE")
def slice_op(c: _Converter, op: TflOp) -> None:
    x = op.inputs[0]
    begin = c.const_ints(op.inputs[1], "begin").reshape(-1)
    size = c.const_ints(op.inputs[2], "size").reshape(-1)
    rank = len(c.shape(x))
    if begin.size != rank or size.size != rank:
        raise ValueError(f"begin/size of {begin.size}/{size.size} values for a tensor of rank {rank}")
    ends = [_INT_MAX if s == -1 else int(b + s) for b, s in zip(begin.tolist(), size.tolist(), strict=True)]
    y = c.one(
        "Slice",
        [c.value(x), c.ints("starts", begin), c.ints("ends", ends), c.ints("axes", list(range(rank)))],
    )
    c.bind(op.outputs[0], y)


@lowering("STRIDED_SLICE")
def strided_slice(c: _Converter, op: TflOp) -> None:
    """TF's strided slice: the sparse spec (ellipsis, new axes) is made dense over the input's
    dimensions, masked bounds run to the end, shrunk axes take one element at ``begin``; one ONNX
    Slice, then a Squeeze of shrunk axes and an Unsqueeze of new ones."""
    x = op.inputs[0]
    begin = c.const_ints(op.inputs[1], "begin").reshape(-1).tolist()
    end = c.const_ints(op.inputs[2], "end").reshape(-1).tolist()
    strides = c.const_ints(op.inputs[3], "strides").reshape(-1).tolist() if c.has(op, 3) else [1] * len(begin)
    n = len(begin)
    if len(end) != n or len(strides) != n:
        raise ValueError(f"begin, end and strides hold {n}, {len(end)} and {len(strides)} values")
    bm, em = int(c.opt(op, "BeginMask", 0)), int(c.opt(op, "EndMask", 0))
    elm, nam, sam = (int(c.opt(op, k, 0)) for k in ("EllipsisMask", "NewAxisMask", "ShrinkAxisMask"))
    offset = bool(c.opt(op, "Offset", False))
    rank = len(c.shape(x))

    def bit(mask: int, i: int) -> bool:
        return bool(mask >> i & 1)

    real = sum(1 for i in range(n) if not bit(elm, i) and not bit(nam, i))
    entries: list[tuple] = []  # ("new",), ("full",) or ("dim", i)
    ellipsis = False
    for i in range(n):
        if bit(elm, i):
            if ellipsis:
                raise ValueError("more than one ellipsis")
            ellipsis = True
            entries += [("full",)] * (rank - real)
        elif bit(nam, i):
            entries.append(("new",))
        else:
            entries.append(("dim", i))
    if not ellipsis:
        entries += [("full",)] * (rank - real)
    if sum(e[0] != "new" for e in entries) != rank:
        raise ValueError(f"a slice of {real} dimensions for a tensor of rank {rank}")
    starts, ends, axes, steps, squeeze, unsqueeze = [], [], [], [], [], []
    axis = out_pos = 0
    for e in entries:
        if e[0] == "new":
            unsqueeze.append(out_pos)
            out_pos += 1
            continue
        if e[0] == "dim":
            i = e[1]
            s = int(strides[i])
            if s == 0:
                raise ValueError("stride 0")
            b, en = int(begin[i]), int(end[i]) + (int(begin[i]) if offset else 0)
            if bit(sam, i):
                if bit(bm, i):
                    b = 0
                starts.append(b)
                ends.append(b + 1 if b != -1 else _INT_MAX)
                steps.append(1)
                axes.append(axis)
                squeeze.append(axis)
            else:
                starts.append((0 if s > 0 else _INT_MAX) if bit(bm, i) else b)
                ends.append((_INT_MAX if s > 0 else _INT_MIN) if bit(em, i) else en)
                steps.append(s)
                axes.append(axis)
                out_pos += 1
        else:
            out_pos += 1
        axis += 1
    y = c.value(x)
    if axes:
        y = c.one(
            "Slice",
            [y, c.ints("starts", starts), c.ints("ends", ends), c.ints("axes", axes), c.ints("steps", steps)],
        )
    if squeeze:
        y = c.one("Squeeze", [y, c.ints("squeeze", squeeze)])
    if unsqueeze:
        y = c.one("Unsqueeze", [y, c.ints("unsqueeze", unsqueeze)])
    if y == c.value(x):
        y = c.one("Identity", [y])
    c.bind(op.outputs[0], y)


@lowering("REVERSE_V2")
def reverse_v2(c: _Converter, op: TflOp) -> None:
    rank = len(c.shape(op.inputs[0]))
    axes = sorted({_axis(int(a), rank) for a in c.const_ints(op.inputs[1], "axis").reshape(-1)})
    k = len(axes)
    y = c.one(
        "Slice",
        [
            c.value(op.inputs[0]),
            c.ints("starts", [-1] * k),
            c.ints("ends", [_INT_MIN] * k),
            c.ints("axes", axes),
            c.ints("steps", [-1] * k),
        ],
    )
    c.bind(op.outputs[0], y)


@lowering("MIRROR_PAD")
def mirror_pad(c: _Converter, op: TflOp) -> None:
    p = c.const_ints(op.inputs[1], "paddings").reshape(-1, 2)
    rank = len(c.shape(op.inputs[0]))
    if p.shape[0] != rank or (p < 0).any():
        raise ValueError(f"paddings {p.tolist()} for a tensor of rank {rank}")
    x = c.value(op.inputs[0])
    if int(c.opt(op, "Mode", 0)) == 0:  # REFLECT: the edge is not repeated, as ONNX's reflect
        c.bind(
            op.outputs[0],
            c.one("Pad", [x, c.ints("pads", np.concatenate([p[:, 0], p[:, 1]]))], mode="reflect"),
        )
        return
    # SYMMETRIC (the edge repeated) has no ONNX mode: reversed slices concatenated per axis.
    for a in range(rank):
        lo, hi = int(p[a, 0]), int(p[a, 1])
        if not (lo or hi):
            continue
        parts = []
        if lo:
            parts.append(
                c.one(
                    "Slice",
                    [x, c.ints("s", [lo - 1]), c.ints("e", [_INT_MIN]), c.ints("a", [a]), c.ints("st", [-1])],
                )
            )
        parts.append(x)
        if hi:
            parts.append(
                c.one(
                    "Slice",
                    [x, c.ints("s", [-1]), c.ints("e", [-1 - hi]), c.ints("a", [a]), c.ints("st", [-1])],
                )
            )
        x = c.one("Concat", parts, axis=a)
    c.bind(op.outputs[0], x if x != c.value(op.inputs[0]) else c.one("Identity", [x]))


@lowering("SPLIT", "SPLIT_V")
def split(c: _Converter, op: TflOp) -> None:
    if op.code == "SPLIT":
        axis_i, x = op.inputs[0], op.inputs[1]
    else:
        x, axis_i = op.inputs[0], op.inputs[2]
    xs = c.T(x).signature or c.shape(x)
    axis = _axis(_scalar_int(c, axis_i, "axis"), len(xs))
    n, dim = len(op.outputs), xs[axis]
    sizes: list[int] | None
    if op.code == "SPLIT_V":
        sizes = c.const_ints(op.inputs[1], "size_splits").reshape(-1).tolist()
        if len(sizes) != n or sum(s == -1 for s in sizes) > 1:
            raise ValueError(f"size_splits {sizes[:8]} for {n} outputs")
        if -1 in sizes:
            if dim < 0:
                raise _Unsupported("size_splits with -1 along a dynamic dimension")
            sizes[sizes.index(-1)] = dim - sum(s for s in sizes if s != -1)
    else:
        if dim >= 0 and dim % n:
            raise ValueError(f"dimension {dim} does not split into {n} equal parts")
        sizes = [dim // n] * n if dim >= 0 else None
    if sizes is not None and (min(sizes) < 0 or (dim >= 0 and sum(sizes) != dim)):
        raise ValueError(f"split sizes {sizes[:8]} for a dimension of {dim}")
    inputs = [c.value(x)] + ([c.ints("split", sizes)] if sizes is not None else [])
    extra: dict[str, int] = {} if sizes is not None else {"num_outputs": n}
    outs = c.emit("Split", inputs, n, axis=axis, **extra) if n > 1 else [c.one("Identity", [c.value(x)])]
    for k, v in zip(op.outputs, outs, strict=True):
        c.bind(k, v)


@lowering("PACK")
def pack(c: _Converter, op: TflOp) -> None:
    rank = len(c.shape(op.inputs[0])) + 1
    axis = _axis(int(c.opt(op, "Axis", 0)), rank)
    parts = [c.one("Unsqueeze", [c.value(i), c.ints("axes", [axis])]) for i in op.inputs]
    c.bind(op.outputs[0], c.one("Concat", parts, axis=axis) if len(parts) > 1 else parts[0])


@lowering("UNPACK")
def unpack(c: _Converter, op: TflOp) -> None:
    xs = c.shape(op.inputs[0])
    axis = _axis(int(c.opt(op, "Axis", 0)), len(xs))
    n = len(op.outputs)
    x = c.value(op.inputs[0])
    parts = c.emit("Split", [x, c.ints("split", [1] * n)], n, axis=axis) if n > 1 else [x]
    for k, v in zip(op.outputs, parts, strict=True):
        c.bind(k, c.one("Squeeze", [v, c.ints("axes", [axis])]))


@lowering("GATHER")
def gather(c: _Converter, op: TflOp) -> None:
    if int(c.opt(op, "BatchDims", 0)) != 0:
        raise _Unsupported("batch_dims")
    y = c.one("Gather", [c.value(op.inputs[0]), c.value(op.inputs[1])], axis=int(c.opt(op, "Axis", 0)))
    c.bind(op.outputs[0], y)


@lowering("EMBEDDING_LOOKUP")
def embedding_lookup(c: _Converter, op: TflOp) -> None:
    c.bind(op.outputs[0], c.one("Gather", [c.value(op.inputs[1]), c.value(op.inputs[0])], axis=0))


@lowering("GATHER_ND")
def gather_nd(c: _Converter, op: TflOp) -> None:
    c.bind(op.outputs[0], c.one("GatherND", [c.value(op.inputs[0]), _int64(c, op.inputs[1])]))


@lowering("BATCH_MATMUL")
def batch_matmul(c: _Converter, op: TflOp) -> None:
    xs = []
    for k, adj in ((0, "AdjX"), (1, "AdjY")):
        v = c.value(op.inputs[k])
        if c.opt(op, adj, False):
            r = len(c.shape(op.inputs[k]))
            if r < 2:
                raise ValueError(f"adjoint of a tensor of rank {r}")
            v = c.one("Transpose", [v], perm=list(range(r - 2)) + [r - 1, r - 2])
        xs.append(v)
    c.bind(op.outputs[0], c.one("MatMul", xs))


@lowering("DEPTH_TO_SPACE", "SPACE_TO_DEPTH")
def depth_space(c: _Converter, op: TflOp) -> None:
    bs = int(c.opt(op, "BlockSize", 0))
    if bs < 1:
        raise ValueError(f"block size {bs}")
    if op.code == "DEPTH_TO_SPACE":  # TF's channel order is ONNX's DCR
        y = c.one("DepthToSpace", [c.to_nchw(op.inputs[0])], blocksize=bs, mode="DCR")
    else:
        y = c.one("SpaceToDepth", [c.to_nchw(op.inputs[0])], blocksize=bs)
    c.bind(op.outputs[0], y, nchw=True)


@lowering("RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR")
def resize(c: _Converter, op: TflOp) -> None:
    """TF's resize (NHWC, the size input [new_h, new_w]) as ONNX Resize over axes 1, 2:
    bilinear: align_corners -> align_corners, half_pixel_centers -> half_pixel, else asymmetric;
    nearest: align_corners rounds half up (round_prefer_ceil); half_pixel_centers takes
    floor((x + 0.5) * in/out), which is half_pixel with round_prefer_ceil; else asymmetric floor."""
    size = c.const_ints(op.inputs[1], "size").reshape(-1)
    if size.size != 2 or (size < 1).any() or len(c.shape(op.inputs[0])) != 4:
        raise ValueError(f"size {size.tolist()} for input of shape {list(c.shape(op.inputs[0]))}")
    align, half = bool(c.opt(op, "AlignCorners", False)), bool(c.opt(op, "HalfPixelCenters", False))
    if align and half:
        raise _Unsupported("align_corners with half_pixel_centers")
    ctm = "align_corners" if align else "half_pixel" if half else "asymmetric"
    if op.code == "RESIZE_BILINEAR":
        attrs = {"mode": "linear"}
    else:
        attrs = {"mode": "nearest", "nearest_mode": "round_prefer_ceil" if (align or half) else "floor"}
    x = c.to_nchw(op.inputs[0])
    t = c.T(op.inputs[0])
    dims = t.signature or t.shape
    if dims[0] >= 0 and dims[3] >= 0:  # full NCHW sizes (ORT 1.32 mis-reads sizes with ``axes``)
        sizes = c.ints("sizes", [t.shape[0], t.shape[3], *size.tolist()])
    else:
        nc = c.one("Slice", [c.one("Shape", [x]), c.ints("zero", [0]), c.ints("two", [2])])
        sizes = c.one("Concat", [nc, c.ints("hw", size)], axis=0)
    y = c.one("Resize", [x, "", "", sizes], coordinate_transformation_mode=ctm, **attrs)
    c.bind(op.outputs[0], y, nchw=True)


def _space_batch(c: _Converter, op: TflOp, to_batch: bool) -> None:
    x = op.inputs[0]
    xs = list(c.shape(x))
    block = c.const_ints(op.inputs[1], "block_shape").reshape(-1).tolist()
    pads = c.const_ints(op.inputs[2], "paddings" if to_batch else "crops").reshape(-1, 2).tolist()
    m = len(block)
    if m < 1 or len(pads) != m or len(xs) < m + 1 or min(block) < 1 or min(min(p) for p in pads) < 0:
        raise ValueError(f"block {block[:4]} / pads {pads[:4]} for shape {xs}")
    sig = c.T(x).signature
    if any(d < 0 for d in xs) or (sig and -1 in sig):
        raise _Unsupported("dynamic dimensions")
    rest = xs[m + 1 :]
    v = c.value(x)
    if to_batch:
        full = [[0, 0]] + pads + [[0, 0]] * len(rest)
        if any(p != [0, 0] for p in pads):
            v = c.one("Pad", [v, c.ints("pads", [p[0] for p in full] + [p[1] for p in full])])
        sp = [xs[1 + k] + pads[k][0] + pads[k][1] for k in range(m)]
        if any(s % b for s, b in zip(sp, block, strict=True)):
            raise ValueError(f"padded dimensions {sp} do not divide by block {block}")
        shape = [xs[0]]
        for s, b in zip(sp, block, strict=True):
            shape += [s // b, b]
        v = c.one("Reshape", [v, c.ints("shape", shape + rest)])
        perm = [2 + 2 * k for k in range(m)] + [0] + [1 + 2 * k for k in range(m)]
        perm += list(range(1 + 2 * m, 1 + 2 * m + len(rest)))
        v = c.one("Transpose", [v], perm=perm)
        out = [xs[0] * int(np.prod(block))] + [s // b for s, b in zip(sp, block, strict=True)] + rest
        v = c.one("Reshape", [v, c.ints("shape", out)])
    else:
        nb = int(np.prod(block))
        if xs[0] % nb:
            raise ValueError(f"batch {xs[0]} does not divide by block {block}")
        n = xs[0] // nb
        v = c.one("Reshape", [v, c.ints("shape", block + [n] + xs[1:])])
        perm = [m]
        for k in range(m):
            perm += [m + 1 + k, k]
        perm += list(range(2 * m + 1, 2 * m + 1 + len(rest)))
        v = c.one("Transpose", [v], perm=perm)
        sp = [xs[1 + k] * block[k] for k in range(m)]
        v = c.one("Reshape", [v, c.ints("shape", [n] + sp + rest)])
        if any(p != [0, 0] for p in pads):
            v = c.one(
                "Slice",
                [
                    v,
                    c.ints("starts", [p[0] for p in pads]),
                    c.ints("ends", [s - p[1] for s, p in zip(sp, pads, strict=True)]),
                    c.ints("axes", list(range(1, m + 1))),
                ],
            )
    c.bind(op.outputs[0], v)


@lowering("SPACE_TO_BATCH_ND")
def space_to_batch_nd(c: _Converter, op: TflOp) -> None:
    _space_batch(c, op, True)


@lowering("BATCH_TO_SPACE_ND")
def batch_to_space_nd(c: _Converter, op: TflOp) -> None:
    _space_batch(c, op, False)


# ------------------------------------------------------------------------------ MediaPipe custom ops
# Semantics from MediaPipe's kernels (mediapipe/util/tflite/operations/*.cc); LiteRT has none of them.


def _custom_ints(c: _Converter, op: TflOp, n: int, what: str) -> list[int]:
    """The first ``n`` little-endian int32 of a custom op's options (a C struct the kernel reads)."""
    if len(op.custom) < 4 * n:
        raise ValueError(f"{what} needs {4 * n} bytes of custom_options, the op has {len(op.custom)}")
    return [int(v) for v in np.frombuffer(op.custom, dtype="<i4", count=n)]


@lowering("CUSTOM:Convolution2DTransposeBias")
def transpose_conv_bias(c: _Converter, op: TflOp) -> None:
    """transpose_conv_bias.cc: inputs (x NHWC, filter [Cout, KH, KW, Cin], bias [Cout]); the
    options are TfLiteTransposeConvParams {padding (1 SAME, 2 VALID), stride_w, stride_h}. SAME
    pads ``max(0, k - (in-1) % s - 1)`` in all, ``total // 2`` before; the output is
    ``s*(in-1) + k - total``, initialized to the bias."""
    padding, sw, sh = _custom_ints(c, op, 3, "Convolution2DTransposeBias")
    if padding not in (0, 1, 2):
        raise ValueError(f"padding {padding} is not one of 0 (unknown), 1 (SAME), 2 (VALID)")
    if sw < 1 or sh < 1:
        raise ValueError(f"stride {sh}x{sw} must be positive")
    x, w_i = op.inputs[0], op.inputs[1]
    w = c.need_const(w_i, "filter").astype(np.float32)
    xs = c.T(x).shape
    if w.ndim != 4 or len(xs) != 4 or xs[3] != w.shape[3]:
        raise _Unsupported(f"filter {list(w.shape)} does not fit input {list(xs)}")
    kh, kw = w.shape[1], w.shape[2]
    th = max(0, kh - (xs[1] - 1) % sh - 1) if padding == 1 else 0
    tw = max(0, kw - (xs[2] - 1) % sw - 1) if padding == 1 else 0
    out = c.T(op.outputs[0]).shape
    expect = (xs[0], sh * (xs[1] - 1) + kh - th, sw * (xs[2] - 1) + kw - tw, w.shape[0])
    if out and tuple(out) != expect:
        raise ValueError(f"output shape {list(out)}, the kernel computes {list(expect)}")
    wn = _weight(c, w_i, w, lambda a: a.transpose(3, 0, 1, 2), 0, 1)  # ONNX: [Cin, Cout, KH, KW]
    y = c.one(
        "ConvTranspose",
        [c.to_nchw(x), wn, *_bias(c, op, 2, w.shape[0])],
        strides=[sh, sw],
        pads=[th // 2, tw // 2, th - th // 2, tw - tw // 2],
        kernel_shape=[kh, kw],
    )
    c.bind(op.outputs[0], y, nchw=True)


def _flex_options(op: TflOp, what: str) -> dict:
    """A custom op's options as a FlexBuffers map (MediaPipe's v2 ops)."""
    from flatbuffers import flexbuffers  # type: ignore[import-untyped]

    try:
        m = flexbuffers.Loads(op.custom)
    except Exception as exc:  # any parse failure of hostile bytes is a malformed op
        raise ValueError(f"{what} options are not a FlexBuffers map ({type(exc).__name__})") from None
    if not isinstance(m, dict):
        raise ValueError(f"{what} options are not a FlexBuffers map")
    return m


def _flex_num(m: dict, key: str, kind: type, what: str) -> float:
    v = m.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not np.isfinite(v):
        raise ValueError(f"{what} option '{key}' is missing or not a number")
    return kind(v)


def _mp_matrix_rows(c: _Converter, i: int) -> tuple[str, str, str, str, str, str]:
    """m00, m01, m03, m10, m11, m13 of a [1, 4, 4] transform matrix value, each of shape [1]."""
    if c.shape(i) not in ((1, 4, 4), (4, 4)):
        raise _Unsupported(f"transform matrix of shape {list(c.shape(i))}, expected [1, 4, 4]")
    flat = c.one("Reshape", [c.value(i), c.ints("m16", [16])])
    return tuple(c.one("Gather", [flat, c.ints(f"m{k}", [k])], axis=0) for k in (0, 1, 3, 4, 5, 7))  # type: ignore[return-value]


@lowering("CUSTOM:TransformLandmarks")
def transform_landmarks(c: _Converter, op: TflOp) -> None:
    """transform_landmarks.cc v2: each landmark's x, y become ``m00 x + m01 y + m03`` and
    ``m10 x + m11 y + m13`` (the matrix's first two rows); z (a 3rd value) is kept."""
    x, mi = op.inputs[0], op.inputs[1]
    xs = c.shape(x)
    if len(xs) != 3 or xs[2] not in (2, 3):
        raise _Unsupported(f"landmarks of shape {list(xs)}, expected [1, N, 2 or 3]")
    m00, m01, m03, m10, m11, m13 = _mp_matrix_rows(c, mi)
    v = c.value(x)
    lx = c.one("Slice", [v, c.ints("x0", [0]), c.ints("x1", [1]), c.ints("ax", [2])])
    ly = c.one("Slice", [v, c.ints("y0", [1]), c.ints("y1", [2]), c.ints("ax", [2])])
    nx = c.one("Add", [c.one("Add", [c.one("Mul", [lx, m00]), c.one("Mul", [ly, m01])]), m03])
    ny = c.one("Add", [c.one("Add", [c.one("Mul", [lx, m10]), c.one("Mul", [ly, m11])]), m13])
    parts = [nx, ny]
    if xs[2] == 3:
        parts.append(c.one("Slice", [v, c.ints("z0", [2]), c.ints("z1", [3]), c.ints("ax", [2])]))
    c.bind(op.outputs[0], c.one("Concat", parts, axis=2))


@lowering("CUSTOM:TransformTensorBilinear")
def transform_tensor_bilinear(c: _Converter, op: TflOp) -> None:
    """transform_tensor_bilinear.cc v2: output pixel (x, y) reads the input at
    ``(m00 x + m01 y + m03', m10 x + m11 y + m13')`` with ``m03' = m03 + (m00 + m01 - 1) / 2``
    (the align-corners correction), bilinearly; a point outside ``[0, W-1] x [0, H-1]`` gives 0.
    As GridSample (bilinear, align_corners=1, zeros) on the normalized points, times that mask."""
    m = _flex_options(op, "TransformTensorBilinear")
    oh = int(_flex_num(m, "output_height", int, "TransformTensorBilinear"))
    ow = int(_flex_num(m, "output_width", int, "TransformTensorBilinear"))
    x, mi = op.inputs[0], op.inputs[1]
    xs = c.shape(x)
    if len(xs) != 4 or xs[0] != 1 or min(xs[1], xs[2]) < 2:
        raise _Unsupported(f"input of shape {list(xs)}, expected [1, H>=2, W>=2, C]")
    if not (0 < oh <= 4096 and 0 < ow <= 4096):
        raise ValueError(f"output size {oh}x{ow} is out of range")
    if c.shape(op.outputs[0]) not in ((), (1, oh, ow, xs[3])):
        raise ValueError(f"output shape {list(c.shape(op.outputs[0]))}, the options say {oh}x{ow}")
    h, w = xs[1], xs[2]
    m00, m01, m03, m10, m11, m13 = _mp_matrix_rows(c, mi)
    half = c.init("half", np.array(0.5, np.float32))
    m03 = c.one(
        "Add",
        [
            m03,
            c.one(
                "Mul",
                [c.one("Sub", [c.one("Add", [m00, m01]), c.init("one", np.array(1.0, np.float32))]), half],
            ),
        ],
    )
    m13 = c.one(
        "Add",
        [
            m13,
            c.one(
                "Mul",
                [c.one("Sub", [c.one("Add", [m10, m11]), c.init("one", np.array(1.0, np.float32))]), half],
            ),
        ],
    )
    gy, gx = np.meshgrid(np.arange(oh, dtype=np.float32), np.arange(ow, dtype=np.float32), indexing="ij")
    px, py = c.init("out_x", gx.reshape(1, oh, ow, 1)), c.init("out_y", gy.reshape(1, oh, ow, 1))
    tx = c.one("Add", [c.one("Add", [c.one("Mul", [px, m00]), c.one("Mul", [py, m01])]), m03])
    ty = c.one("Add", [c.one("Add", [c.one("Mul", [px, m10]), c.one("Mul", [py, m11])]), m13])
    # normalized for align_corners=1: -1 is pixel 0, +1 is pixel W-1
    nx = c.one(
        "Sub",
        [
            c.one("Mul", [tx, c.init("sx", np.array(2.0 / (w - 1), np.float32))]),
            c.init("one", np.array(1.0, np.float32)),
        ],
    )
    ny = c.one(
        "Sub",
        [
            c.one("Mul", [ty, c.init("sy", np.array(2.0 / (h - 1), np.float32))]),
            c.init("one", np.array(1.0, np.float32)),
        ],
    )
    grid = c.one("Concat", [nx, ny], axis=3)
    y = c.one("GridSample", [c.to_nchw(x), grid], mode="linear", padding_mode="zeros", align_corners=1)
    zero = c.init("zero", np.array(0.0, np.float32))
    inside = c.one(
        "And",
        [
            c.one(
                "And",
                [
                    c.one("GreaterOrEqual", [tx, zero]),
                    c.one("LessOrEqual", [tx, c.init("xmax", np.array(w - 1, np.float32))]),
                ],
            ),
            c.one(
                "And",
                [
                    c.one("GreaterOrEqual", [ty, zero]),
                    c.one("LessOrEqual", [ty, c.init("ymax", np.array(h - 1, np.float32))]),
                ],
            ),
        ],
    )
    mask = c.one("Transpose", [c.one("Cast", [inside], to=TensorProto.FLOAT)], perm=[0, 3, 1, 2])
    c.bind(op.outputs[0], c.one("Mul", [y, mask]), nchw=True)


@lowering("CUSTOM:Landmarks2TransformMatrix")
def landmarks_to_transform_matrix(c: _Converter, op: TflOp) -> None:
    """landmarks_to_transform_matrix.cc v2: the rotation ``r = target - atan2(dy, dx)`` of the
    left -> right landmark pair; the subset's landmarks rotated by ``r`` give a box (size w, h,
    center rotated back by ``-r``); the matrix is ``shift(center) * rot(-r) * scale(scale_x * w /
    output_width, scale_y * h / output_height) * shift(-output_width / 2, -output_height / 2)``.
    cos r and sin r come from the pair's direction (no atan2 in ONNX): cos t cos a + sin t sin a,
    sin t cos a - cos t sin a with (cos a, sin a) = (dx, dy) / |(dx, dy)| (a zero pair: a = 0)."""
    what = "Landmarks2TransformMatrix"
    m = _flex_options(op, what)
    x = op.inputs[0]
    xs = c.shape(x)
    if len(xs) != 3 or xs[0] != 1 or xs[2] != 3:  # the kernel reads x, y at 3 * index
        raise _Unsupported(f"landmarks of shape {list(xs)}, expected [1, N, 3]")
    n, dims = xs[1], xs[2]
    subset = m.get("subset_idxs")
    if not isinstance(subset, list) or not subset or not all(type(k) is int for k in subset):
        raise ValueError(f"{what} option 'subset_idxs' is missing or not a list of integers")
    left = int(_flex_num(m, "left_rotation_idx", int, what))
    right = int(_flex_num(m, "right_rotation_idx", int, what))
    if any(not 0 <= k < n for k in [*subset, left, right]):
        raise ValueError(f"{what} landmark indices outside the {n} landmarks")
    target = _flex_num(m, "target_rotation_radians", float, what)
    oh = _flex_num(m, "output_height", float, what)
    ow = _flex_num(m, "output_width", float, what)
    scx, scy = _flex_num(m, "scale_x", float, what), _flex_num(m, "scale_y", float, what)
    if oh <= 0 or ow <= 0:
        raise ValueError(f"{what} output size {oh}x{ow} must be positive")
    f32 = np.float32
    flat = c.one("Reshape", [c.value(x), c.ints("pts", [n, dims])])
    xy = c.one("Slice", [flat, c.ints("c0", [0]), c.ints("c2", [2]), c.ints("ax", [1])])  # [n, 2]
    pair = c.one("Gather", [xy, c.ints("pair", [left, right])], axis=0)  # [2, 2]
    d = c.one(
        "Sub",
        [
            c.one("Gather", [pair, c.ints("r", [1])], axis=0),
            c.one("Gather", [pair, c.ints("l", [0])], axis=0),
        ],
    )
    dx = c.one(
        "Reshape",
        [c.one("Slice", [d, c.ints("c0", [0]), c.ints("c1", [1]), c.ints("ax", [1])]), c.ints("one_d", [1])],
    )
    dy = c.one(
        "Reshape",
        [c.one("Slice", [d, c.ints("c1", [1]), c.ints("c2", [2]), c.ints("ax", [1])]), c.ints("one_d", [1])],
    )
    norm = c.one("Sqrt", [c.one("Add", [c.one("Mul", [dx, dx]), c.one("Mul", [dy, dy])])])
    zero, one = c.init("zero", np.array(0.0, f32)), c.init("one", np.array(1.0, f32))
    degenerate = c.one("Equal", [norm, zero])
    safe = c.one("Where", [degenerate, one, norm])
    ca = c.one("Where", [degenerate, one, c.one("Div", [dx, safe])])
    sa = c.one("Where", [degenerate, zero, c.one("Div", [dy, safe])])
    ct, st = c.init("cos_t", np.array(np.cos(target), f32)), c.init("sin_t", np.array(np.sin(target), f32))
    cr = c.one("Add", [c.one("Mul", [ct, ca]), c.one("Mul", [st, sa])])  # cos r
    sr = c.one("Sub", [c.one("Mul", [st, ca]), c.one("Mul", [ct, sa])])  # sin r
    pts = c.one("Gather", [xy, c.ints("subset", subset)], axis=0)  # [k, 2]
    px = c.one("Slice", [pts, c.ints("c0", [0]), c.ints("c1", [1]), c.ints("ax", [1])])
    py = c.one("Slice", [pts, c.ints("c1", [1]), c.ints("c2", [2]), c.ints("ax", [1])])
    rx = c.one("Sub", [c.one("Mul", [cr, px]), c.one("Mul", [sr, py])])
    ry = c.one("Add", [c.one("Mul", [sr, px]), c.one("Mul", [cr, py])])
    all_axes = c.ints("all", [0, 1])
    lo_x, hi_x = (
        c.one("ReduceMin", [rx, all_axes], keepdims=0),
        c.one("ReduceMax", [rx, all_axes], keepdims=0),
    )
    lo_y, hi_y = (
        c.one("ReduceMin", [ry, all_axes], keepdims=0),
        c.one("ReduceMax", [ry, all_axes], keepdims=0),
    )
    half = c.init("half", np.array(0.5, f32))
    bw, bh = c.one("Sub", [hi_x, lo_x]), c.one("Sub", [hi_y, lo_y])
    mx, my = (
        c.one("Mul", [c.one("Add", [lo_x, hi_x]), half]),
        c.one("Mul", [c.one("Add", [lo_y, hi_y]), half]),
    )
    cx = c.one("Add", [c.one("Mul", [cr, mx]), c.one("Mul", [sr, my])])  # rot(-r) * middle
    cy = c.one("Sub", [c.one("Mul", [cr, my]), c.one("Mul", [sr, mx])])
    sx = c.one("Mul", [bw, c.init("kx", np.array(scx / ow, f32))])
    sy = c.one("Mul", [bh, c.init("ky", np.array(scy / oh, f32))])
    a00, a01 = c.one("Mul", [cr, sx]), c.one("Mul", [sr, sy])
    a10, a11 = c.one("Neg", [c.one("Mul", [sr, sx])]), c.one("Mul", [cr, sy])
    hx, hy = c.init("hx", np.array(-ow / 2.0, f32)), c.init("hy", np.array(-oh / 2.0, f32))
    tx = c.one("Add", [c.one("Add", [c.one("Mul", [a00, hx]), c.one("Mul", [a01, hy])]), cx])
    ty = c.one("Add", [c.one("Add", [c.one("Mul", [a10, hx]), c.one("Mul", [a11, hy])]), cy])
    z1, o1 = c.init("z1", np.zeros(1, f32)), c.init("o1", np.ones(1, f32))
    row = [c.one("Reshape", [v, c.ints("one_d", [1])]) for v in (a00, a01, tx, a10, a11, ty)]
    flat16 = c.one(
        "Concat",
        [row[0], row[1], z1, row[2], row[3], row[4], z1, row[5], z1, z1, o1, z1, z1, z1, z1, o1],
        axis=0,
    )
    c.bind(op.outputs[0], c.one("Reshape", [flat16, c.ints("m44", [1, 4, 4])]))
