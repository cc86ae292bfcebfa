"""Each kernel family against ONNX Runtime, through the C++ harness (fp32: rtol 1e-4).

Each test builds one small graph whose branches cover a family's attribute cases (so one
compile checks many kernels); every branch is a graph output compared with ORT.
"""

from __future__ import annotations

import numpy as np
import pytest
from mconv.targets.metal import TARGET
from metal_models import assert_fp16_close, make_model, needs_cxx, run_ort
from onnx import helper

pytestmark = needs_cxx
_STATE: dict[str, np.random.Generator] = {}


@pytest.fixture(autouse=True)
def _seeded():
    """Each test draws from its own generator, seeded the same whatever runs before it."""
    _STATE["rng"] = np.random.default_rng(7)
    yield
    _STATE.clear()


def randn(*shape, scale=1.0):
    return (_STATE["rng"].standard_normal(shape) * scale).astype(np.float32)


def check(model, feeds, tmp_path, precision="fp32"):
    expected = run_ort(model, feeds)
    runner = TARGET.load(TARGET.export(model, tmp_path / f"b_{precision}", {"precision": precision}))
    got = runner.run(feeds)
    for name, ref in expected.items():
        if precision == "fp32":
            np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-5, err_msg=name)
        else:
            assert_fp16_close(ref, got[name])
    return runner


def test_conv_grouped_depthwise_dilated_strided_1d_and_fused_activations_match_ort(tmp_path):
    w = {
        "wg": randn(6, 2, 3, 3, scale=0.3),
        "bg": randn(6),  # groups=2, dilation 2
        "wd": randn(4, 1, 3, 3, scale=0.3),  # depthwise, stride 2, SAME_UPPER
        "wp": randn(5, 4, 1, 1, scale=0.3),
        "bp": randn(5),
        "w1": randn(3, 4, 3, scale=0.3),  # 1-D
        "w2": randn(4, 4, 2, 2, scale=0.3),
        "b2": randn(4),
        "lo": np.float32(0),
        "hi": np.float32(6),
    }
    nodes = [
        helper.make_node("Conv", ["x", "wg", "bg"], ["g"], group=2, dilations=[2, 2], pads=[2, 1, 2, 1]),
        helper.make_node("LeakyRelu", ["g"], ["g_out"], alpha=0.2),
        helper.make_node(
            "Conv", ["x", "wd"], ["d"], group=4, strides=[2, 2], auto_pad="SAME_UPPER", kernel_shape=[3, 3]
        ),
        helper.make_node("Clip", ["d", "lo", "hi"], ["d_out"]),
        helper.make_node("Conv", ["x", "wp", "bp"], ["p"]),
        helper.make_node("Sigmoid", ["p"], ["p_out"]),
        helper.make_node("Conv", ["x", "w2", "b2"], ["t"], strides=[2, 1], pads=[0, 1, 1, 0]),
        helper.make_node("Tanh", ["t"], ["t_out"]),
        helper.make_node("Conv", ["x", "w2", "b2"], ["s"]),
        helper.make_node("Sigmoid", ["s"], ["s_sig"]),
        helper.make_node("Mul", ["s_sig", "s"], ["s_out"]),  # swish, operands swapped
        helper.make_node("Reshape", ["x", "shape1d"], ["x1"]),
        helper.make_node("Conv", ["x1", "w1"], ["c1"], pads=[1, 1], strides=[2]),
        helper.make_node("Gelu", ["c1"], ["c1_out"]),
    ]
    w["shape1d"] = np.array([1, 4, 63], np.int64)
    model = make_model(
        nodes, [("x", [1, 4, 7, 9])], ["g_out", "d_out", "p_out", "t_out", "s_out", "c1_out"], w, opset=20
    )
    runner = check(model, {"x": randn(1, 4, 7, 9)}, tmp_path)
    # every activation was fused: one layer per Conv
    assert [layer.op.split("+")[0] for layer in runner.plan.layers] == ["Conv"] * 6
    assert {layer.op.split("+")[1] for layer in runner.plan.layers} == {
        "leaky",
        "clip",
        "sigmoid",
        "tanh",
        "swish",
        "gelu",
    }


