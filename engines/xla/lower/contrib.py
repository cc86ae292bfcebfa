"""ONNX Runtime's ``com.microsoft`` contrib ops: the dynamic and QOperator quantized ops that
ORT's quantization tools write, fused activations and normalizations, attention, and blockwise
n-bit weights (MatMulNBits, GatherBlockQuantized). Each rule computes what the reference
executor's kernel of the same op computes (:mod:`mconv.engines.reference.ops.contrib`).

Rules:

1. Integer products are exact: codes minus zero points in int32, accumulated in int32
   (``preferred_element_type``); the accumulator becomes float32 exactly (|acc| < 2^24 for any
   layer ORT's tools write), and float32 products of two float32 values round as the
   reference's float64 product cast to float32 does.
2. Dynamic quantization (DynamicQuantizeMatMul, DynamicQuantizeLSTM): one per-tensor uint8 scale
   ``(max - min) / 255`` over the range extended to 0, zero point ``round(-min / scale)``, codes
   rounded half to even and saturated, all in float32 as ORT does. DynamicQuantizeLSTM quantizes
   X of all steps at once and each step's hidden state over the batch rows still running (a row
   whose sequence ended counts as zeros, which leaves the range extended to 0 unchanged);
   ``sequence_lens`` may be traced.
3. Requantization (QOperator element ops, QGemm): dequantize in float32, compute, divide by the
   output scale, round half to even, add the zero point, saturate to its type. QLinearSigmoid,
   QLinearLeakyRelu and QLinearSoftsign are 256-entry tables: computed by the reference kernel
   at trace time when the scales and zero points are initializers (the registry's rule 5, so the
   codes equal the reference's), otherwise in jax. QLinearSoftmax computes in float32 what the reference
   computes in float64 (one code apart at most, on ties).
4. Float ops compute in the input's type (float32) with ``precision=HIGHEST`` products. Attention
   takes a 2-D key mask or 1-D valid lengths and no past state; MultiHeadAttention 3-D query,
   key and value, an optional bias and a ``[B, L]`` key padding mask; FusedConv the activations
   Relu, Tanh, Sigmoid, LeakyRelu, Clip and HardSigmoid. Other variants are refused by name.
5. MatMulNBits (2, 4, 8 bits) and GatherBlockQuantized unpack codes low bits first; the zero
   point defaults to ``2^(bits-1)`` for packed uint8, and to 0 for int4 and uint4 tables (as ORT's
   kernel does). A 4-bit table reaches the rule
   widened to 8 bits; the graph's declared type (``ctx.input_types``) says whether it was int4,
   uint4 or packed uint8.
6. Quotients go through :func:`.quantization.divide`; scales, zero points and dequantized
   values through :func:`.quantization.opaque`, so XLA computes each float32 step as written
   (the reference's order, IEEE division) instead of folding scalars across steps.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from mconv.engines.xla.lower import is_static, lookup, lower
from mconv.engines.xla.lower.quantization import divide, opaque
from mconv.engines.xla.lower.recurrent import _activations

MS = "com.microsoft"
_P = lax.Precision.HIGHEST
_F = jnp.float32


def _opt(inputs: list, i: int):
    return inputs[i] if len(inputs) > i and inputs[i] is not None else None


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _dtype(v) -> np.dtype:
    return np.dtype(v.dtype)


def _per(v):
    """A scale or zero point: a scalar when it has one entry, else flat (per column)."""
    v = jnp.asarray(v)
    return v.reshape(()) if v.size == 1 else v.reshape(-1)


# ----------------------------------------------------------------------------- quantization helpers


def _dynamic_params(x):
    """ORT's uint8 GetQuantizationParameter (rule 2): (scale, zero point) as float32 scalars."""
    x = x.astype(_F)
    lo = jnp.minimum(_F(0), jnp.min(x))
    hi = jnp.maximum(_F(0), jnp.max(x))
    scale = jnp.where(hi == lo, _F(1), (hi - lo) / opaque(_F(255))).astype(_F)
    zp = jnp.round(jnp.clip(_F(0) - lo / scale, 0, 255))
    return scale, zp


def _quantize_u8(x, scale, zp):
    return jnp.clip(jnp.round(divide(x.astype(_F), scale)) + zp, 0, 255).astype(jnp.int32)


