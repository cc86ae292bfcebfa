"""Op family: normalization (BatchNormalization, InstanceNormalization, LayerNormalization,
GroupNormalization, LpNormalization, MeanVarianceNormalization, LRN), forward and VJP.

Rules
-----
1. Standardization over axes A (D elements): ``xhat = (x - mean_A x) * invstd`` with
   ``invstd = 1 / sqrt(var_A x + epsilon)`` (biased variance); its VJP is
   ``dx = invstd * (dxhat - mean_A dxhat - xhat * mean_A(dxhat * xhat))``.
2. BatchNormalization in inference mode uses the given mean/var (no reduction, so its VJP is a
   per-channel scale, and the mean/var inputs get gradients too). With ``training_mode=1``
   (opset 14+) it normalizes with the batch statistics over (N, spatial) and also returns
   ``running = input * momentum + batch * (1 - momentum)`` for mean and (biased) var.
3. LayerNormalization normalizes over axes ``[axis, rank)``; Mean and InvStdDev keep those
   axes as size 1. Statistics are computed in float32 or wider (``stash_type=1``).
4. GroupNormalization splits channels into ``num_groups`` consecutive groups; scale and bias are
   per channel (opset 21) or per group (opset 18, detected by their length).
5. MeanVarianceNormalization (the ONNX function): ``(x - E x) / (sqrt(E x^2 - (E x)^2) + 1e-9)``.
6. LRN follows the ONNX spec (as onnxruntime does): the window runs over CHANNELS,
   ``[c - floor((size-1)/2), c + ceil((size-1)/2)]``, and
   ``y = x / (bias + alpha / size * square_sum) ** beta``.
"""

from __future__ import annotations

import math

import numpy as np

from . import OpContext, register, register_vjp, wide


def _stat_dtype(dtype: np.dtype) -> np.dtype:
    """float64 for narrow floats (ops/__init__: Exactness), at least float32 in fast mode."""
    return np.promote_types(wide(dtype), np.float32)


