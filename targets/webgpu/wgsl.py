"""WGSL kernel generators: the Metal target's kernels (``mconv.targets.metal.msl``) written
as WebGPU compute shaders, one rule per ONNX op type.

A rule ``lower(ctx, node, kernel, act) -> KernelSource`` (or a list, one per output or per chunk)
writes one complete WGSL module specialized for the node: shapes, strides and padding are
``const`` values baked in the source, so the shader compiler folds them.

Kernel conventions (the runner and the web page rely on them):

1. Bindings are ``@group(0) @binding(i)``, i = 0..n-1 in the plan's binding order: the values
   read (``var<storage, read>``) first, the output (``var<storage, read_write>``) last.
2. Storage type ``T``: the module starts with ``alias T = f32;`` or, for fp16 storage,
   ``enable f16;`` + ``alias T = f16;`` (:data:`HEADER_F16`); a runner without ``shader-f16``
   replaces that header with the f32 one (:func:`storage_header`). Every sum and every
   transcendental is ``f32``.
3. The entry point is the kernel's name (``L3_conv``), ``@workgroup_size(64)``. The plan's grid
   ``(GX, GY, GZ)`` is run as ``GX*GY*GZ`` invocations in 1-D or 2-D dispatches of 64-wide
   workgroups (:func:`dispatch_size`); each invocation recovers its linear index
   ``id.x + id.y * num_workgroups.x * 64`` and from it ``gx, gy, gz`` (x fastest), returning at
   once past the end.
4. No workgroup memory, no barriers: each invocation computes its outputs from storage alone.
5. A fused activation is a WGSL expression of the f32 ``v`` (:func:`activation_expr`).
6. Register blocking: a convolution invocation computes 8 (or 4, or 2) output channels of one
   group at one pixel, and a Gemm/MatMul invocation 8 (4, 2) adjacent output columns of one row
   (:func:`_block`), so each input value is loaded once for all of them; the grid counts
   invocations (``n * OC / 8`` in z for a convolution, ``N / 8`` in x for a Gemm). Depthwise
   convolutions (one output channel a group) stay one output an invocation, and a layer is
   blocked only as far as :data:`MIN_INVOCATIONS` invocations remain (a GPU starves on fewer:
   on the H200, 8 columns an invocation made AlexNet's fully connected layers at batch 1 twice
   as slow).
7. Convolutions (but depthwise ones) and 2-D Gemm/MatMul are workgroup-tiled where their shape
   allows (:mod:`mconv.targets.webgpu.tiled`: implicit-GEMM tiles in workgroup memory, split-K
   matrix-vector products at batch 1), and so are Softmax rows of at least
   :data:`~mconv.targets.webgpu.tiled.SOFTMAX_ROW` values (a workgroup a row); rules 3, 4 and
   6 are then that module's. The rules above describe the direct kernels, kept for the shapes
   tiling does not suit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
from mconv.errors import InputError
from mconv.onnx_rules import softmax_axes
from mconv.targets.gpu import expr
from mconv.targets.gpu.expr import BINARY, is_inf_expr, wrap_expr
from mconv.targets.gpu.ops import Activation, LowerContext, activation_of, check_unary, flit, tensor_clip
from mconv.targets.gpu.params.conv import bias_strides, conv_transpose_constants, spatial_params
from mconv.targets.gpu.params.elementwise import broadcast_strides, cast_rule, cast_target
from mconv.targets.gpu.params.indexing import check_gather, check_gathernd, gather_geometry, gathernd_geometry
from mconv.targets.gpu.params.normalization import check_layernorm, softmax_axis
from mconv.targets.gpu.params.quantization import CODE_RANGES, code_type, quant_params
from mconv.targets.gpu.params.reduction import merged_groups, reduce_axes
from mconv.targets.gpu.params.sampling import (
    OUTSIDE,
    GridAxis,
    GridSamplePlan,
    check_grid_sample,
    grid_sample_plan,
)
from mconv.targets.gpu.params.shape import (
    check_pad,
    check_resize,
    depth_space_view,
    pad_params,
    resize_axes,
    resize_taps,
    slice_params,
    strides,
)

WORKGROUP = 64
MAX_WORKGROUPS = 65535  # WebGPU's guaranteed maxComputeWorkgroupsPerDimension
MAX_BINDINGS = 8  # WebGPU's guaranteed maxStorageBuffersPerShaderStage
HEADER_F32 = "alias T = f32;\n"
HEADER_F16 = "enable f16;\nalias T = f16;\n"

PRELUDE = """
// x^y for every x: a negative base with an integral exponent as ONNX Pow gives it.
fn mconv_pow(a: f32, b: f32) -> f32 {
    if (a >= 0.0f || b != floor(b)) { return pow(a, b); }
    let r = pow(-a, b);
    return select(r, -r, (b % 2.0f) != 0.0f);
}

// erf (Abramowitz and Stegun 7.1.26, |error| < 1.5e-7).
fn mconv_erf(x: f32) -> f32 {
    let s = select(1.0f, -1.0f, x < 0.0f);
    let a = abs(x);
    let t = 1.0f / (1.0f + 0.3275911f * a);
    let y = 1.0f - (((((1.061405429f * t - 1.453152027f) * t) + 1.421413741f) * t - 0.284496736f) * t
                     + 0.254829592f) * t * exp(-a * a);
    return s * y;
}
"""
LOWEST = "(-3.4028234663852886e+38f)"  # WGSL has no infinity literal: the lowest f32
HIGHEST = "3.4028234663852886e+38f"


def storage_header(source: str, f16: bool) -> str:
    """The module with the header for the storage the device runs (rule 2)."""
    if not f16 and source.startswith(HEADER_F16):
        return HEADER_F32 + source[len(HEADER_F16) :]
    return source


def dispatch_size(grid: list[int] | tuple[int, ...]) -> tuple[int, int, int]:
    """Workgroups to dispatch for a grid (rule 3)."""
    total = int(np.prod(grid))
    groups = max(1, -(-total // WORKGROUP))
    if groups <= MAX_WORKGROUPS:
        return (groups, 1, 1)
    return (MAX_WORKGROUPS, -(-groups // MAX_WORKGROUPS), 1)


def activation_expr(act: Activation | None, v: str = "v") -> str:
    """The WGSL expression of ``act`` applied to the f32 ``v``."""
    return expr.activation_expr(act, v, expr.WGSL)


@dataclass
class KernelSource:
    """A generated kernel: name, WGSL module, the values it reads (binding order), grid."""

    name: str
    source: str
    reads: list[ir.Value]
    grid: tuple[int, int, int]
    output: ir.Value | None = None  # the value written; None: the node's (fused chain's) output
    threadgroup: tuple[int, int, int] = (WORKGROUP, 1, 1)


def inp(node: ir.Node, i: int) -> ir.Value:
    """Input ``i`` of ``node`` (the planner has checked that it exists)."""
    v = node.inputs[i]
    assert v is not None
    return v


def outp(node: ir.Node, i: int = 0) -> ir.Value:
    v = node.outputs[i]
    assert v is not None
    return v


def consts(values: dict[str, int]) -> str:
    return "".join(f"const {k}: i32 = {int(v)};\n" for k, v in values.items())


def module(
    ctx: LowerContext,
    kernel: str,
    reads: list[str],
    grid: tuple[int, int, int],
    constants: dict[str, int],
    body: str,
    tables: str = "",
) -> str:
    """A complete WGSL module: header, prelude, constants, bindings, the entry point (rules 1-3)."""
    header = HEADER_F16 if ctx.storage == "half" else HEADER_F32
    binds = [
        f"@group(0) @binding({i}) var<storage, read> {name}: array<T>;\n" for i, name in enumerate(reads)
    ]
    binds.append(f"@group(0) @binding({len(reads)}) var<storage, read_write> Y: array<T>;\n")
    gx, gy, gz = grid
    return (
        header
        + PRELUDE
        + "\n"
        + consts({"GX": gx, "GY": gy, "GZ": gz, **constants})
        + tables
        + "".join(binds)
        + f"""