def _saturate(v, dtype: np.dtype):
    info = np.iinfo(dtype)
    return jnp.clip(jnp.round(v), info.min, info.max).astype(dtype)


def _dq(x, scale, zp):
    scale, zp = opaque(scale, zp)
    v = jnp.asarray(x).astype(_F)
    if zp is not None:
        v = v - jnp.asarray(zp).astype(_F)
    return opaque(v * jnp.asarray(scale).astype(_F))


def _requant(v, scale, zp, dtype: np.dtype | None = None):
    dtype = np.dtype(np.uint8) if zp is None and dtype is None else dtype or _dtype(zp)
    scale, zp = opaque(scale, zp)
    q = jnp.round(divide(v.astype(_F), jnp.asarray(scale).astype(_F).reshape(())))
    if zp is not None:
        q = q + jnp.asarray(zp).astype(_F).reshape(())
    return _saturate(q, dtype)


def _int_codes(b, zp):
    qb = jnp.asarray(b).astype(jnp.int32)
    return qb if zp is None else qb - _per(zp).astype(jnp.int32)


def _qgemm(a, b, b_scale, b_zp, live=None):
    """``a`` [M, K] float quantized per tensor (uint8, dynamic; over the rows where ``live`` when
    given) times integer ``b`` [K, N] with a per-tensor or per-column scale and zero point."""
    rng = a if live is None else jnp.where(live[:, None], a, jnp.zeros((), a.dtype))
    scale, zp = _dynamic_params(rng)
    qa = _quantize_u8(a, scale, zp) - zp.astype(jnp.int32)
    acc = jnp.matmul(qa, _int_codes(b, b_zp), preferred_element_type=jnp.int32)
    return acc.astype(_F) * (scale * _per(b_scale).astype(_F))


# ----------------------------------------------------------------------------- dynamic quantization


@lower("DynamicQuantizeMatMul", domain=MS)
def dynamic_quantize_matmul(inputs, attrs, ctx):
    a, b, b_scale = inputs[0], inputs[1], inputs[2]
    b_zp, bias = _opt(inputs, 3), _opt(inputs, 4)
    lead = a.shape[:-1]
    y = _qgemm(a.reshape(-1, a.shape[-1]), b, b_scale, b_zp).reshape(*lead, b.shape[-1])
    if bias is not None:
        y = y + jnp.asarray(bias).astype(_F)
    return (y,)


@lower("MatMulIntegerToFloat", domain=MS)
def matmul_integer_to_float(inputs, attrs, ctx):
    a, b, a_scale, b_scale = inputs[:4]
    a_zp, b_zp, bias = _opt(inputs, 4), _opt(inputs, 5), _opt(inputs, 6)
    qa = jnp.asarray(a).astype(jnp.int32)
    if a_zp is not None:
        qa = qa - jnp.asarray(a_zp).astype(jnp.int32).reshape(())
    acc = jnp.matmul(qa, _int_codes(b, b_zp), preferred_element_type=jnp.int32)
    scale = jnp.asarray(a_scale).astype(_F).reshape(()) * _per(b_scale).astype(_F)
    y = acc.astype(_F) * scale
    if bias is not None:
        y = y + jnp.asarray(bias).astype(_F)
    return (y.astype(_dtype(a_scale)),)


def _reverse_within(a, lens):
    """Reverse [T, B, ...] along time, each batch entry within its own length."""
    T, B = a.shape[0], a.shape[1]
    t = jnp.arange(T)[:, None]
    src = jnp.where(t < lens[None, :], lens[None, :] - 1 - t, t)
    return a[src, jnp.arange(B)[None, :]]


