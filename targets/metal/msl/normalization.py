"""Normalization kernels: BatchNormalization (one that fuse-bn could not fold into a
convolution), LRN (across channels, as the ONNX spec says) and LayerNormalization.

Rules:

1. BatchNormalization (inference), one thread per element, with a fused activation:
   ``y = (x - mean[c]) * rsqrt(var[c] + eps) * scale[c] + B[c]``.
2. LRN: one thread per element; ``y = x / (bias + alpha / size * sum(x[c']^2))^beta`` over
   ``c' in [c - floor((size-1)/2), c + ceil((size-1)/2)]`` clipped to the channels.
3. LayerNormalization: one thread per row (everything from ``axis`` on); scale and bias of the
   row's shape (or one value); mean and variance in float, ``rsqrt(var + epsilon)``.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from mconv.targets.gpu.params.normalization import check_layernorm
from mconv.targets.gpu.values import all_required, required
from mconv.targets.metal.msl import (
    Activation,
    KernelSource,
    LowerContext,
    activation_expr,
    flit,
    register,
)
from mconv.targets.metal.msl.conv import constants


@register("LRN")
def lower_lrn(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x = required(node.inputs[0])
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


@register("LayerNormalization", check=check_layernorm)
def lower_layernorm(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    """rule 3: one thread per row (the axes from ``axis`` on), two float passes (mean, variance)."""
    x = required(node.inputs[0])
    xs = ctx.shape(x)
    axis = node.attributes.get_int("axis", -1)
    axis = axis + len(xs) if axis < 0 else axis
    size = int(np.prod(xs[axis:]))
    rows = int(np.prod(xs[:axis]))
    eps = node.attributes.get_float("epsilon", 1e-5)
    reads = [x, required(node.inputs[1])]
    params = [ctx.buffer_param(0, "X"), ctx.buffer_param(1, "S")]
    s_idx = "j" if int(np.prod(ctx.shape(required(node.inputs[1])))) == size else "0"
    bias = ""
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        reads.append(required(node.inputs[2]))
        params.append(ctx.buffer_param(2, "B"))
        b_idx = "j" if int(np.prod(ctx.shape(required(node.inputs[2])))) == size else "0"
        bias = f" + float(B[{b_idx}])"
    params.append(ctx.buffer_param(len(params), "Y", out=True))
    P = kernel
    src = (
        constants(P, dict(ROWS=rows, SIZE=size))
        + ctx.signature(kernel, params)
        + f""" {{
    if (gid.x >= uint({P}_ROWS)) return;
    const int base = int(gid.x) * {P}_SIZE;
    float mean = 0.0f;
    for (int j = 0; j < {P}_SIZE; ++j) mean += float(X[base + j]);
    mean /= float({P}_SIZE);
    float var = 0.0f;
    for (int j = 0; j < {P}_SIZE; ++j) {{ const float d = float(X[base + j]) - mean; var += d * d; }}
    const float inv = rsqrt(var / float({P}_SIZE) + {flit(eps)});
    for (int j = 0; j < {P}_SIZE; ++j)
        Y[base + j] = {ctx.storage}((float(X[base + j]) - mean) * inv * float(S[{s_idx}]){bias});
}}
"""
    )
    return KernelSource(kernel, src, reads, (rows, 1, 1))


@register("BatchNormalization", fusible=True)
def lower_batchnorm(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x, scale, bias, mean, var = all_required(node.inputs[:5])
    xs = ctx.shape(x)
    count = int(np.prod(xs))
    c = xs[1] if len(xs) > 1 else 1
    inner = int(np.prod(xs[2:])) if len(xs) > 2 else 1
    eps = node.attributes.get_float("epsilon", 1e-5)
    P = kernel
    names = ("X", "S", "B", "M", "V")
    params = [ctx.buffer_param(i, n) for i, n in enumerate(names)] + [ctx.buffer_param(5, "Y", out=True)]
    src = (
        constants(P, dict(COUNT=count, C=c, INNER=inner))
        + ctx.signature(kernel, params)
        + f""" {{
    if (gid.x >= uint({P}_COUNT)) return;
    const int c = (int(gid.x) / {P}_INNER) % {P}_C;
    const float v = (float(X[gid.x]) - float(M[c])) * rsqrt(float(V[c]) + {flit(eps)}) * float(S[c]) + float(B[c]);
    Y[gid.x] = {ctx.storage}({activation_expr(act)});
}}
"""
    )
    return KernelSource(kernel, src, [x, scale, bias, mean, var], (count, 1, 1))
