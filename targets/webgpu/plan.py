"""The WebGPU plan: the Metal target's plan (:mod:`mconv.targets.metal.plan`) with WGSL kernels.

Rules:

1. The model is prepared exactly as for Metal (:func:`mconv.targets.metal.plan.prepare`: static
   batch, shape arithmetic folded, BatchNorm folded into convolutions, shapes inferred) and
   activations fuse by the same rule (``_fusions``). Buffers, bindings and grids follow the
   Metal plan's rules 4 and 5, so ``webgpu_plan.json`` has the same schema as
   ``metal_plan.json`` (``dtype`` is ``half`` or ``float``).
2. Every node is a WGSL kernel (a rule of :data:`mconv.targets.webgpu.wgsl.LOWER`), a view
   (Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout: the output shares the input's
   buffer) or unsupported; all unsupported nodes are named in one UnsupportedError
   (:func:`mconv.targets.metal.plan.refuse_unsupported`, the Metal plan's rule). Kernels compute
   floats: integer and bool values are held as floats (bool as 0/1) by the Metal plan's rule 3,
   shared: exact for integers up to 2^24 in f32 storage and 2^11 in f16 storage; only the
   kernels exact on them take them (data movement, comparisons, logic, Where, Cast,
   QuantizeLinear/DequantizeLinear, Add/Sub/Mul/Min/Max: the Metal target's ``INTEGER_OPS``),
   any other node reading or writing them is refused with the reason, and so is an integer
   weight beyond the exact range (:func:`~mconv.targets.metal.plan.check_integer_constant`).
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
5. Storage follows the Metal plan's rule 6: f16 for ``precision`` fp16, except that a graph which
   quantizes computed values is planned in f32 and the plan's ``notes`` say so.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx_ir as ir
from mconv.errors import InputError, UnsupportedError
from mconv.irio import real_inputs
from mconv.targets.metal.kernels import LowerContext
from mconv.targets.metal.plan import (
    VIEWS,
    Buffer,
    Layer,
    MetalPlan,
    _fusions,
    _opset,
    _safe,
    _static_shape,
    check_integer_constant,
    prepare,
    refuse_unsupported,
    storage_for,
)
from mconv.targets.webgpu.wgsl import CHECKS, LOWER, MAX_BINDINGS

__all__ = ["MAX_BINDING_BYTES", "build_plan", "prepare", "split_large_weights", "supported_ops"]

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
        ys = _static_shape(y)
        if bw.ndim != 2 or bw.size * item <= limit or ys is None or len(ys) != 2:
            continue
        if node.op_type == "MatMul" and len(_static_shape(a) or []) != 2:
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


def build_plan(model: ir.Model, options: Mapping | None = None) -> MetalPlan:
    """Lower a prepared model to a plan whose ``sources`` are WGSL modules (rules 2, 3)."""
    options = dict(options or {})
    storage, notes = storage_for(model, options.get("precision") or "fp32")  # the Metal plan's rule 6
    ctx = LowerContext(storage, _opset(model))
    split_large_weights(model, 2 if storage == "half" else 4)
    graph = model.graph
    graph.sort()
    refuse_unsupported(graph, ctx, LOWER, CHECKS, "webgpu")

    fused = _fusions(model, ctx)
    absorbed = {id(n) for _, nodes in fused.values() for n in nodes}
    buffers: list[Buffer] = []
    by_value: dict[str, int] = {}

    def buffer_for(value: ir.Value, kind: str) -> int:
        if value.name in by_value:
            return by_value[value.name]
        if kind == "weight":
            check_integer_constant(value, ctx.storage)
        shape = _static_shape(value)
        if shape is None:
            raise InputError(
                "value has no static shape", where=f"value '{value.name}'", hint="check the model's shapes"
            )
        buffers.append(
            Buffer(len(buffers), str(value.name), kind, shape, int(np.prod(shape)) if shape else 1)
        )
        by_value[str(value.name)] = len(buffers) - 1
        return by_value[str(value.name)]

    inputs = [
        {"name": v.name, "buffer": buffer_for(v, "input"), "shape": _static_shape(v)}
        for v in real_inputs(graph)
    ]
    layers: list[Layer] = []
    sources: dict[str, str] = {}
    for node in graph:
        if id(node) in absorbed:
            continue
        if node.op_type in VIEWS:
            src, view = node.inputs[0], node.outputs[0]
            assert src is not None and view is not None
            if src.name not in by_value:
                buffer_for(src, "weight" if src.const_value is not None else "activation")
            by_value[str(view.name)] = by_value[str(src.name)]
            continue
        act, extra = fused.get(id(node), (None, []))
        kernel = f"L{len(layers)}_{_safe(node.op_type)}"
        try:
            lowered = LOWER[node.op_type](ctx, node, kernel, act)
        except InputError as exc:
            if exc.where is None:
                exc.where = f"node '{node.name}'"
            raise
        for ks in lowered if isinstance(lowered, list) else [lowered]:
            out_value = ks.output or (extra[-1].outputs[0] if extra else node.outputs[0])
            if len(ks.reads) + 1 > MAX_BINDINGS:
                raise UnsupportedError(
                    [(str(node.name), node.op_type)],
                    what="node",
                    hint=f"WebGPU binds at most {MAX_BINDINGS} storage buffers per kernel",
                )
            reads = [buffer_for(v, "weight" if v.const_value is not None else "activation") for v in ks.reads]
            out = buffer_for(out_value, "activation")
            layers.append(
                Layer(
                    kernel=ks.name,
                    op=node.op_type if act is None else f"{node.op_type}+{act.kind}",
                    nodes=[str(node.name), *[str(n.name) for n in extra]],
                    bindings=[*reads, out],
                    binding_names=[*[str(v.name) for v in ks.reads], str(out_value.name)],
                    grid=list(ks.grid),
                    threadgroup=list(ks.threadgroup),
                )
            )
            sources[ks.name] = ks.source
    outputs = []
    for v in graph.outputs:
        if v.name not in by_value:
            raise InputError(
                "graph output is not computed by any kernel",
                where=f"output '{v.name}'",
                hint="the webgpu target needs outputs computed from the inputs",
            )
        outputs.append({"name": v.name, "buffer": by_value[str(v.name)], "shape": _static_shape(v)})
    return MetalPlan(
        model_name=options.get("model_name") or graph.name or "Model",
        dtype=storage,
        buffers=buffers,
        layers=layers,
        inputs=inputs,
        outputs=outputs,
        batch=int(options.get("batch") or 1),
        sources=sources,
        notes=notes,
    )
