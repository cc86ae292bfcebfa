"""Elementwise parameters: broadcast strides, and Cast as a rule on integer-valued floats."""

from __future__ import annotations

import onnx_ir as ir

FLOAT_TYPES = (ir.DataType.FLOAT, ir.DataType.DOUBLE)


def broadcast_strides(in_shape: list[int], out_shape: list[int]) -> list[int]:
    """Element strides of ``in_shape`` over ``out_shape``'s coordinates (0 where broadcast)."""
    padded = [1] * (len(out_shape) - len(in_shape)) + list(in_shape)
    strides, step = [], 1
    for d in reversed(padded):
        strides.append(step if d != 1 else 0)
        step *= d
    return list(reversed(strides))


# integer types: (bits, signed); int64's range is wider than any float holds exactly anyway
INT_TYPES = {
    ir.DataType.INT8: (8, True),
    ir.DataType.UINT8: (8, False),
    ir.DataType.INT16: (16, True),
    ir.DataType.UINT16: (16, False),
    ir.DataType.INT32: (32, True),
    ir.DataType.UINT32: (32, False),
    ir.DataType.INT64: (64, True),
    ir.DataType.UINT64: (64, False),
}


def cast_target(node: ir.Node) -> ir.DataType | None:
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
    known = (*FLOAT_TYPES, ir.DataType.FLOAT16, ir.DataType.BOOL, *INT_TYPES)
    if src not in known or dst not in known:
        return None
    if dst == ir.DataType.BOOL:
        return ("bool",)
    if dst == ir.DataType.FLOAT16:
        return ("keep",) if src in (ir.DataType.FLOAT16, ir.DataType.BOOL) else ("half",)
    if dst in FLOAT_TYPES:
        return ("keep",)
    bits, signed = INT_TYPES[dst]
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    if src in (*FLOAT_TYPES, ir.DataType.FLOAT16):
        return ("truncate", lo, hi)
    if src == ir.DataType.BOOL or bits >= 32:
        return ("keep",)  # 0/1, or a type wider than the integers a float holds exactly
    sbits, ssigned = INT_TYPES[src]
    if (sbits == bits and ssigned == signed) or (sbits < bits and (signed or not ssigned)):
        return ("keep",)  # every value of the source type is one of the target type
    return ("wrap", bits, signed)
