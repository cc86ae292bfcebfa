"""Elementwise kernels: broadcast Add/Sub/Mul/Div/Max/Min/Mean/Pow (with a fused activation) and
the unary math functions (Neg, Exp, Log, Sqrt, Abs, Clip, ...); the activation family
(:mod:`.activation`) reuses both kernels.

Rules:

1. One thread per output element (Sum of two inputs is Add), grid ``(count, 1, 1)``.
2. Broadcasting follows numpy: the output index is split into coordinates (dimensions baked)
   and each operand reads at ``sum(coord * stride)`` with stride 0 along broadcast dimensions.
3. A standalone unary node is the unary kernel with its expression (:func:`activation_of`); an
   activation after Add/Sub/Mul/Div is fused (a ResNet block's Add + Relu is one kernel).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from mconv.targets.metal.kernels import (
    ACTIVATIONS,
    UNARY_ACTIVATIONS,
    Activation,
    KernelSource,
    LowerContext,
    activation_expr,
    register,
)
from mconv.targets.metal.kernels.conv import constants

_BINARY = {
    "Add": "a + b",
    "Sum": "a + b",
    "Sub": "a - b",
    "Mul": "a * b",
    "Div": "a / b",
    "Max": "max(a, b)",
    "Min": "min(a, b)",
    "Mean": "(a + b) * 0.5f",
    "Pow": "mconv_pow(a, b)",
    "PRelu": "(a >= 0.0f ? a : a * b)",
}


def _pow_expr(node: ir.Node, ctx: LowerContext) -> str | None:
    """A cheaper expression for Pow with a constant scalar exponent (x^2, x^0.5, ...)."""
    e = LowerContext.const(node.inputs[1])
    if e is None or e.size != 1:
        return None
    e = float(e.reshape(()))
    return {1.0: "a", 2.0: "a * a", 3.0: "a * a * a", 0.5: "sqrt(a)", -1.0: "1.0f / a", 0.0: "1.0f"}.get(e)


def check_binary(ctx: LowerContext, node: ir.Node) -> str | None:
    if len(node.inputs) != 2 or any(v is None for v in node.inputs):
        return f"{len(node.inputs)} inputs (the metal target lowers 2)"
    return None


def broadcast_strides(in_shape: list[int], out_shape: list[int]) -> list[int]:
    """Element strides of ``in_shape`` over ``out_shape``'s coordinates (0 where broadcast)."""
    padded = [1] * (len(out_shape) - len(in_shape)) + list(in_shape)
    strides, step = [], 1
    for d in reversed(padded):
        strides.append(step if d != 1 else 0)
        step *= d
    return list(reversed(strides))


def _offsets(out_shape: list[int], operands: list[tuple[str, list[int]]]) -> str:
    """MSL statements that set ``i_<name>`` for each operand from the flat output index ``r``."""
    lines = [f"int i_{name} = 0;" for name, _ in operands]
    for axis in reversed(range(len(out_shape))):
        dim = out_shape[axis]
        if all(strides[axis] == 0 for _, strides in operands) or dim == 1:
            lines.append(f"r /= {dim};")
            continue
        adds = " ".join(
            f"i_{name} += c * {strides[axis]};" for name, strides in operands if strides[axis] != 0
        )
        lines.append(f"{{ const int c = r % {dim}; r /= {dim}; {adds} }}")
    return "\n    ".join(lines)


