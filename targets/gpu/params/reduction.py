"""Reduction parameters: the reduced axes (attribute or input, by opset) and merged groups."""

from __future__ import annotations

import onnx_ir as ir
from mconv.targets.gpu.ops import LowerContext


def reduce_axes(ctx: LowerContext, node: ir.Node, rank: int) -> list[int] | None:
    """The normalized reduced axes (sorted), or None when the axes input is not constant."""
    axes = None
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        arr = LowerContext.const(node.inputs[1])
        if arr is None:
            return None
        axes = [int(a) for a in arr.ravel()]
    elif "axes" in node.attributes:
        axes = list(node.attributes.get_ints("axes"))
    if not axes:
        return [] if node.attributes.get_int("noop_with_empty_axes", 0) else list(range(rank))
    return sorted({a + rank if a < 0 else a for a in axes})


def merged_groups(shape: list[int], reduced: set[int]) -> list[tuple[int, int, bool]]:
    """(size, element stride, reduced) per run of adjacent axes of the same kind, outermost first."""
    strides, step = [0] * len(shape), 1
    for a in reversed(range(len(shape))):
        strides[a] = step
        step *= shape[a]
    groups: list[tuple[int, int, bool]] = []
    for a in range(len(shape)):
        if shape[a] == 1:
            continue
        red = a in reduced
        if groups and groups[-1][2] == red:
            size, _, _ = groups[-1]
            groups[-1] = (size * shape[a], strides[a], red)
        else:
            groups.append((shape[a], strides[a], red))
    return groups
