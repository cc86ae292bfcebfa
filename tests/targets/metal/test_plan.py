"""The planner: unsupported nodes, fusion, views, static shapes, the caller's model untouched."""

from __future__ import annotations

import numpy as np
import pytest
from mconv.errors import InputError, UnsupportedError
from mconv.targets.metal import TARGET
from mconv.targets.metal.plan import build_plan, prepare
from metal_models import make_model
from onnx import helper


def _conv_net(act_nodes, opset=17):
    w = {"w": np.ones((2, 1, 3, 3), np.float32), "b": np.zeros(2, np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv"), *act_nodes]
    return make_model(nodes, [("x", ["N", 1, 5, 5])], ["y"], w, opset=opset)


def test_unsupported_nodes_are_all_named_in_one_error_and_nothing_is_written(tmp_path):
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="ok"),
        helper.make_node("Hardmax", ["a"], ["b"], name="hm1"),
        helper.make_node("TopK", ["b", "k"], ["y", "idx"], name="topk1"),
    ]
    model = make_model(nodes, [("x", [1, 8])], ["y"], {"k": np.array([2], np.int64)})
    with pytest.raises(UnsupportedError) as info:
        TARGET.export(model, tmp_path / "out", {})
    assert info.value.items == [("hm1", "Hardmax"), ("topk1", "TopK")]
    assert info.value.exit_code == 2 and "hm1 (Hardmax)" in info.value.line()
    assert not (tmp_path / "out").exists()


def test_activation_is_fused_into_conv_and_views_add_no_layer():
    model = _conv_net(
        [
            helper.make_node("Relu", ["c"], ["r"], name="relu"),
            helper.make_node("Flatten", ["r"], ["y"], name="flat"),
        ]
    )
    plan = build_plan(prepare(model))
    assert [(lay.op, lay.nodes) for lay in plan.layers] == [("Conv+relu", ["conv", "relu"])]
    assert plan.outputs[0]["buffer"] == plan.layers[0].bindings[-1]  # Flatten aliases the conv's buffer
    assert plan.outputs[0]["shape"] == [1, 18]


def test_activation_is_not_fused_when_the_conv_output_has_another_use():
    model = _conv_net(
        [
            helper.make_node("Relu", ["c"], ["r"], name="relu"),
            helper.make_node("Add", ["c", "r"], ["y"], name="add"),
        ]
    )
    ops = [lay.op for lay in build_plan(prepare(model)).layers]
    assert ops == ["Conv", "Relu", "Add"]


def test_batch_option_bakes_the_symbolic_batch_and_caller_model_keeps_it():
    model = _conv_net([helper.make_node("Relu", ["c"], ["y"], name="relu")])
    plan = build_plan(prepare(model, batch=4), {"batch": 4})
    assert plan.inputs[0]["shape"] == [4, 1, 5, 5] and plan.layers[0].grid == [3, 3, 8]
    assert not isinstance(model.graph.inputs[0].shape[0], int)  # the caller's model is untouched


def test_symbolic_non_batch_dimension_is_refused_naming_the_input_and_input_shape():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", [1, "L"])], ["y"], {})
    with pytest.raises(InputError, match="unsupported input.*x .dimension 1 is symbolic: L") as info:
        prepare(model)
    assert "--input-shape x=1,L" in info.value.line()


def test_unknown_precision_is_refused():
    model = _conv_net([helper.make_node("Relu", ["c"], ["y"], name="relu")])
    with pytest.raises(InputError, match="precision"):
        build_plan(prepare(model), {"precision": "int4"})
