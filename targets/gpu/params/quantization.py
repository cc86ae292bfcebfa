"""QuantizeLinear/DequantizeLinear parameters: code types and ranges, scales and zero points
(the kernels' rule 3: constants, per tensor or per axis)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from mconv.targets.gpu.ops import LowerContext, exact_integer_limit

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


def code_type(node: ir.Node) -> ir.DataType | None:
    """The integer type of the codes: QuantizeLinear's output, DequantizeLinear's input."""
    v = node.outputs[0] if node.op_type == "QuantizeLinear" else node.inputs[0]
    if v is not None and v.dtype is not None:
        return v.dtype
    zp = node.inputs[2] if len(node.inputs) > 2 else None
    if zp is not None and zp.dtype is not None:
        return zp.dtype
    out = node.attributes.get_int("output_dtype", 0) if node.op_type == "QuantizeLinear" else 0
    return ir.DataType(out) if out else ir.DataType.UINT8


def quant_params(ctx: LowerContext, node: ir.Node) -> tuple[np.ndarray, np.ndarray, int] | str:
    """(scale, zero point, axis) as float64 arrays of one value or one per channel, or why not."""
    if node.attributes.get_int("block_size", 0) > 0:
        return "blocked quantization (block_size) on activations"
    code = code_type(node)
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
