"""Shape ops: Reshape, Flatten, (Un)Squeeze, Transpose, Concat, Split, Slice, Pad, Expand, Tile,
Shape, Size, ConstantOfShape, Range, Resize/Upsample, Depth/SpaceToDepth, Trilu (Gather and
GatherElements: :mod:`.indexing`).

Rules:

1. Shape-giving inputs (Reshape's shape, Slice's starts/ends/axes/steps, Pad's pads, Expand's
   shape, Tile's repeats, Split's sizes, axes inputs, Resize's scales/sizes) are static.
2. Reshape: 0 copies the input dimension (unless ``allowzero``), -1 takes the rest. Under a
   symbolic batch, a constant target whose first entry equals the model's declared static batch
   keeps the input's (symbolic) batch instead: exporters write ``[1, 9216]`` for "flatten one
   sample", which would be wrong for any other batch.
3. Shape/Size of a traced value give numpy arrays; a symbolic dimension makes them object
   arrays that the shape ops here (and elementwise arithmetic) evaluate with numpy.
4. Resize lowers ``nearest`` and ``linear`` (no antialias) separably, one gather per resized
   axis, with coordinates computed at export time (coordinate modes half_pixel,
   pytorch_half_pixel, align_corners, asymmetric); ``cubic`` is one dense (out x in) weight
   matrix per resized axis, built at export time from the 4-tap kernel (``cubic_coeff_a``,
   edge-clamped taps, or dropped and renormalized with ``exclude_outside``);
   tf_crop_and_resize is refused.
6. Slice along a symbolic axis: an int bound that jax can prove lies past the axis (every
   symbolic dimension is declared ``<= 1e9``, so ends of 1e9 or INT64_MAX do) is dropped, so
   the result is ``d`` and not ``min(d, 1e9)``. Pad reflect/edge/wrap along a symbolic axis is a
   gather with indices computed from the axis size (see :func:`_pad_axis`).
5. ReverseSequence reverses each batch row's first ``sequence_lens[b]`` steps with one gather
   (the lengths may be traced). CenterCropPad's shape input is static.
"""

from __future__ import annotations

import math
import operator

import jax.numpy as jnp
import numpy as np
from jax import lax
from mconv.engines.xla.lower import is_static, lower, static_ints


def _xp(*xs):
    return np if all(is_static(x) for x in xs) else jnp


def _norm_axis(a: int, rank: int) -> int:
    return a + rank if a < 0 else a


def _prod(dims):
    out = 1
    for d in dims:
        out = out * d
    return out


def _is_int(d) -> bool:
    return isinstance(d, (int, np.integer))


@lower("Reshape", static=(1,))
def reshape(inputs, attrs, ctx):
    x, shape = inputs
    dims = list(np.shape(x)) if is_static(x) else list(x.shape)
    target = static_ints(shape)
    out = [
        dims[i] if (_is_int(t) and t == 0 and not attrs.get("allowzero", 0)) else t
        for i, t in enumerate(target)
    ]
    if (
        ctx.batch_dim is not None
        and ctx.declared_batch is not None
        and dims
        and not _is_int(dims[0])
        and out
        and _is_int(out[0])
        and out[0] == ctx.declared_batch
    ):
        out[0] = dims[0]
    if any(_is_int(t) and t == -1 for t in out):
        i = next(i for i, t in enumerate(out) if _is_int(t) and t == -1)
        rest = _prod(t for j, t in enumerate(out) if j != i)
        out[i] = _prod(dims) // rest
    return (_xp(x).reshape(x, tuple(out)),)


@lower("Flatten")
def flatten(inputs, attrs, ctx):
    x = inputs[0]
    axis = _norm_axis(attrs.get("axis", 1), x.ndim)
    return (_xp(x).reshape(x, (_prod(x.shape[:axis]), _prod(x.shape[axis:]))),)


def _axes_of(inputs, attrs):
    if len(inputs) > 1 and inputs[1] is not None:
        return static_ints(inputs[1])
    return list(attrs["axes"]) if "axes" in attrs else None


@lower("Squeeze", static=(1,))
def squeeze(inputs, attrs, ctx):
    x = inputs[0]
    axes = _axes_of(inputs, attrs)
    if axes is None:
        axes = [i for i, d in enumerate(x.shape) if _is_int(d) and d == 1]
    return (_xp(x).squeeze(x, axis=tuple(_norm_axis(a, x.ndim) for a in axes)),)


