"""fuse-bn: BatchNormalization folded into Conv / ConvTranspose / Gemm; outputs match onnxruntime."""

from __future__ import annotations

import json

import mconv.passes as P
import numpy as np
import pytest
from onnx import TensorProto, helper

RNG = np.random.default_rng(1)


def _bn_inits(c):
    return [
        ("scale", RNG.uniform(0.5, 2, c).astype(np.float32)),
        ("shift", RNG.standard_normal(c).astype(np.float32)),
        ("mean", RNG.standard_normal(c).astype(np.float32)),
        ("var", RNG.uniform(0.1, 3, c).astype(np.float32)),
    ]


def _bn_node(inp, out):
    return helper.make_node(
        "BatchNormalization", [inp, "scale", "shift", "mean", "var"], [out], name="bn", epsilon=1e-3
    )


@pytest.mark.parametrize("with_bias", [True, False])
def test_conv_bn_fused_matches_onnxruntime(build, run_ort, with_bias):
    inits = [("w", RNG.standard_normal((4, 3, 3, 3)).astype(np.float32))] + _bn_inits(4)
    conv_in = ["x", "w"]
    if with_bias:
        inits.append(("b", RNG.standard_normal(4).astype(np.float32)))
        conv_in.append("b")
    nodes = [
        helper.make_node("Conv", conv_in, ["h"], name="conv", pads=[1, 1, 1, 1]),
        _bn_node("h", "y"),
        helper.make_node("Relu", ["y"], ["z"], name="relu"),
    ]
    model = build(nodes, [("x", TensorProto.FLOAT, [2, 3, 5, 5])], [("z", TensorProto.FLOAT, None)], inits)
    x = RNG.standard_normal((2, 3, 5, 5)).astype(np.float32)
    expected = run_ort(model, {"x": x})["z"]
    model, (report, _) = P.run_pipeline(model, P.parse_spec("fuse-bn,dce"))
    assert [n.op_type for n in model.graph] == ["Conv", "Relu"]
    conv = next(iter(model.graph))
    assert json.loads(conv.metadata_props["mconv.fused_from"]) == ["conv", "bn"]
    assert conv.outputs[0].name == "y"  # the BN output's name, as localization expects
    np.testing.assert_allclose(run_ort(model, {"x": x})["z"], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("group", [1, 2])
def test_convtranspose_bn_fused_matches_onnxruntime(build, run_ort, group):
    inits = [("w", RNG.standard_normal((4, 6 // group, 2, 2)).astype(np.float32))] + _bn_inits(6)
    nodes = [
        helper.make_node("ConvTranspose", ["x", "w"], ["h"], name="deconv", group=group, strides=[2, 2]),
        _bn_node("h", "y"),
    ]
    model = build(nodes, [("x", TensorProto.FLOAT, [1, 4, 3, 3])], [("y", TensorProto.FLOAT, None)], inits)
    x = RNG.standard_normal((1, 4, 3, 3)).astype(np.float32)
    expected = run_ort(model, {"x": x})["y"]
    model, _ = P.run_pipeline(model, P.parse_spec("fuse-bn"))
    assert [n.op_type for n in model.graph] == ["ConvTranspose"]
    assert model.graph.outputs[0].name == "y"
    np.testing.assert_allclose(run_ort(model, {"x": x})["y"], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("trans_b", "beta", "with_c"), [(0, 1.0, True), (1, 0.5, True), (1, 1.0, False)])
def test_gemm_bn_fused_matches_onnxruntime(build, run_ort, trans_b, beta, with_c):
    w = RNG.standard_normal((5, 3) if trans_b else (3, 5)).astype(np.float32)
    inits = [("w", w)] + _bn_inits(5)
    gemm_in = ["x", "w"]
    if with_c:
        inits.append(("c", RNG.standard_normal(5).astype(np.float32)))
        gemm_in.append("c")
    nodes = [
        helper.make_node("Gemm", gemm_in, ["h"], name="fc", transB=trans_b, beta=beta, alpha=1.5),
        _bn_node("h", "y"),
    ]
    model = build(nodes, [("x", TensorProto.FLOAT, [2, 3])], [("y", TensorProto.FLOAT, None)], inits)
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    expected = run_ort(model, {"x": x})["y"]
    model, _ = P.run_pipeline(model, P.parse_spec("fuse-bn"))
    assert [n.op_type for n in model.graph] == ["Gemm"]
    np.testing.assert_allclose(run_ort(model, {"x": x})["y"], expected, rtol=1e-4, atol=1e-5)


def test_bn_kept_when_conv_output_has_another_consumer(build, run_ort):
    inits = [("w", RNG.standard_normal((2, 2, 1, 1)).astype(np.float32))] + _bn_inits(2)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["h"], name="conv"),
        _bn_node("h", "y"),
        helper.make_node("Add", ["h", "y"], ["z"]),
    ]
    model = build(nodes, [("x", TensorProto.FLOAT, [1, 2, 2, 2])], [("z", TensorProto.FLOAT, None)], inits)
    model, (report,) = P.run_pipeline(model, P.parse_spec("fuse-bn"))
    assert not report.modified and any("other consumers" in n for n in report.notes)


def test_shared_weight_is_copied_not_changed_under_its_other_user(build, run_ort):
    inits = [("w", RNG.standard_normal((2, 2, 1, 1)).astype(np.float32))] + _bn_inits(2)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["h"], name="conv"),
        _bn_node("h", "y"),
        helper.make_node("Conv", ["x", "w"], ["h2"], name="conv_b"),
        helper.make_node("Add", ["y", "h2"], ["z"]),
    ]
    model = build(nodes, [("x", TensorProto.FLOAT, [1, 2, 2, 2])], [("z", TensorProto.FLOAT, None)], inits)
    x = RNG.standard_normal((1, 2, 2, 2)).astype(np.float32)
    expected = run_ort(model, {"x": x})["z"]
    model, (report,) = P.run_pipeline(model, P.parse_spec("fuse-bn"))
    assert report.modified
    np.testing.assert_allclose(run_ort(model, {"x": x})["z"], expected, rtol=1e-4, atol=1e-5)
