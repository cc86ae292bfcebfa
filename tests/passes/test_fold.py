"""fold: constant subgraphs become initializers; outputs unchanged (onnxruntime before vs after)."""

from __future__ import annotations

import collections
from pathlib import Path

import mconv.passes as P
import numpy as np
import onnx
from mconv.irio import load_onnx, to_proto
from onnx import TensorProto, helper

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def _ops(model):
    return collections.Counter(n.op_type for n in model.graph)


def test_fold_evaluates_constant_chain_and_keeps_outputs(build, run_ort):
    nodes = [
        helper.make_node("Constant", [], ["c"], value=onnx.numpy_helper.from_array(np.float32([1, 2, 3]))),
        helper.make_node("Mul", ["c", "k"], ["c2"]),
        helper.make_node("Transpose", ["m"], ["mt"]),
        helper.make_node("MatMul", ["x", "mt"], ["h"]),
        helper.make_node("Add", ["h", "c2"], ["y"]),
    ]
    inits = [("k", np.float32([2, 2, 2])), ("m", np.arange(6, dtype=np.float32).reshape(3, 2))]
    model = build(nodes, [("x", TensorProto.FLOAT, [2, 2])], [("y", TensorProto.FLOAT, [2, 3])], inits)
    x = np.float32([[1, -1], [0.5, 2]])
    expected = run_ort(model, {"x": x})["y"]
    model, reports = P.run_pipeline(model, P.parse_spec("fold,dce"))
    assert _ops(model) == {"MatMul": 1, "Add": 1}
    assert reports[0].nodes_before == 5 and reports[1].nodes_after == 2
    np.testing.assert_allclose(model.graph.initializers["c2"].const_value.numpy(), [2, 4, 6])
    np.testing.assert_array_equal(run_ort(model, {"x": x})["y"], expected)


def test_fold_leaves_random_ops_and_dynamic_nodes(build):
    nodes = [
        helper.make_node("RandomNormal", [], ["r"], shape=[3]),
        helper.make_node("Add", ["x", "r"], ["y"]),
    ]
    model = build(nodes, [("x", TensorProto.FLOAT, [3])], [("y", TensorProto.FLOAT, [3])])
    model, (report,) = P.run_pipeline(model, P.parse_spec("fold"))
    assert _ops(model) == {"RandomNormal": 1, "Add": 1}
    assert not report.modified


def test_fold_size_cap_skips_expanding_ops_unless_raised(build):
    nodes = [
        helper.make_node("Expand", ["one", "shape"], ["big"]),
        helper.make_node("Add", ["x", "big"], ["y"]),
    ]
    inits = [("one", np.float32([1.0])), ("shape", np.int64([64, 64]))]
    model = build(nodes, [("x", TensorProto.FLOAT, [64, 64])], [("y", TensorProto.FLOAT, [64, 64])], inits)
    model, (report,) = P.run_pipeline(model, P.parse_spec("fold(max_bytes=1000)"))
    assert "Expand" in _ops(model) and any("max_bytes" in n for n in report.notes)
    model, _ = P.run_pipeline(model, P.parse_spec("fold(max_bytes=1000000)"))
    assert "Expand" not in _ops(model)


