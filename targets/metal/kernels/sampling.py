"""Sampling kernels: GridSample (opsets 16, 20 and 22; RoiAlign is not lowered).

Rules:

1. One thread per output element, grid ``(count, 1, 1)``; the input X is (N, C, D1, ..., Dr) with
   1 to 3 spatial axes (3-D to 5-D), the grid (N, O1, ..., Or, r), computed or constant, its last
   axis listing coordinates innermost-first (x, y, z). Larger ranks are refused by name.
2. The reference executor's rules (``targets/reference/ops/sampling.py``), axis by axis in f32:
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

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
from mconv.targets.metal.kernels import Activation, KernelSource, LowerContext, flit, register
from mconv.targets.metal.kernels.conv import constants
from mconv.targets.metal.values import required

_MODES = {
    "bilinear": "linear",
    "linear": "linear",
    "nearest": "nearest",
    "bicubic": "cubic",
    "cubic": "cubic",
}
_PADDINGS = ("zeros", "border", "reflection")
MAX_SPATIAL = 3
OUTSIDE = 8  # rule 4


@dataclass(frozen=True)
class GridAxis:
    """One spatial axis of X: its size, its stride in X's spatial block, the grid component that
    addresses it, and the coordinate range ``[lo, hi]`` that padding keeps to (rule 2)."""

    size: int
    stride: int
    component: int
    align: bool

    @property
    def lo(self) -> float:
        return 0.0 if self.align else -0.5

    @property
    def hi(self) -> float:
        return self.size - 1.0 if self.align else self.size - 0.5

    def coord(self, g: str) -> str:
        """The source coordinate of the f32 grid value ``g`` (the reference's operation order)."""
        d = self.size
        if self.align:
            return f"(({g} + 1.0f) / 2.0f * {flit(d - 1)})"
        return f"((({g} + 1.0f) * {flit(d)} - 1.0f) / 2.0f)"

    def reflect_period(self) -> tuple[int, int] | None:
        """Integer tap reflection (rule 3): (period m, mirror) with ``k = mirror - k`` for
        ``k mod m >= size``; None where every tap is index 0 (one pixel, ``align_corners``)."""
        if self.align:
            return None if self.size == 1 else (2 * (self.size - 1), 2 * (self.size - 1))
        return 2 * self.size, 2 * self.size - 1


@dataclass(frozen=True)
class GridSamplePlan:
    mode: str  # linear, nearest or cubic
    padding: str  # zeros, border or reflection
    batch: int
    channels: int
    axes: tuple[GridAxis, ...]  # X's spatial axes in X's order
    out_spatial: tuple[int, ...]

    @property
    def in_size(self) -> int:
        return int(np.prod([a.size for a in self.axes]))

    @property
    def out_size(self) -> int:
        return int(np.prod(self.out_spatial))

    @property
    def count(self) -> int:
        return self.batch * self.channels * self.out_size

    @property
    def offsets(self) -> tuple[int, ...]:
        """Each axis's tap offsets from ``floor(c)`` (nearest: the rounded coordinate itself)."""
        return {"nearest": (0,), "linear": (0, 1), "cubic": (-1, 0, 1, 2)}[self.mode]

    @property
    def first(self) -> str:
        """The first tap's offset as a term to append (``" - 1"`` for cubic, else nothing)."""
        return f" - {-self.offsets[0]}" if self.offsets[0] else ""

    def weights(self, t: str) -> list[str]:
        """The taps' weights as expressions of the fraction ``t`` (rule 3; MSL and WGSL alike)."""
        if self.mode == "linear":
            return [f"(1.0f - {t})", t]
        a = -0.75  # the distances of the four taps from the sample point: t + 1, t, 1 - t, 2 - t
        far0, near0, near1, far1 = f"({t} + 1.0f)", t, f"(1.0f - {t})", f"(2.0f - {t})"
        return [
            f"((({flit(a)} * {far0} - {flit(5 * a)}) * {far0} + {flit(8 * a)}) * {far0} - {flit(4 * a)})",
            f"(({flit(a + 2)} * {near0} - {flit(a + 3)}) * {near0} * {near0} + 1.0f)",
            f"(({flit(a + 2)} * {near1} - {flit(a + 3)}) * {near1} * {near1} + 1.0f)",
            f"((({flit(a)} * {far1} - {flit(5 * a)}) * {far1} + {flit(8 * a)}) * {far1} - {flit(4 * a)})",
        ]


def grid_sample_plan(ctx: LowerContext, node: ir.Node) -> GridSamplePlan | str:
    """The node's plan, or why it cannot be lowered (Metal and WebGPU)."""
    x, grid = required(node.inputs[0], node), required(node.inputs[1], node)
    mode_attr = node.attributes.get_string("mode", "linear")
    mode = _MODES.get(mode_attr)
    if mode is None:
        return f"mode {mode_attr}"
    padding = node.attributes.get_string("padding_mode", "zeros")
    if padding not in _PADDINGS:
        return f"padding_mode {padding}"
    if grid.shape is None or any(not isinstance(d, int) for d in grid.shape):
        return "grid shape not static"
    xs, gs = ctx.shape(x), ctx.shape(grid)
    rank = len(xs) - 2
    if not 1 <= rank <= MAX_SPATIAL:
        return f"{len(xs)}-D input (kernels for 3-D to {MAX_SPATIAL + 2}-D)"
    if len(gs) != rank + 2 or gs[-1] != rank or gs[0] != xs[0]:
        return f"grid shape {gs} for a {len(xs)}-D input"
    align = node.attributes.get_int("align_corners", 0) == 1
    strides = [int(np.prod(xs[2 + j + 1 :])) for j in range(rank)]
    axes = tuple(GridAxis(xs[2 + j], strides[j], rank - 1 - j, align) for j in range(rank))
    return GridSamplePlan(mode, padding, xs[0], xs[1], axes, tuple(gs[1:-1]))


def check_grid_sample(ctx: LowerContext, node: ir.Node) -> str | None:
    plan = grid_sample_plan(ctx, node)
    return plan if isinstance(plan, str) else None


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