@lower("DynamicQuantizeLSTM", domain=MS)
def dynamic_quantize_lstm(inputs, attrs, ctx):
    """LSTM with int8/uint8 ``W`` [nd, I, 4H] and ``R`` [nd, H, 4H], per-direction (or
    per-column) scales and zero points in inputs 8-11 (rule 2)."""
    x, W, R = inputs[0], inputs[1], inputs[2]
    B_, lens, h0, c0, P = (_opt(inputs, k) for k in range(3, 8))
    w_s, w_zp, r_s, r_zp = (_opt(inputs, k) for k in range(8, 12))
    if w_s is None or r_s is None:
        raise NotImplementedError("a missing W_scale or R_scale is not lowered")
    if attrs.get("layout", 0):
        x = jnp.swapaxes(x, 0, 1)
        h0 = None if h0 is None else jnp.swapaxes(h0, 0, 1)
        c0 = None if c0 is None else jnp.swapaxes(c0, 0, 1)
    x = jnp.asarray(x)
    dt = x.dtype
    T, batch = x.shape[0], x.shape[1]
    nd = W.shape[0]
    H = int(attrs.get("hidden_size", R.shape[1]))
    B_ = jnp.zeros((nd, 8 * H), dt) if B_ is None else jnp.asarray(B_).astype(dt)
    h0 = jnp.zeros((nd, batch, H), dt) if h0 is None else jnp.asarray(h0).astype(dt)
    c0 = jnp.zeros((nd, batch, H), dt) if c0 is None else jnp.asarray(c0).astype(dt)
    P = jnp.zeros((nd, 3 * H), dt) if P is None else jnp.asarray(P).astype(dt)
    lens = jnp.full((batch,), T, jnp.int32) if lens is None else jnp.asarray(lens).astype(jnp.int32)
    acts = _activations(attrs, ["Sigmoid", "Tanh", "Tanh"], nd)
    clip = attrs.get("clip")
    couple = bool(attrs.get("input_forget", 0))
    direction = _s(attrs.get("direction", "forward"))
    reverses = [False, True] if nd == 2 else [direction == "reverse"]

    def per_dir(p, d):
        if p is None:
            return None
        p = jnp.asarray(p)
        return p.reshape(()) if p.ndim == 0 else p[d] if p.shape[0] == nd else p.reshape(-1)

    def cl(v):
        return v if clip is None else jnp.clip(v, -clip, clip)

    ys, hs, cs = [], [], []
    for d, reverse in enumerate(reverses):
        f, g, hact = acts[d]
        xd = _reverse_within(x, lens) if reverse else x
        Wb, Rb = B_[d, : 4 * H], B_[d, 4 * H :]
        ws, wz, rs, rz = per_dir(w_s, d), per_dir(w_zp, d), per_dir(r_s, d), per_dir(r_zp, d)
        xw = _qgemm(xd.reshape(-1, xd.shape[-1]), W[d], ws, wz).reshape(T, batch, 4 * H).astype(dt) + Wb
        Rd, Pd = R[d], P[d]

        def step(carry, inp, Rd=Rd, Pd=Pd, rs=rs, rz=rz, f=f, g=g, hact=hact, Rb=Rb):
            h, c = carry
            xt, t = inp
            live = jnp.logical_or(t == 0, lens >= t)
            pre = xt + _qgemm(h, Rd, rs, rz, live).astype(dt) + Rb
            i = f(cl(pre[:, :H] + Pd[:H] * c))
            fg = 1 - i if couple else f(cl(pre[:, 2 * H : 3 * H] + Pd[2 * H :] * c))
            ct = g(cl(pre[:, 3 * H :]))
            cn = fg * c + i * ct
            o = f(cl(pre[:, H : 2 * H] + Pd[H : 2 * H] * cn))
            hn = o * hact(cn)
            m = (t < lens)[:, None].astype(dt)
            return (m * hn + (1 - m) * h, m * cn + (1 - m) * c), m * hn

        (h_last, c_last), y = lax.scan(step, (h0[d], c0[d]), (xw, jnp.arange(T, dtype=jnp.int32)))
        ys.append(_reverse_within(y, lens) if reverse else y)
        hs.append(h_last)
        cs.append(c_last)
    Y, Yh, Yc = jnp.stack(ys, axis=1), jnp.stack(hs), jnp.stack(cs)
    if attrs.get("layout", 0):
        Y, Yh, Yc = jnp.transpose(Y, (2, 0, 1, 3)), jnp.swapaxes(Yh, 0, 1), jnp.swapaxes(Yc, 0, 1)
    return (Y, Yh, Yc)[: ctx.num_outputs]


# ----------------------------------------------------------------------------- QOperator


def _out_zp(inputs, k, like):
    zp = _opt(inputs, k)
    return zp if zp is not None else np.zeros((), _dtype(like))


