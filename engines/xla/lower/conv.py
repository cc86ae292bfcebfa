"""Convolution: Conv and ConvTranspose as ``lax.conv_general_dilated``, Col2Im, DeformConv
(ConvInteger and QLinearConv: :mod:`.quantization`).

Rules:

1. Layouts are ONNX's (NC..., OI...), which is lax's default dimension order for any rank.
2. ``auto_pad`` SAME_UPPER puts the odd pad at the end, SAME_LOWER at the start; VALID pads
   nothing; NOTSET uses ``pads`` = [begin..., end...].
3. ConvTranspose is the convolution of the stride-dilated input with the flipped kernel, its
   in/out channels swapped per group; padding (k-1)*d - pad_begin and (k-1)*d - pad_end +
   output_padding. An ``output_shape`` attribute fixes the total padding; the odd pad goes to
   the start unless auto_pad is SAME_UPPER (as ONNX Runtime does).
4. Col2Im (static image and block shapes) scatter-adds each kernel tap's strided slice onto the
   padded canvas and crops the pads.
6. A Conv with 2..SPLIT_GROUPS groups (AlexNet's two towers) is lowered as that many ordinary
   convolutions on channel slices, concatenated: XLA's CPU backend runs a grouped convolution
   as a generic loop, 4-5x slower than the split (AlexNet's conv2); depthwise and many-group
   convolutions stay one op.
7. DeformConv (2-D) samples each tap bilinearly at its (traced) offset, zero outside the
   input, scaled by the optional mask, then multiplies with the weights per group.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax
from mconv.engines.xla.lower import lower

SPLIT_GROUPS = 4  # rule 6


def same_pads(size: list[int], kernel: list[int], strides: list[int], dilations: list[int], upper: bool):
    pads = []
    for n, k, s, d in zip(size, kernel, strides, dilations):
        out = -(-n // s)
        total = max((out - 1) * s + (k - 1) * d + 1 - n, 0)
        small = total // 2
        pads.append((small, total - small) if upper else (total - small, small))
    return pads


def conv_pads(attrs: dict, size: list[int], kernel: list[int], strides: list[int], dilations: list[int]):
    """(begin, end) per spatial axis from auto_pad / pads."""
    auto = attrs.get("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        return same_pads(size, kernel, strides, dilations, auto == "SAME_UPPER")
    if auto == "VALID":
        return [(0, 0)] * len(size)
    pads = list(attrs.get("pads", [0] * (2 * len(size))))
    r = len(size)
    return [(int(pads[i]), int(pads[i + r])) for i in range(r)]


def _bias(y, b):
    if b is None:
        return y
    return y + jnp.reshape(b, (1, -1) + (1,) * (y.ndim - 2))


@lower("Conv")
def conv(inputs, attrs, ctx):
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    r = w.ndim - 2
    kernel = list(attrs.get("kernel_shape", w.shape[2:]))
    strides = list(attrs.get("strides", [1] * r))
    dilations = list(attrs.get("dilations", [1] * r))
    pads = conv_pads(attrs, list(x.shape[2:]), kernel, strides, dilations)
    group = int(attrs.get("group", 1))
    w = jnp.asarray(w).astype(x.dtype)

    def one(xg, wg, groups):
        return lax.conv_general_dilated(
            xg, wg, window_strides=strides, padding=pads, rhs_dilation=dilations, feature_group_count=groups
        )

    if 1 < group <= SPLIT_GROUPS and w.shape[0] % group == 0 and w.shape[0] > group:
        # rule 6: a few groups as that many ordinary convolutions, concatenated
        xs = jnp.split(x, group, axis=1)
        ws = jnp.split(w, group, axis=0)
        y = jnp.concatenate([one(a, c, 1) for a, c in zip(xs, ws)], axis=1)
    else:
        y = one(x, w, group)
    return (_bias(y, b),)


@lower("ConvTranspose")
def conv_transpose(inputs, attrs, ctx):
    x, w = inputs[0], jnp.asarray(inputs[1])
    b = inputs[2] if len(inputs) > 2 else None
    r = w.ndim - 2
    group = int(attrs.get("group", 1))
    kernel = list(attrs.get("kernel_shape", w.shape[2:]))
    strides = list(attrs.get("strides", [1] * r))
    dilations = list(attrs.get("dilations", [1] * r))
    out_pad = list(attrs.get("output_padding", [0] * r))
    size = list(x.shape[2:])
    auto = attrs.get("auto_pad", "NOTSET")
    if "output_shape" in attrs or auto in ("SAME_UPPER", "SAME_LOWER"):
        out_shape = (
            list(attrs["output_shape"])[-r:]
            if "output_shape" in attrs
            else [n * s for n, s in zip(size, strides)]
        )
        pads = []
        for i in range(r):
            total = (
                strides[i] * (size[i] - 1) + out_pad[i] + (kernel[i] - 1) * dilations[i] + 1 - out_shape[i]
            )
            total = max(total, 0)
            if auto == "SAME_UPPER":
                pads.append((total // 2, total - total // 2))
            else:
                pads.append((total - total // 2, total // 2))
    elif auto == "VALID":
        pads = [(0, 0)] * r
    else:
        p = list(attrs.get("pads", [0] * (2 * r)))
        pads = [(int(p[i]), int(p[i + r])) for i in range(r)]
    cin, cout_g = w.shape[0], w.shape[1]
    # (C, M/g, k...) -> (g, C/g, M/g, k...) -> (g, M/g, C/g, k...) -> (M, C/g, k...), flipped.
    wg = jnp.reshape(w, (group, cin // group, cout_g) + tuple(w.shape[2:]))
    wg = jnp.swapaxes(wg, 1, 2)
    wt = jnp.reshape(wg, (group * cout_g, cin // group) + tuple(w.shape[2:]))
    wt = jnp.flip(wt, axis=tuple(range(2, 2 + r)))
    padding = [
        (
            (kernel[i] - 1) * dilations[i] - pads[i][0],
            (kernel[i] - 1) * dilations[i] - pads[i][1] + out_pad[i],
        )
        for i in range(r)
    ]
    y = lax.conv_general_dilated(
        x,
        wt.astype(x.dtype),
        window_strides=[1] * r,
        padding=padding,
        lhs_dilation=strides,
        rhs_dilation=dilations,
        feature_group_count=group,
    )
    return (_bias(y, b),)


@lower("Col2Im", static=(1, 2))
def col2im(inputs, attrs, ctx):
    """Scatter-add the ``(N, C*prod(block), L)`` columns onto the padded image, then crop."""
    import itertools
    import math

    x = jnp.asarray(inputs[0])
    image = [int(v) for v in np.asarray(inputs[1]).reshape(-1)]
    block = [int(v) for v in np.asarray(inputs[2]).reshape(-1)]
    r = len(image)
    strides = list(attrs.get("strides", [1] * r))
    dilations = list(attrs.get("dilations", [1] * r))
    pads = conv_pads(attrs, image, block, strides, dilations)
    canvas = [i + b + e for i, (b, e) in zip(image, pads)]
    out = [(c - ((k - 1) * d + 1)) // s + 1 for c, k, d, s in zip(canvas, block, dilations, strides)]
    n, ck, length = x.shape
    if length != math.prod(out):
        raise ValueError(f"Col2Im: {length} blocks given, image and block shapes imply {math.prod(out)}")
    c = ck // math.prod(block)
    cols = x.reshape((n, c, *block, *out))
    y = jnp.zeros((n, c, *canvas), x.dtype)
    for tap in itertools.product(*(range(k) for k in block)):
        sl = tuple(
            slice(t * d, t * d + (o - 1) * s + 1, s) for t, d, o, s in zip(tap, dilations, out, strides)
        )
        y = y.at[(slice(None), slice(None), *sl)].add(cols[(slice(None), slice(None), *tap)])
    crop = tuple(slice(b, b + i) for i, (b, _) in zip(image, pads))
    return (y[(slice(None), slice(None), *crop)],)


@lower("DeformConv")
def deform_conv(inputs, attrs, ctx):
    """2-D deformable convolution: each tap samples X bilinearly at its offset (zero outside),
    then one grouped product with the weights (the reference executor's formulation)."""
    x, w, offset = jnp.asarray(inputs[0]), jnp.asarray(inputs[1]), jnp.asarray(inputs[2])
    b = inputs[3] if len(inputs) > 3 else None
    mask = inputs[4] if len(inputs) > 4 else None
    if x.ndim != 4:
        raise NotImplementedError("DeformConv other than 2-D")
    group = int(attrs.get("group", 1))
    og = int(attrs.get("offset_group", 1))
    kh, kw = (int(k) for k in attrs.get("kernel_shape", w.shape[2:]))
    strides = list(attrs.get("strides", [1, 1]))
    dilations = list(attrs.get("dilations", [1, 1]))
    n, c, h, wd = x.shape
    pads = conv_pads(attrs, [h, wd], [kh, kw], strides, dilations)
    oh, ow = (
        (size + pb + pe - ((k - 1) * d + 1)) // s + 1
        for size, (pb, pe), k, d, s in zip((h, wd), pads, (kh, kw), dilations, strides)
    )
    taps = kh * kw
    dt = jnp.result_type(x.dtype, offset.dtype)
    off = offset.reshape(n, og, taps, 2, oh, ow).astype(dt)
    msk = (
        jnp.ones((n, og, taps, oh, ow), dt)
        if mask is None
        else jnp.asarray(mask).reshape(n, og, taps, oh, ow)
    )
    ky, kx = np.meshgrid(np.arange(kh), np.arange(kw), indexing="ij")
    base_y = (np.arange(oh) * strides[0] - pads[0][0])[None, :, None] + (ky.reshape(-1) * dilations[0])[
        :, None, None
    ]
    base_x = (np.arange(ow) * strides[1] - pads[1][0])[None, None, :] + (kx.reshape(-1) * dilations[1])[
        :, None, None
    ]
    py = base_y[None, None] + off[:, :, :, 0]  # (n, og, taps, oh, ow)
    px = base_x[None, None] + off[:, :, :, 1]
    y0, x0 = jnp.floor(py).astype(jnp.int32), jnp.floor(px).astype(jnp.int32)
    fy, fx = py - y0, px - x0
    cpg = c // og
    xr = x.reshape(n, og, cpg, h * wd).astype(dt)
    samples = jnp.zeros((n, og, cpg, taps, oh, ow), dt)
    for dy, dx in ((0, 0), (0, 1), (1, 0), (1, 1)):
        yy, xx = y0 + dy, x0 + dx
        wgt = (fy if dy else 1 - fy) * (fx if dx else 1 - fx)
        valid = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < wd)
        idx = jnp.where(valid, yy * wd + xx, 0).reshape(n, og, 1, -1)
        vals = jnp.take_along_axis(xr, jnp.broadcast_to(idx, (n, og, cpg, idx.shape[-1])), axis=3)
        samples = samples + vals.reshape(n, og, cpg, taps, oh, ow) * (wgt * valid * msk)[:, :, None]
    cols = samples.reshape(n, group, (c // group) * taps, oh * ow)
    m = w.shape[0]
    y = jnp.matmul(w.reshape(group, m // group, -1)[None].astype(dt), cols, precision=lax.Precision.HIGHEST)
    y = y.reshape(n, m, oh, ow)
    if b is not None:
        y = y + jnp.asarray(b).reshape(1, m, 1, 1)
    return (y.astype(x.dtype),)
