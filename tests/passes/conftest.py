"""Helpers for pass tests: build small ONNX models and run them in onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from mconv.irio import from_proto, to_proto
from onnx import helper


def _build(nodes, inputs, outputs, initializers=(), opset=17, ir_version=8):
    """A model from onnx.helper parts; inputs/outputs as (name, elem_type, shape)."""
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [onnx.numpy_helper.from_array(np.asarray(a), name) for name, a in initializers],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)
    if all(s is not None for _, _, s in list(inputs) + list(outputs)):
        onnx.checker.check_model(model)  # the checker wants a shape on every declared input/output
    return from_proto(model)


def _run_ort(model, feeds):
    proto = model if isinstance(model, onnx.ModelProto) else to_proto(model)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


@pytest.fixture
def build():
    return _build


@pytest.fixture
def run_ort():
    return _run_ort
