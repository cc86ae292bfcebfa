"""TFLite op lowerings: one function per op family, registered in :data:`mconv.formats.tflite.OPS`.

Each lowering reads its op's tensors through the converter (``c.value``, ``c.need_const``), emits
ONNX nodes (``c.one``/``c.emit``) and binds the op's outputs (``c.bind``), which applies the fused
activation and the fake-quant rounding. Rules of layout, padding and quantization are stated in
:mod:`mconv.formats.tflite`.
"""

from __future__ import annotations

import numpy as np
from mconv.formats.tflite import (
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
        return [c.init(f"{c.tname[op.inputs[k]]}", b)]
    return []


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
    wn = c.init(c.tname[w_i], w.transpose(0, 3, 1, 2))
    y = c.one(
        "Conv",
        [c.to_nchw(x), wn, *_bias(c, op, 2, w.shape[0])],
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
    wn = c.init(c.tname[w_i], w[0].transpose(2, 0, 1)[:, None])
    y = c.one(
        "Conv",
        [c.to_nchw(x), wn, *_bias(c, op, 2, w.shape[3])],
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
    wn = c.init(c.tname[w_i], w.transpose(3, 0, 1, 2))  # ONNX: [Cin, Cout, KH, KW]
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
    wn = c.init(c.tname[w_i], w)
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


@lowering("DEQUANTIZE")
def dequantize_op(c: _Converter, op: TflOp) -> None:
    x = op.inputs[0]
    if c.T(x).data is not None:  # fp16 / int8 weights dequantized for a float kernel: fold
        c.vals[op.outputs[0]] = c.init(c.tname[op.outputs[0]], c.const_array(x).astype(np.float32))
        return
    c.bind(op.outputs[0], c.value(x), quantize=False)


# ------------------------------------------------------------------------------ shape


@lowering("RESHAPE")
def reshape(c: _Converter, op: TflOp) -> None:
    out = c.T(op.outputs[0])
    c.bind(op.outputs[0], c.one("Reshape", [c.value(op.inputs[0]), c.ints("shape", _target_shape(out))]))


@lowering("SQUEEZE")
def squeeze(c: _Converter, op: TflOp) -> None:
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
    if any(a is None for a in wx[1:] + wr[1:]):
        raise _Unsupported("missing gate weights")
    hidden = wx[1].shape[0]
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
    if simple:
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
