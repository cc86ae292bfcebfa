"""fp16: weights stored as float16 (size halves) or float16 compute; runs in onnxruntime."""

from __future__ import annotations

import collections

import mconv.passes as P
import numpy as np
import onnx
import onnx_ir as ir
from mconv.irio import save_onnx, to_proto
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator


def _cnn(build):
    rng = np.random.default_rng(2)  # same weights on every call: models are compared across calls
    inits = [
        ("w1", rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3),
        ("b1", rng.standard_normal(8).astype(np.float32)),
        ("w2", rng.standard_normal((10, 8 * 8 * 8)).astype(np.float32) * 0.1),
        ("b2", rng.standard_normal(10).astype(np.float32)),
        ("shape", np.int64([0, -1])),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
        helper.make_node("Reshape", ["p", "shape"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "w2", "b2"], ["logits"], transB=1, name="fc"),
        helper.make_node("Softmax", ["logits"], ["prob"], axis=1, name="softmax"),
    ]
    return build(
        nodes, [("x", TensorProto.FLOAT, [2, 3, 16, 16])], [("prob", TensorProto.FLOAT, [2, 10])], inits
    )


def _x():
    return np.random.default_rng(3).standard_normal((2, 3, 16, 16)).astype(np.float32)


def test_fp16_weights_halves_saved_file_and_stays_close(build, run_ort, tmp_path):
    model = _cnn(build)
    x = _x()
    expected = run_ort(model, {"x": x})["prob"]
    before = save_onnx(model, tmp_path / "a.onnx")[0].stat().st_size
    model, (report,) = P.run_pipeline(model, P.parse_spec("fp16"))
    after = save_onnx(model, tmp_path / "b.onnx")[0].stat().st_size
    assert report.bytes_after < 0.55 * report.bytes_before
    assert before - after >= 0.45 * report.bytes_before  # the file loses about half its weight bytes
    assert {t["name"] for t in report.tensors} == {"w1", "w2"}  # b1, b2 under min_elements=16
    assert all(t["max_abs_error"] <= 1e-3 for t in report.tensors)
    got = run_ort(onnx.load(tmp_path / "b.onnx"), {"x": x})["prob"]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, atol=2e-3)


def test_fp16_weights_keeps_value_names_and_survives_fold(build, run_ort):
    model, _ = P.run_pipeline(_cnn(build), P.parse_spec("fp16,fold,dce"))
    conv = next(n for n in model.graph if n.op_type == "Conv")
    assert conv.inputs[1].name == "w1" and conv.inputs[1].producer().op_type == "Cast"
    assert model.graph.initializers["w1_fp16"].const_value.dtype == ir.DataType.FLOAT16


def test_fp16_weights_keeps_out_of_range_tensor_float32(build):
    w = np.full((4, 4), 1e6, np.float32)
    model = build(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [("x", TensorProto.FLOAT, [1, 4])],
        [("y", TensorProto.FLOAT, [1, 4])],
        [("w", w)],
    )
    model, (report,) = P.run_pipeline(model, P.parse_spec("fp16"))
    assert model.graph.initializers["w"].const_value.dtype == ir.DataType.FLOAT
    assert any("float16 range" in n for n in report.notes)


def test_fp16_all_runs_half_compute_blocks_softmax_keeps_io_float32(build, run_ort):
    model = _cnn(build)
    x = _x()
    expected = run_ort(model, {"x": x})["prob"]
    model, (report,) = P.run_pipeline(model, P.parse_spec("fp16(mode='all')"))
    ops = collections.Counter(n.op_type for n in model.graph)
    conv = next(n for n in model.graph if n.op_type == "Conv")
    softmax = next(n for n in model.graph if n.op_type == "Softmax")
    assert conv.inputs[1].const_value.dtype == ir.DataType.FLOAT16
    assert softmax.inputs[0].producer().op_type == "Cast"  # blocked: runs in float32
    assert ops["Cast"] == 2  # x down to fp16, logits back up to fp32
    assert model.graph.inputs[0].dtype == ir.DataType.FLOAT and model.graph.outputs[0].name == "prob"
    got = run_ort(model, {"x": x})["prob"]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, atol=5e-3)
    ref = ReferenceEvaluator(to_proto(model)).run(None, {"x": x})[0]
    np.testing.assert_allclose(ref, expected, atol=5e-3)


def test_fp16_all_without_keep_io_types_takes_and_gives_float16(build, run_ort):
    model = _cnn(build)
    x = _x()
    expected = run_ort(model, {"x": x})["prob"]
    model, _ = P.run_pipeline(model, P.parse_spec("fp16(mode='all',keep_io_types=False,block_list=[])"))
    assert not any(n.op_type == "Cast" for n in model.graph)
    got = run_ort(model, {"x": x.astype(np.float16)})["prob"]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), expected, atol=1e-2)


def test_fp16_models_run_in_the_mconv_reference_executor(build, run_ort):
    from mconv.engines.reference import executor

    x = _x()
    expected = run_ort(_cnn(build), {"x": x})["prob"]
    for spec in ("fp16", "fp16(mode='all')"):
        model, _ = P.run_pipeline(_cnn(build), P.parse_spec(spec))
        exe = executor.Executor(model)
        got = exe.run({"x": x})["prob"]
        np.testing.assert_allclose(np.asarray(got, np.float32), expected, atol=5e-3)


def test_fp16_after_prune_and_cluster_keeps_compression_record_for_export(build, run_ort, tmp_path):
    """cluster then fp16: the record moves to NAME_fp16, so the cpu bundle still stores the float16
    tensors with the sparse / palette codecs, and the bundle computes what onnxruntime does."""
    from mconv.api.runtime import open_runner
    from mconv.edit.weights import CLUSTER_KEY, PRUNED_KEY, compression_info
    from mconv.targets import get_target

    spec = "prune(sparsity=0.8),cluster(bits=4),fp16"
    model, reports = P.run_pipeline(_cnn(build), P.parse_spec(spec))
    g = model.graph.initializers
    info = compression_info(model)
    for name in ("w1", "w2"):
        stored = g[f"{name}_fp16"]
        array = stored.const_value.numpy()
        assert array.dtype == np.float16
        assert np.unique(array[array != 0]).size <= 16  # still at most 2**bits distinct nonzeros
        assert np.mean(array == 0) >= 0.79  # pruned zeros stay zero
        assert info[f"{name}_fp16"]["bits"] == 4 and info[f"{name}_fp16"]["pruned"]
        assert name not in info and name not in g  # moved, not copied: w1 is now the Cast's output
        assert stored.metadata_props[PRUNED_KEY] == "1" and CLUSTER_KEY in stored.metadata_props
    assert any("compression record moved" in n for n in reports[-1].notes)

    bundle = get_target("cpu").export(model, tmp_path / "bundle", {})
    rows = {r["name"]: r for r in bundle.account["layers"]}
    for name in ("w1_fp16", "w2_fp16"):
        assert rows[name]["codec"].startswith(("sparse", "palette")), rows[name]
        assert rows[name]["bytes"] < 0.5 * rows[name]["original_bytes"]  # well below float16 raw
    x = _x()
    got = open_runner(tmp_path / "bundle").run({"x": x})["prob"]
    np.testing.assert_allclose(got, run_ort(model, {"x": x})["prob"], atol=1e-5)