@register("Add", "Sum", "Sub", "Mul", "Div", "Max", "Min", "Mean", "Pow", fusible=True, check=check_binary)
def lower_binary(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    a, b, y = node.inputs[0], node.inputs[1], node.outputs[0]
    ys = ctx.shape(y)
    count = int(np.prod(ys)) if ys else 1
    sa = broadcast_strides(ctx.shape(a), ys)
    sb = broadcast_strides(ctx.shape(b), ys)
    expr = (_pow_expr(node, ctx) if node.op_type == "Pow" else None) or _BINARY[node.op_type]
    P = kernel
    params = [ctx.buffer_param(0, "A"), ctx.buffer_param(1, "B"), ctx.buffer_param(2, "Y", out=True)]
    src = (
        constants(P, dict(COUNT=count))
        + ctx.signature(kernel, params)
        + f""" {{
    if (gid.x >= uint({P}_COUNT)) return;
    int r = int(gid.x);
    {_offsets(ys, [("a", sa), ("b", sb)])}
    const float a = float(A[i_a]), b = float(B[i_b]);
    const float v = {expr};
    Y[gid.x] = {ctx.storage}({activation_expr(act)});
}}
"""
    )
    return KernelSource(kernel, src, [a, b], (count, 1, 1))


_SIMPLE = {
    "HardSwish": "hardswish",
    "Softplus": "softplus",
    "Softsign": "softsign",
    "Mish": "mish",
    "Neg": "neg",
    "Exp": "exp",
    "Log": "log",
    "Sqrt": "sqrt",
    "Abs": "abs",
    "Reciprocal": "reciprocal",
    "Erf": "erf",
    "Floor": "floor",
    "Ceil": "ceil",
    "Round": "round",
    "Sin": "sin",
    "Cos": "cos",
}


def activation_of(ctx: LowerContext, node: ir.Node) -> Activation | None:
    """The Activation an activation node computes, or None when it cannot be expressed."""
    op = node.op_type
    if op == "Relu":
        return Activation("relu", (), (node.name,))
    if op == "LeakyRelu":
        return Activation("leaky", (node.attributes.get_float("alpha", 0.01),), (node.name,))
    if op == "Sigmoid":
        return Activation("sigmoid", (), (node.name,))
    if op == "Tanh":
        return Activation("tanh", (), (node.name,))
    if op == "Gelu":
        kind = "gelu_tanh" if node.attributes.get_string("approximate", "none") == "tanh" else "gelu"
        return Activation(kind, (), (node.name,))
    if op == "HardSigmoid":
        a = node.attributes.get_float("alpha", 0.2)
        b = node.attributes.get_float("beta", 0.5)
        return Activation("hardsigmoid", (a, b), (node.name,))
    if op == "Elu":
        return Activation("elu", (node.attributes.get_float("alpha", 1.0),), (node.name,))
    if op == "Celu":
        return Activation("celu", (node.attributes.get_float("alpha", 1.0),), (node.name,))
    if op == "Selu":
        a = node.attributes.get_float("alpha", 1.67326319217681884765625)
        g = node.attributes.get_float("gamma", 1.05070102214813232421875)
        return Activation("selu", (a, g), (node.name,))
    if op in _SIMPLE:
        return Activation(_SIMPLE[op], (), (node.name,))
    if op in ("Min", "Max") and len(node.inputs) == 2:  # Min(x, 6) after a Relu: Keras' relu6
        c = LowerContext.const(node.inputs[1])
        if c is None or c.size != 1 or LowerContext.const(node.inputs[0]) is not None:
            return None
        bound = float(c.reshape(()))
        return Activation("clip", (-np.inf, bound) if op == "Min" else (bound, np.inf), (node.name,))
    if op == "Clip":
        if ctx.opset < 11 or len(node.inputs) == 1:
            lo = node.attributes.get_float("min", -np.inf) if ctx.opset < 11 else -np.inf
            hi = node.attributes.get_float("max", np.inf) if ctx.opset < 11 else np.inf
            return Activation("clip", (lo, hi), (node.name,))
        bounds = []
        for k, default in ((1, -np.inf), (2, np.inf)):
            v = node.inputs[k] if len(node.inputs) > k else None
            if v is None:
                bounds.append(default)
                continue
            arr = LowerContext.const(v)
            if arr is None or arr.size != 1:
                return None
            bounds.append(float(arr.reshape(())))
        return Activation("clip", tuple(bounds), (node.name,))
    return None


def check_unary(ctx: LowerContext, node: ir.Node) -> str | None:
    return None if activation_of(ctx, node) is not None else "bounds that are not constant scalars"


@register(*(op for op in ACTIVATIONS if op not in UNARY_ACTIVATIONS), check=check_unary)
def lower_unary(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x = node.inputs[0]
    count = int(np.prod(ctx.shape(x)))
    own = activation_of(ctx, node)
    assert own is not None  # the planner checks this before lowering
    P = kernel
    params = [ctx.buffer_param(0, "X"), ctx.buffer_param(1, "Y", out=True)]
    src = (
        constants(P, dict(COUNT=count))
        + ctx.signature(kernel, params)
        + f""" {{
    if (gid.x >= uint({P}_COUNT)) return;
    const float v = float(X[gid.x]);
    Y[gid.x] = {ctx.storage}({activation_expr(own)});
}}
"""
    )
    return KernelSource(kernel, src, [x], (count, 1, 1))
