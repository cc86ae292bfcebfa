"""The reference interpreter: order, intermediates, errors, gradients, initializers, functions."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from mconv.engines.reference.executor import Executor, run_node
from mconv.errors import InputError, UnsupportedError
from mconv.targets.reference import TARGET
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper


def _model(nodes, inputs, outputs, inits=(), opset=17, functions=()):
    graph = oh.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    imports = [oh.make_opsetid("", opset)] + [oh.make_opsetid(f.domain, 1) for f in functions]
    return oh.make_model(graph, opset_imports=imports, functions=list(functions))


def _vi(name, shape, t=TP.FLOAT):
    return oh.make_tensor_value_info(name, t, shape)


def _ort(proto, feeds):
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _mlp(rng):
    w1 = numpy_helper.from_array(rng.standard_normal((4, 5)), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(5), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((5, 3)), "w2")
    nodes = [
        oh.make_node("MatMul", ["x", "w1"], ["h0"], name="fc1"),
        oh.make_node("Add", ["h0", "b1"], ["h1"], name="bias1"),
        oh.make_node("Tanh", ["h1"], ["h2"], name="act"),
        oh.make_node("MatMul", ["h2", "w2"], ["y"], name="fc2"),
        oh.make_node("Mul", ["y", "y"], ["sq"], name="square"),
        oh.make_node("ReduceSum", ["sq"], ["loss"], name="sum", keepdims=0),
    ]
    return _model(
        nodes,
        [_vi("x", [2, 4], TP.DOUBLE)],
        [_vi("y", [2, 3], TP.DOUBLE), _vi("loss", [], TP.DOUBLE)],
        [w1, b1, w2],
        opset=17,
    )


def test_nodes_listed_out_of_topological_order_run_in_dependency_order():
    nodes = [
        oh.make_node("Mul", ["b", "x"], ["y"], name="last"),
        oh.make_node("Relu", ["a"], ["b"], name="middle"),
        oh.make_node("Neg", ["x"], ["a"], name="first"),
    ]
    proto = _model(nodes, [_vi("x", [3])], [_vi("y", [3])])
    x = np.array([-1.0, 2.0, -3.0], dtype=np.float32)
    got = Executor(ir.serde.deserialize_model(proto)).run({"x": x})["y"]
    np.testing.assert_allclose(got, np.maximum(-x, 0) * x)  # hand math


def test_intermediates_returns_every_value_keyed_by_name_in_topological_order():
    nodes = [
        oh.make_node("Mul", ["b", "x"], ["y"]),
        oh.make_node("Relu", ["a"], ["b"]),
        oh.make_node("Neg", ["x"], ["a"]),
    ]
    proto = _model(nodes, [_vi("x", [2])], [_vi("y", [2])])
    x = np.array([-2.0, 3.0], dtype=np.float32)
    got = Executor(ir.serde.deserialize_model(proto)).run({"x": x}, intermediates=True)
    assert list(got) == ["x", "a", "b", "y"]
    np.testing.assert_allclose(got["a"], [2.0, -3.0])
    np.testing.assert_allclose(got["b"], [2.0, 0.0])
    np.testing.assert_allclose(got["y"], [-4.0, 0.0])


def test_outputs_argument_returns_only_the_requested_values():
    nodes = [oh.make_node("Neg", ["x"], ["a"]), oh.make_node("Abs", ["a"], ["y"])]
    proto = _model(nodes, [_vi("x", [2])], [_vi("y", [2])])
    got = Executor(ir.serde.deserialize_model(proto)).run(
        {"x": np.array([1.0, -2.0], np.float32)}, outputs=["a"]
    )
    assert list(got) == ["a"]
    np.testing.assert_allclose(got["a"], [-1.0, 2.0])


def test_unknown_ops_are_all_named_in_one_error_subgraphs_included():
    then_g = oh.make_graph(
        [oh.make_node("Frobnicate", ["x"], ["t"], name="inner")], "then", [], [_vi("t", [1])]
    )
    else_g = oh.make_graph([oh.make_node("Identity", ["x"], ["e"])], "else", [], [_vi("e", [1])])
    nodes = [
        oh.make_node("Warp", ["x"], ["a"], name="outer1"),
        oh.make_node("Zap", ["a"], ["c"], name="outer2", domain="custom.dom"),
        oh.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g, name="if"),
    ]
    graph = oh.make_graph(nodes, "g", [_vi("x", [1])], [_vi("y", [1])])
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("custom.dom", 1)])
    with pytest.raises(UnsupportedError) as info:
        Executor(ir.serde.deserialize_model(proto))
    names = {name for name, _ in info.value.items}
    assert names == {"outer1", "outer2", "inner"}
    assert "3 unsupported" in str(info.value)


def test_value_and_grad_of_an_mlp_matches_central_finite_differences():
    rng = np.random.default_rng(0)
    proto = _mlp(rng)
    exe = Executor(ir.serde.deserialize_model(proto))
    x = rng.standard_normal((2, 4))
    loss, grads = exe.value_and_grad({"x": x}, "loss", ["x", "w1", "b1", "w2"])
    assert loss == pytest.approx(float(_ort(proto, {"x": x})[1]), rel=1e-12)
    eps = 1e-6
    for name in ["x", "w1", "b1", "w2"]:
        base = x if name == "x" else exe.initializers[name]
        numeric = np.zeros_like(base)
        for idx in np.ndindex(base.shape):
            vals = []
            for sign in (1, -1):
                pert = base.copy()
                pert[idx] += sign * eps
                feeds = {"x": pert} if name == "x" else {"x": x, name: pert}
                vals.append(float(exe.run(feeds)["loss"]))
            numeric[idx] = (vals[0] - vals[1]) / (2 * eps)
        np.testing.assert_allclose(grads[name], numeric, rtol=1e-6, atol=1e-8, err_msg=name)


def test_callable_loss_and_vjp_agree_with_hand_gradient_of_a_linear_output():
    rng = np.random.default_rng(1)
    proto = _mlp(rng)
    exe = Executor(ir.serde.deserialize_model(proto))
    x = rng.standard_normal((2, 4))
    target = rng.standard_normal((2, 3))

    def mse(outs):
        diff = outs["y"] - target
        return float((diff**2).sum()), {"y": 2 * diff}

    loss, grads = exe.value_and_grad({"x": x}, mse, ["w2"])
    h2 = np.tanh(x @ exe.initializers["w1"] + exe.initializers["b1"])
    y = h2 @ exe.initializers["w2"]
    assert loss == pytest.approx(float(((y - target) ** 2).sum()))
    np.testing.assert_allclose(grads["w2"], h2.T @ (2 * (y - target)), rtol=1e-10)  # hand math
    vj = exe.vjp({"x": x}, {"y": np.ones((2, 3))}, ["w2"])
    np.testing.assert_allclose(vj["w2"], h2.T @ np.ones((2, 3)), rtol=1e-10)


def test_gradient_path_through_an_op_without_vjp_is_refused_clearly():
    # DFT has no VJP; a gradient asked through it must name the node.
    nodes = [oh.make_node("DFT", ["x"], ["f"], name="spectrum"), oh.make_node("Mul", ["f", "f"], ["y"])]
    proto = _model(nodes, [_vi("x", [1, 4, 1])], [_vi("y", [1, 4, 2])])
    exe = Executor(ir.serde.deserialize_model(proto))
    x = np.ones((1, 4, 1), np.float32)
    with pytest.raises(UnsupportedError, match="spectrum"):
        exe.vjp({"x": x}, {"y": np.ones((1, 4, 2), np.float32)}, ["x"])


def test_initializers_listed_as_inputs_are_not_runner_inputs_but_can_be_fed():
    w = numpy_helper.from_array(np.array([2.0, 3.0], np.float32), "w")
    nodes = [oh.make_node("Mul", ["x", "w"], ["y"])]
    proto = _model(nodes, [_vi("x", [2]), _vi("w", [2])], [_vi("y", [2])], [w])
    runner = TARGET.load_model(ir.serde.deserialize_model(proto))
    assert [spec.name for spec in runner.inputs] == ["x"]
    assert runner.outputs == ["y"]
    x = np.array([1.0, 1.0], np.float32)
    np.testing.assert_allclose(runner.run({"x": x})["y"], [2.0, 3.0])
    fed = runner.executor.run({"x": x, "w": np.array([5.0, 7.0], np.float32)})["y"]
    np.testing.assert_allclose(fed, [5.0, 7.0])


def test_set_initializer_updates_the_weight_without_rebuilding():
    w = numpy_helper.from_array(np.array([2.0, 3.0], np.float32), "w")
    proto = _model([oh.make_node("Mul", ["x", "w"], ["y"])], [_vi("x", [2])], [_vi("y", [2])], [w])
    exe = Executor(ir.serde.deserialize_model(proto))
    exe.set_initializer("w", np.array([-1.0, 4.0]))
    np.testing.assert_allclose(exe.run({"x": np.ones(2, np.float32)})["y"], [-1.0, 4.0])
    with pytest.raises(InputError, match="shape"):
        exe.set_initializer("w", np.ones(3))
    with pytest.raises(InputError, match="no initializer"):
        exe.set_initializer("nope", np.ones(2))


def test_bad_feeds_raise_one_line_input_errors():
    proto = _model([oh.make_node("Neg", ["x"], ["y"])], [_vi("x", [2])], [_vi("y", [2])])
    exe = Executor(ir.serde.deserialize_model(proto))
    with pytest.raises(InputError, match="missing input 'x'"):
        exe.run({})
    with pytest.raises(InputError, match="dtype float64"):
        exe.run({"x": np.ones(2)})
    with pytest.raises(InputError, match="rank 2"):
        exe.run({"x": np.ones((1, 2), np.float32)})


def test_model_local_function_is_expanded_into_its_body():
    fn = oh.make_function(
        "my.fns",
        "ScaledNeg",
        ["a"],
        ["b"],
        [oh.make_node("Neg", ["a"], ["n"]), oh.make_node("Mul", ["n", "a"], ["b"])],
        [oh.make_opsetid("", 17)],
    )
    nodes = [oh.make_node("ScaledNeg", ["x"], ["y"], domain="my.fns", name="call")]
    proto = _model(nodes, [_vi("x", [3])], [_vi("y", [3])], functions=[fn])
    x = np.array([1.0, -2.0, 3.0], np.float32)
    got = Executor(ir.serde.deserialize_model(proto)).run({"x": x})["y"]
    np.testing.assert_allclose(got, -x * x)
    np.testing.assert_allclose(got, _ort(proto, {"x": x})[0])


def test_onnx_function_op_without_kernel_is_expanded_from_its_schema(monkeypatch):
    # Hide any Celu kernel so the schema's function body must be used; compare with onnxruntime.
    from mconv.engines.reference.ops import REGISTRY

    monkeypatch.delitem(REGISTRY, ("Celu", ""), raising=False)
    proto = _model(
        [oh.make_node("Celu", ["x"], ["y"], alpha=2.0)], [_vi("x", [4])], [_vi("y", [4])], opset=17
    )
    exe = Executor(ir.serde.deserialize_model(proto))
    assert exe.plan.steps[0].opdef.op_type == "Celu" and exe.plan.steps[0].opdef.vjp is not None
    x = np.array([-3.0, -0.5, 0.0, 2.0], np.float32)
    np.testing.assert_allclose(exe.run({"x": x})["y"], _ort(proto, {"x": x})[0], rtol=1e-6)


def test_context_dependent_function_op_is_expanded_for_the_input_types(monkeypatch):
    # SoftmaxCrossEntropyLoss's body depends on its input types; reduction="sum" must reach it.
    from mconv.engines.reference.ops import REGISTRY

    monkeypatch.delitem(REGISTRY, ("SoftmaxCrossEntropyLoss", ""), raising=False)
    monkeypatch.delitem(REGISTRY, ("NegativeLogLikelihoodLoss", ""), raising=False)
    node = oh.make_node("SoftmaxCrossEntropyLoss", ["s", "t"], ["loss"], reduction="sum")
    proto = _model([node], [_vi("s", [3, 5]), _vi("t", [3], TP.INT64)], [_vi("loss", [])], opset=17)
    rng = np.random.default_rng(0)
    feeds = {"s": rng.standard_normal((3, 5)).astype(np.float32), "t": np.array([0, 4, 2], np.int64)}
    got = Executor(ir.serde.deserialize_model(proto)).run(feeds)["loss"]
    np.testing.assert_allclose(got, _ort(proto, feeds)[0], rtol=1e-5)


def test_run_node_evaluates_a_single_op_with_plain_attributes():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (y,) = run_node("Transpose", [x], {"perm": [1, 0]})
    np.testing.assert_array_equal(y, x.T)
    (q,) = run_node(
        "QuantizeLinear",
        [np.array([0.0, 1.0, 2.6], np.float32), np.array(0.5, np.float32), np.array(1, np.uint8)],
    )
    np.testing.assert_array_equal(q, [1, 3, 6])  # round(x / 0.5) + 1, half to even


def test_reference_target_has_no_bundle():
    with pytest.raises(InputError, match="no bundle"):
        TARGET.export(None, None, {})


def test_backend_rep_returns_outputs_in_graph_order():
    from mconv.engines.reference import backend

    nodes = [oh.make_node("Neg", ["x"], ["b"]), oh.make_node("Abs", ["x"], ["a"])]
    proto = _model(nodes, [_vi("x", [2])], [_vi("b", [2]), _vi("a", [2])])
    x = np.array([1.0, -2.0], np.float32)
    b, a = backend.run_model(proto, [x])
    np.testing.assert_allclose(b, -x)
    np.testing.assert_allclose(a, np.abs(x))
    assert backend.supports_device("CPU") and not backend.supports_device("CUDA")
    assert onnx.checker.check_model(proto) is None


def test_fallback_kernel_runs_with_each_nodes_own_attributes_not_a_cached_sessions():
    """The onnx.reference fallback caches one session per attribute set. It was keyed by the
    attribute dict's id(), which a freed dict's successor can reuse: a StringNormalizer then ran
    with another node's case action (a backend test failed some of the time). The same dict
    object with new values stands for that reuse here, deterministically."""
    from mconv.engines.reference.ops import OpContext, lookup

    forward = lookup("StringNormalizer").forward
    words = np.array(["Mixed", "Case"], dtype=object)
    attrs = {"case_change_action": "LOWER"}
    (low,) = forward([words], attrs, OpContext(opset=21, num_outputs=1))
    attrs["case_change_action"] = "UPPER"
    (up,) = forward([words], attrs, OpContext(opset=21, num_outputs=1))
    assert list(low) == ["mixed", "case"]
    assert list(up) == ["MIXED", "CASE"]
