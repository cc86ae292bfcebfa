"""Reduction kernels: ReduceMean (global average pooling as Keras and TFLite write it: axes [1, 2]
of NHWC, or [2, 3] of NCHW), ReduceSum, ReduceMax, ReduceMin, ReduceProd, ReduceL1, ReduceL2,
ReduceSumSquare, ReduceLogSum, ReduceLogSumExp.

Rules:

1. Axes come from the ``axes`` attribute or the constant second input (opset 18, ReduceSum 13);
   none (or an empty list) reduces every axis, unless ``noop_with_empty_axes`` is 1 (a copy).
   ``keepdims`` only changes the output's shape, which is read from the inferred one.
2. Adjacent axes that are both reduced (or both kept) are merged, so ``[1, 2]`` of NHWC is one
   loop of H*W steps with stride C. One thread per output element, grid ``(count, 1, 1)``;
   the kept coordinates give the base offset, the loop walks the reduced ones. Sums are float;
   ReduceLogSumExp subtracts the maximum first.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from mconv.targets.metal.kernels import Activation, KernelSource, LowerContext, activation_expr, register
from mconv.targets.metal.kernels.conv import constants
from mconv.targets.metal.values import required

OPS = (
    "ReduceMean",
    "ReduceSum",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceSumSquare",
    "ReduceLogSum",
    "ReduceLogSumExp",
)
# op -> (initial value, step on float t, final expression of acc and the count R)
_FORMS = {
    "ReduceMean": ("0.0f", "acc += t;", "acc / float({R})"),
    "ReduceSum": ("0.0f", "acc += t;", "acc"),
    "ReduceMax": ("-INFINITY", "acc = max(acc, t);", "acc"),
    "ReduceMin": ("INFINITY", "acc = min(acc, t);", "acc"),
    "ReduceProd": ("1.0f", "acc *= t;", "acc"),
    "ReduceL1": ("0.0f", "acc += fabs(t);", "acc"),
    "ReduceL2": ("0.0f", "acc += t * t;", "sqrt(acc)"),
    "ReduceSumSquare": ("0.0f", "acc += t * t;", "acc"),
    "ReduceLogSum": ("0.0f", "acc += t;", "log(acc)"),
    "ReduceLogSumExp": ("0.0f", "acc += exp(t - mx);", "mx + log(acc)"),
}


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


def _check(ctx: LowerContext, node: ir.Node) -> str | None:
    xs = required(node.inputs[0], node).shape
    if xs is None:
        return None  # the planner names missing shapes itself
    if reduce_axes(ctx, node, len(xs)) is None:
        return "axes not constant"
    return None


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


@register(*OPS, fusible=True, check=_check)
def lower_reduce(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x = required(node.inputs[0])
    xs = ctx.shape(x)
    axes = reduce_axes(ctx, node, len(xs))
    assert axes is not None  # checked by _check
    groups = merged_groups(xs, set(axes))
    kept = [(size, stride) for size, stride, red in groups if not red]
    red = [(size, stride) for size, stride, red in groups if red]
    count = int(np.prod([s for s, _ in kept])) if kept else 1
    total = int(np.prod([s for s, _ in red])) if red else 1
    P = kernel
    base = ["int r = int(gid.x);", "int base = 0;"]
    for size, stride in reversed(kept):
        base.append(f"base += (r % {size}) * {stride}; r /= {size};")
    # the reduced loop: one nested loop per reduced group (innermost last)
    opens, closes, offset = [], [], ["base"]
    for i, (size, stride) in enumerate(red):
        opens.append(f"for (int j{i} = 0; j{i} < {size}; ++j{i}) {{")
        closes.append("}")
        offset.append(f"j{i} * {stride}")
    idx = " + ".join(offset)
    init, step, final = _FORMS[node.op_type]
    final = final.format(R=total)
    pre = ""
    if node.op_type == "ReduceLogSumExp":
        pre = (
            "float mx = -INFINITY;\n    "
            + " ".join(opens)
            + f" mx = max(mx, float(X[{idx}])); "
            + " ".join(closes)
            + "\n    if (isinf(mx)) mx = 0.0f;\n    "
        )
    params = [ctx.buffer_param(0, "X"), ctx.buffer_param(1, "Y", out=True)]
    src = (
        constants(P, dict(COUNT=count))
        + ctx.signature(kernel, params)
        + f""" {{
    if (gid.x >= uint({P}_COUNT)) return;
    {chr(10).join("    " + ln for ln in base).strip()}
    {pre}float acc = {init};
    {" ".join(opens)}
        const float t = float(X[{idx}]);
        {step}
    {" ".join(closes)}
    const float v = {final};
    Y[gid.x] = {ctx.storage}({activation_expr(act)});
}}
"""
    )
    return KernelSource(kernel, src, [x], (count, 1, 1))
