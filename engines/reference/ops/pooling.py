"""Op family: pooling (MaxPool, AveragePool, LpPool, Global*Pool, MaxUnpool, MaxRoiPool), forward and VJP.

Rules
-----
1. Window geometry (strides, dilations, pads, auto_pad, ceil_mode) is the one of Conv
   (:func:`mconv.engines.reference.ops.conv.conv_window`); with ``ceil_mode`` a window may reach
   past the end padding, and a last window starting inside the end padding is dropped.
2. Every pool is a reduction over kernel taps: the padded canvas is read by one strided slice per
   tap (``kh*kw`` whole-tensor numpy ops, never a loop over output pixels).
3. MaxPool pads with -inf (the dtype's minimum for integers); the first maximal tap in row-major
   tap order wins. ``Indices`` flattens ``(n, c, *spatial)`` row-major, or with
   ``storage_order=1`` the spatial part column-major (``n*C*H*W + c*H*W + w*H + h``).
4. AveragePool divides by the number of taps inside the input (``count_include_pad=0``) or inside
   the input plus its explicit/auto pads (``count_include_pad=1``); taps in the extra ceil_mode
   region never count. Window sums (AveragePool, LpPool, the global ones) accumulate in float64
   for float16/bfloat16/float32 inputs (``ops/__init__``, Exactness).
5. LpPool: ``(sum over the window of |x|^p)^(1/p)``, zero padding, ``p`` defaults to 2.
6. VJPs scatter the cotangent back through the same taps: MaxPool to the winning element,
   AveragePool ``g / count`` to every tap, LpPool ``g * (|x|/y)^(p-1) * sign(x)``.
"""

from __future__ import annotations

import math

import numpy as np

from . import OpContext, register, register_vjp, wide
from .conv import Window, col2im, conv_window, crop_canvas, im2col, pad_to_canvas


def _pool_window(x: np.ndarray, attrs: dict) -> Window:
    kernel = tuple(int(k) for k in attrs["kernel_shape"])
    return conv_window(x.shape[2:], kernel, attrs, ceil_mode=bool(attrs.get("ceil_mode", 0)))


def _lowest(dtype: np.dtype):
    return -np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min


def _tap_view(canvas: np.ndarray, sl: tuple[slice, ...]) -> np.ndarray:
    return canvas[(slice(None), slice(None)) + sl]


# ----------------------------------------------------------------------------- MaxPool


def _tiles(x: np.ndarray, win: Window) -> np.ndarray | None:
    """``x`` as ``(N, C, o1, k1, o2, k2, ...)`` when the windows tile it exactly (kernel = stride, no
    padding or dilation, nothing left over), else None."""
    if win.kernel != win.strides or any(d != 1 for d in win.dilations):
        return None
    if any(win.pads_begin) or any(win.pads_end) or win.canvas != tuple(x.shape[2:]):
        return None
    shape = x.shape[:2] + tuple(v for o, k in zip(win.out, win.kernel) for v in (o, k))
    return x.reshape(shape)


def _maxpool_values(x: np.ndarray, win: Window) -> np.ndarray:
    tiles = _tiles(x, win) if x.ndim == 4 else None
    if tiles is not None:  # rows of a tile first (contiguous), then its columns
        kh, kw = win.kernel
        rows = tiles[:, :, :, 0].copy()
        for i in range(1, kh):
            np.maximum(rows, tiles[:, :, :, i], out=rows)
        best = rows[..., 0].copy()
        for j in range(1, kw):
            np.maximum(best, rows[..., j], out=best)
        return best
    canvas = pad_to_canvas(x, win, _lowest(x.dtype))
    taps = win.taps()
    best = _tap_view(canvas, taps[0][1]).copy()
    for _, sl in taps[1:]:
        np.maximum(best, _tap_view(canvas, sl), out=best)
    return best