@lower("QLinearAdd", domain=MS, prefer_static=(1, 2, 4, 5, 6, 7))
def qlinear_add(inputs, attrs, ctx):
    a, a_s, a_zp, b, b_s, b_zp, c_s = inputs[:7]
    c_zp = _opt(inputs, 7)
    return (_requant(_dq(a, a_s, a_zp) + _dq(b, b_s, b_zp), c_s, c_zp if c_zp is not None else a_zp),)


@lower("QLinearMul", domain=MS, prefer_static=(1, 2, 4, 5, 6, 7))
def qlinear_mul(inputs, attrs, ctx):
    a, a_s, a_zp, b, b_s, b_zp, c_s = inputs[:7]
    c_zp = _opt(inputs, 7)
    return (_requant(_dq(a, a_s, a_zp) * _dq(b, b_s, b_zp), c_s, c_zp if c_zp is not None else a_zp),)


_TABLE_FNS = {
    "QLinearSigmoid": lambda v, a: jax.nn.sigmoid(v),
    "QLinearLeakyRelu": lambda v, a: jnp.where(v >= 0, v, v * _F(a.get("alpha", 0.01))),
    "QLinearSoftsign": lambda v, a: v / (1 + jnp.abs(v)),
}


def _table_rule(op: str):
    def rule(inputs, attrs, ctx):
        x, x_s, x_zp, y_s = inputs[:4]
        y_zp = _out_zp(inputs, 4, x)
        first = -128 if _dtype(x) == np.int8 else 0
        codes = np.arange(256, dtype=np.int64) + first
        params = [x_s, x_zp, y_s, y_zp]
        if all(is_static(p) for p in params):  # rule 3: the reference's own table
            from mconv.engines.reference.ops import OpContext
            from mconv.engines.reference.ops import lookup as ref_lookup

            ref = ref_lookup(op, MS)
            assert ref is not None
            table = jnp.asarray(ref.forward([codes.astype(_dtype(x)), *params], dict(attrs), OpContext())[0])
        else:
            f = _TABLE_FNS[op](_dq(jnp.asarray(codes), x_s, x_zp), attrs).astype(_F)
            table = _requant(f, y_s, y_zp, _dtype(y_zp))
        return (table[jnp.asarray(x).astype(jnp.int32) - first],)

    return rule


for _op in _TABLE_FNS:
    lower(_op, domain=MS, prefer_static=(1, 2, 3, 4))(_table_rule(_op))


@lower("QLinearSoftmax", domain=MS, prefer_static=(1, 2, 3, 4))
def qlinear_softmax(inputs, attrs, ctx):
    """The reference's kernel in float32: exp of each code's distance below its row's largest
    times ``x_scale`` (``opset`` < 13: rows of the 2-D coercion at ``axis``), normalised,
    requantized."""
    x, x_s = jnp.asarray(inputs[0]), inputs[1]
    y_s, y_zp = inputs[3], _out_zp(inputs, 4, inputs[0])
    shape, axis = x.shape, int(attrs.get("axis", -1)) % max(x.ndim, 1)
    v = x.astype(jnp.int32)
    if int(attrs.get("opset", 13)) < 13:
        v, axis = v.reshape(math.prod(shape[:axis]), math.prod(shape[axis:])), 1
    d = (v - jnp.max(v, axis=axis, keepdims=True)).astype(_F)  # exact, <= 0
    e = jnp.exp(d * opaque(jnp.asarray(x_s).astype(_F).reshape(())))
    p = divide(e, jnp.sum(e, axis=axis, keepdims=True)).reshape(shape)
    return (_requant(p, y_s, y_zp),)


@lower("QLinearAveragePool", domain=MS, prefer_static=(1, 2, 3, 4))
def qlinear_average_pool(inputs, attrs, ctx):
    x, x_s, x_zp, y_s = inputs[:4]
    y_zp = _out_zp(inputs, 4, x)
    pool = lookup("AveragePool")
    assert pool is not None
    last = bool(attrs.get("channels_last", 0))
    a = {k: v for k, v in attrs.items() if k != "channels_last"}
    xf = _dq(x, x_s, x_zp)
    if last:
        xf = jnp.moveaxis(xf, -1, 1)
    y = pool.fn([xf], a, ctx)[0]
    if last:
        y = jnp.moveaxis(y, 1, -1)
    return (_requant(y, y_s, y_zp),)


