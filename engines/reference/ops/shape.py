"""Op family: shape manipulation, padding, slicing and resizing.

Rules:

1. Version-dependent inputs: Reshape's shape (input from opset 5), Split's sizes and
   Squeeze/Unsqueeze's axes (inputs from opset 13), Slice's starts/ends/axes/steps (inputs from
   opset 10), Pad's pads/value (inputs from opset 11). Both forms are accepted when present.
2. Ops that only move elements (Reshape, Transpose, Slice, Pad, Tile, DepthToSpace, ...) are
   written as an index gather, so their VJP is the scatter-add of the cotangent through the same
   indices (``np.add.at``): repeated reads (Pad reflect/edge/wrap, Tile, Expand) accumulate.
3. Resize is separable: along each resized axis an output sample is a weighted sum of input
   samples (nearest: one weight 1; linear: 2 taps, cubic: 4 taps, wider under ``antialias``
   when downsampling). Each axis is one (out x in) weight matrix, so the VJP applies the
   transposes. Coordinates follow ``coordinate_transformation_mode``; out-of-range taps clamp to
   the edge, or drop and renormalize with ``exclude_outside``; ``tf_crop_and_resize`` writes
   ``extrapolation_value`` outside the region.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnx.numpy_helper
from mconv.errors import InputError

from . import register, register_vjp
from .elementwise import _same, cast_array, is_float, unbroadcast


def _opt(inputs: list, i: int):
    """Input ``i`` or ``None`` when omitted (absent or empty name)."""
    return inputs[i] if len(inputs) > i and inputs[i] is not None else None


def _ints(a) -> list[int]:
    return [int(v) for v in np.asarray(a).ravel()]


def _norm_axis(a: int, rank: int) -> int:
    return a + rank if a < 0 else a


def _none_for_rest(inputs: list, first) -> list:
    return [first] + [None] * (len(inputs) - 1)


# --------------------------------------------------------------------------- Reshape, Flatten, Squeeze


def reshape_target(x_shape: tuple[int, ...], shape: list[int], allowzero: bool) -> list[int]:
    """ONNX Reshape's target: 0 copies the input dim (unless ``allowzero``), one -1 is inferred."""
    out = list(shape)
    if not allowzero:
        out = [x_shape[i] if d == 0 else d for i, d in enumerate(out)]
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        total = int(np.prod(x_shape))
        out[out.index(-1)] = total // known if known else 0
    return out


@register("Reshape")
def reshape(inputs, attrs, ctx):
    x = inputs[0]
    shape = _ints(inputs[1]) if _opt(inputs, 1) is not None else list(attrs["shape"])
    return (x.reshape(reshape_target(x.shape, shape, bool(attrs.get("allowzero", 0)))),)


@register("Flatten")
def flatten(inputs, attrs, ctx):
    x = inputs[0]
    axis = _norm_axis(attrs.get("axis", 1), x.ndim)
    lead = int(np.prod(x.shape[:axis]))
    return (x.reshape(lead, int(np.prod(x.shape[axis:]))),)


def _axes_from(inputs, attrs, ctx):
    if _opt(inputs, 1) is not None:
        return _ints(inputs[1])
    return list(attrs["axes"]) if "axes" in attrs else None


@register("Squeeze")
def squeeze(inputs, attrs, ctx):
    x = inputs[0]
    axes = _axes_from(inputs, attrs, ctx)
    if axes is None:
        return (x.reshape([d for d in x.shape if d != 1]),)
    return (np.squeeze(x, axis=tuple(_norm_axis(a, x.ndim) for a in axes)),)


@register("Unsqueeze")
def unsqueeze(inputs, attrs, ctx):
    x = inputs[0]
    axes = _axes_from(inputs, attrs, ctx) or []
    rank = x.ndim + len(axes)
    return (np.expand_dims(x, tuple(sorted(_norm_axis(a, rank) for a in axes))),)


