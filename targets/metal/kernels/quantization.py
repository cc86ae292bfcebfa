"""Quantization kernels: QuantizeLinear and DequantizeLinear on activations (the planner evaluates
them on constants before lowering; TFLite int8 models import as Q/DQ pairs).

Rules:

1. One thread per element, grid ``(count, 1, 1)``. Kernels compute floats: a quantized tensor is
   a float-valued buffer holding the integer codes: 8-bit codes are exact in half and float
   storage; wider codes in float storage only (refused with half storage, the reason named).
2. QuantizeLinear: ``clamp(rint(x / scale) + zero_point, lo, hi)``: the quotient rounded half to
   even BEFORE the zero point is added (as the reference executor and ONNX Runtime do), then
   saturated to the range of the output type (the zero point's type, else ``output_dtype``,
   else uint8). DequantizeLinear: ``(q - zero_point) * scale``.
3. Scales and zero points must be constants: per tensor (one value, baked as a literal) or per
   axis (``axis``; one value per channel, baked as ``constant float`` tables). Blocked
   quantization (``block_size``) and float8/float4 codes are refused with the reason.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from mconv.targets.metal.kernels import (
    Activation,
    KernelSource,
    LowerContext,
    exact_integer_limit,
    flit,
    register,
)
from mconv.targets.metal.kernels.conv import constants

# integer code ranges (ONNX's int4/uint4 included); other types (float8, float4) are refused
CODE_RANGES: dict[ir.DataType, tuple[int, int]] = {
    ir.DataType.UINT8: (0, 255),
    ir.DataType.INT8: (-128, 127),
    ir.DataType.UINT16: (0, 65535),
    ir.DataType.INT16: (-32768, 32767),
    ir.DataType.UINT4: (0, 15),
    ir.DataType.INT4: (-8, 7),
    ir.DataType.INT32: (-(2**31), 2**31 - 1),
    ir.DataType.UINT32: (0, 2**32 - 1),
}


def _code_type(node: ir.Node) -> ir.DataType | None:
    """The integer type of the codes: QuantizeLinear's output, DequantizeLinear's input."""
    v = node.outputs[0] if node.op_type == "QuantizeLinear" else node.inputs[0]
    if v is not None and v.dtype is not None:
        return v.dtype
    zp = node.inputs[2] if len(node.inputs) > 2 else None
    if zp is not None and zp.dtype is not None:
        return zp.dtype
    out = node.attributes.get_int("output_dtype", 0) if node.op_type == "QuantizeLinear" else 0
    return ir.DataType(out) if out else ir.DataType.UINT8


def _params(ctx: LowerContext, node: ir.Node) -> tuple[np.ndarray, np.ndarray, int] | str:
    """(scale, zero point, axis) as float64 arrays of one value or one per channel, or why not."""
    if node.attributes.get_int("block_size", 0) > 0:
        return "blocked quantization (block_size) on activations"
    code = _code_type(node)
    if code not in CODE_RANGES:
        return f"{code.name.lower() if code is not None else 'unknown'} codes"
    lo, hi = CODE_RANGES[code]
    if max(-lo, hi) > exact_integer_limit(ctx.storage):
        return (
            f"{code.name.lower()} codes are beyond the integers {ctx.storage} storage holds exactly"
            " (export with --precision fp32)"
        )
    scale = LowerContext.const(node.inputs[1])
    zp_value = node.inputs[2] if len(node.inputs) > 2 else None
    zp = np.zeros(1) if zp_value is None else LowerContext.const(zp_value)
    if scale is None or zp is None:
        return "scale or zero point not constant"
    x = node.inputs[0]
    assert x is not None
    rank = len(ctx.shape(x))
    axis = node.attributes.get_int("axis", 1)
    axis = axis + rank if axis < 0 else axis
    scale = scale.astype(np.float64).ravel()
    zp = zp.astype(np.float64).ravel()
    if scale.size > 1 or zp.size > 1:
        if not 0 <= axis < rank:
            return f"axis {axis} outside rank {rank}"
        n = ctx.shape(x)[axis]
        if {scale.size, zp.size} - {1, n}:
            return f"{scale.size} scales, {zp.size} zero points for {n} channels"
        scale = np.broadcast_to(scale, (n,)) if scale.size == 1 else scale
        zp = np.broadcast_to(zp, (n,)) if zp.size == 1 else zp
    return scale, zp, axis


def _check(ctx: LowerContext, node: ir.Node) -> str | None:
    got = _params(ctx, node)
    return got if isinstance(got, str) else None


@register("QuantizeLinear", "DequantizeLinear", check=_check, integers=True)
def lower_quantize(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x = node.inputs[0]
    assert x is not None
    xs = ctx.shape(x)
    got = _params(ctx, node)
    assert not isinstance(got, str)  # the planner checks this before lowering
    scale, zp, axis = got
    count = int(np.prod(xs)) if xs else 1
    P = kernel
    tables = ""
    if scale.size == 1:
        s, z, pick = flit(scale[0]), flit(zp[0]), ""
    else:
        inner = int(np.prod(xs[axis + 1 :]))
        n = scale.size
        tables = (
            f"constant float {P}_S[{n}] = {{{', '.join(flit(v) for v in scale)}}};\n"
            f"constant float {P}_Z[{n}] = {{{', '.join(flit(v) for v in zp)}}};\n"
        )
        pick = f"const int c = (int(gid.x) / {inner}) % {n};\n    "
        s, z = f"{P}_S[c]", f"{P}_Z[c]"
    if node.op_type == "QuantizeLinear":
        code = _code_type(node)
        assert code is not None
        lo, hi = CODE_RANGES[code]
        body = f"const float v = min(max(rint(float(X[gid.x]) / {s}) + {z}, {flit(lo)}), {flit(hi)});"
    else:
        body = f"const float v = (float(X[gid.x]) - {z}) * {s};"
    params = [ctx.buffer_param(0, "X"), ctx.buffer_param(1, "Y", out=True)]
    src = (
        tables
        + constants(P, dict(COUNT=count))
        + ctx.signature(kernel, params)
        + f""" {{
    if (gid.x >= uint({P}_COUNT)) return;
    {pick}{body}
    Y[gid.x] = {ctx.storage}(v);
}}
"""
    )
    return KernelSource(kernel, src, [x], (count, 1, 1))
