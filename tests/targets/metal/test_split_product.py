"""A MatMulInteger whose int32 sums pass 2^24, cast to float32 as ORT's dynamic quantizer writes
it (``MatMulInteger -> Cast``): the GPU targets compute it as two exact float products of the
split weights and one rounding (mconv.targets.gpu.contrib rule 7), equal to ORT's Cast of its
int32 sums bit for bit. Without the Cast (an int32 output) it is still refused. Checked on metal
(the C++ harness) and webgpu (wgpu, where an adapter is present)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from mconv.irio import from_proto
from mconv.targets import get_target
from mconv.targets.gpu.split_product import split_weights
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "webgpu"))
from test_webgpu import needs_adapter  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import _ortq  # noqa: E402

K = 1031  # 255 * 127 * K = 33388935: odd and over 2^25, so float32 must round it


def _model(cast: bool) -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    a = rng.integers(0, 256, size=(3, K)).astype(np.uint8)
    a[0] = 255  # the row that reaches the largest sums
    a[1, ::3] = 0
    b = rng.integers(-128, 128, size=(K, 4)).astype(np.int8)
    b[:, 0] = -127
    b[:, 1] = 127
    inits = [numpy_helper.from_array(b, "b"), numpy_helper.from_array(np.array(0, np.uint8), "azp")]
    nodes = [helper.make_node("MatMulInteger", ["a", "b", "azp"], ["acc"], name="the_MatMulInteger")]
    out = "acc"
    if cast:
        nodes.append(helper.make_node("Cast", ["acc"], ["y"], to=TensorProto.FLOAT))
        out = "y"
    dtype = TensorProto.FLOAT if cast else TensorProto.INT32
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [3, K])],
        [helper.make_tensor_value_info(out, dtype, [3, 4])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), a, b


def _ort(model: onnx.ModelProto, a: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"a": a})[0]


def test_split_is_exact_and_within_the_bound():
    rng = np.random.default_rng(3)
    b = rng.integers(-255, 256, size=(4096, 5)).astype(np.float64)
    hi, lo, base = split_weights(b, 255.0, 2**24)
    np.testing.assert_array_equal(base * hi + lo, b)
    assert (lo >= 0).all() and (lo < base).all()
    for part in (hi, lo):
        assert (np.abs(part).sum(axis=0) * 255).max() <= 2**24
    assert split_weights(b[:, :1] * 2**20, 255.0, 2**24) is None  # no base brings it under


@pytest.mark.parametrize("target", ["metal", pytest.param("webgpu", marks=needs_adapter)])
def test_wide_product_cast_to_float_equals_ort(target, tmp_path):
    """The judge is the exact int32 sums cast to float32, which is ORT's Cast on a CPU whose
    u8 x s8 kernels are exact; without VNNI ORT's own sums saturate (tests/_ortq.py), so ORT
    is compared only where its probe finds it exact."""
    model, a, b = _model(cast=True)
    exact = a.astype(np.int64) @ b.astype(np.int64)
    want = exact.astype(np.int32).astype(np.float32)  # one rounding, as Cast(int32 -> float)
    assert np.abs(exact).max() > 2**24 and (want != exact).any()  # the Cast does round
    if _ortq.ort_u8s8_is_exact():  # and ORT's Cast of its own sums, where they are exact
        np.testing.assert_array_equal(_ort(model, a), want)
    runner = get_target(target).load(get_target(target).export(from_proto(model), tmp_path / "b", {}))
    got = runner.run({"a": a})["y"]
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


def test_wide_product_with_int32_output_is_still_refused(tmp_path):
    from mconv.errors import UnsupportedError

    model, _, _ = _model(cast=False)
    with pytest.raises(UnsupportedError, match="2\\^24"):
        get_target("metal").export(from_proto(model), tmp_path / "b", {})