def _maxpool_argmax(x: np.ndarray, win: Window) -> tuple[np.ndarray, np.ndarray]:
    """Max over taps and the index of the first winning tap, both shaped ``(N, C, *out)``."""
    canvas = pad_to_canvas(x, win, _lowest(x.dtype))
    views = [_tap_view(canvas, sl) for _, sl in win.taps()]
    best = views[0].copy()
    for v in views[1:]:
        np.maximum(best, v, out=best)
    # Walking the taps backwards leaves the first maximal tap in ``arg`` (rule 3). Multiply-add
    # on masks is several times faster than masked assignment (copyto/putmask) here.
    arg = np.zeros(best.shape, dtype=np.int16 if len(views) < 2**15 else np.int64)
    hit = np.empty(best.shape, dtype=bool)
    for t in range(len(views) - 1, -1, -1):
        np.equal(views[t], best, out=hit)
        arg *= ~hit
        if t:
            arg += hit * arg.dtype.type(t)
    return best, arg


def _flat_indices(
    x_shape: tuple[int, ...], win: Window, arg: np.ndarray, column_major: bool = False
) -> np.ndarray:
    """Global flat index into ``x`` of each window's winning tap (rule 3).

    index = plane offset of (n, c) + flat position of the window origin + flat offset of the tap,
    with row-major (or column-major) strides of the spatial axes.
    """
    n, c = x_shape[:2]
    spatial = x_shape[2:]
    nsp = len(spatial)
    strides = [1] * nsp
    order = range(nsp) if column_major else range(nsp - 1, -1, -1)
    step = 1
    for axis in order:
        strides[axis] = step
        step *= spatial[axis]
    tap_offset = np.array(
        [sum(t * d * st for t, d, st in zip(tap, win.dilations, strides)) for tap, _ in win.taps()],
        dtype=np.int64,
    )
    origin = np.zeros((1, 1) + win.out, dtype=np.int64)
    for axis, (s, b, o, st) in enumerate(zip(win.strides, win.pads_begin, win.out, strides)):
        shape = [1] * (2 + nsp)
        shape[2 + axis] = o
        origin = origin + ((np.arange(o) * s - b) * st).reshape(shape)
    plane = (np.arange(n * c, dtype=np.int64) * math.prod(spatial)).reshape((n, c) + (1,) * nsp)
    return tap_offset[arg] + origin + plane


@register("MaxPool")
def max_pool(inputs: list, attrs: dict, ctx: OpContext) -> tuple[np.ndarray, ...]:
    x = inputs[0]
    win = _pool_window(x, attrs)
    if getattr(ctx, "num_outputs", None) == 1:  # the node has no Indices output: skip the argmax
        return (_maxpool_values(x, win),)
    y, arg = _maxpool_argmax(x, win)
    return y, _flat_indices(x.shape, win, arg, column_major=int(attrs.get("storage_order", 0)) == 1)


@register_vjp("MaxPool")
def max_pool_vjp(inputs: list, attrs: dict, outputs, grads, ctx: OpContext) -> list:
    x = inputs[0]
    gy = grads[0]
    if gy is None:
        return [None]
    win = _pool_window(x, attrs)
    _, arg = _maxpool_argmax(x, win)
    idx = _flat_indices(x.shape, win, arg)
    gx = np.bincount(idx.reshape(-1), weights=gy.reshape(-1), minlength=x.size)
    return [gx.reshape(x.shape).astype(x.dtype, copy=False)]


# ----------------------------------------------------------------------------- AveragePool


def _tap_counts(x_shape: tuple[int, ...], win: Window, include_pad: bool) -> np.ndarray:
    """Number of counted taps per output pixel (rule 4), as a broadcastable ``(1, 1, *out)``."""
    counts = np.ones((1, 1) + win.out)
    for axis, (i, k, s, d, b, e, o) in enumerate(
        zip(x_shape[2:], win.kernel, win.strides, win.dilations, win.pads_begin, win.pads_end, win.out)
    ):
        lo, hi = (0, b + i + e) if include_pad else (b, b + i)
        pos = np.arange(o)[:, None] * s + np.arange(k)[None, :] * d
        per_axis = ((pos >= lo) & (pos < hi)).sum(axis=1).astype(np.float64)
        shape = [1] * (2 + len(win.out))
        shape[2 + axis] = o
        counts = counts * per_axis.reshape(shape)
    return counts


def _window_sum(canvas: np.ndarray, win: Window) -> np.ndarray:
    taps = win.taps()
    total = _tap_view(canvas, taps[0][1]).copy()
    for _, sl in taps[1:]:
        total += _tap_view(canvas, sl)
    return total


