"""shape-inference: value shapes and dtypes filled in; large weights never enter the proto."""

from __future__ import annotations

import mconv.passes as P
import numpy as np
import onnx_ir as ir
from onnx import TensorProto, helper


def _model(build, w):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    return build(
        nodes, [("x", TensorProto.FLOAT, [2, w.shape[0]])], [("y", TensorProto.FLOAT, ["a", "b"])], [("w", w)]
    )


def test_shape_inference_fills_intermediate_shapes(build):
    model = _model(build, np.zeros((4, 5), np.float32))
    h = next(iter(model.graph)).outputs[0]
    assert h.shape is None
    model, (report,) = P.run_pipeline(model, P.parse_spec("shape-inference"))
    assert report.modified
    assert h.dtype == ir.DataType.FLOAT and list(h.shape) == [2, 5]
    assert list(model.graph.outputs[0].shape) == [2, 5]


def test_shape_inference_keeps_weights_and_interface(build):
    w = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)  # 16 KiB: stripped during inference
    model = _model(build, w)
    model, _ = P.run_pipeline(model, P.parse_spec("shape-inference"))
    np.testing.assert_array_equal(model.graph.initializers["w"].const_value.numpy(), w)
    assert [v.name for v in model.graph.inputs] == ["x"]
    assert list(model.graph.outputs[0].shape) == [2, 64]


def test_shape_inference_failure_is_a_note_not_an_error(build):
    model = build(
        [helper.make_node("Relu", ["x"], ["y"])],
        [("x", TensorProto.FLOAT, [2])],
        [("y", TensorProto.FLOAT, [2])],
    )
    bad = ir.Node("", "MatMul", [model.graph.outputs[0], model.graph.outputs[0]], name="bad")  # [2]x[2] ok
    bad2 = ir.Node("", "Concat", [bad.outputs[0]], attributes=[ir.AttrInt64("axis", 5)], name="bad2")
    model.graph.extend([bad, bad2])
    model.graph.outputs.append(bad2.outputs[0])
    bad2.outputs[0].name = "z"
    model, (report,) = P.run_pipeline(model, P.parse_spec("shape-inference(strict=True)"))
    assert not report.modified and "failed" in report.notes[0]
