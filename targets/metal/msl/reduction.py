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
from mconv.targets.gpu.params.reduction import merged_groups, reduce_axes
from mconv.targets.gpu.values import required
from mconv.targets.metal.msl import Activation, KernelSource, LowerContext, activation_expr, register
from mconv.targets.metal.msl.conv import constants

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


def _check(ctx: LowerContext, node: ir.Node) -> str | None:
    xs = required(node.inputs[0], node).shape
    if xs is None:
        return None  # the planner names missing shapes itself
    if reduce_axes(ctx, node, len(xs)) is None:
        return "axes not constant"
    return None


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
