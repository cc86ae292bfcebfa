"""Indexing kernels: Gather.

Rules:

1. One thread per output element, grid ``(count, 1, 1)``.
2. Gather with constant indices (negative ones counted from the end): the index table is baked
   as a ``constant int`` array (none when the indices are one value or an arithmetic run).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from mconv.targets.metal.kernels import Activation, KernelSource, LowerContext, register
from mconv.targets.metal.kernels.conv import constants
from mconv.targets.metal.values import required


def _check_gather(ctx: LowerContext, node: ir.Node) -> str | None:
    if LowerContext.const(node.inputs[1]) is None:
        return "indices not constant"
    return None


@register("Gather", check=_check_gather, integers=True)
def lower_gather(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x = required(node.inputs[0])
    xs = ctx.shape(x)
    axis = node.attributes.get_int("axis", 0)
    axis = axis + len(xs) if axis < 0 else axis
    indices = LowerContext.const(node.inputs[1])
    assert indices is not None  # _check_gather admits constant indices only
    idx = [int(i) + xs[axis] if int(i) < 0 else int(i) for i in indices.ravel()]
    inner = int(np.prod(xs[axis + 1 :]))
    n_idx = len(idx)
    count = int(np.prod(xs[:axis])) * n_idx * inner
    P = kernel
    table = ""
    if n_idx == 1:
        pick = str(idx[0])
    elif all(idx[i + 1] - idx[i] == idx[1] - idx[0] for i in range(n_idx - 1)):
        pick = f"({idx[0]} + j * {idx[1] - idx[0]})"
    else:
        table = f"constant int {P}_IDX[{n_idx}] = {{{', '.join(map(str, idx))}}};\n"
        pick = f"{P}_IDX[j]"
    params = [ctx.buffer_param(0, "X"), ctx.buffer_param(1, "Y", out=True)]
    src = (
        table
        + constants(P, dict(COUNT=count, INNER=inner, NIDX=n_idx, AXIS=xs[axis]))
        + ctx.signature(kernel, params)
        + f""" {{
    if (gid.x >= uint({P}_COUNT)) return;
    const int i = int(gid.x);
    const int ii = i % {P}_INNER, j = (i / {P}_INNER) % {P}_NIDX, o = i / ({P}_INNER * {P}_NIDX);
    Y[gid.x] = X[(o * {P}_AXIS + {pick}) * {P}_INNER + ii];
}}
"""
    )
    return KernelSource(kernel, src, [x], (count, 1, 1))