@register_vjp("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def reshape_like_vjp(inputs, attrs, outputs, grads, ctx):
    x = inputs[0]
    gx = _same(x, np.reshape(grads[0], x.shape)) if is_float(x) else None
    return _none_for_rest(inputs, gx)


# --------------------------------------------------------------------------- Transpose, Concat, Split


@register("Transpose")
def transpose(inputs, attrs, ctx):
    x = inputs[0]
    perm = attrs.get("perm", list(range(x.ndim))[::-1])
    return (np.transpose(x, perm),)


@register_vjp("Transpose")
def transpose_vjp(inputs, attrs, outputs, grads, ctx):
    x = inputs[0]
    perm = attrs.get("perm", list(range(x.ndim))[::-1])
    return [np.transpose(grads[0], np.argsort(perm)).astype(x.dtype)]


@register("Concat")
def concat(inputs, attrs, ctx):
    xs = [x for x in inputs if x is not None]
    return (np.concatenate(xs, axis=attrs["axis"]),)


@register_vjp("Concat")
def concat_vjp(inputs, attrs, outputs, grads, ctx):
    axis = _norm_axis(attrs["axis"], outputs[0].ndim)
    cuts = np.cumsum([x.shape[axis] for x in inputs])[:-1]
    parts = np.split(grads[0], cuts, axis=axis)
    return [p.astype(x.dtype) if is_float(x) else None for p, x in zip(parts, inputs)]


def _split_sizes(inputs, attrs, ctx, dim: int) -> list[int]:
    if _opt(inputs, 1) is not None:
        return _ints(inputs[1])
    if "split" in attrs:
        return list(attrs["split"])
    n = attrs.get("num_outputs") or ctx.num_outputs
    if n is None:
        raise InputError(
            "Split: cannot tell how many outputs to make",
            where="Split",
            hint="give the split input, num_outputs, or set OpContext.num_outputs",
        )
    # opset 18: the last chunk is smaller when dim does not divide evenly.
    size = -(-dim // n)
    return [min(size, max(dim - i * size, 0)) for i in range(n)]


@register("Split")
def split(inputs, attrs, ctx):
    x = inputs[0]
    axis = _norm_axis(attrs.get("axis", 0), x.ndim)
    sizes = _split_sizes(inputs, attrs, ctx, x.shape[axis])
    return tuple(np.split(x, np.cumsum(sizes)[:-1], axis=axis))


@register_vjp("Split")
def split_vjp(inputs, attrs, outputs, grads, ctx):
    x = inputs[0]
    axis = _norm_axis(attrs.get("axis", 0), x.ndim)
    parts = [np.zeros_like(o) if g is None else np.asarray(g, x.dtype) for o, g in zip(outputs, grads)]
    return _none_for_rest(inputs, np.concatenate(parts, axis=axis))


# --------------------------------------------------------------------------- gather-by-axes helper


def _gather_axes(x: np.ndarray, idx: dict[int, np.ndarray]) -> np.ndarray:
    """``x`` indexed along each axis in ``idx`` by an index vector (others kept whole)."""
    return x[_ix(x.shape, idx)]


def _ix(shape, idx: dict[int, np.ndarray]):
    vecs = [idx.get(a, np.arange(n)) for a, n in enumerate(shape)]
    return np.ix_(*vecs) if vecs else ()


def _scatter_axes(shape, dtype, idx: dict[int, np.ndarray], g: np.ndarray) -> np.ndarray:
    """The transpose of :func:`_gather_axes`: cotangent summed back into ``shape``."""
    gx = np.zeros(shape, dtype=dtype)
    np.add.at(gx, _ix(shape, idx), np.asarray(g, dtype=dtype))
    return gx


# --------------------------------------------------------------------------- Slice


def _slice_indices(inputs, attrs, ctx, shape) -> dict[int, np.ndarray]:
    if ctx.opset < 10 and "starts" in attrs:
        starts, ends = list(attrs["starts"]), list(attrs["ends"])
        axes = list(attrs.get("axes", range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts, ends = _ints(inputs[1]), _ints(inputs[2])
        axes = _ints(inputs[3]) if _opt(inputs, 3) is not None else list(range(len(starts)))
        steps = _ints(inputs[4]) if _opt(inputs, 4) is not None else [1] * len(starts)
    idx = {}
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = _norm_axis(a, len(shape))
        n = shape[a]
        s = s + n if s < 0 else s
        e = e + n if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), n), min(max(e, 0), n)
        else:
            s, e = min(max(s, 0), n - 1), min(max(e, -1), n - 1)
        idx[a] = np.arange(s, e, st, dtype=np.int64)
    return idx


@register("Slice")
def slice_(inputs, attrs, ctx):
    x = inputs[0]
    return (_gather_axes(x, _slice_indices(inputs, attrs, ctx, x.shape)),)


@register_vjp("Slice")
def slice_vjp(inputs, attrs, outputs, grads, ctx):
    x = inputs[0]
    gx = _scatter_axes(x.shape, x.dtype, _slice_indices(inputs, attrs, ctx, x.shape), grads[0])
    return _none_for_rest(inputs, gx)


# --------------------------------------------------------------------------- Pad


def _pad_spec(inputs, attrs, ctx, x):
    if ctx.opset < 11:
        pads = list(attrs.get("pads", attrs.get("paddings", [])))
        value = attrs.get("value", 0.0)
        axes = list(range(x.ndim))
    else:
        pads = _ints(inputs[1])
        v = _opt(inputs, 2)
        value = np.asarray(v).ravel()[0] if v is not None and np.size(v) else 0
        axes = _ints(inputs[3]) if _opt(inputs, 3) is not None else list(range(x.ndim))
    axes = [_norm_axis(a, x.ndim) for a in axes]
    k = len(axes)
    return attrs.get("mode", "constant"), {a: (pads[i], pads[i + k]) for i, a in enumerate(axes)}, value


def _pad_indices(mode: str, n: int, before: int, after: int) -> np.ndarray:
    """Source index of each output position along one axis; -1 where the constant goes."""
    p = np.arange(-before, n + after, dtype=np.int64)
    if mode == "constant":
        return np.where((p >= 0) & (p < n), p, -1)
    if n == 0:
        return np.full(p.shape, -1, dtype=np.int64)
    if mode == "edge":
        return np.clip(p, 0, n - 1)
    if mode == "wrap":
        return np.mod(p, n)
    if mode == "reflect":
        if n == 1:
            return np.zeros_like(p)
        period = 2 * (n - 1)
        m = np.mod(p, period)
        return np.where(m < n, m, period - m)
    raise InputError(f"Pad: unknown mode {mode!r}", where="Pad", hint="use constant, reflect, edge or wrap")


def _pad_plan(inputs, attrs, ctx):
    x = inputs[0]
    mode, spec, value = _pad_spec(inputs, attrs, ctx, x)
    idx = {a: _pad_indices(mode, x.shape[a], b, e) for a, (b, e) in spec.items()}
    return x, idx, value


@register("Pad")
def pad(inputs, attrs, ctx):
    x, idx, value = _pad_plan(inputs, attrs, ctx)
    safe = {a: np.maximum(v, 0) for a, v in idx.items()}
    if x.size == 0:
        out_shape = [len(idx[a]) if a in idx else n for a, n in enumerate(x.shape)]
        return (np.full(out_shape, value, dtype=x.dtype),)
    y = _gather_axes(x, safe).copy()
    for a, v in idx.items():
        if (v < 0).any():
            sl = [slice(None)] * x.ndim
            sl[a] = v < 0
            y[tuple(sl)] = value
    return (y,)


@register_vjp("Pad")
def pad_vjp(inputs, attrs, outputs, grads, ctx):
    x, idx, _ = _pad_plan(inputs, attrs, ctx)
    g = np.array(grads[0], dtype=x.dtype)
    for a, v in idx.items():
        sl = [slice(None)] * x.ndim
        sl[a] = v < 0
        g[tuple(sl)] = 0  # the constant fill does not depend on x
    safe = {a: np.maximum(v, 0) for a, v in idx.items()}
    return _none_for_rest(inputs, _scatter_axes(x.shape, x.dtype, safe, g))


# --------------------------------------------------------------------------- Expand, Tile


@register("Expand")
def expand(inputs, attrs, ctx):
    x, shape = inputs
    return (np.array(np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(_ints(shape))))),)


