"""Pass-through and quantization ops: Identity, Dropout (inference), DequantizeLinear,
QuantizeLinear, Trilu, OneHot.

Rules:

1. Dropout is the identity at inference; its optional mask output is all True.
2. DequantizeLinear: (x - zero_point) * scale, per tensor or per ``axis`` (default 1), and per
   block when ``block_size`` is set; the result has the scale's type.
3. QuantizeLinear rounds half to even and saturates to the zero point's integer type (uint8
   when absent).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
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
