"""Gather parameters: the indices' conditions and the geometry (axis, inner size, counts)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from mconv.targets.gpu.ops import LowerContext
from mconv.targets.gpu.values import required


def check_gather(ctx: LowerContext, node: ir.Node) -> str | None:
    if len(node.inputs) < 2 or node.inputs[1] is None:
        return "Gather takes 2 inputs"
    idx = node.inputs[1]
    if idx.const_value is None and (idx.shape is None or any(not isinstance(d, int) for d in idx.shape)):
        return "indices shape not static"
    return None


def gather_geometry(ctx: LowerContext, node: ir.Node) -> tuple[list[int], int, int, int, int]:
    """(data shape, axis, inner size, index count, output count) of a Gather."""
    x = required(node.inputs[0])
    xs = ctx.shape(x)
    axis = node.attributes.get_int("axis", 0)
    axis = axis + len(xs) if axis < 0 else axis
    idx_value = required(node.inputs[1])
    const = LowerContext.const(idx_value)
    n_idx = int(const.size) if const is not None else int(np.prod(ctx.shape(idx_value)))
    inner = int(np.prod(xs[axis + 1 :]))
    count = int(np.prod(xs[:axis])) * n_idx * inner
    return xs, axis, inner, n_idx, count
