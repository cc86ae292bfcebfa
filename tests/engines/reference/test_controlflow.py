"""If, Loop and Scan against onnxruntime (the independent oracle), outer scope included."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
from mconv.engines.reference.executor import Executor
from onnx import TensorProto as TP
from onnx import helper as oh


def _vi(name, shape, t=TP.FLOAT):
    return oh.make_tensor_value_info(name, t, shape)


def _both(graph, feeds, opset=17):
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)
    got = Executor(ir.serde.deserialize_model(proto)).run(feeds)
    return [got[o.name] for o in graph.output], want


def test_if_runs_the_branch_the_condition_picks_and_reads_outer_scope():
    then_g = oh.make_graph([oh.make_node("Add", ["x", "x"], ["t"])], "then", [], [_vi("t", [3])])
    else_g = oh.make_graph([oh.make_node("Neg", ["x"], ["e"])], "else", [], [_vi("e", [3])])
    graph = oh.make_graph(
        [oh.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
        "g",
        [_vi("c", [], TP.BOOL), _vi("x", [3])],
        [_vi("y", [3])],
    )
    x = np.array([1.0, -2.0, 3.0], np.float32)
    for cond in (True, False):
        got, want = _both(graph, {"c": np.array(cond), "x": x})
        np.testing.assert_array_equal(got[0], want[0])


def _loop_graph():
    # carried s <- s + x * i ; scan output: s after each step; stop when s > limit
    body = oh.make_graph(
        [
            oh.make_node("Cast", ["i"], ["fi"], to=TP.FLOAT),
            oh.make_node("Mul", ["x", "fi"], ["xi"]),
            oh.make_node("Add", ["s_in", "xi"], ["s_out"]),
            oh.make_node("ReduceSum", ["s_out"], ["tot"], keepdims=0),
            oh.make_node("Less", ["tot", "limit"], ["c_out"]),
            oh.make_node("Identity", ["s_out"], ["scan"]),
        ],
        "body",
        [_vi("i", [], TP.INT64), _vi("c_in", [], TP.BOOL), _vi("s_in", [2])],
        [_vi("c_out", [], TP.BOOL), _vi("s_out", [2]), _vi("scan", [2])],
    )
    return oh.make_graph(
        [oh.make_node("Loop", ["M", "c", "s0"], ["s", "hist"], body=body)],
        "g",
        [_vi("M", [], TP.INT64), _vi("c", [], TP.BOOL), _vi("s0", [2]), _vi("x", [2]), _vi("limit", [])],
        [_vi("s", [2]), _vi("hist", [None, 2])],
    )


def test_loop_stops_on_trip_count_or_condition_and_stacks_scan_outputs():
    graph = _loop_graph()
    base = {
        "c": np.array(True),
        "s0": np.array([0.0, 1.0], np.float32),
        "x": np.array([1.0, 2.0], np.float32),
    }
    for trips, limit in ((5, 1000.0), (10, 20.0), (0, 1000.0)):
        feeds = {**base, "M": np.array(trips, np.int64), "limit": np.array(limit, np.float32)}
        got, want = _both(graph, feeds)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w)


def test_scan_slices_inputs_along_axes_and_directions_and_stacks_outputs():
    body = oh.make_graph(
        [oh.make_node("Add", ["acc_in", "xt"], ["acc_out"]), oh.make_node("Mul", ["acc_out", "w"], ["yt"])],
        "body",
        [_vi("acc_in", [3]), _vi("xt", [3])],
        [_vi("acc_out", [3]), _vi("yt", [3])],
    )
    node = oh.make_node(
        "Scan",
        ["acc0", "xs"],
        ["acc", "ys"],
        body=body,
        num_scan_inputs=1,
        scan_input_axes=[1],
        scan_input_directions=[1],
        scan_output_axes=[1],
        scan_output_directions=[0],
    )
    graph = oh.make_graph(
        [node],
        "g",
        [_vi("acc0", [3]), _vi("xs", [3, 4]), _vi("w", [3])],
        [_vi("acc", [3]), _vi("ys", [3, 4])],
    )
    rng = np.random.default_rng(0)
    feeds = {
        "acc0": rng.standard_normal(3).astype(np.float32),
        "xs": rng.standard_normal((3, 4)).astype(np.float32),
        "w": rng.standard_normal(3).astype(np.float32),
    }
    got, want = _both(graph, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_sequence_ops_round_trip_through_split_and_concat():
    nodes = [
        oh.make_node("SplitToSequence", ["x"], ["seq"], axis=1),
        oh.make_node("SequenceLength", ["seq"], ["n"]),
        oh.make_node("ConcatFromSequence", ["seq"], ["y"], axis=0, new_axis=1),
    ]
    graph = oh.make_graph(nodes, "g", [_vi("x", [2, 3])], [_vi("n", [], TP.INT64), _vi("y", [3, 2])])
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    got, want = _both(graph, {"x": x})
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_if_gradient_reaches_outer_values_read_by_the_taken_branch():
    # then: y = x * w ; else: y = x + w. d(sum y)/dw by hand: x (then) or 1 (else).
    then_g = oh.make_graph([oh.make_node("Mul", ["x", "w"], ["t"])], "then", [], [_vi("t", [3])])
    else_g = oh.make_graph([oh.make_node("Add", ["x", "w"], ["e"])], "else", [], [_vi("e", [3])])
    graph = oh.make_graph(
        [oh.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
        "g",
        [_vi("c", [], TP.BOOL), _vi("x", [3], TP.DOUBLE), _vi("w", [3], TP.DOUBLE)],
        [_vi("y", [3], TP.DOUBLE)],
    )
    exe = Executor(ir.serde.deserialize_model(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])))
    x = np.array([1.5, -2.0, 3.0])
    w = np.array([0.5, 4.0, -1.0])
    for cond, want_w, want_x in ((True, x, w), (False, np.ones(3), np.ones(3))):
        grads = exe.vjp({"c": np.array(cond), "x": x, "w": w}, {"y": np.ones(3)}, ["w", "x"])
        np.testing.assert_allclose(grads["w"], want_w)
        np.testing.assert_allclose(grads["x"], want_x)


def _fd_grad(exe, feeds, name, out, eps=1e-6):
    base = feeds[name]
    num = np.zeros_like(base)
    for idx in np.ndindex(base.shape):
        vals = []
        for sign in (1, -1):
            pert = base.copy()
            pert[idx] += sign * eps
            vals.append(float(exe.run({**feeds, name: pert})[out].sum()))
        num[idx] = (vals[0] - vals[1]) / (2 * eps)
    return num


def test_loop_gradient_matches_finite_differences_for_carried_and_outer_values():
    # s <- s * w + x (w read from the outer scope); scan output s*s; loss = sum(s) + sum(hist)
    body = oh.make_graph(
        [
            oh.make_node("Identity", ["c_in"], ["c_out"]),
            oh.make_node("Mul", ["s_in", "w"], ["sw"]),
            oh.make_node("Add", ["sw", "x"], ["s_out"]),
            oh.make_node("Mul", ["s_out", "s_out"], ["sq"]),
        ],
        "body",
        [_vi("i", [], TP.INT64), _vi("c_in", [], TP.BOOL), _vi("s_in", [2], TP.DOUBLE)],
        [_vi("c_out", [], TP.BOOL), _vi("s_out", [2], TP.DOUBLE), _vi("sq", [2], TP.DOUBLE)],
    )
    nodes = [
        oh.make_node("Loop", ["M", "", "s0"], ["s", "hist"], body=body),
        oh.make_node("ReduceSum", ["hist"], ["h"], keepdims=0),
        oh.make_node("ReduceSum", ["s"], ["t"], keepdims=0),
        oh.make_node("Add", ["h", "t"], ["loss"]),
    ]
    graph = oh.make_graph(
        nodes,
        "g",
        [
            _vi("M", [], TP.INT64),
            _vi("s0", [2], TP.DOUBLE),
            _vi("x", [2], TP.DOUBLE),
            _vi("w", [2], TP.DOUBLE),
        ],
        [_vi("loss", [], TP.DOUBLE)],
    )
    exe = Executor(ir.serde.deserialize_model(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])))
    feeds = {
        "M": np.array(3, np.int64),
        "s0": np.array([0.5, -1.0]),
        "x": np.array([0.3, 0.2]),
        "w": np.array([0.9, -0.7]),
    }
    _, grads = exe.value_and_grad(feeds, "loss", ["s0", "x", "w"])
    for name in ("s0", "x", "w"):
        np.testing.assert_allclose(grads[name], _fd_grad(exe, feeds, name, "loss"), rtol=1e-6, err_msg=name)


def test_scan_gradient_matches_finite_differences_with_reversed_input():
    body = oh.make_graph(
        [
            oh.make_node("Mul", ["acc_in", "xt"], ["p"]),
            oh.make_node("Add", ["p", "w"], ["acc_out"]),
            oh.make_node("Tanh", ["acc_out"], ["yt"]),
        ],
        "body",
        [_vi("acc_in", [3], TP.DOUBLE), _vi("xt", [3], TP.DOUBLE)],
        [_vi("acc_out", [3], TP.DOUBLE), _vi("yt", [3], TP.DOUBLE)],
    )
    nodes = [
        oh.make_node(
            "Scan",
            ["acc0", "xs"],
            ["acc", "ys"],
            body=body,
            num_scan_inputs=1,
            scan_input_axes=[1],
            scan_input_directions=[1],
        ),
        oh.make_node("ReduceSum", ["ys"], ["a"], keepdims=0),
        oh.make_node("ReduceSum", ["acc"], ["b"], keepdims=0),
        oh.make_node("Add", ["a", "b"], ["loss"]),
    ]
    graph = oh.make_graph(
        nodes,
        "g",
        [_vi("acc0", [3], TP.DOUBLE), _vi("xs", [3, 4], TP.DOUBLE), _vi("w", [3], TP.DOUBLE)],
        [_vi("loss", [], TP.DOUBLE)],
    )
    exe = Executor(ir.serde.deserialize_model(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])))
    rng = np.random.default_rng(3)
    feeds = {
        "acc0": rng.standard_normal(3),
        "xs": rng.standard_normal((3, 4)) * 0.5,
        "w": rng.standard_normal(3),
    }
    _, grads = exe.value_and_grad(feeds, "loss", ["acc0", "xs", "w"])
    for name in ("acc0", "xs", "w"):
        np.testing.assert_allclose(
            grads[name], _fd_grad(exe, feeds, name, "loss"), rtol=1e-6, atol=1e-9, err_msg=name
        )