@compute @workgroup_size({WORKGROUP})
fn {kernel}(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
    let lin = id.x + id.y * nwg.x * {WORKGROUP}u;
    if (lin >= u32(GX * GY * GZ)) {{ return; }}
    let gx = i32(lin % u32(GX));
    let gy = i32((lin / u32(GX)) % u32(GY));
    let gz = i32(lin / u32(GX * GY));
{body}}}
"""
    )


# Rule 6: register blocking divides the invocations; a GPU needs many of them in flight (an
# H200 holds 270K), so a layer is blocked only as far as this many invocations remain
MIN_INVOCATIONS = 16384


def _block(count: int, others: int = 1) -> int:
    """Rule 6: how many outputs one invocation computes along a run of ``count`` (8, 4, 2 or
    1) when the rest of the grid holds ``others`` invocations: the largest that divides
    ``count`` and leaves at least :data:`MIN_INVOCATIONS` invocations, else 1."""
    for b in (8, 4, 2):
        if count % b == 0 and count // b * others >= MIN_INVOCATIONS:
            return b
    return 1


def _indent(text: str) -> str:
    return "".join(f"    {ln}\n" if ln.strip() else "\n" for ln in text.strip("\n").splitlines())


# op_type -> rule(ctx, node, kernel, act); op_type -> check(ctx, node) -> None or why not
LOWER: dict[str, Callable] = {}
CHECKS: dict[str, Callable] = {}


def register(*ops: str, check: Callable | None = None) -> Callable[[Callable], Callable]:
    def deco(fn: Callable) -> Callable:
        for op in ops:
            LOWER[op] = fn
            if check is not None:
                CHECKS[op] = check
        return fn

    return deco


# -- convolution and fully connected ------------------------------------------------------


def _check_window(ctx: LowerContext, node: ir.Node) -> str | None:
    xs = inp(node, 0).shape
    return "only 1-D and 2-D windows" if xs is None or len(xs) not in (3, 4) else None


@register("Conv", check=_check_window)
def lower_conv(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    from mconv.targets.webgpu.tiled import lower_conv_tiled

    tiled = lower_conv_tiled(ctx, node, kernel, act)  # rule 7
    if tiled is not None:
        return tiled
    x, w = inp(node, 0), inp(node, 1)
    b = node.inputs[2] if len(node.inputs) > 2 else None
    xs, ws, ys = ctx.shape(x), ctx.shape(w), ctx.shape(outp(node))
    (ih, iw), (oh, ow), (kh, kw), (sh, sw), (dh, dw), (ph, pw) = spatial_params(node, xs, ys, ws[2:])
    group = node.attributes.get_int("group", 1)
    n, c, oc = xs[0], xs[1], ys[1]
    reads, names = [x, w], ["X", "W"]
    if b is not None:
        reads.append(b)
        names.append("B")
    ocg = oc // group
    ob = _block(ocg, ow * oh * n * group)  # rule 6: output channels per invocation, all in one group
    accs = [f"a{j}" for j in range(ob)]
    seeds = [f"f32(B[oc0 + {j}])" if b is not None else "0.0f" for j in range(ob)]
    updates = "\n".join(
        f"            {a} += xv * f32(W[wb + {j * (c // group) * kh * kw} + kh * KW + kw]);"
        for j, a in enumerate(accs)
    )
    stores = "\n".join(
        f"Y[((n * OC + oc0 + {j}) * OH + oh) * OW + ow] = T({activation_expr(act, a)});"
        for j, a in enumerate(accs)
    )
    body = (
        f"""
let ow = gx; let oh = gy; let oc0 = (gz % OCB) * {ob}; let n = gz / OCB;
let c0 = (oc0 / OCG) * ICG;
"""
        + "".join(f"var {a}: f32 = {sd};\n" for a, sd in zip(accs, seeds))
        + f"""for (var ic: i32 = 0; ic < ICG; ic++) {{
    let xb = ((n * IC + c0 + ic) * IH) * IW;
    let wb = ((oc0 * ICG + ic) * KH) * KW;
    for (var kh: i32 = 0; kh < KH; kh++) {{
        let ih = oh * SH - PH + kh * DH;
        if (ih < 0 || ih >= IH) {{ continue; }}
        for (var kw: i32 = 0; kw < KW; kw++) {{
            let iw = ow * SW - PW + kw * DW;
            if (iw < 0 || iw >= IW) {{ continue; }}
            let xv = f32(X[xb + ih * IW + iw]);
{updates}
        }}
    }}
}}
{stores}
"""
    )
    grid = (ow, oh, n * (oc // ob))
    cs = dict(IC=c, IH=ih, IW=iw, OC=oc, OH=oh, OW=ow, KH=kh, KW=kw, SH=sh, SW=sw, DH=dh, DW=dw, PH=ph, PW=pw)
    cs.update(ICG=c // group, OCG=ocg, OCB=oc // ob)
    return KernelSource(kernel, module(ctx, kernel, names, grid, cs, _indent(body)), reads, grid)


@register("Gemm", "MatMul")
def lower_gemm(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    a, b = inp(node, 0), inp(node, 1)
    as_, bs = ctx.shape(a), ctx.shape(b)
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
    a_index = "kk * M + row" if ta else "row * K + kk"
    b_index = "col0 * K + kk" if tb else "kk * N + col0"
    reads, names = [a, b], ["A", "B"]
    sr = sc = None
    if c is not None and beta != 0.0:
        sr, sc = bias_strides(ctx.shape(c), m, n)
        reads.append(c)
        names.append("C")

    from mconv.targets.webgpu.tiled import lower_gemm_tiled

    tiled = lower_gemm_tiled(ctx, node, kernel, act, m, n, k, ta, tb, alpha, c, beta, sr, sc)  # rule 7
    if tiled is not None:
        return tiled

    def bias(col: str) -> str:
        return "" if sr is None else f" + {flit(beta)} * f32(C[row * {sr} + {col} * {sc}])"

    scale = "" if alpha == 1.0 else f"{flit(alpha)} * "
    cb = _block(n, m)  # rule 6: adjacent output columns per invocation
    accs = [f"a{j}" for j in range(cb)]
    b_step = "K" if tb else "1"  # B's stride from one output column to the next
    lines = [f"let col0 = gx * {cb}; let row = gy;", *(f"var {acc}: f32 = 0.0f;" for acc in accs)]
    lines.append("for (var kk: i32 = 0; kk < K; kk++) {")
    lines.append(f"    let av = f32(A[{a_index}]);")
    lines.append(f"    let bi = {b_index};")
    lines += [f"    {acc} += av * f32(B[bi + {j} * {b_step}]);" for j, acc in enumerate(accs)]
    lines.append("}")
    for j, acc in enumerate(accs):
        lines.append(f"let v{j} = {scale}{acc}{bias(f'(col0 + {j})')};")
        lines.append(f"Y[row * N + col0 + {j}] = T({activation_expr(act, f'v{j}')});")
    body = "\n" + "\n".join(lines) + "\n"
    grid = (n // cb, m, 1)
    return KernelSource(
        kernel, module(ctx, kernel, names, grid, dict(M=m, N=n, K=k), _indent(body)), reads, grid
    )


def offsets(out_shape: list[int], operands: list[tuple[str, list[int]]], flat: str = "gx") -> str:
    """WGSL statements setting ``i_<name>`` for each operand from the flat output index."""
    lines = [f"var r: i32 = {flat};"] + [f"var i_{name}: i32 = 0;" for name, _ in operands]
    for axis in reversed(range(len(out_shape))):
        dim = out_shape[axis]
        if all(strides[axis] == 0 for _, strides in operands) or dim == 1:
            lines.append(f"r = r / {dim};")
            continue
        adds = " ".join(
            f"i_{name} += c{axis} * {strides[axis]};" for name, strides in operands if strides[axis]
        )
        lines.append(f"{{ let c{axis} = r % {dim}; r = r / {dim}; {adds} }}")
    return "\n".join(lines) + "\n"


def _lower_batched_matmul(
    ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None
) -> KernelSource:
    a, b = inp(node, 0), inp(node, 1)
    as_, bs = ctx.shape(a), ctx.shape(b)
    a2 = [1, *as_] if len(as_) == 1 else as_
    b2 = [*bs, 1] if len(bs) == 1 else bs
    m, k, n = a2[-2], a2[-1], b2[-1]
    batch = list(np.broadcast_shapes(tuple(a2[:-2]), tuple(b2[:-2])))
    count = int(np.prod(batch)) if batch else 1
    sa = [s * m * k for s in broadcast_strides(a2[:-2], batch)]
    sb = [s * k * n for s in broadcast_strides(b2[:-2], batch)]
    body = (
        "let col = gx; let row = gy;\n"
        + offsets(batch, [("a", sa), ("b", sb)], "gz")
        + f"""var acc: f32 = 0.0f;
