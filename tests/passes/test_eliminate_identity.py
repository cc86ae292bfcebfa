"""eliminate-identity: Identity and inference Dropout go; output names stay stable."""

from __future__ import annotations

import mconv.passes as P
import numpy as np
from onnx import TensorProto, helper


def test_identity_and_dropout_removed_outputs_equal(build, run_ort):
    nodes = [
        helper.make_node("Identity", ["x"], ["a"]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("Dropout", ["b"], ["c"], ratio=0.5),
        helper.make_node("Sigmoid", ["c"], ["y"]),
    ]
    model = build(
        nodes, [("x", TensorProto.FLOAT, [3])], [("y", TensorProto.FLOAT, [3])], opset=9, ir_version=4
    )
    x = np.float32([-1, 0.5, 2])
    expected = run_ort(model, {"x": x})["y"]
    model, (report,) = P.run_pipeline(model, P.parse_spec("eliminate-identity"))
    assert [n.op_type for n in model.graph] == ["Relu", "Sigmoid"]
    assert (report.nodes_before, report.nodes_after) == (4, 2)
    np.testing.assert_array_equal(run_ort(model, {"x": x})["y"], expected)


def test_graph_output_name_survives_elimination(build, run_ort):
    nodes = [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Identity", ["h"], ["y"])]
    model = build(nodes, [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])])
    model, _ = P.run_pipeline(model, P.parse_spec("eliminate-identity"))
    assert [n.op_type for n in model.graph] == ["Relu"] and model.graph.outputs[0].name == "y"
    np.testing.assert_array_equal(run_ort(model, {"x": np.float32([-2, 2])})["y"], [0, 2])


def test_identity_from_graph_input_to_output_is_kept(build):
    model = build(
        [helper.make_node("Identity", ["x"], ["y"])],
        [("x", TensorProto.FLOAT, [2])],
        [("y", TensorProto.FLOAT, [2])],
    )
    model, (report,) = P.run_pipeline(model, P.parse_spec("eliminate-identity"))
    assert [n.op_type for n in model.graph] == ["Identity"] and not report.modified


def test_dropout_with_used_mask_or_training_mode_is_kept(build):
    nodes = [
        helper.make_node("Dropout", ["x"], ["y", "mask"]),
        helper.make_node("Dropout", ["x", "r", "train"], ["z"]),
    ]
    model = build(
        nodes,
        [("x", TensorProto.FLOAT, [2])],
        [("y", TensorProto.FLOAT, [2]), ("mask", TensorProto.BOOL, [2]), ("z", TensorProto.FLOAT, [2])],
        [("r", np.float32(0.5)), ("train", np.bool_(True))],
    )
    model, (report,) = P.run_pipeline(model, P.parse_spec("eliminate-identity"))
    assert [n.op_type for n in model.graph] == ["Dropout", "Dropout"] and not report.modified
