"""Small IR rewrite helpers shared by passes: constants, fresh names, value replacement, provenance."""

from __future__ import annotations

import json

import numpy as np
import onnx_ir as ir

FUSED_FROM_KEY = "mconv.fused_from"


def is_overridable(graph: ir.Graph, value: ir.Value, ir_version: int) -> bool:
    """An initializer that is also a graph input is a default a caller may override (IR >= 4).

    Before IR version 4 every initializer had to be listed as an input, so there it is a weight.
    """
    return ir_version >= 4 and value in graph.inputs


def upgrade_ir3(model: ir.Model) -> bool:
    """Raise an IR 3 model to IR 4, where initializers need not be listed as graph inputs.

    In IR 3 every initializer had to be an input, yet it was a weight; in IR 4 an initializer
    listed as an input is a default the caller may override. So the listed weights leave the
    inputs, and the model keeps meaning what it meant. Returns whether the model changed.
    """
    if (model.ir_version or 10) >= 4:
        return False
    graph = model.graph
    weights = [v for v in graph.inputs if v.is_initializer()]
    for value in weights:
        graph.inputs.remove(value)
    model.ir_version = 4
    return True


def constant_array(value: ir.Value | None, graph: ir.Graph, ir_version: int) -> np.ndarray | None:
    """The value as a numpy array when it is a constant (initializer or Constant node output)."""
    if value is None:
        return None
    if value.is_initializer() and value.const_value is not None:
        if is_overridable(graph, value, ir_version):
            return None
        return value.const_value.numpy()
    node = value.producer()
    if node is not None and node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
        return constant_node_array(node)
    return None


def constant_node_array(node: ir.Node) -> np.ndarray | None:
    """The value of a ``Constant`` node, whichever attribute holds it."""
    for key, attr in node.attributes.items():
        v = attr.value
        if key == "value":
            return v.numpy()
        if key == "value_float":
            return np.array(v, dtype=np.float32)
        if key == "value_floats":
            return np.array(list(v), dtype=np.float32)
        if key == "value_int":
            return np.array(v, dtype=np.int64)
        if key == "value_ints":
            return np.array(list(v), dtype=np.int64)
        if key == "value_string":
            return np.array(v.encode() if isinstance(v, str) else v, dtype=object)
        if key == "value_strings":
            return np.array([s.encode() if isinstance(s, str) else s for s in v], dtype=object)
    return None


def taken_names(graph: ir.Graph) -> set[str]:
    names = {v.name for v in graph.inputs if v.name}
    names.update(graph.initializers)
    for node in ir.traversal.RecursiveGraphIterator(graph):
        names.update(o.name for o in node.outputs if o.name)
        if node.name:
            names.add(node.name)
    return names


def fresh_name(base: str, taken: set[str]) -> str:
    """``base``, or ``base_1``, ``base_2``, ... whichever is not taken; the result is reserved."""
    name, i = base, 0
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    taken.add(name)
    return name


def add_initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    tensor = ir.tensor(array, name=name)
    value = ir.Value(
        name=name, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype), const_value=tensor
    )
    graph.register_initializer(value)
    return value


def name_of(value: ir.Value) -> str:
    """The name of a value of a graph: onnx_ir names every value a graph takes in (a loaded
    model's values have their file's names, "" for an absent optional output), so None here
    is a value outside any graph, a bug rather than bad input."""
    name = value.name
    assert name is not None, "a value outside any graph"
    return name


def tensor_of(value: ir.Value) -> ir.TensorProtocol:
    """The tensor of a graph initializer: onnx_ir registers an initializer only with one."""
    tensor = value.const_value
    assert tensor is not None, f"initializer {value.name} without a tensor"
    return tensor


def replace_value(old: ir.Value, new: ir.Value) -> None:
    """Point every use of ``old`` (graph outputs included) at ``new``; ``new`` takes the output's name.

    Keeping the name keeps a graph's interface stable for callers that feed and fetch by name.
    """
    was_output = old.is_graph_output()
    name = old.name
    ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
    if was_output:
        old.name = None
        new.name = name


def add_fused_from(node: ir.Node, *sources: ir.Node) -> None:
    """Record in ``node``'s metadata the names of the original nodes it now computes."""
    names: list[str] = []
    for src in (node, *sources):
        prior = src.metadata_props.get(FUSED_FROM_KEY)
        if prior:
            names.extend(json.loads(prior))
        elif src.name:
            names.append(src.name)
    node.metadata_props[FUSED_FROM_KEY] = json.dumps(list(dict.fromkeys(names)))


def attr_values(node: ir.Node) -> dict:
    """Attributes as Python values (tensors as numpy, graphs as ir.Graph) for op kernels."""
    out = {}
    for key, attr in node.attributes.items():
        if attr.is_ref():
            continue
        v = attr.value
        if attr.type == ir.AttributeType.TENSOR:
            v = v.numpy()
        elif attr.type in (ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS):
            v = list(v)
        out[key] = v
    return out
