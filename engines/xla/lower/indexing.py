"""Indexing ops: Gather, GatherElements, GatherND, ScatterND, ScatterElements (and the older
Scatter), OneHot.

Rules:

1. Negative indices count from the end of their axis; they are normalized before indexing.
2. GatherND with ``batch_dims=b``: the first ``b`` axes of data and indices are shared; the
   last indices axis (of length k) addresses data's axes ``b .. b+k-1``.
3. Scatters lower to ``x.at[where]``: ``set`` for reduction ``none`` (with duplicate indices
   the result is unspecified, as in ONNX), ``add``, ``multiply``, ``max`` and ``min``.
4. Gather of static data at static indices (shape arithmetic) is evaluated with numpy, so a
   symbolic dimension passes through; traced gathers clip (indices were normalized).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from mconv.engines.xla.lower import is_static, lower
from mconv.engines.xla.lower.shape import _norm_axis


def _norm(idx, n):
    idx = jnp.asarray(idx)
    return jnp.where(idx < 0, idx + n, idx)


def _apply(data, where: tuple, updates, reduction: str):
    at = jnp.asarray(data).at[where]
    updates = jnp.asarray(updates).astype(jnp.asarray(data).dtype)
    if reduction == "none":
        return at.set(updates)
    if reduction == "add":
        return at.add(updates)
    if reduction == "mul":
        return at.multiply(updates)
    if reduction == "max":
        return at.max(updates)
    if reduction == "min":
        return at.min(updates)
    raise NotImplementedError(f"reduction {reduction!r}")


@lower("GatherND")
def gather_nd(inputs, attrs, ctx):
    x, idx = jnp.asarray(inputs[0]), jnp.asarray(inputs[1])
    b = attrs.get("batch_dims", 0)
    k = idx.shape[-1]
    lead = idx.shape[:-1]
    batch = [jnp.arange(x.shape[i]).reshape((1,) * i + (-1,) + (1,) * (len(lead) - i - 1)) for i in range(b)]
    cols = [jnp.broadcast_to(_norm(idx[..., j], x.shape[b + j]), lead) for j in range(k)]
    return (x[tuple(batch + cols)],)


@lower("ScatterND")
def scatter_nd(inputs, attrs, ctx):
    data, idx, updates = inputs
    data, idx = jnp.asarray(data), jnp.asarray(idx)
    where = tuple(_norm(idx[..., j], data.shape[j]) for j in range(idx.shape[-1]))
    return (_apply(data, where, updates, attrs.get("reduction", "none")),)


def _scatter_elements(inputs, attrs, reduction):
    data, idx, updates = (jnp.asarray(v) for v in inputs)
    axis = attrs.get("axis", 0)
    axis = axis + data.ndim if axis < 0 else axis
    grid = list(np.indices(idx.shape, sparse=True))
    grid[axis] = _norm(idx, data.shape[axis])
    return (_apply(data, tuple(grid), updates, reduction),)


@lower("ScatterElements")
def scatter_elements(inputs, attrs, ctx):
    return _scatter_elements(inputs, attrs, attrs.get("reduction", "none"))


@lower("Scatter")
def scatter(inputs, attrs, ctx):
    return _scatter_elements(inputs, attrs, "none")


@lower("Gather")
def gather(inputs, attrs, ctx):
    x, idx = inputs
    axis = _norm_axis(attrs.get("axis", 0), np.ndim(x))
    if is_static(x) and is_static(idx):
        # Object arrays (symbolic shapes) give a bare element for a scalar index: re-wrap it.
        return (np.asarray(np.take(x, np.asarray(idx), axis=axis), dtype=np.asarray(x).dtype),)
    n = x.shape[axis]
    idx = jnp.asarray(idx)
    idx = jnp.where(idx < 0, idx + n, idx)
    return (jnp.take(jnp.asarray(x), idx, axis=axis, mode="clip"),)


@lower("GatherElements")
def gather_elements(inputs, attrs, ctx):
    x, idx = inputs
    axis = _norm_axis(attrs.get("axis", 0), x.ndim)
    idx = jnp.asarray(idx)
    idx = jnp.where(idx < 0, idx + x.shape[axis], idx)
    return (jnp.take_along_axis(x, idx, axis=axis, mode="clip"),)


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
