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
from mconv.targets.metal.kernels import (
    ACTIVATIONS,
    UNARY_ACTIVATIONS,
    Activation,
    KernelSource,
    LowerContext,
    activation_expr,
    flit,
    register,
)
from mconv.targets.metal.kernels.conv import constants
from mconv.targets.metal.values import required

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
    exponent = float(e.reshape(()))
    return {1.0: "a", 2.0: "a * a", 3.0: "a * a * a", 0.5: "sqrt(a)", -1.0: "1.0f / a", 0.0: "1.0f"}.get(
        exponent
    )


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
_BINARY.update(_PREDICATES)


@register(*_PREDICATES, check=check_binary, integers=True)
@register(*_INTEGER_BINARY, fusible=True, check=check_binary, integers=True)
@register("Div", "Mean", "Pow", fusible=True, check=check_binary)
def lower_binary(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    a, b, y = node.inputs[0], node.inputs[1], node.outputs[0]
    ys = ctx.shape(y)
    count = int(np.prod(ys)) if ys else 1
    expr = (_pow_expr(node, ctx) if node.op_type == "Pow" else None) or _BINARY[node.op_type]
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
    names = (node.name or "",)  # a graph names its nodes
    if op == "Relu":
        return Activation("relu", (), names)
    if op == "LeakyRelu":
        return Activation("leaky", (node.attributes.get_float("alpha", 0.01),), names)
    if op == "Sigmoid":
        return Activation("sigmoid", (), names)
    if op == "Tanh":
        return Activation("tanh", (), names)
    if op == "Gelu":
        kind = "gelu_tanh" if node.attributes.get_string("approximate", "none") == "tanh" else "gelu"
        return Activation(kind, (), names)
    if op == "HardSigmoid":
        a = node.attributes.get_float("alpha", 0.2)
        b = node.attributes.get_float("beta", 0.5)
        return Activation("hardsigmoid", (a, b), names)
    if op == "Elu":
        return Activation("elu", (node.attributes.get_float("alpha", 1.0),), names)
    if op == "Celu":
        return Activation("celu", (node.attributes.get_float("alpha", 1.0),), names)
    if op == "Selu":
        a = node.attributes.get_float("alpha", 1.67326319217681884765625)
        g = node.attributes.get_float("gamma", 1.05070102214813232421875)
        return Activation("selu", (a, g), names)
    if op in _SIMPLE:
        return Activation(_SIMPLE[op], (), names)
    if op in ("QuantizeLinear", "DequantizeLinear"):  # per tensor: fused after the producer
        from mconv.targets.metal.kernels.quantization import CODE_RANGES, _code_type, _params

        got = _params(ctx, node)
        if isinstance(got, str) or got[0].size != 1:
            return None
        scale, zp = float(got[0][0]), float(got[1][0])
        if op == "DequantizeLinear":
            return Activation("dequantize", (scale, zp), (node.name or "",))
        code = _code_type(node)
        assert code is not None
        lo, hi = CODE_RANGES[code]
        return Activation("quantize", (scale, zp, float(lo), float(hi)), (node.name or "",))
    if op in ("Mul", "Add", "Sub", "Div") and len(node.inputs) == 2:  # x op c, c a constant scalar
        c = LowerContext.const(node.inputs[1])
        x = node.inputs[0]
        if (
            c is None
            or c.size != 1
            or x is None
            or x.const_value is not None
            or x.dtype not in (*_FLOAT_TYPES, ir.DataType.FLOAT16)
        ):
            return None
        value = float(c.reshape(()))
        kind = {"Mul": "mul", "Add": "add", "Sub": "add", "Div": "div"}[op]
        return Activation(kind, (-value if op == "Sub" else value,), (node.name or "",))
    if op in ("Min", "Max") and len(node.inputs) == 2:  # Min(x, 6) after a Relu: Keras' relu6
        c = LowerContext.const(node.inputs[1])
        if c is None or c.size != 1 or LowerContext.const(node.inputs[0]) is not None:
            return None
        bound = float(c.reshape(()))
        return Activation("clip", (-np.inf, bound) if op == "Min" else (bound, np.inf), names)
    if op == "Clip":
        if ctx.opset < 11 or len(node.inputs) == 1:
            clip_lo = node.attributes.get_float("min", -np.inf) if ctx.opset < 11 else -np.inf
            clip_hi = node.attributes.get_float("max", np.inf) if ctx.opset < 11 else np.inf
            return Activation("clip", (clip_lo, clip_hi), names)
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
        return Activation("clip", tuple(bounds), names)
    return None


def tensor_clip(ctx: LowerContext, node: ir.Node) -> tuple[list[ir.Value], str] | None:
    """A Clip (opset 11+) whose min or max is computed or not one value: (operands, expression
    of ``a`` = x, then ``b``, ``c`` = the bounds present), one broadcast kernel; else None."""
    if node.op_type != "Clip" or ctx.opset < 11 or len(node.inputs) < 2 or activation_of(ctx, node):
        return None
    x = node.inputs[0]
    if x is None:
        return None
    operands, expr = [x], "a"
    for k, fn in ((1, "max"), (2, "min")):
        v = node.inputs[k] if len(node.inputs) > k else None
        if v is None:
            continue
        if v.shape is None or any(not isinstance(d, int) for d in v.shape):
            return None
        name = "abc"[len(operands)]
        operands.append(v)
        expr = f"{fn}({expr}, {name})"
    return operands, expr


def check_unary(ctx: LowerContext, node: ir.Node) -> str | None:
    if activation_of(ctx, node) is not None or tensor_clip(ctx, node) is not None:
        return None
    return "bounds that are not constant scalars"


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


def is_inf_expr(node: ir.Node, inf_test: str) -> str:
    """IsInf's 0/1 expression of ``a`` for the node's detect_negative / detect_positive."""
    neg = node.attributes.get_int("detect_negative", 1)
    pos = node.attributes.get_int("detect_positive", 1)
    if neg and pos:
        test = inf_test
    elif neg or pos:
        test = f"({inf_test} && a {'<' if neg else '>'} 0.0f)"
    else:
        return "0.0f"
    return test


@register("IsNaN", "IsInf", integers=True)
def lower_is_nan_inf(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    test = _NAN_TEST if node.op_type == "IsNaN" else is_inf_expr(node, _INF_TEST)
    expr = test if test == "0.0f" else f"({test} ? 1.0f : 0.0f)"
    return lower_where_or_unary(ctx, kernel, _present(node.inputs[:1]), node.outputs[0], expr)


@register("Not", integers=True)
def lower_not(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x = _present(node.inputs[:1])
    return lower_where_or_unary(ctx, kernel, x, node.outputs[0], "(a != 0.0f ? 0.0f : 1.0f)")


_FLOAT_TYPES = (ir.DataType.FLOAT, ir.DataType.DOUBLE)
# integer types: (bits, signed); int64's range is wider than any float holds exactly anyway
_INT_TYPES = {
    ir.DataType.INT8: (8, True),
    ir.DataType.UINT8: (8, False),
    ir.DataType.INT16: (16, True),
    ir.DataType.UINT16: (16, False),
    ir.DataType.INT32: (32, True),
    ir.DataType.UINT32: (32, False),
    ir.DataType.INT64: (64, True),
    ir.DataType.UINT64: (64, False),
}


def _cast_target(node: ir.Node) -> ir.DataType | None:
    if node.op_type == "CastLike":
        return node.inputs[1].dtype if len(node.inputs) > 1 and node.inputs[1] is not None else None
    to = node.attributes.get_int("to", 0)
    try:
        return ir.DataType(to)
    except ValueError:
        return None


def cast_rule(src: ir.DataType | None, dst: ir.DataType | None) -> tuple | None:
    """Cast from ``src`` to ``dst`` on integer-valued floats as a rule (the webgpu target writes
    the same rules in WGSL), or None (refused): ``("bool",)``, ``("half",)``, ``("keep",)``,
    ``("truncate", lo, hi)`` or ``("wrap", bits, signed)``.

    ONNX's rules, on integer-valued floats: to bool, nonzero is 1; float to an integer type
    rounds toward zero (out of range is undefined in ONNX: saturated here); an integer to a
    narrower integer type keeps the low bits (two's complement wrap); to float16 rounds to half;
    every other cast (integers or bool to float, widening) keeps the value."""
    if src is None or dst is None:
        return None
    known = (*_FLOAT_TYPES, ir.DataType.FLOAT16, ir.DataType.BOOL, *_INT_TYPES)
    if src not in known or dst not in known:
        return None
    if dst == ir.DataType.BOOL:
        return ("bool",)
    if dst == ir.DataType.FLOAT16:
        return ("keep",) if src in (ir.DataType.FLOAT16, ir.DataType.BOOL) else ("half",)
    if dst in _FLOAT_TYPES:
        return ("keep",)
    bits, signed = _INT_TYPES[dst]
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    if src in (*_FLOAT_TYPES, ir.DataType.FLOAT16):
        return ("truncate", lo, hi)
    if src == ir.DataType.BOOL or bits >= 32:
        return ("keep",)  # 0/1, or a type wider than the integers a float holds exactly
    sbits, ssigned = _INT_TYPES[src]
    if (sbits == bits and ssigned == signed) or (sbits < bits and (signed or not ssigned)):
        return ("keep",)  # every value of the source type is one of the target type
    return ("wrap", bits, signed)


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


def wrap_expr(bits: int, signed: bool) -> str:
    """``a`` (an integer held as a float) wrapped to a ``bits``-bit integer type, two's
    complement when ``signed``; MSL and WGSL spell it alike, so both targets take it here."""
    span = flit(2**bits)
    if signed:
        return f"(a - {span} * floor((a + {flit(2 ** (bits - 1))}) / {span}))"
    return f"(a - {span} * floor(a / {span}))"


def _check_cast(ctx: LowerContext, node: ir.Node) -> str | None:
    src, dst = _present(node.inputs[:1])[0].dtype, _cast_target(node)
    if cast_expr(src, dst) is None:
        name = lambda t: t.name.lower() if t is not None else "unknown"  # noqa: E731
        return f"cast from {name(src)} to {name(dst)}"
    return None


@register("Cast", "CastLike", check=_check_cast, integers=True)
def lower_cast(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x = _present(node.inputs[:1])
    expr = cast_expr(x[0].dtype, _cast_target(node))
    assert expr is not None  # the planner checks this before lowering
    return lower_where_or_unary(ctx, kernel, x, node.outputs[0], expr)
