"""Activation kernels: Relu, LeakyRelu, PRelu, Sigmoid, Tanh, Gelu, HardSigmoid, HardSwish, Elu,
Celu, Selu, Softplus, Softsign, Mish, Softmax and LogSoftmax.

Rules:

1. A standalone activation node is the elementwise unary kernel
   (:func:`mconv.targets.metal.msl.elementwise.lower_unary`) with the activation's
   expression; after a fusible op (Conv, Gemm, Add, ...) it is fused into that op's kernel.
2. PRelu is the elementwise binary kernel with ``a >= 0 ? a : a * b`` (the slope broadcast).
3. Softmax/LogSoftmax: one thread per row (a softmax needs the whole row), grid
   ``(OUTER*INNER, 1, 1)``; the row's max is subtracted before ``exp``, sums are float. Opset < 13
   flattens the shape at ``axis`` into 2-D (the row is everything from ``axis`` on); opset >= 13
   normalizes along ``axis`` alone.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from mconv.onnx_rules import softmax_axes
from mconv.targets.gpu.params.normalization import softmax_axis
from mconv.targets.gpu.values import required
from mconv.targets.metal.msl import UNARY_ACTIVATIONS, Activation, KernelSource, LowerContext, register
from mconv.targets.metal.msl.conv import constants
from mconv.targets.metal.msl.elementwise import check_binary, check_unary, lower_binary, lower_unary


@register(*UNARY_ACTIVATIONS, check=check_unary)
def lower_activation(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    """A standalone activation: the unary kernel with the activation's expression (rule 1)."""
    return lower_unary(ctx, node, kernel, act)


@register("PRelu", fusible=True, check=check_binary)
def lower_prelu(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    """PRelu: the binary kernel (rule 2)."""
    return lower_binary(ctx, node, kernel, act)


@register("Softmax", "LogSoftmax")
def lower_softmax(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x = required(node.inputs[0])
    xs = ctx.shape(x)
    axes = softmax_axes(len(xs), softmax_axis(node), ctx.opset)
    axis = axes[0]
    outer = int(np.prod(xs[:axis]))
    size, inner = int(np.prod([xs[a] for a in axes])), int(np.prod(xs[axes[-1] + 1 :]))
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
