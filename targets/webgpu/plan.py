"""The webgpu target's plan: the GPU planner (:mod:`mconv.targets.gpu.plan`) with WGSL kernels.

Rules:

1. The model is prepared as for every GPU target (:func:`mconv.targets.gpu.plan.prepare`:
   static batch, shape arithmetic folded, BatchNorm folded into convolutions, shapes inferred)
   and activations fuse by the planner's rule 3. Buffers, bindings and grids follow its rules
   4 and 5, so ``webgpu_plan.json`` has the same schema as ``metal_plan.json`` (``dtype`` is
   ``half`` or ``float``).
2. Every node is a WGSL kernel (a rule of :data:`mconv.targets.webgpu.wgsl.LOWER`), a view
   (Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout: the output shares the input's
   buffer) or unsupported; all unsupported nodes are named in one UnsupportedError
   (:func:`mconv.targets.gpu.plan.refuse_unsupported`, the planner's rule 2). Kernels compute
   floats: integer and bool values are held as floats (bool as 0/1) by the planner's rule 3:
   exact for integers up to 2^24 in f32 storage and 2^11 in f16 storage; only the kernels
   exact on them take them (data movement, comparisons, logic, Where, Cast,
   QuantizeLinear/DequantizeLinear, Add/Sub/Mul/Min/Max: :data:`~mconv.targets.gpu.ops.INTEGER_OPS`),
   any other node reading or writing them is refused with the reason, and so is an integer
   weight beyond the exact range (:func:`~mconv.targets.gpu.plan.check_integer_constant`).
   Integer and bool graph inputs and outputs are converted at the buffer boundary by the runner.
3. A layer binds at most :data:`~mconv.targets.webgpu.wgsl.MAX_BINDINGS` storage buffers (the
   limit every WebGPU device has); Concat of more inputs is several kernels, each writing its
   slice of the output.
4. No weight buffer is larger than :data:`MAX_BINDING_BYTES` (128 MiB, WebGPU's default
   ``maxStorageBufferBindingSize``, what lavapipe and a browser grant): a Gemm or 2-D MatMul
   whose constant B would be is split over its output columns into Gemms of at most that much
   weight each, their outputs joined by a Concat (AlexNet's fc6, 9216 x 4096 f32 = 144 MiB,
   becomes two); activations never exceed it in the models here, and a buffer that does is
   refused at load by the runner in one line.
5. Storage follows the planner's rule 6: f16 for ``precision`` fp16, except that a graph which
   quantizes computed values is planned in f32 and the plan's ``notes`` say so.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx_ir as ir
from mconv.targets.gpu.ops import LowerContext
from mconv.targets.gpu.plan import VIEWS, Dialect, GpuPlan, prepare, static_shape
from mconv.targets.gpu.plan import build_plan as build_plan_for
from mconv.targets.webgpu.wgsl import CHECKS, LOWER, MAX_BINDINGS

__all__ = ["MAX_BINDING_BYTES", "WGSL", "build_plan", "prepare", "split_large_weights", "supported_ops"]

MAX_BINDING_BYTES = 128 << 20


def _initializer(name: str, array: np.ndarray) -> ir.Value:
    array = np.ascontiguousarray(array)
    tensor = ir.tensor(array, name=name)
    return ir.Value(
        name=name, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype), const_value=tensor
    )


def split_large_weights(model: ir.Model, item: int, limit: int | None = None) -> int:
    """Rule 4: split every Gemm / 2-D MatMul whose constant B exceeds ``limit`` bytes
    (default :data:`MAX_BINDING_BYTES`) at ``item`` bytes per element; returns how many nodes
    were split."""
    limit = limit or MAX_BINDING_BYTES
    graph = model.graph
    split = 0
    for node in list(graph):
        if node.op_type not in ("Gemm", "MatMul") or node.domain not in ("", "ai.onnx"):
            continue
        a, b = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
        y = node.outputs[0]
        if a is None or b is None or b.const_value is None or y is None:
            continue
        bw = b.const_value.numpy()
        ys = static_shape(y)
        if bw.ndim != 2 or bw.size * item <= limit or ys is None or len(ys) != 2:
            continue
        if node.op_type == "MatMul" and len(static_shape(a) or []) != 2:
            continue
        trans_b = node.attributes.get_int("transB", 0) if node.op_type == "Gemm" else 0
        n = bw.shape[0] if trans_b else bw.shape[1]
        k = bw.size // n
        cols = max(1, limit // (k * item))
        c = node.inputs[2] if node.op_type == "Gemm" and len(node.inputs) > 2 else None
        cw = c.const_value.numpy() if c is not None and c.const_value is not None else None
        if c is not None and cw is None:
            continue  # a computed C: left whole (the runner says so if it does not fit)
        pieces, outs = [], []
        for i, lo in enumerate(range(0, n, cols)):
            hi = min(n, lo + cols)
            chunk = bw[lo:hi] if trans_b else bw[:, lo:hi]
            bv = _initializer(f"{b.name}__cols{lo}", chunk)
            graph.register_initializer(bv)
            inputs: list[ir.Value | None] = [a, bv]
            if cw is not None and c is not None:
                cc = cw[..., lo:hi] if cw.ndim >= 1 and cw.shape[-1] == n else cw
                cv = _initializer(f"{c.name}__cols{lo}", cc)
                graph.register_initializer(cv)
                inputs.append(cv)
            out = ir.Value(name=f"{y.name}__cols{lo}", shape=ir.Shape([ys[0], hi - lo]), type=y.type)
            attrs = list(node.attributes.values()) if node.op_type == "Gemm" else []
            pieces.append(
                ir.Node("", node.op_type, inputs, attrs, outputs=[out], name=f"{node.name}__part{i}")
            )
            outs.append(out)
        joined = ir.Value(name=str(y.name), shape=ir.Shape(ys), type=y.type)
        concat = ir.Node(
            "", "Concat", outs, [ir.AttrInt64("axis", 1)], outputs=[joined], name=f"{node.name}__join"
        )
        ir.convenience.replace_nodes_and_values(graph, node, [node], [*pieces, concat], [y], [joined])
        split += 1
    return split


def supported_ops() -> list[str]:
    return sorted({*LOWER, *VIEWS})


def _split_for(model: ir.Model, storage: str) -> None:
    split_large_weights(model, 2 if storage == "half" else 4)


WGSL = Dialect(
    target="webgpu",
    lower=LOWER,
    checks=CHECKS,
    context=LowerContext,
    max_bindings=MAX_BINDINGS,
    binding_hint=f"WebGPU binds at most {MAX_BINDINGS} storage buffers per kernel",
    default_precision="fp32",
    before=_split_for,
)


def build_plan(model: ir.Model, options: Mapping | None = None) -> GpuPlan:
    """Lower a prepared model to a plan whose ``sources`` are WGSL modules (rules 2-5)."""
    return build_plan_for(model, WGSL, options)
