"""The ops the CNNs of the wild need (issue 12 item 4), each through the C++ harness.

Every test builds one graph whose outputs cover an op family's cases and runs it at fp32 and
fp16 storage against mconv's reference executor (fp32: rtol 1e-4; fp16: cosine >= 0.999 and
max abs error within 2% of the output's scale), and at fp32 against ONNX Runtime as well.
"""

from __future__ import annotations

import numpy as np
import pytest
from mconv.targets.metal import TARGET
from mconv.targets.reference import ReferenceRunner
from metal_models import assert_fp16_close, make_model, needs_cxx, run_ort
from onnx import helper

pytestmark = needs_cxx
PRECISIONS = ["fp32", "fp16"]


def const(x, dtype=np.int64):
    return np.asarray(x, dtype)


def check(model, feeds, tmp_path, precision):
    runner = TARGET.load(TARGET.export(model, tmp_path / f"b_{precision}", {"precision": precision}))
    got = runner.run(feeds)
    ref = ReferenceRunner(model).run(feeds)
    oracle = run_ort(model, feeds) if precision == "fp32" else {}
    assert set(got) == set(ref)
    for name, want in ref.items():
        assert got[name].shape == want.shape, name
        if precision == "fp32":
            np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=f"{name} vs reference")
            np.testing.assert_allclose(
                got[name], oracle[name], rtol=1e-4, atol=1e-5, err_msg=f"{name} vs ORT"
            )
        else:
            assert_fp16_close(want, got[name])
    return runner


@pytest.mark.parametrize("precision", PRECISIONS)
def test_unary_activations_and_broadcast_binary_ops_match(tmp_path, precision):
    rng = np.random.default_rng(11)
    w = {
        "slope": rng.uniform(0.05, 0.5, (4, 1, 1)).astype(np.float32),
        "two": np.float32(2),
        "half": np.float32(0.5),
        "three": np.float32(3),
        "row": rng.standard_normal(5).astype(np.float32),
        "lo": np.float32(-0.5),
        "hi": np.float32(0.7),
    }
    n = helper.make_node
    nodes = [
        n("Neg", ["x"], ["neg"]),
        n("Exp", ["x"], ["exp"]),
        n("Abs", ["x"], ["ax"]),
        n("Sqrt", ["ax"], ["sqrt"]),
        n("Log", ["pos"], ["log"]),
        n("Reciprocal", ["pos"], ["rec"]),
        n("Pow", ["x", "two"], ["sq"]),
        n("Pow", ["pos", "half"], ["root"]),
        n("Pow", ["x", "three"], ["cube"]),  # a negative base, an integral exponent
        n("Pow", ["pos", "x"], ["powt"]),
        n("HardSigmoid", ["x"], ["hsig"], alpha=0.3, beta=0.4),
        n("HardSwish", ["x"], ["hswish"]),
        n("Sigmoid", ["x"], ["sig"]),
        n("Tanh", ["x"], ["tanh"]),
        n("Clip", ["x", "lo", "hi"], ["clip"]),
        n("LeakyRelu", ["x"], ["leaky"], alpha=0.1),
        n("PRelu", ["x", "slope"], ["prelu"]),
        n("Elu", ["x"], ["elu"], alpha=0.8),
        n("Selu", ["x"], ["selu"]),
        n("Softplus", ["x"], ["softplus"]),
        n("Mish", ["x"], ["mish"]),
        n("Erf", ["x"], ["erf"]),
        n("Mul", ["x", "row"], ["mul"]),
        n("Div", ["x", "pos"], ["div"]),
        n("Sub", ["row", "x"], ["sub"]),
        n("Max", ["x", "row"], ["max"]),
        n("Min", ["x", "pos"], ["min"]),
        n("Add", ["x", "pos"], ["sum0"]),
        n("HardSwish", ["sum0"], ["add_hswish"]),  # fused into the Add
        n("Conv", ["x", "w1x1"], ["conv"]),
        n("Relu", ["conv"], ["conv_relu"]),
        n("Min", ["conv_relu", "three"], ["relu6"]),  # Keras' relu6: Relu then Min, one kernel
    ]
    w["w1x1"] = rng.standard_normal((4, 4, 1, 1)).astype(np.float32)
    outs = [o for node in nodes for o in node.output if o not in ("ax", "sum0", "conv", "conv_relu")]
    model = make_model(nodes, [("x", [2, 4, 3, 5]), ("pos", [2, 1, 3, 5])], outs, w, opset=18)
    feeds = {
        "x": rng.standard_normal((2, 4, 3, 5)).astype(np.float32),
        "pos": rng.uniform(0.5, 2.0, (2, 1, 3, 5)).astype(np.float32),
    }
    runner = check(model, feeds, tmp_path, precision)
    ops = [layer.op for layer in runner.plan.layers]
    assert "Add+hardswish" in ops and "Conv+relu+clip" in ops


