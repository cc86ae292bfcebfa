"""The WebGPU plan: the Metal target's plan (:mod:`mconv.targets.metal.plan`) with WGSL kernels.

Rules:

1. The model is prepared exactly as for Metal (:func:`mconv.targets.metal.plan.prepare`: static
   batch, shape arithmetic folded, BatchNorm folded into convolutions, shapes inferred) and
   activations fuse by the same rule (``_fusions``). Buffers, bindings and grids follow the
   Metal plan's rules 4 and 5, so ``webgpu_plan.json`` has the same schema as
   ``metal_plan.json`` (``dtype`` is ``half`` or ``float``).
2. Every node is a WGSL kernel (a rule of :data:`mconv.targets.webgpu.wgsl.LOWER`), a view
   (Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout: the output shares the input's
   buffer) or unsupported; all unsupported nodes are named in one UnsupportedError.
3. A layer binds at most :data:`~mconv.targets.webgpu.wgsl.MAX_BINDINGS` storage buffers (the
   limit every WebGPU device has); Concat of more inputs is several kernels, each writing its
   slice of the output.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx_ir as ir
from mconv.errors import InputError, UnsupportedError
from mconv.irio import real_inputs
from mconv.targets.metal.kernels import LowerContext
from mconv.targets.metal.plan import (
    _FLOATS,
    VIEWS,
    Buffer,
    Layer,
    MetalPlan,
    _fusions,
    _opset,
    _safe,
    _static_shape,
    prepare,
)
from mconv.targets.webgpu.wgsl import CHECKS, LOWER, MAX_BINDINGS

__all__ = ["build_plan", "prepare", "supported_ops"]


def supported_ops() -> list[str]:
    return sorted({*LOWER, *VIEWS})


def _unsupported_reason(ctx: LowerContext, node: ir.Node) -> str | None:
    """None when the node lowers (a kernel or a view); else "" (unknown op) or why not."""
    if node.domain not in ("", "ai.onnx") or (node.op_type not in LOWER and node.op_type not in VIEWS):
        return ""
    if node.op_type == "Dropout" and len(node.outputs) > 1 and node.outputs[1].uses():
        return "mask output"
    if node.op_type in VIEWS:
        return None
    if any(_static_shape(v) is None for v in node.inputs[:1] if v is not None):
        return "input shape not static"
    for v in [*[v for v in node.inputs if v is not None and v.const_value is None], *node.outputs]:
        if (
            v is not None
            and v.dtype is not None
            and v.dtype not in _FLOATS
            and (v.uses() or v.is_graph_output())
        ):
            return f"{v.dtype.name.lower()} values (the webgpu target computes floats)"
    x = node.inputs[0]
    if node.op_type in ("Conv", "MaxPool", "AveragePool") and (x is None or len(x.shape or []) not in (3, 4)):
        return "only 1-D and 2-D windows"
    check = CHECKS.get(node.op_type)
    return check(ctx, node) if check is not None else None


def build_plan(model: ir.Model, options: Mapping | None = None) -> MetalPlan:
    """Lower a prepared model to a plan whose ``sources`` are WGSL modules (rules 2, 3)."""
    options = dict(options or {})
    precision = options.get("precision") or "fp32"
    if precision not in ("fp16", "fp32"):
        raise InputError(f"precision '{precision}'", where="--precision", hint="choose fp16 or fp32")
    storage = "half" if precision == "fp16" else "float"
    ctx = LowerContext(storage, _opset(model))
    graph = model.graph
    graph.sort()
    unsupported: list[tuple[str, str]] = []
    for node in graph:
        reason = _unsupported_reason(ctx, node)
        if reason is not None:
            label = node.op_type if reason == "" else f"{node.op_type}: {reason}"
            unsupported.append((node.name or f"#{len(unsupported)}", label))
    if unsupported:
        raise UnsupportedError(
            unsupported, what="node", hint="the webgpu target lowers " + ", ".join(supported_ops())
        )

    fused = _fusions(model, ctx)
    absorbed = {id(n) for _, nodes in fused.values() for n in nodes}
    buffers: list[Buffer] = []
    by_value: dict[str, int] = {}

    def buffer_for(value: ir.Value, kind: str) -> int:
        if value.name in by_value:
            return by_value[value.name]
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
    )
