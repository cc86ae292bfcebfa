"""Pooling as ``lax.reduce_window``: MaxPool, AveragePool, LpPool and the global pools.

Rules:

1. Padding follows Conv (auto_pad, pads). ``ceil_mode`` adds end padding so that the last
   window starting inside the input (plus begin padding) is kept; that extra padding never
   counts as data.
2. MaxPool pads with -inf; AveragePool divides by the number of counted cells: with
   ``count_include_pad`` the explicit pads count, otherwise only input cells (the ceil-mode
   extra never counts), as ONNX Runtime does.
3. MaxPool's optional Indices output is not lowered. Along a symbolic axis, floor mode lowers
   (its extra end padding is always 0) and AveragePool's divisor mask is built in the
   program; ``ceil_mode`` is refused there (its last window depends on the size).
4. MaxUnpool scatters X into zeros at its flat Indices over the inferred shape
   ``(in-1)*s + k - pad_begin - pad_end`` (the reference executor's reading); a static
   ``output_shape`` crops or zero-pads that at the end of each axis.
5. MaxRoiPool (Caffe): each (RoI, bin) is a masked max over the image; RoIs may be traced.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax
from mconv.engines.xla.lower import lower
from mconv.engines.xla.lower.conv import conv_pads


def _window(x, attrs):
    r = x.ndim - 2
    kernel = list(attrs["kernel_shape"])
    strides = list(attrs.get("strides", [1] * r))
    dilations = list(attrs.get("dilations", [1] * r))
    size = list(x.shape[2:])
    pads = conv_pads(attrs, size, kernel, strides, dilations)
    extra = []
    for i in range(r):
        if not attrs.get("ceil_mode", 0):
            extra.append(0)  # floor mode: the last window ends inside the (padded) input
            continue
        if not isinstance(size[i], (int, np.integer)):
            raise NotImplementedError("ceil_mode along a symbolic axis")
        eff = (kernel[i] - 1) * dilations[i] + 1
        span = size[i] + pads[i][0] + pads[i][1] - eff
        out = math.ceil(span / strides[i]) + 1
        if (out - 1) * strides[i] >= size[i] + pads[i][0]:
            out -= 1
        need = (out - 1) * strides[i] + eff - (size[i] + pads[i][0] + pads[i][1])
        extra.append(max(need, 0))
    return kernel, strides, dilations, pads, extra


def _static(size) -> bool:
    return all(isinstance(d, (int, np.integer)) for d in size)


def _reduce(x, init, op, kernel, strides, dilations, padding):
    return lax.reduce_window(
        x,
        init,
        op,
        window_dimensions=(1, 1, *kernel),
        window_strides=(1, 1, *strides),
        padding=((0, 0), (0, 0), *padding),
        window_dilation=(1, 1, *dilations),
    )


@lower("MaxPool")
def max_pool(inputs, attrs, ctx):
    x = inputs[0]
    if ctx.num_outputs > 1:
        raise NotImplementedError("MaxPool with an Indices output is not lowered")
    kernel, strides, dilations, pads, extra = _window(x, attrs)
    padding = [(b, e + x_) for (b, e), x_ in zip(pads, extra)]
    init = -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
    return (_reduce(x, np.array(init, x.dtype), lax.max, kernel, strides, dilations, padding),)


@lower("AveragePool")
def average_pool(inputs, attrs, ctx):
    x = inputs[0]
    kernel, strides, dilations, pads, extra = _window(x, attrs)
    padding = [(b, e + x_) for (b, e), x_ in zip(pads, extra)]
    total = _reduce(x, np.array(0, x.dtype), lax.add, kernel, strides, dilations, padding)
    # Divisor: a window sum over a mask that is 1 on counted cells (computed once, in numpy).
    size = x.shape[2:]
    if not any(b or e for b, e in padding):
        return ((total / np.float32(np.prod(kernel))).astype(x.dtype),)
    if not _static(size):  # a symbolic axis: the mask is built in the program
        one = jnp.ones(size, jnp.float32)
        if attrs.get("count_include_pad", 0):
            one = lax.pad(one, jnp.float32(1), [(b, e, 0) for b, e in pads])
            mask = lax.pad(one, jnp.float32(0), [(0, x_, 0) for x_ in extra])
        else:
            mask = lax.pad(one, jnp.float32(0), [(b, e, 0) for b, e in padding])
    elif attrs.get("count_include_pad", 0):
        mask = np.pad(np.ones(size, np.float32), [(b, e) for b, e in pads], constant_values=1.0)
        mask = np.pad(mask, [(0, x_) for x_ in extra])
    else:
        mask = np.pad(np.ones(size, np.float32), padding)
    count = _reduce(
        jnp.asarray(mask)[None, None],
        jnp.array(0, jnp.float32),
        lax.add,
        kernel,
        strides,
        dilations,
        [(0, 0)] * len(size),
    )
    return ((total / count.astype(x.dtype)).astype(x.dtype),)


@lower("LpPool")
def lp_pool(inputs, attrs, ctx):
    x = inputs[0]
    p = float(attrs.get("p", 2))
    kernel, strides, dilations, pads, extra = _window(x, attrs)
    padding = [(b, e + x_) for (b, e), x_ in zip(pads, extra)]
    s = _reduce(jnp.abs(x) ** p, jnp.array(0, x.dtype), lax.add, kernel, strides, dilations, padding)
    return (s ** (1.0 / p),)


def _spatial(x):
    return tuple(range(2, x.ndim))


@lower("GlobalMaxPool")
def global_max_pool(inputs, attrs, ctx):
    return (jnp.max(inputs[0], axis=_spatial(inputs[0]), keepdims=True),)


@lower("GlobalAveragePool")
def global_average_pool(inputs, attrs, ctx):
    return (jnp.mean(inputs[0], axis=_spatial(inputs[0]), keepdims=True),)


@lower("GlobalLpPool")
def global_lp_pool(inputs, attrs, ctx):
    x, p = inputs[0], float(attrs.get("p", 2))
    return (jnp.sum(jnp.abs(x) ** p, axis=_spatial(x), keepdims=True) ** (1.0 / p),)


@lower("MaxUnpool", static=(2,))
def max_unpool(inputs, attrs, ctx):
    x, idx = jnp.asarray(inputs[0]), jnp.asarray(inputs[1])
    out_shape = inputs[2] if len(inputs) > 2 else None
    nsp = x.ndim - 2
    kernel = [int(k) for k in attrs["kernel_shape"]]
    strides = [int(s) for s in attrs.get("strides", [1] * nsp)]
    pads = [int(p) for p in attrs.get("pads", [0] * (2 * nsp))]
    spatial = [
        (i - 1) * s + k - pads[a] - pads[a + nsp]
        for a, (i, s, k) in enumerate(zip(x.shape[2:], strides, kernel))
    ]
    inferred = (*x.shape[:2], *spatial)
    y = jnp.zeros(math.prod(inferred), x.dtype).at[idx.reshape(-1)].set(x.reshape(-1)).reshape(inferred)
    if out_shape is None:
        return (y,)
    shape = [int(v) for v in np.asarray(out_shape).reshape(-1)]
    y = y[tuple(slice(0, min(a, b)) for a, b in zip(inferred, shape))]
    return (jnp.pad(y, [(0, b - a) for a, b in zip(y.shape, shape)]),)


@lower("MaxRoiPool")
def max_roi_pool(inputs, attrs, ctx):
    """Caffe RoI max pooling as a masked max over the image per (RoI, bin); empty bins give 0."""
    x, rois = jnp.asarray(inputs[0]), jnp.asarray(inputs[1])
    ph_n, pw_n = (int(v) for v in attrs["pooled_shape"])
    scale = float(attrs.get("spatial_scale", 1.0))
    _, c, h, w = x.shape
    v = rois[:, 1:5].astype(jnp.float32) * scale
    # C roundf: halves round away from zero.
    x1, y1, x2, y2 = (jnp.sign(v[:, k]) * jnp.floor(jnp.abs(v[:, k]) + 0.5) for k in range(4))
    rh, rw = jnp.maximum(y2 - y1 + 1, 1), jnp.maximum(x2 - x1 + 1, 1)
    bh, bw = rh / ph_n, rw / pw_n

    def bins(n_bins, size, start, step):
        k = jnp.arange(n_bins, dtype=jnp.float32)[None, :]
        lo = jnp.clip(jnp.floor(k * step[:, None]) + start[:, None], 0, size)
        hi = jnp.clip(jnp.ceil((k + 1) * step[:, None]) + start[:, None], 0, size)
        pos = jnp.arange(size, dtype=jnp.float32)[None, None, :]
        return (pos >= lo[..., None]) & (pos < hi[..., None])  # (R, bins, size)

    my = bins(ph_n, h, y1, bh)
    mx = bins(pw_n, w, x1, bw)
    img = x[rois[:, 0].astype(jnp.int32)]  # (R, C, H, W)
    m = my[:, :, None, :, None] & mx[:, None, :, None, :]  # (R, PH, PW, H, W)
    vals = jnp.where(m[:, None], img[:, :, None, None], -jnp.inf)
    y = vals.max(axis=(-2, -1))
    return (jnp.where(jnp.isneginf(y), 0, y).astype(x.dtype),)