@lower("QLinearGlobalAveragePool", domain=MS, prefer_static=(1, 2, 3, 4))
def qlinear_global_average_pool(inputs, attrs, ctx):
    x, x_s, x_zp, y_s = inputs[:4]
    y_zp = _out_zp(inputs, 4, x)
    last = bool(attrs.get("channels_last", 0))
    axes = tuple(range(1, x.ndim - 1)) if last else tuple(range(2, x.ndim))
    n = int(np.prod([x.shape[a] for a in axes]))
    total = jnp.sum(jnp.asarray(x).astype(jnp.int32), axis=axes, keepdims=True)  # exact
    x_s, x_zp, count = opaque(x_s, x_zp, _F(n))
    centred = total.astype(_F) - count * jnp.asarray(x_zp).astype(_F).reshape(())
    y = divide(centred, count) * jnp.asarray(x_s).astype(_F).reshape(())
    return (_requant(y, y_s, y_zp),)


@lower("QLinearConcat", domain=MS, prefer_static=(0, 1))
def qlinear_concat(inputs, attrs, ctx):
    y_s, y_zp = inputs[0], inputs[1]
    parts = [
        _requant(_dq(inputs[k], inputs[k + 1], inputs[k + 2]), y_s, y_zp) for k in range(2, len(inputs), 3)
    ]
    return (jnp.concatenate(parts, axis=int(attrs["axis"])),)


@lower("QGemm", domain=MS, prefer_static=(1, 2, 4, 5, 7, 8))
def qgemm(inputs, attrs, ctx):
    a, a_s, a_zp, b, b_s, b_zp = inputs[:6]
    c, y_s, y_zp = _opt(inputs, 6), _opt(inputs, 7), _opt(inputs, 8)
    trans_b = int(attrs.get("transB", 0))
    qa = jnp.asarray(a).astype(jnp.int32) - jnp.asarray(a_zp).astype(jnp.int32).reshape(())
    qb = jnp.asarray(b).astype(jnp.int32)
    zb = jnp.asarray(b_zp).astype(jnp.int32)
    if zb.size > 1:
        zb = zb.reshape(-1, 1) if trans_b else zb.reshape(1, -1)
    qb = qb - (zb if zb.size > 1 else zb.reshape(()))
    if int(attrs.get("transA", 0)):
        qa = qa.T
    if trans_b:
        qb = qb.T
    acc = jnp.matmul(qa, qb, preferred_element_type=jnp.int32)
    if c is not None:
        acc = acc + jnp.asarray(c).astype(jnp.int32)
    a_s, b_s = opaque(a_s, b_s)
    scale = jnp.asarray(a_s).astype(_F).reshape(()) * _F(attrs.get("alpha", 1.0)) * _per(b_s).astype(_F)
    y = acc.astype(_F) * scale
    if y_s is None:
        return (y,)
    return (_requant(y, y_s, y_zp),)


# ----------------------------------------------------------------------------- fused float ops


def _gelu_erf(x):
    return 0.5 * x * (1.0 + jax.scipy.special.erf(x / math.sqrt(2.0)))


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


@lower("Gelu", domain=MS)
def gelu(inputs, attrs, ctx):
    return (_gelu_erf(inputs[0]),)


@lower("BiasGelu", domain=MS)
def bias_gelu(inputs, attrs, ctx):
    x = inputs[0]
    return (_gelu_erf(x + jnp.asarray(inputs[1]).astype(x.dtype)),)


@lower("FastGelu", domain=MS)
def fast_gelu(inputs, attrs, ctx):
    x, b = inputs[0], _opt(inputs, 1)
    if b is not None:
        x = x + jnp.asarray(b).astype(x.dtype)
    return (_gelu_tanh(x),)


@lower("QuickGelu", domain=MS)
def quick_gelu(inputs, attrs, ctx):
    x = inputs[0]
    return (x * jax.nn.sigmoid(jnp.asarray(float(attrs.get("alpha", 1.702)), x.dtype) * x),)


@lower("BiasAdd", domain=MS)
def bias_add(inputs, attrs, ctx):
    x, bias, skip = inputs[0], inputs[1], inputs[2]
    return (x + jnp.asarray(bias).astype(x.dtype) + jnp.asarray(skip).astype(x.dtype),)


