"""Reductions: Reduce*, ArgMax/ArgMin, CumSum, TopK.

Rules:

1. Axes come from the ``axes`` attribute (ReduceSum before 13, the others before 18) or from
   the static second input; no axes reduce everything unless ``noop_with_empty_axes``.
2. ``keepdims`` defaults to 1. ArgMax/ArgMin give int64, first index unless
   ``select_last_index``.
3. CumProd (like CumSum) needs its axis static; exclusive shifts in a 1.
4. TopK needs k static; ties keep the lower index first (lax.top_k's order).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from mconv.engines.xla.lower import lower, static_ints


def _axes(inputs, attrs, x):
    axes = attrs.get("axes")
    if len(inputs) > 1 and inputs[1] is not None:
        axes = static_ints(inputs[1])
    if axes is None or len(axes) == 0:
        return None if not attrs.get("noop_with_empty_axes", 0) else ()
    return tuple(int(a) + x.ndim if int(a) < 0 else int(a) for a in axes)


def _reduce(fn):
    def rule(inputs, attrs, ctx):
        x = inputs[0]
        axes = _axes(inputs, attrs, x)
        if axes == ():
            return (x,)
        return (fn(x, axes, bool(attrs.get("keepdims", 1))),)

    return rule


_REDUCE = {
    "ReduceSum": lambda x, a, k: jnp.sum(x, axis=a, keepdims=k),
    "ReduceMean": lambda x, a, k: jnp.mean(x, axis=a, keepdims=k),
    "ReduceMax": lambda x, a, k: jnp.max(x, axis=a, keepdims=k),
    "ReduceMin": lambda x, a, k: jnp.min(x, axis=a, keepdims=k),
    "ReduceProd": lambda x, a, k: jnp.prod(x, axis=a, keepdims=k),
    "ReduceL1": lambda x, a, k: jnp.sum(jnp.abs(x), axis=a, keepdims=k),
    "ReduceL2": lambda x, a, k: jnp.sqrt(jnp.sum(jnp.square(x), axis=a, keepdims=k)),
    "ReduceSumSquare": lambda x, a, k: jnp.sum(jnp.square(x), axis=a, keepdims=k),
    "ReduceLogSum": lambda x, a, k: jnp.log(jnp.sum(x, axis=a, keepdims=k)),
    "ReduceLogSumExp": lambda x, a, k: jax.nn.logsumexp(x, axis=a, keepdims=k),
}

for _op, _fn in _REDUCE.items():
    lower(_op, static=(1,))(_reduce(_fn))


def _arg(fn):
    def rule(inputs, attrs, ctx):
        x = inputs[0]
        axis = attrs.get("axis", 0)
        axis = axis + x.ndim if axis < 0 else axis
        keep = bool(attrs.get("keepdims", 1))
        if attrs.get("select_last_index", 0):
            n = x.shape[axis]
            idx = n - 1 - fn(jnp.flip(x, axis=axis), axis=axis, keepdims=keep)
        else:
            idx = fn(x, axis=axis, keepdims=keep)
        return (idx.astype(jnp.int64),)

    return rule


lower("ArgMax")(_arg(jnp.argmax))
lower("ArgMin")(_arg(jnp.argmin))


@lower("CumSum", static=(1,))
def cumsum(inputs, attrs, ctx):
    x = inputs[0]
    axis = int(np.asarray(inputs[1]).reshape(-1)[0])
    axis = axis + x.ndim if axis < 0 else axis
    if attrs.get("reverse", 0):
        x = jnp.flip(x, axis=axis)
    y = jnp.cumsum(x, axis=axis)
    if attrs.get("exclusive", 0):
        y = y - x
    if attrs.get("reverse", 0):
        y = jnp.flip(y, axis=axis)
    return (y,)


@lower("CumProd", static=(1,))
def cumprod(inputs, attrs, ctx):
    x = inputs[0]
    axis = int(np.asarray(inputs[1]).reshape(-1)[0])
    axis = axis + x.ndim if axis < 0 else axis
    if attrs.get("reverse", 0):
        x = jnp.flip(x, axis=axis)
    if attrs.get("exclusive", 0):
        # Shift by one step (a leading 1) instead of dividing: exact when x holds zeros.
        pads = [(0, 0, 0)] * x.ndim
        pads[axis] = (1, -1, 0)
        x = lax.pad(x, jnp.ones((), x.dtype), pads)
    y = jnp.cumprod(x, axis=axis)
    if attrs.get("reverse", 0):
        y = jnp.flip(y, axis=axis)
    return (y,)


@lower("TopK", static=(1,))
def top_k(inputs, attrs, ctx):
    x = inputs[0]
    k = int(np.asarray(inputs[1]).reshape(-1)[0])
    axis = attrs.get("axis", -1)
    axis = axis + x.ndim if axis < 0 else axis
    largest = attrs.get("largest", 1)
    xm = jnp.moveaxis(x, axis, -1)
    vals, idx = lax.top_k(xm if largest else -xm, k)
    if not largest:
        vals = -vals
    return (jnp.moveaxis(vals, -1, axis), jnp.moveaxis(idx.astype(jnp.int64), -1, axis))
