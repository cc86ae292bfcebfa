"""Pooling kernels: MaxPool, AveragePool (1-D and 2-D windows), GlobalMaxPool, GlobalAveragePool.

Rules:

1. Windowed pooling: one thread per output pixel x channel, grid ``(OW, OH, N*C)``; taps in the
   padding are skipped. ``ceil_mode`` only changes the output size, read from the inferred shape.
2. AveragePool divides by the taps inside the input (``count_include_pad=0``) or inside the
   padded extent (``count_include_pad=1``; taps past the end padding, which ceil_mode can add,
   never count), as the ONNX reference does.
3. Global pooling: one thread per (n, c), grid ``(N*C, 1, 1)``, a float loop over H*W.
"""

from __future__ import annotations

import onnx_ir as ir
from mconv.errors import InputError
from mconv.targets.gpu.values import required
from mconv.targets.metal.msl import Activation, KernelSource, LowerContext, activation_expr, register
from mconv.targets.metal.msl.conv import constants, spatial_params


@register("MaxPool", "AveragePool", fusible=True)
def lower_pool(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x, y = required(node.inputs[0]), node.outputs[0]
    if len(node.outputs) > 1 and node.outputs[1] is not None and node.outputs[1].uses():
        raise InputError("MaxPool indices output", where=f"node '{node.name}'", hint="not supported by metal")
    xs, ys = ctx.shape(x), ctx.shape(y)
    kshape = list(node.attributes.get_ints("kernel_shape"))
    (ih, iw), (oh, ow), (kh, kw), (sh, sw), (dh, dw), (ph, pw) = spatial_params(node, xs, ys, kshape)
    rank = len(xs) - 2
    pads = list(node.attributes.get_ints("pads", [0] * (2 * rank)))
    pe = pads[rank:] if node.attributes.get_string("auto_pad", "NOTSET") == "NOTSET" else pads[rank:]
    peh, pew = ([0, *pe] if rank == 1 else pe) if pe else (0, 0)
    n, c = xs[0], xs[1]
    P = kernel
    is_max = node.op_type == "MaxPool"
    include_pad = node.attributes.get_int("count_include_pad", 0)
    consts = constants(
        P,
        dict(
            NC=n * c,
            IH=ih,
            IW=iw,
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
            PEH=peh,
            PEW=pew,
        ),
    )
    if is_max:
        init, step, final = "float acc = -INFINITY;", "acc = max(acc, float(xc[ih * {P}_IW + iw]));", "acc"
    else:
        init = "float acc = 0.0f; int taps = 0;"
        step = "acc += float(xc[ih * {P}_IW + iw]); ++taps;"
        final = "acc / float(taps)"
    if not is_max and include_pad:
        # taps counted over the padded extent, clipped to it (ceil_mode may run past the end pad)
        final = (
            f"acc / float((min(oh * {P}_SH - {P}_PH + ({P}_KH - 1) * {P}_DH, {P}_IH + {P}_PEH - 1)"
            f" - (oh * {P}_SH - {P}_PH)) / {P}_DH + 1) / float((min(ow * {P}_SW - {P}_PW + ({P}_KW - 1) * {P}_DW,"
            f" {P}_IW + {P}_PEW - 1) - (ow * {P}_SW - {P}_PW)) / {P}_DW + 1)"
        )
    step = step.format(P=P)
    params = [ctx.buffer_param(0, "X"), ctx.buffer_param(1, "Y", out=True)]
    src = (
        consts
        + ctx.signature(kernel, params)
        + f""" {{
    if (gid.x >= uint({P}_OW) || gid.y >= uint({P}_OH) || gid.z >= uint({P}_NC)) return;
    const int ow = int(gid.x), oh = int(gid.y), nc = int(gid.z);
    device const {ctx.storage}* xc = X + nc * {P}_IH * {P}_IW;
    {init}
    for (int kh = 0; kh < {P}_KH; ++kh) {{
        const int ih = oh * {P}_SH - {P}_PH + kh * {P}_DH;
        if (ih < 0 || ih >= {P}_IH) continue;
        for (int kw = 0; kw < {P}_KW; ++kw) {{
            const int iw = ow * {P}_SW - {P}_PW + kw * {P}_DW;
            if (iw < 0 || iw >= {P}_IW) continue;
            {step}
        }}
    }}
    const float v = {final};
    Y[(nc * {P}_OH + oh) * {P}_OW + ow] = {ctx.storage}({activation_expr(act)});
}}
"""
    )
    return KernelSource(kernel, src, [x], (ow, oh, n * c))


@register("GlobalMaxPool", "GlobalAveragePool", fusible=True)
def lower_global_pool(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x = required(node.inputs[0])
    xs = ctx.shape(x)
    n, c = xs[0], xs[1]
    hw = 1
    for d in xs[2:]:
        hw *= d
    P = kernel
    is_max = node.op_type == "GlobalMaxPool"
    init = "-INFINITY" if is_max else "0.0f"
    step = "acc = max(acc, float(xc[i]));" if is_max else "acc += float(xc[i]);"
    final = "acc" if is_max else f"acc / float({P}_HW)"
    params = [ctx.buffer_param(0, "X"), ctx.buffer_param(1, "Y", out=True)]
    src = (
        constants(P, dict(NC=n * c, HW=hw))
        + ctx.signature(kernel, params)
        + f""" {{
    if (gid.x >= uint({P}_NC)) return;
    device const {ctx.storage}* xc = X + int(gid.x) * {P}_HW;
    float acc = {init};
    for (int i = 0; i < {P}_HW; ++i) {{
        {step}
    }}
    const float v = {final};
    Y[gid.x] = {ctx.storage}({activation_expr(act)});
}}
"""
    )
    return KernelSource(kernel, src, [x], (n * c, 1, 1))
