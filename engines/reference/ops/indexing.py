"""Op family: gathers, scatters, selection and index-producing ops.

Rules:

1. Negative indices count from the end of their axis (Gather, GatherElements, GatherND, the
   Scatter ops, OneHot); an index out of range is bad input and raises InputError naming the op.
2. Gather VJPs are scatter-adds (``np.add.at``), so repeated indices accumulate.
3. ScatterElements / ScatterND apply updates in index order; ``reduction`` is none, add, mul,
   max or min. VJP: for ``none`` the data gradient is zero where an update landed and the update
   gradient is the cotangent gathered there (exact when indices are unique, as ONNX requires);
   for ``add`` the data gradient passes through unchanged. ``mul``/``max``/``min`` have no VJP here
   (InputError, saying so).
4. NonZero, OneHot, Compress and Unique follow numpy's C order; Unique's ``sorted=0`` keeps the
   order of first occurrence.
"""

from __future__ import annotations

import numpy as np
from mconv.errors import InputError

from . import register, register_vjp
from .elementwise import is_float


def _check_range(op: str, idx: np.ndarray, n: int) -> np.ndarray:
    idx = np.asarray(idx).astype(np.int64)
    if idx.size and (idx.min() < -n or idx.max() >= n):
        bad = idx[(idx < -n) | (idx >= n)].ravel()[0]
        raise InputError(
            f"{op}: index {int(bad)} out of range for an axis of size {n}",
            where=op,
            hint="indices must lie in [-n, n-1]",
        )
    return np.where(idx < 0, idx + n, idx)


def _axis(attrs: dict, ndim: int, default: int = 0) -> int:
    a = attrs.get("axis", default)
    return a + ndim if a < 0 else a


# --------------------------------------------------------------------------- Gather


@register("Gather")
def gather(inputs, attrs, ctx):
    x, idx = inputs
    axis = _axis(attrs, x.ndim)
    return (np.take(x, _check_range("Gather", idx, x.shape[axis]), axis=axis),)


@register_vjp("Gather")
def gather_vjp(inputs, attrs, outputs, grads, ctx):
    x, idx = inputs
    if not is_float(x):
        return [None, None]
    axis = _axis(attrs, x.ndim)
    idx = _check_range("Gather", idx, x.shape[axis])
    gx = np.zeros(x.shape, dtype=x.dtype)
    # Move the gathered axis first so one np.add.at over the flat indices suffices.
    gm = np.moveaxis(gx, axis, 0)
    g = np.asarray(grads[0], dtype=x.dtype)
    g = np.moveaxis(g.reshape(x.shape[:axis] + (idx.size,) + x.shape[axis + 1 :]), axis, 0)
    np.add.at(gm, idx.ravel(), g)
    return [gx, None]


def _full_index(idx: np.ndarray, axis: int) -> tuple:
    """Index tuple addressing ``data`` at ``idx`` along ``axis`` and the element's own place elsewhere."""
    grid: list[np.ndarray] = list(np.indices(idx.shape, sparse=True))
    grid[axis] = idx
    return tuple(grid)


@register("GatherElements")
def gather_elements(inputs, attrs, ctx):
    x, idx = inputs
    axis = _axis(attrs, x.ndim)
    return (x[_full_index(_check_range("GatherElements", idx, x.shape[axis]), axis)],)


@register_vjp("GatherElements")
def gather_elements_vjp(inputs, attrs, outputs, grads, ctx):
    x, idx = inputs
    if not is_float(x):
        return [None, None]
    axis = _axis(attrs, x.ndim)
    gx = np.zeros(x.shape, dtype=x.dtype)
    full = _full_index(_check_range("GatherElements", idx, x.shape[axis]), axis)
    np.add.at(gx, full, np.asarray(grads[0], dtype=x.dtype))
    return [gx, None]


def _gather_nd_index(x: np.ndarray, idx: np.ndarray, b: int) -> tuple:
    """An index tuple for ``x`` that GatherND's ``indices`` (with ``batch_dims=b``) addresses."""
    k = idx.shape[-1]
    cols = [_check_range("GatherND", idx[..., j], x.shape[b + j]) for j in range(k)]
    lead = idx.shape[:-1]
    batch = [np.arange(x.shape[i]).reshape((1,) * i + (-1,) + (1,) * (len(lead) - i - 1)) for i in range(b)]
    return tuple(batch + [np.broadcast_to(c, lead) for c in cols])


@register("GatherND")
def gather_nd(inputs, attrs, ctx):
    x, idx = inputs
    return (x[_gather_nd_index(x, np.asarray(idx, np.int64), attrs.get("batch_dims", 0))],)


@register_vjp("GatherND")
def gather_nd_vjp(inputs, attrs, outputs, grads, ctx):
    x, idx = inputs
    if not is_float(x):
        return [None, None]
    gx = np.zeros(x.shape, dtype=x.dtype)
    np.add.at(gx, _gather_nd_index(x, np.asarray(idx, np.int64), attrs.get("batch_dims", 0)), grads[0])
    return [gx, None]


# --------------------------------------------------------------------------- scatters

_REDUCE_AT = {"add": np.add.at, "mul": np.multiply.at, "max": np.maximum.at, "min": np.minimum.at}


