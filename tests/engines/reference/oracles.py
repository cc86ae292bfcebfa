"""Independent oracles for op tests: one-node ONNX models run by onnxruntime or onnx.reference."""

from __future__ import annotations

import numpy as np
import onnx
from mconv.engines.reference.ops import OpContext, lookup
from onnx import helper


def one_node_model(
    op_type: str, inputs: list, attrs: dict, n_outputs: int = 1, opset: int = 21, domain: str = ""
) -> onnx.ModelProto:
    """A model with one node; ``None`` inputs become empty names (omitted optionals)."""
    names, vis = [], []
    for i, a in enumerate(inputs):
        if a is None:
            names.append("")
            continue
        names.append(f"in{i}")
        vis.append(helper.make_tensor_value_info(f"in{i}", helper.np_dtype_to_tensor_dtype(a.dtype), a.shape))
    outs = [f"out{k}" for k in range(n_outputs)]
    node = helper.make_node(op_type, names, outs, domain=domain, **attrs)
    graph = helper.make_graph([node], "one_node", vis, [helper.make_empty_tensor_value_info(o) for o in outs])
    opsets = [helper.make_opsetid("", opset)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def run_ort(op_type: str, inputs: list, attrs: dict, n_outputs: int = 1, opset: int = 21) -> list[np.ndarray]:
    import onnxruntime as ort

    model = one_node_model(op_type, inputs, attrs, n_outputs, opset)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {f"in{i}": a for i, a in enumerate(inputs) if a is not None}
    return sess.run(None, feeds)


def run_onnx_reference(
    op_type: str, inputs: list, attrs: dict, n_outputs: int = 1, opset: int = 21
) -> list[np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    model = one_node_model(op_type, inputs, attrs, n_outputs, opset)
    feeds = {f"in{i}": a for i, a in enumerate(inputs) if a is not None}
    return ReferenceEvaluator(model).run(None, feeds)


def run_mconv(
    op_type: str, inputs: list, attrs: dict, opset: int = 21, n_outputs: int | None = None
) -> list[np.ndarray]:
    """The registered forward; ``n_outputs`` tells the op how many outputs the node declares."""
    opdef = lookup(op_type)
    assert opdef is not None, f"{op_type} is not registered"
    ctx = OpContext(opset=opset)
    if n_outputs is not None:
        ctx.num_outputs = n_outputs
    return list(opdef.forward(list(inputs), dict(attrs), ctx))
