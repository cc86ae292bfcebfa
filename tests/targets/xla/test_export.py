"""Whole models through xla bundles: export, load, run; weights, determinism, integrity, loader."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from mconv.bundle import load_bundle
from mconv.errors import IntegrityError
from mconv.fixtures.light import he_normal, light_model
from mconv.targets import get_target
from onnx import TensorProto, helper

RNG = np.random.default_rng(1)


def _ort(proto: onnx.ModelProto):
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])


def _cnn(batch=1) -> onnx.ModelProto:
    w1 = (RNG.standard_normal((4, 1, 3, 3)) * 0.3).astype(np.float32)
    w2 = (RNG.standard_normal((10, 4 * 4 * 4)) * 0.1).astype(np.float32)
    b2 = RNG.standard_normal(10).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "w2", "b2"], ["g"], transB=1),
        helper.make_node("Softmax", ["g"], ["y"], axis=1),
    ]
    inits = [onnx.numpy_helper.from_array(a, n) for n, a in (("w1", w1), ("w2", w2), ("b2", b2))]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_cnn_bundle_runs_any_batch_and_matches_onnxruntime(tmp_path):
    proto = _cnn()
    bundle = get_target("xla").export(ir.serde.deserialize_model(proto), tmp_path / "b", {})
    runner = get_target("xla").load(load_bundle(tmp_path / "b"))
    assert bundle.manifest["inputs"][0]["shape"] == ["b", 1, 8, 8]
    sess = _ort(proto)
    for n in (1, 3):
        x = RNG.standard_normal((n, 1, 8, 8)).astype(np.float32)
        want = np.concatenate([sess.run(None, {"x": x[i : i + 1]})[0] for i in range(n)])
        np.testing.assert_allclose(runner.run({"x": x})["y"], want, rtol=1e-5, atol=1e-6)


def test_static_batch_option_fixes_the_leading_dimension(tmp_path):
    model = ir.serde.deserialize_model(_cnn())
    get_target("xla").export(model, tmp_path / "b", {"batch": 4, "platforms": ["cpu"]})
    conv = json.loads((tmp_path / "b" / "xla.json").read_text())
    assert conv["inputs"][0]["shape"] == [4, 1, 8, 8] and conv["platforms"] == ["cpu"]


def test_same_model_and_options_give_byte_identical_bundles(tmp_path):
    for d in ("a", "b"):
        get_target("xla").export(ir.serde.deserialize_model(_cnn_fixed), tmp_path / d, {"mlir_text": True})
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert "model.stablehlo.mlir" in files and "model.mlirbc" in files
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    text = (tmp_path / "a" / "model.stablehlo.mlir").read_text()
    assert "/work/" not in text and str(Path(__file__).parent) not in text  # no checkout paths


_cnn_fixed = _cnn()


def test_weights_are_arguments_and_fp16_storage_is_lossless(tmp_path):
    proto = _cnn()
    # Weights rounded to fp16 values: the container stores them as fp16, the program gets f32.
    for init in proto.graph.initializer:
        a = onnx.numpy_helper.to_array(init).astype(np.float16).astype(np.float32)
        init.CopyFrom(onnx.numpy_helper.from_array(a, init.name))
    bundle = get_target("xla").export(ir.serde.deserialize_model(proto), tmp_path / "b", {})
    conv = json.loads((tmp_path / "b" / "xla.json").read_text())
    assert [w["name"] for w in conv["weight_args"]] == ["w1", "w2", "b2"]
    assert all(w["dtype"] == "float32" for w in conv["weight_args"])
    assert {w["codec"] for w in bundle.weights} == {"fp16"}
    x = RNG.standard_normal((2, 1, 8, 8)).astype(np.float32)
    sess = _ort(proto)
    want = np.concatenate([sess.run(None, {"x": x[i : i + 1]})[0] for i in range(2)])
    np.testing.assert_allclose(
        get_target("xla").load(tmp_path / "b").run({"x": x})["y"], want, rtol=1e-5, atol=1e-6
    )


def test_bake_weights_embeds_them_and_float16_initializers_stay_float16(tmp_path):
    proto = _cnn()
    # An fp16 weight with a Cast in the graph (what a weights-only fp16 pass writes).
    w2 = next(i for i in proto.graph.initializer if i.name == "w2")
    half = onnx.numpy_helper.to_array(w2).astype(np.float16)
    w2.CopyFrom(onnx.numpy_helper.from_array(half, "w2h"))
    proto.graph.node.insert(0, helper.make_node("Cast", ["w2h"], ["w2"], to=TensorProto.FLOAT))
    model = ir.serde.deserialize_model(proto)
    get_target("xla").export(model, tmp_path / "args", {})
    conv = json.loads((tmp_path / "args" / "xla.json").read_text())
    assert {w["name"]: w["dtype"] for w in conv["weight_args"]}["w2h"] == "float16"
    baked = get_target("xla").export(model, tmp_path / "baked", {"bake_weights": True})
    assert json.loads((tmp_path / "baked" / "xla.json").read_text())["weight_args"] == []
    assert "weights.mcw" not in baked.files and all(w["codec"] == "dense" for w in baked.weights)
    assert "f16" in get_target("xla").load(tmp_path / "baked").exported.mlir_module()
    x = RNG.standard_normal((1, 1, 8, 8)).astype(np.float32)
    want = _ort(proto).run(None, {"x": x})[0]
    for d in ("args", "baked"):
        got = get_target("xla").load(tmp_path / d).run({"x": x})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_lstm_model_matches_onnxruntime(tmp_path):
    h, i = 6, 4
    w = (RNG.standard_normal((1, 4 * h, i)) * 0.4).astype(np.float32)
    r = (RNG.standard_normal((1, 4 * h, h)) * 0.4).astype(np.float32)
    b = (RNG.standard_normal((1, 8 * h)) * 0.4).astype(np.float32)
    nodes = [
        helper.make_node("LSTM", ["x", "w", "r", "b"], ["y", "yh", "yc"], hidden_size=h),
        helper.make_node("Squeeze", ["yh", "ax"], ["s"]),
    ]
    inits = [onnx.numpy_helper.from_array(a, n) for n, a in (("w", w), ("r", r), ("b", b))]
    inits.append(onnx.numpy_helper.from_array(np.array([0], np.int64), "ax"))
    graph = helper.make_graph(
        nodes,
        "lstm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [7, 3, i])],
        [
            helper.make_tensor_value_info("s", TensorProto.FLOAT, [3, h]),
            helper.make_tensor_value_info("yc", TensorProto.FLOAT, None),
        ],
        inits,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    get_target("xla").export(ir.serde.deserialize_model(proto), tmp_path / "b", {})
    x = RNG.standard_normal((7, 3, i)).astype(np.float32)
    want = _ort(proto).run(None, {"x": x})
    got = get_target("xla").load(tmp_path / "b").run({"x": x})
    np.testing.assert_allclose(got["s"], want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["yc"], want[1], rtol=1e-5, atol=1e-5)


def test_light_alexnet_with_random_weights_matches_onnxruntime_at_batch_1_and_2(tmp_path):
    # The ConstantOfShape weight generators folded and filled with random weights (a real-looking net).
    model = light_model("bvlc_alexnet", he_normal, seed=3)
    rng = np.random.default_rng(3)
    fixed = ir.serde.serialize_model(model)
    # Its Reshape [1, 9216] pins batch 1: the dynamic-batch pass frees it (the exporter refuses it)
    from mconv import passes as P

    model, _ = P.run_pipeline(model, P.parse_spec("dynamic-batch"), P.PassContext())
    get_target("xla").export(model, tmp_path / "alex", {"platforms": ["cpu"]})
    runner = get_target("xla").load(tmp_path / "alex")
    sess = _ort(fixed)
    x = rng.standard_normal((2, 3, 224, 224)).astype(np.float32)
    got = runner.run({"data_0": x})["prob_1"]
    want = np.concatenate([sess.run(None, {"data_0": x[i : i + 1]})[0] for i in range(2)])
    assert got.shape == (2, 1000)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-6)
    assert (got.argmax(1) == want.argmax(1)).all()
    np.testing.assert_allclose(runner.run({"data_0": x[:1]})["prob_1"], want[:1], rtol=1e-3, atol=1e-6)


def test_tampered_bundle_is_refused_by_the_loader(tmp_path):
    get_target("xla").export(ir.serde.deserialize_model(_cnn()), tmp_path / "b", {})
    payload = tmp_path / "b" / "model.jax_export"
    data = bytearray(payload.read_bytes())
    data[len(data) // 2] ^= 0xFF
    payload.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="model.jax_export: sha256 mismatch"):
        get_target("xla").load(tmp_path / "b")


def test_loader_needs_only_jax_numpy_and_the_container(tmp_path):
    get_target("xla").export(ir.serde.deserialize_model(_cnn()), tmp_path / "b", {})
    script = f"""
