"""Elementwise kernels: broadcast Add/Sub/Mul/Div/Max/Min/Mean/Pow (with a fused activation) and
the unary math functions (Neg, Exp, Log, Sqrt, Abs, Clip, ...); the activation family
(:mod:`.activation`) reuses both kernels.

Rules:

1. One thread per output element (Sum of two inputs is Add), grid ``(count, 1, 1)``.
2. Broadcasting follows numpy: the output index is split into coordinates (dimensions baked)
   and each operand reads at ``sum(coord * stride)`` with stride 0 along broadcast dimensions.
3. A standalone unary node is the unary kernel with its expression (:func:`activation_of`); an
   activation after Add/Sub/Mul/Div is fused (a ResNet block's Add + Relu is one kernel).
4. A constant scalar operand of a binary op is a float literal in the kernel, not a buffer; and
   ``x * c``, ``x + c``, ``x - c``, ``x / c`` with ``c`` a constant scalar are activations too
   (kinds mul/add/div), fused into a fusible producer: a mean (a sum times 1/n) is computed in
   float before it is stored, so a sum beyond half's range stays finite.
5. Integer and bool tensors are floats (bool: 0 and 1, nonzero is true): comparisons, And, Or,
   Xor and Not give 0/1; Where picks by ``c != 0`` (three broadcast operands); Cast is
   :func:`cast_expr`. Add/Sub/Mul/Min/Max and these are exact on integers within the storage's
   exact range; Div, Mean and Pow are refused on integers by the planner.
6. IsNaN and IsInf give 0/1 from the float's bits (fast math may fold float compares on NaN).
   A Clip whose min or max is computed at run time (or not one value) is one kernel over the
   broadcast operands ``min(max(x, lo), hi)`` (x where x is NaN, as numpy clips); a Clip with constant scalar bounds is an
   activation (rule 3).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from mconv.targets.gpu.expr import BINARY, is_inf_expr, wrap_expr
from mconv.targets.gpu.ops import activation_of, check_unary, tensor_clip
from mconv.targets.gpu.params.elementwise import broadcast_strides, cast_rule, cast_target
from mconv.targets.gpu.values import required
from mconv.targets.metal.msl import (
    ACTIVATIONS,
    UNARY_ACTIVATIONS,
    Activation,
    KernelSource,
    LowerContext,
    activation_expr,
    flit,
    register,
)
from mconv.targets.metal.msl.conv import constants


def _pow_expr(node: ir.Node, ctx: LowerContext) -> str | None:
    """A cheaper expression for Pow with a constant scalar exponent (x^2, x^0.5, ...)."""
    e = LowerContext.const(node.inputs[1])
    if e is None or e.size != 1:
        return None
    exponent = float(e.reshape(()))
    return {1.0: "a", 2.0: "a * a", 3.0: "a * a * a", 0.5: "sqrt(a)", -1.0: "1.0f / a", 0.0: "1.0f"}.get(
        exponent
    )


def check_binary(ctx: LowerContext, node: ir.Node) -> str | None:
    if len(node.inputs) != 2 or any(v is None for v in node.inputs):
        return f"{len(node.inputs)} inputs (the metal target lowers 2)"
    return None


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


# exact on integer-valued operands held as floats (below 2^24 in float storage, 2^11 in half)
_INTEGER_BINARY = ("Add", "Sum", "Sub", "Mul", "Max", "Min")
# 0/1 results: comparisons and logic (bool tensors are floats 0 and 1; nonzero is true)
_PREDICATES = {
    "Equal": "(a == b ? 1.0f : 0.0f)",
    "Less": "(a < b ? 1.0f : 0.0f)",
    "Greater": "(a > b ? 1.0f : 0.0f)",
    "LessOrEqual": "(a <= b ? 1.0f : 0.0f)",
    "GreaterOrEqual": "(a >= b ? 1.0f : 0.0f)",
    "And": "((a != 0.0f && b != 0.0f) ? 1.0f : 0.0f)",
    "Or": "((a != 0.0f || b != 0.0f) ? 1.0f : 0.0f)",
    "Xor": "(((a != 0.0f) != (b != 0.0f)) ? 1.0f : 0.0f)",
}
BINARY.update(_PREDICATES)


@register(*_PREDICATES, check=check_binary, integers=True)
@register(*_INTEGER_BINARY, fusible=True, check=check_binary, integers=True)
@register("Div", "Mean", "Pow", fusible=True, check=check_binary)
def lower_binary(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    a, b, y = node.inputs[0], node.inputs[1], node.outputs[0]
    ys = ctx.shape(y)
    count = int(np.prod(ys)) if ys else 1
    expr = (_pow_expr(node, ctx) if node.op_type == "Pow" else None) or BINARY[node.op_type]
    P = kernel
    # a constant scalar operand is a float literal (rule 4): it keeps float32 precision in half
    # storage (log(x * x + 1e-10) stays finite) and needs no buffer
    reads: list[ir.Value] = []
    strided: list[tuple[str, list[int]]] = []
    loads = []
    for name, v in (("a", a), ("b", b)):
        assert v is not None  # check_binary
        c = LowerContext.const(v)
        if c is not None and c.size == 1:
            loads.append(f"{name} = {flit(float(c.reshape(())))}")
            continue
        loads.append(f"{name} = float({name.upper()}[i_{name}])")
        strided.append((name, broadcast_strides(ctx.shape(v), ys)))
        reads.append(v)
    params = [ctx.buffer_param(i, n.upper()) for i, (n, _) in enumerate(strided)]
    params.append(ctx.buffer_param(len(reads), "Y", out=True))
    src = (
        constants(P, dict(COUNT=count))
        + ctx.signature(kernel, params)
        + f""" {{
    if (gid.x >= uint({P}_COUNT)) return;
    int r = int(gid.x);
    {_offsets(ys, strided)}
    const float {", ".join(loads)};
    const float v = {expr};
    Y[gid.x] = {ctx.storage}({activation_expr(act)});
}}
"""
    )
    return KernelSource(kernel, src, reads, (count, 1, 1))


@register(*(op for op in ACTIVATIONS if op not in UNARY_ACTIVATIONS), check=check_unary)
def lower_unary(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x = required(node.inputs[0])
    count = int(np.prod(ctx.shape(x)))
    own = activation_of(ctx, node)
    clip = tensor_clip(ctx, node) if own is None else None
    if clip is not None:  # Clip with computed bounds: broadcast operands; NaN stays NaN
        expr = f"({_NAN_TEST} ? a : {clip[1]})"
        return lower_where_or_unary(ctx, kernel, clip[0], node.outputs[0], expr)
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


def _present(values: Sequence[ir.Value | None]) -> list[ir.Value]:
    """A node's inputs, checked present (the planner's checks ran before lowering)."""
    out = [v for v in values if v is not None]
    assert len(out) == len(values)
    return out


def lower_where_or_unary(
    ctx: LowerContext, kernel: str, operands: list[ir.Value], out: ir.Value, expr: str
) -> KernelSource:
    """Y = expr over broadcast operands named ``a``, ``b``, ``c`` (floats) in one kernel."""
    ys = ctx.shape(out)
    count = int(np.prod(ys)) if ys else 1
    names = "abc"[: len(operands)]
    strided = [(n, broadcast_strides(ctx.shape(v), ys)) for n, v in zip(names, operands)]
    P = kernel
    params = [ctx.buffer_param(i, n.upper()) for i, n in enumerate(names)]
    params.append(ctx.buffer_param(len(operands), "Y", out=True))
    reads = ", ".join(f"{n} = float({n.upper()}[i_{n}])" for n in names)
    src = (
        constants(P, dict(COUNT=count))
        + ctx.signature(kernel, params)
        + f""" {{
    if (gid.x >= uint({P}_COUNT)) return;
    int r = int(gid.x);
    {_offsets(ys, strided)}
    const float {reads};
    Y[gid.x] = {ctx.storage}({expr});
}}
"""
    )
    return KernelSource(kernel, src, list(operands), (count, 1, 1))


def _check_where(ctx: LowerContext, node: ir.Node) -> str | None:
    if len(node.inputs) != 3 or any(v is None for v in node.inputs):
        return "Where takes 3 inputs"
    return None


@register("Where", check=_check_where, integers=True)
def lower_where(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    return lower_where_or_unary(ctx, kernel, _present(node.inputs), node.outputs[0], "(a != 0.0f ? b : c)")


# IsNaN / IsInf test the float's bits (exponent all ones; mantissa nonzero for NaN, zero for
# infinities), not compares that Metal's fast math may fold away; a half value widens exactly.
_NAN_TEST = "((as_type<uint>(a) & 0x7fffffffu) > 0x7f800000u)"
_INF_TEST = "((as_type<uint>(a) & 0x7fffffffu) == 0x7f800000u)"


@register("IsNaN", "IsInf", integers=True)
def lower_is_nan_inf(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    test = _NAN_TEST if node.op_type == "IsNaN" else is_inf_expr(node, _INF_TEST)
    expr = test if test == "0.0f" else f"({test} ? 1.0f : 0.0f)"
    return lower_where_or_unary(ctx, kernel, _present(node.inputs[:1]), node.outputs[0], expr)


@register("Not", integers=True)
def lower_not(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x = _present(node.inputs[:1])
    return lower_where_or_unary(ctx, kernel, x, node.outputs[0], "(a != 0.0f ? 0.0f : 1.0f)")


def cast_expr(src: ir.DataType | None, dst: ir.DataType | None) -> str | None:
    """The MSL expression of Cast from ``src`` to ``dst`` applied to ``a`` (:func:`cast_rule`),
    or None (refused)."""
    rule = cast_rule(src, dst)
    if rule is None:
        return None
    kind = rule[0]
    if kind == "bool":
        return "(a != 0.0f ? 1.0f : 0.0f)"
    if kind == "half":
        return "float(half(a))"
    if kind == "keep":
        return "a"
    if kind == "truncate":
        return f"min(max((a < 0.0f ? ceil(a) : floor(a)), {flit(rule[1])}), {flit(rule[2])})"
    return wrap_expr(rule[1], rule[2])


def _check_cast(ctx: LowerContext, node: ir.Node) -> str | None:
    src, dst = _present(node.inputs[:1])[0].dtype, cast_target(node)
    if cast_expr(src, dst) is None:
        name = lambda t: t.name.lower() if t is not None else "unknown"  # noqa: E731
        return f"cast from {name(src)} to {name(dst)}"
    return None


@register("Cast", "CastLike", check=_check_cast, integers=True)
def lower_cast(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x = _present(node.inputs[:1])
    expr = cast_expr(x[0].dtype, cast_target(node))
    assert expr is not None  # the planner checks this before lowering
    return lower_where_or_unary(ctx, kernel, x, node.outputs[0], expr)
