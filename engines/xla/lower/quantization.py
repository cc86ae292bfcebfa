"""Quantization: DequantizeLinear, QuantizeLinear, DynamicQuantizeLinear and the integer and
quantized-linear products (MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv).

Rules:

1. DequantizeLinear: (x - zero_point) * scale, per tensor or per ``axis`` (default 1), and per
   block when ``block_size`` is set; the result has the scale's type.
2. QuantizeLinear rounds half to even and saturates to the zero point's integer type (uint8
   when absent).
3. DynamicQuantizeLinear: uint8 with the range [min(0, x.min()), max(0, x.max())] over 255
   steps (scale 1 for an all-zero input). MatMulInteger accumulates in int32.
4. ConvInteger and QLinearConv convolve the codes minus their zero points (per output channel
   for the weights) with an int32 accumulator (``lax.conv_general_dilated``, padding as Conv);
   QLinearConv adds its int32 bias and requantizes like QLinearMatMul.
5. QLinearMatMul accumulates the codes minus their zero points in int32, then requantizes
   (float32 scale, round half to even, saturate to the output zero point's type).
6. Quotients go through :func:`divide` and scalar constants through :func:`opaque`: XLA
   would otherwise multiply by a divisor's reciprocal, or fold a scalar factor of the dividend
   into the divisor (``(a * s) / y`` into ``a * (s / y)``), neither the quotient ONNX asks for.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax
from mconv.engines.xla.lower import is_static, lower
from mconv.engines.xla.lower.conv import conv_pads


def opaque(*values):
    """``values`` behind ``lax.optimization_barrier``: XLA's simplifier reassociates products
    and quotients with scalars (``(a * s1) * (b * s2)`` into ``a * (b * (s1 * s2))``, ``x / c``
    into ``x * (1 / c)``, ``(a * s) / y`` into ``a * (s / y)``), which moves a float32 result by
    an ulp and a requantized code by one."""
    arrays = [None if v is None else jnp.asarray(v) for v in values]
    present = tuple(a for a in arrays if a is not None)
    hidden = iter(lax.optimization_barrier(present) if present else ())
    out = tuple(None if a is None else next(hidden) for a in arrays)
    return out if len(out) != 1 else out[0]


def divide(a, b):
    """``a / b`` rounded as IEEE division, element by element: XLA's CPU backend otherwise
    multiplies by the reciprocal of a divisor broadcast from a scalar (22.5 for
    ``0.90000004 / 0.04``, where the quotient is 22.500002), so both operands reach the
    division at the quotient's full shape, behind :func:`opaque`."""
    a, b = jnp.asarray(a), jnp.asarray(b)
    shape = jnp.broadcast_shapes(a.shape, b.shape)
    a, b = opaque(jnp.broadcast_to(a, shape), jnp.broadcast_to(b, shape))
    return a / b


def _per_axis(v, x, attrs):
    """Broadcast a scale/zero point against ``x`` (per tensor, per axis, or per block)."""
    v = jnp.asarray(v)
    if v.ndim == 0 or v.size == 1 and v.ndim <= 1:
        return v.reshape(())
    axis = attrs.get("axis", 1)
    axis = axis + x.ndim if axis < 0 else axis
    block = attrs.get("block_size", 0)
    if block:
        return jnp.repeat(v, block, axis=axis)[tuple(slice(0, n) for n in x.shape)]
    shape = [1] * x.ndim
    shape[axis] = -1
    return v.reshape(shape)


@lower("DequantizeLinear")
def dequantize_linear(inputs, attrs, ctx):
    x, scale = inputs[0], inputs[1]
    zp = inputs[2] if len(inputs) > 2 else None
    xf = jnp.asarray(x).astype(jnp.float32)
    if zp is not None:
        xf = xf - _per_axis(zp, x, attrs).astype(jnp.float32)
    s = _per_axis(scale, x, attrs)
    return ((xf * s.astype(jnp.float32)).astype(jnp.asarray(scale).dtype),)


@lower("QuantizeLinear")
def quantize_linear(inputs, attrs, ctx):
    x, scale = inputs[0], inputs[1]
    zp = inputs[2] if len(inputs) > 2 else None
    out_dtype = np.dtype(
        np.asarray(zp).dtype
        if is_static(zp) and zp is not None
        else (zp.dtype if zp is not None else np.uint8)
    )
    info = np.iinfo(out_dtype)
    q = jnp.round(divide(x.astype(jnp.float32), _per_axis(scale, x, attrs).astype(jnp.float32)))
    if zp is not None:
        q = q + _per_axis(zp, x, attrs).astype(jnp.float32)
    return (jnp.clip(q, info.min, info.max).astype(out_dtype),)


@lower("DynamicQuantizeLinear")
def dynamic_quantize_linear(inputs, attrs, ctx):
    x = jnp.asarray(inputs[0]).astype(jnp.float32)
    lo = jnp.minimum(0.0, jnp.min(x))
    hi = jnp.maximum(0.0, jnp.max(x))
    scale = jnp.where(hi != lo, (hi - lo) / opaque(jnp.float32(255)), 1.0).astype(jnp.float32)
    zp = jnp.clip(jnp.round(0.0 - lo / scale), 0, 255)
    y = jnp.clip(jnp.round(divide(x, scale)) + zp, 0, 255).astype(jnp.uint8)
    return y, scale, zp.astype(jnp.uint8)


