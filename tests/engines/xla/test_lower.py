"""Per-op-family lowering checks: each ONNX op through XLA against ONNX Runtime (the oracle), except
the integer ops (MatMulInteger, ConvInteger, QLinear*), checked against exact integer arithmetic."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from mconv.errors import UnsupportedError
from mconv.targets.xla import load_model
from onnx import TensorProto, helper

RNG = np.random.default_rng(0)
F = TensorProto.FLOAT


def _model(node, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph([node], "g", inputs, outputs, initializer=list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _check(proto, feeds, rtol=1e-4, atol=1e-5, options=None):
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)
    runner = load_model(ir.serde.deserialize_model(proto), options=options)
    got = runner.run(feeds)
    for w, name in zip(want, runner.outputs):
        assert got[name].shape == w.shape, name
        np.testing.assert_allclose(got[name], w, rtol=rtol, atol=atol)


def _vi(name, shape, dtype=F):
    if shape is None:  # an output whose type ONNX Runtime infers
        return onnx.ValueInfoProto(name=name)
    return helper.make_tensor_value_info(name, dtype, shape)


def _init(name, arr):
    return onnx.numpy_helper.from_array(np.asarray(arr), name)


def _unary_case(op, shape, attrs=None, opset=17, xs=None):
    x = RNG.standard_normal(shape).astype(np.float32) if xs is None else xs
    node = helper.make_node(op, ["x"], ["y"], **(attrs or {}))
    return _model(node, [_vi("x", list(shape))], [_vi("y", None)], opset=opset), {"x": x}


CONV_CASES = [
    dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
    dict(kernel_shape=[3, 3], strides=[2, 2], dilations=[2, 1], pads=[0, 1, 2, 1]),
    dict(kernel_shape=[3, 3], auto_pad="SAME_UPPER", strides=[2, 2]),
    dict(kernel_shape=[2, 2], auto_pad="SAME_LOWER", strides=[1, 1]),
    dict(kernel_shape=[3, 3], group=2),
    dict(kernel_shape=[3, 3], group=4, auto_pad="VALID"),
]


@pytest.mark.parametrize("attrs", CONV_CASES)
def test_conv_matches_onnxruntime(attrs):
    g = attrs.get("group", 1)
    w = RNG.standard_normal((4, 4 // g, *attrs["kernel_shape"])).astype(np.float32)
    b = RNG.standard_normal(4).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    m = _model(node, [_vi("x", [2, 4, 9, 8])], [_vi("y", None)], [_init("w", w), _init("b", b)])
    _check(m, {"x": RNG.standard_normal((2, 4, 9, 8)).astype(np.float32)})


@pytest.mark.parametrize(
    "attrs",
    [
        dict(kernel_shape=[3, 3], strides=[2, 2]),
        dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 1, 1], output_padding=[1, 0]),
        dict(kernel_shape=[2, 2], strides=[2, 2], group=2, dilations=[1, 2]),
        dict(kernel_shape=[3, 3], strides=[2, 2], output_shape=[10, 9]),
    ],
)
def test_conv_transpose_matches_onnxruntime(attrs):
    g = attrs.get("group", 1)
    w = RNG.standard_normal((4, 6 // g, *attrs["kernel_shape"])).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], **attrs)
    m = _model(node, [_vi("x", [1, 4, 5, 4])], [_vi("y", None)], [_init("w", w)])
    _check(m, {"x": RNG.standard_normal((1, 4, 5, 4)).astype(np.float32)})


@pytest.mark.parametrize(
    "op,attrs",
    [
        ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2])),
        ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
        ("MaxPool", dict(kernel_shape=[2, 2], pads=[1, 1, 0, 0], dilations=[2, 2])),
        ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
        ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1)),
        (
            "AveragePool",
            dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1, count_include_pad=1, pads=[1, 1, 1, 1]),
        ),
        ("AveragePool", dict(kernel_shape=[3, 2], auto_pad="SAME_UPPER", strides=[2, 2])),
        ("LpPool", dict(kernel_shape=[2, 2], p=2)),
        ("GlobalAveragePool", {}),
        ("GlobalMaxPool", {}),
    ],
)
def test_pooling_matches_onnxruntime(op, attrs):
    _check(*_unary_case(op, (2, 3, 10, 9), attrs))


@pytest.mark.parametrize(
    "op,attrs",
    [
        ("LRN", dict(size=5, alpha=1e-3, beta=0.75, bias=2.0)),
        ("LRN", dict(size=3)),
        ("Relu", {}),
        ("LeakyRelu", dict(alpha=0.2)),
        ("Elu", {}),
        ("Selu", {}),
        ("Sigmoid", {}),
        ("HardSigmoid", {}),
        ("HardSwish", {}),
        ("Tanh", {}),
        ("Softplus", {}),
        ("Softsign", {}),
        ("Erf", {}),
        ("Softmax", dict(axis=1)),
        ("LogSoftmax", {}),
        ("Hardmax", dict(axis=-1)),
        ("Transpose", dict(perm=[0, 2, 3, 1])),
        ("Flatten", dict(axis=2)),
        ("ReduceMean", dict(axes=[1, 3], keepdims=1)),
        ("ReduceMax", dict(axes=[2], keepdims=0)),
        ("ArgMax", dict(axis=1)),
    ],
)
def test_unary_ops_match_onnxruntime(op, attrs):
    _check(*_unary_case(op, (2, 6, 5, 4), attrs))


def test_softmax_before_opset_13_normalizes_the_flattened_block():
    _check(*_unary_case("Softmax", (2, 3, 4), {"axis": 1}, opset=11))


def test_batchnorm_layernorm_instancenorm_match_onnxruntime():
    c = 3
    s, b = RNG.random(c).astype(np.float32) + 0.5, RNG.standard_normal(c).astype(np.float32)
    mean, var = RNG.standard_normal(c).astype(np.float32), RNG.random(c).astype(np.float32) + 0.1
    inits = [_init("s", s), _init("b", b), _init("m", mean), _init("v", var)]
    x = RNG.standard_normal((2, c, 4, 5)).astype(np.float32)
    for node, names in [
        (helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-3), 4),
        (helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"]), 2),
    ]:
        _check(_model(node, [_vi("x", [2, c, 4, 5])], [_vi("y", None)], inits[:names]), {"x": x})
    ln = helper.make_node("LayerNormalization", ["x", "g", "h"], ["y"], axis=-2)
    g, h = RNG.random((4, 5)).astype(np.float32), RNG.standard_normal((4, 5)).astype(np.float32)
    _check(_model(ln, [_vi("x", [2, c, 4, 5])], [_vi("y", None)], [_init("g", g), _init("h", h)]), {"x": x})


def test_gemm_matmul_einsum_match_onnxruntime():
    a = RNG.standard_normal((3, 4)).astype(np.float32)
    w = RNG.standard_normal((5, 4)).astype(np.float32)
    c = RNG.standard_normal(5).astype(np.float32)
    gemm = helper.make_node("Gemm", ["a", "w", "c"], ["y"], transB=1, alpha=0.5, beta=2.0)
    _check(_model(gemm, [_vi("a", [3, 4])], [_vi("y", None)], [_init("w", w), _init("c", c)]), {"a": a})
    mm = helper.make_node("MatMul", ["a", "w"], ["y"])
    w3 = RNG.standard_normal((2, 4, 6)).astype(np.float32)
    _check(_model(mm, [_vi("a", [3, 4])], [_vi("y", None)], [_init("w", w3)]), {"a": a})
    es = helper.make_node("Einsum", ["a", "w"], ["y"], equation="ij,kj->ik")
    _check(_model(es, [_vi("a", [3, 4])], [_vi("y", None)], [_init("w", w)]), {"a": a})


@pytest.mark.parametrize(
    "op,extra,attrs",
    [
        ("Reshape", [np.array([0, -1, 2], np.int64)], {}),
        ("Slice", [np.array([1, 0]), np.array([100, -1]), np.array([1, 3]), np.array([1, 2])], {}),
        ("Slice", [np.array([-1]), np.array([-100]), np.array([2]), np.array([-2])], {}),
        ("Pad", [np.array([0, 1, 0, 2, 0, 0, 1, 1])], {}),
        ("Pad", [np.array([0, 0, 1, 2, 0, 0, 1, 1])], {"mode": "reflect"}),
        ("Pad", [np.array([0, 0, 1, 0, 0, 0, 0, -1])], {"mode": "constant"}),
        ("Expand", [np.array([3, 1, 1, 1], np.int64)], {}),
        ("Tile", [np.array([1, 2, 1, 2], np.int64)], {}),
        ("Unsqueeze", [np.array([0, -1], np.int64)], {}),
        ("Squeeze", [np.array([0], np.int64)], {}),
        ("Split", [np.array([1, 3], np.int64)], {"axis": 1}),
        ("ReduceSum", [np.array([1], np.int64)], {"keepdims": 0}),
        ("Gather", [np.array([[0, -1], [2, 1]], np.int64)], {"axis": 1}),
        ("TopK", [np.array([2], np.int64)], {"axis": 1}),
        ("CumSum", [np.array(1, np.int64)], {"exclusive": 1, "reverse": 1}),
    ],
)
def test_shape_ops_match_onnxruntime(op, extra, attrs):
    names = [f"k{i}" for i in range(len(extra))]
    inits = [_init(n, np.asarray(a, np.int64)) for n, a in zip(names, extra)]
    n_out = 2 if op in ("Split", "TopK") else 1
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, ["x", *names], outs, **attrs)
    m = _model(node, [_vi("x", [1, 4, 3, 4])], [_vi(o, None) for o in outs], inits, opset=18)
    # A static batch: Squeeze/Expand of axis 0 needs the 1 that a symbolic batch would replace.
    _check(m, {"x": RNG.standard_normal((1, 4, 3, 4)).astype(np.float32)}, options={"batch": 1})


@pytest.mark.parametrize(
    "attrs,scales,sizes",
    [
        (dict(mode="nearest"), [1, 1, 2, 1.5], None),
        (
            dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
            [1, 1, 2, 3],
            None,
        ),
        (dict(mode="linear"), [1, 1, 2, 0.5], None),
        (dict(mode="linear", coordinate_transformation_mode="align_corners"), None, [1, 2, 7, 5]),
        (dict(mode="linear", coordinate_transformation_mode="pytorch_half_pixel"), None, [1, 2, 9, 3]),
    ],
)
def test_resize_matches_onnxruntime(attrs, scales, sizes):
    roi = np.zeros(0, np.float32)
    inits = [_init("roi", roi)]
    ins = ["x", "roi"]
    if scales is not None:
        inits.append(_init("scales", np.array(scales, np.float32)))
        ins.append("scales")
    else:
        inits.append(_init("scales", np.zeros(0, np.float32)))
        inits.append(_init("sizes", np.array(sizes, np.int64)))
        ins += ["scales", "sizes"]
    node = helper.make_node("Resize", ins, ["y"], **attrs)
    m = _model(node, [_vi("x", [1, 2, 4, 6])], [_vi("y", None)], inits, opset=13)
    _check(m, {"x": RNG.standard_normal((1, 2, 4, 6)).astype(np.float32)})


def test_elementwise_broadcast_and_where_match_onnxruntime():
    nodes = [
        helper.make_node("Mul", ["a", "b"], ["m"]),
        helper.make_node("Sub", ["m", "a"], ["s"]),
        helper.make_node("Greater", ["s", "b"], ["c"]),
        helper.make_node("Where", ["c", "s", "a"], ["w"]),
        helper.make_node("Pow", ["w", "two"], ["p"]),
        helper.make_node("Clip", ["p", "lo", "hi"], ["y"]),
    ]
    inits = [_init("two", np.float32(2.0)), _init("lo", np.float32(0.1)), _init("hi", np.float32(2.0))]
    graph = helper.make_graph(nodes, "g", [_vi("a", [2, 3, 4]), _vi("b", [3, 1])], [_vi("y", None)], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {
        "a": RNG.standard_normal((2, 3, 4)).astype(np.float32),
        "b": RNG.standard_normal((3, 1)).astype(np.float32),
    }
    _check(m, feeds)


def test_dequantize_linear_per_axis_matches_onnxruntime():
    q = RNG.integers(-128, 127, (4, 3)).astype(np.int8)
    scale = (RNG.random(4) + 0.1).astype(np.float32)
    zp = RNG.integers(-3, 3, 4).astype(np.int8)
    nodes = [
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["w"], axis=0),
        helper.make_node("MatMul", ["x", "w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [_vi("x", [2, 4])], [_vi("y", None)], [_init("q", q), _init("s", scale), _init("z", zp)]
    )
    _check(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
        {"x": RNG.standard_normal((2, 4)).astype(np.float32)},
    )


@pytest.mark.parametrize(
    "op,gates,attrs",
    [
        ("LSTM", 4, dict(hidden_size=5)),
        ("LSTM", 4, dict(hidden_size=5, direction="bidirectional")),
        ("GRU", 3, dict(hidden_size=5)),
        ("GRU", 3, dict(hidden_size=5, linear_before_reset=1, direction="reverse")),
        ("RNN", 1, dict(hidden_size=5)),
    ],
)
def test_recurrent_ops_match_onnxruntime(op, gates, attrs):
    dirs = 2 if attrs.get("direction") == "bidirectional" else 1
    h, i = attrs["hidden_size"], 3
    w = (RNG.standard_normal((dirs, gates * h, i)) * 0.5).astype(np.float32)
    r = (RNG.standard_normal((dirs, gates * h, h)) * 0.5).astype(np.float32)
    b = (RNG.standard_normal((dirs, 2 * gates * h)) * 0.5).astype(np.float32)
    node = helper.make_node(op, ["x", "w", "r", "b"], ["y", "yh"], **attrs)
    m = _model(
        node,
        [_vi("x", [6, 2, i])],
        [_vi("y", None), _vi("yh", None)],
        [_init("w", w), _init("r", r), _init("b", b)],
    )
    _check(m, {"x": RNG.standard_normal((6, 2, i)).astype(np.float32)})


def test_shape_chain_reshape_follows_a_symbolic_batch():
    # Shape -> Gather(0) -> Unsqueeze -> Concat([-1]) -> Reshape: the batch stays symbolic.
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    inits = [
        _init("zero", np.int64(0)),
        _init("ax", np.array([0], np.int64)),
        _init("minus1", np.array([-1], np.int64)),
    ]
    graph = helper.make_graph(nodes, "g", [_vi("x", ["N", 3, 4])], [_vi("y", None)], inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    runner = load_model(ir.serde.deserialize_model(proto))
    assert runner.inputs[0].shape[0] == "b"  # a symbolic leading dimension becomes the batch "b"
    for n in (1, 3):
        x = RNG.standard_normal((n, 3, 4)).astype(np.float32)
        np.testing.assert_array_equal(runner.run({"x": x})["y"], x.reshape(n, -1))


def test_unsupported_ops_are_all_named_in_one_error():
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="ok"),
        helper.make_node("NonMaxSuppression", ["a", "a"], ["b"], name="nms1"),
        helper.make_node("Foo", ["a"], ["c"], name="custom1", domain="my.domain"),
        helper.make_node("Add", ["b", "c"], ["y"], name="add"),
    ]
    graph = helper.make_graph(nodes, "g", [_vi("x", [1, 2, 4])], [_vi("y", None)])
    proto = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("my.domain", 1)]
    )
    with pytest.raises(UnsupportedError) as err:
        load_model(ir.serde.deserialize_model(proto))
    msg = str(err.value)
    assert "nms1 (NonMaxSuppression)" in msg and "custom1 (my.domain::Foo)" in msg
    assert "2 unsupported" in msg and err.value.exit_code == 2


def _ref_check(proto, feeds, rtol=1e-5, atol=1e-6, options=None):
    """Like ``_check`` with the reference executor as the oracle (ops ONNX Runtime lacks)."""
    from mconv.engines.reference.executor import Executor

    model = ir.serde.deserialize_model(proto)
    want = Executor(model).run(feeds)
    runner = load_model(ir.serde.deserialize_model(proto), options=options)
    got = runner.run(feeds)
    for name in runner.outputs:
        w = np.asarray(want[name])
        assert got[name].shape == w.shape, name
        np.testing.assert_allclose(got[name], w, rtol=rtol, atol=atol)


@pytest.mark.parametrize(
    "idx,batch_dims",
    [
        ([[0, 1], [2, -1]], 0),
        ([[1], [0]], 0),
        ([[[0, 1]], [[1, 0]], [[2, 1]]], 1),
    ],
)
def test_gather_nd_matches_onnxruntime(idx, batch_dims):
    node = helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=batch_dims)
    m = _model(node, [_vi("x", [3, 3, 2])], [_vi("y", None)], [_init("i", np.array(idx, np.int64))])
    _check(m, {"x": RNG.standard_normal((3, 3, 2)).astype(np.float32)}, options={"batch": 3})


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd_matches_onnxruntime(reduction):
    idx = np.array([[0, 1], [2, -1], [0, 1]] if reduction != "none" else [[0, 1], [2, -1]], np.int64)
    upd = RNG.standard_normal((len(idx), 2)).astype(np.float32)
    node = helper.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction=reduction)
    m = _model(node, [_vi("x", [3, 3, 2])], [_vi("y", None)], [_init("i", idx), _init("u", upd)], opset=18)
    _check(m, {"x": RNG.standard_normal((3, 3, 2)).astype(np.float32)}, options={"batch": 3})


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements_matches_onnxruntime(reduction):
    idx = np.array([[1, 0, 2], [0, -1, 1]] if reduction != "none" else [[1, 0, 2], [0, 2, 1]], np.int64)
    upd = RNG.standard_normal((2, 3)).astype(np.float32)
    node = helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=1, reduction=reduction)
    m = _model(node, [_vi("x", [2, 4])], [_vi("y", None)], [_init("i", idx), _init("u", upd)], opset=18)
    _check(m, {"x": RNG.standard_normal((2, 4)).astype(np.float32)}, options={"batch": 2})


def test_scatter_with_traced_indices_and_updates_matches_onnxruntime():
    node = helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=0, reduction="add")
    m = _model(
        node,
        [_vi("x", [3, 2]), _vi("i", [2, 2], TensorProto.INT64), _vi("u", [2, 2])],
        [_vi("y", None)],
        opset=18,
    )
    feeds = {
        "x": RNG.standard_normal((3, 2)).astype(np.float32),
        "i": np.array([[2, 0], [2, 1]], np.int64),
        "u": RNG.standard_normal((2, 2)).astype(np.float32),
    }
    _check(m, feeds, options={"batch": 3})


@pytest.mark.parametrize(
    "attrs,scales,sizes",
    [
        (dict(mode="cubic"), [1, 1, 2, 1.5], None),
        (dict(mode="cubic", cubic_coeff_a=-0.5, exclude_outside=1), [1, 1, 0.5, 2], None),
        (dict(mode="cubic", coordinate_transformation_mode="align_corners"), None, [1, 2, 7, 5]),
        (dict(mode="cubic", coordinate_transformation_mode="asymmetric"), [1, 1, 3, 2], None),
    ],
)
def test_resize_cubic_matches_onnxruntime(attrs, scales, sizes):
    test_resize_matches_onnxruntime(attrs, scales, sizes)


@pytest.mark.parametrize("attrs", [{}, {"k": 1}, {"k": -2, "dtype": TensorProto.INT32}])
def test_eye_like_matches_onnxruntime(attrs):
    node = helper.make_node("EyeLike", ["x"], ["y"], **attrs)
    m = _model(node, [_vi("x", [3, 4])], [_vi("y", None)])
    _check(m, {"x": RNG.standard_normal((3, 4)).astype(np.float32)}, options={"batch": 3})


def test_misc_ops_match_onnxruntime():
    x = RNG.standard_normal((2, 5, 3)).astype(np.float32)
    opts = {"batch": 2}
    cp = helper.make_node("CumProd", ["x", "ax"], ["y"], exclusive=1, reverse=1)
    cp_m = _model(cp, [_vi("x", [2, 5, 3])], [_vi("y", None)], [_init("ax", np.int64(1))], 26)
    _ref_check(cp_m, {"x": x}, rtol=1e-5, atol=1e-5, options=opts)  # ONNX Runtime lacks CumProd
    det = helper.make_node("Det", ["x"], ["y"])
    sq = RNG.standard_normal((2, 3, 3)).astype(np.float32)
    _check(_model(det, [_vi("x", [2, 3, 3])], [_vi("y", None)]), {"x": sq}, options=opts)
    rs = helper.make_node("ReverseSequence", ["x", "l"], ["y"], batch_axis=0, time_axis=1)
    lens = np.array([3, 5], np.int64)
    m = _model(rs, [_vi("x", [2, 5, 3]), _vi("l", [2], TensorProto.INT64)], [_vi("y", None)])
    _check(m, {"x": x, "l": lens}, options=opts)
    rs2 = helper.make_node("ReverseSequence", ["x", "l"], ["y"], batch_axis=1, time_axis=0)
    m = _model(rs2, [_vi("x", [5, 2, 3]), _vi("l", [2], TensorProto.INT64)], [_vi("y", None)])
    _check(m, {"x": x.transpose(1, 0, 2).copy(), "l": lens}, options={"batch": 5})
    ccp = helper.make_node("CenterCropPad", ["x", "s"], ["y"], axes=[1, 2])
    m = _model(ccp, [_vi("x", [2, 5, 3])], [_vi("y", None)], [_init("s", np.array([2, 6], np.int64))], 18)
    _check(m, {"x": x}, options=opts)
    dq = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])
    m = _model(dq, [_vi("x", [2, 5, 3])], [_vi("y", None), _vi("s", None), _vi("z", None)])
    _check(m, {"x": x}, options=opts)


def _check_exact(proto, feeds, expected, atol=0, options=None):
    """The XLA lowering against an expected output computed in the test (integer ops: ONNX
    Runtime is no oracle for them, its u8 x s8 kernels saturate on CPUs without VNNI)."""
    runner = load_model(ir.serde.deserialize_model(proto), options=options)
    (name,) = runner.outputs
    got = runner.run(feeds)[name]
    assert got.shape == expected.shape and got.dtype == expected.dtype, (got.shape, got.dtype)
    diff = np.abs(got.astype(np.int64) - expected.astype(np.int64))
    assert diff.max() <= atol, diff.max()


def _conv_int_exact(x, w, x_zero, w_zero, strides=(1, 1), pads=(0, 0, 0, 0)):
    """2-D convolution of (x - x_zero) and (w - w_zero) in int64, zero padding after the subtraction."""
    pt, pl, pb, pr = pads
    xi = np.pad(x.astype(np.int64) - np.int64(x_zero), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    wi = w.astype(np.int64) - np.asarray(w_zero, np.int64).reshape(-1, 1, 1, 1)
    (sh, sw), (kh, kw) = strides, wi.shape[2:]
    oh, ow = (xi.shape[2] - kh) // sh + 1, (xi.shape[3] - kw) // sw + 1
    out = np.zeros((x.shape[0], wi.shape[0], oh, ow), np.int64)
    for i in range(oh):
        for j in range(ow):
            win = xi[:, None, :, i * sh : i * sh + kh, j * sw : j * sw + kw]
            out[:, :, i, j] = (win * wi[None]).sum(axis=(2, 3, 4))
    return out


def _requantize(acc, scale, zero):
    """QLinear* output: round half to even in float32, add the zero point, saturate to uint8."""
    y = np.rint(acc.astype(np.float32) * np.asarray(scale, np.float32)) + np.float32(zero)
    return np.clip(y, 0, 255).astype(np.uint8)


def test_integer_ops_match_exact_integer_arithmetic():
    a = RNG.integers(0, 255, (3, 4)).astype(np.uint8)
    b = RNG.integers(0, 255, (4, 5)).astype(np.uint8)
    node = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])
    m = _model(
        node,
        [_vi("a", [3, 4], TensorProto.UINT8)],
        [_vi("y", None)],
        [_init("b", b), _init("az", np.uint8(3)), _init("bz", np.uint8(7))],
    )
    expected = ((a.astype(np.int64) - 3) @ (b.astype(np.int64) - 7)).astype(np.int32)
    _check_exact(m, {"a": a}, expected, options={"batch": 3})
    x = RNG.integers(0, 1000, (3, 4)).astype(np.int32)
    for direction in ("LEFT", "RIGHT"):
        node = helper.make_node("BitShift", ["x", "s"], ["y"], direction=direction)
        m = _model(node, [_vi("x", [3, 4], TensorProto.UINT32)], [_vi("y", None)], [_init("s", np.uint32(2))])
        _check(m, {"x": x.astype(np.uint32)}, options={"batch": 3})


def test_bitcast_and_tensor_scatter_match_the_reference():
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    node = helper.make_node("BitCast", ["x"], ["y"], to=TensorProto.INT32)
    _ref_check(_model(node, [_vi("x", [2, 3])], [_vi("y", None)], opset=26), {"x": x}, options={"batch": 2})
    cache = RNG.standard_normal((2, 2, 6, 3)).astype(np.float32)
    upd = RNG.standard_normal((2, 2, 2, 3)).astype(np.float32)
    for mode, idx in (("linear", [1, 4]), ("circular", [5, 2])):
        node = helper.make_node("TensorScatter", ["c", "u", "i"], ["y"], mode=mode)
        m = _model(
            node,
            [_vi("c", [2, 2, 6, 3]), _vi("u", [2, 2, 2, 3]), _vi("i", [2], TensorProto.INT64)],
            [_vi("y", None)],
            opset=24,
        )
        _ref_check(m, {"c": cache, "u": upd, "i": np.array(idx, np.int64)}, options={"batch": 2})


def test_quantized_conv_and_matmul_match_exact_integer_arithmetic():
    x = RNG.integers(0, 255, (1, 2, 5, 5)).astype(np.uint8)
    w = RNG.integers(-100, 100, (3, 2, 3, 3)).astype(np.int8)
    node = helper.make_node("ConvInteger", ["x", "w", "xz"], ["y"], pads=[1, 1, 1, 1])
    m = _model(
        node,
        [_vi("x", [1, 2, 5, 5], TensorProto.UINT8)],
        [_vi("y", None)],
        [_init("w", w), _init("xz", np.uint8(5))],
    )
    expected = _conv_int_exact(x, w, 5, np.zeros(3, np.int64), pads=(1, 1, 1, 1)).astype(np.int32)
    _check_exact(m, {"x": x}, expected, options={"batch": 1})
    ws = np.array([0.01, 0.02, 0.015], np.float32)
    bias = RNG.integers(-500, 500, 3).astype(np.int32)
    inits = [
        _init("xs", np.float32(0.05)),
        _init("xz", np.uint8(7)),
        _init("w", w),
        _init("ws", ws),
        _init("wz", np.zeros(3, np.int8)),
        _init("ys", np.float32(0.3)),
        _init("yz", np.uint8(100)),
        _init("b", bias),
    ]
    node = helper.make_node(
        "QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"], strides=[2, 2]
    )
    m = _model(node, [_vi("x", [1, 2, 5, 5], TensorProto.UINT8)], [_vi("y", None)], inits)
    acc = _conv_int_exact(x, w, 7, np.zeros(3, np.int64), strides=(2, 2)) + bias[None, :, None, None]
    scale = (np.float32(0.05) * ws / np.float32(0.3)).reshape(1, 3, 1, 1)
    _check_exact(m, {"x": x}, _requantize(acc, scale, 100), atol=1, options={"batch": 1})
    a = RNG.integers(0, 255, (3, 4)).astype(np.uint8)
    b = RNG.integers(0, 255, (4, 5)).astype(np.uint8)
    inits = [
        _init("as", np.float32(0.02)),
        _init("az", np.uint8(120)),
        _init("b", b),
        _init("bs", np.float32(0.03)),
        _init("bz", np.uint8(128)),
        _init("ys", np.float32(0.1)),
        _init("yz", np.uint8(128)),
    ]
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    m = _model(node, [_vi("a", [3, 4], TensorProto.UINT8)], [_vi("y", None)], inits)
    acc = (a.astype(np.int64) - 120) @ (b.astype(np.int64) - 128)
    scale = np.float32(0.02) * np.float32(0.03) / np.float32(0.1)
    _check_exact(m, {"a": a}, _requantize(acc, scale, 128), atol=1, options={"batch": 3})


def test_signal_ops_match_onnxruntime():
    x = RNG.standard_normal((2, 8, 1)).astype(np.float32)
    for attrs in ({}, {"onesided": 1}, {"inverse": 1}):
        node = helper.make_node("DFT", ["x", "", "ax"], ["y"], **attrs)
        m = _model(node, [_vi("x", [2, 8, 1])], [_vi("y", None)], [_init("ax", np.int64(1))], opset=20)
        _check(m, {"x": x}, rtol=1e-4, atol=1e-4, options={"batch": 2})
    sig = RNG.standard_normal((1, 32, 1)).astype(np.float32)
    nodes = [
        helper.make_node("HannWindow", ["n"], ["win"]),
        helper.make_node("STFT", ["x", "step", "win", "n"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [_vi("x", [1, 32, 1])],
        [_vi("y", None)],
        [_init("n", np.int64(8)), _init("step", np.int64(4))],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    _check(m, {"x": sig}, rtol=1e-4, atol=1e-4, options={"batch": 1})


def test_col2im_and_max_unpool_match_the_reference():
    x = RNG.standard_normal((1, 2 * 4, 12)).astype(np.float32)
    node = helper.make_node("Col2Im", ["x", "img", "blk"], ["y"], strides=[1, 2], pads=[0, 1, 1, 0])
    inits = [_init("img", np.array([4, 6], np.int64)), _init("blk", np.array([2, 2], np.int64))]
    m = _model(node, [_vi("x", [1, 8, 12])], [_vi("y", None)], inits, opset=18)
    _ref_check(m, {"x": x}, options={"batch": 1})
    _check(m, {"x": x}, options={"batch": 1})
    v = RNG.standard_normal((1, 2, 2, 2)).astype(np.float32)
    idx = np.array([[[[0, 3], [9, 14]], [[17, 18], [28, 30]]]], np.int64)
    node = helper.make_node("MaxUnpool", ["v", "i", "shape"], ["y"], kernel_shape=[2, 2], strides=[2, 2])
    m = _model(
        node,
        [_vi("v", [1, 2, 2, 2]), _vi("i", [1, 2, 2, 2], TensorProto.INT64)],
        [_vi("y", None)],
        [_init("shape", np.array([1, 2, 5, 4], np.int64))],
    )
    _ref_check(m, {"v": v, "i": idx}, options={"batch": 1})


@pytest.mark.parametrize(
    "attrs",
    [
        dict(mode="linear"),
        dict(mode="nearest", padding_mode="border", align_corners=1),
        dict(mode="cubic", padding_mode="reflection"),
    ],
)
def test_grid_sample_matches_onnxruntime(attrs):
    x = RNG.standard_normal((1, 2, 4, 5)).astype(np.float32)
    grid = (RNG.random((1, 3, 4, 2)) * 2.4 - 1.2).astype(np.float32)
    node = helper.make_node("GridSample", ["x", "g"], ["y"], **attrs)
    m = _model(node, [_vi("x", [1, 2, 4, 5]), _vi("g", [1, 3, 4, 2])], [_vi("y", None)], opset=20)
    _check(m, {"x": x, "g": grid}, rtol=1e-4, atol=1e-4, options={"batch": 1})


@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align_matches_onnxruntime(mode):
    x = RNG.standard_normal((2, 2, 6, 7)).astype(np.float32)
    rois = np.array([[0.5, 1.0, 4.0, 5.5], [1.0, 0.0, 6.5, 3.0], [2.0, 2.0, 3.0, 3.0]], np.float32)
    node = helper.make_node(
        "RoiAlign", ["x", "r", "b"], ["y"], mode=mode, output_height=2, output_width=3, sampling_ratio=2
    )
    m = _model(
        node,
        [_vi("x", [2, 2, 6, 7]), _vi("r", [3, 4]), _vi("b", [3], TensorProto.INT64)],
        [_vi("y", None)],
        opset=16,
    )
    _check(
        m, {"x": x, "r": rois, "b": np.array([0, 1, 1], np.int64)}, rtol=1e-4, atol=1e-4, options={"batch": 2}
    )


def test_deform_conv_and_max_roi_pool_match_the_reference():
    x = RNG.standard_normal((1, 4, 5, 6)).astype(np.float32)
    w = RNG.standard_normal((2, 2, 3, 3)).astype(np.float32)
    off = (RNG.standard_normal((1, 2 * 2 * 9, 5, 6)) * 1.5).astype(np.float32)
    mask = RNG.random((1, 2 * 9, 5, 6)).astype(np.float32)
    node = helper.make_node(
        "DeformConv", ["x", "w", "o", "b", "m"], ["y"], pads=[1, 1, 1, 1], group=2, offset_group=2
    )
    m = _model(
        node,
        [_vi("x", [1, 4, 5, 6]), _vi("o", [1, 36, 5, 6]), _vi("m", [1, 18, 5, 6])],
        [_vi("y", None)],
        [_init("w", w), _init("b", RNG.standard_normal(2).astype(np.float32))],
        opset=19,
    )
    _ref_check(m, {"x": x, "o": off, "m": mask}, rtol=1e-4, atol=1e-4, options={"batch": 1})
    rois = np.array([[0, 0.4, 1.0, 4.6, 3.0], [0, 2.0, 0.0, 5.0, 4.5], [0, -1.0, -1.0, 0.5, 0.5]], np.float32)
    node = helper.make_node("MaxRoiPool", ["x", "r"], ["y"], pooled_shape=[2, 3], spatial_scale=1.0)
    m = _model(node, [_vi("x", [1, 4, 5, 6]), _vi("r", [3, 5])], [_vi("y", None)])
    _ref_check(m, {"x": x, "r": rois}, options={"batch": 1})
