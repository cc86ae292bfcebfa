"""Op family: reductions, arg-reductions, CumSum, CumProd and TopK.

Rules:

1. ``axes`` is an attribute before the op's move to an input (ReduceSum at opset 13, the other
   Reduce* at opset 18) and the second input after; either form is accepted whenever present.
2. Absent or empty ``axes`` reduces over every axis, unless ``noop_with_empty_axes=1``: then the
   op is the identity (ReduceSumSquare, ReduceL1, ... still apply their pointwise part).
3. A reduction over an empty set gives the identity of its monoid: 0 for sums, 1 for products,
   -inf/+inf (or the integer extremes) for Max/Min, -inf for the log-sums.
4. VJPs broadcast the cotangent back over the reduced axes; ReduceMax/Min spread it evenly over
   tied maxima (the average subgradient, so a finite difference sees the same value).
5. ArgMax/ArgMin give int64 and the first index of the extremum, the last with
   ``select_last_index=1``. TopK breaks ties by the lower index; its VJP scatters onto ``values``.
6. The summing reductions accumulate in float64 for float16/bfloat16/float32 inputs
   (``ops/__init__``, Exactness).
"""

from __future__ import annotations

import numpy as np

from . import register, register_vjp, wide
from .elementwise import _same, is_float


def _reduce_axes(inputs: list, attrs: dict, ndim: int) -> tuple[int, ...] | None:
    """The normalized reduce axes; ``None`` means "no-op" (noop_with_empty_axes with no axes)."""
    axes = None
    if len(inputs) > 1 and inputs[1] is not None:
        axes = [int(a) for a in np.asarray(inputs[1]).ravel()]
    elif "axes" in attrs:
        axes = list(attrs["axes"])
    if not axes:
        if attrs.get("noop_with_empty_axes", 0):
            return None
        return tuple(range(ndim))
    return tuple(sorted(a + ndim if a < 0 else a for a in axes))


def _extreme(dtype: np.dtype, largest: bool):
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return info.max if largest else info.min
    if dtype == np.bool_:
        return largest
    return np.inf if largest else -np.inf


def _reduce(op: str, x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
    if op == "ReduceSum":
        return np.sum(x, axis=axes, keepdims=keep)
    if op == "ReduceMean":
        return np.mean(x, axis=axes, keepdims=keep)
    if op == "ReduceMax":
        return np.max(x, axis=axes, keepdims=keep, initial=_extreme(x.dtype, False))
    if op == "ReduceMin":
        return np.min(x, axis=axes, keepdims=keep, initial=_extreme(x.dtype, True))
    if op == "ReduceProd":
        return np.prod(x, axis=axes, keepdims=keep)
    if op == "ReduceL1":
        return np.sum(np.abs(x), axis=axes, keepdims=keep)
    if op == "ReduceL2":
        return np.sqrt(np.sum(np.square(x), axis=axes, keepdims=keep))
    if op == "ReduceSumSquare":
        return np.sum(np.square(x), axis=axes, keepdims=keep)
    if op == "ReduceLogSum":
        with np.errstate(divide="ignore"):
            return np.log(np.sum(x, axis=axes, keepdims=keep))
    if op == "ReduceLogSumExp":
        if x.size == 0:
            return np.log(np.sum(np.exp(x), axis=axes, keepdims=keep))
        m = np.max(x, axis=axes, keepdims=True)
        m = np.where(np.isfinite(m), m, 0)
        s = np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True)) + m
        return s if keep else np.squeeze(s, axis=axes)
    raise AssertionError(op)


# Applied elementwise when noop_with_empty_axes turns the reduction off.
_NOOP_POINTWISE = {
    "ReduceL1": np.abs,
    "ReduceL2": np.abs,
    "ReduceSumSquare": np.square,
    "ReduceLogSum": np.log,
    "ReduceLogSumExp": lambda x: x,
}

_REDUCE_OPS = (
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceSumSquare",
    "ReduceLogSum",
    "ReduceLogSumExp",
)


# Sums over many terms accumulate in float64 for narrow floats (ops/__init__: Exactness).
_SUMMING = {
    "ReduceSum",
    "ReduceMean",
    "ReduceL1",
    "ReduceL2",
    "ReduceSumSquare",
    "ReduceLogSum",
    "ReduceLogSumExp",
}


