"""Shape inference on a model of any size: ONNX's inference run on a copy whose large
initializers are reduced to typed inputs, and its results merged back onto values that lack them."""

from __future__ import annotations

import onnx
import onnx_ir as ir

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
