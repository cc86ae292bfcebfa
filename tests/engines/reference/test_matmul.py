"""MatMul, Gemm, Einsum: forward against onnxruntime, VJPs against finite differences;
MatMulInteger against exact integer arithmetic."""

from __future__ import annotations

import numpy as np
import pytest
from gradcheck import check_vjp
from oracles import run_mconv, run_onnx_reference, run_ort

RNG = np.random.default_rng(0)


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


MATMUL_SHAPES = [
    ((3, 4), (4, 5)),
    ((4,), (4, 5)),
    ((3, 4), (4,)),
    ((4,), (4,)),
    ((2, 1, 3, 4), (5, 4, 2)),
    ((3, 4), (2, 4, 5)),
    ((2, 3, 4), (4,)),
]


@pytest.mark.parametrize(("sa", "sb"), MATMUL_SHAPES)
def test_matmul_broadcasting_and_1d_promotion_match_onnxruntime(sa, sb) -> None:
    a, b = f32(*sa), f32(*sb)
    (expected,) = run_ort("MatMul", [a, b], {})
    (got,) = run_mconv("MatMul", [a, b], {})
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("sa", "sb"), MATMUL_SHAPES)
def test_matmul_vjp_sums_over_broadcast_axes(sa, sb) -> None:
    check_vjp("MatMul", [f32(*sa), f32(*sb)], {})


GEMM_C_SHAPES = [None, (5,), (3, 1), (3, 5), (1,), ()]


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", GEMM_C_SHAPES)
def test_gemm_matches_onnxruntime_and_finite_differences(trans_a: int, trans_b: int, c_shape) -> None:
    a = f32(4, 3) if trans_a else f32(3, 4)
    b = f32(5, 4) if trans_b else f32(4, 5)
    inputs = [a, b] if c_shape is None else [a, b, f32(*c_shape)]
    attrs = {"transA": trans_a, "transB": trans_b, "alpha": 0.5, "beta": 2.0}
    (expected,) = run_ort("Gemm", inputs, attrs)
    (got,) = run_mconv("Gemm", inputs, attrs)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    check_vjp("Gemm", inputs, attrs)


def test_gemm_defaults_are_alpha_beta_one() -> None:
    a, b, c = f32(2, 3), f32(3, 4), f32(4)
    np.testing.assert_allclose(run_mconv("Gemm", [a, b, c], {})[0], a @ b + c, rtol=1e-5, atol=1e-6)


def matmul_integer_exact(a, b, a_zero=0, b_zero=0) -> np.ndarray:
    """MatMulInteger in int64 arithmetic (numpy's integer matmul is exact; no BLAS, no saturation).

    ONNX Runtime is no oracle here: its u8 x s8 kernels saturate on CPUs without VNNI."""
    acc = (a.astype(np.int64) - np.asarray(a_zero, np.int64)) @ (
        b.astype(np.int64) - np.asarray(b_zero, np.int64)
    )
    assert np.abs(acc).max() < 2**31
    return acc.astype(np.int32)


@pytest.mark.parametrize(
    ("a_dtype", "b_dtype", "zero_points"),
    [(np.uint8, np.uint8, None), (np.uint8, np.int8, (7, -3)), (np.int8, np.uint8, (-5, 200))],
)
def test_matmul_integer_matches_exact_integer_arithmetic(a_dtype, b_dtype, zero_points) -> None:
    rng = np.random.default_rng(20)
    info_a, info_b = np.iinfo(a_dtype), np.iinfo(b_dtype)
    # the full range, extremes included: these are the values a saturating kernel gets wrong
    a = rng.integers(info_a.min, info_a.max, (2, 3, 4), endpoint=True).astype(a_dtype)
    b = rng.integers(info_b.min, info_b.max, (4, 5), endpoint=True).astype(b_dtype)
    a[0, 0], b[:, 0] = info_a.max, info_b.min
    inputs = [a, b]
    expected = matmul_integer_exact(a, b)
    if zero_points is not None:
        inputs += [np.array(zero_points[0], a_dtype), np.array(zero_points[1], b_dtype)]
        expected = matmul_integer_exact(a, b, *zero_points)
    (got,) = run_mconv("MatMulInteger", inputs, {})
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, expected)


def test_matmul_integer_per_row_and_per_column_zero_points_match_hand_math() -> None:
    a = RNG.integers(0, 255, (3, 4)).astype(np.uint8)
    b = RNG.integers(0, 255, (4, 2)).astype(np.uint8)
    az, bz = np.array([1, 2, 3], np.uint8), np.array([10, 20], np.uint8)
    (got,) = run_mconv("MatMulInteger", [a, b, az, bz], {})
    expected = [
        [sum((int(a[i, k]) - int(az[i])) * (int(b[k, j]) - int(bz[j])) for k in range(4)) for j in range(2)]
        for i in range(3)
    ]
    np.testing.assert_array_equal(got, np.array(expected))


EINSUM_CASES = [
    ("ij,jk->ik", [(2, 3), (3, 4)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 2)]),
    ("ii->i", [(3, 3)]),
    ("iij,j->i", [(2, 2, 3), (3,)]),
    ("ij->", [(2, 3)]),
    ("ij", [(2, 3)]),
    ("ji", [(2, 3)]),
    ("i,i", [(3,), (3,)]),
    ("ij,kl->ijkl", [(2, 2), (3, 1)]),
    ("...ij,...jk", [(2, 3, 4), (1, 4, 5)]),
    ("...i,...i->...", [(2, 1, 3), (2, 4, 3)]),
    ("bhid,bhjd->bhij", [(1, 2, 3, 4), (1, 2, 2, 4)]),
]


@pytest.mark.parametrize(("equation", "shapes"), EINSUM_CASES)
def test_einsum_matches_onnx_reference(equation: str, shapes) -> None:
    inputs = [f32(*s) for s in shapes]
    (expected,) = run_onnx_reference("Einsum", inputs, {"equation": equation})
    (got,) = run_mconv("Einsum", inputs, {"equation": equation})
    assert got.shape == np.shape(expected)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("equation", "shapes"), [c for c in EINSUM_CASES if c[0] != "...ij,...jk"])
def test_einsum_matches_onnxruntime(equation: str, shapes) -> None:
    inputs = [f32(*s) for s in shapes]
    (expected,) = run_ort("Einsum", inputs, {"equation": equation})
    (got,) = run_mconv("Einsum", inputs, {"equation": equation})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("equation", "shapes"), EINSUM_CASES)
def test_einsum_vjp_handles_diagonals_sums_and_broadcasts(equation: str, shapes) -> None:
    check_vjp("Einsum", [f32(*s) for s in shapes], {"equation": equation})