def _make_reduce(op: str):
    def forward(inputs, attrs, ctx):
        x = inputs[0]
        axes = _reduce_axes(inputs, attrs, x.ndim)
        if axes is None:
            return (_same(x, _NOOP_POINTWISE.get(op, lambda v: v)(x)),)
        xs = x.astype(wide(x.dtype), copy=False) if op in _SUMMING else x
        return (_same(x, _reduce(op, xs, axes, bool(attrs.get("keepdims", 1)))),)

    def vjp(inputs, attrs, outputs, grads, ctx):
        x = inputs[0]
        rest = [None] * (len(inputs) - 1)
        if not is_float(x):
            return [None, *rest]
        (g,) = grads
        (y,) = outputs
        axes = _reduce_axes(inputs, attrs, x.ndim)
        if axes is None:
            axes, keep = (), True
        else:
            keep = bool(attrs.get("keepdims", 1))
        if not keep:
            g = np.expand_dims(g, axes)
            y = np.expand_dims(y, axes)
        g = np.broadcast_to(g, x.shape)
        y = np.broadcast_to(y, x.shape)
        if op == "ReduceSum":
            gx = g
        elif op == "ReduceMean":
            n = int(np.prod([x.shape[a] for a in axes])) if axes else 1
            gx = g / max(n, 1)
        elif op in ("ReduceMax", "ReduceMin"):
            hit = (x == y).astype(np.float64)
            gx = g * hit / np.sum(hit, axis=axes, keepdims=True) if axes else g * hit
        elif op == "ReduceProd":
            # y / x where x != 0; with zeros, the product of the other entries (exact via a loop-free trick).
            gx = g * _prod_others(x, axes)
        elif op == "ReduceL1":
            gx = g * np.sign(x)
        elif op == "ReduceL2":
            with np.errstate(divide="ignore", invalid="ignore"):
                gx = g * np.where(y > 0, x / np.where(y > 0, y, 1), 0)
        elif op == "ReduceSumSquare":
            gx = g * 2 * x
        elif op == "ReduceLogSum":
            gx = g / np.exp(y)
        else:  # ReduceLogSumExp
            gx = g * np.exp(x - y)
        return [_same(x, gx), *rest]

    register(op)(forward)
    register_vjp(op)(vjp)


