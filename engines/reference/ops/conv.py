"""Op family: convolution (Conv, ConvTranspose, ConvInteger, DeformConv, Col2Im), forward and VJP.

Rules
-----
1. Layout is NC[D]HW; ``kernel_shape``, ``strides``, ``dilations`` default to the weight's kernel,
   ones and ones; ``pads`` is ``[x1_begin, x2_begin, ..., x1_end, x2_end, ...]``.
2. ``auto_pad``: NOTSET uses ``pads`` (default zeros); VALID pads nothing; SAME_UPPER/SAME_LOWER
   make ``out = ceil(in / stride)`` with total padding ``max(0, (out-1)*s + (k-1)*d + 1 - in)``,
   the odd pixel going at the end (UPPER) or the beginning (LOWER).
3. Conv is im2col + one GEMM per group over every image at once (accumulated in float64 for
   float16/bfloat16/float32 inputs, rounded once to the output type; see ``ops/__init__``,
   Exactness): the padded input, channels first (``(C, N, *canvas)``, widened in the same copy),
   is cut into a contiguous patch matrix ``cols[g, (c, kernel tap), (image, output pixel)]`` by
   one strided copy per kernel tap (no Python loop over output elements or images), and
   ``Y[g] = W[g] @ cols[g]``, an ``(M, K) @ (K, N*P)`` product, not N small ones. Images go
   in chunks of about ``_COLS_BYTES`` of patches (at least one image), so the patch matrix of a
   large batch stays in cache instead of being allocated whole.
   With stride 1 on every axis the canvas is laid out flat per channel, each tap becomes one
   contiguous block copy, and the GEMM also computes ``canvas - out`` junk columns per row that
   are dropped afterwards (about 15% extra FLOPs for 3x3 on 13x13, far less copying); the
   forward takes it only where the junk is at most a quarter of the columns.
   Weights and bias are widened through :func:`widen` (once per runner for constants).
4. The VJP of Conv: ``dW[g] = sum_n dY[n, g] @ cols[n, g]^T``, ``dX = col2im(W[g]^T @ dY[n, g])``
   (the scatter-add adjoint of rule 3), ``dB = sum(dY)`` over batch and space.
5. ConvTranspose is the adjoint of Conv: ``cols = W[g]^T @ X[n, g]`` scattered by col2im onto a
   canvas of ``s*(in-1) + (k-1)*d + 1 + output_padding`` pixels, then cropped by ``pads``. With
   ``output_shape`` (or SAME auto_pad, where ``output_shape = in * s``) the pads are derived:
   ``total = s*(in-1) + output_padding + (k-1)*d + 1 - out``; SAME_UPPER puts ``total//2`` at the
   beginning, anything else puts ``total - total//2`` there.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import OpContext, register, register_vjp, wide, widen


@dataclass(frozen=True)
class Window:
    """Geometry of a sliding window over the spatial axes of an NC[D]HW tensor."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    out: tuple[int, ...]  # output spatial shape

    @property
    def extent(self) -> tuple[int, ...]:
        """Dilated kernel size ``(k-1)*d + 1`` per axis."""
        return tuple((k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations))

    @property
    def canvas(self) -> tuple[int, ...]:
        """Padded spatial size the windows read: ``(out-1)*s + extent``."""
        return tuple((o - 1) * s + e for o, s, e in zip(self.out, self.strides, self.extent))

    def taps(self) -> list[tuple[tuple[int, ...], tuple[slice, ...]]]:
        """Each kernel tap's index and the strided slice of the canvas it reads for every output."""
        result = []
        for tap in itertools.product(*(range(k) for k in self.kernel)):
            sl = tuple(
                slice(t * d, t * d + (o - 1) * s + 1, s)
                for t, d, o, s in zip(tap, self.dilations, self.out, self.strides)
            )
            result.append((tap, sl))
        return result


def _ints(value, n: int, default: int) -> tuple[int, ...]:
    if value is None:
        return (default,) * n
    return tuple(int(v) for v in value)


