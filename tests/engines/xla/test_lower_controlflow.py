"""Control flow (If, Loop, Scan) through XLA against ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from mconv.errors import UnsupportedError
from mconv.targets.xla import load_model
from onnx import TensorProto, helper

RNG = np.random.default_rng(1)
F, B, I64 = TensorProto.FLOAT, TensorProto.BOOL, TensorProto.INT64


def _check(proto, feeds, rtol=1e-4, atol=1e-5, options=None):
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)
    runner = load_model(ir.serde.deserialize_model(proto), options=options)
    got = runner.run(feeds)
    for w, name in zip(want, runner.outputs):
        assert got[name].shape == w.shape, name
        np.testing.assert_allclose(got[name], w, rtol=rtol, atol=atol)


def _vi(name, shape, dtype=F):
    if shape is None:
        return onnx.ValueInfoProto(name=name)
    return helper.make_tensor_value_info(name, dtype, shape)


def _init(name, arr):
    return onnx.numpy_helper.from_array(np.asarray(arr), name)


def _graph_model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _if_model(cond_init=None):
    then = helper.make_graph([helper.make_node("Add", ["x", "x"], ["t"])], "then", [], [_vi("t", [2, 3])])
    els = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [_vi("e", [2, 3])])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=els)
    if cond_init is None:
        return _graph_model([node], [_vi("c", [], B), _vi("x", [2, 3])], [_vi("y", None)])
    return _graph_model([node], [_vi("x", [2, 3])], [_vi("y", None)], [_init("c", np.array(cond_init))])


@pytest.mark.parametrize("c", [True, False])
def test_if_with_a_traced_condition_matches_onnxruntime(c):
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    _check(_if_model(), {"c": np.array(c), "x": x}, options={"batch": 2})


@pytest.mark.parametrize("c", [True, False])
def test_if_with_a_static_condition_picks_its_branch(c):
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    _check(_if_model(cond_init=c), {"x": x}, options={"batch": 2})


def _loop_body(with_scan: bool, cond_from_body: bool):
    # (i, cond, acc) -> (cond', acc + x * i, [acc]); cond' = sum(acc') < 20 when cond_from_body
    nodes = [
        helper.make_node("Cast", ["i"], ["fi"], to=F),
        helper.make_node("Mul", ["x", "fi"], ["xi"]),
        helper.make_node("Add", ["acc", "xi"], ["acc_out"]),
    ]
    if cond_from_body:
        nodes += [
            helper.make_node("ReduceSum", ["acc_out"], ["s"], keepdims=0),
            helper.make_node("Less", ["s", "limit"], ["c_out"]),
        ]
    else:
        nodes.append(helper.make_node("Identity", ["c_in"], ["c_out"]))
    outs = [_vi("c_out", [], B), _vi("acc_out", [3])]
    if with_scan:
        nodes.append(helper.make_node("Identity", ["acc"], ["scan_out"]))
        outs.append(_vi("scan_out", [3]))
    return helper.make_graph(nodes, "body", [_vi("i", [], I64), _vi("c_in", [], B), _vi("acc", [3])], outs)


def test_loop_with_a_static_trip_count_and_scan_outputs_matches_onnxruntime():
    body = _loop_body(with_scan=True, cond_from_body=False)
    node = helper.make_node("Loop", ["M", "", "acc0"], ["acc", "stack"], body=body)
    m = _graph_model(
        [node],
        [_vi("x", [3]), _vi("acc0", [3])],
        [_vi("acc", None), _vi("stack", None)],
        [_init("M", np.int64(4))],
    )
    feeds = {
        "x": RNG.standard_normal(3).astype(np.float32),
        "acc0": RNG.standard_normal(3).astype(np.float32),
    }
    _check(m, feeds, options={"batch": 3})


@pytest.mark.parametrize("trip", [None, 50, 2])
def test_loop_with_a_carried_condition_becomes_a_while_loop(trip):
    body = _loop_body(with_scan=False, cond_from_body=True)
    inits = [_init("limit", np.float32(20.0)), _init("c0", np.array(True))]
    if trip is not None:
        inits.append(_init("M", np.int64(trip)))
    node = helper.make_node("Loop", ["M" if trip is not None else "", "c0", "acc0"], ["acc"], body=body)
    m = _graph_model([node], [_vi("x", [3]), _vi("acc0", [3])], [_vi("acc", None)], inits)
    feeds = {"x": np.array([1.0, 2.0, 0.5], np.float32), "acc0": RNG.standard_normal(3).astype(np.float32)}
    _check(m, feeds, options={"batch": 3})


def test_loop_with_scan_outputs_and_a_traced_trip_count_is_refused():
    body = _loop_body(with_scan=True, cond_from_body=False)
    node = helper.make_node("Loop", ["M", "", "acc0"], ["acc", "stack"], body=body, name="loop1")
    m = _graph_model(
        [node], [_vi("M", [], I64), _vi("x", [3]), _vi("acc0", [3])], [_vi("acc", None), _vi("stack", None)]
    )
    with pytest.raises(UnsupportedError, match="static trip count"):
        load_model(ir.serde.deserialize_model(m), options={"batch": 3})


@pytest.mark.parametrize(
    "attrs",
    [
        {},
        dict(
            scan_input_axes=[1], scan_input_directions=[1], scan_output_axes=[1], scan_output_directions=[1]
        ),
    ],
)
def test_scan_matches_onnxruntime(attrs):
    # state: running sum (2,), scan input row (2,) -> (sum + row, (sum + row) * w)
    body = helper.make_graph(
        [
            helper.make_node("Add", ["s", "row"], ["s_out"]),
            helper.make_node("Mul", ["s_out", "w"], ["y"]),
        ],
        "body",
        [_vi("s", [2]), _vi("row", [2])],
        [_vi("s_out", [2]), _vi("y", [2])],
    )
    node = helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1, **attrs)
    xs_shape = [2, 5] if attrs else [5, 2]
    m = _graph_model(
        [node],
        [_vi("s0", [2]), _vi("xs", xs_shape)],
        [_vi("s", None), _vi("ys", None)],
        [_init("w", RNG.standard_normal(2).astype(np.float32))],
    )
    feeds = {
        "s0": RNG.standard_normal(2).astype(np.float32),
        "xs": RNG.standard_normal(xs_shape).astype(np.float32),
    }
    _check(m, feeds, options={"batch": 2})


def test_an_unsupported_op_inside_a_branch_is_named_before_tracing():
    then = helper.make_graph(
        [helper.make_node("NonZero", ["x"], ["t"], name="nz_in_branch")], "then", [], [_vi("t", None)]
    )
    els = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [_vi("e", None)])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=els)
    m = _graph_model([node], [_vi("c", [], B), _vi("x", [2, 3])], [_vi("y", None)])
    with pytest.raises(UnsupportedError, match=r"nz_in_branch \(NonZero\)"):
        load_model(ir.serde.deserialize_model(m), options={"batch": 2})


def test_if_inside_a_loop_body_matches_onnxruntime():
    # acc' = acc + x when i is even (i % 2 == 0), else acc - x; 5 static iterations.
    then = helper.make_graph([helper.make_node("Add", ["acc", "x"], ["t"])], "then", [], [_vi("t", [3])])
    els = helper.make_graph([helper.make_node("Sub", ["acc", "x"], ["e"])], "else", [], [_vi("e", [3])])
    body = helper.make_graph(
        [
            helper.make_node("Mod", ["i", "two"], ["r"]),
            helper.make_node("Equal", ["r", "zero"], ["even"]),
            helper.make_node("If", ["even"], ["acc_out"], then_branch=then, else_branch=els),
            helper.make_node("Identity", ["c_in"], ["c_out"]),
        ],
        "body",
        [_vi("i", [], I64), _vi("c_in", [], B), _vi("acc", [3])],
        [_vi("c_out", [], B), _vi("acc_out", [3])],
    )
    node = helper.make_node("Loop", ["M", "", "acc0"], ["acc"], body=body)
    inits = [_init("M", np.int64(5)), _init("two", np.int64(2)), _init("zero", np.int64(0))]
    m = _graph_model([node], [_vi("x", [3]), _vi("acc0", [3])], [_vi("acc", None)], inits)
    feeds = {
        "x": RNG.standard_normal(3).astype(np.float32),
        "acc0": RNG.standard_normal(3).astype(np.float32),
    }
    _check(m, feeds, options={"batch": 3})
