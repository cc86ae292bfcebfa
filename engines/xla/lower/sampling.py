"""Sampling ops: GridSample and RoiAlign (ports of the reference executor's kernels to jax).

Rules:

1. GridSample is N-d: the grid's last axis lists coordinates innermost-first (x, y, ...),
   normalized to [-1, 1]; ``align_corners`` maps -1/1 to the corner pixels' centres (1) or outer
   edges (0). Modes nearest (half to even), linear/bilinear, cubic/bicubic (a = -0.75); padding
   zeros, border (clamp) or reflection. Coordinates are computed in float32.
2. RoiAlign samples a regular grid of bilinear samples in each output bin and averages (or,
   as ONNX Runtime does, takes the largest weighted corner). The number of samples per bin
   must be static: ``sampling_ratio`` > 0 (the adaptive 0 depends on each RoI's size, i.e. on
   runtime data, unless the RoIs are static).
"""

from __future__ import annotations

import itertools
import math

import jax.numpy as jnp
import numpy as np
from mconv.engines.reference.ops.sampling import grid_coords, reflect
from mconv.engines.xla.lower import is_static, lower


def _cubic_coeffs(t):
    a = -0.75
    return [
        ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
        ((a + 2) * t - (a + 3)) * t * t + 1,
        ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
        ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a,
    ]


@lower("GridSample")
def grid_sample(inputs, attrs, ctx):
    x, grid = jnp.asarray(inputs[0]), jnp.asarray(inputs[1])
    mode = attrs.get("mode", "linear")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    padding = attrs.get("padding_mode", "zeros")
    align = int(attrs.get("align_corners", 0)) == 1
    n_batch, channels = x.shape[:2]
    dims = x.shape[2:]
    g = grid.astype(jnp.float32)[..., ::-1]
    out_shape = grid.shape[1:-1]
    lo = [0.0 if align else -0.5 for _ in dims]
    hi = [d - 1.0 if align else d - 0.5 for d in dims]
    coords = grid_coords(g, dims, mode, padding, align, jnp)
    batch_idx = jnp.arange(n_batch).reshape((n_batch,) + (1,) * len(out_shape))
    xl = jnp.moveaxis(x, 1, -1)

    def gather(idx):
        valid = jnp.ones(idx[0].shape, dtype=bool)
        fixed = []
        for i, (k, d) in enumerate(zip(idx, dims)):
            if padding == "zeros":
                valid &= (k >= 0) & (k < d)
                k = jnp.clip(k, 0, d - 1)
            elif padding == "border":
                k = jnp.clip(k, 0, d - 1)
            else:
                k = jnp.clip(
                    jnp.trunc(reflect(k.astype(jnp.float32), lo[i], hi[i], jnp)).astype(jnp.int32), 0, d - 1
                )
            fixed.append(k)
        vals = xl[(batch_idx, *fixed)]  # (N, *out, C)
        return jnp.where(valid[..., None], vals, 0)

    if mode == "nearest":
        y = gather([c.astype(jnp.int32) for c in coords])
    else:
        base = [jnp.floor(c).astype(jnp.int32) for c in coords]
        frac = [c - b for c, b in zip(coords, base)]
        if mode == "linear":
            offsets, weights = (0, 1), [[1 - f, f] for f in frac]
        else:
            offsets, weights = (-1, 0, 1, 2), [_cubic_coeffs(f) for f in frac]
        y = 0.0
        for combo in itertools.product(range(len(offsets)), repeat=len(dims)):
            w = jnp.ones(coords[0].shape, jnp.float32)
            for i, k in enumerate(combo):
                w = w * weights[i][k]
            y = y + w[..., None] * gather([b + offsets[k] for b, k in zip(base, combo)])
    y = jnp.moveaxis(jnp.asarray(y), -1, 1)
    return (y.reshape(n_batch, channels, *out_shape).astype(x.dtype),)


