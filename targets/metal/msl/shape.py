"""Data-movement kernels: Concat, Transpose, Slice, Split, Pad, Expand, Tile, Resize,
Upsample, DepthToSpace, SpaceToDepth (Reshape, Flatten, Squeeze, Unsqueeze, Identity and Dropout
are views: the planner aliases their output to the input's buffer, no kernel; Gather:
:mod:`.indexing`).

Rules:

1. One thread per output element, grid ``(count, 1, 1)``, for every kernel here.
2. Concat: the coordinate along ``axis`` picks the input, each input bound in the node's order.
3. Strided copies: output coordinates map to input offsets through baked strides: Transpose
   (permuted strides), Slice (constant starts/ends/axes/steps, clamped as Python slices are:
   a start offset plus ``step * stride``), Split (one kernel per output, each a Slice), Expand
   (stride 0 along broadcast axes), DepthToSpace/SpaceToDepth (the 6-D transpose of their
   definition).
4. Pad (constant pads, ``axes``; modes constant, reflect, edge, wrap; negative pads crop): each
   output coordinate minus the begin pad is mapped into the input (reflected about the borders,
   clamped, or wrapped) or, in constant mode, out of range gives the constant value. Tile: each
   coordinate modulo the input's extent.
5. Resize/Upsample (constant scales or sizes; every mode and coordinate transformation the
   reference executor has): separable, one tap table per resized axis computed by the
   reference executor's own ``resize_matrix`` (nearest: one tap; linear: two; cubic: four),
   baked as constant arrays; the kernel sums the product of the axes' weights over their taps.
   ``tf_crop_and_resize`` outputs outside the RoI take ``extrapolation_value``.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from mconv.targets.gpu.params.elementwise import broadcast_strides
from mconv.targets.gpu.params.shape import (
    check_pad,
    check_resize,
    depth_space_view,
    pad_params,
    resize_axes,
    resize_taps,
    slice_params,
    strides,
)
from mconv.targets.gpu.values import all_required, required
from mconv.targets.metal.msl import Activation, KernelSource, LowerContext, flit, register
from mconv.targets.metal.msl.conv import constants
from mconv.targets.metal.msl.elementwise import _offsets


@register("Concat", integers=True)
def lower_concat(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    y = node.outputs[0]
    ys = ctx.shape(y)
    axis = node.attributes.get_int("axis", 0)
    axis = axis + len(ys) if axis < 0 else axis
    inner = int(np.prod(ys[axis + 1 :]))
    count = int(np.prod(ys))
    inputs = all_required(node.inputs)
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


@register("Transpose", integers=True)
def lower_transpose(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x, y = required(node.inputs[0]), node.outputs[0]
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


def strided_copy(
    ctx: LowerContext,
    kernel: str,
    x: ir.Value,
    out_shape: list[int],
    strides: list[int],
    base: int = 0,
    output: ir.Value | None = None,
) -> KernelSource:
    """Y[flat] = X[base + sum(coord_i * strides_i)] over ``out_shape`` (rule 3)."""
    count = int(np.prod(out_shape)) if out_shape else 1
    P = kernel
    params = [ctx.buffer_param(0, "X"), ctx.buffer_param(1, "Y", out=True)]
    src = (
        constants(P, dict(COUNT=count))
        + ctx.signature(kernel, params)
        + f""" {{
    if (gid.x >= uint({P}_COUNT)) return;
    int r = int(gid.x);
    {_offsets(out_shape, [("x", strides)])}
    Y[gid.x] = X[{base} + i_x];
}}
"""
    )
    return KernelSource(kernel, src, [x], (count, 1, 1), output=output)


def _check_slice(ctx: LowerContext, node: ir.Node) -> str | None:
    got = slice_params(ctx, node)
    return got if isinstance(got, str) else None


@register("Slice", check=_check_slice, integers=True)
def lower_slice(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x, y = required(node.inputs[0]), node.outputs[0]
    xs, ys = ctx.shape(x), ctx.shape(y)
    got = slice_params(ctx, node)
    assert not isinstance(got, str)
    begin, step = got
    st = strides(xs)
    base = sum(b * s for b, s in zip(begin, st))
    return strided_copy(ctx, kernel, x, ys, [sp * s for sp, s in zip(step, st)], base)


@register("Split", integers=True)
def lower_split(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> list[KernelSource]:
    x = required(node.inputs[0])
    xs = ctx.shape(x)
    axis = node.attributes.get_int("axis", 0)
    axis = axis + len(xs) if axis < 0 else axis
    st = strides(xs)
    out, start = [], 0
    for i, y in enumerate(node.outputs):
        ys = ctx.shape(y)
        if y.uses() or y.is_graph_output():
            out.append(strided_copy(ctx, f"{kernel}_o{i}", x, ys, st, start * st[axis], output=y))
        start += ys[axis]
    return out


@register("Expand", integers=True)
def lower_expand(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x, y = required(node.inputs[0]), node.outputs[0]
    return strided_copy(ctx, kernel, x, ctx.shape(y), broadcast_strides(ctx.shape(x), ctx.shape(y)))


@register("DepthToSpace", "SpaceToDepth", integers=True)
def lower_depth_space(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x = required(node.inputs[0])
    return strided_copy(ctx, kernel, x, *depth_space_view(node, ctx.shape(x)))


@register("Pad", check=check_pad, integers=True)
def lower_pad(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x, y = required(node.inputs[0]), node.outputs[0]
    xs, ys = ctx.shape(x), ctx.shape(y)
    got = pad_params(ctx, node)
    assert not isinstance(got, str)
    begins, mode, value = got
    return _remap(ctx, kernel, x, xs, ys, [(b, mode) for b in begins], value)


def _remap(ctx, kernel, x, xs, ys, axes, value=0.0) -> KernelSource:
    """Per output axis (begin, mode): i = c - begin mapped into [0, D) by the mode (rule 4)."""
    st = strides(xs)
    count = int(np.prod(ys)) if ys else 1
    lines = ["int off = 0; bool outside = false;"]
    for a in reversed(range(len(ys))):
        dim, d_in, (b, mode) = ys[a], xs[a], axes[a]
        if d_in == 1 and mode != "constant":
            lines.append(f"r /= {dim};")  # every mode maps to the one element
            continue
        fix = ""
        if mode == "constant":
            fix = f"if (i < 0 || i >= {d_in}) outside = true;"
        elif mode == "edge":
            fix = f"i = min(max(i, 0), {d_in - 1});"
        elif mode == "reflect":
            m = 2 * (d_in - 1)
            fix = f"i = ((i % {m}) + {m}) % {m}; if (i >= {d_in}) i = {m} - i;"
        elif mode in ("wrap", "tile"):
            fix = f"i = ((i % {d_in}) + {d_in}) % {d_in};"
        if b == 0 and dim == d_in and mode != "tile":
            fix = ""
        lines.append(f"{{ int i = r % {dim} - {b}; r /= {dim}; {fix} off += i * {st[a]}; }}")
    P = kernel
    params = [ctx.buffer_param(0, "X"), ctx.buffer_param(1, "Y", out=True)]
    src = (
        constants(P, dict(COUNT=count))
        + ctx.signature(kernel, params)
        + f""" {{
    if (gid.x >= uint({P}_COUNT)) return;
    int r = int(gid.x);
    {(chr(10) + "    ").join(lines)}
    Y[gid.x] = outside ? {ctx.storage}({flit(value)}) : X[outside ? 0 : off];
}}
"""
    )
    return KernelSource(kernel, src, [x], (count, 1, 1))


@register("Tile", integers=True)
def lower_tile(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x, y = required(node.inputs[0]), node.outputs[0]
    xs = ctx.shape(x)
    return _remap(ctx, kernel, x, xs, ctx.shape(y), [(0, "tile")] * len(xs))


@register("Resize", "Upsample", check=check_resize)
def lower_resize(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x, y = required(node.inputs[0]), node.outputs[0]
    xs, ys = ctx.shape(x), ctx.shape(y)
    plan, attrs = resize_axes(ctx, node)
    P = kernel
    st = strides(xs)
    tables, loops_open, loops_close, weights, offs = [], [], [], [], []
    resized = {axis: (w, ext) for axis, w, ext in plan}
    any_ext = any(ext.any() for _, _, ext in plan)
    coords = ["int r = int(gid.x); int off = 0; bool outside = false;"]
    for a in reversed(range(len(ys))):
        if a in resized:
            w, ext = resized[a]
            coords.append(f"const int c{a} = r % {ys[a]}; r /= {ys[a]};")
            if ext.any():
                tables.append(
                    f"constant int {P}_E{a}[{len(ext)}] = {{{', '.join(str(int(e)) for e in ext)}}};\n"
                )
                coords.append(f"if ({P}_E{a}[c{a}]) outside = true;")
        else:
            coords.append(f"off += (r % {ys[a]}) * {st[a]}; r /= {ys[a]};")
    for a in sorted(resized):
        w, _ = resized[a]
        taps, idx, wts = resize_taps(w)
        tables.append(f"constant int {P}_I{a}[{len(idx)}] = {{{', '.join(map(str, idx))}}};\n")
        if attrs.get("mode", "nearest") != "nearest":
            tables.append(f"constant float {P}_W{a}[{len(wts)}] = {{{', '.join(flit(v) for v in wts)}}};\n")
            weights.append(f"{P}_W{a}[c{a} * {taps} + t{a}]")
        loops_open.append(f"for (int t{a} = 0; t{a} < {taps}; ++t{a}) {{")
        loops_close.append("}")
        offs.append(f"{P}_I{a}[c{a} * {taps} + t{a}] * {st[a]}")
    count = int(np.prod(ys))
    weight = " * ".join(weights) if weights else "1.0f"
    value = flit(attrs.get("extrapolation_value", 0.0))
    params = [ctx.buffer_param(0, "X"), ctx.buffer_param(1, "Y", out=True)]
    src = (
        "".join(tables)
        + constants(P, dict(COUNT=count))
        + ctx.signature(kernel, params)
        + f""" {{
    if (gid.x >= uint({P}_COUNT)) return;
    {(chr(10) + "    ").join(coords)}
    float acc = 0.0f;
    {" ".join(loops_open)}
        acc += {weight} * float(X[off + {" + ".join(offs) or "0"}]);
    {" ".join(loops_close)}
    Y[gid.x] = {ctx.storage}({"outside ? " + value + " : acc" if any_ext else "acc"});
}}
"""
    )
    return KernelSource(kernel, src, [x], (count, 1, 1))
