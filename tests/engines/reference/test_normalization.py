"""Normalization ops: forward against onnxruntime (onnx.reference for BatchNormalization's
training mode, hand loops for even-size LRN), VJPs against finite differences."""

from __future__ import annotations

import numpy as np
import pytest
from gradcheck import check_vjp
from oracles import run_mconv, run_onnx_reference, run_ort

RNG = np.random.default_rng(0)


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def f64(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape)


def close(got, expected) -> None:
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (3, 4), (2, 3, 5), (1, 2, 2, 3, 2)])
def test_batch_normalization_inference_matches_onnxruntime(shape) -> None:
    c = shape[1]
    inputs = [f32(*shape), f32(c), f32(c), f32(c), np.abs(f32(c)) + 0.5]
    close(
        run_mconv("BatchNormalization", inputs, {"epsilon": 1e-3})[0],
        run_ort("BatchNormalization", inputs, {"epsilon": 1e-3})[0],
    )


@pytest.mark.parametrize("opset", [14, 15])
def test_batch_normalization_training_mode_matches_onnx_reference(opset: int) -> None:
    inputs = [f32(3, 4, 2, 3), f32(4), f32(4), f32(4), np.abs(f32(4)) + 0.5]
    attrs = {"training_mode": 1, "momentum": 0.8}
    expected = run_onnx_reference("BatchNormalization", inputs, attrs, n_outputs=3, opset=opset)
    got = run_mconv("BatchNormalization", inputs, attrs, opset=opset)
    assert len(got) == 3
    for g, e in zip(got, expected):
        close(g, e)


def test_batch_normalization_inference_vjp_covers_every_input() -> None:
    c = 3
    check_vjp(
        "BatchNormalization",
        [f64(2, c, 2, 3), f64(c), f64(c), f64(c), np.abs(f64(c)) + 0.5],
        {"epsilon": 1e-3},
    )


def test_batch_normalization_training_vjp_matches_finite_differences() -> None:
    c = 3
    inputs = [f64(3, c, 2, 2), f64(c), f64(c), f64(c), np.abs(f64(c)) + 0.5]
    check_vjp("BatchNormalization", inputs, {"training_mode": 1}, wrt=[0, 1, 2], outputs=[0])


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (2, 3, 5)])
def test_instance_normalization_matches_onnxruntime_and_finite_differences(shape) -> None:
    c = shape[1]
    inputs = [f32(*shape), f32(c), f32(c)]
    close(
        run_mconv("InstanceNormalization", inputs, {"epsilon": 1e-3})[0],
        run_ort("InstanceNormalization", inputs, {"epsilon": 1e-3})[0],
    )
    check_vjp("InstanceNormalization", [f64(1, c, *shape[2:]), f64(c), f64(c)], {})


LAYER_CASES = {
    "last_axis": ((2, 3, 5), {}, (5,)),
    "axis_1": ((2, 3, 4), {"axis": 1}, (3, 4)),
    "negative_axis_broadcast_scale": ((2, 3, 4), {"axis": -2}, (1, 4)),
}


@pytest.mark.parametrize("case", LAYER_CASES)
def test_layer_normalization_outputs_match_onnxruntime(case: str) -> None:
    xs, attrs, ss = LAYER_CASES[case]
    inputs = [f32(*xs), f32(*ss), f32(*ss)]
    attrs = dict(attrs, epsilon=1e-3)
    expected = run_ort("LayerNormalization", inputs, attrs, n_outputs=3, opset=17)
    got = run_mconv("LayerNormalization", inputs, attrs, opset=17)
    for g, e in zip(got, expected):
        close(g, e)


@pytest.mark.parametrize("case", LAYER_CASES)
def test_layer_normalization_vjp_through_all_outputs(case: str) -> None:
    xs, attrs, ss = LAYER_CASES[case]
    check_vjp("LayerNormalization", [f64(*xs), f64(*ss), f64(*ss)], attrs)


def test_layer_normalization_without_bias() -> None:
    inputs = [f32(2, 5), f32(5)]
    close(
        run_mconv("LayerNormalization", inputs, {})[0], run_ort("LayerNormalization", inputs, {}, opset=17)[0]
    )
    check_vjp("LayerNormalization", [f64(2, 5), f64(5)], {}, outputs=[0])


