"""Sampling kernels: GridSample (opsets 16, 20 and 22; RoiAlign is not lowered).

Rules:

1. One thread per output element, grid ``(count, 1, 1)``; the input X is (N, C, D1, ..., Dr) with
   1 to 3 spatial axes (3-D to 5-D), the grid (N, O1, ..., Or, r), computed or constant, its last
   axis listing coordinates innermost-first (x, y, z). Larger ranks are refused by name.
2. The reference executor's rules (``engines/reference/ops/sampling.py``), axis by axis in f32:
   the normalized coordinate g maps to ``(g + 1) / 2 * (D - 1)`` (``align_corners=1``) or
   ``((g + 1) * D - 1) / 2``; nearest rounds it half to even (``rint``); border clamps a
   coordinate outside ``[lo, hi]`` (the corner pixels' centres, or their outer edges) to
   ``[0, D - 1]``; reflection folds it into ``[lo, hi]`` as often as it takes.
3. Taps: nearest one, linear two (``1 - t``, ``t``), cubic four (a = -0.75, offsets -1..2) per
   axis, summed over their product in the reference's order. A tap index outside ``[0, D)``
   reads nothing under zeros padding, is clamped under border and reflected (period ``2 D``, or
   ``2 (D - 1)`` with ``align_corners``) under reflection.
4. Under zeros padding a coordinate is clamped to ``[-8, D + 8]`` before it becomes an integer:
   beyond that every tap is outside anyway, and the conversion stays in range.

:func:`grid_sample_plan` and the expressions of rules 2-3 are shared with the WebGPU target
(``targets/webgpu/wgsl.py``); each target writes the statements in its own language.
"""

from __future__ import annotations

import onnx_ir as ir
from mconv.targets.gpu.params.sampling import (
    OUTSIDE,
    GridAxis,
    GridSamplePlan,
    check_grid_sample,
    grid_sample_plan,
)
from mconv.targets.gpu.values import required
from mconv.targets.metal.msl import Activation, KernelSource, LowerContext, flit, register
from mconv.targets.metal.msl.conv import constants


def _axis_msl(plan: GridSamplePlan, j: int, ax: GridAxis) -> list[str]:
    """MSL statements for spatial axis ``j``: its coordinate ``c{j}`` (rule 2), then its taps'
    X offsets ``o{j}[]`` (-1: reads nothing) and weights ``w{j}[]`` (rule 3)."""
    lo, hi, d = flit(ax.lo), flit(ax.hi), ax.size
    lines = [f"float c{j} = {ax.coord(f'float(G[g + {ax.component}])')};"]
    if plan.mode == "nearest":
        lines.append(f"c{j} = rint(c{j});")
    if plan.padding == "border":
        lines.append(f"if (c{j} < {lo} || c{j} > {hi}) c{j} = min(max(c{j}, 0.0f), {flit(d - 1)});")
    elif plan.padding == "reflection" and ax.hi > ax.lo:
        span = flit(ax.hi - ax.lo)
        lines += [
            f"if (c{j} < {lo} || c{j} > {hi}) {{",
            f"    const float dx{j} = c{j} < {lo} ? {lo} - c{j} : c{j} - {hi};",
            f"    const float n{j} = floor(dx{j} / {span}), r{j} = dx{j} - n{j} * {span};",
            f"    c{j} = (c{j} < {lo}) == (fmod(n{j}, 2.0f) == 0.0f) ? {lo} + r{j} : {hi} - r{j};",
            "}",
        ]
    elif plan.padding == "zeros":  # rule 4
        lines.append(f"c{j} = min(max(c{j}, {flit(-OUTSIDE)}), {flit(d + OUTSIDE)});")
    taps = len(plan.offsets)
    if plan.mode == "nearest":
        lines.append(f"const int b{j} = int(c{j});")
    else:
        lines.append(f"const float f{j} = floor(c{j}), u{j} = c{j} - f{j};")
        lines.append(f"const int b{j} = int(f{j}){plan.first};")
        lines.append(f"const float w{j}[{taps}] = {{{', '.join(plan.weights(f'u{j}'))}}};")
    lines.append(f"int o{j}[{taps}];")
    if plan.padding == "zeros":
        fix = f"o{j}[i] = k >= 0 && k < {d} ? k * {ax.stride} : -1;"
    elif plan.padding == "border":
        fix = f"o{j}[i] = min(max(k, 0), {d - 1}) * {ax.stride};"
    elif (period := ax.reflect_period()) is None:
        fix = f"o{j}[i] = 0; (void)k;"
    else:
        m, mirror = period
        fix = f"k = ((k % {m}) + {m}) % {m}; o{j}[i] = (k >= {d} ? {mirror} - k : k) * {ax.stride};"
    lines.append(f"for (int i = 0; i < {taps}; ++i) {{ int k = b{j} + i; {fix} }}")
    return lines


@register("GridSample", check=check_grid_sample)
def lower_grid_sample(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x, grid = required(node.inputs[0]), required(node.inputs[1])
    plan = grid_sample_plan(ctx, node)
    assert not isinstance(plan, str)  # check_grid_sample admitted it
    P, rank, taps = kernel, len(plan.axes), len(plan.offsets)
    lines = [line for j, ax in enumerate(plan.axes) for line in _axis_msl(plan, j, ax)]
    loops = " ".join(f"for (int t{j} = 0; t{j} < {taps}; ++t{j}) {{" for j in range(rank))
    offset = " + ".join(f"o{j}[t{j}]" for j in range(rank))
    weight = " * ".join(f"w{j}[t{j}]" for j in range(rank)) if plan.mode != "nearest" else "1.0f"
    add = f"acc += {weight} * float(X[xb + {offset}]);"
    if plan.padding == "zeros":
        add = f"if ({' && '.join(f'o{j}[t{j}] >= 0' for j in range(rank))}) {add}"
    params = [ctx.buffer_param(0, "X"), ctx.buffer_param(1, "G"), ctx.buffer_param(2, "Y", out=True)]
    src = (
        constants(P, dict(COUNT=plan.count, OUT=plan.out_size, C=plan.channels, IN=plan.in_size))
        + ctx.signature(kernel, params)
        + f""" {{
    if (gid.x >= uint({P}_COUNT)) return;
    const int i_out = int(gid.x) % {P}_OUT, nc = int(gid.x) / {P}_OUT;
    const int g = ((nc / {P}_C) * {P}_OUT + i_out) * {rank}, xb = nc * {P}_IN;
    {(chr(10) + "    ").join(lines)}
    float acc = 0.0f;
    {loops}
        {add}
    {"}" * rank}
    Y[gid.x] = {ctx.storage}(acc);
}}
"""
    )
    return KernelSource(kernel, src, [x, grid], (plan.count, 1, 1))
