"""Convolution and fully connected kernels: Conv (grouped, depthwise, dilated; 1-D and 2-D),
Gemm and MatMul, ConvTranspose, each with bias and a fused activation.

Rules:

1. Conv: one thread per output pixel x channel, grid ``(OW, OH, N*OC)``; the sum runs over the
   group's input channels and the kernel window, skipping taps in the padding. 1-D convolution
   is 2-D with height 1. ``auto_pad`` is resolved from the inferred output shape.
2. Gemm ``Y = alpha * A' B' + beta * C`` and MatMul ``Y = A B`` (A of any rank >= 2, flattened to
   rows; B a 2-D matrix): one thread per output element, grid ``(N, M, 1)``. ``transA``/``transB``
   are index orders, the weights stay as the model stores them. C broadcasts by baked strides.
   MatMul with a right operand of rank other than 2 is numpy's: 1-D operands promoted, batch
   dimensions broadcast, grid ``(N, M, batch)``.
3. The accumulator is float, seeded with the bias; the activation applies before the store.
4. ConvTranspose (1-D, 2-D, grouped, strided, dilated, ``output_padding``, ``auto_pad``,
   ``output_shape``): one thread per output pixel x channel, grid ``(OW, OH, N*OC)``; the pad
   begin is the attribute's, or derived from the inferred output size (SAME_UPPER: half the
   total padding at the start, rounded down).
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
    del ys, where
    return KernelSource(kernel, src, reads, (n, m, 1))


def _lower_batched_matmul(
    ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None
) -> KernelSource:
    """numpy matmul: 1-D operands promoted, batch dimensions broadcast (rule 2)."""
    from mconv.targets.metal.kernels.elementwise import _offsets, broadcast_strides

    a, b = node.inputs[0], node.inputs[1]
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


def _check_conv_transpose(ctx: LowerContext, node: ir.Node) -> str | None:
    xs = node.inputs[0].shape
    if xs is None or len(xs) not in (3, 4):
        return "only 1-D and 2-D ConvTranspose"
    return None


@register("ConvTranspose", fusible=True, check=_check_conv_transpose)
def lower_conv_transpose(
    ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None
) -> KernelSource:
    """Transposed convolution (rule 4): each output pixel gathers the input pixels whose stride
    grid lands on it, ``ih = (oh + pad - kh * dilation) / stride`` where that divides exactly."""
    x, w = node.inputs[0], node.inputs[1]
    b = node.inputs[2] if len(node.inputs) > 2 else None
    y = node.outputs[0]
    xs, ws, ys = ctx.shape(x), ctx.shape(w), ctx.shape(y)
    rank = len(xs) - 2
    k = list(ws[2:])
    s = list(node.attributes.get_ints("strides", [1] * rank))
    d = list(node.attributes.get_ints("dilations", [1] * rank))
    opad = list(node.attributes.get_ints("output_padding", [0] * rank))
    auto = node.attributes.get_string("auto_pad", "NOTSET")
    in_sp, out_sp = xs[2:], ys[2:]
    if auto in ("SAME_UPPER", "SAME_LOWER") or (auto == "NOTSET" and "output_shape" in node.attributes):
        begins = []
        for i in range(rank):
            total = max(0, s[i] * (in_sp[i] - 1) + opad[i] + (k[i] - 1) * d[i] + 1 - out_sp[i])
            begins.append(total // 2 if auto == "SAME_UPPER" else total - total // 2)
    elif auto == "VALID":
        begins = [0] * rank
    else:
        begins = list(node.attributes.get_ints("pads", [0] * (2 * rank)))[:rank]
    if rank == 1:
        in_sp, out_sp, k, s, d, begins = [1, *in_sp], [1, *out_sp], [1, *k], [1, *s], [1, *d], [0, *begins]
    group = node.attributes.get_int("group", 1)
    n, c, oc = xs[0], xs[1], ys[1]
    P = kernel
    consts = constants(
        P,
        dict(
            N=n,
            IC=c,
            IH=in_sp[0],
            IW=in_sp[1],
            OC=oc,
            OH=out_sp[0],
            OW=out_sp[1],
            KH=k[0],
            KW=k[1],
            SH=s[0],
            SW=s[1],
            DH=d[0],
            DW=d[1],
            PH=begins[0],
            PW=begins[1],
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
    const int g = oc / {P}_OCG, ocg = oc % {P}_OCG;
    float acc = {seed};
    for (int icg = 0; icg < {P}_ICG; ++icg) {{
        const int ic = g * {P}_ICG + icg;
        device const {ctx.storage}* xc = X + ((n * {P}_IC + ic) * {P}_IH) * {P}_IW;
        device const {ctx.storage}* wc = W + ((ic * {P}_OCG + ocg) * {P}_KH) * {P}_KW;
        for (int kh = 0; kh < {P}_KH; ++kh) {{
            const int th = oh + {P}_PH - kh * {P}_DH;
            if (th < 0 || th % {P}_SH != 0) continue;
            const int ih = th / {P}_SH;
            if (ih >= {P}_IH) continue;
            for (int kw = 0; kw < {P}_KW; ++kw) {{
                const int tw = ow + {P}_PW - kw * {P}_DW;
                if (tw < 0 || tw % {P}_SW != 0) continue;
                const int iw = tw / {P}_SW;
                if (iw >= {P}_IW) continue;
                acc += float(xc[ih * {P}_IW + iw]) * float(wc[kh * {P}_KW + kw]);
            }}
        }}
    }}
    const float v = acc;
    Y[((n * {P}_OC + oc) * {P}_OH + oh) * {P}_OW + ow] = {ctx.storage}({activation_expr(act)});
}}
"""
    src = consts + ctx.signature(kernel, params) + " " + body
    return KernelSource(kernel, src, reads, (out_sp[1], out_sp[0], n * oc))