@pytest.mark.parametrize("precision", PRECISIONS)
def test_reductions_as_keras_tflite_and_torch_write_them_match(tmp_path, precision):
    rng = np.random.default_rng(12)
    n = helper.make_node
    nodes = [
        # global average pooling: Keras/TFLite on NHWC (axes 1, 2), keepdims 0 and 1; NCHW axes 2, 3
        n("ReduceMean", ["nhwc", "ax12"], ["gap_nhwc"], keepdims=0),
        n("ReduceMean", ["nhwc", "ax12"], ["gap_nhwc_k"], keepdims=1),
        n("ReduceMean", ["nchw", "ax23"], ["gap_nchw"], keepdims=1),
        n("ReduceSum", ["nchw", "ax1"], ["sum_c"], keepdims=0),
        n("ReduceMax", ["nhwc", "axm1"], ["max_last"], keepdims=1),
        n("ReduceMin", ["nchw"], ["min_all"], keepdims=0),
        n("ReduceL2", ["nchw", "ax13"], ["l2"], keepdims=1),
        n("ReduceLogSumExp", ["nchw", "ax23"], ["lse"], keepdims=0),
        n("ReduceSumSquare", ["nhwc", "ax2"], ["ssq"], keepdims=0),
        n("GlobalMaxPool", ["nchw"], ["gmp"]),
        n("ReduceMean", ["nchw", "ax23"], ["se"], keepdims=1),  # squeeze-excite: fused sigmoid
        n("Sigmoid", ["se"], ["se_sig"]),
    ]
    w = {
        "ax12": const([1, 2]),
        "ax23": const([2, 3]),
        "ax1": const([1]),
        "axm1": const([-1]),
        "ax13": const([1, 3]),
        "ax2": const([2]),
    }
    outs = ["gap_nhwc", "gap_nhwc_k", "gap_nchw", "sum_c", "max_last", "min_all", "l2", "lse", "ssq", "gmp"]
    model = make_model(
        nodes, [("nhwc", [2, 5, 6, 4]), ("nchw", [2, 4, 5, 6])], [*outs, "se_sig"], w, opset=18
    )
    feeds = {
        "nhwc": rng.standard_normal((2, 5, 6, 4)).astype(np.float32),
        "nchw": rng.standard_normal((2, 4, 5, 6)).astype(np.float32),
    }
    runner = check(model, feeds, tmp_path, precision)
    assert "ReduceMean+sigmoid" in [layer.op for layer in runner.plan.layers]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_reduce_mean_with_axes_attribute_opset_13_matches(tmp_path, precision):
    rng = np.random.default_rng(13)
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["a"], axes=[1, 2], keepdims=0),
        helper.make_node("ReduceMean", ["x"], ["b"], axes=[-1], keepdims=1),
        helper.make_node("ReduceMax", ["x"], ["c"], axes=[0, 3], keepdims=0),
    ]
    model = make_model(nodes, [("x", [2, 3, 4, 5])], ["a", "b", "c"], {}, opset=13)
    check(model, {"x": rng.standard_normal((2, 3, 4, 5)).astype(np.float32)}, tmp_path, precision)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_slice_pad_gather_split_concat_transpose_and_views_match(tmp_path, precision):
    rng = np.random.default_rng(14)
    n = helper.make_node
    big = np.iinfo(np.int64).max
    w = {
        "s_st": const([1, -1]),
        "s_en": const([big, -big]),
        "s_ax": const([2, 3]),
        "s_sp": const([2, -2]),
        "s2_st": const([0]),
        "s2_en": const([2]),
        "s2_ax": const([1]),
        "pads": const([0, 0, 1, 2, 0, 0, 2, 1]),
        "pads_crop": const([0, 1, -1, 0, 0, 0, 0, -2]),
        "pads_ax": const([2, 1, 1, 3]),
        "axes23": const([2, 3]),
        "g_one": const([2]),
        "cval": np.float32(0.25),
        "g_scalar": const(2),
        "g_table": const([[3, 0], [-1, 1]]),
        "g_run": const([0, 2, 4]),
        "split": const([1, 3, 1]),
        "sq_ax": const([1]),
        "unsq_ax": const([0, 3]),
        "shape": const([2, -1]),
        "exp_shape": const([2, 4, 1, 5]),
        "reps": const([1, 2, 1, 2]),
    }
    nodes = [
        n("Slice", ["x", "s_st", "s_en", "s_ax", "s_sp"], ["slice"]),
        n("Slice", ["x", "s2_st", "s2_en", "s2_ax"], ["slice2"]),
        n("Pad", ["x", "pads", "cval"], ["pad_const"], mode="constant"),
        n("Pad", ["x", "pads"], ["pad_reflect"], mode="reflect"),
        n("Pad", ["x", "pads"], ["pad_edge"], mode="edge"),
        n("Pad", ["x", "pads_crop"], ["pad_crop"]),
        n("Pad", ["x", "pads_ax", "", "axes23"], ["pad_axes"], mode="reflect"),
        n("Gather", ["x", "g_scalar"], ["gather_scalar"], axis=1),
        n("Gather", ["x", "g_table"], ["gather_table"], axis=3),
        n("Gather", ["x", "g_run"], ["gather_run"], axis=-1),
        n("Split", ["x", "split"], ["sp0", "sp1", "sp2"], axis=3),
        n("Concat", ["sp2", "sp0", "x"], ["cat_last"], axis=-1),
        n("Concat", ["x", "x"], ["cat0"], axis=0),
        n("Concat", ["x", "slice2"], ["cat1"], axis=1),
        n("Transpose", ["x"], ["nhwc"], perm=[0, 2, 3, 1]),
        n("Relu", ["nhwc"], ["nhwc_relu"]),
        n("Gather", ["x", "g_one"], ["gather_scalar_k"], axis=1),
        n("Squeeze", ["gather_scalar_k", "sq_ax"], ["squeezed"]),
        n("Unsqueeze", ["slice2", "unsq_ax"], ["unsq"]),
        n("Flatten", ["x"], ["flat"], axis=2),
        n("Reshape", ["x", "shape"], ["reshaped"]),
        n("Exp", ["reshaped"], ["reshaped_exp"]),
        n("Expand", ["col", "exp_shape"], ["expanded"]),
        n("Tile", ["x", "reps"], ["tiled"]),
        n("DepthToSpace", ["x"], ["d2s"], blocksize=2, mode="CRD"),
    ]
    outs = [
        "slice",
        "slice2",
        "pad_const",
        "pad_reflect",
        "pad_edge",
        "pad_crop",
        "pad_axes",
        "gather_scalar",
        "gather_table",
        "gather_run",
        "sp0",
        "sp1",
        "cat_last",
        "cat0",
        "cat1",
        "nhwc_relu",
        "squeezed",
        "unsq",
        "flat",
        "reshaped_exp",
        "expanded",
        "tiled",
        "d2s",
    ]
    model = make_model(nodes, [("x", [2, 4, 6, 5]), ("col", [4, 1, 1])], outs, w, opset=18)
    feeds = {
        "x": rng.standard_normal((2, 4, 6, 5)).astype(np.float32),
        "col": rng.standard_normal((4, 1, 1)).astype(np.float32),
    }
    runner = check(model, feeds, tmp_path, precision)
    split_layers = [layer for layer in runner.plan.layers if layer.op == "Split"]
    assert len(split_layers) == 3  # one kernel per output


