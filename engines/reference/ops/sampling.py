"""Op family: sampling at computed coordinates: GridSample and RoiAlign.

Rules
-----
1. Both follow the ONNX spec where it is explicit and ONNX Runtime's conventions where it is
   not (each docstring says which).
"""

from __future__ import annotations

import numpy as np
from mconv.engines.reference.ops import register


def reflect(x, lo: float, hi: float, xp=np):
    """Reflect coordinates about the borders until they fall inside ``[lo, hi]`` (``xp``: numpy
    here, jax.numpy in the XLA lowering, which shares these rules)."""
    span = hi - lo
    below, above = x < lo, x > hi
    dx = xp.where(below, lo - x, x - hi)
    n = xp.trunc(dx / span) if span > 0 else xp.zeros_like(dx)
    r = dx - n * span
    even = n % 2 == 0
    return xp.where(below, xp.where(even, lo + r, hi - r), xp.where(above, xp.where(even, hi - r, lo + r), x))


def grid_coords(g, dims, mode: str, padding: str, align: bool, xp=np) -> list:
    """GridSample's source coordinate along each spatial axis of X, in X's dimension order
    (``g``: the grid with its last axis reversed), with rounding and padding applied."""
    coords = []
    for i, d in enumerate(dims):
        lo, hi = (0.0, d - 1.0) if align else (-0.5, d - 0.5)
        c = (g[..., i] + 1) / 2.0 * (d - 1) if align else ((g[..., i] + 1) * d - 1) / 2.0
        if mode == "nearest":
            c = xp.round(c)  # half to even, as rint
        if padding == "border":
            c = xp.where((c < lo) | (c > hi), xp.clip(c, 0, d - 1), c)
        elif padding == "reflection":
            c = reflect(c, lo, hi, xp)
        coords.append(c)
    return coords


def _cubic_coeffs(t: np.ndarray) -> list[np.ndarray]:
    a = -0.75  # the cubic convolution constant PyTorch and ONNX use
    return [
        ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
        ((a + 2) * t - (a + 3)) * t * t + 1,
        ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
        ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a,
    ]


@register("GridSample")
def grid_sample(inputs, attrs, ctx):
    """N-d grid sampling. The grid's last axis lists coordinates innermost-first (x, y, ...),
    normalized to [-1, 1]; ``align_corners`` maps -1/1 to the centres (1) or the outer edges (0)
    of the corner pixels. Padding: zeros, border (clamp) or reflection."""
    x, grid = inputs[0], inputs[1]
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(
        attrs.get("mode", "linear"), attrs.get("mode", "linear")
    )
    padding = attrs.get("padding_mode", "zeros")
    align = int(attrs.get("align_corners", 0)) == 1
    n_batch, channels = x.shape[:2]
    dims = x.shape[2:]
    g = grid.astype(np.float64)[..., ::-1]  # now in X's dimension order
    out_shape = grid.shape[1:-1]
    lo = [0.0 if align else -0.5 for _ in dims]
    hi = [d - 1.0 if align else d - 0.5 for d in dims]
    coords = grid_coords(g, dims, mode, padding, align)
    batch_idx = np.arange(n_batch).reshape((n_batch,) + (1,) * len(out_shape))

    def gather(idx: list[np.ndarray]) -> np.ndarray:
        valid = np.ones(idx[0].shape, dtype=bool)
        fixed = []
        for i, (k, d) in enumerate(zip(idx, dims)):
            if padding == "zeros":
                valid &= (k >= 0) & (k < d)
                k = np.clip(k, 0, d - 1)
            elif padding == "border":
                k = np.clip(k, 0, d - 1)
            else:
                k = np.clip(np.trunc(reflect(k.astype(np.float64), lo[i], hi[i])).astype(np.int64), 0, d - 1)
            fixed.append(k)
        vals = np.moveaxis(x, 1, -1)[(batch_idx, *fixed)]  # (N, *out, C)
        return np.where(valid[..., None], vals, 0)

    if mode == "nearest":
        y = gather([c.astype(np.int64) for c in coords])
    else:
        base = [np.floor(c).astype(np.int64) for c in coords]
        frac = [c - b for c, b in zip(coords, base)]
        if mode == "linear":
            offsets, weights = (0, 1), [[1 - f, f] for f in frac]
        else:
            offsets, weights = (-1, 0, 1, 2), [_cubic_coeffs(f) for f in frac]
        y = 0.0
        for combo in np.ndindex(*([len(offsets)] * len(dims))):
            w = np.ones(coords[0].shape)
            for i, k in enumerate(combo):
                w = w * weights[i][k]
            y = y + w[..., None] * gather([b + offsets[k] for b, k in zip(base, combo)])
    y = np.moveaxis(np.asarray(y), -1, 1)
    return (y.reshape(n_batch, channels, *out_shape).astype(x.dtype),)