@register_vjp("Expand")
def expand_vjp(inputs, attrs, outputs, grads, ctx):
    x = inputs[0]
    return [unbroadcast(grads[0], x.shape, x.dtype) if is_float(x) else None, None]


@register("Tile")
def tile(inputs, attrs, ctx):
    return (np.tile(inputs[0], _ints(inputs[1])),)


@register_vjp("Tile")
def tile_vjp(inputs, attrs, outputs, grads, ctx):
    x = inputs[0]
    reps = _ints(inputs[1])
    inter = [v for r, d in zip(reps, x.shape) for v in (r, d)]
    g = np.reshape(grads[0], inter).sum(axis=tuple(range(0, 2 * x.ndim, 2)))
    return [g.astype(x.dtype), None]


# --------------------------------------------------------------------------- Shape, Size, ConstantOfShape, Range


@register("Shape")
def shape_(inputs, attrs, ctx):
    dims = np.array(inputs[0].shape, dtype=np.int64)
    r = len(dims)
    start = attrs.get("start", 0)
    end = attrs.get("end", r)
    start = min(max(start + r if start < 0 else start, 0), r)
    end = min(max(end + r if end < 0 else end, 0), r)
    return (dims[start:end],)


@register("Size")
def size(inputs, attrs, ctx):
    return (np.array(inputs[0].size, dtype=np.int64),)