@lower("RoiAlign")
def roi_align(inputs, attrs, ctx):
    x, rois, batch_idx = jnp.asarray(inputs[0]), inputs[1], jnp.asarray(inputs[2])
    mode = attrs.get("mode", "avg")
    ph, pw = int(attrs.get("output_height", 1)), int(attrs.get("output_width", 1))
    ratio = int(attrs.get("sampling_ratio", 0))
    scale = float(attrs.get("spatial_scale", 1.0))
    half = (
        attrs.get("coordinate_transformation_mode", "half_pixel" if ctx.opset >= 16 else "output_half_pixel")
        == "half_pixel"
    )
    height, width = x.shape[2:]
    off = 0.5 if half else 0.0
    if ratio > 0:
        grids = [(ratio, ratio)] * rois.shape[0]
    elif is_static(rois):
        grids = []
        for roi in np.asarray(rois, np.float64):
            x1, y1, x2, y2 = roi * scale - off
            rw, rh = x2 - x1, y2 - y1
            if not half:
                rw, rh = max(rw, 1.0), max(rh, 1.0)
            grids.append((int(math.ceil(rh / ph)), int(math.ceil(rw / pw))))
    else:
        raise NotImplementedError("RoiAlign with sampling_ratio 0 and RoIs known only at runtime")
    rois = jnp.asarray(rois).astype(jnp.float32)
    outs = []
    for r, (gh, gw) in enumerate(grids):
        x1, y1, x2, y2 = (rois[r, k] * scale - off for k in range(4))
        rw, rh = x2 - x1, y2 - y1
        if not half:
            rw, rh = jnp.maximum(rw, 1.0), jnp.maximum(rh, 1.0)
        bh, bw = rh / ph, rw / pw
        count = max(gh * gw, 1)
        ys = y1 + jnp.arange(ph)[:, None] * bh + (jnp.arange(gh)[None, :] + 0.5) * bh / gh
        xs = x1 + jnp.arange(pw)[:, None] * bw + (jnp.arange(gw)[None, :] + 0.5) * bw / gw
        yy, xx = jnp.broadcast_arrays(ys[:, :, None, None], xs[None, None, :, :])  # (ph, gh, pw, gw)
        inside = ~((yy < -1.0) | (yy > height) | (xx < -1.0) | (xx > width))
        yc, xc = jnp.maximum(yy, 0.0), jnp.maximum(xx, 0.0)
        y_lo = jnp.floor(yc).astype(jnp.int32)
        x_lo = jnp.floor(xc).astype(jnp.int32)
        y_edge, x_edge = y_lo >= height - 1, x_lo >= width - 1
        y_lo = jnp.where(y_edge, height - 1, y_lo)
        x_lo = jnp.where(x_edge, width - 1, x_lo)
        y_hi = jnp.where(y_edge, height - 1, y_lo + 1)
        x_hi = jnp.where(x_edge, width - 1, x_lo + 1)
        ly = jnp.where(y_edge, 0.0, yc - y_lo)
        lx = jnp.where(x_edge, 0.0, xc - x_lo)
        hy, hx = 1.0 - ly, 1.0 - lx
        img = x[batch_idx[r]].astype(jnp.float32)  # (C, H, W)
        corners = [(hy * hx, y_lo, x_lo), (hy * lx, y_lo, x_hi), (ly * hx, y_hi, x_lo), (ly * lx, y_hi, x_hi)]
        terms = [jnp.where(inside, w * img[:, yi, xi], 0.0) for w, yi, xi in corners]
        if mode == "avg":
            val = sum(terms).sum(axis=(2, 4)) / count
        else:
            val = jnp.max(jnp.stack(terms), axis=0).max(axis=(2, 4))
        outs.append(val.astype(x.dtype))
    if not outs:
        return (jnp.zeros((0, x.shape[1], ph, pw), x.dtype),)
    return (jnp.stack(outs),)