@register("RoiAlign")
def roi_align(inputs, attrs, ctx):
    """Average (or max) of bilinear samples on a regular grid in each output bin of each RoI.
    ``half_pixel`` shifts RoI corners by -0.5 pixel; the legacy ``output_half_pixel`` does not
    and forces RoIs to be at least 1x1. Samples beyond one pixel outside the image count zero;
    max mode takes, as ONNX Runtime does, the largest weighted corner of each sample."""
    x, rois, batch_idx = inputs
    mode = attrs.get("mode", "avg")
    ph, pw = int(attrs.get("output_height", 1)), int(attrs.get("output_width", 1))
    ratio = int(attrs.get("sampling_ratio", 0))
    scale = float(attrs.get("spatial_scale", 1.0))
    half = (
        attrs.get("coordinate_transformation_mode", "half_pixel" if ctx.opset >= 16 else "output_half_pixel")
        == "half_pixel"
    )
    height, width = x.shape[2:]
    out = np.zeros((rois.shape[0], x.shape[1], ph, pw), dtype=x.dtype)
    for r, roi in enumerate(rois.astype(np.float64)):
        off = 0.5 if half else 0.0
        x1, y1, x2, y2 = roi * scale - off
        rw, rh = x2 - x1, y2 - y1
        if not half:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / ph, rw / pw
        gh = ratio if ratio > 0 else int(np.ceil(rh / ph))
        gw = ratio if ratio > 0 else int(np.ceil(rw / pw))
        count = max(gh * gw, 1)
        ys = y1 + np.arange(ph)[:, None] * bh + (np.arange(gh)[None, :] + 0.5) * bh / gh  # (ph, gh)
        xs = x1 + np.arange(pw)[:, None] * bw + (np.arange(gw)[None, :] + 0.5) * bw / gw  # (pw, gw)
        yy = ys[:, :, None, None]
        xx = xs[None, None, :, :]
        yy, xx = np.broadcast_arrays(yy, xx)  # (ph, gh, pw, gw)
        inside = ~((yy < -1.0) | (yy > height) | (xx < -1.0) | (xx > width))
        yc, xc = np.maximum(yy, 0.0), np.maximum(xx, 0.0)
        y_lo = np.floor(yc).astype(np.int64)
        x_lo = np.floor(xc).astype(np.int64)
        y_edge, x_edge = y_lo >= height - 1, x_lo >= width - 1
        y_lo = np.where(y_edge, height - 1, y_lo)
        x_lo = np.where(x_edge, width - 1, x_lo)
        y_hi = np.where(y_edge, height - 1, y_lo + 1)
        x_hi = np.where(x_edge, width - 1, x_lo + 1)
        ly = np.where(y_edge, 0.0, yc - y_lo)
        lx = np.where(x_edge, 0.0, xc - x_lo)
        hy, hx = 1.0 - ly, 1.0 - lx
        img = x[int(batch_idx[r])].astype(np.float64)  # (C, H, W)
        corners = [(hy * hx, y_lo, x_lo), (hy * lx, y_lo, x_hi), (ly * hx, y_hi, x_lo), (ly * lx, y_hi, x_hi)]
        terms = [w * img[:, yi, xi] for w, yi, xi in corners]  # each (C, ph, gh, pw, gw)
        terms = [np.where(inside, t, 0.0) for t in terms]
        if mode == "avg":
            val = sum(terms).sum(axis=(2, 4)) / count
        else:
            val = np.maximum.reduce(terms).max(axis=(2, 4))
        out[r] = val.astype(x.dtype)
    return (out,)
