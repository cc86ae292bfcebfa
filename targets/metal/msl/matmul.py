"""Matrix product kernels: Gemm and MatMul, with bias and a fused activation.

Rules:

1. Gemm ``Y = alpha * A' B' + beta * C`` and MatMul ``Y = A B`` (A of any rank >= 2, flattened to
   rows; B a 2-D matrix): one thread per output element, grid ``(N, M, 1)``. ``transA``/``transB``
   are index orders, the weights stay as the model stores them. C broadcasts by baked strides.
2. MatMul with a right operand of rank other than 2 is numpy's: 1-D operands promoted, batch
   dimensions broadcast, grid ``(N, M, batch)``.
3. The accumulator is float, seeded with the bias; the activation applies before the store.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from mconv.targets.gpu.params.conv import bias_strides
from mconv.targets.gpu.values import required
from mconv.targets.metal.msl import (
    Activation,
    KernelSource,
    LowerContext,
    activation_expr,
    flit,
    register,
)
from mconv.targets.metal.msl.conv import constants


@register("Gemm", "MatMul", fusible=True)
def lower_gemm(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    a, b = required(node.inputs[0]), required(node.inputs[1])
    y = node.outputs[0]
    as_, bs, ys = ctx.shape(a), ctx.shape(b), ctx.shape(y)
    where = f"node '{node.name}'"
    if node.op_type == "MatMul":
        if len(bs) != 2 or len(as_) < 2:
            return _lower_batched_matmul(ctx, node, kernel, act)
        ta, tb, alpha, beta, c = 0, 0, 1.0, 0.0, None
        m, k = int(np.prod(as_[:-1])), as_[-1]
    else:
        ta = node.attributes.get_int("transA", 0)
        tb = node.attributes.get_int("transB", 0)
        alpha = node.attributes.get_float("alpha", 1.0)
        beta = node.attributes.get_float("beta", 1.0)
        c = node.inputs[2] if len(node.inputs) > 2 else None
        m, k = (as_[1], as_[0]) if ta else (as_[0], as_[1])
    n = bs[0] if tb else bs[1]
    P = kernel
    a_index = f"kk * {m} + row" if ta else f"row * {k} + kk"
    b_index = f"col * {k} + kk" if tb else f"kk * {n} + col"
    params = [ctx.buffer_param(0, "A"), ctx.buffer_param(1, "B")]
    reads = [a, b]
    bias = ""
    if c is not None and beta != 0.0:
        sr, sc = bias_strides(ctx.shape(c), m, n)
        params.append(ctx.buffer_param(2, "C"))
        reads.append(c)
        bias = f" + {flit(beta)} * float(C[row * {sr} + col * {sc}])"
    params.append(ctx.buffer_param(len(params), "Y", out=True))
    scale = "" if alpha == 1.0 else f"{flit(alpha)} * "
    src = (
        constants(P, dict(M=m, N=n, K=k))
        + ctx.signature(kernel, params)
        + f""" {{
    if (gid.x >= uint({P}_N) || gid.y >= uint({P}_M)) return;
    const int col = int(gid.x), row = int(gid.y);
    float acc = 0.0f;
    for (int kk = 0; kk < {P}_K; ++kk) {{
        acc += float(A[{a_index}]) * float(B[{b_index}]);
    }}
    const float v = {scale}acc{bias};
    Y[row * {P}_N + col] = {ctx.storage}({activation_expr(act)});
}}
"""
    )
    del ys, where
    return KernelSource(kernel, src, reads, (n, m, 1))


def _lower_batched_matmul(
    ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None
) -> KernelSource:
    """numpy matmul: 1-D operands promoted, batch dimensions broadcast (rule 2)."""
    from mconv.targets.gpu.params.elementwise import broadcast_strides
    from mconv.targets.metal.msl.elementwise import _offsets

    a, b = required(node.inputs[0]), required(node.inputs[1])
    as_, bs = ctx.shape(a), ctx.shape(b)
    a2 = [1, *as_] if len(as_) == 1 else as_
    b2 = [*bs, 1] if len(bs) == 1 else bs
    m, k, n = a2[-2], a2[-1], b2[-1]
    batch = list(np.broadcast_shapes(tuple(a2[:-2]), tuple(b2[:-2])))
    count = int(np.prod(batch)) if batch else 1
    sa = [s * m * k for s in broadcast_strides(a2[:-2], batch)]
    sb = [s * k * n for s in broadcast_strides(b2[:-2], batch)]
    P = kernel
    params = [ctx.buffer_param(0, "A"), ctx.buffer_param(1, "B"), ctx.buffer_param(2, "Y", out=True)]
    src = (
        constants(P, dict(M=m, N=n, K=k, BATCH=count))
        + ctx.signature(kernel, params)
        + f""" {{
    if (gid.x >= uint({P}_N) || gid.y >= uint({P}_M) || gid.z >= uint({P}_BATCH)) return;
    const int col = int(gid.x), row = int(gid.y);
    int r = int(gid.z);
    {_offsets(batch, [("a", sa), ("b", sb)])}
    device const {ctx.storage}* ap = A + i_a + row * {P}_K;
    device const {ctx.storage}* bp = B + i_b + col;
    float acc = 0.0f;
    for (int kk = 0; kk < {P}_K; ++kk) {{
        acc += float(ap[kk]) * float(bp[kk * {P}_N]);
    }}
    const float v = acc;
    Y[(int(gid.z) * {P}_M + row) * {P}_N + col] = {ctx.storage}({activation_expr(act)});
}}
"""
    )
    return KernelSource(kernel, src, [a, b], (n, m, count))
