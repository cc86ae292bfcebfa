"""dce: dead nodes and unused weights go; graph inputs and outputs stay."""

from __future__ import annotations

import mconv.passes as P
import numpy as np
from onnx import TensorProto, helper


def test_dce_removes_dead_chain_and_unused_initializers_but_keeps_inputs(build, run_ort):
    nodes = [
        helper.make_node("Relu", ["x"], ["y"]),
        helper.make_node("Mul", ["x", "w_dead"], ["d1"]),
        helper.make_node("Exp", ["d1"], ["d2"]),
    ]
    inits = [("w_dead", np.float32([2, 2])), ("w_unused", np.float32([1, 1]))]
    model = build(
        nodes,
        [("x", TensorProto.FLOAT, [2]), ("unused_in", TensorProto.FLOAT, [2])],
        [("y", TensorProto.FLOAT, [2])],
        inits,
    )
    model, (report,) = P.run_pipeline(model, P.parse_spec("dce"))
    assert [n.op_type for n in model.graph] == ["Relu"]
    assert len(model.graph.initializers) == 0
    assert [v.name for v in model.graph.inputs] == ["x", "unused_in"]
    assert report.nodes_before - report.nodes_after == 2 and report.params_after == 0
    np.testing.assert_array_equal(
        run_ort(model, {"x": np.float32([-1, 3]), "unused_in": np.float32([0, 0])})["y"], [0, 3]
    )


def test_dce_drops_unused_weights_listed_as_inputs_in_ir3_models(build):
    graph_inputs = [("x", TensorProto.FLOAT, [2]), ("w_old", TensorProto.FLOAT, [2])]
    model = build(
        [helper.make_node("Relu", ["x"], ["y"])],
        graph_inputs,
        [("y", TensorProto.FLOAT, [2])],
        [("w_old", np.float32([1, 2]))],
        opset=9,
        ir_version=3,
    )
    model, _ = P.run_pipeline(model, P.parse_spec("dce"))
    assert [v.name for v in model.graph.inputs] == ["x"]


def test_dce_sweeps_inside_subgraphs(build):
    then_g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["dead"]), helper.make_node("Identity", ["x"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])],
    )
    else_g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])],
    )
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    model = build(
        nodes, [("x", TensorProto.FLOAT, [2]), ("c", TensorProto.BOOL, [])], [("y", TensorProto.FLOAT, [2])]
    )
    model, (report,) = P.run_pipeline(model, P.parse_spec("dce"))
    then_branch = next(iter(model.graph)).attributes["then_branch"].value
    assert [n.op_type for n in then_branch] == ["Identity"]
    assert report.nodes_before - report.nodes_after == 1
