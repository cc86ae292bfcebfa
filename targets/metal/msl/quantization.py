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
from mconv.targets.gpu.params.quantization import CODE_RANGES, code_type, quant_params
from mconv.targets.metal.msl import (
    Activation,
    KernelSource,
    LowerContext,
    flit,
    register,
)
from mconv.targets.metal.msl.conv import constants


def _check(ctx: LowerContext, node: ir.Node) -> str | None:
    got = quant_params(ctx, node)
    return got if isinstance(got, str) else None


@register("QuantizeLinear", "DequantizeLinear", check=_check, integers=True)
def lower_quantize(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x = node.inputs[0]
    assert x is not None
    xs = ctx.shape(x)
    got = quant_params(ctx, node)
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
        code = code_type(node)
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
