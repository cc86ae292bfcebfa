"""Op family: quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear and the
integer and quantized-linear products (MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv).

Rules
-----
1. The scale (and zero point) is per tensor (scalar), per axis (1-D along ``axis``) or per block
   (``block_size`` > 0: each scale covers ``block_size`` consecutive elements along ``axis``).
   Integer targets round ``x / scale`` half to even, then add the zero point, and saturate to the
   type's range; float8 targets saturate to the largest finite value when ``saturate=1``. The
   output type is the zero point's, else ``output_dtype``, else uint8.
2. The integer products subtract the zero points in int32 and accumulate exactly; the
   quantized-linear ops requantize the int32 result with the output scale and zero point.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from mconv.engines.reference.ops import lookup, register, register_vjp
from mconv.engines.reference.ops.misc import _onnx_dtype


def _is_float8(dtype: np.dtype) -> bool:
    return dtype.name.startswith(("float8", "float4"))


def _broadcast_param(p: np.ndarray, x: np.ndarray, axis: int, block_size: int) -> np.ndarray:
    """A scale or zero point laid out to broadcast against ``x`` (per tensor, axis or block)."""
    if p.ndim == 0 or p.size == 1 and block_size == 0:
        return p.reshape(())
    axis = axis % x.ndim
    if block_size > 0:
        p = np.repeat(p, block_size, axis=axis)
        return np.take(p, np.arange(x.shape[axis]), axis=axis)
    shape = [1] * x.ndim
    shape[axis] = p.size
    return p.reshape(shape)


def _quantize_to(v: np.ndarray, dtype: np.dtype, saturate: bool) -> np.ndarray:
    if _is_float8(dtype):
        if saturate:
            finfo = ml_dtypes.finfo(dtype)
            big = float(finfo.max)
            v = np.where(np.isinf(v), np.sign(v) * big, v)
            v = np.clip(v, -big, big)
        return v.astype(dtype)
    info: ml_dtypes.iinfo | np.iinfo
    try:
        info = ml_dtypes.iinfo(dtype)
    except ValueError:
        info = np.iinfo(dtype)
    return np.clip(np.rint(v), info.min, info.max).astype(dtype)


@register("QuantizeLinear")
def quantize_linear(inputs, attrs, ctx):
    x, scale = inputs[0], inputs[1]
    zp = inputs[2] if len(inputs) > 2 else None
    if zp is not None:
        out_dtype = zp.dtype
    elif attrs.get("output_dtype"):
        out_dtype = _onnx_dtype(attrs["output_dtype"])
    else:
        out_dtype = np.dtype(np.uint8)
    axis, block = int(attrs.get("axis", 1)), int(attrs.get("block_size", 0))
    s = _broadcast_param(scale, x, axis, block).astype(np.float32)
    v = x.astype(np.float32) / s
    if not _is_float8(np.dtype(out_dtype)):
        # saturate(round(x / scale) + zero_point): the rounding comes BEFORE the zero point (a
        # quotient of exactly k + 0.5 rounds to even first; adding the zero point first moves the tie).
        v = np.rint(v).astype(np.float64)
    if zp is not None:
        v = v + _broadcast_param(zp, x, axis, block).astype(v.dtype)
    return (_quantize_to(v, np.dtype(out_dtype), bool(attrs.get("saturate", 1))),)


@register("DequantizeLinear")
def dequantize_linear(inputs, attrs, ctx):
    x, scale = inputs[0], inputs[1]
    zp = inputs[2] if len(inputs) > 2 else None
    axis, block = int(attrs.get("axis", 1)), int(attrs.get("block_size", 0))
    v = x.astype(np.float32)
    if zp is not None:
        v = v - _broadcast_param(zp, x, axis, block).astype(np.float32)
    out_dtype = _onnx_dtype(attrs["output_dtype"]) if attrs.get("output_dtype") else scale.dtype
    return ((v * _broadcast_param(scale, x, axis, block).astype(np.float32)).astype(out_dtype),)


@register_vjp("DequantizeLinear")
def dequantize_linear_vjp(inputs, attrs, outputs, grads, ctx):
    """The codes and the zero point are integers: no gradient. The scale's is the cotangent times
    ``x - zero_point``, summed over the elements each scale entry multiplies (per tensor, axis or
    block: the element-to-entry map is the forward's own broadcast of the entries' indices)."""
    x, scale = inputs[0], inputs[1]
    g = grads[0]
    out: list = [None] * len(inputs)
    if g is None or not np.issubdtype(scale.dtype, np.floating):
        return out
    zp = inputs[2] if len(inputs) > 2 else None
    axis, block = int(attrs.get("axis", 1)), int(attrs.get("block_size", 0))
    v = x.astype(np.float64)
    if zp is not None:
        v = v - _broadcast_param(zp, x, axis, block).astype(np.float64)
    which = _broadcast_param(np.arange(scale.size).reshape(scale.shape), x, axis, block)
    which = np.broadcast_to(which, x.shape)
    total = np.bincount(which.ravel(), weights=(np.asarray(g, np.float64) * v).ravel(), minlength=scale.size)
    out[1] = total.reshape(scale.shape).astype(scale.dtype)
    return out


@register("DynamicQuantizeLinear")
def dynamic_quantize_linear(inputs, attrs, ctx):
    x = inputs[0].astype(np.float32)
    lo, hi = min(0.0, float(x.min())), max(0.0, float(x.max()))
    # float32 arithmetic, as ORT computes it (a float64 quotient rounds to another scale by an ulp,
    # and a code flips downstream)
    scale = (np.float32(hi) - np.float32(lo)) / np.float32(255.0) if hi != lo else np.float32(1.0)
    zp = np.clip(np.rint(0.0 - lo / scale), 0, 255).astype(np.uint8)
    y = np.clip(np.rint(x / scale) + zp, 0, 255).astype(np.uint8)
    return y, np.array(scale, dtype=np.float32), np.array(zp, dtype=np.uint8)


def _int_minus(x, zp):
    x = x.astype(np.int32)
    return x if zp is None else x - zp.astype(np.int32)


@register("MatMulInteger")
def matmul_integer(inputs, attrs, ctx):
    a, b = inputs[0], inputs[1]
    a_zp = inputs[2] if len(inputs) > 2 else None
    b_zp = inputs[3] if len(inputs) > 3 else None
    if a_zp is not None and a_zp.ndim == 1 and a_zp.size > 1:  # per-row zero point of A
        a_zp = a_zp.reshape(-1, 1)
    return (np.matmul(_int_minus(a, a_zp), _int_minus(b, b_zp)).astype(np.int32),)


def _conv_forward(x, w, attrs, ctx):
    conv = lookup("Conv")
    if conv is None:
        raise NotImplementedError("Conv kernel is not registered")
    return conv.forward([x, w, None], attrs, ctx)[0]


@register("ConvInteger")
def conv_integer(inputs, attrs, ctx):
    x, w = inputs[0], inputs[1]
    x_zp = inputs[2] if len(inputs) > 2 else None
    w_zp = inputs[3] if len(inputs) > 3 else None
    if w_zp is not None and w_zp.size > 1:
        w_zp = w_zp.reshape(-1, *([1] * (w.ndim - 1)))
    xf = _int_minus(x, x_zp).astype(np.float64)
    wf = _int_minus(w, w_zp).astype(np.float64)
    return (np.rint(_conv_forward(xf, wf, attrs, ctx)).astype(np.int32),)


@register("QLinearMatMul")
def qlinear_matmul(inputs, attrs, ctx):
    a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = inputs
    af = (a.astype(np.float64) - a_zp.astype(np.float64)) * a_s.astype(np.float64)
    bf = (
        b.astype(np.float64) - b_zp.astype(np.float64).reshape(-1)[None, :]
        if b_zp.size > 1
        else b.astype(np.float64) - b_zp.astype(np.float64)
    ) * (b_s.astype(np.float64).reshape(-1)[None, :] if b_s.size > 1 else b_s.astype(np.float64))
    y = np.matmul(af, bf) / y_s.astype(np.float64) + y_zp.astype(np.float64)
    return (_quantize_to(y, y_zp.dtype, True),)


@register("QLinearConv")
def qlinear_conv(inputs, attrs, ctx):
    x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp = inputs[:8]
    bias = inputs[8] if len(inputs) > 8 else None
    per_oc = (-1,) + (1,) * (w.ndim - 1)
    xf = x.astype(np.float64) - x_zp.astype(np.float64)
    wf = w.astype(np.float64) - (w_zp.astype(np.float64).reshape(per_oc) if w_zp.size > 1 else w_zp)
    acc = _conv_forward(xf, wf, attrs, ctx)  # integer-valued accumulator
    if bias is not None:
        acc = acc + bias.astype(np.float64).reshape(1, -1, *([1] * (x.ndim - 2)))
    ws = w_s.astype(np.float64).reshape(1, -1, *([1] * (x.ndim - 2))) if w_s.size > 1 else w_s
    y = acc * (x_s.astype(np.float64) * ws) / y_s.astype(np.float64) + y_zp.astype(np.float64)
    return (_quantize_to(y, y_zp.dtype, True),)