def _scatter(op: str, data: np.ndarray, where: tuple, updates: np.ndarray, reduction: str) -> np.ndarray:
    out = data.copy()
    if reduction == "none":
        out[where] = updates  # numpy assigns in order: the last duplicate wins
    elif reduction in _REDUCE_AT:
        _REDUCE_AT[reduction](out, where, updates)
    else:
        raise InputError(
            f"{op}: unknown reduction {reduction!r}", where=op, hint="none, add, mul, max or min"
        )
    return out


def _scatter_elements_where(op, inputs, attrs) -> tuple:
    data, idx, _ = inputs
    axis = _axis(attrs, data.ndim)
    return _full_index(_check_range(op, idx, data.shape[axis]), axis)


@register("ScatterElements")
def scatter_elements(inputs, attrs, ctx):
    where = _scatter_elements_where("ScatterElements", inputs, attrs)
    return (_scatter("ScatterElements", inputs[0], where, inputs[2], attrs.get("reduction", "none")),)


@register("Scatter")
def scatter_old(inputs, attrs, ctx):
    where = _scatter_elements_where("Scatter", inputs, attrs)
    return (_scatter("Scatter", inputs[0], where, inputs[2], "none"),)


def _scatter_nd_where(data: np.ndarray, idx: np.ndarray) -> tuple:
    k = idx.shape[-1]
    return tuple(_check_range("ScatterND", idx[..., j], data.shape[j]) for j in range(k))


@register("ScatterND")
def scatter_nd(inputs, attrs, ctx):
    data, idx, updates = inputs
    where = _scatter_nd_where(data, np.asarray(idx))
    return (_scatter("ScatterND", data, where, updates, attrs.get("reduction", "none")),)


def _scatter_vjp(op: str, inputs, attrs, grads, where: tuple) -> list:
    data, _, updates = inputs
    reduction = attrs.get("reduction", "none")
    if reduction not in ("none", "add"):
        raise InputError(
            f"{op}: no gradient for reduction={reduction!r}",
            where=op,
            hint="only reduction none and add are differentiable in the reference executor",
        )
    g = np.asarray(grads[0])
    gd = g.astype(data.dtype, copy=True)
    if reduction == "none":
        gd[where] = 0
    gu = g[where].astype(updates.dtype) if is_float(updates) else None
    return [gd if is_float(data) else None, None, gu]


@register_vjp("ScatterElements", "Scatter")
def scatter_elements_vjp(inputs, attrs, outputs, grads, ctx):
    return _scatter_vjp(
        "ScatterElements", inputs, attrs, grads, _scatter_elements_where("ScatterElements", inputs, attrs)
    )


@register_vjp("ScatterND")
def scatter_nd_vjp(inputs, attrs, outputs, grads, ctx):
    return _scatter_vjp(
        "ScatterND", inputs, attrs, grads, _scatter_nd_where(inputs[0], np.asarray(inputs[1]))
    )


# --------------------------------------------------------------------------- OneHot, NonZero, Compress, Unique


@register("OneHot")
def one_hot(inputs, attrs, ctx):
    idx, depth, values = inputs
    d = int(np.asarray(depth).ravel()[0])
    off, on = np.asarray(values).ravel()[:2]
    idx = np.asarray(idx).astype(np.int64)
    idx = np.where(idx < 0, idx + d, idx)
    rank = idx.ndim + 1
    axis = attrs.get("axis", -1)
    axis = axis + rank if axis < 0 else axis
    hot = idx[..., None] == np.arange(d)  # out-of-range indices match nothing: all "off"
    hot = np.moveaxis(hot, -1, axis)
    return (np.where(hot, on, off).astype(np.asarray(values).dtype),)


@register("NonZero")
def nonzero(inputs, attrs, ctx):
    x = np.asarray(inputs[0])
    if x.ndim == 0:
        return (np.zeros((0, int(bool(x))), dtype=np.int64),)
    return (np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1),)


def _compress_plan(inputs, attrs):
    x, cond = inputs
    sel = np.nonzero(np.asarray(cond).astype(bool).ravel())[0]
    if "axis" not in attrs:
        return x.reshape(-1), 0, sel
    return x, _axis(attrs, x.ndim), sel


@register("Compress")
def compress(inputs, attrs, ctx):
    x, axis, sel = _compress_plan(inputs, attrs)
    return (np.take(x, sel, axis=axis),)


@register_vjp("Compress")
def compress_vjp(inputs, attrs, outputs, grads, ctx):
    x = inputs[0]
    if not is_float(x):
        return [None, None]
    xv, axis, sel = _compress_plan(inputs, attrs)
    gx = np.zeros(xv.shape, x.dtype)
    idx = [slice(None)] * xv.ndim
    idx[axis] = sel
    gx[tuple(idx)] = grads[0]
    return [gx.reshape(x.shape), None]


@register("Unique")
def unique(inputs, attrs, ctx):
    x = inputs[0]
    axis = attrs.get("axis")
    if axis is None:
        vals, first, inverse, counts = np.unique(
            x.ravel(), return_index=True, return_inverse=True, return_counts=True
        )
    else:
        axis = axis + x.ndim if axis < 0 else axis
        vals, first, inverse, counts = np.unique(
            x, axis=axis, return_index=True, return_inverse=True, return_counts=True
        )
    inverse = inverse.ravel()
    if not attrs.get("sorted", 1):
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        vals = np.take(vals, order, axis=0 if axis is None else axis)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    i64 = np.int64
    return (vals, first.astype(i64), inverse.astype(i64), counts.astype(i64))
