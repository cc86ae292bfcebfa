"""ONNX Runtime as the judge of integer products (u8 x s8: MatMulInteger, ConvInteger,
QLinearConv, QLinearMatMul, QGemm, DynamicQuantizeMatMul, MatMulIntegerToFloat,
DynamicQuantizeLSTM).

On x86 without AVX-512 VNNI (AVX2: an AMD EPYC, a Haswell) ORT's u8 x s8 kernels multiply with
vpmaddubsw, which saturates the sum of each pair of products at int16: with 8-bit weights ORT's
outputs there are not the op's (a 64-deep MatMulInteger on an AMD EPYC: codes off by 35,057),
while on a CPU with VNNI they are exact. ORT's quantizer has ``reduce_range`` (7-bit weights)
for this; with 7-bit weights a pair of products is at most 2 * 255 * 64 = 32,640 < 32,767 and
ORT is exact on every CPU. So a test that compares against ORT draws its weights here, and a
test of full-range weights compares against an exact product (numpy's int64), not ORT."""

from __future__ import annotations

import numpy as np


def w7(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """int8 weights in [-64, 63], the range ORT's ``reduce_range`` writes."""
    return rng.integers(-64, 64, size=shape).astype(np.int8)


def exact_matmul_integer(a: np.ndarray, b: np.ndarray, a_zero: int = 0, b_zero: int = 0) -> np.ndarray:
    """MatMulInteger's int32 result by numpy's exact int64 product (the judge where ORT is not)."""
    got = (a.astype(np.int64) - a_zero) @ (b.astype(np.int64) - b_zero)
    return got.astype(np.int32)


def ort_u8s8_is_exact() -> bool:
    """Whether this CPU's ORT computes a full-range u8 x s8 MatMulInteger exactly (VNNI: yes;
    AVX2 alone: no), on a seeded 64-deep product."""
    global _EXACT
    if _EXACT is None:
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper

        rng = np.random.default_rng(0)
        a = rng.integers(0, 256, (8, 64)).astype(np.uint8)
        b = rng.integers(-127, 128, (64, 16)).astype(np.int8)
        graph = helper.make_graph(
            [helper.make_node("MatMulInteger", ["a", "b"], ["y"])],
            "probe",
            [helper.make_tensor_value_info("a", TensorProto.UINT8, a.shape)],
            [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
            [numpy_helper.from_array(b, "b")],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=10)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        _EXACT = bool(np.array_equal(sess.run(None, {"a": a})[0], exact_matmul_integer(a, b)))
    return _EXACT


_EXACT: bool | None = None
