"""Convolution: Conv and ConvTranspose as ``lax.conv_general_dilated``.

Rules:

1. Layouts are ONNX's (NC..., OI...), which is lax's default dimension order for any rank.
2. ``auto_pad`` SAME_UPPER puts the odd pad at the end, SAME_LOWER at the start; VALID pads
   nothing; NOTSET uses ``pads`` = [begin..., end...].
3. ConvTranspose is the convolution of the stride-dilated input with the flipped kernel, its
   in/out channels swapped per group; padding (k-1)*d - pad_begin and (k-1)*d - pad_end +
   output_padding. An ``output_shape`` attribute fixes the total padding; the odd pad goes to
   the start unless auto_pad is SAME_UPPER (as ONNX Runtime does).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from mconv.targets.xla.lower import lower


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
    y = lax.conv_general_dilated(
        x,
        jnp.asarray(w).astype(x.dtype),
        window_strides=strides,
        padding=pads,
        rhs_dilation=dilations,
        feature_group_count=int(attrs.get("group", 1)),
    )
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