@register("ConstantOfShape")
def constant_of_shape(inputs, attrs, ctx):
    value = attrs.get("value")
    if isinstance(value, onnx.TensorProto):
        value = onnx.numpy_helper.to_array(value)
    value = np.zeros(1, dtype=np.float32) if value is None else np.asarray(value)
    return (np.full(_ints(inputs[0]), value.ravel()[0], dtype=value.dtype),)


@register("Range")
def range_(inputs, attrs, ctx):
    start, limit, delta = (np.asarray(v).ravel()[0] for v in inputs)
    n = max(int(math.ceil((float(limit) - float(start)) / float(delta))), 0)
    dtype = np.asarray(inputs[0]).dtype
    return (
        (start + np.arange(n, dtype=np.float64 if dtype.kind == "f" else np.int64) * delta).astype(dtype),
    )


# --------------------------------------------------------------------------- DepthToSpace, SpaceToDepth


def _d2s(x: np.ndarray, b: int, mode: str) -> np.ndarray:
    n, c, h, w = x.shape
    if mode == "CRD":
        t = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    else:
        t = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    return t.reshape(n, c // (b * b), h * b, w * b)


def _s2d(x: np.ndarray, b: int, mode: str) -> np.ndarray:
    n, c, h, w = x.shape
    t = x.reshape(n, c, h // b, b, w // b, b)
    t = t.transpose(0, 1, 3, 5, 2, 4) if mode == "CRD" else t.transpose(0, 3, 5, 1, 2, 4)
    return t.reshape(n, c * b * b, h // b, w // b)


@register("DepthToSpace")
def depth_to_space(inputs, attrs, ctx):
    return (_d2s(inputs[0], attrs["blocksize"], attrs.get("mode", "DCR")),)


@register_vjp("DepthToSpace")
def depth_to_space_vjp(inputs, attrs, outputs, grads, ctx):
    g = _s2d(np.asarray(grads[0]), attrs["blocksize"], attrs.get("mode", "DCR"))
    return [g.astype(inputs[0].dtype)]


@register("SpaceToDepth")
def space_to_depth(inputs, attrs, ctx):
    return (_s2d(inputs[0], attrs["blocksize"], attrs.get("mode", "DCR")),)


@register_vjp("SpaceToDepth")
def space_to_depth_vjp(inputs, attrs, outputs, grads, ctx):
    return [_d2s(np.asarray(grads[0]), attrs["blocksize"], attrs.get("mode", "DCR")).astype(inputs[0].dtype)]


# --------------------------------------------------------------------------- Trilu, ReverseSequence, CenterCropPad
# (EyeLike is registered by misc.py.)


def _trilu_mask(shape, k: int, upper: bool) -> np.ndarray:
    r, c = shape[-2], shape[-1]
    i, j = np.arange(r)[:, None], np.arange(c)[None, :]
    return (j - i >= k) if upper else (j - i <= k)


def _trilu_k(inputs) -> int:
    return int(np.asarray(inputs[1]).ravel()[0]) if _opt(inputs, 1) is not None else 0


@register("Trilu")
def trilu(inputs, attrs, ctx):
    x = inputs[0]
    mask = _trilu_mask(x.shape, _trilu_k(inputs), bool(attrs.get("upper", 1)))
    return (np.where(mask, x, np.zeros((), x.dtype)).astype(x.dtype),)


@register_vjp("Trilu")
def trilu_vjp(inputs, attrs, outputs, grads, ctx):
    x = inputs[0]
    mask = _trilu_mask(x.shape, _trilu_k(inputs), bool(attrs.get("upper", 1)))
    return _none_for_rest(inputs, np.where(mask, grads[0], 0).astype(x.dtype))


def _reverse_sequence(x: np.ndarray, lens: np.ndarray, batch_axis: int, time_axis: int) -> np.ndarray:
    y = x.copy()
    for b, n in enumerate(_ints(lens)):
        src: list[slice | int] = [slice(None)] * x.ndim
        src[batch_axis] = b
        src[time_axis] = slice(0, n)
        dst = list(src)
        dst[time_axis] = slice(n - 1, None, -1) if n > 0 else slice(0, 0)
        y[tuple(src)] = x[tuple(dst)]
    return y


@register("ReverseSequence")
def reverse_sequence(inputs, attrs, ctx):
    x, lens = inputs
    return (_reverse_sequence(x, lens, attrs.get("batch_axis", 1), attrs.get("time_axis", 0)),)


@register_vjp("ReverseSequence")
def reverse_sequence_vjp(inputs, attrs, outputs, grads, ctx):
    x, lens = inputs
    g = _reverse_sequence(
        np.asarray(grads[0], x.dtype), lens, attrs.get("batch_axis", 1), attrs.get("time_axis", 0)
    )
    return [g, None]


def _center_crop_pad_plan(inputs, attrs):
    x, shape = inputs
    target = _ints(shape)
    axes = [_norm_axis(a, x.ndim) for a in attrs.get("axes", range(x.ndim))]
    idx = {}
    for a, t in zip(axes, target):
        n = x.shape[a]
        # Crop keeps the centre (extra element dropped at the end); pad adds extra at the end too.
        start = (n - t) // 2 if t <= n else -((t - n) // 2)
        p = np.arange(start, start + t, dtype=np.int64)
        idx[a] = np.where((p >= 0) & (p < n), p, -1)
    return x, idx


@register("CenterCropPad")
def center_crop_pad(inputs, attrs, ctx):
    x, idx = _center_crop_pad_plan(inputs, attrs)
    out_shape = [len(idx[a]) if a in idx else n for a, n in enumerate(x.shape)]
    if x.size == 0:
        return (np.zeros(out_shape, x.dtype),)
    y = _gather_axes(x, {a: np.maximum(v, 0) for a, v in idx.items()}).copy()
    for a, v in idx.items():
        sl = [slice(None)] * x.ndim
        sl[a] = v < 0
        y[tuple(sl)] = 0
    return (y,)


@register_vjp("CenterCropPad")
def center_crop_pad_vjp(inputs, attrs, outputs, grads, ctx):
    x, idx = _center_crop_pad_plan(inputs, attrs)
    g = np.array(grads[0], dtype=x.dtype)
    for a, v in idx.items():
        sl = [slice(None)] * x.ndim
        sl[a] = v < 0
        g[tuple(sl)] = 0
    return [_scatter_axes(x.shape, x.dtype, {a: np.maximum(v, 0) for a, v in idx.items()}, g), None]


# --------------------------------------------------------------------------- Resize, Upsample


def _nearest_index(x: np.ndarray, mode: str, n_in: int) -> np.ndarray:
    fl = np.floor(x)
    frac = x - fl
    if mode == "round_prefer_ceil":
        i = np.where(frac >= 0.5, fl + 1, fl)
    elif mode == "floor":
        i = fl
    elif mode == "ceil":
        i = np.ceil(x)
    else:  # round_prefer_floor
        i = np.where(frac > 0.5, fl + 1, fl)
    return np.clip(i, 0, n_in - 1).astype(np.int64)


def _cubic_kernel(d: np.ndarray, a: float) -> np.ndarray:
    d = np.abs(d)
    return np.where(
        d <= 1,
        ((a + 2) * d - (a + 3)) * d * d + 1,
        np.where(d < 2, ((a * d - 5 * a) * d + 8 * a) * d - 4 * a, 0.0),
    )


def _source_coords(mode: str, n_in: int, n_out: int, scale: float, roi: tuple[float, float] | None):
    y = np.arange(n_out, dtype=np.float64)
    out_len = scale * n_in
    if mode == "align_corners":
        return np.zeros(n_out) if out_len == 1 else y * (n_in - 1) / (out_len - 1)
    if mode == "asymmetric":
        return y / scale
    if mode == "tf_crop_and_resize":
        r0, r1 = roi if roi is not None else (0.0, 1.0)
        if out_len == 1:
            x = np.full(n_out, (r1 - r0) * (n_in - 1) / 2)
        else:
            x = y * (r1 - r0) * (n_in - 1) / (out_len - 1)
        return x + r0 * (n_in - 1)
    if mode == "pytorch_half_pixel":
        return np.full(n_out, -0.5) if out_len == 1 else (y + 0.5) / scale - 0.5
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adjustment = n_out / out_len
        offset = n_in / 2 * (1 - adjustment)
        return offset + (y + 0.5) / scale - 0.5
    raise InputError(
        f"Resize: unknown coordinate_transformation_mode {mode!r}",
        where="Resize",
        hint="see the ONNX Resize spec",
    )


def resize_matrix(
    n_in: int, n_out: int, scale: float, attrs: dict, roi=None
) -> tuple[np.ndarray, np.ndarray]:
    """The (n_out x n_in) interpolation weights of one axis and the mask of extrapolated outputs."""
    mode = attrs.get("mode", "nearest")
    ctm = attrs.get("coordinate_transformation_mode", "half_pixel")
    x = _source_coords(ctm, n_in, n_out, scale, roi)
    extrapolated = ((x < 0) | (x > n_in - 1)) if ctm == "tf_crop_and_resize" else np.zeros(n_out, bool)
    w = np.zeros((n_out, n_in))
    rows = np.arange(n_out)
    if mode == "nearest":
        w[rows, _nearest_index(x, attrs.get("nearest_mode", "round_prefer_floor"), n_in)] = 1.0
    else:
        s = min(scale, 1.0) if attrs.get("antialias", 0) else 1.0
        support = 1.0 if mode == "linear" else 2.0
        start = int(math.floor(-support / s) + 1)
        offsets = np.arange(start, 2 - start)  # the window [start, 1 - start] around floor(x)
        base = np.floor(x)
        ratio = x - base
        taps = base[:, None] + offsets[None, :]
        d = (offsets[None, :] - ratio[:, None]) * s
        if mode == "linear":
            k = np.clip(1 - np.abs(d), 0, 1)
        else:
            k = _cubic_kernel(d, attrs.get("cubic_coeff_a", -0.75))
        k = k / k.sum(axis=1, keepdims=True)
        if attrs.get("exclude_outside", 0):
            k = np.where((taps < 0) | (taps >= n_in), 0.0, k)
            tot = k.sum(axis=1, keepdims=True)
            k = k / np.where(tot == 0, 1, tot)
        np.add.at(
            w,
            (np.repeat(rows, taps.shape[1]), np.clip(taps, 0, n_in - 1).astype(np.int64).ravel()),
            k.ravel(),
        )
    w[extrapolated] = 0.0
    return w, extrapolated


def _resize_plan(inputs, attrs, ctx, old_style: bool = False):
    """Per resized axis: (axis, weight matrix, extrapolated mask)."""
    x = inputs[0]
    r = x.ndim
    scales: list[float] | None
    if old_style:  # Upsample, Resize-10: (X, scales), asymmetric coordinates
        scales = (
            list(attrs["scales"]) if "scales" in attrs else [float(v) for v in np.asarray(inputs[1]).ravel()]
        )
        sizes, roi, axes = None, None, list(range(r))
    else:
        roi = _opt(inputs, 1)
        scales_in = _opt(inputs, 2)
        sizes = _opt(inputs, 3)
        scales = (
            [float(v) for v in np.asarray(scales_in).ravel()]
            if scales_in is not None and np.size(scales_in)
            else None
        )
        sizes = _ints(sizes) if sizes is not None and np.size(sizes) else None
        axes = [_norm_axis(a, r) for a in attrs.get("axes", range(r))]
        roi = [float(v) for v in np.asarray(roi).ravel()] if roi is not None and np.size(roi) else None
    if sizes is not None:
        sc = [sizes[i] / x.shape[a] for i, a in enumerate(axes)]
        policy = attrs.get("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            s = min(sc) if policy == "not_larger" else max(sc)
            sc = [s] * len(axes)
            sizes = [int(s * x.shape[a] + 0.5) for a in axes]
    elif scales is not None:
        sc = scales
        sizes = [int(math.floor(s * x.shape[a])) for s, a in zip(sc, axes)]
    else:
        raise InputError(
            "Resize has neither scales nor sizes", where="Resize", hint="give the node one of the two inputs"
        )
    plan = []
    k = len(axes)
    for i, a in enumerate(axes):
        a_roi = (roi[i], roi[i + k]) if roi is not None else None
        if sc[i] == 1.0 and sizes[i] == x.shape[a] and (a_roi is None or a_roi == (0.0, 1.0)):
            continue
        w, ext = resize_matrix(x.shape[a], sizes[i], sc[i], attrs, a_roi)
        plan.append((a, w, ext))
    return plan


def _apply_axis(x: np.ndarray, axis: int, w: np.ndarray) -> np.ndarray:
    return np.moveaxis(np.tensordot(w, x, axes=([1], [axis])), 0, axis)


def _resize_forward(x: np.ndarray, plan, attrs) -> np.ndarray:
    mode = attrs.get("mode", "nearest")
    y = x if mode == "nearest" else x.astype(np.float64)
    for axis, w, _ in plan:
        # Nearest is a pure gather: exact for every dtype, no float round trip.
        y = np.take(y, np.argmax(w, axis=1), axis=axis) if mode == "nearest" else _apply_axis(y, axis, w)
    if any(ext.any() for _, _, ext in plan):
        value = attrs.get("extrapolation_value", 0.0)
        mask = np.zeros(y.shape, bool)
        for axis, _, ext in plan:
            shp = [1] * y.ndim
            shp[axis] = len(ext)
            mask |= ext.reshape(shp)
        y = np.where(mask, value, y)
    if mode != "nearest" and np.issubdtype(x.dtype, np.integer):
        info = np.iinfo(x.dtype)
        return np.clip(np.round(y), info.min, info.max).astype(x.dtype)
    return y.astype(x.dtype)


def _resize_vjp(x: np.ndarray, plan, g: np.ndarray) -> np.ndarray:
    g = np.asarray(g, dtype=np.float64)
    if any(ext.any() for _, _, ext in plan):
        mask = np.zeros(g.shape, bool)
        for axis, _, ext in plan:
            shp = [1] * g.ndim
            shp[axis] = len(ext)
            mask |= ext.reshape(shp)
        g = np.where(mask, 0.0, g)
    for axis, w, _ in reversed(plan):
        g = _apply_axis(g, axis, w.T)
    return g.astype(x.dtype)


def _resize_attrs(attrs: dict, ctx) -> dict:
    if ctx.opset < 11:
        return {**attrs, "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    return attrs


@register("Resize")
def resize(inputs, attrs, ctx):
    a = _resize_attrs(attrs, ctx)
    plan = _resize_plan(inputs, a, ctx, old_style=ctx.opset < 11)
    return (_resize_forward(inputs[0], plan, a),)


@register_vjp("Resize")
def resize_vjp(inputs, attrs, outputs, grads, ctx):
    x = inputs[0]
    if not is_float(x):
        return _none_for_rest(inputs, None)
    a = _resize_attrs(attrs, ctx)
    plan = _resize_plan(inputs, a, ctx, old_style=ctx.opset < 11)
    return _none_for_rest(inputs, _resize_vjp(x, plan, grads[0]))


def _upsample_attrs(attrs: dict) -> dict:
    mode = attrs.get("mode", "nearest")
    return {
        **attrs,
        "mode": "linear" if mode in ("linear", "bilinear") else mode,
        "coordinate_transformation_mode": "asymmetric",
        "nearest_mode": "floor",
    }


@register("Upsample")
def upsample(inputs, attrs, ctx):
    a = _upsample_attrs(attrs)
    return (_resize_forward(inputs[0], _resize_plan(inputs, a, ctx, old_style=True), a),)


@register_vjp("Upsample")
def upsample_vjp(inputs, attrs, outputs, grads, ctx):
    a = _upsample_attrs(attrs)
    plan = _resize_plan(inputs, a, ctx, old_style=True)
    return _none_for_rest(inputs, _resize_vjp(inputs[0], plan, grads[0]))


# Cast helpers re-exported for ops that build constants of an ONNX dtype.
__all__ = ["cast_array", "reshape_target", "resize_matrix"]
