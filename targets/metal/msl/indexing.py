"""Indexing kernels: Gather, GatherND.

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
4. GatherND (opset 11-13, ``batch_dims``): one thread per output element; the element's index
   tuple picks a slab of the data within its batch's block. Constant indices are baked as a
   table of data offsets (-1, giving 0, for a tuple with a component out of range); indices
   computed at run time are a buffer read as floats with rule 3's conditions on every component
   (the planner's float storage rule takes the longest axis a tuple addresses).
"""

from __future__ import annotations

import onnx_ir as ir
from mconv.targets.gpu.params.indexing import check_gather, check_gathernd, gather_geometry, gathernd_geometry
from mconv.targets.gpu.values import required
from mconv.targets.metal.msl import Activation, KernelSource, LowerContext, register
from mconv.targets.metal.msl.conv import constants


@register("Gather", check=check_gather, integers=True)
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


@register("GatherND", check=check_gathernd, integers=True)
def lower_gathernd(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    """Rule 4."""
    x, idx_value = required(node.inputs[0]), required(node.inputs[1])
    g = gathernd_geometry(ctx, node)
    P = kernel
    sizes = dict(COUNT=g.count, INNER=g.inner, PER=g.per, SLAB=g.slab, K=max(g.k, 1))
    head = f"""    if (gid.x >= uint({P}_COUNT)) return;
    const int i = int(gid.x);
    const int ii = i % {P}_INNER, t = i / {P}_INNER;
"""
    indices = LowerContext.const(idx_value)
    if indices is None:
        lines = [f"    int off = (t / {P}_PER) * {P}_SLAB;"]
        for j, (d, st) in enumerate(zip(g.dims, g.strides)):
            lines.append(
                f"    {{ const float f = float(I[t * {P}_K + {j}]);\n"
                f"      if (!(f >= float(-{d}) && f < float({d}))) {{ Y[gid.x] = 0; return; }}\n"
                f"      int k = int(f); if (k < 0) k += {d};\n"
                f"      if (k < 0 || k >= {d}) {{ Y[gid.x] = 0; return; }}\n"
                f"      off += k * {st}; }}"
            )
        params = [ctx.buffer_param(0, "X"), ctx.buffer_param(1, "I"), ctx.buffer_param(2, "Y", out=True)]
        src = (
            constants(P, sizes)
            + ctx.signature(kernel, params)
            + " {\n"
            + head
            + "\n".join(lines)
            + "\n    Y[gid.x] = X[off + ii];\n}\n"
        )
        return KernelSource(kernel, src, [x, idx_value], (g.count, 1, 1))
    offs = g.offsets(indices)
    table = f"constant int {P}_OFF[{len(offs)}] = {{{', '.join(map(str, offs))}}};\n"
    params = [ctx.buffer_param(0, "X"), ctx.buffer_param(1, "Y", out=True)]
    src = (
        table
        + constants(P, sizes)
        + ctx.signature(kernel, params)
        + " {\n"
        + head
        + f"""    const int off = {P}_OFF[t];
    if (off < 0) {{ Y[gid.x] = 0; return; }}
    Y[gid.x] = X[off + ii];
}}
"""
    )
    return KernelSource(kernel, src, [x], (g.count, 1, 1))