_FUSED_ACTS = {
    "Relu": lambda v, p: jnp.maximum(v, 0),
    "Tanh": lambda v, p: jnp.tanh(v),
    "Sigmoid": lambda v, p: jax.nn.sigmoid(v),
    "LeakyRelu": lambda v, p: jnp.where(v >= 0, v, v * (p[0] if p else 0.01)),
    "Clip": lambda v, p: jnp.clip(v, p[0], p[1]),
    "HardSigmoid": lambda v, p: jnp.clip(v * (p[0] if p else 0.2) + (p[1] if len(p) > 1 else 0.5), 0, 1),
}


@lower("FusedConv", domain=MS)
def fused_conv(inputs, attrs, ctx):
    x, w, b, z = inputs[0], inputs[1], _opt(inputs, 2), _opt(inputs, 3)
    act = _s(attrs.get("activation", ""))
    params = [float(p) for p in attrs.get("activation_params", [])]
    if act and act not in _FUSED_ACTS:
        raise NotImplementedError(f"activation '{act}' is not lowered")
    conv = lookup("Conv")
    assert conv is not None
    conv_attrs = {k: v for k, v in attrs.items() if k not in ("activation", "activation_params")}
    y = conv.fn([x, w, b], conv_attrs, ctx)[0]
    if z is not None:
        y = y + jnp.asarray(z).astype(y.dtype)
    if act:
        y = _FUSED_ACTS[act](y, params)
    return (y.astype(x.dtype),)


def _norm(inputs, attrs, ctx, *, simplified: bool, skip: bool):
    x = inputs[0]
    v = x
    k = 1
    if skip:
        v = v + jnp.asarray(inputs[1]).astype(x.dtype)
        k = 2
    gamma = inputs[k]
    beta = None if simplified else _opt(inputs, k + 1)
    bias = _opt(inputs, k + (1 if simplified else 2)) if skip else None
    if bias is not None:
        v = v + jnp.asarray(bias).astype(x.dtype)
    eps = float(attrs.get("epsilon", 1e-12 if skip else 1e-5))
    axis = int(attrs.get("axis", -1)) % x.ndim
    axes = tuple(range(axis, x.ndim))
    if simplified:
        var = jnp.mean(v * v, axis=axes, keepdims=True)
        mean = jnp.zeros_like(var)
        y = v * lax.rsqrt(var + eps)
    else:
        mean = jnp.mean(v, axis=axes, keepdims=True)
        var = jnp.mean(jnp.square(v - mean), axis=axes, keepdims=True)
        y = (v - mean) * lax.rsqrt(var + eps)
    y = y * jnp.asarray(gamma).astype(x.dtype)
    if beta is not None:
        y = y + jnp.asarray(beta).astype(x.dtype)
    inv = lax.rsqrt(var + eps)
    outs = [y.astype(x.dtype)]
    if skip:
        extra = [mean.astype(_F), inv.astype(_F), v.astype(x.dtype)]
    elif simplified:
        extra = [inv.astype(_F)]
    else:
        extra = [mean.astype(_F), inv.astype(_F)]
    return tuple(outs + extra[: max(0, ctx.num_outputs - 1)])


@lower("SkipLayerNormalization", domain=MS)
def skip_layer_norm(inputs, attrs, ctx):
    return _norm(inputs, attrs, ctx, simplified=False, skip=True)


@lower("SkipSimplifiedLayerNormalization", domain=MS)
def skip_simplified_layer_norm(inputs, attrs, ctx):
    return _norm(inputs, attrs, ctx, simplified=True, skip=True)


@lower("SimplifiedLayerNormalization")
@lower("SimplifiedLayerNormalization", domain=MS)
def simplified_layer_norm(inputs, attrs, ctx):
    return _norm(inputs, attrs, ctx, simplified=True, skip=False)


@lower("LayerNormalization", domain=MS)
def layer_norm_ms(inputs, attrs, ctx):
    return _norm(inputs, attrs, ctx, simplified=False, skip=False)


# ----------------------------------------------------------------------------- attention


