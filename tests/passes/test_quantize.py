"""quantize pass: int8 per-channel weights (passes/quantize.py)."""

from __future__ import annotations

import mconv.passes as P
import numpy as np
import onnx
import pytest
from mconv.engines.reference.executor import Executor
from mconv.irio import to_proto
from onnx import TensorProto, helper


def _model(build, opset=17):
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((4, 3, 3, 3)) * np.array([1, 0.01, 5, 0.2])[:, None, None, None]).astype(
        np.float32
    )
    w2 = rng.standard_normal((5, 64)).astype(np.float32)  # Gemm transB=1: output axis 0
    w2[1] = 0.0  # an all-zero channel
    b2 = rng.standard_normal(5).astype(np.float32)
    model = build(
        [
            helper.make_node("Conv", ["x", "W1"], ["c"], name="conv"),
            helper.make_node("Relu", ["c"], ["r"], name="relu"),
            helper.make_node("Flatten", ["r"], ["f"], name="flat"),
            helper.make_node("Gemm", ["f", "W2", "B2"], ["y"], name="fc", transB=1),
        ],
        [("x", TensorProto.FLOAT, [2, 3, 6, 6])],
        [("y", TensorProto.FLOAT, [2, 5])],
        [("W1", w1), ("W2", w2), ("B2", b2)],
        opset=opset,
    )
    return model, {"W1": (w1, 0), "W2": (w2, 0)}


@pytest.mark.parametrize("opset", [17, 11])
def test_int8_model_runs_in_onnxruntime_and_error_is_within_half_a_step(build, run_ort, opset):
    model, originals = _model(build, opset)
    x = np.random.default_rng(1).standard_normal((2, 3, 6, 6)).astype(np.float32)
    before = run_ort(model, {"x": x})["y"]
    model, reports = P.run_pipeline(model, P.parse_spec("quantize"))
    proto = to_proto(model)
    onnx.checker.check_model(proto)
    assert {i.name: i.data_type for i in proto.graph.initializer}["W1_int8"] == TensorProto.INT8
    op = "DequantizeLinear" if opset >= 13 else "Mul"
    assert op in [n.op_type for n in proto.graph.node]
    after = run_ort(proto, {"x": x})["y"]
    np.testing.assert_allclose(after, before, atol=0.05 * np.abs(before).max())
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in proto.graph.initializer}
    for name, (w, axis) in originals.items():
        q, scale = inits[f"{name}_int8"].astype(np.float32), inits[f"{name}_scale"].ravel()
        shape = [1] * w.ndim
        shape[axis] = -1
        step = (np.abs(w).reshape(w.shape[0], -1).max(axis=1) / 127).reshape(shape)  # hand math
        back = q * scale.reshape(shape)
        assert np.all(np.abs(back - w) <= step / 2 + 1e-7)
    assert np.all(inits["W2_int8"][1] == 0)
    rows = {t["name"]: t for t in reports[0].tensors}
    assert rows["W1"]["max_abs_error"] <= rows["W1"]["scale_max"] / 2 + 1e-7


def test_int8_model_runs_in_the_reference_executor(build, run_ort):
    model, _ = _model(build)
    model, _ = P.run_pipeline(model, P.parse_spec("quantize"))
    x = np.random.default_rng(2).standard_normal((2, 3, 6, 6)).astype(np.float32)
    ours = Executor(model).run({"x": x})["y"]
    np.testing.assert_allclose(ours, run_ort(model, {"x": x})["y"], rtol=1e-4, atol=1e-4)


def test_pruned_zeros_stay_zero_and_keep_their_flag(build):
    model, _ = _model(build)
    model, _ = P.run_pipeline(model, P.parse_spec("prune(sparsity=0.5),quantize"))
    q = model.graph.initializers["W1_int8"]
    assert np.count_nonzero(q.const_value.numpy()) == 54
    assert q.metadata_props.get("mconv.pruned") == "1"


def test_fp16_mode_stores_weights_as_float16(build, run_ort):
    model, _ = _model(build)
    model, _ = P.run_pipeline(model, P.parse_spec("quantize(mode='fp16')"))
    dtypes = {i.name: i.data_type for i in to_proto(model).graph.initializer}
    assert dtypes["W1_fp16"] == TensorProto.FLOAT16