for (var kk: i32 = 0; kk < K; kk++) {{
    acc += f32(A[i_a + row * K + kk]) * f32(B[i_b + kk * N + col]);
}}
let v = acc;
Y[(gz * M + row) * N + col] = T({activation_expr(act)});
"""
    )
    grid = (n, m, count)
    return KernelSource(
        kernel, module(ctx, kernel, ["A", "B"], grid, dict(M=m, N=n, K=k), _indent(body)), [a, b], grid
    )


# -- pooling ------------------------------------------------------------------------------


@register("MaxPool", "AveragePool", check=_check_window)
def lower_pool(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x, y = inp(node, 0), outp(node)
    if len(node.outputs) > 1 and node.outputs[1] is not None and node.outputs[1].uses():
        raise InputError(
            "MaxPool indices output", where=f"node '{node.name}'", hint="not supported by webgpu"
        )
    xs, ys = ctx.shape(x), ctx.shape(y)
    kshape = list(node.attributes.get_ints("kernel_shape"))
    (ih, iw), (oh, ow), (kh, kw), (sh, sw), (dh, dw), (ph, pw) = spatial_params(node, xs, ys, kshape)
    rank = len(xs) - 2
    pads = list(node.attributes.get_ints("pads", [0] * (2 * rank)))
    pe = pads[rank:]
    peh, pew = ([0, *pe] if rank == 1 else pe) if pe else (0, 0)
    n, c = xs[0], xs[1]
    is_max = node.op_type == "MaxPool"
    if is_max:
        init, step, final = f"var acc: f32 = {LOWEST}; var taps: i32 = 0;", "acc = max(acc, t);", "acc"
    else:
        init, step, final = "var acc: f32 = 0.0f; var taps: i32 = 0;", "acc += t; taps++;", "acc / f32(taps)"
    if not is_max and node.attributes.get_int("count_include_pad"):
        final = (
            "acc / f32((min(oh * SH - PH + (KH - 1) * DH, IH + PEH - 1) - (oh * SH - PH)) / DH + 1)"
            " / f32((min(ow * SW - PW + (KW - 1) * DW, IW + PEW - 1) - (ow * SW - PW)) / DW + 1)"
        )
    body = f"""
let ow = gx; let oh = gy; let nc = gz;
let xb = nc * IH * IW;
{init}
for (var kh: i32 = 0; kh < KH; kh++) {{
    let ih = oh * SH - PH + kh * DH;
    if (ih < 0 || ih >= IH) {{ continue; }}
    for (var kw: i32 = 0; kw < KW; kw++) {{
        let iw = ow * SW - PW + kw * DW;
        if (iw < 0 || iw >= IW) {{ continue; }}
        let t = f32(X[xb + ih * IW + iw]);
        {step}
    }}
}}
let v = {final};
Y[(nc * OH + oh) * OW + ow] = T({activation_expr(act)});
"""
    grid = (ow, oh, n * c)
    cs = dict(
        IH=ih, IW=iw, OH=oh, OW=ow, KH=kh, KW=kw, SH=sh, SW=sw, DH=dh, DW=dw, PH=ph, PW=pw, PEH=peh, PEW=pew
    )
    return KernelSource(kernel, module(ctx, kernel, ["X"], grid, cs, _indent(body)), [x], grid)


@register("GlobalMaxPool", "GlobalAveragePool")
def lower_global_pool(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x = inp(node, 0)
    xs = ctx.shape(x)
    n, c, hw = xs[0], xs[1], int(np.prod(xs[2:]))
    is_max = node.op_type == "GlobalMaxPool"
    body = f"""
let xb = gx * HW;
var acc: f32 = {LOWEST if is_max else "0.0f"};
for (var i: i32 = 0; i < HW; i++) {{
    {"acc = max(acc, f32(X[xb + i]));" if is_max else "acc += f32(X[xb + i]);"}
}}
let v = {"acc" if is_max else "acc / f32(HW)"};
Y[gx] = T({activation_expr(act)});
"""
    grid = (n * c, 1, 1)
    return KernelSource(kernel, module(ctx, kernel, ["X"], grid, dict(HW=hw), _indent(body)), [x], grid)


# -- elementwise --------------------------------------------------------------------------

_BINARY = {**BINARY, "PRelu": "select(a * b, a, a >= 0.0f)"}


def _check_binary(ctx: LowerContext, node: ir.Node) -> str | None:
    if len(node.inputs) != 2 or any(v is None for v in node.inputs):
        return f"{len(node.inputs)} inputs (the webgpu target lowers 2)"
    return None


@register("Add", "Sum", "Sub", "Mul", "Div", "Max", "Min", "Mean", "Pow", "PRelu", check=_check_binary)
def lower_binary(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    a, b, y = inp(node, 0), inp(node, 1), outp(node)
    ys = ctx.shape(y)
    count = int(np.prod(ys)) if ys else 1
    sa, sb = broadcast_strides(ctx.shape(a), ys), broadcast_strides(ctx.shape(b), ys)
    expr = _BINARY[node.op_type]
    if node.op_type == "Pow":
        e = LowerContext.const(inp(node, 1))
        if e is not None and e.size == 1:
            special = {
                1.0: "a",
                2.0: "a * a",
                3.0: "a * a * a",
                0.5: "sqrt(a)",
                -1.0: "1.0f / a",
                0.0: "1.0f",
            }
            expr = special.get(float(e.reshape(())), expr)
    body = (
        offsets(ys, [("a", sa), ("b", sb)])
        + f"""let a = f32(A[i_a]); let b = f32(B[i_b]);
