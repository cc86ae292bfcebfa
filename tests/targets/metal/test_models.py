"""Whole models through the metal bundle and the C++ harness, against the reference executor.

fp16 storage: cosine >= 0.999 and max abs error within 2% of the output's scale; fp32: rtol 1e-4.
"""

from __future__ import annotations

import json

import numpy as np
import onnx_ir as ir
from mconv.targets.metal import TARGET
from mconv.targets.reference import ReferenceRunner
from metal_models import agreement, assert_fp16_close, light_with_random_weights, mobilenet_style, needs_cxx

pytestmark = needs_cxx


def lenet(shared):
    from mconv.formats import import_model

    caffe = shared / "models" / "caffe"
    return import_model([caffe / "lenet.prototxt", caffe / "lenet_iter_10000.caffemodel"])


def with_logits(model: ir.Model) -> ir.Model:
    """Also output the Softmax's input: random-weight nets give near-uniform probabilities,
    which would agree whatever the logits; the logits are the stronger check."""
    for node in model.graph:
        if node.op_type == "Softmax" and node.inputs[0].name not in {v.name for v in model.graph.outputs}:
            model.graph.outputs.append(node.inputs[0])
    return model


def compare(model, feeds, tmp_path, precision="fp16"):
    expected = ReferenceRunner(model).run(feeds)
    bundle = TARGET.export(model, tmp_path / f"bundle_{precision}", {"precision": precision})
    got = TARGET.load(bundle).run(feeds)
    assert set(got) == set(expected)
    for name, ref in expected.items():
        if precision == "fp32":
            np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(ref).max()))
        else:
            assert_fp16_close(ref, got[name])
    return bundle, expected, got


def test_caffe_lenet5_fp16_bundle_agrees_with_reference_and_classifies_alike(shared, tmp_path):
    model = with_logits(lenet(shared))
    x = np.random.default_rng(0).random((3, 1, 28, 28)).astype(np.float32)  # batch 3 on a batch-1 plan
    bundle, expected, got = compare(model, {"data": x}, tmp_path)
    assert np.array_equal(expected["prob"].argmax(1), got["prob"].argmax(1))
    ops = [layer["op"] for layer in json.loads((bundle.root / "metal_plan.json").read_text())["layers"]]
    assert "Gemm+relu" in ops  # ip1 + relu1 fused


def test_caffe_lenet5_fp32_bundle_matches_reference_to_rtol_1e4(shared, tmp_path):
    x = np.random.default_rng(1).random((1, 1, 28, 28)).astype(np.float32)
    compare(with_logits(lenet(shared)), {"data": x}, tmp_path, "fp32")


def test_mobilenet_style_depthwise_net_with_folded_batchnorm_agrees_with_reference(tmp_path):
    model = with_logits(mobilenet_style())
    x = np.random.default_rng(2).standard_normal((2, 3, 16, 16)).astype(np.float32)
    bundle, _, _ = compare(model, {"x": x}, tmp_path)
    plan = json.loads((bundle.root / "metal_plan.json").read_text())
    ops = [layer["op"] for layer in plan["layers"]]
    assert not any("BatchNormalization" in op for op in ops)  # folded by fuse-bn
    assert ops.count("Conv+clip") == 3 and ops.count("Conv+swish") == 1


def test_alexnet_with_random_weights_agrees_with_reference(tmp_path):
    model = with_logits(light_with_random_weights("bvlc_alexnet"))
    x = np.random.default_rng(3).standard_normal((1, 3, 224, 224)).astype(np.float32)
    _, expected, got = compare(model, {"data_0": x}, tmp_path)
    err, scale, cos = agreement(expected["prob_1"], got["prob_1"])
    assert cos >= 0.999 and err <= 2e-2 * max(scale, 1e-6), (cos, err, scale)  # fp16: 2% of the scale


def test_pruned_clustered_lenet_decodes_its_compressed_weights_and_agrees(shared, tmp_path):
    from mconv.passes import parse_spec, run_pipeline

    model, _ = run_pipeline(lenet(shared), parse_spec("prune(sparsity=0.8),cluster(bits=5)"))
    model = with_logits(model)
    x = np.random.default_rng(4).random((2, 1, 28, 28)).astype(np.float32)
    bundle, _, _ = compare(model, {"data": x}, tmp_path)
    codecs = {w["name"]: w["codec"] for w in bundle.weights}
    assert any(c in ("palette", "sparse") for c in codecs.values()), codecs
    dense = sum(int(np.prod(w["shape"])) * 4 for w in bundle.weights)
    stored = sum(w["bytes"] for w in bundle.weights)
    assert stored * 8 < dense  # compressed more than 8x against float32


def test_resnet50_with_random_weights_agrees_with_reference(tmp_path):
    # 73 kernels; BatchNorm folded into the convs; each residual Sum + Relu is one kernel
    model = with_logits(light_with_random_weights("resnet50"))
    x = np.random.default_rng(5).standard_normal((1, 3, 224, 224)).astype(np.float32)
    bundle, _, _ = compare(model, {"gpu_0/data_0": x}, tmp_path)
    ops = [layer["op"] for layer in json.loads((bundle.root / "metal_plan.json").read_text())["layers"]]
    assert ops.count("Sum+relu") == 16 and not any("BatchNormalization" in op for op in ops)
