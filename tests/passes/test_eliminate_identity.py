"""eliminate-identity: Identity and inference Dropout go; output names stay stable."""

from __future__ import annotations

import mconv.passes as P
import numpy as np
import onnx
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


def _vi(name, shape=(2, 3), elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, list(shape))


def _if_model(build):
    """t = Neg(x); y = If(cond) {then: Identity(t) (outer value), else: Identity(Relu(t))}; z = y + t."""
    then = helper.make_graph(
        [helper.make_node("Identity", ["t"], ["then_out"])], "then", [], [_vi("then_out")]
    )
    els = helper.make_graph(
        [helper.make_node("Relu", ["t"], ["u"]), helper.make_node("Identity", ["u"], ["else_out"])],
        "else",
        [],
        [_vi("else_out")],
    )
    nodes = [
        helper.make_node("Neg", ["x"], ["t"]),
        helper.make_node("Identity", ["t"], ["t_copy"]),  # a plain main-graph Identity: removed
        helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=els),
        helper.make_node("Add", ["y", "t_copy"], ["z"]),
    ]
    return build(
        nodes,
        [("cond", TensorProto.BOOL, []), ("x", TensorProto.FLOAT, [2, 3])],
        [("z", TensorProto.FLOAT, [2, 3])],
    )


def test_identity_returning_an_outer_value_from_an_if_branch_is_kept(build, run_ort):
    from mconv.irio import to_proto

    model = _if_model(build)
    x = np.random.default_rng(5).standard_normal((2, 3)).astype(np.float32)
    expected = {c: run_ort(model, {"cond": np.array(c), "x": x})["z"] for c in (True, False)}
    model, (report,) = P.run_pipeline(model, P.parse_spec("eliminate-identity"))
    if_node = next(n for n in model.graph if n.op_type == "If")
    then, els = if_node.attributes["then_branch"].value, if_node.attributes["else_branch"].value
    # then: Identity(t) returns an outer-scope value; ONNX wants a node to produce a branch output.
    assert [n.op_type for n in then] == ["Identity"] and then.outputs[0].name == "then_out"
    # else: Relu's output is renamed to the branch output; the main-graph copy goes too.
    assert [n.op_type for n in els] == ["Relu"] and els.outputs[0].name == "else_out"
    assert [n.op_type for n in model.graph] == ["Neg", "If", "Add"]
    assert (report.nodes_before, report.nodes_after) == (7, 5)  # subgraph nodes count too
    onnx.checker.check_model(to_proto(model), full_check=True)
    for c in (True, False):
        np.testing.assert_array_equal(run_ort(model, {"cond": np.array(c), "x": x})["z"], expected[c])


def test_loop_body_identities_of_outer_values_and_body_inputs_are_kept(build, run_ort):
    from mconv.irio import to_proto

    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),  # a body input: kept
            helper.make_node("Add", ["acc_in", "w"], ["acc_out"]),
            helper.make_node("Identity", ["w"], ["scan_out"]),  # an outer value: kept
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            _vi("acc_in"),
        ],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), _vi("acc_out"), _vi("scan_out")],
    )
    nodes = [
        helper.make_node("Mul", ["x", "two"], ["w"]),
        helper.make_node("Loop", ["n", "true", "x"], ["acc", "scans"], body=body),
    ]
    model = build(
        nodes,
        [("x", TensorProto.FLOAT, [2, 3])],
        [("acc", TensorProto.FLOAT, [2, 3]), ("scans", TensorProto.FLOAT, [3, 2, 3])],
        [("n", np.int64(3)), ("true", np.bool_(True)), ("two", np.float32(2))],
    )
    x = np.random.default_rng(6).standard_normal((2, 3)).astype(np.float32)
    expected = run_ort(model, {"x": x})
    model, (report,) = P.run_pipeline(model, P.parse_spec("eliminate-identity"))
    assert not report.modified
    onnx.checker.check_model(to_proto(model), full_check=True)
    got = run_ort(model, {"x": x})
    for k in ("acc", "scans"):
        np.testing.assert_array_equal(got[k], expected[k])


def test_nested_subgraphs_rename_uses_at_every_depth(build, run_ort):
    from mconv.irio import to_proto

    inner_then = helper.make_graph([helper.make_node("Identity", ["h"], ["it"])], "it", [], [_vi("it")])
    inner_else = helper.make_graph(
        [helper.make_node("Mul", ["h", "h"], ["sq"]), helper.make_node("Identity", ["sq"], ["ie"])],
        "ie",
        [],
        [_vi("ie")],
    )
    outer_then = helper.make_graph(
        [
            helper.make_node("Not", ["cond"], ["nc"]),
            helper.make_node("If", ["nc"], ["o1"], then_branch=inner_then, else_branch=inner_else),
            helper.make_node("Identity", ["o1"], ["ot"]),
        ],
        "ot",
        [],
        [_vi("ot")],
    )
    outer_else = helper.make_graph([helper.make_node("Identity", ["x"], ["oe"])], "oe", [], [_vi("oe")])
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Identity", ["r"], ["h"]),  # used two subgraph levels down
        helper.make_node("If", ["cond"], ["y"], then_branch=outer_then, else_branch=outer_else),
    ]
    model = build(
        nodes,
        [("cond", TensorProto.BOOL, []), ("x", TensorProto.FLOAT, [2, 3])],
        [("y", TensorProto.FLOAT, [2, 3])],
    )
    x = np.random.default_rng(7).standard_normal((2, 3)).astype(np.float32)
    expected = {c: run_ort(model, {"cond": np.array(c), "x": x})["y"] for c in (True, False)}
    model, (report,) = P.run_pipeline(model, P.parse_spec("eliminate-identity"))
    assert [n.op_type for n in model.graph] == ["Relu", "If"]
    assert report.nodes_before - report.nodes_after == 3  # h, ot and ie; it and oe stay
    onnx.checker.check_model(to_proto(model), full_check=True)
    for c in (True, False):
        np.testing.assert_array_equal(run_ort(model, {"cond": np.array(c), "x": x})["y"], expected[c])
