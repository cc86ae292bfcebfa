"""Indexing kernels: Gather.

Rules:

1. One thread per output element, grid ``(count, 1, 1)``.
2. Gather with constant indices (negative ones counted from the end): the index table is baked
   as a ``constant int`` array (none when the indices are one value or an arithmetic run).
3. Gather with indices computed at run time (a token embedding's ids): the indices are a buffer
   read as floats (integers held as floats, the plan's rule 3), bound after the data. A negative
   index counts from the end; an index outside ``[-n, n)`` (or not a number) gives 0 for the
   element, never a read outside the data. Integer indices are exact up to 2^11 in half storage,
   so the planner stores a graph in float whenever such a Gather indexes an axis longer than
   that (:func:`runtime_gather_axes`, the plan's rule 6).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from mconv.targets.metal.kernels import Activation, KernelSource, LowerContext, register
from mconv.targets.metal.kernels.conv import constants
from mconv.targets.metal.values import required


def runtime_gather_axes(graph: ir.Graph) -> list[tuple[str, int]]:
    """(node name, length of the gathered axis) for every Gather whose indices are computed at
    run time (rule 3)."""
    found = []
    for node in graph:
        if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
            continue
        x, idx = node.inputs[0], node.inputs[1]
        if x is None or idx is None or idx.const_value is not None or x.shape is None:
            continue
        axis = node.attributes.get_int("axis", 0)
        rank = len(x.shape)
        if not -rank <= axis < rank:
            continue
        n = x.shape[axis]
        found.append((node.name or "", n if isinstance(n, int) else 0))
    return found


def _check_gather(ctx: LowerContext, node: ir.Node) -> str | None:
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


@register("Gather", check=_check_gather, integers=True)
def lower_gather(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x = required(node.inputs[0])
    xs, axis, inner, n_idx, count = gather_geometry(ctx, node)
    P = kernel
    indices = LowerContext.const(node.inputs[1])
    if indices is None:  # rule 3
        idx_value = required(node.inputs[1])
        params = [ctx.buffer_param(0, "X"), ctx.buffer_param(1, "I"), ctx.buffer_param(2, "Y", out=True)]
        src = (
            constants(P, dict(COUNT=count, INNER=inner, NIDX=n_idx, AXIS=xs[axis]))
            + ctx.signature(kernel, params)
            + f""" {{
    if (gid.x >= uint({P}_COUNT)) return;
    const int i = int(gid.x);
    const int ii = i % {P}_INNER, j = (i / {P}_INNER) % {P}_NIDX, o = i / ({P}_INNER * {P}_NIDX);
    const float f = float(I[j]);
    if (!(f >= float(-{P}_AXIS) && f < float({P}_AXIS))) {{ Y[gid.x] = 0; return; }}
    int k = int(f);
    if (k < 0) k += {P}_AXIS;
    if (k < 0 || k >= {P}_AXIS) {{ Y[gid.x] = 0; return; }}
    Y[gid.x] = X[(o * {P}_AXIS + k) * {P}_INNER + ii];
}}
"""
        )
        return KernelSource(kernel, src, [x, idx_value], (count, 1, 1))
    idx = [int(i) + xs[axis] if int(i) < 0 else int(i) for i in indices.ravel()]
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
