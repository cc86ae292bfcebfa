"""Op family: ONNX Runtime's ``com.microsoft`` contrib ops that real exports and ORT's own
quantization tools write: the dynamic and QOperator quantized ops, fused activations and
normalizations, attention, and the blockwise 4-bit weights (MatMulNBits, GatherBlockQuantized).

Rules
-----
1. Each op computes what ONNX Runtime's CPU kernel computes. Where ORT quantizes activations at
   run time (DynamicQuantizeMatMul, DynamicQuantizeLSTM), the reference does the same: one
   per-tensor uint8 scale and zero point from the tensor's range extended to 0 (float32
   arithmetic, :func:`_dynamic_params`), codes rounded half to even, integer products exact,
   then scaled. The cells of DynamicQuantizeLSTM quantize X (all steps at once) and each step's
   hidden state (the whole batch at once, rows whose sequence ended before the previous step
   taken as zeros), as ORT's quantized LSTM does on one thread; ORT on
   several threads quantizes the state in chunks of batch rows, one chunk per thread, which
   moves its result by up to a quantization step of the state.
2. The QOperator element ops (QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu,
   QLinearSoftmax, QLinearAveragePool, QLinearGlobalAveragePool, QLinearConcat, QGemm)
   dequantize, compute in float32 (the ratios of scales as ORT forms them) and requantize:
   round half to even, add the zero point, saturate. QLinearSoftmax's exponentials and sum are
   float64 (``opset`` < 13: softmax over the 2-D coercion at ``axis``; 13 on: over ``axis``).
   ORT's vectorised sigmoid and pooling, and its float32 softmax table, differ from this by at
   most one code on ties.
3. Float ops (FusedConv, Gelu, FastGelu, BiasGelu, QuickGelu, BiasAdd, SkipLayerNormalization,
   SkipSimplifiedLayerNormalization, SimplifiedLayerNormalization, Attention,
   MultiHeadAttention) accumulate in :func:`wide` and round once to the input's dtype.
   Attention takes a 2-D ``mask_index`` (1 keeps a key, 0 masks it) or a 1-D one of valid
   lengths, no past state; MultiHeadAttention takes 3-D query, key and value, optional bias
   and a key padding mask ``[B, L]``. Anything else is refused by name.
4. MatMulNBits (2, 4 or 8 bits) and GatherBlockQuantized unpack codes low bits first, subtract
   the zero point (default ``2^(bits-1)``, or 0 for int4 and uint4 tables) and multiply by the block's
   scale; MatMulNBits' product is then a float MatMul (ORT's ``accuracy_level`` 0).
5. No op of this family has a VJP: quantized graphs are verified, not fine-tuned through.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
from mconv.engines.reference.ops import lookup, register, wide
from mconv.errors import InputError

from ._special import special

MS = "com.microsoft"


def _opt(inputs: list, i: int):
    return inputs[i] if len(inputs) > i and inputs[i] is not None else None


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _refuse(op: str, what: str) -> InputError:
    return InputError(
        f"{op}: {what} is not supported by the reference", where=op, hint="see the op's docstring"
    )


# ----------------------------------------------------------------------------- quantization helpers


def _dynamic_params(x: np.ndarray) -> tuple[np.float32, int]:
    """ORT's GetQuantizationParameter for uint8: the range [min, max] extended to 0, scale
    ``(max - min) / 255`` in float32, zero point ``round(0 - min / scale)`` clamped."""
    x = x.astype(np.float32, copy=False)
    lo = np.float32(min(np.float32(0), x.min())) if x.size else np.float32(0)
    hi = np.float32(max(np.float32(0), x.max())) if x.size else np.float32(0)
    scale = np.float32(1.0) if hi == lo else np.float32((hi - lo) / np.float32(255))
    zp = int(np.rint(np.clip(np.float32(0) - lo / scale, 0, 255)))
    return scale, zp


def _quantize_u8(x: np.ndarray, scale: np.float32, zp: int) -> np.ndarray:
    q = np.rint(x.astype(np.float32) / np.float32(scale)) + zp
    return np.clip(q, 0, 255).astype(np.int64)


def _saturate(v: np.ndarray, dtype: np.dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.clip(np.rint(v), info.min, info.max).astype(dtype)


def _dq(x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None) -> np.ndarray:
    v = x.astype(np.float32)
    if zp is not None:
        v = v - np.asarray(zp).astype(np.float32)
    return v * np.asarray(scale).astype(np.float32)


def _requant(v: np.ndarray, scale, zp) -> np.ndarray:
    zp_arr = np.asarray(zp) if zp is not None else np.zeros((), np.uint8)
    q = np.rint(v.astype(np.float32) / np.float32(np.asarray(scale).reshape(()))) + np.float32(
        zp_arr.reshape(())
    )
    return _saturate(q, zp_arr.dtype)


def _qgemm(
    a: np.ndarray, b: np.ndarray, b_scale: np.ndarray, b_zp: np.ndarray | None, rng: np.ndarray | None = None
) -> np.ndarray:
    """``a`` [M, K] float quantized per tensor (uint8, dynamic; the range of ``rng`` when given,
    else of ``a``) times integer ``b`` [K, N] with a per-tensor or per-column scale and zero
    point: float64 result of the exact integer product."""
    scale, zp = _dynamic_params(a if rng is None else rng)
    qa = _quantize_u8(a, scale, zp) - zp
    qb = b.astype(np.int64)
    if b_zp is not None:
        qb = qb - np.asarray(b_zp).astype(np.int64).reshape(-1 if np.size(b_zp) > 1 else ())
    acc = (qa @ qb).astype(np.float64)
    bs = np.asarray(b_scale).astype(np.float32).reshape(-1 if np.size(b_scale) > 1 else ())
    return acc * (np.float32(scale) * bs).astype(np.float32)


# ----------------------------------------------------------------------------- dynamic quantization


@register("DynamicQuantizeMatMul", domain=MS)
def dynamic_quantize_matmul(inputs, attrs, ctx):
    a, b, b_scale = inputs[0], inputs[1], inputs[2]
    b_zp, bias = _opt(inputs, 3), _opt(inputs, 4)
    lead = a.shape[:-1]
    y = _qgemm(a.reshape(-1, a.shape[-1]), b, b_scale, b_zp).reshape(*lead, b.shape[-1])
    if bias is not None:
        y = y + bias.astype(np.float64)
    return (y.astype(np.float32),)


@register("MatMulIntegerToFloat", domain=MS)
def matmul_integer_to_float(inputs, attrs, ctx):
    a, b, a_scale, b_scale = inputs[:4]
    a_zp, b_zp, bias = _opt(inputs, 4), _opt(inputs, 5), _opt(inputs, 6)
    qa = a.astype(np.int64) - (0 if a_zp is None else np.asarray(a_zp).astype(np.int64).reshape(()))
    qb = b.astype(np.int64)
    if b_zp is not None:
        qb = qb - np.asarray(b_zp).astype(np.int64).reshape(-1 if np.size(b_zp) > 1 else ())
    bs = np.asarray(b_scale).astype(np.float32).reshape(-1 if np.size(b_scale) > 1 else ())
    y = np.matmul(qa, qb).astype(np.float64) * (np.asarray(a_scale, np.float32).reshape(()) * bs)
    if bias is not None:
        y = y + bias.astype(np.float64)
    return (y.astype(a_scale.dtype),)


@register("DynamicQuantizeLSTM", domain=MS)
def dynamic_quantize_lstm(inputs, attrs, ctx):
    """LSTM with int8/uint8 ``W`` [nd, I, 4H] and ``R`` [nd, H, 4H] (transposed against LSTM's),
    per-direction (or per-column) scales and zero points in inputs 8-11."""
    from mconv.engines.reference.ops import recurrent

    x, W, R = inputs[0], inputs[1], inputs[2]
    rest = [_opt(inputs, k) for k in range(3, 8)]
    w_s, w_zp, r_s, r_zp = (_opt(inputs, k) for k in range(8, 12))
    if w_s is None or r_s is None:
        raise _refuse("DynamicQuantizeLSTM", "a missing W_scale or R_scale")

    def per_dir(p, d):
        if p is None:
            return None
        p = np.asarray(p)
        return p.reshape(()) if p.ndim == 0 else p[d] if p.shape[0] == W.shape[0] else p.reshape(-1)

    def deq(q, scale, zp):
        out = []
        for d in range(q.shape[0]):
            v = q[d].astype(np.float64)
            z = per_dir(zp, d)
            if z is not None:
                v = v - z.astype(np.float64)
            out.append(v * per_dir(scale, d).astype(np.float64))
        return np.transpose(np.stack(out), (0, 2, 1)).astype(x.dtype)  # LSTM's [nd, 4H, I]

    quant = {"W": (W, w_s, w_zp), "R": (R, r_s, r_zp)}

    def matmul(a, d, which, live):
        q, scale, zp = quant[which]
        s, z = per_dir(scale, d), per_dir(zp, d)
        # rows whose sequence ended before the previous step hold zeros in ORT's state buffer:
        # they take no part in the state's range
        y = _qgemm(a.reshape(-1, a.shape[-1]), q[d], s, z, None if live is None else a[live])
        return y.reshape(*a.shape[:-1], q.shape[-1]).astype(a.dtype)

    lstm_inputs = [x, deq(W, w_s, w_zp), deq(R, r_s, r_zp), *rest]
    outs, _, _ = recurrent._forward("LSTM", lstm_inputs, attrs, matmul=matmul)
    return outs


# ----------------------------------------------------------------------------- QOperator


@register("QLinearAdd", domain=MS)
def qlinear_add(inputs, attrs, ctx):
    a, a_s, a_zp, b, b_s, b_zp, c_s = inputs[:7]
    c_zp = _opt(inputs, 7)
    return (_requant(_dq(a, a_s, a_zp) + _dq(b, b_s, b_zp), c_s, c_zp if c_zp is not None else a_zp),)


@register("QLinearMul", domain=MS)
def qlinear_mul(inputs, attrs, ctx):
    a, a_s, a_zp, b, b_s, b_zp, c_s = inputs[:7]
    c_zp = _opt(inputs, 7)
    return (_requant(_dq(a, a_s, a_zp) * _dq(b, b_s, b_zp), c_s, c_zp if c_zp is not None else a_zp),)


def _table_op(fn):
    """A unary QOperator op as ORT builds it: a 256-entry table of requantized f(dequantized)."""

    def forward(inputs, attrs, ctx):
        x, x_s, x_zp, y_s = inputs[:4]
        y_zp = _opt(inputs, 4)
        codes = np.arange(256, dtype=np.int64) + (-128 if x.dtype == np.int8 else 0)
        f = fn(_dq(codes, x_s, x_zp), attrs).astype(np.float32)
        table = _requant(f, y_s, y_zp if y_zp is not None else np.zeros((), x.dtype))
        return (table[x.astype(np.int64) - codes[0]],)

    return forward


register("QLinearSigmoid", domain=MS)(_table_op(lambda v, a: special.expit(v.astype(np.float32))))
register("QLinearLeakyRelu", domain=MS)(
    _table_op(lambda v, a: np.where(v >= 0, v, v * np.float32(a.get("alpha", 0.01))))
)
register("QLinearSoftsign", domain=MS)(_table_op(lambda v, a: v / (1 + np.abs(v))))


def _softmax_rows(x: np.ndarray, attrs) -> tuple[tuple[int, ...], int, np.ndarray]:
    """QLinearSoftmax's layout: ``opset`` < 13 coerces to 2-D at ``axis`` (softmax over the
    trailing block), 13 and later reduce the one axis. Returns (shape back, axis, view)."""
    axis = int(attrs.get("axis", -1))
    axis = axis + x.ndim if axis < 0 else axis
    if int(attrs.get("opset", 13)) < 13:
        return x.shape, 1, x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))
    return x.shape, axis, x


@register("QLinearSoftmax", domain=MS)
def qlinear_softmax(inputs, attrs, ctx):
    """ORT's kernel: exp of each code's distance below its row's largest, times ``x_scale``
    (its table, the zero point cancels), normalised, requantized half to even and saturated."""
    x, x_s, _x_zp, y_s = inputs[:4]
    y_zp = _opt(inputs, 4)
    shape, axis, v = _softmax_rows(x, attrs)
    d = v.astype(np.int64) - v.max(axis=axis, keepdims=True).astype(np.int64)  # exact, <= 0
    e = np.exp(d.astype(np.float64) * np.float64(np.asarray(x_s).reshape(())))
    p = (e / e.sum(axis=axis, keepdims=True)).astype(np.float32).reshape(shape)
    return (_requant(p, y_s, y_zp if y_zp is not None else np.zeros((), x.dtype)),)


@register("QLinearAveragePool", domain=MS)
def qlinear_average_pool(inputs, attrs, ctx):
    x, x_s, x_zp, y_s = inputs[:4]
    y_zp = _opt(inputs, 4)
    pool = lookup("AveragePool")
    assert pool is not None
    a = {k: v for k, v in attrs.items() if k != "channels_last"}
    xf = _dq(x, x_s, x_zp)
    if attrs.get("channels_last"):
        xf = np.moveaxis(xf, -1, 1)
    y = pool.forward([xf], a, ctx)[0]
    if attrs.get("channels_last"):
        y = np.moveaxis(y, 1, -1)
    return (_requant(y, y_s, y_zp if y_zp is not None else np.zeros((), x.dtype)),)


@register("QLinearGlobalAveragePool", domain=MS)
def qlinear_global_average_pool(inputs, attrs, ctx):
    x, x_s, x_zp, y_s = inputs[:4]
    y_zp = _opt(inputs, 4)
    last = bool(attrs.get("channels_last", 0))
    axes = tuple(range(1, x.ndim - 1)) if last else tuple(range(2, x.ndim))
    xf = (x.astype(np.float64) - np.float64(np.asarray(x_zp).reshape(()))).mean(axis=axes, keepdims=True)
    y = xf * np.float64(np.asarray(x_s).reshape(()))
    return (_requant(y.astype(np.float32), y_s, y_zp if y_zp is not None else np.zeros((), x.dtype)),)


@register("QLinearConcat", domain=MS)
def qlinear_concat(inputs, attrs, ctx):
    y_s, y_zp = inputs[0], inputs[1]
    parts = []
    for k in range(2, len(inputs), 3):
        x, s, zp = inputs[k], inputs[k + 1], inputs[k + 2]
        parts.append(_requant(_dq(x, s, zp), y_s, y_zp))
    return (np.concatenate(parts, axis=int(attrs["axis"])),)


@register("QGemm", domain=MS)
def qgemm(inputs, attrs, ctx):
    a, a_s, a_zp, b, b_s, b_zp = inputs[:6]
    c, y_s, y_zp = _opt(inputs, 6), _opt(inputs, 7), _opt(inputs, 8)
    qa = a.astype(np.int64) - np.asarray(a_zp).astype(np.int64).reshape(())
    qb = b.astype(np.int64)
    trans_b = int(attrs.get("transB", 0))
    zp_b = np.asarray(b_zp).astype(np.int64)
    if zp_b.size > 1:
        zp_b = zp_b.reshape(-1, 1) if trans_b else zp_b.reshape(1, -1)
    qb = qb - zp_b.reshape(zp_b.shape if zp_b.size > 1 else ())
    if int(attrs.get("transA", 0)):
        qa = qa.T
    if trans_b:
        qb = qb.T
    acc = (qa @ qb).astype(np.float64)
    if c is not None:
        acc = acc + c.astype(np.float64)
    bs = np.asarray(b_s).astype(np.float32).reshape(-1 if np.size(b_s) > 1 else ())
    y = acc * (np.float32(np.asarray(a_s).reshape(())) * np.float32(attrs.get("alpha", 1.0)) * bs).astype(
        np.float32
    )
    if y_s is None:
        return (y.astype(np.float32),)
    return (_requant(y.astype(np.float32), y_s, y_zp),)


# ----------------------------------------------------------------------------- fused float ops


def _gelu_erf(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + special.erf(x / math.sqrt(2.0)))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


@register("Gelu", domain=MS)
def gelu(inputs, attrs, ctx):
    x = inputs[0]
    return (_gelu_erf(x.astype(wide(x.dtype))).astype(x.dtype),)


@register("BiasGelu", domain=MS)
def bias_gelu(inputs, attrs, ctx):
    x, b = inputs[0], inputs[1]
    return (_gelu_erf(x.astype(wide(x.dtype)) + b.astype(wide(x.dtype))).astype(x.dtype),)


@register("FastGelu", domain=MS)
def fast_gelu(inputs, attrs, ctx):
    x, b = inputs[0], _opt(inputs, 1)
    v = x.astype(wide(x.dtype))
    if b is not None:
        v = v + b.astype(v.dtype)
    return (_gelu_tanh(v).astype(x.dtype),)


@register("QuickGelu", domain=MS)
def quick_gelu(inputs, attrs, ctx):
    x = inputs[0]
    v = x.astype(wide(x.dtype))
    return ((v * special.expit(float(attrs.get("alpha", 1.702)) * v)).astype(x.dtype),)


@register("BiasAdd", domain=MS)
def bias_add(inputs, attrs, ctx):
    x, bias, skip = inputs[0], inputs[1], inputs[2]
    w = wide(x.dtype)
    return ((x.astype(w) + bias.astype(w) + skip.astype(w)).astype(x.dtype),)


_FUSED_ACTS = {
    "Relu": lambda v, p: np.maximum(v, 0),
    "Tanh": lambda v, p: np.tanh(v),
    "Sigmoid": lambda v, p: special.expit(v),
    "LeakyRelu": lambda v, p: np.where(v >= 0, v, v * (p[0] if p else 0.01)),
    "Clip": lambda v, p: np.clip(v, p[0], p[1]),
    "HardSigmoid": lambda v, p: np.clip(v * (p[0] if p else 0.2) + (p[1] if len(p) > 1 else 0.5), 0, 1),
}


@register("FusedConv", domain=MS)
def fused_conv(inputs, attrs, ctx):
    x, w, b, z = inputs[0], inputs[1], _opt(inputs, 2), _opt(inputs, 3)
    act = _s(attrs.get("activation", ""))
    params = [float(p) for p in attrs.get("activation_params", [])]
    conv_attrs = {k: v for k, v in attrs.items() if k not in ("activation", "activation_params")}
    conv = lookup("Conv")
    assert conv is not None
    y = conv.forward([x, w, b], conv_attrs, ctx)[0].astype(wide(x.dtype))
    if z is not None:
        y = y + z.astype(y.dtype)
    if act:
        if act not in _FUSED_ACTS:
            raise _refuse("FusedConv", f"activation {act!r}")
        y = _FUSED_ACTS[act](y, params)
    return (np.asarray(y).astype(x.dtype),)


def _norm(inputs, attrs, ctx, *, simplified: bool, skip: bool):
    x = inputs[0]
    w = wide(x.dtype)
    k = 1
    v = x.astype(w)
    s = None
    if skip:
        s = inputs[1]
        v = v + s.astype(w)
        k = 2
    gamma = inputs[k]
    beta = None if simplified else _opt(inputs, k + 1)
    bias = _opt(inputs, k + (1 if simplified else 2)) if skip else None
    if bias is not None:
        v = v + bias.astype(w)
    eps = float(attrs.get("epsilon", 1e-12 if skip else 1e-5))
    axis = int(attrs.get("axis", -1)) % x.ndim
    axes = tuple(range(axis, x.ndim))
    if simplified:
        mean = np.zeros_like(v.mean(axis=axes, keepdims=True))
        var = (v * v).mean(axis=axes, keepdims=True)
        y = v / np.sqrt(var + eps)
    else:
        mean = v.mean(axis=axes, keepdims=True)
        var = ((v - mean) ** 2).mean(axis=axes, keepdims=True)
        y = (v - mean) / np.sqrt(var + eps)
    y = y * gamma.astype(w)
    if beta is not None:
        y = y + beta.astype(w)
    inv = 1.0 / np.sqrt(var + eps)
    outs = [y.astype(x.dtype)]
    n = ctx.num_outputs or 1
    if skip:
        # outputs: output, mean, inv_std_var, input_skip_bias_sum
        extra = [mean.astype(np.float32), inv.astype(np.float32), v.astype(x.dtype)]
    elif simplified:
        extra = [inv.astype(np.float32)]
    else:
        extra = [mean.astype(np.float32), inv.astype(np.float32)]
    return tuple(outs + extra[: max(0, n - 1)])


@register("SkipLayerNormalization", domain=MS)
def skip_layer_norm(inputs, attrs, ctx):
    return _norm(inputs, attrs, ctx, simplified=False, skip=True)


@register("SkipSimplifiedLayerNormalization", domain=MS)
def skip_simplified_layer_norm(inputs, attrs, ctx):
    return _norm(inputs, attrs, ctx, simplified=True, skip=True)


@register("SimplifiedLayerNormalization")
@register("SimplifiedLayerNormalization", domain=MS)
def simplified_layer_norm(inputs, attrs, ctx):
    return _norm(inputs, attrs, ctx, simplified=True, skip=False)


@register("LayerNormalization", domain=MS)
def layer_norm_ms(inputs, attrs, ctx):
    return _norm(inputs, attrs, ctx, simplified=False, skip=False)


# ----------------------------------------------------------------------------- attention


def _softmax(s: np.ndarray) -> np.ndarray:
    s = s - s.max(axis=-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(axis=-1, keepdims=True)


def _heads(t: np.ndarray, n: int) -> np.ndarray:
    b, s, d = t.shape
    return t.reshape(b, s, n, d // n).transpose(0, 2, 1, 3)


def _attend(q, k, v, n, scale, key_mask, causal, filter_value):
    """``q`` [B,S,Dq], ``k`` [B,L,Dq], ``v`` [B,L,Dv]; ``key_mask`` [B, L] bool (True keeps)."""
    qh, kh, vh = _heads(q, n), _heads(k, n), _heads(v, n)
    if scale is None:
        scale = 1.0 / math.sqrt(qh.shape[-1])
    s = (qh @ kh.transpose(0, 1, 3, 2)) * scale
    if key_mask is not None:
        s = np.where(key_mask[:, None, None, :], s, s + filter_value)
    if causal:
        S, L = s.shape[-2], s.shape[-1]
        keep = np.tril(np.ones((S, L), bool), k=L - S)
        s = np.where(keep, s, s + filter_value)
    y = _softmax(s) @ vh  # [B, n, S, dv]
    b, _, S, dv = y.shape
    return y.transpose(0, 2, 1, 3).reshape(b, S, n * dv)


@register("Attention", domain=MS)
def attention(inputs, attrs, ctx):
    x, w, bias = inputs[0], inputs[1], _opt(inputs, 2)
    mask = _opt(inputs, 3)
    for k, what in ((4, "past"), (5, "attention_bias"), (6, "past_sequence_length")):
        if _opt(inputs, k) is not None:
            raise _refuse("Attention", f"the {what} input")
    if (ctx.num_outputs or 1) > 1:
        raise _refuse("Attention", "the present output")
    n = int(attrs["num_heads"])
    dt = wide(x.dtype)
    proj = x.astype(dt) @ w.astype(dt)
    if bias is not None:
        proj = proj + bias.astype(dt)
    sizes = [int(v) for v in attrs.get("qkv_hidden_sizes", [])] or [w.shape[1] // 3] * 3
    q, k, v = np.split(proj, np.cumsum(sizes)[:2], axis=-1)
    key_mask = None
    B, L = x.shape[0], x.shape[1]
    if mask is not None:
        if mask.ndim == 2 and mask.shape == (B, L):
            key_mask = mask != 0
        elif mask.ndim == 1 and mask.shape[0] == B:
            key_mask = np.arange(L)[None, :] < mask.astype(np.int64)[:, None]
        else:
            raise _refuse("Attention", f"mask_index of shape {list(mask.shape)}")
    scale = attrs.get("scale")
    scale = float(scale) if scale else None
    filt = float(attrs.get("mask_filter_value", -10000.0))
    y = _attend(q, k, v, n, scale, key_mask, bool(attrs.get("unidirectional", 0)), filt)
    return (y.astype(x.dtype),)


@register("MultiHeadAttention", domain=MS)
def multi_head_attention(inputs, attrs, ctx):
    q, k, v = inputs[0], _opt(inputs, 1), _opt(inputs, 2)
    bias, kpm = _opt(inputs, 3), _opt(inputs, 4)
    if k is None or v is None or q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise _refuse("MultiHeadAttention", "packed or 4-D query/key/value")
    for idx, what in ((5, "attention_bias"), (6, "past_key"), (7, "past_value")):
        if _opt(inputs, idx) is not None:
            raise _refuse("MultiHeadAttention", f"the {what} input")
    if (ctx.num_outputs or 1) > 1:
        raise _refuse("MultiHeadAttention", "the present outputs")
    dt = wide(q.dtype)
    qf, kf, vf = q.astype(dt), k.astype(dt), v.astype(dt)
    if bias is not None:
        dq, dk = q.shape[-1], k.shape[-1]
        b = bias.astype(dt)
        qf, kf, vf = qf + b[:dq], kf + b[dq : dq + dk], vf + b[dq + dk :]
    key_mask = None
    if kpm is not None:
        if kpm.shape != (k.shape[0], k.shape[1]):
            raise _refuse("MultiHeadAttention", f"key_padding_mask of shape {list(kpm.shape)}")
        key_mask = kpm != 0
    scale = attrs.get("scale")
    scale = float(scale) if scale else None
    filt = float(attrs.get("mask_filter_value", -10000.0))
    y = _attend(
        qf, kf, vf, int(attrs["num_heads"]), scale, key_mask, bool(attrs.get("unidirectional", 0)), filt
    )
    return (y.astype(q.dtype),)


# ----------------------------------------------------------------------------- n-bit weights


def _unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """Codes of ``bits`` each from uint8 bytes along the last axis, the first in the low bits."""
    per = 8 // bits
    p = packed.astype(np.uint8)
    parts = [(p >> (bits * i)) & ((1 << bits) - 1) for i in range(per)]
    return np.stack(parts, axis=-1).reshape(*p.shape[:-1], p.shape[-1] * per)


@register("MatMulNBits", domain=MS)
def matmul_nbits(inputs, attrs, ctx):
    a, b, scales = inputs[0], inputs[1], inputs[2]
    zp, g_idx, bias = _opt(inputs, 3), _opt(inputs, 4), _opt(inputs, 5)
    K, N = int(attrs["K"]), int(attrs["N"])
    bits, block = int(attrs.get("bits", 4)), int(attrs["block_size"])
    if bits not in (2, 4, 8):
        raise _refuse("MatMulNBits", f"bits={bits}")
    if g_idx is not None:
        raise _refuse("MatMulNBits", "g_idx")
    k_blocks = (K + block - 1) // block
    codes = _unpack(b.reshape(N, k_blocks, -1), bits)[:, :, :block].astype(np.float64)  # [N, kb, block]
    s = scales.reshape(N, k_blocks).astype(np.float64)
    if zp is None:
        z = np.full((N, k_blocks), 2 ** (bits - 1), np.float64)
    elif zp.dtype == np.uint8:
        z = _unpack(zp.reshape(N, -1), bits)[:, :k_blocks].astype(np.float64)
    else:
        z = zp.reshape(N, k_blocks).astype(np.float64)
    wt = ((codes - z[..., None]) * s[..., None]).reshape(N, -1)[:, :K]  # [N, K]
    wdt = wide(a.dtype)
    y = a.astype(wdt) @ wt.T.astype(wdt)
    if bias is not None:
        y = y + bias.astype(wdt)
    return (y.astype(a.dtype),)


@register("GatherBlockQuantized", domain=MS)
def gather_block_quantized(inputs, attrs, ctx):
    data, indices, scales = inputs[0], inputs[1], inputs[2]
    zp = _opt(inputs, 3)
    bits = int(attrs.get("bits", 4))
    block = int(attrs.get("block_size", 128))
    g_axis = int(attrs.get("gather_axis", 0)) % data.ndim
    q_axis = int(attrs.get("quantize_axis", 1)) % data.ndim
    # ORT's default zero point: 2^(bits-1) for codes packed in uint8, 0 for int4 and uint4 tables
    signed = data.dtype in (np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.uint4))
    if data.dtype == np.uint8 and bits < 8:
        codes = _unpack(data, bits).astype(np.float64)
        z = _unpack(zp, bits).astype(np.float64) if zp is not None else None
    else:
        codes = data.astype(np.float64)
        z = zp.astype(np.float64) if zp is not None else None
    if z is None:
        z = np.zeros((), np.float64) if signed else np.full((), 2 ** (bits - 1), np.float64)
    z = z.reshape(scales.shape) if z.ndim else z
    n = codes.shape[q_axis]

    def spread(p):
        if p.ndim == 0:
            return p
        return np.take(np.repeat(p, block, axis=q_axis), np.arange(n), axis=q_axis)

    table = (codes - spread(z)) * spread(scales.astype(np.float64))
    idx = indices.astype(np.int64)
    idx = np.where(idx < 0, idx + table.shape[g_axis], idx)
    return (np.take(table, idx, axis=g_axis).astype(scales.dtype),)
