"""Pooling ops: forward (values and MaxPool Indices) against onnxruntime, VJPs against finite
differences."""

from __future__ import annotations

import numpy as np
import pytest
from gradcheck import check_vjp
from oracles import run_mconv, run_onnx_reference, run_ort

RNG = np.random.default_rng(0)


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


WINDOW_CASES = {
    "plain": ((2, 3, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2]}),
    "pads": ((1, 2, 6, 7), {"kernel_shape": [3, 2], "pads": [1, 0, 1, 1]}),
    "ceil_mode": (
        (1, 2, 7, 8),
        {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1, "pads": [1, 0, 0, 1]},
    ),
    "dilations": ((1, 2, 8, 9), {"kernel_shape": [2, 3], "dilations": [2, 2], "pads": [1, 1, 1, 1]}),
    "same_upper": ((1, 2, 7, 8), {"kernel_shape": [2, 3], "auto_pad": "SAME_UPPER", "strides": [2, 3]}),
    "same_lower": ((1, 2, 7, 8), {"kernel_shape": [2, 3], "auto_pad": "SAME_LOWER", "strides": [2, 3]}),
    "valid": ((1, 2, 7, 8), {"kernel_shape": [3, 3], "auto_pad": "VALID", "strides": [2, 2]}),
    "pool1d_ceil": ((2, 2, 9), {"kernel_shape": [3], "strides": [2], "ceil_mode": 1}),
    "pool3d": (
        (1, 2, 4, 5, 6),
        {"kernel_shape": [2, 2, 3], "strides": [2, 1, 2], "pads": [0, 1, 1, 1, 0, 1]},
    ),
}


@pytest.mark.parametrize("case", WINDOW_CASES)
def test_max_pool_values_and_indices_match_onnxruntime(case: str) -> None:
    xs, attrs = WINDOW_CASES[case]
    x = f32(*xs)
    expected = run_ort("MaxPool", [x], attrs, n_outputs=2)
    got = run_mconv("MaxPool", [x], attrs, n_outputs=2)
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])
    (values_only,) = run_mconv("MaxPool", [x], attrs, n_outputs=1)
    np.testing.assert_array_equal(values_only, expected[0])


def test_max_pool_column_major_indices_match_onnxruntime() -> None:
    x = f32(2, 3, 6, 7)
    attrs = {"kernel_shape": [3, 2], "strides": [2, 1], "storage_order": 1}
    expected = run_ort("MaxPool", [x], attrs, n_outputs=2)
    got = run_mconv("MaxPool", [x], attrs, n_outputs=2)
    np.testing.assert_array_equal(got[1], expected[1])


def test_max_pool_int8_pads_with_the_dtype_minimum() -> None:
    x = RNG.integers(-128, -100, (1, 2, 5, 5)).astype(np.int8)
    attrs = {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1]}
    (expected,) = run_ort("MaxPool", [x], attrs)
    (got,) = run_mconv("MaxPool", [x], attrs, n_outputs=1)
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got, expected)


def test_max_pool_ties_pick_the_first_tap() -> None:
    x = np.zeros((1, 1, 2, 2), np.float32)
    _, idx = run_mconv("MaxPool", [x], {"kernel_shape": [2, 2]}, n_outputs=2)
    assert idx.reshape(-1).tolist() == [0]


@pytest.mark.parametrize("case", WINDOW_CASES)
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool_matches_onnxruntime(case: str, count_include_pad: int) -> None:
    xs, attrs = WINDOW_CASES[case]
    attrs = dict(attrs, count_include_pad=count_include_pad)
    x = f32(*xs)
    (expected,) = run_ort("AveragePool", [x], attrs)
    (got,) = run_mconv("AveragePool", [x], attrs)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "case", ["plain", "pads", "ceil_mode", "dilations", "same_upper", "pool1d_ceil", "pool3d"]
)
@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pool_matches_onnxruntime(case: str, p: int) -> None:
    xs, attrs = WINDOW_CASES[case]
    attrs = dict(attrs, p=p)
    x = f32(*xs)
    (expected,) = run_ort("LpPool", [x], attrs, opset=18)
    (got,) = run_mconv("LpPool", [x], attrs, opset=18)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


