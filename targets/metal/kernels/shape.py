"""Data-movement kernels: Concat and Transpose (Reshape, Flatten, Squeeze, Unsqueeze, Identity
and Dropout are views: the planner aliases their output to the input's buffer, no kernel).

Rules:

1. Concat: one thread per output element, grid ``(count, 1, 1)``; the coordinate along ``axis``
   picks the input, each input bound in the node's order.
2. Transpose: one thread per output element; output coordinates map to input offsets through
   the permuted input strides (baked).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from mconv.targets.metal.kernels import Activation, KernelSource, LowerContext, register
from mconv.targets.metal.kernels.conv import constants
from mconv.targets.metal.kernels.elementwise import _offsets


@register("Concat")
def lower_concat(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    y = node.outputs[0]
    ys = ctx.shape(y)
    axis = node.attributes.get_int("axis", 0)
    axis = axis + len(ys) if axis < 0 else axis
    inner = int(np.prod(ys[axis + 1 :]))
    count = int(np.prod(ys))
    inputs = list(node.inputs)
    sizes = [ctx.shape(v)[axis] for v in inputs]
    P = kernel
    params = [ctx.buffer_param(i, f"X{i}") for i in range(len(inputs))]
    params.append(ctx.buffer_param(len(inputs), "Y", out=True))
    branches, start = [], 0
    for i, s in enumerate(sizes):
        cond = "if" if i == 0 else "else if"
        branches.append(f"{cond} (a < {start + s}) v = X{i}[(o * {s} + (a - {start})) * {P}_INNER + ii];")
        start += s
    src = (
        constants(P, dict(COUNT=count, AXIS=ys[axis], INNER=inner))
        + ctx.signature(kernel, params)
        + f""" {{
    if (gid.x >= uint({P}_COUNT)) return;
    const int i = int(gid.x);
    const int ii = i % {P}_INNER, a = (i / {P}_INNER) % {P}_AXIS, o = i / ({P}_INNER * {P}_AXIS);
    {ctx.storage} v = {ctx.storage}(0);
    {(chr(10) + "    ").join(branches)}
    Y[i] = v;
}}
"""
    )
    return KernelSource(kernel, src, inputs, (count, 1, 1))


@register("Transpose")
def lower_transpose(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x, y = node.inputs[0], node.outputs[0]
    xs, ys = ctx.shape(x), ctx.shape(y)
    perm = list(node.attributes.get_ints("perm", list(reversed(range(len(xs))))))
    in_strides, step = [0] * len(xs), 1
    for axis in reversed(range(len(xs))):
        in_strides[axis] = step
        step *= xs[axis]
    strides = [in_strides[p] for p in perm]
    count = int(np.prod(ys))
    P = kernel
    params = [ctx.buffer_param(0, "X"), ctx.buffer_param(1, "Y", out=True)]
    src = (
        constants(P, dict(COUNT=count))
        + ctx.signature(kernel, params)
        + f""" {{
    if (gid.x >= uint({P}_COUNT)) return;
    int r = int(gid.x);
    {_offsets(ys, [("x", strides)])}
    Y[gid.x] = X[i_x];
}}
"""
    )
    return KernelSource(kernel, src, [x], (count, 1, 1))