@register("AveragePool")
def average_pool(inputs: list, attrs: dict, ctx: OpContext) -> tuple[np.ndarray]:
    x = inputs[0]
    win = _pool_window(x, attrs)
    total = _window_sum(pad_to_canvas(x.astype(wide(x.dtype), copy=False), win), win)
    counts = _tap_counts(x.shape, win, bool(attrs.get("count_include_pad", 0)))
    return ((total / counts).astype(x.dtype, copy=False),)


@register_vjp("AveragePool")
def average_pool_vjp(inputs: list, attrs: dict, outputs, grads, ctx: OpContext) -> list:
    x = inputs[0]
    if grads[0] is None:
        return [None]
    win = _pool_window(x, attrs)
    counts = _tap_counts(x.shape, win, bool(attrs.get("count_include_pad", 0)))
    g = (grads[0] / counts).astype(x.dtype, copy=False)
    canvas = np.zeros(x.shape[:2] + win.canvas, dtype=x.dtype)
    for _, sl in win.taps():
        _tap_view(canvas, sl)[...] += g
    return [crop_canvas(canvas, win, x.shape[2:])]


# ----------------------------------------------------------------------------- LpPool


@register("LpPool")
def lp_pool(inputs: list, attrs: dict, ctx: OpContext) -> tuple[np.ndarray]:
    x = inputs[0]
    p = float(attrs.get("p", 2))
    win = _pool_window(x, attrs)
    total = _window_sum(pad_to_canvas(np.abs(x.astype(wide(x.dtype), copy=False)) ** p, win), win)
    return ((total ** (1.0 / p)).astype(x.dtype, copy=False),)


@register_vjp("LpPool")
def lp_pool_vjp(inputs: list, attrs: dict, outputs, grads, ctx: OpContext) -> list:
    x = inputs[0]
    if grads[0] is None:
        return [None]
    p = float(attrs.get("p", 2))
    win = _pool_window(x, attrs)
    y = outputs[0]
    nsp = len(win.out)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(y > 0, grads[0] * y ** (1.0 - p), 0.0)
    cols = im2col(pad_to_canvas(x, win), win)  # (N, C, *kernel, *out)
    scale = scale.reshape(x.shape[:2] + (1,) * nsp + win.out)
    gcols = scale * np.abs(cols) ** (p - 1.0) * np.sign(cols)
    return [crop_canvas(col2im(gcols.astype(x.dtype, copy=False), win), win, x.shape[2:])]


# ----------------------------------------------------------------------------- Global pools


def _spatial_axes(x: np.ndarray) -> tuple[int, ...]:
    return tuple(range(2, x.ndim))


@register("GlobalMaxPool")
def global_max_pool(inputs: list, attrs: dict, ctx: OpContext) -> tuple[np.ndarray]:
    return (inputs[0].max(axis=_spatial_axes(inputs[0]), keepdims=True),)


@register_vjp("GlobalMaxPool")
def global_max_pool_vjp(inputs: list, attrs: dict, outputs, grads, ctx: OpContext) -> list:
    """All of the gradient goes to the first maximal element of each (n, c) plane."""
    x = inputs[0]
    n, c = x.shape[:2]
    flat = x.reshape(n, c, -1)
    first = flat.argmax(axis=2)
    gx = np.zeros_like(flat)
    np.put_along_axis(gx, first[..., None], grads[0].reshape(n, c, 1).astype(x.dtype), axis=2)
    return [gx.reshape(x.shape)]


@register("GlobalAveragePool")
def global_average_pool(inputs: list, attrs: dict, ctx: OpContext) -> tuple[np.ndarray]:
    x = inputs[0]
    y = x.astype(wide(x.dtype), copy=False).mean(axis=_spatial_axes(x), keepdims=True)
    return (y.astype(x.dtype, copy=False),)


@register_vjp("GlobalAveragePool")
def global_average_pool_vjp(inputs: list, attrs: dict, outputs, grads, ctx: OpContext) -> list:
    x = inputs[0]
    size = math.prod(x.shape[2:])
    return [np.broadcast_to(grads[0] / size, x.shape).astype(x.dtype)]


