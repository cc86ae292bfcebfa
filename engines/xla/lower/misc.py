"""Pass-through and small ops: Identity, Dropout (inference), EyeLike, BitShift, BitCast, Det,
TensorScatter.

Rules:

1. Dropout is the identity at inference; its optional mask output is all True.
2. EyeLike reads only its input's (static) shape; BitCast between types of one width is
   ``lax.bitcast_convert_type``; Det is ``jnp.linalg.det``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import onnx
from jax import lax
from mconv.engines.xla.lower import lower


@lower("Identity")
def identity(inputs, attrs, ctx):
    return (inputs[0],)


@lower("Dropout")
def dropout(inputs, attrs, ctx):
    x = inputs[0]
    outs = (x, jnp.ones(x.shape, dtype=bool))
    return outs[: ctx.num_outputs]


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