def _prod_others(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """For each element, the product of the other elements of its reduction group."""
    if not axes:
        return np.ones_like(x)
    keep = [a for a in range(x.ndim) if a not in axes]
    perm = keep + list(axes)
    xt = np.transpose(x, perm)
    lead = xt.shape[: len(keep)]
    flat = xt.reshape(*lead, -1)
    # Exclusive prefix and suffix products: no division, so zeros are handled exactly.
    ones = np.ones((*lead, 1), dtype=x.dtype)
    pre = np.cumprod(np.concatenate([ones, flat[..., :-1]], axis=-1), axis=-1)
    suf = np.flip(np.cumprod(np.concatenate([ones, np.flip(flat, -1)[..., :-1]], axis=-1), axis=-1), -1)
    others = (pre * suf).reshape(xt.shape)
    return np.transpose(others, np.argsort(perm))


for _op in _REDUCE_OPS:
    _make_reduce(_op)


# --------------------------------------------------------------------------- ArgMax / ArgMin


def _arg(x: np.ndarray, attrs: dict, largest: bool) -> np.ndarray:
    axis = attrs.get("axis", 0)
    axis = axis + x.ndim if axis < 0 else axis
    fn = np.argmax if largest else np.argmin
    if attrs.get("select_last_index", 0):
        idx = x.shape[axis] - 1 - fn(np.flip(x, axis), axis=axis)
    else:
        idx = fn(x, axis=axis)
    idx = idx.astype(np.int64)
    return np.expand_dims(idx, axis) if attrs.get("keepdims", 1) else idx


@register("ArgMax")
def argmax(inputs, attrs, ctx):
    return (_arg(inputs[0], attrs, True),)


@register("ArgMin")
def argmin(inputs, attrs, ctx):
    return (_arg(inputs[0], attrs, False),)


# --------------------------------------------------------------------------- CumSum


def _cumsum(x: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> np.ndarray:
    if reverse:
        x = np.flip(x, axis)
    y = np.cumsum(x, axis=axis, dtype=x.dtype)
    if exclusive:
        y = y - x
    if reverse:
        y = np.flip(y, axis)
    return y


@register("CumSum")
def cumsum(inputs, attrs, ctx):
    x, axis = inputs
    return (
        _cumsum(
            x,
            int(np.asarray(axis).ravel()[0]),
            bool(attrs.get("exclusive", 0)),
            bool(attrs.get("reverse", 0)),
        ),
    )


@register_vjp("CumSum")
def cumsum_vjp(inputs, attrs, outputs, grads, ctx):
    # y = L x with L (strictly) lower triangular; L^T is the same sum running the other way.
    x, axis = inputs
    if not is_float(x):
        return [None, None]
    g = _cumsum(
        np.asarray(grads[0], dtype=x.dtype),
        int(np.asarray(axis).ravel()[0]),
        bool(attrs.get("exclusive", 0)),
        not attrs.get("reverse", 0),
    )
    return [g, None]


# --------------------------------------------------------------------------- CumProd


def _cumprod(x: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> np.ndarray:
    if reverse:
        x = np.flip(x, axis)
    y = np.cumprod(x, axis=axis, dtype=x.dtype)
    if exclusive:  # y_j = prod_{k<j} x_k: shift by one and start from 1
        y = np.concatenate([np.ones_like(np.take(y, [0], axis=axis)), np.delete(y, -1, axis=axis)], axis=axis)
    if reverse:
        y = np.flip(y, axis)
    return y


@register("CumProd")
def cumprod(inputs, attrs, ctx):
    x, axis = inputs
    return (
        _cumprod(
            x,
            int(np.asarray(axis).ravel()[0]),
            bool(attrs.get("exclusive", 0)),
            bool(attrs.get("reverse", 0)),
        ),
    )


@register_vjp("CumProd")
def cumprod_vjp(inputs, attrs, outputs, grads, ctx):
    # dL/dx_i = P_{<i} * R_i, with P the exclusive prefix product and R_i = sum_{j>=i} g_j
    # prod_{i<k<=j} x_k (inclusive; j>i and k<j when exclusive), a reverse scan that stays exact
    # when x holds zeros (no division by x).
    x, axis_in = inputs
    if not is_float(x):
        return [None, None]
    axis = int(np.asarray(axis_in).ravel()[0])
    exclusive, reverse = bool(attrs.get("exclusive", 0)), bool(attrs.get("reverse", 0))
    xs = np.moveaxis(x, axis, 0)
    gs = np.moveaxis(np.asarray(grads[0], dtype=x.dtype), axis, 0)
    if reverse:
        xs, gs = xs[::-1], gs[::-1]
    n = xs.shape[0]
    prefix = _cumprod(xs, 0, True, False)
    r = np.zeros_like(xs)
    acc = np.zeros_like(xs[0]) if n else None
    for i in range(n - 1, -1, -1):
        if exclusive:
            acc = (gs[i + 1] + xs[i + 1] * acc) if i + 1 < n else np.zeros_like(xs[0])
        else:
            acc = gs[i] + (xs[i + 1] * acc if i + 1 < n else 0)
        r[i] = acc
    gx = prefix * r
    if reverse:
        gx = gx[::-1]
    return [np.ascontiguousarray(np.moveaxis(gx, 0, axis)).astype(x.dtype, copy=False), None]


# --------------------------------------------------------------------------- TopK


def _topk_indices(x: np.ndarray, k: int, axis: int, largest: bool) -> np.ndarray:
    if largest:
        # Stable sort of the negated keys keeps lower indices first among ties.
        keys = -x.astype(np.float64) if np.issubdtype(x.dtype, np.integer) else -x
    else:
        keys = x
    order = np.argsort(keys, axis=axis, kind="stable")
    return np.take(order, np.arange(k), axis=axis)


@register("TopK")
def topk(inputs, attrs, ctx):
    x = inputs[0]
    axis = attrs.get("axis", -1)
    axis = axis + x.ndim if axis < 0 else axis
    k = int(np.asarray(inputs[1]).ravel()[0]) if len(inputs) > 1 else int(attrs["k"])
    idx = _topk_indices(x, k, axis, bool(attrs.get("largest", 1)))
    return (np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64))


@register_vjp("TopK")
def topk_vjp(inputs, attrs, outputs, grads, ctx):
    x = inputs[0]
    rest = [None] * (len(inputs) - 1)
    if not is_float(x) or grads[0] is None:
        return [None if not is_float(x) else np.zeros_like(x), *rest]
    axis = attrs.get("axis", -1)
    axis = axis + x.ndim if axis < 0 else axis
    gx = np.zeros_like(x)
    np.put_along_axis(gx, outputs[1], np.asarray(grads[0], dtype=x.dtype), axis=axis)
    return [gx, *rest]