GRAD_CASES = ["plain", "ceil_mode", "dilations", "same_lower", "pool1d_ceil", "pool3d"]


def _small(xs: tuple[int, ...]) -> tuple[int, ...]:
    return (1, 1) + xs[2:]


@pytest.mark.parametrize("case", GRAD_CASES)
def test_max_pool_vjp_matches_finite_differences(case: str) -> None:
    xs, attrs = WINDOW_CASES[case]
    # A permutation keeps every window's maximum unique, so the function is smooth at x.
    x = RNG.permutation(np.prod(_small(xs))).reshape(_small(xs)).astype(np.float64)
    check_vjp("MaxPool", [x], attrs, outputs=[0])


@pytest.mark.parametrize("case", GRAD_CASES)
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool_vjp_matches_finite_differences(case: str, count_include_pad: int) -> None:
    xs, attrs = WINDOW_CASES[case]
    check_vjp("AveragePool", [f32(*_small(xs))], dict(attrs, count_include_pad=count_include_pad))


@pytest.mark.parametrize("case", GRAD_CASES)
def test_lp_pool_vjp_matches_finite_differences(case: str) -> None:
    xs, attrs = WINDOW_CASES[case]
    check_vjp("LpPool", [f32(*_small(xs))], dict(attrs, p=3))


@pytest.mark.parametrize("op", ["GlobalMaxPool", "GlobalAveragePool", "GlobalLpPool"])
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 2, 7), (1, 2, 2, 3, 2)])
def test_global_pool_matches_onnxruntime(op: str, shape: tuple[int, ...]) -> None:
    x = f32(*shape)
    (expected,) = run_ort(op, [x], {})
    (got,) = run_mconv(op, [x], {})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["GlobalMaxPool", "GlobalAveragePool", "GlobalLpPool"])
def test_global_pool_vjp_matches_finite_differences(op: str) -> None:
    check_vjp(op, [f32(2, 3, 3, 4)], {})


def test_max_unpool_inverts_max_pool_like_onnxruntime() -> None:
    # Without output_shape the unpooled size is (in-1)*s + k: pool 6 rows to get 6 rows back.
    x = f32(2, 3, 6, 8)
    pool = {"kernel_shape": [2, 2], "strides": [2, 2]}
    y, idx = run_ort("MaxPool", [x], pool, n_outputs=2)
    (expected,) = run_ort("MaxUnpool", [y, idx], pool)
    (got,) = run_mconv("MaxUnpool", [y, idx], pool)
    assert got.shape == (2, 3, 6, 8)
    np.testing.assert_array_equal(got, expected)


def test_max_unpool_output_shape_pads_the_inferred_result_like_onnx_reference() -> None:
    """The backend test's semantics (onnx.reference): indices address the inferred 4x4 output,
    which output_shape then pads to 5x5 (onnxruntime reads them as 5x5 addresses instead)."""
    x = np.array([[[[5, 6], [7, 8]]]], np.float32)
    idx = np.array([[[[5, 7], [13, 15]]]], np.int64)
    shape = np.array([1, 1, 5, 5], np.int64)
    pool = {"kernel_shape": [2, 2], "strides": [2, 2]}
    (got,) = run_mconv("MaxUnpool", [x, idx, shape], pool)
    expected = np.zeros((1, 1, 5, 5), np.float32)
    expected[0, 0, 1, 1], expected[0, 0, 1, 3], expected[0, 0, 3, 1], expected[0, 0, 3, 3] = 5, 6, 7, 8
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(got, run_onnx_reference("MaxUnpool", [x, idx, shape], pool)[0])


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_max_roi_pool_matches_onnxruntime(scale: float) -> None:
    x = f32(2, 3, 7, 8)
    rois = np.array([[0, 1, 1, 5, 4], [1, 0, 2, 7, 6], [0, 2, 2, 2, 2], [1, 3, 1, 9, 9]], np.float32)
    attrs = {"pooled_shape": [2, 3], "spatial_scale": scale}
    (expected,) = run_ort("MaxRoiPool", [x, rois], attrs)
    (got,) = run_mconv("MaxRoiPool", [x, rois], attrs)
    np.testing.assert_array_equal(got, expected)