def test_group_normalization_per_channel_matches_onnxruntime() -> None:
    inputs = [f32(2, 6, 3, 4), f32(6), f32(6)]
    attrs = {"num_groups": 3, "epsilon": 1e-3}
    close(
        run_mconv("GroupNormalization", inputs, attrs)[0],
        run_ort("GroupNormalization", inputs, attrs, opset=21)[0],
    )


def test_group_normalization_opset18_per_group_scale_matches_onnx_reference() -> None:
    inputs = [f32(2, 6, 3, 4), f32(3), f32(3)]
    attrs = {"num_groups": 3}
    expected = run_onnx_reference("GroupNormalization", inputs, attrs, opset=18)[0]
    close(run_mconv("GroupNormalization", inputs, attrs, opset=18)[0], expected)


@pytest.mark.parametrize(("scale_len", "opset"), [(4, 21), (2, 18)])
def test_group_normalization_vjp_matches_finite_differences(scale_len: int, opset: int) -> None:
    check_vjp(
        "GroupNormalization",
        [f64(2, 4, 2, 3), f64(scale_len), f64(scale_len)],
        {"num_groups": 2},
        opset=opset,
    )


@pytest.mark.parametrize("attrs", [{}, {"p": 1}, {"axis": 1, "p": 2}, {"axis": 0, "p": 1}])
def test_lp_normalization_matches_onnxruntime_and_finite_differences(attrs) -> None:
    x = f32(2, 3, 4)
    close(run_mconv("LpNormalization", [x], attrs)[0], run_ort("LpNormalization", [x], attrs)[0])
    check_vjp("LpNormalization", [f64(2, 3, 4)], attrs)


@pytest.mark.parametrize("p", [1, 2])
def test_lp_normalization_keeps_a_zero_vector_zero(p: int) -> None:
    x = np.array([[0.0, 0.0], [3.0, 4.0]], np.float32)
    (got,) = run_mconv("LpNormalization", [x], {"p": p})
    expected = np.array([[0, 0], [3 / 7, 4 / 7] if p == 1 else [0.6, 0.8]], np.float32)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


@pytest.mark.parametrize("attrs", [{}, {"axes": [1, 3]}, {"axes": [2]}])
def test_mean_variance_normalization_matches_onnxruntime_and_finite_differences(attrs) -> None:
    x = f32(2, 3, 4, 3)
    close(
        run_mconv("MeanVarianceNormalization", [x], attrs)[0],
        run_ort("MeanVarianceNormalization", [x], attrs)[0],
    )
    check_vjp("MeanVarianceNormalization", [f64(2, 3, 4, 3)], attrs)


def lrn_by_hand(x: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    """The ONNX spec's LRN, one channel at a time: window [c - floor((size-1)/2), c + ceil((size-1)/2)]."""
    y = np.empty_like(x, dtype=np.float64)
    channels = x.shape[1]
    for c in range(channels):
        lo, hi = max(0, c - (size - 1) // 2), min(channels - 1, c + size // 2)
        square_sum = (x[:, lo : hi + 1].astype(np.float64) ** 2).sum(axis=1)
        y[:, c] = x[:, c] / (bias + alpha / size * square_sum) ** beta
    return y


@pytest.mark.parametrize("size", [1, 3, 5])
def test_lrn_runs_over_channels_like_onnxruntime(size: int) -> None:
    x = f32(2, 7, 3, 4)
    attrs = {"size": size, "alpha": 0.2, "beta": 0.6, "bias": 1.5}
    close(run_mconv("LRN", [x], attrs)[0], run_ort("LRN", [x], attrs)[0])


@pytest.mark.parametrize("size", [2, 4])
def test_lrn_even_size_follows_the_spec_window(size: int) -> None:
    # onnxruntime refuses even sizes; the spec's window is the oracle.
    x = f32(1, 6, 2, 3)
    got = run_mconv("LRN", [x], {"size": size, "alpha": 0.3, "beta": 0.75, "bias": 2.0})[0]
    np.testing.assert_allclose(got, lrn_by_hand(x, size, 0.3, 0.75, 2.0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("size", [2, 3, 5])
def test_lrn_vjp_matches_finite_differences(size: int) -> None:
    check_vjp("LRN", [f64(2, 6, 2, 2)], {"size": size, "alpha": 0.2, "beta": 0.6, "bias": 1.5})
