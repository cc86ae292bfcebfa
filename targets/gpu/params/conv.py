"""Conv and ConvTranspose parameters: pads (``auto_pad`` resolved), strides, dilations, the
bias strides of Gemm and MatMul, ConvTranspose's constants."""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir
from mconv.errors import InputError


def resolve_pads(
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
    pb = resolve_pads(node, in_sp, out_sp, kernel, s, d)
    if rank == 1:
        return [1, *in_sp], [1, *out_sp], [1, *kernel], [1, *s], [1, *d], [0, *pb]
    return in_sp, out_sp, list(kernel), s, d, pb


def bias_strides(c_shape: list[int], m: int, n: int) -> tuple[int, int]:
    """Strides of C over (row, column) after broadcasting C to [M, N]."""
    shape = [1] * (2 - len(c_shape)) + list(c_shape[-2:]) if c_shape else [1, 1]
    rows, cols = shape[-2], shape[-1]
    return (cols if rows == m and m != 1 else 0), (1 if cols == n and n != 1 else 0)


def conv_transpose_constants(
    node: ir.Node, xs: Sequence[int], ws: Sequence[int], ys: Sequence[int]
) -> dict[str, int]:
    """ConvTranspose's kernel constants (rule 3), shared by the metal and webgpu kernels: sizes,
    kernel, strides, dilations, leading pads (from the attribute, or from the inferred output for
    auto_pad and output_shape) and group widths; a 1-D transposed convolution as 2-D with a
    height of 1."""
    rank = len(xs) - 2
    k = list(ws[2:])
    s = list(node.attributes.get_ints("strides", [1] * rank))
    d = list(node.attributes.get_ints("dilations", [1] * rank))
    opad = list(node.attributes.get_ints("output_padding", [0] * rank))
    auto = node.attributes.get_string("auto_pad", "NOTSET")
    in_sp, out_sp = list(xs[2:]), list(ys[2:])
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
    c, oc = xs[1], ys[1]
    return dict(
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
    )