import sys, json, numpy as np
from mconv.targets.xla.runtime import load_bundle_path
r = load_bundle_path({str(tmp_path / "b")!r})
y = r.run({{"x": np.ones((2, 1, 8, 8), np.float32)}})["y"]
bad = sorted(m for m in sys.modules if m.split(".")[0] in ("onnx", "onnx_ir", "onnxruntime")
             or m.startswith(("mconv.formats", "mconv.passes", "mconv.bundle", "mconv.irio", "mconv.targets.reference")))
print(json.dumps({{"shape": list(y.shape), "bad": bad}}))
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"shape": [2, 10], "bad": []}


def test_pruned_clustered_weights_keep_their_compressed_codecs_in_the_bundle(tmp_path):
    from mconv import passes as P

    model = ir.serde.deserialize_model(_cnn())
    model, _ = P.run_pipeline(model, P.parse_spec("prune(sparsity=0.7),cluster(bits=4)"), P.PassContext())
    want = ort.InferenceSession(ir.serde.serialize_model(model).SerializeToString()).run(
        None, {"x": np.ones((1, 1, 8, 8), np.float32)}
    )[0]
    bundle = get_target("xla").export(model, tmp_path / "b", {})
    codecs = {w["name"]: w["codec"] for w in bundle.weights}
    assert codecs["w2"] in ("palette", "sparse"), codecs
    runner = get_target("xla").load(load_bundle(tmp_path / "b"))
    got = runner.run({"x": np.ones((1, 1, 8, 8), np.float32)})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