@pytest.mark.parametrize("precision", PRECISIONS)
def test_resize_nearest_linear_and_cubic_in_the_common_coordinate_modes_match(tmp_path, precision):
    rng = np.random.default_rng(15)
    n = helper.make_node
    w = {
        "up2": np.array([1, 1, 2, 2], np.float32),
        "odd": np.array([1, 1, 1.5, 0.6], np.float32),
        "sizes": const([2, 3, 9, 4]),
    }
    cases = [
        ("nearest", "asymmetric", "floor", "up2", None),
        ("nearest", "half_pixel", "round_prefer_floor", "odd", None),
        ("nearest", "half_pixel", "round_prefer_ceil", "up2", None),
        ("nearest", "align_corners", "round_prefer_floor", None, "sizes"),
        ("linear", "half_pixel", None, "up2", None),
        ("linear", "pytorch_half_pixel", None, "odd", None),
        ("linear", "align_corners", None, None, "sizes"),
        ("linear", "asymmetric", None, "odd", None),
        ("cubic", "half_pixel", None, "up2", None),
    ]
    nodes, outs = [], []
    for i, (mode, ctm, nearest, scales, sizes) in enumerate(cases):
        attrs = {"mode": mode, "coordinate_transformation_mode": ctm}
        if nearest:
            attrs["nearest_mode"] = nearest
        ins = ["x", "", scales or ""] + ([sizes] if sizes else [])
        nodes.append(n("Resize", ins, [f"r{i}"], **attrs))
        outs.append(f"r{i}")
    model = make_model(nodes, [("x", [2, 3, 5, 6])], outs, w, opset=18)
    check(model, {"x": rng.standard_normal((2, 3, 5, 6)).astype(np.float32)}, tmp_path, precision)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_upsample_opset_9_matches(tmp_path, precision):
    rng = np.random.default_rng(16)
    nodes = [helper.make_node("Upsample", ["x", "sc"], ["y"], mode="nearest")]
    model = make_model(
        nodes, [("x", [1, 2, 3, 4])], ["y"], {"sc": np.array([1, 1, 2, 3], np.float32)}, opset=9
    )
    check(model, {"x": rng.standard_normal((1, 2, 3, 4)).astype(np.float32)}, tmp_path, precision)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_matmul_softmax_batchnorm_layernorm_and_conv_transpose_match(tmp_path, precision):
    rng = np.random.default_rng(17)
    n = helper.make_node

    def r(*shape, s=1.0):
        return (rng.standard_normal(shape) * s).astype(np.float32)

    w = {
        "wb": r(3, 6, 4, s=0.4),  # batched right operand
        "wv": r(6, s=0.4),  # 1-D right operand
        "s": r(4),
        "b": r(4),
        "mu": r(4),
        "var": np.abs(r(4)) + 0.5,
        "ln_s": r(6),
        "ln_b": r(6),
        "wt": r(4, 3, 3, 3, s=0.3),  # ConvTranspose weights [C, OC/group, kh, kw]
        "bt": r(3),
        "wtg": r(4, 2, 2, 3, s=0.3),  # group 2
        "wt1": r(4, 2, 4, s=0.3),  # 1-D
    }
    nodes = [
        n("MatMul", ["a3", "wb"], ["mm_b"]),
        n("MatMul", ["a4", "a3t"], ["mm_bcast"]),
        n("MatMul", ["a3", "wv"], ["mm_vec"]),
        n("Softmax", ["x"], ["sm1"], axis=1),
        n("Softmax", ["x"], ["sm2"], axis=2),
        n("BatchNormalization", ["x", "s", "b", "mu", "var"], ["bn"], epsilon=1e-3),
        n("Relu", ["bn"], ["bn_relu"]),
        n("LayerNormalization", ["a3", "ln_s", "ln_b"], ["ln"], axis=-1, epsilon=1e-5),
        n(
            "ConvTranspose",
            ["x", "wt", "bt"],
            ["ct"],
            strides=[2, 2],
            pads=[1, 1, 1, 1],
            output_padding=[1, 0],
        ),
        n("ConvTranspose", ["x", "wtg"], ["ctg"], group=2, strides=[1, 2], dilations=[2, 1]),
        n("ConvTranspose", ["x", "wt"], ["ct_same"], strides=[2, 2], auto_pad="SAME_UPPER"),
        n("ConvTranspose", ["x1", "wt1"], ["ct1"], strides=[3], pads=[1, 2]),
        n("Relu", ["ct1"], ["ct1_relu"]),
    ]
    outs = ["mm_b", "mm_bcast", "mm_vec", "sm1", "sm2", "bn_relu", "ln", "ct", "ctg", "ct_same", "ct1_relu"]
    inputs = [
        ("a3", [3, 5, 6]),
        ("a4", [2, 1, 4, 5]),
        ("a3t", [3, 5, 2]),
        ("x", [1, 4, 5, 6]),
        ("x1", [1, 4, 7]),
    ]
    model = make_model(nodes, inputs, outs, w, opset=18)
    feeds = {name: r(*shape) for name, shape in inputs}
    runner = check(model, feeds, tmp_path, precision)
    ops = [layer.op for layer in runner.plan.layers]
    assert "BatchNormalization+relu" in ops and "ConvTranspose+relu" in ops