@register("GlobalLpPool")
def global_lp_pool(inputs: list, attrs: dict, ctx: OpContext) -> tuple[np.ndarray]:
    x = inputs[0]
    p = float(attrs.get("p", 2))
    y = (np.abs(x.astype(wide(x.dtype), copy=False)) ** p).sum(axis=_spatial_axes(x), keepdims=True) ** (
        1.0 / p
    )
    return (y.astype(x.dtype, copy=False),)


@register_vjp("GlobalLpPool")
def global_lp_pool_vjp(inputs: list, attrs: dict, outputs, grads, ctx: OpContext) -> list:
    x = inputs[0]
    p = float(attrs.get("p", 2))
    y = outputs[0]
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(y > 0, grads[0] * y ** (1.0 - p), 0.0)
    return [(scale * np.abs(x) ** (p - 1.0) * np.sign(x)).astype(x.dtype, copy=False)]


# ----------------------------------------------------------------------------- MaxUnpool, MaxRoiPool


@register("MaxUnpool")
def max_unpool(inputs: list, attrs: dict, ctx: OpContext) -> tuple[np.ndarray]:
    """Scatter X into zeros at the flat Indices of MaxPool.

    The indices address the inferred shape ``(in-1)*s + k - pad_begin - pad_end``; an
    ``output_shape`` input larger than that pads the result with zeros at the end of each axis.
    This is what ONNX's backend test ``maxunpool_export_with_output_shape`` and onnx.reference
    expect; onnxruntime instead reads the indices as addresses into ``output_shape``.
    """
    x, indices = inputs[0], inputs[1]
    out_shape = inputs[2] if len(inputs) > 2 else None
    nsp = x.ndim - 2
    kernel = [int(k) for k in attrs["kernel_shape"]]
    strides = [int(s) for s in attrs.get("strides", [1] * nsp)]
    pads = [int(p) for p in attrs.get("pads", [0] * (2 * nsp))]
    spatial = [
        (i - 1) * s + k - pads[a] - pads[a + nsp]
        for a, (i, s, k) in enumerate(zip(x.shape[2:], strides, kernel))
    ]
    inferred = x.shape[:2] + tuple(spatial)
    y = np.zeros(math.prod(inferred), dtype=x.dtype)
    y[indices.reshape(-1)] = x.reshape(-1)
    y = y.reshape(inferred)
    if out_shape is None:
        return (y,)
    shape = tuple(int(v) for v in out_shape)
    result = np.zeros(shape, dtype=x.dtype)
    region = tuple(slice(0, min(a, b)) for a, b in zip(inferred, shape))
    result[region] = y[region]
    return (result,)


@register("MaxRoiPool")
def max_roi_pool(inputs: list, attrs: dict, ctx: OpContext) -> tuple[np.ndarray]:
    """Caffe RoI max pooling: rois ``[batch, x1, y1, x2, y2]`` scaled by ``spatial_scale`` and rounded;
    bin ``(ph, pw)`` covers rows ``[floor(ph*bh), ceil((ph+1)*bh))`` of the RoI; empty bins give 0."""
    x, rois = inputs[0], inputs[1]
    ph_n, pw_n = (int(v) for v in attrs["pooled_shape"])
    scale = float(attrs.get("spatial_scale", 1.0))
    _, c, h, w = x.shape
    y = np.zeros((rois.shape[0], c, ph_n, pw_n), dtype=x.dtype)
    for r, roi in enumerate(rois):
        b = int(roi[0])
        # C roundf: halves round away from zero (np.round would round them to even).
        x1, y1, x2, y2 = (int(math.copysign(math.floor(abs(v * scale) + 0.5), v)) for v in roi[1:5])
        rh, rw = max(y2 - y1 + 1, 1), max(x2 - x1 + 1, 1)
        bh, bw = rh / ph_n, rw / pw_n
        for ph in range(ph_n):
            hs = min(max(int(np.floor(ph * bh)) + y1, 0), h)
            he = min(max(int(np.ceil((ph + 1) * bh)) + y1, 0), h)
            for pw in range(pw_n):
                ws = min(max(int(np.floor(pw * bw)) + x1, 0), w)
                we = min(max(int(np.ceil((pw + 1) * bw)) + x1, 0), w)
                if he > hs and we > ws:
                    y[r, :, ph, pw] = x[b, :, hs:he, ws:we].max(axis=(1, 2))
    return (y,)
