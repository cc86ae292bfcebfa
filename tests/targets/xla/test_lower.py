"""Per-op-family lowering checks: each ONNX op through XLA against ONNX Runtime (the oracle)."""

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
