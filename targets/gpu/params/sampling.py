"""GridSample parameters: modes, padding, and the per-axis plan both dialects emit."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
from mconv.targets.gpu.ops import LowerContext, flit
from mconv.targets.gpu.values import required

MODES = {
    "bilinear": "linear",
    "linear": "linear",
    "nearest": "nearest",
    "bicubic": "cubic",
    "cubic": "cubic",
}


PADDINGS = ("zeros", "border", "reflection")


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
    mode = MODES.get(mode_attr)
    if mode is None:
        return f"mode {mode_attr}"
    padding = node.attributes.get_string("padding_mode", "zeros")
    if padding not in PADDINGS:
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