def _standardize(
    x: np.ndarray, axes: tuple[int, ...], eps: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``xhat, mean, invstd`` over ``axes`` (rule 1), statistics keeping reduced axes."""
    mean = x.mean(axis=axes, keepdims=True)
    centered = x - mean
    var = np.mean(centered * centered, axis=axes, keepdims=True)
    invstd = 1.0 / np.sqrt(var + eps)
    return centered * invstd, mean, invstd


def _standardize_vjp(
    dxhat: np.ndarray, xhat: np.ndarray, invstd: np.ndarray, axes: tuple[int, ...]
) -> np.ndarray:
    return invstd * (
        dxhat - dxhat.mean(axis=axes, keepdims=True) - xhat * (dxhat * xhat).mean(axis=axes, keepdims=True)
    )


def _unbroadcast(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``g`` down to ``shape`` (numpy broadcasting, right-aligned)."""
    lead = g.ndim - len(shape)
    g = g.sum(axis=tuple(range(lead))) if lead > 0 else g
    axes = tuple(i for i, s in enumerate(shape) if s == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


def _channel(v: np.ndarray, ndim: int) -> np.ndarray:
    """A per-channel vector shaped to broadcast over NC[spatial]."""
    return v.reshape((1, -1) + (1,) * (ndim - 2))


def _nonchannel_axes(x: np.ndarray) -> tuple[int, ...]:
    return (0,) + tuple(range(2, x.ndim))


# ----------------------------------------------------------------------------- BatchNormalization


def _bn_training(attrs: dict, ctx: OpContext) -> bool:
    return bool(attrs.get("training_mode", 0)) and ctx.opset >= 14


_BLOCK = 1 << 15  # elements per block of :func:`_affine`'s wide temporary (256 KiB in float64)


def _affine(x: np.ndarray, a: np.ndarray, b: np.ndarray, sd: np.dtype) -> np.ndarray:
    """``x * a + b`` per channel, computed in ``sd`` and rounded once to ``x.dtype``, through a
    cache-sized wide temporary rather than whole-tensor wide arrays (inference BatchNormalization)."""
    if x.ndim < 2 or x.dtype == sd:
        return (x * _channel(a, x.ndim) + _channel(b, x.ndim)).astype(x.dtype, copy=False)
    n, c = x.shape[:2]
    rows = np.ascontiguousarray(x).reshape(n * c, -1)
    plane = rows.shape[1]
    ra, rb = np.tile(a, n)[:, None], np.tile(b, n)[:, None]
    out = np.empty_like(rows)
    step = max(1, _BLOCK // max(plane, 1))
    tmp = np.empty((min(step, n * c), plane), dtype=sd)
    for lo in range(0, n * c, step):
        hi = min(n * c, lo + step)
        t = tmp[: hi - lo]
        np.multiply(rows[lo:hi], ra[lo:hi], out=t)
        t += rb[lo:hi]
        out[lo:hi] = t
    return out.reshape(x.shape)


@register("BatchNormalization")
def batch_normalization(inputs: list, attrs: dict, ctx: OpContext) -> tuple:
    x, scale, bias, mean, var = inputs[:5]
    eps = float(attrs.get("epsilon", 1e-5))
    sd = _stat_dtype(x.dtype)
    if not _bn_training(attrs, ctx):
        inv = 1.0 / np.sqrt(var.astype(sd) + eps)
        a = scale.astype(sd) * inv
        return (_affine(x, a, bias.astype(sd) - mean.astype(sd) * a, sd),)
    axes = _nonchannel_axes(x)
    xf = x.astype(sd, copy=False)
    xhat, bmean, invstd = _standardize(xf, axes, eps)
    y = xhat * _channel(scale.astype(sd), x.ndim) + _channel(bias.astype(sd), x.ndim)
    bvar = (1.0 / invstd**2 - eps).reshape(-1)
    momentum = float(attrs.get("momentum", 0.9))
    run_mean = mean * momentum + bmean.reshape(-1) * (1 - momentum)
    run_var = var * momentum + bvar * (1 - momentum)
    return (y.astype(x.dtype), run_mean.astype(mean.dtype), run_var.astype(var.dtype))


@register_vjp("BatchNormalization")
def batch_normalization_vjp(inputs: list, attrs: dict, outputs, grads, ctx: OpContext) -> list:
    """Gradients through Y only (running statistics are treated as state, not as values)."""
    x, scale, bias, mean, var = inputs[:5]
    g = grads[0]
    if g is None:
        return [None] * len(inputs)
    eps = float(attrs.get("epsilon", 1e-5))
    sd = _stat_dtype(x.dtype)
    axes = _nonchannel_axes(x)
    g = g.astype(sd, copy=False)
    xf = x.astype(sd, copy=False)
    if _bn_training(attrs, ctx):
        xhat, _, invstd = _standardize(xf, axes, eps)
        gx = _standardize_vjp(g * _channel(scale.astype(sd), x.ndim), xhat, invstd, axes)
        gmean = gvar = None
    else:
        inv = 1.0 / np.sqrt(var.astype(sd) + eps)
        centered = xf - _channel(mean.astype(sd), x.ndim)
        xhat = centered * _channel(inv, x.ndim)
        gx = g * _channel(scale.astype(sd) * inv, x.ndim)
        gmean = -(g.sum(axis=axes) * scale * inv).astype(mean.dtype)
        gvar = (-0.5 * scale * inv**3 * (g * centered).sum(axis=axes)).astype(var.dtype)
    gscale = (g * xhat).sum(axis=axes).astype(scale.dtype)
    gbias = g.sum(axis=axes).astype(bias.dtype)
    return [gx.astype(x.dtype, copy=False), gscale, gbias, gmean, gvar] + [None] * (len(inputs) - 5)


# ----------------------------------------------------------------------------- Instance / Layer / Group


@register("InstanceNormalization")
def instance_normalization(inputs: list, attrs: dict, ctx: OpContext) -> tuple[np.ndarray]:
    x, scale, bias = inputs[:3]
    sd = _stat_dtype(x.dtype)
    xhat, _, _ = _standardize(
        x.astype(sd, copy=False), tuple(range(2, x.ndim)), float(attrs.get("epsilon", 1e-5))
    )
    y = xhat * _channel(scale.astype(sd), x.ndim) + _channel(bias.astype(sd), x.ndim)
    return (y.astype(x.dtype, copy=False),)


@register_vjp("InstanceNormalization")
def instance_normalization_vjp(inputs: list, attrs: dict, outputs, grads, ctx: OpContext) -> list:
    x, scale, bias = inputs[:3]
    sd = _stat_dtype(x.dtype)
    g = grads[0].astype(sd, copy=False)
    axes = tuple(range(2, x.ndim))
    xhat, _, invstd = _standardize(x.astype(sd, copy=False), axes, float(attrs.get("epsilon", 1e-5)))
    gx = _standardize_vjp(g * _channel(scale.astype(sd), x.ndim), xhat, invstd, axes)
    return [
        gx.astype(x.dtype, copy=False),
        (g * xhat).sum(axis=_nonchannel_axes(x)).astype(scale.dtype),
        g.sum(axis=_nonchannel_axes(x)).astype(bias.dtype),
    ]


def _layer_axes(x: np.ndarray, attrs: dict) -> tuple[int, ...]:
    axis = int(attrs.get("axis", -1))
    axis = axis + x.ndim if axis < 0 else axis
    return tuple(range(axis, x.ndim))


@register("LayerNormalization")
def layer_normalization(inputs: list, attrs: dict, ctx: OpContext) -> tuple:
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    sd = _stat_dtype(x.dtype)
    xhat, mean, invstd = _standardize(
        x.astype(sd, copy=False), _layer_axes(x, attrs), float(attrs.get("epsilon", 1e-5))
    )
    y = xhat * scale.astype(sd)
    if bias is not None:
        y = y + bias.astype(sd)
    stash = np.promote_types(x.dtype, np.float32)  # Mean/InvStdDev's ONNX type (stash_type=1)
    return (y.astype(x.dtype, copy=False), mean.astype(stash), invstd.astype(stash))


@register_vjp("LayerNormalization")
def layer_normalization_vjp(inputs: list, attrs: dict, outputs, grads, ctx: OpContext) -> list:
    """Gradients from all three outputs: Y (rule 1), Mean (``dx += dMean / D``) and InvStdDev
    (``dx += -dInv * invstd^3 * (x - mean) / D``)."""
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    sd = _stat_dtype(x.dtype)
    axes = _layer_axes(x, attrs)
    d = math.prod(x.shape[a] for a in axes)
    xhat, _, invstd = _standardize(x.astype(sd, copy=False), axes, float(attrs.get("epsilon", 1e-5)))
    gx = np.zeros(x.shape, sd)
    gscale = np.zeros(scale.shape, scale.dtype)
    gbias = None if bias is None else np.zeros(bias.shape, bias.dtype)
    gy = grads[0]
    if gy is not None:
        gy = gy.astype(sd, copy=False)
        gx = gx + _standardize_vjp(gy * scale.astype(sd), xhat, invstd, axes)
        gscale = _unbroadcast(gy * xhat, scale.shape).astype(scale.dtype)
        if bias is not None:
            gbias = _unbroadcast(gy, bias.shape).astype(bias.dtype)
    if len(grads) > 1 and grads[1] is not None:
        gx = gx + grads[1].astype(sd) / d
    if len(grads) > 2 and grads[2] is not None:
        gx = gx - grads[2].astype(sd) * invstd**2 * xhat / d
    result: list[np.ndarray | None] = [gx.astype(x.dtype, copy=False), gscale]
    if len(inputs) > 2:
        result.append(gbias)
    return result


def _group_setup(x: np.ndarray, scale: np.ndarray, attrs: dict) -> tuple[int, bool]:
    groups = int(attrs["num_groups"])
    c = x.shape[1]
    per_group = scale.size == groups and groups != c  # opset 18 layout (rule 4)
    return groups, per_group


@register("GroupNormalization")
def group_normalization(inputs: list, attrs: dict, ctx: OpContext) -> tuple[np.ndarray]:
    x, scale, bias = inputs[:3]
    groups, per_group = _group_setup(x, scale, attrs)
    sd = _stat_dtype(x.dtype)
    n, c = x.shape[:2]
    xg = x.astype(sd, copy=False).reshape(n, groups, -1)
    xhat, _, _ = _standardize(xg, (2,), float(attrs.get("epsilon", 1e-5)))
    xhat = xhat.reshape(x.shape)
    s, b = scale.astype(sd), bias.astype(sd)
    if per_group:
        s, b = np.repeat(s, c // groups), np.repeat(b, c // groups)
    y = xhat * _channel(s, x.ndim) + _channel(b, x.ndim)
    return (y.astype(x.dtype, copy=False),)


@register_vjp("GroupNormalization")
def group_normalization_vjp(inputs: list, attrs: dict, outputs, grads, ctx: OpContext) -> list:
    x, scale, bias = inputs[:3]
    groups, per_group = _group_setup(x, scale, attrs)
    sd = _stat_dtype(x.dtype)
    n, c = x.shape[:2]
    g = grads[0].astype(sd, copy=False)
    xhat, _, invstd = _standardize(
        x.astype(sd, copy=False).reshape(n, groups, -1), (2,), float(attrs.get("epsilon", 1e-5))
    )
    s = scale.astype(sd)
    if per_group:
        s = np.repeat(s, c // groups)
    dxhat = (g * _channel(s, x.ndim)).reshape(n, groups, -1)
    gx = _standardize_vjp(dxhat, xhat, invstd, (2,)).reshape(x.shape)
    axes = _nonchannel_axes(x)
    gscale = (g * xhat.reshape(x.shape)).sum(axis=axes)
    gbias = g.sum(axis=axes)
    if per_group:
        gscale = gscale.reshape(groups, -1).sum(axis=1)
        gbias = gbias.reshape(groups, -1).sum(axis=1)
    return [gx.astype(x.dtype, copy=False), gscale.astype(scale.dtype), gbias.astype(bias.dtype)]


# ----------------------------------------------------------------------------- Lp / MVN


@register("LpNormalization")
def lp_normalization(inputs: list, attrs: dict, ctx: OpContext) -> tuple[np.ndarray]:
    x = inputs[0]
    axis, p = int(attrs.get("axis", -1)), int(attrs.get("p", 2))
    norm = (
        np.abs(x).sum(axis=axis, keepdims=True) if p == 1 else np.sqrt((x * x).sum(axis=axis, keepdims=True))
    )
    # A zero vector stays zero (ONNX backend test l2normalization_axis_0) instead of 0/0.
    return (np.divide(x, norm, out=np.zeros_like(x), where=norm != 0),)


@register_vjp("LpNormalization")
def lp_normalization_vjp(inputs: list, attrs: dict, outputs, grads, ctx: OpContext) -> list:
    """``y = x / n``: p=2 gives ``(g - y <g, y>) / n``; p=1 gives ``g / n - sign(x) <g, x> / n^2``."""
    x, g = inputs[0], grads[0]
    axis, p = int(attrs.get("axis", -1)), int(attrs.get("p", 2))
    if p == 1:
        norm = np.abs(x).sum(axis=axis, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            gx = g / norm - np.sign(x) * (g * x).sum(axis=axis, keepdims=True) / norm**2
    else:
        norm = np.sqrt((x * x).sum(axis=axis, keepdims=True))
        with np.errstate(divide="ignore", invalid="ignore"):
            y = x / norm
            gx = (g - y * (g * y).sum(axis=axis, keepdims=True)) / norm
    # At a zero vector the forward is not differentiable; report 0 like the forward's output.
    gx = np.where(norm != 0, gx, 0.0)
    return [gx.astype(x.dtype, copy=False)]


_MVN_EPS = 1e-9


def _mvn_axes(x: np.ndarray, attrs: dict) -> tuple[int, ...]:
    return tuple(int(a) % x.ndim for a in attrs.get("axes", [0, 2, 3]))


@register("MeanVarianceNormalization")
def mean_variance_normalization(inputs: list, attrs: dict, ctx: OpContext) -> tuple[np.ndarray]:
    x = inputs[0]
    axes = _mvn_axes(x, attrs)
    mean = x.mean(axis=axes, keepdims=True)
    var = (x * x).mean(axis=axes, keepdims=True) - mean * mean
    return (((x - mean) / (np.sqrt(np.maximum(var, 0)) + _MVN_EPS)).astype(x.dtype, copy=False),)


@register_vjp("MeanVarianceNormalization")
def mean_variance_normalization_vjp(inputs: list, attrs: dict, outputs, grads, ctx: OpContext) -> list:
    """With ``c = x - mean``, ``sigma = sqrt(mean c^2)``, ``r = 1/(sigma + eps)``:
    ``dc = g r - r^2 c / (D sigma) * sum(g c)``, then ``dx = dc - mean(dc)``."""
    x, g = inputs[0], grads[0]
    axes = _mvn_axes(x, attrs)
    d = math.prod(x.shape[a] for a in axes)
    c = x - x.mean(axis=axes, keepdims=True)
    sigma = np.sqrt((c * c).mean(axis=axes, keepdims=True))
    r = 1.0 / (sigma + _MVN_EPS)
    dc = g * r - r * r * c / (d * sigma) * (g * c).sum(axis=axes, keepdims=True)
    return [(dc - dc.mean(axis=axes, keepdims=True)).astype(x.dtype, copy=False)]


# ----------------------------------------------------------------------------- LRN


def _channel_window_sum(v: np.ndarray, before: int, after: int) -> np.ndarray:
    """``out[:, c] = sum of v[:, c - before : c + after + 1]`` (clipped to the channels)."""
    c = v.shape[1]
    out = np.zeros_like(v)
    for shift in range(-before, after + 1):
        lo, hi = max(0, -shift), min(c, c - shift)
        if hi > lo:
            out[:, lo:hi] += v[:, lo + shift : hi + shift]
    return out


def _lrn_denominator(x: np.ndarray, attrs: dict) -> tuple[np.ndarray, int, int]:
    size = int(attrs["size"])
    before, after = (size - 1) // 2, size // 2  # floor and ceil of (size-1)/2
    alpha, bias = float(attrs.get("alpha", 1e-4)), float(attrs.get("bias", 1.0))
    den = _channel_window_sum(x * x, before, after)
    den *= den.dtype.type(alpha / size)
    den += den.dtype.type(bias)
    return den, before, after


@register("LRN")
def lrn(inputs: list, attrs: dict, ctx: OpContext) -> tuple[np.ndarray]:
    x = inputs[0]
    den, _, _ = _lrn_denominator(x, attrs)
    beta = float(attrs.get("beta", 0.75))
    if beta == 0.75:  # AlexNet's value: two square roots are much cheaper than a power
        root = np.sqrt(den)
        root *= np.sqrt(root)
        return ((x / root).astype(x.dtype, copy=False),)
    return ((x * den ** (-beta)).astype(x.dtype, copy=False),)


@register_vjp("LRN")
def lrn_vjp(inputs: list, attrs: dict, outputs, grads, ctx: OpContext) -> list:
    """``dx_j = g_j den_j^-beta - 2 beta alpha/size x_j sum_{c: j in window(c)} g_c x_c den_c^(-beta-1)``;
    the channels c whose window holds j form the mirrored window ``[j - after, j + before]``."""
    x, g = inputs[0], grads[0]
    size = int(attrs["size"])
    den, before, after = _lrn_denominator(x, attrs)
    beta, alpha = float(attrs.get("beta", 0.75)), float(attrs.get("alpha", 1e-4))
    t = g * x * den ** (-beta - 1.0)
    gx = g * den ** (-beta) - (2.0 * beta * alpha / size) * x * _channel_window_sum(t, after, before)
    return [gx.astype(x.dtype, copy=False)]