@lower("Unsqueeze", static=(1,))
def unsqueeze(inputs, attrs, ctx):
    x = inputs[0]
    axes = _axes_of(inputs, attrs)
    rank = np.ndim(x) + len(axes)
    return (_xp(x).expand_dims(x, tuple(sorted(_norm_axis(a, rank) for a in axes))),)


@lower("Transpose")
def transpose(inputs, attrs, ctx):
    x = inputs[0]
    perm = attrs.get("perm", list(range(np.ndim(x)))[::-1])
    return (_xp(x).transpose(x, perm),)


@lower("Concat")
def concat(inputs, attrs, ctx):
    xs = [x for x in inputs if x is not None]
    axis = _norm_axis(attrs["axis"], np.ndim(xs[0]))
    if all(is_static(x) for x in xs):
        return (np.concatenate([np.asarray(x) for x in xs], axis=axis),)
    return (jnp.concatenate([jnp.asarray(x) for x in xs], axis=axis),)


@lower("Split", static=(1,))
def split(inputs, attrs, ctx):
    x = inputs[0]
    axis = _norm_axis(attrs.get("axis", 0), x.ndim)
    sizes = static_ints(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else attrs.get("split")
    n = x.shape[axis]
    if not sizes:
        k = int(attrs.get("num_outputs", ctx.num_outputs))
        step = -(-n // k)
        sizes = [min(step, n - i * step) for i in range(k)]
    bounds = np.cumsum(sizes)[:-1].tolist()
    return tuple(_xp(x).split(x, bounds, axis=axis))


@lower("Slice", static=(1, 2, 3, 4))
def slice_(inputs, attrs, ctx):
    x = inputs[0]
    if len(inputs) > 1:
        starts, ends = static_ints(inputs[1]), static_ints(inputs[2])
        axes = static_ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else None
        steps = static_ints(inputs[4]) if len(inputs) > 4 and inputs[4] is not None else None
    else:
        starts, ends, axes, steps = attrs["starts"], attrs["ends"], attrs.get("axes"), None
    rank = np.ndim(x)
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    index = [slice(None)] * rank
    big = 1 << 62
    dims = np.shape(x) if is_static(x) else x.shape
    for s, e, a, st in zip(starts, ends, axes, steps):
        s = max(min(s, big), -big) if _is_int(s) else s
        e = max(min(e, big), -big) if _is_int(e) else e
        a = _norm_axis(a, rank)
        n = dims[a]
        if not _is_int(n):  # a symbolic axis: a bound past its end is no bound (rule 6)
            forward = st > 0
            if _is_int(s) and (_decided(operator.le, s, -n) if forward else _decided(operator.ge, s, n)):
                s = None
            if _is_int(e) and (_decided(operator.ge, e, n) if forward else _decided(operator.le, e, -n - 1)):
                e = None
        index[a] = slice(s, e, st)
    return (x[tuple(index)],)


def _decided(op, a, b) -> bool:
    """``op(a, b)`` with a symbolic dimension, False when jax cannot decide it."""
    try:
        return bool(op(a, b))
    except Exception:  # noqa: BLE001 - InconclusiveDimensionOperation: keep the bound
        return False


@lower("Pad", static=(1, 3))
def pad(inputs, attrs, ctx):
    x = inputs[0]
    if len(inputs) > 1 and inputs[1] is not None:
        pads = static_ints(inputs[1])
        value = inputs[2] if len(inputs) > 2 and inputs[2] is not None else 0
        axes = static_ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else None
    else:
        pads, value, axes = list(attrs["pads"]), attrs.get("value", 0.0), None
    rank = x.ndim
    axes = list(range(rank)) if axes is None else [_norm_axis(a, rank) for a in axes]
    widths = [(0, 0)] * rank
    for i, a in enumerate(axes):
        widths[a] = (pads[i], pads[i + len(axes)])
    mode = attrs.get("mode", "constant")
    if mode == "constant":
        v = jnp.asarray(value, x.dtype).reshape(())
        return (lax.pad(x, v, [(lo, hi, 0) for lo, hi in widths]),)
    if mode not in ("reflect", "edge", "wrap"):
        raise NotImplementedError(f"Pad mode {mode!r}")
    if any(lo < 0 or hi < 0 for lo, hi in widths):
        raise NotImplementedError(f"Pad mode {mode} with negative pads")
    y = x
    for axis, (lo, hi) in enumerate(widths):
        if lo or hi:
            y = _pad_axis(y, axis, lo, hi, mode)
    return (y,)


def _pad_axis(x, axis: int, lo: int, hi: int, mode: str):
    """Reflect, edge or wrap padding of one axis. A static axis is ``jnp.pad``; along a symbolic
    axis (whose size jax cannot compare with the pads) it is one gather whose indices are
    computed from the size at run time: reflect ``|i|`` folded at ``n - 1``, edge clipped to
    ``[0, n - 1]``, wrap ``i mod n`` (ONNX requires pads below the axis size for reflect)."""
    n = x.shape[axis]
    if _is_int(n):
        widths = [(0, 0)] * x.ndim
        widths[axis] = (lo, hi)
        return jnp.pad(x, widths, mode=mode)
    from jax._src import core

    size = core.dimension_as_value(n)
    i = lax.iota(np.int32, n + lo + hi) - lo
    if mode == "reflect":
        period = jnp.maximum(2 * (size - 1), 1)
        j = jnp.abs(i) % period
        idx = jnp.where(j >= size, period - j, j)
    elif mode == "edge":
        idx = jnp.clip(i, 0, size - 1)
    else:
        idx = i % size
    return jnp.take(x, idx.astype(np.int32), axis=axis, mode="clip")


def _broadcast(a: list, b: list) -> list:
    n = max(len(a), len(b))
    a, b = [1] * (n - len(a)) + list(a), [1] * (n - len(b)) + list(b)
    return [y if (_is_int(x) and x == 1) else x for x, y in zip(a, b)]


@lower("Expand", static=(1,))
def expand(inputs, attrs, ctx):
    x, shape = inputs
    out = _broadcast(list(np.shape(x)) if is_static(x) else list(x.shape), static_ints(shape))
    return (_xp(x).broadcast_to(x, tuple(out)),)


@lower("Tile", static=(1,))
def tile(inputs, attrs, ctx):
    return (_xp(inputs[0]).tile(inputs[0], tuple(static_ints(inputs[1]))),)


def _shape_array(dims) -> np.ndarray:
    if all(_is_int(d) for d in dims):
        return np.array([int(d) for d in dims], dtype=np.int64)
    return np.array(list(dims), dtype=object)


@lower("Shape", shape_only=True)
def shape(inputs, attrs, ctx):
    dims = list(np.shape(inputs[0])) if is_static(inputs[0]) else list(inputs[0].shape)
    start = attrs.get("start", 0)
    end = attrs.get("end", len(dims))
    return (_shape_array(dims[start:end]),)


@lower("Size", shape_only=True)
def size(inputs, attrs, ctx):
    dims = list(np.shape(inputs[0])) if is_static(inputs[0]) else list(inputs[0].shape)
    n = _prod(dims)
    return (np.array(n, dtype=np.int64) if _is_int(n) else np.array(n, dtype=object),)


@lower("ConstantOfShape", static=(0,))
def constant_of_shape(inputs, attrs, ctx):
    value = attrs.get("value", np.zeros(1, np.float32))
    value = np.asarray(value).reshape(-1)
    dims = tuple(static_ints(inputs[0]))
    if all(_is_int(d) for d in dims):
        return (np.full(dims, value[0], dtype=value.dtype),)
    return (jnp.full(dims, value[0], dtype=value.dtype),)


@lower("Range", static=(0, 1, 2))
def range_(inputs, attrs, ctx):
    start, limit, delta = (np.asarray(v).reshape(()) for v in inputs)
    if start.dtype != object and limit.dtype != object and delta.dtype != object:
        n = max(int(math.ceil((limit - start) / delta)), 0)
        return ((start + delta * np.arange(n)).astype(start.dtype),)
    # A symbolic bound (Range(0, Shape(x)[i], 1)): integer steps only; the length is a
    # dimension expression and the values are computed in the program.
    from jax._src import core

    s, lim, d = start.item(), limit.item(), delta.item()
    if not _is_int(d) or isinstance(s, (float, np.floating)) or isinstance(lim, (float, np.floating)):
        raise NotImplementedError("Range with a symbolic bound and a non-integer step")
    if d == 0:
        raise ValueError("Range delta is 0")
    d = int(d)
    n = ((lim - s) + d - 1) // d if d > 0 else ((s - lim) - d - 1) // -d
    if not _decided(operator.ge, n, 0):
        n = core.max_dim(n, 0)
    plain = [a.dtype for a in (start, limit, delta) if a.dtype != object]
    dtype = plain[0] if plain else np.dtype(np.int64)
    first = s if _is_int(s) else core.dimension_as_value(s)
    import jax

    dtype = jax.dtypes.canonicalize_dtype(dtype)  # int64 is int32 outside 64-bit mode
    return ((first + d * lax.iota(dtype, n)).astype(dtype),)


def _source_coords(mode: str, out: int, n: int, scale: float) -> np.ndarray:
    x = np.arange(out, dtype=np.float64)
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if out > 1 else np.zeros(out)
    if mode == "align_corners":
        return np.zeros(out) if out == 1 else x * (n - 1) / (out - 1)
    if mode == "asymmetric":
        return x / scale
    raise NotImplementedError(f"Resize coordinate_transformation_mode '{mode}' is not lowered")


def _nearest(coords: np.ndarray, mode: str, n: int) -> np.ndarray:
    if mode == "round_prefer_ceil":
        idx = np.floor(coords + 0.5)
    elif mode == "floor":
        idx = np.floor(coords)
    elif mode == "ceil":
        idx = np.ceil(coords)
    else:  # round_prefer_floor
        idx = np.ceil(coords - 0.5)
    return np.clip(idx, 0, n - 1).astype(np.int64)


def _cubic_matrix(coords: np.ndarray, n: int, a: float, exclude_outside: bool) -> np.ndarray:
    """The (out, n) weights of cubic interpolation at source ``coords``."""
    i0 = np.floor(coords)
    t = coords - i0
    dists = [t + 1, t, 1 - t, 2 - t]
    taps_w = []
    for d in dists:
        d = np.abs(d)
        taps_w.append(
            np.where(
                d <= 1,
                ((a + 2) * d - (a + 3)) * d * d + 1,
                np.where(d < 2, ((a * d - 5 * a) * d + 8 * a) * d - 4 * a, 0.0),
            )
        )
    w = np.stack(taps_w, axis=1)  # (out, 4)
    taps = i0.astype(np.int64)[:, None] + np.arange(-1, 3)[None, :]
    inside = (taps >= 0) & (taps < n)
    if exclude_outside:
        w = np.where(inside, w, 0.0)
        w = w / w.sum(axis=1, keepdims=True)
    m = np.zeros((len(coords), n), np.float64)
    rows = np.repeat(np.arange(len(coords)), 4)
    np.add.at(m, (rows, np.clip(taps, 0, n - 1).reshape(-1)), w.reshape(-1))
    return m


def resize_axes(x, out_sizes, scales, mode, coord_mode, nearest_mode, cubic_a=-0.75, exclude_outside=False):
    """Resize ``x`` axis by axis to ``out_sizes`` (static ints) using ``scales`` for coordinates."""
    y = x
    for axis, (n, out, scale) in enumerate(zip(x.shape, out_sizes, scales)):
        if not _is_int(n) or (n == out and scale == 1.0):
            continue
        coords = _source_coords(coord_mode, out, n, scale)
        if mode == "cubic":
            m = jnp.asarray(_cubic_matrix(coords, n, cubic_a, exclude_outside).astype(np.float32))
            y = jnp.moveaxis(
                jnp.tensordot(y, m.astype(y.dtype), axes=([axis], [1]), precision="highest"), -1, axis
            )
            continue
        if mode == "nearest":
            y = jnp.take(y, jnp.asarray(_nearest(coords, nearest_mode, n)), axis=axis)
            continue
        c = np.clip(coords, 0, n - 1)
        i0 = np.floor(c).astype(np.int64)
        i1 = np.minimum(i0 + 1, n - 1)
        w = (c - i0).astype(np.float32)
        shape = [1] * y.ndim
        shape[axis] = out
        wj = jnp.asarray(w.reshape(shape)).astype(y.dtype)
        y = jnp.take(y, jnp.asarray(i0), axis=axis) * (1 - wj) + jnp.take(y, jnp.asarray(i1), axis=axis) * wj
    return y


@lower("Resize", static=(1, 2, 3))
def resize(inputs, attrs, ctx):
    x = inputs[0]
    mode = attrs.get("mode", "nearest")
    if mode not in ("nearest", "linear", "cubic") or attrs.get("antialias", 0):
        raise NotImplementedError(f"Resize mode '{mode}' (antialias) is not lowered")
    if "axes" in attrs:
        raise NotImplementedError("Resize with axes is not lowered")
    dims = list(x.shape)
    if ctx.opset < 11:
        scales = [float(s) for s in np.asarray(inputs[1]).reshape(-1)]
        sizes = None
        coord = "asymmetric"
    else:
        scales_in = inputs[2] if len(inputs) > 2 else None
        sizes_in = inputs[3] if len(inputs) > 3 else None
        sizes = static_ints(sizes_in) if sizes_in is not None and np.size(sizes_in) else None
        scales = [float(s) for s in np.asarray(scales_in).reshape(-1)] if sizes is None else None
        coord = attrs.get("coordinate_transformation_mode", "half_pixel")
    if sizes is not None:
        scales = [o / n if _is_int(n) else 1.0 for o, n in zip(sizes, dims)]
        out = [o if _is_int(n) else n for o, n in zip(sizes, dims)]  # a symbolic batch is kept
    else:
        out = [int(math.floor(n * s)) if _is_int(n) else n for n, s in zip(dims, scales)]
    nearest_mode = attrs.get("nearest_mode", "round_prefer_floor") if ctx.opset >= 11 else "floor"
    cubic_a = float(attrs.get("cubic_coeff_a", -0.75))
    exclude = bool(attrs.get("exclude_outside", 0))
    return (resize_axes(x, out, scales, mode, coord, nearest_mode, cubic_a, exclude),)


@lower("Upsample", static=(1,))
def upsample(inputs, attrs, ctx):
    x = inputs[0]
    scales = [float(s) for s in (np.asarray(inputs[1]).reshape(-1) if len(inputs) > 1 else attrs["scales"])]
    out = [int(math.floor(n * s)) if _is_int(n) else n for n, s in zip(x.shape, scales)]
    mode = attrs.get("mode", "nearest")
    return (
        resize_axes(
            x, out, scales, "linear" if mode in ("linear", "bilinear") else "nearest", "asymmetric", "floor"
        ),
    )


@lower("DepthToSpace")
def depth_to_space(inputs, attrs, ctx):
    x = inputs[0]
    b = int(attrs["blocksize"])
    n, c, h, w = x.shape
    if attrs.get("mode", "DCR") == "DCR":
        y = jnp.reshape(x, (n, b, b, c // (b * b), h, w)).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = jnp.reshape(x, (n, c // (b * b), b, b, h, w)).transpose(0, 1, 4, 2, 5, 3)
    return (jnp.reshape(y, (n, c // (b * b), h * b, w * b)),)


@lower("SpaceToDepth")
def space_to_depth(inputs, attrs, ctx):
    x = inputs[0]
    b = int(attrs["blocksize"])
    n, c, h, w = x.shape
    y = jnp.reshape(x, (n, c, h // b, b, w // b, b)).transpose(0, 3, 5, 1, 2, 4)
    return (jnp.reshape(y, (n, c * b * b, h // b, w // b)),)


@lower("ReverseSequence")
def reverse_sequence(inputs, attrs, ctx):
    x, lens = jnp.asarray(inputs[0]), jnp.asarray(inputs[1])
    b_axis, t_axis = attrs.get("batch_axis", 1), attrs.get("time_axis", 0)
    steps = x.shape[t_axis]
    t = jnp.arange(steps)
    lens = lens.astype(t.dtype)
    # src[b, t]: the time step that lands on t in batch row b.
    src = jnp.where(t[None, :] < lens[:, None], lens[:, None] - 1 - t[None, :], t[None, :])
    shape = [1] * x.ndim
    shape[b_axis], shape[t_axis] = x.shape[b_axis], steps
    src = src if b_axis < t_axis else src.T
    return (jnp.take_along_axis(x, jnp.broadcast_to(src.reshape(shape), x.shape), axis=t_axis),)


@lower("CenterCropPad", static=(1,))
def center_crop_pad(inputs, attrs, ctx):
    x = jnp.asarray(inputs[0])
    target = static_ints(inputs[1])
    axes = [_norm_axis(a, x.ndim) for a in attrs.get("axes", range(x.ndim))]
    y = x
    for a, t in zip(axes, target):
        n = x.shape[a]
        if t <= n:
            start = (n - t) // 2
            y = lax.slice_in_dim(y, start, start + t, axis=a)
        else:
            before = (t - n) // 2
            pads = [(0, 0, 0)] * y.ndim
            pads[a] = (before, t - n - before, 0)
            y = lax.pad(y, jnp.zeros((), y.dtype), pads)
    return (y,)


@lower("Trilu", static=(1,))
def trilu(inputs, attrs, ctx):
    x = inputs[0]
    k = int(np.asarray(inputs[1]).reshape(-1)[0]) if len(inputs) > 1 and inputs[1] is not None else 0
    return (jnp.triu(x, k) if attrs.get("upper", 1) else jnp.tril(x, k),)
