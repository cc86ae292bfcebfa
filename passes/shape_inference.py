"""shape-inference: fill in value shapes and dtypes with ONNX's shape inference."""

from __future__ import annotations

from dataclasses import dataclass

import onnx
import onnx_ir as ir
from mconv.passes.base import Pass, PassContext, PassReport, register_pass

_PROTO_LIMIT = (1 << 31) - (1 << 20)  # protobuf's 2 GiB limit, with room for the envelope


def infer_on_stripped_copy(
    model: ir.Model, *, keep_bytes: int, strict: bool, data_prop: bool
) -> onnx.ModelProto | None:
    """Run ``onnx.shape_inference`` on the model with large initializers reduced to typed inputs.

    Inference needs only the types and shapes of weights; small ones (shape tensors) stay so that
    data propagation can see their values. The model is restored whatever happens. Returns None
    when even the stripped proto would exceed protobuf's 2 GiB limit.
    """
    graph = model.graph
    saved = {name: v.const_value for name, v in graph.initializers.items()}
    inputs_before = list(graph.inputs)
    stripped = []
    try:
        for name, value in list(graph.initializers.items()):
            tensor = value.const_value
            if tensor is None or tensor.nbytes <= keep_bytes:
                continue
            value.shape = value.shape or ir.Shape(tensor.shape.numpy())
            value.dtype = value.dtype or tensor.dtype
            graph.initializers.pop(name)
            value.const_value = None
            if value not in graph.inputs:
                graph.inputs.append(value)
            stripped.append((name, value))
        proto = ir.serde.serialize_model(model)
        if proto.ByteSize() > _PROTO_LIMIT:
            return None
        return onnx.shape_inference.infer_shapes(
            proto, check_type=False, strict_mode=strict, data_prop=data_prop
        )
    finally:
        for name, value in stripped:
            value.const_value = saved[name]
            graph.register_initializer(value)
        graph.inputs.clear()
        graph.inputs.extend(inputs_before)


def merge_inferred(model: ir.Model, inferred: onnx.ModelProto) -> int:
    """Copy inferred shapes/dtypes onto values that lack them; returns how many values changed."""
    inferred_model = ir.serde.deserialize_model(inferred)
    changed = 0
    for graph, inferred_graph in zip(model.graphs(), inferred_model.graphs()):
        known = ir.convenience.create_value_mapping(inferred_graph)
        for name, value in ir.convenience.create_value_mapping(graph).items():
            other = known.get(name)
            if other is None:
                continue
            hit = False
            if other.type is not None and value.type is None:  # the type, not only the dtype:
                value.type = other.type  # setting .dtype would make a sequence a tensor
                hit = True
            if other.shape is not None and (value.shape is None or _less_known(value.shape, other.shape)):
                value.shape = other.shape
                hit = True
            changed += hit
    return changed


def _less_known(shape: ir.Shape, other: ir.Shape) -> bool:
    if len(shape) != len(other):
        return False
    mine = sum(isinstance(d, int) for d in shape)
    theirs = sum(isinstance(d, int) for d in other)
    return theirs > mine


@register_pass("shape-inference")
class ShapeInference(Pass):
    """Fill value shapes and dtypes from ONNX shape inference.

    1. Initializers larger than ``keep_bytes`` are replaced, for the inference call only, by typed
       graph inputs, so the proto stays small (models over 2 GB work); the model is restored.
    2. A value without a dtype takes the inferred dtype; a shape is replaced only by a shape of
       the same rank with more known dimensions (inference never erases what was known).
    3. If inference fails (an op it does not know, inconsistent shapes), the model is left
       unchanged and the reason is a note; this pass never fails a pipeline.
    """

    @dataclass
    class Config:
        keep_bytes: int = 1024  # initializers up to this size stay visible to data propagation
        strict: bool = False
        data_prop: bool = True

    def run(self, model: ir.Model, config: Config, ctx: PassContext) -> PassReport:
        try:
            inferred = infer_on_stripped_copy(
                model, keep_bytes=config.keep_bytes, strict=config.strict, data_prop=config.data_prop
            )
        except Exception as exc:  # onnx raises InferenceError, ValidationError, RuntimeError...
            return self.report(False, notes=[f"shape inference failed, model unchanged: {str(exc)[:200]}"])
        if inferred is None:
            return self.report(False, notes=["skipped: the model without its weights is still over 2 GiB"])
        changed = merge_inferred(model, inferred)
        return self.report(changed > 0, notes=[f"{changed} values got shapes or dtypes"])
