"""Pass-through and quantization ops: Identity, Dropout (inference), DequantizeLinear,
QuantizeLinear, Trilu, OneHot.

Rules:

1. Dropout is the identity at inference; its optional mask output is all True.
2. DequantizeLinear: (x - zero_point) * scale, per tensor or per ``axis`` (default 1), and per
   block when ``block_size`` is set; the result has the scale's type.
3. QuantizeLinear rounds half to even and saturates to the zero point's integer type (uint8
   when absent).
4. DynamicQuantizeLinear: uint8 with the range [min(0, x.min()), max(0, x.max())] over 255
   steps (scale 1 for an all-zero input). MatMulInteger accumulates in int32.
5. EyeLike reads only its input's (static) shape; BitCast between types of one width is
   ``lax.bitcast_convert_type``; Det is ``jnp.linalg.det``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import onnx
from jax import lax
from mconv.targets.xla.lower import is_static, lower


@lower("Identity")
def identity(inputs, attrs, ctx):
    return (inputs[0],)


@lower("Dropout")
def dropout(inputs, attrs, ctx):
    x = inputs[0]
    outs = (x, jnp.ones(x.shape, dtype=bool))
    return outs[: ctx.num_outputs]


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
    q = jnp.round(x.astype(jnp.float32) / _per_axis(scale, x, attrs).astype(jnp.float32))
    if zp is not None:
        q = q + _per_axis(zp, x, attrs).astype(jnp.float32)
    return (jnp.clip(q, info.min, info.max).astype(out_dtype),)


@lower("Trilu", static=(1,))
def trilu(inputs, attrs, ctx):
    x = inputs[0]
    k = int(np.asarray(inputs[1]).reshape(-1)[0]) if len(inputs) > 1 and inputs[1] is not None else 0
    return (jnp.triu(x, k) if attrs.get("upper", 1) else jnp.tril(x, k),)


@lower("OneHot", static=(1,))
def one_hot(inputs, attrs, ctx):
    idx, depth, values = inputs
    n = int(np.asarray(depth).reshape(-1)[0])
    axis = attrs.get("axis", -1)
    idx = jnp.asarray(idx)
    idx = jnp.where(idx < 0, idx + n, idx)
    hot = jnp.moveaxis(idx[..., None] == jnp.arange(n), -1, axis if axis >= 0 else idx.ndim + 1 + axis)
    values = jnp.asarray(values)
    return (jnp.where(hot, values[1], values[0]),)


def _onnx_dtype(code: int) -> np.dtype:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(code)))


@lower("EyeLike", shape_only=True)
def eye_like(inputs, attrs, ctx):
    x = inputs[0]
    dtype = _onnx_dtype(attrs["dtype"]) if "dtype" in attrs else np.dtype(x.dtype)
    n, m = x.shape
    xp = np if isinstance(n, (int, np.integer)) and isinstance(m, (int, np.integer)) else jnp
    return (xp.eye(n, m, k=int(attrs.get("k", 0)), dtype=dtype),)


@lower("BitShift")
def bit_shift(inputs, attrs, ctx):
    x = jnp.asarray(inputs[0])
    y = jnp.asarray(inputs[1]).astype(x.dtype)
    if attrs["direction"] == "LEFT":
        return (jnp.left_shift(x, y),)
    return (jnp.right_shift(x, y),)


@lower("BitCast")
def bit_cast(inputs, attrs, ctx):
    x = jnp.asarray(inputs[0])
    to = _onnx_dtype(attrs["to"])
    if to.itemsize != x.dtype.itemsize:
        raise NotImplementedError("BitCast between types of different widths")
    return (lax.bitcast_convert_type(x, to),)


@lower("Det")
def det(inputs, attrs, ctx):
    return (jnp.linalg.det(inputs[0]),)


@lower("DynamicQuantizeLinear")
def dynamic_quantize_linear(inputs, attrs, ctx):
    x = jnp.asarray(inputs[0]).astype(jnp.float32)
    lo = jnp.minimum(0.0, jnp.min(x))
    hi = jnp.maximum(0.0, jnp.max(x))
    scale = jnp.where(hi != lo, (hi - lo) / 255.0, 1.0).astype(jnp.float32)
    zp = jnp.clip(jnp.round(0.0 - lo / scale), 0, 255)
    y = jnp.clip(jnp.round(x / scale) + zp, 0, 255).astype(jnp.uint8)
    return y, scale, zp.astype(jnp.uint8)


def _int_minus(x, zp):
    x = jnp.asarray(x).astype(jnp.int32)
    return x if zp is None else x - jnp.asarray(zp).astype(jnp.int32)


@lower("MatMulInteger")
def matmul_integer(inputs, attrs, ctx):
    a, b = inputs[0], inputs[1]
    a_zp = inputs[2] if len(inputs) > 2 else None
    b_zp = inputs[3] if len(inputs) > 3 else None
    if a_zp is not None and np.ndim(a_zp) == 1 and np.size(a_zp) > 1:  # per-row zero point of A
        a_zp = jnp.asarray(a_zp).reshape(-1, 1)
    return (jnp.matmul(_int_minus(a, a_zp), _int_minus(b, b_zp), preferred_element_type=jnp.int32),)


@lower("TensorScatter")
def tensor_scatter(inputs, attrs, ctx):
    cache, update = jnp.asarray(inputs[0]), jnp.asarray(inputs[1])
    idx = inputs[2] if len(inputs) > 2 and inputs[2] is not None else None
    axis = int(attrs.get("axis", -2)) % cache.ndim
    if axis == 0:
        raise NotImplementedError("TensorScatter along the batch axis")
    length, steps = cache.shape[axis], update.shape[axis]
    start = jnp.zeros(cache.shape[0], jnp.int32) if idx is None else jnp.asarray(idx).astype(jnp.int32)
    pos = start[:, None] + jnp.arange(steps, dtype=jnp.int32)[None, :]  # (batch, steps)
    if attrs.get("mode", "linear") == "circular":
        pos = pos % length
    shape = [1] * cache.ndim
    shape[0], shape[axis] = cache.shape[0], steps
    grid = list(np.indices(update.shape, sparse=True))
    grid[axis] = pos.reshape(shape)
    return (cache.at[tuple(grid)].set(update.astype(cache.dtype)),)