def test_gemm_matmul_transposes_alpha_beta_and_bias_broadcast_match_ort(tmp_path):
    w = {
        "b_t": randn(5, 6),
        "c_row": randn(5),
        "b": randn(6, 5),
        "c_col": randn(3, 1),
        "a_t": randn(3, 4),
        "m": randn(6, 4),
    }
    nodes = [
        helper.make_node("Gemm", ["x", "b_t", "c_row"], ["y1"], transB=1, alpha=0.5, beta=2.0),
        helper.make_node("Gemm", ["x", "b", "c_col"], ["y2"]),
        helper.make_node("Gemm", ["a_t", "xt"], ["y3"], transA=1),
        helper.make_node("Transpose", ["x"], ["xt0"], perm=[1, 0]),
        helper.make_node("Gemm", ["xt0", "b"], ["y4"], transA=1),
        helper.make_node("Relu", ["y4"], ["y4r"]),
        helper.make_node("MatMul", ["x3", "m"], ["y5"]),
    ]
    model = make_model(
        nodes, [("x", [3, 6]), ("xt", [3, 5]), ("x3", [2, 3, 6])], ["y1", "y2", "y3", "y4r", "y5"], w
    )
    check(model, {"x": randn(3, 6), "xt": randn(3, 5), "x3": randn(2, 3, 6)}, tmp_path)


def test_max_average_and_global_pooling_with_pads_and_ceil_mode_match_ort(tmp_path):
    nodes = [
        helper.make_node("MaxPool", ["x"], ["m1"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
        helper.make_node("MaxPool", ["x"], ["m2"], kernel_shape=[2, 3], pads=[1, 1, 0, 1], dilations=[1, 2]),
        helper.make_node(
            "AveragePool", ["x"], ["a1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]
        ),
        helper.make_node(
            "AveragePool",
            ["x"],
            ["a2"],
            kernel_shape=[3, 3],
            pads=[1, 1, 1, 1],
            strides=[2, 2],
            count_include_pad=1,
        ),
        helper.make_node("AveragePool", ["x"], ["a3"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
        helper.make_node("GlobalAveragePool", ["x"], ["ga"]),
        helper.make_node("GlobalMaxPool", ["x"], ["gm"]),
    ]
    model = make_model(nodes, [("x", [2, 3, 7, 8])], ["m1", "m2", "a1", "a2", "a3", "ga", "gm"], {})
    check(model, {"x": randn(2, 3, 7, 8)}, tmp_path)


def test_broadcast_binary_concat_transpose_softmax_lrn_and_batchnorm_match_ort(tmp_path):
    w = {
        "chan": randn(1, 4, 1, 1),
        "row": randn(5),
        "s": randn(4),
        "b": randn(4),
        "mu": randn(4),
        "var": np.abs(randn(4)) + 0.5,
    }
    nodes = [
        helper.make_node("Add", ["x", "chan"], ["add"]),
        helper.make_node("Relu", ["add"], ["add_relu"]),
        helper.make_node("Mul", ["x", "row"], ["mul"]),
        helper.make_node("Sub", ["row", "x"], ["sub"]),
        helper.make_node("Div", ["x", "y"], ["div"]),
        helper.make_node("Concat", ["x", "mul", "add_relu"], ["cat"], axis=1),
        helper.make_node("Transpose", ["x"], ["tr"], perm=[2, 0, 3, 1]),
        helper.make_node("Softmax", ["x"], ["sm1"], axis=1),
        helper.make_node("LogSoftmax", ["x"], ["lsm"], axis=-1),
        helper.make_node("LRN", ["x"], ["lrn"], size=3, alpha=0.2, beta=0.75, bias=2.0),
        helper.make_node("LRN", ["x"], ["lrn4"], size=5, alpha=0.1, beta=0.5),
        helper.make_node("BatchNormalization", ["x", "s", "b", "mu", "var"], ["bn"], epsilon=1e-3),
    ]
    outs = ["add_relu", "mul", "sub", "div", "cat", "tr", "sm1", "lsm", "lrn", "lrn4", "bn"]
    model = make_model(nodes, [("x", [2, 4, 3, 5]), ("y", [2, 1, 3, 1])], outs, w)
    y = np.abs(randn(2, 1, 3, 1)) + 0.5
    check(model, {"x": randn(2, 4, 3, 5), "y": y}, tmp_path)


def test_softmax_opset_11_flattens_at_axis_like_ort(tmp_path):
    nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=1)]
    model = make_model(nodes, [("x", [2, 3, 4])], ["y"], {}, opset=11)
    check(model, {"x": randn(2, 3, 4)}, tmp_path)


@pytest.mark.parametrize("precision", ["fp16"])
def test_half_storage_stays_within_fp16_rounding_of_ort(tmp_path, precision):
    w = {"w": randn(8, 3, 3, 3, scale=0.3), "b": randn(8)}
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[2, 2], strides=[2, 2]),
    ]
    model = make_model(nodes, [("x", [1, 3, 8, 8])], ["y"], w)
    runner = check(model, {"x": randn(1, 3, 8, 8)}, tmp_path, precision)
    assert runner.plan.dtype == "half"
