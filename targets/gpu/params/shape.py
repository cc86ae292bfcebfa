"""Shape-family parameters: strides, Slice, Pad, DepthToSpace views, Resize taps per axis."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from mconv.targets.gpu.ops import LowerContext
from mconv.targets.gpu.values import required


def strides(shape: list[int]) -> list[int]:
    out, step = [0] * len(shape), 1
    for axis in reversed(range(len(shape))):
        out[axis] = step
        step *= shape[axis]
    return out


def const_ints(v: ir.Value | None) -> list[int] | None:
    arr = LowerContext.const(v)
    return None if arr is None else [int(a) for a in arr.ravel()]


def slice_params(ctx: LowerContext, node: ir.Node) -> tuple[list[int], list[int]] | str:
    """(start per axis, step per axis) of a Slice over its input, or why it cannot be lowered."""
    xs = ctx.shape(required(node.inputs[0]))
    rank = len(xs)
    if ctx.opset < 10:
        starts = list(node.attributes.get_ints("starts", []))
        ends = list(node.attributes.get_ints("ends", []))
        axes = list(node.attributes.get_ints("axes", list(range(len(starts)))))
        steps = [1] * len(starts)
    else:
        ins = list(node.inputs) + [None] * 5
        c_starts, c_ends = const_ints(ins[1]), const_ints(ins[2])
        c_axes = const_ints(ins[3]) if ins[3] is not None else None
        c_steps = const_ints(ins[4]) if ins[4] is not None else None
        if c_starts is None or c_ends is None or (ins[3] is not None and c_axes is None):
            return "starts, ends or axes not constant"
        if ins[4] is not None and c_steps is None:
            return "steps not constant"
        starts, ends = c_starts, c_ends
        axes = c_axes if c_axes is not None else list(range(len(starts)))
        steps = c_steps if c_steps is not None else [1] * len(starts)
    begin, step = [0] * rank, [1] * rank
    for a, st, en, sp in zip(axes, starts, ends, steps):
        a = a + rank if a < 0 else a
        if sp == 0:
            return "a step of 0"
        first, _, stride = slice(st, en, sp).indices(xs[a])
        begin[a], step[a] = first, stride
    return begin, step


def depth_space_view(node: ir.Node, shape: list[int]) -> tuple[list[int], list[int]]:
    """DepthToSpace (DCR or CRD) / SpaceToDepth of an NCHW input as the 6-D transpose of the ONNX
    definition: the copy's output shape and the input strides it reads with (Metal and WebGPU)."""
    n, c, h, w = shape
    bs = node.attributes.get_int("blocksize")
    if node.op_type == "DepthToSpace":
        if node.attributes.get_string("mode", "DCR") == "DCR":
            shape6, perm = [n, bs, bs, c // (bs * bs), h, w], [0, 3, 4, 1, 5, 2]
        else:
            shape6, perm = [n, c // (bs * bs), bs, bs, h, w], [0, 1, 4, 2, 5, 3]
    else:
        shape6, perm = [n, c, h // bs, bs, w // bs, bs], [0, 3, 5, 1, 2, 4]
    st = strides(shape6)
    return [shape6[p] for p in perm], [st[p] for p in perm]


def pad_params(ctx: LowerContext, node: ir.Node) -> tuple[list[int], str, float] | str:
    """(begin pads per axis, mode, constant value) or why not."""
    rank = len(ctx.shape(required(node.inputs[0])))
    if ctx.opset < 11:
        pads = list(node.attributes.get_ints("pads", [0] * (2 * rank)))
        value = node.attributes.get_float("value", 0.0)
    else:
        c_pads = const_ints(node.inputs[1]) if len(node.inputs) > 1 else None
        if c_pads is None:
            return "pads not constant"
        pads = c_pads
        value = 0.0
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            cv = LowerContext.const(node.inputs[2])
            if cv is None or cv.size > 1:
                return "constant_value not a constant"
            value = float(cv.ravel()[0]) if cv.size else 0.0
        if len(node.inputs) > 3 and node.inputs[3] is not None:
            axes = const_ints(node.inputs[3])
            if axes is None:
                return "axes not constant"
            full = [0] * (2 * rank)
            for i, a in enumerate(axes):
                a = a + rank if a < 0 else a
                full[a], full[a + rank] = pads[i], pads[i + len(axes)]
            pads = full
    mode = node.attributes.get_string("mode", "constant")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        return f"mode {mode}"
    return pads[:rank], mode, value


def check_pad(ctx: LowerContext, node: ir.Node) -> str | None:
    got = pad_params(ctx, node)
    return got if isinstance(got, str) else None


def resize_axes(ctx: LowerContext, node: ir.Node):
    """The reference executor's per-axis plan [(axis, weights n_out x n_in, extrapolated)]."""
    from mconv.engines.reference.executor import attr_to_python
    from mconv.engines.reference.ops import shape as ref

    xs = ctx.shape(required(node.inputs[0]))
    attrs = {k: attr_to_python(a) for k, a in node.attributes.items()}
    inputs: list = [np.broadcast_to(np.float32(0), xs)]
    for v in node.inputs[1:]:
        if v is None:
            inputs.append(None)
            continue
        arr = LowerContext.const(v)
        if arr is None:
            raise ValueError("scales, sizes or roi not constant")
        inputs.append(arr)

    class _Ctx:
        opset = ctx.opset

    if node.op_type == "Upsample":
        a = ref._upsample_attrs(attrs)
        old = True
    else:
        a = ref._resize_attrs(attrs, _Ctx)
        old = ctx.opset < 11
    return ref._resize_plan(inputs, a, _Ctx, old_style=old), a


def resize_taps(w: np.ndarray) -> tuple[int, list[int], list[float]]:
    """One resized axis's (output x input) weights as a fixed number of taps per output: (taps,
    input indices, weights), row after row, padded with index 0 and weight 0 (metal and webgpu)."""
    taps = max(1, int((w != 0).sum(axis=1).max()))
    idx: list[int] = []
    wts: list[float] = []
    for row in w:
        nz = np.flatnonzero(row)[:taps]
        idx += [int(i) for i in nz] + [0] * (taps - len(nz))
        wts += [float(row[i]) for i in nz] + [0.0] * (taps - len(nz))
    return taps, idx, wts


def check_resize(ctx: LowerContext, node: ir.Node) -> str | None:
    try:
        plan, _ = resize_axes(ctx, node)
    except Exception as exc:  # noqa: BLE001 - the reason is reported
        return str(exc).removeprefix("Resize: ")[:80] or type(exc).__name__
    if len(plan) > 4:
        return f"{len(plan)} resized axes"
    return None
