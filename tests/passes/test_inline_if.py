"""inline-if and export --input-value (issue 12 item 4): an If with a constant condition becomes
its taken branch; a graph input baked to a constant decides the Ifs it feeds (silero-vad's
``sr``). Each model is built here with onnx.helper and checked against ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from mconv.errors import InputError
from mconv.irio import from_proto, load_onnx, to_proto
from mconv.passes import parse_spec, run_pipeline
from mconv.passes.inline_if import bake_input_values
from onnx import TensorProto, helper, numpy_helper


def sr_model(seed: int, *, nested: bool = False) -> onnx.ModelProto:
    """y = If(sr == 16000, then: x * w16 + outer, else: x * w8); an int64 scalar input ``sr`` as
    silero-vad has. ``nested``: the then branch holds another If on ``sr > 8000``."""
    rng = np.random.default_rng(seed)
    w16 = rng.standard_normal(4).astype(np.float32)
    w8 = rng.standard_normal(4).astype(np.float32)
    then_nodes = [
        helper.make_node("Mul", ["x", "w16"], ["t0"], name="then_mul"),
        helper.make_node("Add", ["t0", "outer"], ["t1"], name="then_add"),  # reads an outer value
    ]
    if nested:
        inner_then = helper.make_graph(
            [helper.make_node("Neg", ["t1"], ["n1"], name="inner_neg")],
            "inner_then",
            [],
            [helper.make_tensor_value_info("n1", TensorProto.FLOAT, [4])],
        )
        inner_else = helper.make_graph(
            [helper.make_node("Identity", ["t1"], ["i1"], name="inner_id")],
            "inner_else",
            [],
            [helper.make_tensor_value_info("i1", TensorProto.FLOAT, [4])],
        )
        then_nodes += [
            helper.make_node("Greater", ["sr", "eight_k"], ["gt"], name="then_gt"),
            helper.make_node(
                "If", ["gt"], ["t2"], name="inner_if", then_branch=inner_then, else_branch=inner_else
            ),
        ]
        then_out = "t2"
    else:
        then_out = "t1"
    then_g = helper.make_graph(
        then_nodes,
        "then",
        [],
        [helper.make_tensor_value_info(then_out, TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(w16, "w16")],
    )
    else_g = helper.make_graph(
        [helper.make_node("Mul", ["x", "w8"], ["e0"], name="else_mul")],
        "else",
        [],
        [helper.make_tensor_value_info("e0", TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(w8, "w8")],
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["outer"], name="outer_relu"),
        helper.make_node("Equal", ["sr", "sixteen_k"], ["is16"], name="eq"),
        helper.make_node("If", ["is16"], ["y"], name="the_if", then_branch=then_g, else_branch=else_g),
    ]
    inits = [
        numpy_helper.from_array(np.array(16000, np.int64), "sixteen_k"),
        numpy_helper.from_array(np.array(8000, np.int64), "eight_k"),
    ]
    g = helper.make_graph(
        nodes,
        "sr_net",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
            helper.make_tensor_value_info("sr", TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def ort_run(proto: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v for k, v in feeds.items() if k in names})


@pytest.mark.parametrize(
    ("sr", "nested"),
    [(16000, False), (8000, False), (16000, True), (8000, True)],
)
def test_baked_sr_inlines_the_taken_branch_and_matches_ort(sr, nested):
    proto = sr_model(1, nested=nested)
    rng = np.random.default_rng(2)
    feeds = {"x": rng.standard_normal(4).astype(np.float32), "sr": np.array(sr, np.int64)}
    want = ort_run(proto, feeds)
    model, notes = bake_input_values(from_proto(proto), {"sr": str(sr)})
    assert not [n for n in model.graph if n.op_type == "If"]
    assert [v.name for v in model.graph.inputs] == ["x"]
    assert any("the_if" in n for n in notes) and any("sr" in n for n in notes)
    out = to_proto(model)
    onnx.checker.check_model(out, full_check=True)
    np.testing.assert_array_equal(ort_run(out, feeds)[0], want[0])
    assert [o.name for o in out.graph.output] == ["y"]


def test_inline_if_pass_leaves_a_runtime_condition_alone():
    model = from_proto(sr_model(3))
    model, reports = run_pipeline(model, parse_spec("fold,inline-if"))
    assert [n.op_type for n in model.graph].count("If") == 1
    assert not reports[-1].modified


def test_inline_if_of_a_branch_returning_an_outer_value_keeps_the_output_name():
    """else: returns x itself (an outer value, and a graph input): an Identity stands between."""
    then_g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["n"])],
        "t",
        [],
        [helper.make_tensor_value_info("n", TensorProto.FLOAT, [2])],
    )
    else_g = helper.make_graph([], "e", [], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])])
    g = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], name="if0", then_branch=then_g, else_branch=else_g)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.array(False), "c")],
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model, _ = run_pipeline(from_proto(proto), parse_spec("inline-if"))
    out = to_proto(model)
    onnx.checker.check_model(out)
    assert [o.name for o in out.graph.output] == ["y"] and [n.op_type for n in out.graph.node] == ["Identity"]
    x = np.array([1.5, -2.0], np.float32)
    np.testing.assert_array_equal(ort_run(out, {"x": x})[0], x)


def _saved(tmp_path, proto) -> str:
    path = tmp_path / "sr.onnx"
    onnx.save(proto, path)
    return str(path)


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"rate": "16000"}, "'rate', which is not an input"),
        ({"sr": "16k"}, "not a int64"),
        ({"sr": "1e30"}, "not a int64"),
        ({"sr": "99999999999999999999999"}, "outside int64's range"),
    ],
)
def test_bad_input_values_are_input_errors_naming_the_file(tmp_path, values, needle):
    path = _saved(tmp_path, sr_model(4))
    with pytest.raises(InputError) as info:
        bake_input_values(load_onnx(path), values, path=path)
    assert needle in str(info.value) and "sr.onnx" in str(info.value)


def test_a_symbolic_input_needs_its_shape_first(tmp_path):
    proto = sr_model(5)
    proto.graph.input[1].type.tensor_type.shape.dim.add().dim_param = "n"
    path = _saved(tmp_path, proto)
    with pytest.raises(InputError) as info:
        bake_input_values(load_onnx(path), {"sr": "16000"}, path=path)
    assert "--input-shape sr=DIMS" in str(info.value)


def test_bool_and_float_inputs_bake_to_their_dtype_and_shape():
    """A bool input is the If's condition itself; a float input is broadcast to its [1, 2] shape."""
    then_g = helper.make_graph(
        [helper.make_node("Mul", ["x", "gain"], ["t"])],
        "t",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 2])],
    )
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"])],
        "e",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, 2])],
    )
    g = helper.make_graph(
        [helper.make_node("If", ["flag"], ["y"], name="flag_if", then_branch=then_g, else_branch=else_g)],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2]),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
            helper.make_tensor_value_info("gain", TensorProto.FLOAT, [1, 2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(6).standard_normal((1, 2)).astype(np.float32)
    for flag, want in (("true", x * 2.5), ("0", -x)):
        model, _ = bake_input_values(from_proto(proto), {"flag": flag, "gain": "2.5"})
        out = to_proto(model)
        assert [i.name for i in out.graph.input] == ["x"] and not [
            n for n in out.graph.node if n.op_type == "If"
        ]
        np.testing.assert_allclose(ort_run(out, {"x": x})[0], want, rtol=1e-6)
    with pytest.raises(InputError, match="not a bool"):
        bake_input_values(from_proto(proto), {"flag": "maybe"})
