"""Convolution kernels: Conv (grouped, depthwise, dilated; 1-D and 2-D) and ConvTranspose, each
with bias and a fused activation (Gemm and MatMul: :mod:`.matmul`).

Rules:

1. Conv: one thread per output pixel x channel, grid ``(OW, OH, N*OC)``; the sum runs over the
   group's input channels and the kernel window, skipping taps in the padding. 1-D convolution
   is 2-D with height 1. ``auto_pad`` is resolved from the inferred output shape.
2. The accumulator is float, seeded with the bias; the activation applies before the store.
3. ConvTranspose (1-D, 2-D, grouped, strided, dilated, ``output_padding``, ``auto_pad``,
   ``output_shape``): one thread per output pixel x channel, grid ``(OW, OH, N*OC)``; the pad
   begin is the attribute's, or derived from the inferred output size (SAME_UPPER: half the
   total padding at the start, rounded down).
"""

from __future__ import annotations

import onnx_ir as ir
from mconv.targets.gpu.params.conv import conv_transpose_constants, spatial_params
from mconv.targets.gpu.values import required
from mconv.targets.metal.msl import Activation, KernelSource, LowerContext, activation_expr, register


def constants(prefix: str, values: dict[str, int]) -> str:
    return "".join(f"constant int {prefix}_{k} = {int(v)};\n" for k, v in values.items())


@register("Conv", fusible=True)
def lower_conv(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x, w = required(node.inputs[0]), required(node.inputs[1])
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


def _check_conv_transpose(ctx: LowerContext, node: ir.Node) -> str | None:
    xs = required(node.inputs[0], node).shape
    if xs is None or len(xs) not in (3, 4):
        return "only 1-D and 2-D ConvTranspose"
    return None


@register("ConvTranspose", fusible=True, check=_check_conv_transpose)
def lower_conv_transpose(
    ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None
) -> KernelSource:
    """Transposed convolution (rule 3): each output pixel gathers the input pixels whose stride
    grid lands on it, ``ih = (oh + pad - kh * dilation) / stride`` where that divides exactly."""
    x, w = required(node.inputs[0]), required(node.inputs[1])
    b = node.inputs[2] if len(node.inputs) > 2 else None
    y = node.outputs[0]
    xs, ws, ys = ctx.shape(x), ctx.shape(w), ctx.shape(y)
    cs = conv_transpose_constants(node, xs, ws, ys)
    n, oc = xs[0], ys[1]
    P = kernel
    consts = constants(P, dict(N=n, **cs))
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
    return KernelSource(kernel, src, reads, (cs["OW"], cs["OH"], n * oc))