def _int_minus(x, zp, shape=None):
    x = jnp.asarray(x).astype(jnp.int32)
    if zp is None:
        return x
    zp = jnp.asarray(zp).astype(jnp.int32)
    if shape is not None and zp.size > 1:
        zp = zp.reshape(shape)
    return x - zp


def _int_conv(x, w, attrs):
    """The int32 accumulator of a convolution of integer codes (zero points already removed)."""
    r = w.ndim - 2
    kernel = list(attrs.get("kernel_shape", w.shape[2:]))
    strides = list(attrs.get("strides", [1] * r))
    dilations = list(attrs.get("dilations", [1] * r))
    pads = conv_pads(attrs, list(x.shape[2:]), kernel, strides, dilations)
    return lax.conv_general_dilated(
        x,
        w,
        window_strides=strides,
        padding=pads,
        rhs_dilation=dilations,
        feature_group_count=int(attrs.get("group", 1)),
        preferred_element_type=jnp.int32,
    )


@lower("MatMulInteger")
def matmul_integer(inputs, attrs, ctx):
    a, b = inputs[0], inputs[1]
    a_zp = inputs[2] if len(inputs) > 2 else None
    b_zp = inputs[3] if len(inputs) > 3 else None
    if a_zp is not None and np.ndim(a_zp) == 1 and np.size(a_zp) > 1:  # per-row zero point of A
        a_zp = jnp.asarray(a_zp).reshape(-1, 1)
    return (jnp.matmul(_int_minus(a, a_zp), _int_minus(b, b_zp), preferred_element_type=jnp.int32),)


@lower("ConvInteger")
def conv_integer(inputs, attrs, ctx):
    x, w = inputs[0], inputs[1]
    x_zp = inputs[2] if len(inputs) > 2 else None
    w_zp = inputs[3] if len(inputs) > 3 else None
    per_oc = (-1,) + (1,) * (jnp.ndim(w) - 1)
    return (_int_conv(_int_minus(x, x_zp), _int_minus(w, w_zp, per_oc), attrs),)


@lower("QLinearConv", prefer_static=(1, 2, 4, 5, 6, 7))
def qlinear_conv(inputs, attrs, ctx):
    x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp = inputs[:8]
    bias = inputs[8] if len(inputs) > 8 else None
    per_oc = (-1,) + (1,) * (jnp.ndim(w) - 1)
    acc = _int_conv(_int_minus(x, x_zp), _int_minus(w, w_zp, per_oc), attrs)
    if bias is not None:
        acc = acc + jnp.asarray(bias).astype(jnp.int32).reshape(1, -1, *([1] * (acc.ndim - 2)))
    ws = jnp.asarray(w_s).astype(jnp.float32)
    if ws.size > 1:
        ws = ws.reshape(1, -1, *([1] * (acc.ndim - 2)))
    scale = jnp.asarray(x_s).astype(jnp.float32) * ws / jnp.asarray(y_s).astype(jnp.float32)
    out_dtype = jnp.asarray(y_zp).dtype
    info = jnp.iinfo(out_dtype)
    y = jnp.round(acc.astype(jnp.float32) * scale) + jnp.asarray(y_zp).astype(jnp.float32)
    return (jnp.clip(y, info.min, info.max).astype(out_dtype),)


@lower("QLinearMatMul", prefer_static=(1, 2, 4, 5, 6, 7))
def qlinear_matmul(inputs, attrs, ctx):
    """int32 accumulation of the zero-point-free codes, requantized (half to even, saturated)."""
    a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = inputs
    ai = jnp.asarray(a).astype(jnp.int32) - jnp.asarray(a_zp).astype(jnp.int32).reshape(
        (-1, 1) if jnp.size(a_zp) > 1 else ()
    )
    bz = jnp.asarray(b_zp).astype(jnp.int32)
    bi = jnp.asarray(b).astype(jnp.int32) - (bz.reshape(-1) if bz.size > 1 else bz.reshape(()))
    acc = jnp.matmul(ai, bi, preferred_element_type=jnp.int32)
    bs = jnp.asarray(b_s).astype(jnp.float32)
    bs = bs.reshape(-1) if bs.size > 1 else bs.reshape(())
    as_ = jnp.asarray(a_s).astype(jnp.float32)
    as_ = as_.reshape(-1, 1) if as_.size > 1 else as_.reshape(())
    scale = as_ * bs / jnp.asarray(y_s).astype(jnp.float32)
    out_dtype = jnp.asarray(y_zp).dtype
    info = jnp.iinfo(out_dtype)
    y = jnp.round(acc.astype(jnp.float32) * scale) + jnp.asarray(y_zp).astype(jnp.float32)
    return (jnp.clip(y, info.min, info.max).astype(out_dtype),)