def conv_window(
    spatial: Sequence[int],
    kernel: Sequence[int],
    attrs: dict,
    *,
    ceil_mode: bool = False,
) -> Window:
    """Resolve strides, dilations, pads and output shape for Conv and pooling (rule 2).

    ``ceil_mode`` (pooling only) rounds the output size up, dropping a last window that would
    start in the end padding, as onnxruntime and the ONNX reference do.
    """
    n = len(spatial)
    strides = _ints(attrs.get("strides"), n, 1)
    dilations = _ints(attrs.get("dilations"), n, 1)
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    extent = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = [-(-i // s) for i, s in zip(spatial, strides)]
        total = [max(0, (o - 1) * s + e - i) for o, s, e, i in zip(out, strides, extent, spatial)]
        small = [t // 2 for t in total]
        big = [t - t // 2 for t in total]
        begin, end = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
    else:
        if auto_pad == "VALID":
            pads = [0] * (2 * n)
        else:
            pads = list(_ints(attrs.get("pads"), 2 * n, 0))
        begin, end = pads[:n], pads[n:]
        out = []
        for i, e, s, b, en in zip(spatial, extent, strides, begin, end):
            span = i + b + en - e
            if ceil_mode:
                o = -(-span // s) + 1
                if (o - 1) * s >= i + b:
                    o -= 1
            else:
                o = span // s + 1
            out.append(o)
    if any(o <= 0 for o in out):
        raise ValueError(f"window {list(kernel)} over input {list(spatial)} gives empty output {out}")
    return Window(tuple(kernel), strides, dilations, tuple(begin), tuple(end), tuple(out))


def pad_to_canvas(x: np.ndarray, win: Window, fill: float = 0.0) -> np.ndarray:
    """Place ``x`` (NC + spatial) on the canvas the windows read, filling the rest with ``fill``.

    The canvas may be smaller than ``x`` plus pads (trailing pixels no window reads are dropped)
    or larger (ceil_mode windows reaching past the end padding).
    """
    canvas = win.canvas
    spatial = x.shape[2:]
    if all(b == 0 for b in win.pads_begin) and tuple(spatial) == canvas:
        return x
    buf = np.full(x.shape[:2] + canvas, fill, dtype=x.dtype)
    dst, src = [slice(None)] * 2, [slice(None)] * 2
    for b, i, c in zip(win.pads_begin, spatial, canvas):
        lo, hi = max(b, 0), min(b + i, c)
        dst.append(slice(lo, max(lo, hi)))
        src.append(slice(lo - b, lo - b + max(0, hi - lo)))
    buf[tuple(dst)] = x[tuple(src)]
    return buf


def crop_canvas(canvas: np.ndarray, win: Window, spatial: Sequence[int]) -> np.ndarray:
    """Adjoint of :func:`pad_to_canvas`: the part of the canvas that came from ``x``."""
    out = np.zeros(canvas.shape[:2] + tuple(spatial), dtype=canvas.dtype)
    dst, src = [slice(None)] * 2, [slice(None)] * 2
    for b, i, c in zip(win.pads_begin, spatial, canvas.shape[2:]):
        lo, hi = max(b, 0), min(b + i, c)
        src.append(slice(lo, max(lo, hi)))
        dst.append(slice(lo - b, lo - b + max(0, hi - lo)))
    out[tuple(dst)] = canvas[tuple(src)]
    return out


def im2col(canvas: np.ndarray, win: Window) -> np.ndarray:
    """Patches of a padded canvas ``(N, C, *canvas)`` as a contiguous ``(N, C, *kernel, *out)``."""
    n, c = canvas.shape[:2]
    cols = np.empty((n, c) + win.kernel + win.out, dtype=canvas.dtype)
    for tap, sl in win.taps():
        cols[(slice(None), slice(None)) + tap] = canvas[(slice(None), slice(None)) + sl]
    return cols


def col2im(cols: np.ndarray, win: Window) -> np.ndarray:
    """Scatter-add patches ``(N, C, *kernel, *out)`` back onto a canvas (adjoint of im2col)."""
    n, c = cols.shape[:2]
    canvas = np.zeros((n, c) + win.canvas, dtype=cols.dtype)
    for tap, sl in win.taps():
        canvas[(slice(None), slice(None)) + sl] += cols[(slice(None), slice(None)) + tap]
    return canvas


def _conv_setup(x: np.ndarray, w: np.ndarray, attrs: dict) -> tuple[Window, int]:
    group = int(attrs.get("group", 1))
    kernel = tuple(int(k) for k in attrs.get("kernel_shape", w.shape[2:]))
    if x.shape[1] != w.shape[1] * group:
        raise ValueError(
            f"Conv: input has {x.shape[1]} channels, weight expects {w.shape[1]} x group {group}"
        )
    return conv_window(x.shape[2:], kernel, attrs), group


def _grouped_cols(x: np.ndarray, win: Window, group: int) -> np.ndarray:
    """``cols[n, g, (c, tap), pixel]`` for a grouped convolution."""
    cols = im2col(pad_to_canvas(x, win), win)
    n, c = x.shape[:2]
    return cols.reshape(n, group, (c // group) * math.prod(win.kernel), math.prod(win.out))


def _flat_layout(win: Window) -> tuple[list[int], int, int]:
    """Tap offsets, columns per image (``L``) and canvas size of the stride-1 flat layout."""
    canvas = win.canvas
    pitch = [math.prod(canvas[i + 1 :]) for i in range(len(canvas))]
    offsets = [sum(t * d * p for t, d, p in zip(tap, win.dilations, pitch)) for tap, _ in win.taps()]
    return offsets, win.out[0] * pitch[0], math.prod(canvas)


def _uses_flat_layout(win: Window) -> bool:
    return all(s == 1 for s in win.strides) and all(p >= 0 for p in win.pads_begin + win.pads_end)


def _flat_canvas_cols(x: np.ndarray, win: Window) -> np.ndarray:
    """Stride-1 im2col with contiguous copies (rule 3's fast path): ``cols (N, C, taps, L)``.

    The padded canvas is laid out flat per channel with some zero slack at the end. For stride 1
    a kernel tap is then a flat shift: ``out[o] = canvas_flat[o_flat + tap_offset]`` where
    ``o_flat`` runs over ``L = out_0 * pitch_0`` positions (the rows of the first axis, including
    ``canvas - out`` junk columns per row, dropped by :func:`_drop_junk_columns`). Each tap is one
    block copy with long contiguous rows instead of a strided gather.
    """
    n, c = x.shape[:2]
    offsets, length, size = _flat_layout(win)
    flat = np.zeros((n, c, max(size, offsets[-1] + length)), dtype=x.dtype)
    body = flat[:, :, :size].reshape((n, c) + win.canvas)
    # Trailing input pixels that no window reads fall off the canvas.
    counts = [min(i, cv - b) for b, i, cv in zip(win.pads_begin, x.shape[2:], win.canvas)]
    dst = (slice(None), slice(None)) + tuple(slice(b, b + k) for b, k in zip(win.pads_begin, counts))
    body[dst] = x[(slice(None), slice(None)) + tuple(slice(0, k) for k in counts)]
    cols = np.empty((n, c, len(offsets), length), dtype=x.dtype)
    for k, off in enumerate(offsets):
        cols[:, :, k] = flat[:, :, off : off + length]
    return cols


def _flat_col2im(gcols: np.ndarray, win: Window, spatial: Sequence[int]) -> np.ndarray:
    """Adjoint of :func:`_flat_canvas_cols`: scatter-add ``(N, C, taps, L)`` back onto the input."""
    n, c = gcols.shape[:2]
    offsets, length, size = _flat_layout(win)
    flat = np.zeros((n, c, max(size, offsets[-1] + length)), dtype=gcols.dtype)
    for k, off in enumerate(offsets):
        flat[:, :, off : off + length] += gcols[:, :, k]
    return crop_canvas(flat[:, :, :size].reshape((n, c) + win.canvas), win, spatial)


def _drop_junk_columns(y: np.ndarray, win: Window) -> np.ndarray:
    """``(N, M, L)`` in the flat layout to a contiguous ``(N, M, *out)``."""
    n, m = y.shape[:2]
    rows = y.reshape((n, m, win.out[0]) + win.canvas[1:])
    return np.ascontiguousarray(rows[(slice(None),) * 3 + tuple(slice(0, o) for o in win.out[1:])])


def _add_junk_columns(gy: np.ndarray, win: Window) -> np.ndarray:
    """Adjoint of :func:`_drop_junk_columns`: ``(N, M, *out)`` to ``(N, M, L)`` with zero junk."""
    n, m = gy.shape[:2]
    rows = np.zeros((n, m, win.out[0]) + win.canvas[1:], dtype=gy.dtype)
    rows[(slice(None),) * 3 + tuple(slice(0, o) for o in win.out[1:])] = gy
    return rows.reshape(n, m, -1)


_COLS_BYTES = 1 << 23  # patch-matrix bytes per GEMM chunk (rule 3)


def _canvas_cn(x: np.ndarray, win: Window, dtype: np.dtype, flat: bool) -> np.ndarray:
    """``x`` (N, C, *spatial) placed channels first on the zero-padded canvas, in ``dtype``, in one
    copy: ``(C, N, *canvas)``, or with ``flat`` (rule 3's stride-1 layout) ``(C, N, size)`` with
    zero slack after the canvas so that every flat tap shift stays in bounds."""
    n, c = x.shape[:2]
    canvas = win.canvas
    xt = x.swapaxes(0, 1)
    if not flat and n == 1 and all(b == 0 for b in win.pads_begin) and tuple(x.shape[2:]) == canvas:
        return xt.astype(dtype, copy=False)  # nothing to pad or transpose
    size = math.prod(canvas)
    if flat:
        offsets, length, _ = _flat_layout(win)
        total = max(size, offsets[-1] + length)
        if total == size and tuple(x.shape[2:]) == canvas and all(b == 0 for b in win.pads_begin):
            return np.ascontiguousarray(xt, dtype=dtype).reshape(c, n, size)
        buf = np.zeros((c, n, total), dtype=dtype)
        body = buf[:, :, :size].reshape((c, n) + canvas)
    else:
        buf = body = np.zeros((c, n) + canvas, dtype=dtype)
    dst, src = [slice(None)] * 2, [slice(None)] * 2
    for b, i, cv in zip(win.pads_begin, x.shape[2:], canvas):
        lo, hi = max(b, 0), min(b + i, cv)
        dst.append(slice(lo, max(lo, hi)))
        src.append(slice(lo - b, lo - b + max(0, hi - lo)))
    body[tuple(dst)] = xt[tuple(src)]
    return buf


def _batched_cols(x: np.ndarray, win: Window, dtype: np.dtype, flat: bool) -> np.ndarray:
    """Patches of every image side by side, ``(C, taps, N * columns)`` (rule 3)."""
    n, c = x.shape[:2]
    canvas = _canvas_cn(x, win, dtype, flat)
    if flat:
        offsets, length, _ = _flat_layout(win)
        if offsets == [0] and canvas.shape[2] == length:  # 1x1 kernel: the canvas is the matrix
            return canvas.reshape(c, 1, n * length)
        cols = np.empty((c, len(offsets), n, length), dtype=dtype)
        for k, off in enumerate(offsets):
            cols[:, k] = canvas[:, :, off : off + length]
        return cols.reshape(c, len(offsets), n * length)
    taps = win.taps()
    cols = np.empty((c, len(taps), n) + win.out, dtype=dtype)
    for k, (_, sl) in enumerate(taps):
        cols[:, k] = canvas[(slice(None), slice(None)) + sl]
    return cols.reshape(c, len(taps), -1)


@register("Conv")
def conv(inputs: list, attrs: dict, ctx: OpContext) -> tuple[np.ndarray]:
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    win, group = _conv_setup(x, w, attrs)
    acc = wide(x.dtype)  # accumulate in float64 (ops/__init__: Exactness)
    n, c, m = x.shape[0], x.shape[1], w.shape[0]
    wg = widen(w, acc).reshape(group, m // group, -1)  # widened before reshaping: a constant's copy
    bias = None if b is None else widen(b, acc).reshape((m, 1) + (1,) * len(win.out))
    # The flat layout's junk columns cost GEMM work: above a quarter more, strided copies win.
    flat = _uses_flat_layout(win) and 4 * _flat_layout(win)[1] <= 5 * math.prod(win.out)
    columns = _flat_layout(win)[1] if flat else math.prod(win.out)
    per_image = c * math.prod(win.kernel) * columns * acc.itemsize
    step = max(1, _COLS_BYTES // max(per_image, 1))
    y = np.empty((n, m) + win.out, dtype=x.dtype)
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        cols = _batched_cols(x[lo:hi], win, acc, flat).reshape(group, -1, (hi - lo) * columns)
        yc = np.matmul(wg[0], cols[0]) if group == 1 else np.matmul(wg, cols)
        if flat:  # drop the junk columns of each row
            rows = yc.reshape((m, hi - lo, win.out[0]) + win.canvas[1:])
            yc = rows[(slice(None),) * 3 + tuple(slice(0, o) for o in win.out[1:])]
        else:
            yc = yc.reshape((m, hi - lo) + win.out)
        # One pass adds the bias (in the wide type), transposes to (N, M) and rounds once.
        target = y[lo:hi].swapaxes(0, 1)
        if bias is None:
            np.copyto(target, yc, casting="unsafe")
        else:
            np.add(yc, bias, out=target, casting="unsafe")
    return (y,)


@register_vjp("Conv")
def conv_vjp(inputs: list, attrs: dict, outputs, grads, ctx: OpContext) -> list:
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    gy = grads[0]
    if gy is None:
        return [None] * len(inputs)
    win, group = _conv_setup(x, w, attrs)
    n, m = x.shape[0], w.shape[0]
    c = x.shape[1]
    gy_x = gy.astype(x.dtype, copy=False)
    flat = _uses_flat_layout(win)
    if flat:
        length = _flat_layout(win)[1]
        cols = _flat_canvas_cols(x, win).reshape(n, group, -1, length)
        gyg = _add_junk_columns(gy_x, win).reshape(n, group, m // group, length)
    else:
        cols = _grouped_cols(x, win, group)
        gyg = gy_x.reshape(n, group, m // group, -1)
    wg = w.reshape(group, m // group, -1).astype(x.dtype, copy=False)
    gw = np.matmul(gyg, cols.swapaxes(-1, -2)).sum(axis=0).reshape(w.shape).astype(w.dtype, copy=False)
    gcols = np.matmul(wg.swapaxes(-1, -2)[None], gyg)  # (n, g, cg*taps, columns)
    if flat:
        gx = _flat_col2im(gcols.reshape(n, c, math.prod(win.kernel), -1), win, x.shape[2:])
    else:
        gx = crop_canvas(col2im(gcols.reshape((n, c) + win.kernel + win.out), win), win, x.shape[2:])
    result = [gx.astype(x.dtype, copy=False), gw]
    if len(inputs) > 2:
        result.append(
            None if b is None else gy.sum(axis=(0,) + tuple(range(2, gy.ndim))).astype(b.dtype, copy=False)
        )
    return result


# ----------------------------------------------------------------------------- ConvTranspose


def _conv_transpose_setup(x: np.ndarray, w: np.ndarray, attrs: dict) -> tuple[Window, int, tuple[int, ...]]:
    """The Window of the equivalent Conv whose canvas is the ConvTranspose output (rule 5).

    Returns the window (its ``out`` is the ConvTranspose *input* size), the group count and the
    ConvTranspose output spatial shape. The canvas origin sits ``pads_begin`` before output pixel 0.
    """
    nsp = x.ndim - 2
    group = int(attrs.get("group", 1))
    kernel = tuple(int(k) for k in attrs.get("kernel_shape", w.shape[2:]))
    strides = _ints(attrs.get("strides"), nsp, 1)
    dilations = _ints(attrs.get("dilations"), nsp, 1)
    out_pad = _ints(attrs.get("output_padding"), nsp, 0)
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    spatial = x.shape[2:]
    full = [
        s * (i - 1) + (k - 1) * d + 1 + op
        for s, i, k, d, op in zip(strides, spatial, kernel, dilations, out_pad)
    ]
    output_shape = attrs.get("output_shape")
    if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if output_shape is None:
            out = [i * s for i, s in zip(spatial, strides)]
        else:
            out = [int(v) for v in list(output_shape)[-nsp:]]
        total = [f - o for f, o in zip(full, out)]
        if auto_pad == "SAME_UPPER":
            begin = [t // 2 for t in total]
        else:
            begin = [t - t // 2 for t in total]
        end = [t - b for t, b in zip(total, begin)]
    else:
        pads = [0] * (2 * nsp) if auto_pad == "VALID" else list(_ints(attrs.get("pads"), 2 * nsp, 0))
        begin, end = pads[:nsp], pads[nsp:]
        out = [f - b - e for f, b, e in zip(full, begin, end)]
    win = Window(kernel, strides, dilations, tuple(begin), tuple(end), tuple(spatial))
    return win, group, tuple(out)


@register("ConvTranspose")
def conv_transpose(inputs: list, attrs: dict, ctx: OpContext) -> tuple[np.ndarray]:
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    win, group, out = _conv_transpose_setup(x, w, attrs)
    out_dtype = x.dtype
    x = x.astype(wide(x.dtype), copy=False)
    n, c = x.shape[:2]
    mg = w.shape[1]
    xg = x.reshape(n, group, c // group, -1)
    wg = widen(w, x.dtype).reshape(group, c // group, -1)
    cols = np.matmul(wg.swapaxes(-1, -2)[None], xg)  # (n, g, mg*taps, pixels)
    cols = cols.reshape((n, group * mg) + win.kernel + win.out)
    y = crop_canvas(col2im(cols, win), win, out)  # output pixel o is canvas pixel o + pads_begin
    if b is not None:
        y += widen(b, y.dtype).reshape((1, -1) + (1,) * len(out))
    return (y.astype(out_dtype, copy=False),)


@register_vjp("ConvTranspose")
def conv_transpose_vjp(inputs: list, attrs: dict, outputs, grads, ctx: OpContext) -> list:
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    gy = grads[0]
    if gy is None:
        return [None] * len(inputs)
    win, group, out = _conv_transpose_setup(x, w, attrs)
    n, c = x.shape[:2]
    gcols = im2col(pad_to_canvas(gy.astype(x.dtype, copy=False), win), win)
    gcols = gcols.reshape(n, group, -1, math.prod(win.out))  # (n, g, mg*taps, pixels)
    xg = x.reshape(n, group, c // group, -1)
    wg = w.reshape(group, c // group, -1).astype(x.dtype, copy=False)
    gx = np.matmul(wg[None], gcols).reshape(x.shape)
    gw = np.matmul(xg, gcols.swapaxes(-1, -2)).sum(axis=0).reshape(w.shape)
    result = [gx.astype(x.dtype, copy=False), gw.astype(w.dtype, copy=False)]
    if len(inputs) > 2:
        result.append(
            None if b is None else gy.sum(axis=(0,) + tuple(range(2, gy.ndim))).astype(b.dtype, copy=False)
        )
    return result


# ----------------------------------------------------------------------------- integer and others


@register("ConvInteger")
def conv_integer(inputs: list, attrs: dict, ctx: OpContext) -> tuple[np.ndarray]:
    """``(X - x_zero_point) conv (W - w_zero_point)`` accumulated exactly, as int32.

    ``w_zero_point`` may be per output channel. Padding is with the zero point (zero after the
    subtraction). float64 GEMM is exact here: every partial sum stays far below 2**53.
    """
    x, w = inputs[0], inputs[1]
    xz = inputs[2] if len(inputs) > 2 and inputs[2] is not None else np.zeros((), x.dtype)
    wz = inputs[3] if len(inputs) > 3 and inputs[3] is not None else np.zeros((), w.dtype)
    xf = x.astype(np.float64) - np.asarray(xz, np.float64).reshape(())
    wz = np.asarray(wz, np.float64)
    wf = w.astype(np.float64) - (wz.reshape((-1,) + (1,) * (w.ndim - 1)) if wz.size > 1 else wz.reshape(()))
    (y,) = conv([xf, wf], attrs, ctx)
    return (np.rint(y).astype(np.int32),)


@register("DeformConv")
def deform_conv(inputs: list, attrs: dict, ctx: OpContext) -> tuple[np.ndarray]:
    """Deformable convolution (2-D): each kernel tap samples the input bilinearly at its offset.

    Inputs X (N, C, H, W), W (M, C/group, kh, kw), offset (N, offset_group*2*kh*kw, oh, ow) as
    (dy, dx) pairs per tap, optional B and mask (N, offset_group*kh*kw, oh, ow). Samples outside
    the input read zero. Patches for all taps are gathered at once, then one GEMM per group.
    """
    x, w, offset = inputs[0], inputs[1], inputs[2]
    b = inputs[3] if len(inputs) > 3 else None
    mask = inputs[4] if len(inputs) > 4 else None
    group = int(attrs.get("group", 1))
    og = int(attrs.get("offset_group", 1))
    kernel = tuple(int(k) for k in attrs.get("kernel_shape", w.shape[2:]))
    win = conv_window(x.shape[2:], kernel, attrs)
    n, c, h, wd = x.shape
    kh, kw = kernel
    oh, ow = win.out
    taps = kh * kw
    off = offset.reshape(n, og, taps, 2, oh, ow)
    msk = np.ones((n, og, taps, oh, ow), x.dtype) if mask is None else mask.reshape(n, og, taps, oh, ow)
    ky, kx = np.meshgrid(np.arange(kh), np.arange(kw), indexing="ij")
    base_y = (np.arange(oh) * win.strides[0] - win.pads_begin[0])[None, :, None] + (
        ky.reshape(-1) * win.dilations[0]
    )[:, None, None]
    base_x = (np.arange(ow) * win.strides[1] - win.pads_begin[1])[None, None, :] + (
        kx.reshape(-1) * win.dilations[1]
    )[:, None, None]
    py = base_y[None, None] + off[:, :, :, 0]  # (n, og, taps, oh, ow)
    px = base_x[None, None] + off[:, :, :, 1]
    y0, x0 = np.floor(py).astype(np.int64), np.floor(px).astype(np.int64)
    fy, fx = py - y0, px - x0
    cpg = c // og
    xr = x.reshape(n, og, cpg, h * wd)
    samples = np.zeros((n, og, cpg, taps, oh, ow), dtype=np.result_type(x.dtype, offset.dtype))
    for dy, dx in ((0, 0), (0, 1), (1, 0), (1, 1)):
        yy, xx = y0 + dy, x0 + dx
        wgt = (fy if dy else 1 - fy) * (fx if dx else 1 - fx)
        valid = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < wd)
        idx = np.where(valid, yy * wd + xx, 0).reshape(n, og, 1, -1)
        vals = np.take_along_axis(xr, np.broadcast_to(idx, (n, og, cpg, idx.shape[-1])), axis=3)
        samples += vals.reshape(n, og, cpg, taps, oh, ow) * (wgt * valid * msk)[:, :, None]
    cols = samples.reshape(n, group, (c // group) * taps, oh * ow)
    m = w.shape[0]
    cols = cols.astype(wide(cols.dtype), copy=False)
    y = np.matmul(widen(w, cols.dtype).reshape(group, m // group, -1)[None], cols).reshape(n, m, oh, ow)
    if b is not None:
        y = y + b.reshape(1, m, 1, 1)
    return (y.astype(x.dtype, copy=False),)


@register("Col2Im")
def col2im_op(inputs: list, attrs: dict, ctx: OpContext) -> tuple[np.ndarray]:
    """Col2Im: input ``(N, C*prod(block), L)`` is scattered onto ``image_shape`` (sum of overlaps)."""
    x, image_shape, block_shape = inputs[0], inputs[1], inputs[2]
    image = tuple(int(v) for v in image_shape)
    block = tuple(int(v) for v in block_shape)
    win = conv_window(image, block, attrs)
    n, ck, length = x.shape
    if length != math.prod(win.out):
        raise ValueError(f"Col2Im: {length} blocks given, image and block shapes imply {math.prod(win.out)}")
    c = ck // math.prod(block)
    cols = x.reshape((n, c) + block + win.out)
    return (crop_canvas(col2im(cols, win), win, image),)