def _heads(t, n: int):
    b, s, d = t.shape
    return t.reshape(b, s, n, d // n).transpose(0, 2, 1, 3)


def _attend(q, k, v, n, scale, key_mask, causal, filter_value):
    """``q`` [B,S,Dq], ``k`` [B,L,Dq], ``v`` [B,L,Dv]; ``key_mask`` [B, L] bool (True keeps)."""
    qh, kh, vh = _heads(q, n), _heads(k, n), _heads(v, n)
    if scale is None:
        scale = 1.0 / math.sqrt(qh.shape[-1])
    s = jnp.matmul(qh, jnp.swapaxes(kh, -1, -2), precision=_P) * jnp.asarray(scale, q.dtype)
    if key_mask is not None:
        s = jnp.where(key_mask[:, None, None, :], s, s + jnp.asarray(filter_value, s.dtype))
    if causal:
        S, L = s.shape[-2], s.shape[-1]
        keep = np.tril(np.ones((S, L), bool), k=L - S)
        s = jnp.where(keep, s, s + jnp.asarray(filter_value, s.dtype))
    y = jnp.matmul(jax.nn.softmax(s, axis=-1), vh, precision=_P)  # [B, n, S, dv]
    b, _, S, dv = y.shape
    return y.transpose(0, 2, 1, 3).reshape(b, S, n * dv)


@lower("Attention", domain=MS)
def attention(inputs, attrs, ctx):
    x, w, bias = inputs[0], inputs[1], _opt(inputs, 2)
    mask = _opt(inputs, 3)
    for k, what in ((4, "past"), (5, "attention_bias"), (6, "past_sequence_length")):
        if _opt(inputs, k) is not None:
            raise NotImplementedError(f"the {what} input is not lowered")
    if ctx.num_outputs > 1:
        raise NotImplementedError("the present output is not lowered")
    n = int(attrs["num_heads"])
    proj = jnp.matmul(x, jnp.asarray(w).astype(x.dtype), precision=_P)
    if bias is not None:
        proj = proj + jnp.asarray(bias).astype(x.dtype)
    sizes = [int(v) for v in attrs.get("qkv_hidden_sizes", [])] or [w.shape[1] // 3] * 3
    q, k, v = (
        proj[..., : sizes[0]],
        proj[..., sizes[0] : sizes[0] + sizes[1]],
        proj[..., sizes[0] + sizes[1] :],
    )
    key_mask = None
    B, L = x.shape[0], x.shape[1]
    if mask is not None:
        mask = jnp.asarray(mask)
        if mask.ndim == 2 and tuple(mask.shape) == (B, L):
            key_mask = mask != 0
        elif mask.ndim == 1 and mask.shape[0] == B:
            key_mask = jnp.arange(L)[None, :] < mask.astype(jnp.int32)[:, None]
        else:
            raise NotImplementedError(f"mask_index of shape {list(mask.shape)} is not lowered")
    scale = attrs.get("scale")
    scale = float(scale) if scale else None
    filt = float(attrs.get("mask_filter_value", -10000.0))
    return (_attend(q, k, v, n, scale, key_mask, bool(attrs.get("unidirectional", 0)), filt).astype(x.dtype),)


@lower("MultiHeadAttention", domain=MS)
def multi_head_attention(inputs, attrs, ctx):
    q, k, v = inputs[0], _opt(inputs, 1), _opt(inputs, 2)
    bias, kpm = _opt(inputs, 3), _opt(inputs, 4)
    if k is None or v is None or q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise NotImplementedError("packed or 4-D query/key/value is not lowered")
    for idx, what in ((5, "attention_bias"), (6, "past_key"), (7, "past_value")):
        if _opt(inputs, idx) is not None:
            raise NotImplementedError(f"the {what} input is not lowered")
    if ctx.num_outputs > 1:
        raise NotImplementedError("the present outputs are not lowered")
    dt = q.dtype
    qf, kf, vf = q, jnp.asarray(k).astype(dt), jnp.asarray(v).astype(dt)
    if bias is not None:
        dq, dk = q.shape[-1], k.shape[-1]
        b = jnp.asarray(bias).astype(dt)
        qf, kf, vf = qf + b[:dq], kf + b[dq : dq + dk], vf + b[dq + dk :]
    key_mask = None
    if kpm is not None:
        if tuple(kpm.shape) != (k.shape[0], k.shape[1]):
            raise NotImplementedError(f"key_padding_mask of shape {list(kpm.shape)} is not lowered")
        key_mask = jnp.asarray(kpm) != 0
    scale = attrs.get("scale")
    scale = float(scale) if scale else None
    filt = float(attrs.get("mask_filter_value", -10000.0))
    y = _attend(
        qf, kf, vf, int(attrs["num_heads"]), scale, key_mask, bool(attrs.get("unidirectional", 0)), filt
    )
    return (y.astype(dt),)


# ----------------------------------------------------------------------------- n-bit weights


def _unpack(packed, bits: int):
    """Codes of ``bits`` each from uint8 bytes along the last axis, the first in the low bits."""
    per = 8 // bits
    p = jnp.asarray(packed).astype(jnp.uint8)
    parts = [(p >> (bits * i)) & ((1 << bits) - 1) for i in range(per)]
    return jnp.stack(parts, axis=-1).reshape(*p.shape[:-1], p.shape[-1] * per)


@lower("MatMulNBits", domain=MS)
def matmul_nbits(inputs, attrs, ctx):
    a, b, scales = inputs[0], inputs[1], inputs[2]
    zp, g_idx, bias = _opt(inputs, 3), _opt(inputs, 4), _opt(inputs, 5)
    K, N = int(attrs["K"]), int(attrs["N"])
    bits, block = int(attrs.get("bits", 4)), int(attrs["block_size"])
    if bits not in (2, 4, 8):
        raise NotImplementedError(f"bits={bits} is not lowered")
    if g_idx is not None:
        raise NotImplementedError("g_idx is not lowered")
    k_blocks = (K + block - 1) // block
    codes = _unpack(jnp.asarray(b).reshape(N, k_blocks, -1), bits)[:, :, :block].astype(_F)
    s = jnp.asarray(scales).reshape(N, k_blocks).astype(_F)
    if zp is None:
        z = jnp.full((N, k_blocks), 2 ** (bits - 1), _F)
    elif _dtype(zp) == np.uint8:
        z = _unpack(jnp.asarray(zp).reshape(N, -1), bits)[:, :k_blocks].astype(_F)
    else:
        z = jnp.asarray(zp).reshape(N, k_blocks).astype(_F)
    wt = ((codes - z[..., None]) * s[..., None]).reshape(N, -1)[:, :K]  # [N, K]
    y = jnp.matmul(a, wt.T.astype(a.dtype), precision=_P)
    if bias is not None:
        y = y + jnp.asarray(bias).astype(a.dtype)
    return (y.astype(a.dtype),)


@lower("GatherBlockQuantized", domain=MS)
def gather_block_quantized(inputs, attrs, ctx):
    data, indices, scales = inputs[0], inputs[1], inputs[2]
    zp = _opt(inputs, 3)
    bits = int(attrs.get("bits", 4))
    block = int(attrs.get("block_size", 128))
    g_axis = int(attrs.get("gather_axis", 0)) % data.ndim
    q_axis = int(attrs.get("quantize_axis", 1)) % data.ndim
    declared = ctx.input_types[0] if ctx.input_types else None
    # rule 5: int4/uint4 tables arrive widened to int8/uint8; packed uint8 holds two codes a byte
    four_bit = declared in ("INT4", "UINT4") or (declared is None and _dtype(data) == np.int8)
    packed = _dtype(data) == np.uint8 and bits < 8 and declared not in ("UINT4",)
    if packed:
        codes = _unpack(data, bits).astype(_F)
        z = _unpack(zp, bits).astype(_F) if zp is not None else None
    else:
        codes = jnp.asarray(data).astype(_F)
        z = jnp.asarray(zp).astype(_F) if zp is not None else None
    if z is None:
        z = jnp.zeros((), _F) if four_bit else jnp.full((), 2 ** (bits - 1), _F)
    z = z.reshape(scales.shape) if z.ndim else z
    n = codes.shape[q_axis]

    def spread(p):
        if p.ndim == 0:
            return p
        return jnp.take(jnp.repeat(p, block, axis=q_axis), jnp.arange(n), axis=q_axis)

    table = (codes - spread(z)) * spread(jnp.asarray(scales).astype(_F))
    idx = jnp.asarray(indices).astype(jnp.int32)
    idx = jnp.where(idx < 0, idx + table.shape[g_axis], idx)
    return (jnp.take(table, idx, axis=g_axis).astype(_dtype(scales)),)