def test_fold_keeps_widening_cast_of_stored_weights(build):
    nodes = [
        helper.make_node("Cast", ["w16"], ["w"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["x", "w"], ["y"]),
    ]
    model = build(
        nodes,
        [("x", TensorProto.FLOAT, [4])],
        [("y", TensorProto.FLOAT, [4])],
        [("w16", np.float16([1, 2, 3, 4]))],
    )
    model, (report,) = P.run_pipeline(model, P.parse_spec("fold"))
    assert _ops(model)["Cast"] == 1 and not report.modified


def test_fold_does_not_treat_overridable_inputs_as_constants(build):
    # IR >= 4: an initializer that is also a graph input is a default the caller may override.
    graph = helper.make_graph(
        [helper.make_node("Neg", ["k"], ["y"])],
        "g",
        [helper.make_tensor_value_info("k", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [onnx.numpy_helper.from_array(np.float32([1, 2]), "k")],
    )
    from mconv.irio import from_proto

    model = from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    model, (report,) = P.run_pipeline(model, P.parse_spec("fold"))
    assert _ops(model) == {"Neg": 1}


def test_fold_and_dce_turn_light_alexnet_constantofshape_into_initializers(run_ort):
    path = LIGHT / "light_bvlc_alexnet.onnx"
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    expected = run_ort(onnx.load(path), {"data_0": x})
    model = load_onnx(path)
    model, reports = P.run_pipeline(model, P.parse_spec("fold,dce"))
    assert "ConstantOfShape" not in _ops(model)
    for node in model.graph:
        if node.op_type in ("Conv", "Gemm"):
            assert all(v.is_initializer() for v in node.inputs[1:])
    assert reports[0].params_after > 60_000_000  # AlexNet's 61M weights now stored
    assert model.ir_version == 4 and [v.name for v in model.graph.inputs] == ["data_0"]  # weights left inputs
    onnx.checker.check_model(to_proto(model))
    got = run_ort(model, {"data_0": x})
    np.testing.assert_allclose(got["prob_1"], expected["prob_1"], rtol=1e-6, atol=1e-7)


def _scalar_chain(build):
    """Scalars everywhere a detector has them: a Constant scalar, scalar initializers, a scalar
    Gather index computed from constants, and Unsqueeze -> Concat -> Reshape of a folded scalar."""
    nodes = [
        helper.make_node("Constant", [], ["two"], value=onnx.numpy_helper.from_array(np.int64(2))),
        helper.make_node("Sub", ["two", "one"], ["idx"]),  # folds to a 0-d int64
        helper.make_node("Gather", ["x", "idx"], ["g"], axis=1),  # x[:, 1] -> rank 1
        helper.make_node("Mul", ["two", "three"], ["six"]),  # 0-d, folded
        helper.make_node("Unsqueeze", ["six", "axes0"], ["six1"]),
        helper.make_node("Concat", ["minus1", "six1"], ["shape"], axis=0),  # folds to [-1, 6]
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Add", ["half", "quarter"], ["s"]),  # 0-d float
        helper.make_node("Mul", ["r", "s"], ["y"]),
    ]
    inits = [
        ("one", np.int64(1)),
        ("three", np.int64(3)),
        ("axes0", np.int64([0])),
        ("minus1", np.int64([-1])),
        ("half", np.float32(0.5)),
        ("quarter", np.float32(0.25)),
    ]
    return build(
        nodes,
        [("x", TensorProto.FLOAT, [2, 6])],
        [("g", TensorProto.FLOAT, [2]), ("y", TensorProto.FLOAT, [2, 6])],
        inits,
    )


def test_fold_keeps_scalars_zero_dimensional(build, run_ort):
    model = _scalar_chain(build)
    x = np.random.default_rng(11).standard_normal((2, 6)).astype(np.float32)
    expected = run_ort(model, {"x": x})
    model, (report,) = P.run_pipeline(model, P.parse_spec("fold"))
    assert report.modified
    inits = model.graph.initializers
    # Folded outputs and the Constant's initializer keep their rank: a 0-d index stays 0-d
    # (as [1], Gather would give [2, 1] and the checker rejects the declared output g[2]).
    for name in ("two", "idx", "six", "s"):
        assert inits[name].const_value.numpy().shape == (), name
        assert list(inits[name].shape) == [], name
    assert inits["shape"].const_value.numpy().tolist() == [-1, 6]
    proto = to_proto(model)
    onnx.checker.check_model(proto, full_check=True)
    assert {t.name: list(t.dims) for t in proto.graph.initializer}["idx"] == []
    got = run_ort(model, {"x": x})
    np.testing.assert_array_equal(got["g"], expected["g"])
    np.testing.assert_array_equal(got["y"], expected["y"])


def test_fold_leaves_nodes_whose_outputs_are_sequences(build, run_ort):
    # SequenceEmpty has only constant inputs (none), but an initializer is always a tensor.
    nodes = [
        helper.make_node("SequenceEmpty", [], ["empty"], dtype=TensorProto.FLOAT),
        helper.make_node("SequenceInsert", ["empty", "x"], ["seq"]),
        helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=0),
    ]
    model = build(nodes, [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])])
    x = np.float32([3, -1])
    model, (report,) = P.run_pipeline(model, P.parse_spec("fold"))
    assert _ops(model) == {"SequenceEmpty": 1, "SequenceInsert": 1, "ConcatFromSequence": 1}
    assert not model.graph.initializers and not report.modified
    onnx.checker.check_model(to_proto(model), full_check=True)
    np.testing.assert_array_equal(run_ort(model, {"x": x})["y"], x)
