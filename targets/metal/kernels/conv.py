"""Convolution and fully connected kernels: Conv (grouped, depthwise, dilated; 1-D and 2-D),
Gemm and MatMul, each with bias and a fused activation.

Rules:

1. Conv: one thread per output pixel x channel, grid ``(OW, OH, N*OC)``; the sum runs over the
   group's input channels and the kernel window, skipping taps in the padding. 1-D convolution
   is 2-D with height 1. ``auto_pad`` is resolved from the inferred output shape.
2. Gemm ``Y = alpha * A' B' + beta * C`` and MatMul ``Y = A B`` (A of any rank >= 2, flattened to
   rows; B a 2-D matrix): one thread per output element, grid ``(N, M, 1)``. ``transA``/``transB``
   are index orders, the weights stay as the model stores them. C broadcasts by baked strides.
3. The accumulator is float, seeded with the bias; the activation applies before the store.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from mconv.errors import InputError
from mconv.targets.metal.kernels import (
    Activation,
    KernelSource,
    LowerContext,
    activation_expr,
    flit,
    register,
)


def _resolve_pads(
    node: ir.Node, in_sp: list[int], out_sp: list[int], k: list[int], s: list[int], d: list[int]
):
    auto = node.attributes.get_string("auto_pad", "NOTSET")
    n = len(in_sp)
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begins = []
        for i in range(n):
            total = max(0, (out_sp[i] - 1) * s[i] + (k[i] - 1) * d[i] + 1 - in_sp[i])
            begins.append(total // 2 if auto == "SAME_UPPER" else total - total // 2)
        return begins
    if auto == "VALID":
        return [0] * n
    pads = list(node.attributes.get_ints("pads", [0] * (2 * n)))
    return pads[:n]


def spatial_params(node: ir.Node, x_shape: list[int], y_shape: list[int], kernel: list[int]):
    """(in HW, out HW, kernel, strides, dilations, pad begins) as 2-D lists (1-D gets height 1)."""
    rank = len(x_shape) - 2
    if rank not in (1, 2):
        raise InputError(
            f"{node.op_type} with {rank} spatial dimensions",
            where=f"node '{node.name}'",
            hint="the metal target supports 1-D and 2-D windows",
        )
    s = list(node.attributes.get_ints("strides", [1] * rank))
    d = list(node.attributes.get_ints("dilations", [1] * rank))
    in_sp, out_sp = list(x_shape[2:]), list(y_shape[2:])
    pb = _resolve_pads(node, in_sp, out_sp, kernel, s, d)
    if rank == 1:
        return [1, *in_sp], [1, *out_sp], [1, *kernel], [1, *s], [1, *d], [0, *pb]
    return in_sp, out_sp, list(kernel), s, d, pb


def constants(prefix: str, values: dict[str, int]) -> str:
    return "".join(f"constant int {prefix}_{k} = {int(v)};\n" for k, v in values.items())


@register("Conv", fusible=True)
def lower_conv(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x, w = node.inputs[0], node.inputs[1]
    b = node.inputs[2] if len(node.inputs) > 2 else None
    y = node.outputs[0]
    xs, ws, ys = ctx.shape(x), ctx.shape(w), ctx.shape(y)
    (ih, iw), (oh, ow), (kh, kw), (sh, sw), (dh, dw), (ph, pw) = spatial_params(node, xs, ys, ws[2:])
    group = node.attributes.get_int("group", 1)
    n, c, oc = xs[0], xs[1], ys[1]
    P = kernel
    consts = constants(
        P,
        dict(
            N=n,
            IC=c,
            IH=ih,
            IW=iw,
            OC=oc,
            OH=oh,
            OW=ow,
            KH=kh,
            KW=kw,
            SH=sh,
            SW=sw,
            DH=dh,
            DW=dw,
            PH=ph,
            PW=pw,
            ICG=c // group,
            OCG=oc // group,
        ),
    )
    params = [ctx.buffer_param(0, "X"), ctx.buffer_param(1, "W")]
    reads = [x, w]
    if b is not None:
        params.append(ctx.buffer_param(2, "B"))
        reads.append(b)
    params.append(ctx.buffer_param(len(params), "Y", out=True))
    seed = "float(B[oc])" if b is not None else "0.0f"
    body = f"""{{
    if (gid.x >= uint({P}_OW) || gid.y >= uint({P}_OH) || gid.z >= uint({P}_N * {P}_OC)) return;
    const int ow = int(gid.x), oh = int(gid.y), oc = int(gid.z) % {P}_OC, n = int(gid.z) / {P}_OC;
    const int c0 = (oc / {P}_OCG) * {P}_ICG;
    float acc = {seed};
    for (int ic = 0; ic < {P}_ICG; ++ic) {{
        device const {ctx.storage}* xc = X + ((n * {P}_IC + c0 + ic) * {P}_IH) * {P}_IW;
        device const {ctx.storage}* wc = W + ((oc * {P}_ICG + ic) * {P}_KH) * {P}_KW;
        for (int kh = 0; kh < {P}_KH; ++kh) {{
            const int ih = oh * {P}_SH - {P}_PH + kh * {P}_DH;
            if (ih < 0 || ih >= {P}_IH) continue;
            for (int kw = 0; kw < {P}_KW; ++kw) {{
                const int iw = ow * {P}_SW - {P}_PW + kw * {P}_DW;
                if (iw < 0 || iw >= {P}_IW) continue;
                acc += float(xc[ih * {P}_IW + iw]) * float(wc[kh * {P}_KW + kw]);
            }}
        }}
    }}
    const float v = acc;
    Y[((n * {P}_OC + oc) * {P}_OH + oh) * {P}_OW + ow] = {ctx.storage}({activation_expr(act)});
}}
"""
    src = consts + ctx.signature(kernel, params) + " " + body
    return KernelSource(kernel, src, reads, (ow, oh, n * oc))


def _bias_strides(c_shape: list[int], m: int, n: int) -> tuple[int, int]:
    """Strides of C over (row, column) after broadcasting C to [M, N]."""
    shape = [1] * (2 - len(c_shape)) + list(c_shape[-2:]) if c_shape else [1, 1]
    rows, cols = shape[-2], shape[-1]
    return (cols if rows == m and m != 1 else 0), (1 if cols == n and n != 1 else 0)


@register("Gemm", "MatMul", fusible=True)
def lower_gemm(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    a, b = node.inputs[0], node.inputs[1]
    y = node.outputs[0]
    as_, bs, ys = ctx.shape(a), ctx.shape(b), ctx.shape(y)
    where = f"node '{node.name}'"
    if node.op_type == "MatMul":
        if len(bs) != 2 or len(as_) < 2:
            raise InputError(
                f"MatMul of shapes {as_} x {bs}",
                where=where,
                hint="the metal target needs a 2-D right operand",
            )
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
        sr, sc = _bias_strides(ctx.shape(c), m, n)
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
    del ys
    return KernelSource(kernel, src, reads, (n, m, 1))