let v = {expr};
Y[gx] = T({activation_expr(act)});
"""
    )
    grid = (count, 1, 1)
    return KernelSource(kernel, module(ctx, kernel, ["A", "B"], grid, {}, _indent(body)), [a, b], grid)


# comparisons and logic: a bool value is held as T 0 or 1 (nonzero is true), as the Metal target
# holds it; integer and bool values follow the planner's rule 3 (:func:`mconv.targets.gpu.plan.value_reason`)
_PREDICATES = {
    "Equal": "select(0.0f, 1.0f, a == b)",
    "Less": "select(0.0f, 1.0f, a < b)",
    "Greater": "select(0.0f, 1.0f, a > b)",
    "LessOrEqual": "select(0.0f, 1.0f, a <= b)",
    "GreaterOrEqual": "select(0.0f, 1.0f, a >= b)",
    "And": "select(0.0f, 1.0f, a != 0.0f && b != 0.0f)",
    "Or": "select(0.0f, 1.0f, a != 0.0f || b != 0.0f)",
    "Xor": "select(0.0f, 1.0f, (a != 0.0f) != (b != 0.0f))",
}


def _cast_types(node: ir.Node) -> tuple[ir.DataType | None, ir.DataType | None]:
    return inp(node, 0).dtype, cast_target(node)


def _check_cast(ctx: LowerContext, node: ir.Node) -> str | None:
    src, dst = _cast_types(node)
    if cast_rule(src, dst) is None:
        name = lambda t: t.name.lower() if t is not None else "unknown"  # noqa: E731
        return f"cast from {name(src)} to {name(dst)}"
    return None


def cast_wgsl(src: ir.DataType | None, dst: ir.DataType | None) -> str:
    """The WGSL expression of the Metal target's Cast rule (:func:`~mconv.targets.metal.msl.
    elementwise.cast_rule`) applied to the f32 ``a``: to bool nonzero is 1; to float16 rounds to
    half (through WGSL's pack2x16float); float to an integer type rounds toward zero and
    saturates; an integer to a narrower one wraps; the rest keeps the value."""
    rule = cast_rule(src, dst)
    assert rule is not None  # _check_cast admitted it
    kind = rule[0]
    if kind == "bool":
        return "select(0.0f, 1.0f, a != 0.0f)"
    if kind == "half":
        return "unpack2x16float(pack2x16float(vec2<f32>(a, 0.0f))).x"
    if kind == "keep":
        return "a"
    if kind == "truncate":
        return f"min(max(trunc(a), {flit(rule[1])}), {flit(rule[2])})"
    return wrap_expr(rule[1], rule[2])


@register("Cast", "CastLike", check=_check_cast)
def lower_cast(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    """Cast by the Metal target's rule (:func:`cast_wgsl`); integers and bool are floats."""
    x = inp(node, 0)
    expr = cast_wgsl(*_cast_types(node))
    count = int(np.prod(ctx.shape(x))) if ctx.shape(x) else 1
    body = f"let a = f32(X[gx]);\nY[gx] = T({expr});\n"
    grid = (count, 1, 1)
    return KernelSource(kernel, module(ctx, kernel, ["X"], grid, {}, _indent(body)), [x], grid)


def _check_quantize(ctx: LowerContext, node: ir.Node) -> str | None:
    got = quant_params(ctx, node)
    return got if isinstance(got, str) else None


@register("QuantizeLinear", "DequantizeLinear", check=_check_quantize)
def lower_quantize(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    """The Metal target's quantization rules (``targets/metal/msl/quantization.py``): codes
    are floats; QuantizeLinear is ``clamp(round(x / scale) + zero_point, lo, hi)`` (WGSL's
    ``round`` is half to even, before the zero point is added), DequantizeLinear
    ``(q - zero_point) * scale``; per tensor (literals) or per axis (tables)."""
    x = inp(node, 0)
    xs = ctx.shape(x)
    got = quant_params(ctx, node)
    assert not isinstance(got, str)  # _check_quantize admitted it
    scale, zp, axis = got
    count = int(np.prod(xs)) if xs else 1
    tables, pick = "", ""
    if scale.size == 1:
        s, z = flit(scale[0]), flit(zp[0])
    else:
        n, inner = scale.size, int(np.prod(xs[axis + 1 :]))
        tables = "".join(
            f"var<private> {t}: array<f32, {n}> = array<f32, {n}>({', '.join(flit(v) for v in vals)});\n"
            for t, vals in (("S", scale), ("Z", zp))
        )
        pick = f"let c = (gx / {inner}) % {n};\n"
        s, z = "S[c]", "Z[c]"
    if node.op_type == "QuantizeLinear":
        code = code_type(node)
        assert code is not None
        lo, hi = CODE_RANGES[code]
        expr = f"min(max(round(f32(X[gx]) / {s}) + {z}, {flit(lo)}), {flit(hi)})"
    else:
        expr = f"(f32(X[gx]) - {z}) * {s}"
    body = f"{pick}Y[gx] = T({expr});\n"
    grid = (count, 1, 1)
    return KernelSource(kernel, module(ctx, kernel, ["X"], grid, {}, _indent(body), tables), [x], grid)


@register(*_PREDICATES, check=_check_binary)
def lower_predicate(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    return _broadcast_kernel(ctx, node, kernel, _PREDICATES[node.op_type], None)


def _check_where(ctx: LowerContext, node: ir.Node) -> str | None:
    if len(node.inputs) != 3 or any(v is None for v in node.inputs):
        return "Where takes 3 inputs"
    if inp(node, 0).const_value is not None:
        return "constant condition"
    return None


@register("Where", check=_check_where)
def lower_where(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    return _broadcast_kernel(ctx, node, kernel, "select(c, b, a != 0.0f)", act)


@register("Not")
def lower_not(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    return _broadcast_kernel(ctx, node, kernel, "select(1.0f, 0.0f, a != 0.0f)", None)


def _broadcast_kernel(
    ctx: LowerContext, node: ir.Node, kernel: str, expr: str, act: Activation | None
) -> KernelSource:
    """Y = expr(a, b, c) over the node's 1-3 inputs broadcast to the output (numpy's rule)."""
    ops = [inp(node, i) for i in range(len(node.inputs))]
    return _operands_kernel(ctx, kernel, ops, outp(node), expr, act)


def _operands_kernel(
    ctx: LowerContext, kernel: str, ops: list[ir.Value], y: ir.Value, expr: str, act: Activation | None
) -> KernelSource:
    """Y = act(expr(a, b, c)) over 1-3 operands broadcast to ``y`` (numpy's rule)."""
    ys = ctx.shape(y)
    count = int(np.prod(ys)) if ys else 1
    names = "abc"[: len(ops)]
    strided = [(n, broadcast_strides(ctx.shape(v), ys)) for n, v in zip(names, ops)]
    reads = " ".join(f"let {n} = f32({n.upper()}[i_{n}]);" for n in names)
    body = offsets(ys, strided) + f"{reads}\nlet v = {expr};\nY[gx] = T({activation_expr(act)});\n"
    grid = (count, 1, 1)
    src = module(ctx, kernel, [n.upper() for n in names], grid, {}, _indent(body))
    return KernelSource(kernel, src, ops, grid)


_UNARY = (
    "Relu Clip LeakyRelu Sigmoid Tanh Gelu HardSigmoid HardSwish Elu Celu Selu Softplus Softsign Mish Neg Exp "
    "Log Sqrt Abs Reciprocal Erf Floor Ceil Round Sin Cos"
).split()


@register("IsNaN", "IsInf")
def lower_is_nan_inf(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    """0/1 from the float's bits, as the Metal kernels test them."""
    bits = "(bitcast<u32>(a) & 0x7fffffffu)"
    if node.op_type == "IsNaN":
        test = f"({bits} > 0x7f800000u)"
    else:
        test = is_inf_expr(node, f"({bits} == 0x7f800000u)")
    expr = test if test == "0.0f" else f"select(0.0f, 1.0f, {test})"
    return _operands_kernel(ctx, kernel, [inp(node, 0)], outp(node), expr, None)


@register(*_UNARY, check=check_unary)
def lower_unary(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x = inp(node, 0)
    count = int(np.prod(ctx.shape(x)))
    own = activation_of(ctx, node)
    clip = tensor_clip(ctx, node) if own is None else None
    if clip is not None:  # Clip with computed bounds: broadcast operands
        nan = "((bitcast<u32>(a) & 0x7fffffffu) > 0x7f800000u)"  # NaN stays NaN, as numpy clips
        return _operands_kernel(ctx, kernel, clip[0], outp(node), f"select({clip[1]}, a, {nan})", None)
    assert own is not None
    body = f"let v = f32(X[gx]);\nY[gx] = T({activation_expr(own)});\n"
    grid = (count, 1, 1)
    return KernelSource(kernel, module(ctx, kernel, ["X"], grid, {}, _indent(body)), [x], grid)


@register("BatchNormalization")
def lower_batchnorm(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x = inp(node, 0)
    xs = ctx.shape(x)
    count = int(np.prod(xs))
    c = xs[1] if len(xs) > 1 else 1
    inner = int(np.prod(xs[2:])) if len(xs) > 2 else 1
    eps = node.attributes.get_float("epsilon", 1e-5)
    body = f"""
let c = (gx / INNER) % C;
let v = (f32(X[gx]) - f32(M[c])) * inverseSqrt(f32(V[c]) + {flit(eps)}) * f32(S[c]) + f32(B[c]);
Y[gx] = T({activation_expr(act)});
"""
    grid = (count, 1, 1)
    src = module(ctx, kernel, ["X", "S", "B", "M", "V"], grid, dict(C=c, INNER=inner), _indent(body))
    return KernelSource(kernel, src, [inp(node, i) for i in range(5)], grid)


# -- normalization ------------------------------------------------------------------------


@register("Softmax", "LogSoftmax")
def lower_softmax(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x = inp(node, 0)
    xs = ctx.shape(x)
    axes = softmax_axes(len(xs), softmax_axis(node), ctx.opset)
    axis = axes[0]
    outer = int(np.prod(xs[:axis]))
    size, inner = int(np.prod([xs[a] for a in axes])), int(np.prod(xs[axes[-1] + 1 :]))
    from mconv.targets.webgpu.tiled import lower_softmax_rows

    rows = lower_softmax_rows(ctx, node, kernel, outer, size, inner)  # rule 7
    if rows is not None:
        return rows
    store = "t - mx - log(sum)" if node.op_type == "LogSoftmax" else "exp(t - mx) / sum"
    body = f"""
let o = gx / INNER; let ii = gx % INNER;
let base = o * SIZE * INNER + ii;
var mx: f32 = {LOWEST};
for (var j: i32 = 0; j < SIZE; j++) {{ mx = max(mx, f32(X[base + j * INNER])); }}
var sum: f32 = 0.0f;
for (var j: i32 = 0; j < SIZE; j++) {{ sum += exp(f32(X[base + j * INNER]) - mx); }}
for (var j: i32 = 0; j < SIZE; j++) {{
    let t = f32(X[base + j * INNER]);
    Y[base + j * INNER] = T({store});
}}
"""
    grid = (outer * inner, 1, 1)
    return KernelSource(
        kernel, module(ctx, kernel, ["X"], grid, dict(SIZE=size, INNER=inner), _indent(body)), [x], grid
    )


@register("LRN")
def lower_lrn(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x = inp(node, 0)
    xs = ctx.shape(x)
    count, c, inner = int(np.prod(xs)), xs[1], int(np.prod(xs[2:]))
    size = node.attributes.get_int("size")
    alpha = node.attributes.get_float("alpha", 1e-4)
    beta = node.attributes.get_float("beta", 0.75)
    bias = node.attributes.get_float("bias", 1.0)
    lo, hi = (size - 1) // 2, (size - 1) - (size - 1) // 2
    body = f"""
let ch = (gx / INNER) % C;
let base = gx - ch * INNER;
var sq: f32 = 0.0f;
for (var k: i32 = max(0, ch - LO); k <= min(C - 1, ch + HI); k++) {{
    let t = f32(X[base + k * INNER]);
    sq += t * t;
}}
Y[gx] = T(f32(X[gx]) / pow({flit(bias)} + {flit(alpha / size)} * sq, {flit(beta)}));
"""
    grid = (count, 1, 1)
    src = module(ctx, kernel, ["X"], grid, dict(C=c, INNER=inner, LO=lo, HI=hi), _indent(body))
    return KernelSource(kernel, src, [x], grid)


# -- reductions ---------------------------------------------------------------------------

_FORMS = {
    "ReduceMean": ("0.0f", "acc += t;", "acc / f32({R})"),
    "ReduceSum": ("0.0f", "acc += t;", "acc"),
    "ReduceMax": (LOWEST, "acc = max(acc, t);", "acc"),
    "ReduceMin": (HIGHEST, "acc = min(acc, t);", "acc"),
    "ReduceProd": ("1.0f", "acc *= t;", "acc"),
    "ReduceL1": ("0.0f", "acc += abs(t);", "acc"),
    "ReduceL2": ("0.0f", "acc += t * t;", "sqrt(acc)"),
    "ReduceSumSquare": ("0.0f", "acc += t * t;", "acc"),
    "ReduceLogSum": ("0.0f", "acc += t;", "log(acc)"),
}


def _check_reduce(ctx: LowerContext, node: ir.Node) -> str | None:
    xs = inp(node, 0).shape
    if xs is not None and reduce_axes(ctx, node, len(xs)) is None:
        return "axes not constant"
    return None


@register(*_FORMS, check=_check_reduce)
def lower_reduce(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x = inp(node, 0)
    xs = ctx.shape(x)
    axes = reduce_axes(ctx, node, len(xs))
    assert axes is not None
    groups = merged_groups(xs, set(axes))
    kept = [(size, stride) for size, stride, red in groups if not red]
    red = [(size, stride) for size, stride, red in groups if red]
    count = int(np.prod([s for s, _ in kept])) if kept else 1
    total = int(np.prod([s for s, _ in red])) if red else 1
    lines = ["var r: i32 = gx;", "var base: i32 = 0;"]
    for size, stride in reversed(kept):
        lines.append(f"base += (r % {size}) * {stride}; r = r / {size};")
    opens, closes, offset = [], [], ["base"]
    for i, (size, stride) in enumerate(red):
        opens.append(f"for (var j{i}: i32 = 0; j{i} < {size}; j{i}++) {{")
        closes.append("}")
        offset.append(f"j{i} * {stride}")
    init, step, final = _FORMS[node.op_type]
    body = (
        "\n".join(lines)
        + f"""
var acc: f32 = {init};
{" ".join(opens)}
    let t = f32(X[{" + ".join(offset)}]);
    {step}
{" ".join(closes)}
let v = {final.format(R=total)};
Y[gx] = T({activation_expr(act)});
"""
    )
    grid = (count, 1, 1)
    return KernelSource(kernel, module(ctx, kernel, ["X"], grid, {}, _indent(body)), [x], grid)


# -- data movement ------------------------------------------------------------------------


@register("Concat")
def lower_concat(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> list[KernelSource]:
    """One kernel per chunk of up to MAX_BINDINGS - 1 inputs, each writing its part of Y."""
    y = outp(node)
    ys = ctx.shape(y)
    axis = node.attributes.get_int("axis", 0)
    axis = axis + len(ys) if axis < 0 else axis
    inner = int(np.prod(ys[axis + 1 :]))
    outer = int(np.prod(ys[:axis]))
    inputs = [inp(node, i) for i in range(len(node.inputs))]
    sizes = [ctx.shape(v)[axis] for v in inputs]
    starts = [int(s) for s in np.cumsum([0, *sizes[:-1]])]
    per = MAX_BINDINGS - 1
    chunks = [list(range(i, min(i + per, len(inputs)))) for i in range(0, len(inputs), per)]
    out = []
    for ci, idx in enumerate(chunks):
        lo, span = starts[idx[0]], sum(sizes[i] for i in idx)
        branches = []
        for j, i in enumerate(idx):
            cond = "if" if j == 0 else "else if"
            branches.append(
                f"{cond} (a < {starts[i] - lo + sizes[i]}) {{ v = X{j}[(o * {sizes[i]} + (a - {starts[i] - lo})) * INNER + ii]; }}"
            )
        body = f"""
let ii = gx % INNER; let a = (gx / INNER) % SPAN; let o = gx / (INNER * SPAN);
var v: T = T(0);
{chr(10).join(branches)}
Y[(o * AXIS + a + {lo}) * INNER + ii] = v;
"""
        grid = (outer * span * inner, 1, 1)
        name = kernel if len(chunks) == 1 else f"{kernel}_c{ci}"
        cs = dict(INNER=inner, SPAN=span, AXIS=ys[axis])
        src = module(ctx, name, [f"X{j}" for j in range(len(idx))], grid, cs, _indent(body))
        out.append(KernelSource(name, src, [inputs[i] for i in idx], grid, output=y))
    return out


def strided_copy(
    ctx: LowerContext,
    kernel: str,
    x: ir.Value,
    out_shape: list[int],
    strides: list[int],
    base: int = 0,
    output: ir.Value | None = None,
) -> KernelSource:
    """Y[flat] = X[base + sum(coord_i * strides_i)] over ``out_shape``."""
    count = int(np.prod(out_shape)) if out_shape else 1
    body = offsets(out_shape, [("x", strides)]) + f"Y[gx] = X[{base} + i_x];\n"
    grid = (count, 1, 1)
    return KernelSource(kernel, module(ctx, kernel, ["X"], grid, {}, _indent(body)), [x], grid, output=output)


@register("Transpose")
def lower_transpose(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x, y = inp(node, 0), outp(node)
    xs = ctx.shape(x)
    perm = list(node.attributes.get_ints("perm", list(reversed(range(len(xs))))))
    st = strides(xs)
    return strided_copy(ctx, kernel, x, ctx.shape(y), [st[p] for p in perm])


def _check_slice(ctx: LowerContext, node: ir.Node) -> str | None:
    got = slice_params(ctx, node)
    return got if isinstance(got, str) else None


@register("Slice", check=_check_slice)
def lower_slice(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x, y = inp(node, 0), outp(node)
    got = slice_params(ctx, node)
    assert not isinstance(got, str)
    begin, step = got
    st = strides(ctx.shape(x))
    base = sum(b * s for b, s in zip(begin, st))
    return strided_copy(ctx, kernel, x, ctx.shape(y), [sp * s for sp, s in zip(step, st)], base)


@register("Split")
def lower_split(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> list[KernelSource]:
    x = inp(node, 0)
    xs = ctx.shape(x)
    axis = node.attributes.get_int("axis", 0)
    axis = axis + len(xs) if axis < 0 else axis
    st = strides(xs)
    out, start = [], 0
    for i in range(len(node.outputs)):
        y = outp(node, i)
        ys = ctx.shape(y)
        if y.uses() or y.is_graph_output():
            out.append(strided_copy(ctx, f"{kernel}_o{i}", x, ys, st, start * st[axis], output=y))
        start += ys[axis]
    return out


@register("DepthToSpace", "SpaceToDepth")
def lower_depth_space(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    """The 6-D transpose of the ONNX definition (DCR or CRD) as one strided copy (the Metal rule)."""
    x = inp(node, 0)
    return strided_copy(ctx, kernel, x, *depth_space_view(node, ctx.shape(x)))


@register("Tile")
def lower_tile(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    """Each output axis wraps into the input's (the Pad kernel's wrap mode, begin 0)."""
    x = inp(node, 0)
    xs = ctx.shape(x)
    return remap(ctx, kernel, x, xs, ctx.shape(outp(node)), [(0, "wrap")] * len(xs))


@register("Expand")
def lower_expand(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x, y = inp(node, 0), outp(node)
    return strided_copy(ctx, kernel, x, ctx.shape(y), broadcast_strides(ctx.shape(x), ctx.shape(y)))


@register("Gather", check=check_gather)
def lower_gather(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    """The Metal kernels' Gather (rules 2 and 3 of :mod:`mconv.targets.metal.msl.indexing`):
    constant indices baked as a table; indices computed at run time read from a buffer, an index
    outside ``[-n, n)`` (or not a number) giving 0, never a read outside the data."""
    x = inp(node, 0)
    xs, axis, inner, n_idx, count = gather_geometry(ctx, node)
    grid = (count, 1, 1)
    sizes = dict(INNER=inner, NIDX=n_idx, AXIS=xs[axis])
    indices = LowerContext.const(inp(node, 1))
    if indices is None:
        body = """
let ii = gx % INNER; let j = (gx / INNER) % NIDX; let o = gx / (INNER * NIDX);
let f = f32(I[j]);
if (!(f >= f32(-AXIS) && f < f32(AXIS))) { Y[gx] = T(0.0f); return; }
var k = i32(f);
if (k < 0) { k = k + AXIS; }
if (k < 0 || k >= AXIS) { Y[gx] = T(0.0f); return; }
Y[gx] = X[(o * AXIS + k) * INNER + ii];
"""
        src = module(ctx, kernel, ["X", "I"], grid, sizes, _indent(body))
        return KernelSource(kernel, src, [x, inp(node, 1)], grid)
    idx = [int(i) + xs[axis] if int(i) < 0 else int(i) for i in indices.ravel()]
    table = f"const IDX = array<i32, {n_idx}>({', '.join(map(str, idx))});\n"
    body = """
let ii = gx % INNER; let j = (gx / INNER) % NIDX; let o = gx / (INNER * NIDX);
var idx = IDX;
Y[gx] = X[(o * AXIS + idx[j]) * INNER + ii];
"""
    src = module(ctx, kernel, ["X"], grid, sizes, _indent(body), table)
    return KernelSource(kernel, src, [x], grid)


@register("GatherND", check=check_gathernd)
def lower_gathernd(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    """The Metal kernels' GatherND (rule 4 of :mod:`mconv.targets.metal.msl.indexing`):
    constant indices baked as a table of data offsets (-1 giving 0); indices computed at run time
    read from a buffer, a component outside ``[-n, n)`` (or not a number) giving 0."""
    x, idx_value = inp(node, 0), inp(node, 1)
    g = gathernd_geometry(ctx, node)
    grid = (g.count, 1, 1)
    sizes = dict(INNER=g.inner, PER=g.per, SLAB=g.slab, K=max(g.k, 1))
    head = "let ii = gx % INNER; let t = gx / INNER;\n"
    if LowerContext.const(idx_value) is None:
        lines = [head + "var off = (t / PER) * SLAB;"]
        for j, (d, st) in enumerate(zip(g.dims, g.strides)):
            lines.append(
                f"{{ let f = f32(I[t * K + {j}]);\n"
                f"  if (!(f >= f32(-{d}) && f < f32({d}))) {{ Y[gx] = T(0.0f); return; }}\n"
                f"  var k = i32(f); if (k < 0) {{ k = k + {d}; }}\n"
                f"  if (k < 0 || k >= {d}) {{ Y[gx] = T(0.0f); return; }}\n"
                f"  off = off + k * {st}; }}"
            )
        body = "\n".join(lines) + "\nY[gx] = X[off + ii];\n"
        src = module(ctx, kernel, ["X", "I"], grid, sizes, _indent(body))
        return KernelSource(kernel, src, [x, idx_value], grid)
    const = LowerContext.const(idx_value)
    assert const is not None  # the runtime-index branch above returned
    offs = g.offsets(const)
    table = f"const OFF = array<i32, {len(offs)}>({', '.join(map(str, offs))});\n"
    body = (
        head
        + "var offs = OFF;\nlet off = offs[t];\nif (off < 0) { Y[gx] = T(0.0f); return; }\nY[gx] = X[off + ii];\n"
    )
    src = module(ctx, kernel, ["X"], grid, sizes, _indent(body), table)
    return KernelSource(kernel, src, [x], grid)


# -- Pad, Resize, LayerNormalization, ConvTranspose --------------------------


def remap(
    ctx: LowerContext,
    kernel: str,
    x: ir.Value,
    xs: list[int],
    ys: list[int],
    axes: list[tuple[int, str]],
    value: float = 0.0,
) -> KernelSource:
    """Per output axis (begin, mode): i = c - begin mapped into [0, D) by the mode (the Metal
    target's Pad rule: constant, edge, reflect, wrap; negative begins crop)."""
    st = strides(xs)
    count = int(np.prod(ys)) if ys else 1
    lines = ["var r: i32 = gx;", "var off: i32 = 0;", "var outside = false;"]
    for a in reversed(range(len(ys))):
        dim, d_in, (b, mode) = ys[a], xs[a], axes[a]
        if d_in == 1 and mode != "constant":
            lines.append(f"r = r / {dim};")
            continue
        fix = ""
        if mode == "constant":
            fix = f"if (i < 0 || i >= {d_in}) {{ outside = true; }}"
        elif mode == "edge":
            fix = f"i = min(max(i, 0), {d_in - 1});"
        elif mode == "reflect":
            m = 2 * (d_in - 1)
            fix = f"i = ((i % {m}) + {m}) % {m}; if (i >= {d_in}) {{ i = {m} - i; }}"
        elif mode == "wrap":
            fix = f"i = ((i % {d_in}) + {d_in}) % {d_in};"
        if b == 0 and dim == d_in:
            fix = ""
        lines.append(f"{{ var i: i32 = r % {dim} - {b}; r = r / {dim}; {fix} off += i * {st[a]}; }}")
    body = "\n".join(lines) + f"\nY[gx] = select(X[select(off, 0, outside)], T({flit(value)}), outside);\n"
    grid = (count, 1, 1)
    return KernelSource(kernel, module(ctx, kernel, ["X"], grid, {}, _indent(body)), [x], grid)


@register("Pad", check=check_pad)
def lower_pad(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    x, y = inp(node, 0), outp(node)
    got = pad_params(ctx, node)
    assert not isinstance(got, str)
    begins, mode, value = got
    return remap(ctx, kernel, x, ctx.shape(x), ctx.shape(y), [(b, mode) for b in begins], value)


@register("Resize", "Upsample", check=check_resize)
def lower_resize(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    """The reference executor's per-axis plan (output x input weights per resized axis) as
    tables of taps: every mode and coordinate transformation the reference has."""
    x, y = inp(node, 0), outp(node)
    xs, ys = ctx.shape(x), ctx.shape(y)
    plan, attrs = resize_axes(ctx, node)
    st = strides(xs)
    resized = {axis: (w, ext) for axis, w, ext in plan}
    any_ext = any(ext.any() for _, _, ext in plan)
    tables, opens, closes, weights, offs = [], [], [], [], []
    coords = ["var r: i32 = gx;", "var off: i32 = 0;", "var outside = false;"]
    for a in reversed(range(len(ys))):
        if a in resized:
            _, ext = resized[a]
            coords.append(f"let c{a} = r % {ys[a]}; r = r / {ys[a]};")
            if ext.any():
                tables.append(
                    f"var<private> E{a}: array<i32, {len(ext)}> = array<i32, {len(ext)}>({', '.join(str(int(e)) for e in ext)});\n"
                )
                coords.append(f"if (E{a}[c{a}] != 0) {{ outside = true; }}")
        else:
            coords.append(f"off += (r % {ys[a]}) * {st[a]}; r = r / {ys[a]};")
    for a in sorted(resized):
        w, _ = resized[a]
        taps, idx, wts = resize_taps(w)
        tables.append(
            f"var<private> I{a}: array<i32, {len(idx)}> = array<i32, {len(idx)}>({', '.join(map(str, idx))});\n"
        )
        if attrs.get("mode", "nearest") != "nearest":
            tables.append(
                f"var<private> W{a}: array<f32, {len(wts)}> = array<f32, {len(wts)}>({', '.join(flit(v) for v in wts)});\n"
            )
            weights.append(f"W{a}[c{a} * {taps} + t{a}]")
        opens.append(f"for (var t{a}: i32 = 0; t{a} < {taps}; t{a}++) {{")
        closes.append("}")
        offs.append(f"I{a}[c{a} * {taps} + t{a}] * {st[a]}")
    weight = " * ".join(weights) if weights else "1.0f"
    value = flit(attrs.get("extrapolation_value", 0.0))
    store = f"select(acc, {value}, outside)" if any_ext else "acc"
    body = (
        "\n".join(coords)
        + f"""
var acc: f32 = 0.0f;
{" ".join(opens)}
    acc += {weight} * f32(X[off + {" + ".join(offs) or "0"}]);
{" ".join(closes)}
Y[gx] = T({store});
"""
    )
    count = int(np.prod(ys))
    grid = (count, 1, 1)
    return KernelSource(
        kernel, module(ctx, kernel, ["X"], grid, {}, _indent(body), "".join(tables)), [x], grid
    )


@register("LayerNormalization", check=check_layernorm)
def lower_layernorm(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    """One invocation per row (the axes from ``axis`` on): mean, then variance, in f32."""
    x = inp(node, 0)
    xs = ctx.shape(x)
    axis = node.attributes.get_int("axis", -1)
    axis = axis + len(xs) if axis < 0 else axis
    size, rows = int(np.prod(xs[axis:])), int(np.prod(xs[:axis]))
    eps = node.attributes.get_float("epsilon", 1e-5)
    reads, names = [x, inp(node, 1)], ["X", "S"]
    s_idx = "j" if int(np.prod(ctx.shape(inp(node, 1)))) == size else "0"
    bias = ""
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        reads.append(inp(node, 2))
        names.append("B")
        bias = f" + f32(B[{'j' if int(np.prod(ctx.shape(inp(node, 2)))) == size else '0'}])"
    body = f"""
let base = gx * SIZE;
var mean: f32 = 0.0f;
for (var j: i32 = 0; j < SIZE; j++) {{ mean += f32(X[base + j]); }}
mean = mean / f32(SIZE);
var vs: f32 = 0.0f;
for (var j: i32 = 0; j < SIZE; j++) {{ let d = f32(X[base + j]) - mean; vs += d * d; }}
let inv = inverseSqrt(vs / f32(SIZE) + {flit(eps)});
for (var j: i32 = 0; j < SIZE; j++) {{
    let v = (f32(X[base + j]) - mean) * inv * f32(S[{s_idx}]){bias};
    Y[base + j] = T({activation_expr(act)});
}}
"""
    grid = (rows, 1, 1)
    return KernelSource(kernel, module(ctx, kernel, names, grid, dict(SIZE=size), _indent(body)), reads, grid)


def _check_conv_transpose(ctx: LowerContext, node: ir.Node) -> str | None:
    xs = inp(node, 0).shape
    return "only 1-D and 2-D ConvTranspose" if xs is None or len(xs) not in (3, 4) else None


@register("ConvTranspose", check=_check_conv_transpose)
def lower_conv_transpose(
    ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None
) -> KernelSource:
    """Each output pixel gathers the input pixels whose stride grid lands on it (the Metal
    target's rule 3: pads from the attribute, or from the inferred output for auto_pad and
    output_shape)."""
    x, w = inp(node, 0), inp(node, 1)
    b = node.inputs[2] if len(node.inputs) > 2 else None
    xs, ws, ys = ctx.shape(x), ctx.shape(w), ctx.shape(outp(node))
    cs = conv_transpose_constants(node, xs, ws, ys)
    n, oc = xs[0], ys[1]
    reads, names = [x, w], ["X", "W"]
    if b is not None:
        reads.append(b)
        names.append("B")
    seed = "f32(B[oc])" if b is not None else "0.0f"
    body = f"""
let ow = gx; let oh = gy; let oc = gz % OC; let n = gz / OC;
let g = oc / OCG; let ocg = oc % OCG;
var acc: f32 = {seed};
for (var icg: i32 = 0; icg < ICG; icg++) {{
    let ic = g * ICG + icg;
    let xb = ((n * IC + ic) * IH) * IW;
    let wb = ((ic * OCG + ocg) * KH) * KW;
    for (var kh: i32 = 0; kh < KH; kh++) {{
        let th = oh + PH - kh * DH;
        if (th < 0 || th % SH != 0) {{ continue; }}
        let ih = th / SH;
        if (ih >= IH) {{ continue; }}
        for (var kw: i32 = 0; kw < KW; kw++) {{
            let tw = ow + PW - kw * DW;
            if (tw < 0 || tw % SW != 0) {{ continue; }}
            let iw = tw / SW;
            if (iw >= IW) {{ continue; }}
            acc += f32(X[xb + ih * IW + iw]) * f32(W[wb + kh * KW + kw]);
        }}
    }}
}}
let v = acc;
Y[((n * OC + oc) * OH + oh) * OW + ow] = T({activation_expr(act)});
"""
    grid = (cs["OW"], cs["OH"], n * oc)
    return KernelSource(kernel, module(ctx, kernel, names, grid, cs, _indent(body)), reads, grid)


# -- GridSample: the Metal target's rules (targets/metal/msl/sampling.py) -------------------


def _grid_axis_wgsl(plan: GridSamplePlan, j: int, ax: GridAxis) -> list[str]:
    """WGSL statements for spatial axis ``j``: its coordinate ``c{j}``, its taps' X offsets
    ``o{j}`` (-1: reads nothing) and weights ``w{j}`` (the Metal kernel's ``_axis_msl``)."""
    lo, hi, d = flit(ax.lo), flit(ax.hi), ax.size
    lines = [f"var c{j}: f32 = {ax.coord(f'f32(G[g + {ax.component}])')};"]
    if plan.mode == "nearest":
        lines.append(f"c{j} = round(c{j});")  # half to even
    if plan.padding == "border":
        lines.append(f"if (c{j} < {lo} || c{j} > {hi}) {{ c{j} = min(max(c{j}, 0.0f), {flit(d - 1)}); }}")
    elif plan.padding == "reflection" and ax.hi > ax.lo:
        span = flit(ax.hi - ax.lo)
        lines += [
            f"if (c{j} < {lo} || c{j} > {hi}) {{",
            f"    let dx{j} = select(c{j} - {hi}, {lo} - c{j}, c{j} < {lo});",
            f"    let n{j} = floor(dx{j} / {span}); let r{j} = dx{j} - n{j} * {span};",
            f"    c{j} = select({hi} - r{j}, {lo} + r{j}, (c{j} < {lo}) == (n{j} % 2.0f == 0.0f));",
            "}",
        ]
    elif plan.padding == "zeros":
        lines.append(f"c{j} = min(max(c{j}, {flit(-OUTSIDE)}), {flit(d + OUTSIDE)});")
    taps = len(plan.offsets)
    if plan.mode == "nearest":
        lines.append(f"let b{j} = i32(c{j});")
    else:
        lines.append(f"let f{j} = floor(c{j}); let u{j} = c{j} - f{j};")
        lines.append(f"let b{j} = i32(f{j}){plan.first};")
        lines.append(f"var w{j} = array<f32, {taps}>({', '.join(plan.weights(f'u{j}'))});")
    lines.append(f"var o{j}: array<i32, {taps}>;")
    if plan.padding == "zeros":
        fix = f"o{j}[i] = select(-1, k * {ax.stride}, k >= 0 && k < {d});"
    elif plan.padding == "border":
        fix = f"o{j}[i] = min(max(k, 0), {d - 1}) * {ax.stride};"
    elif (period := ax.reflect_period()) is None:
        fix = f"o{j}[i] = 0;"
    else:
        m, mirror = period
        fix = f"k = ((k % {m}) + {m}) % {m}; o{j}[i] = select(k, {mirror} - k, k >= {d}) * {ax.stride};"
    lines.append(f"for (var i: i32 = 0; i < {taps}; i++) {{ var k = b{j} + i; {fix} }}")
    return lines


@register("GridSample", check=check_grid_sample)
def lower_grid_sample(ctx: LowerContext, node: ir.Node, kernel: str, act: Activation | None) -> KernelSource:
    """One invocation per output element: each spatial axis's coordinate, taps and weights, then
    the sum over the taps' product (the Metal target's sampling rules 1-4)."""
    x, grid = inp(node, 0), inp(node, 1)
    plan = grid_sample_plan(ctx, node)
    assert not isinstance(plan, str)  # check_grid_sample admitted it
    rank, taps = len(plan.axes), len(plan.offsets)
    lines = [line for j, ax in enumerate(plan.axes) for line in _grid_axis_wgsl(plan, j, ax)]
    loops = " ".join(f"for (var t{j}: i32 = 0; t{j} < {taps}; t{j}++) {{" for j in range(rank))
    offset = " + ".join(f"o{j}[t{j}]" for j in range(rank))
    weight = " * ".join(f"w{j}[t{j}]" for j in range(rank)) if plan.mode != "nearest" else "1.0f"
    add = f"acc += {weight} * f32(X[xb + {offset}]);"
    if plan.padding == "zeros":
        add = f"if ({' && '.join(f'o{j}[t{j}] >= 0' for j in range(rank))}) {{ {add} }}"
    body = (
        f"""
let i_out = gx % OUT; let nc = gx / OUT;
let g = ((nc / C) * OUT + i_out) * {rank}; let xb = nc * IN;
"""
        + "\n".join(lines)
        + f"""
var acc: f32 = 0.0f;
{loops}
    {add}
{"}" * rank}
Y[gx] = T(acc);
"""
    )
    grid_size = (plan.count, 1, 1)
    constants = dict(OUT=plan.out_size, C=plan.channels, IN=plan.in_size)
    src = module(ctx, kernel, ["X", "G"], grid_size, constants, _indent(body))
    return KernelSource(kernel, src, [x, grid], grid_size)
