"""Normalization kernels: Softmax, LogSoftmax and LRN (across channels, as the ONNX spec says).

Rules:

1. Softmax/LogSoftmax: one thread per row (a softmax needs the whole row), grid
   ``(OUTER*INNER, 1, 1)``; the row's max is subtracted before ``exp``, sums are float. Opset < 13
   flattens the shape at ``axis`` into 2-D (the row is everything from ``axis`` on); opset >= 13
   normalizes along ``axis`` alone.
2. LRN: one thread per element; ``y = x / (bias + alpha / size * sum(x[c']^2))^beta`` over
   ``c' in [c - floor((size-1)/2), c + ceil((size-1)/2)]`` clipped to the channels.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from mconv.targets.metal.kernels import Activation, KernelSource, LowerContext, flit, register
from mconv.targets.metal.kernels.conv import constants


@register("Softmax", "LogSoftmax")
def lower_softmax(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x = node.inputs[0]
    xs = ctx.shape(x)
    rank = len(xs)
    axis = node.attributes.get_int("axis", -1 if ctx.opset >= 13 else 1)
    axis = axis + rank if axis < 0 else axis
    outer = int(np.prod(xs[:axis]))
    if ctx.opset >= 13:
        size, inner = xs[axis], int(np.prod(xs[axis + 1 :]))
    else:
        size, inner = int(np.prod(xs[axis:])), 1
    P = kernel
    store = (
        "float(X[base + j * {P}_INNER]) - mx - log(sum)"
        if node.op_type == "LogSoftmax"
        else ("exp(float(X[base + j * {P}_INNER]) - mx) / sum")
    )
    store = store.format(P=P)
    params = [ctx.buffer_param(0, "X"), ctx.buffer_param(1, "Y", out=True)]
    src = (
        constants(P, dict(ROWS=outer * inner, SIZE=size, INNER=inner))
        + ctx.signature(kernel, params)
        + f""" {{
    if (gid.x >= uint({P}_ROWS)) return;
    const int o = int(gid.x) / {P}_INNER, ii = int(gid.x) % {P}_INNER;
    const int base = o * {P}_SIZE * {P}_INNER + ii;
    float mx = -INFINITY;
    for (int j = 0; j < {P}_SIZE; ++j) mx = max(mx, float(X[base + j * {P}_INNER]));
    float sum = 0.0f;
    for (int j = 0; j < {P}_SIZE; ++j) sum += exp(float(X[base + j * {P}_INNER]) - mx);
    for (int j = 0; j < {P}_SIZE; ++j) Y[base + j * {P}_INNER] = {ctx.storage}({store});
}}
"""
    )
    return KernelSource(kernel, src, [x], (outer * inner, 1, 1))


@register("LRN")
def lower_lrn(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x = node.inputs[0]
    xs = ctx.shape(x)
    count = int(np.prod(xs))
    c = xs[1]
    inner = int(np.prod(xs[2:]))
    size = node.attributes.get_int("size")
    alpha = node.attributes.get_float("alpha", 1e-4)
    beta = node.attributes.get_float("beta", 0.75)
    bias = node.attributes.get_float("bias", 1.0)
    lo, hi = (size - 1) // 2, (size - 1) - (size - 1) // 2
    P = kernel
    params = [ctx.buffer_param(0, "X"), ctx.buffer_param(1, "Y", out=True)]
    src = (
        constants(P, dict(COUNT=count, C=c, INNER=inner, LO=lo, HI=hi))
        + ctx.signature(kernel, params)
        + f""" {{
    if (gid.x >= uint({P}_COUNT)) return;
    const int i = int(gid.x);
    const int ch = (i / {P}_INNER) % {P}_C;
    const int base = i - ch * {P}_INNER;
    float sq = 0.0f;
    for (int k = max(0, ch - {P}_LO); k <= min({P}_C - 1, ch + {P}_HI); ++k) {{
        const float t = float(X[base + k * {P}_INNER]);
        sq += t * t;
    }}
    const float v = float(X[i]) / pow({flit(bias)} + {flit(alpha / size)} * sq, {flit(beta)});
    Y[i] = {ctx.storage}(v);
}}
"""
    )
    return KernelSource(kernel, src, [x], (count, 1, 1))
