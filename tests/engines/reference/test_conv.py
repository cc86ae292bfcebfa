"""Conv, ConvTranspose, DeformConv, Col2Im: forward against onnxruntime, VJPs against finite
differences; ConvInteger against exact integer arithmetic."""

from __future__ import annotations

import numpy as np
import pytest
from gradcheck import check_vjp
from oracles import run_mconv, run_onnx_reference, run_ort

RNG = np.random.default_rng(0)


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# (x shape, w shape, attrs): the variants ONNX's backend tests exercise.
CONV_CASES = {
    "plain": ((2, 3, 7, 8), (4, 3, 3, 3), {}),
    "pads_asymmetric": ((1, 3, 7, 8), (4, 3, 3, 3), {"pads": [1, 0, 2, 1]}),
    "strides": ((1, 3, 9, 8), (4, 3, 3, 3), {"strides": [2, 3], "pads": [1, 1, 1, 1]}),
    "dilations": ((1, 2, 9, 9), (3, 2, 3, 2), {"dilations": [2, 3]}),
    "groups": ((2, 4, 6, 7), (6, 2, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),
    "depthwise": ((1, 4, 6, 7), (8, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}),
    "same_upper": ((1, 3, 7, 8), (2, 3, 4, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 3]}),
    "same_lower": ((1, 3, 7, 8), (2, 3, 4, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 3]}),
    "valid": ((1, 3, 7, 8), (2, 3, 3, 3), {"auto_pad": "VALID", "strides": [2, 2]}),
    "kernel_shape_attr": ((1, 3, 6, 6), (2, 3, 3, 3), {"kernel_shape": [3, 3], "strides": [2, 2]}),
    "conv1d": ((2, 3, 11), (4, 3, 3), {"pads": [1, 2], "strides": [2], "dilations": [2]}),
    "conv3d": ((1, 2, 5, 6, 4), (3, 2, 2, 3, 2), {"pads": [1, 0, 1, 0, 1, 1], "strides": [1, 2, 1]}),
    # Stride 1 everywhere takes the flat-canvas im2col path.
    "conv1d_stride1": ((2, 3, 9), (4, 3, 3), {"pads": [2, 1], "dilations": [2]}),
    "conv3d_stride1": (
        (1, 2, 4, 5, 4),
        (3, 2, 2, 3, 2),
        {"pads": [1, 0, 1, 0, 1, 1], "dilations": [1, 2, 1]},
    ),
    "stride1_valid_dilated": ((1, 2, 6, 7), (3, 2, 3, 3), {"dilations": [2, 2], "auto_pad": "VALID"}),
}


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_forward_matches_onnxruntime(case: str) -> None:
    xs, ws, attrs = CONV_CASES[case]
    inputs = [f32(*xs), f32(*ws), f32(ws[0])]
    (expected,) = run_ort("Conv", inputs, attrs)
    (got,) = run_mconv("Conv", inputs, attrs)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_conv_without_bias_matches_onnxruntime() -> None:
    inputs = [f32(1, 3, 6, 6), f32(2, 3, 3, 3)]
    np.testing.assert_allclose(
        run_mconv("Conv", inputs, {})[0], run_ort("Conv", inputs, {})[0], rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_vjp_matches_finite_differences(case: str) -> None:
    xs, ws, attrs = CONV_CASES[case]
    # Smaller batch keeps the element-wise finite differences quick.
    xs = (1,) + xs[1:]
    check_vjp("Conv", [f32(*xs), f32(*ws), f32(ws[0])], attrs)


CONV_TRANSPOSE_CASES = {
    "plain": ((2, 3, 4, 5), (3, 2, 3, 3), {}),
    "strides_pads": ((1, 3, 4, 5), (3, 2, 3, 3), {"strides": [2, 2], "pads": [1, 0, 1, 1]}),
    "output_padding": ((1, 3, 4, 5), (3, 2, 3, 3), {"strides": [3, 2], "output_padding": [1, 1]}),
    "output_shape": ((1, 4, 4, 5), (4, 3, 3, 3), {"group": 2, "strides": [2, 3], "output_shape": [10, 16]}),
    "groups_dilations": ((1, 4, 4, 5), (4, 2, 3, 2), {"group": 2, "dilations": [2, 2], "strides": [2, 1]}),
    "same_upper": ((1, 2, 4, 5), (2, 2, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 3]}),
    "same_lower": ((1, 2, 4, 5), (2, 2, 3, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 3]}),
    "kernel_shape_attr": ((1, 2, 3, 3), (2, 2, 3, 3), {"kernel_shape": [3, 3], "strides": [2, 2]}),
    "conv_transpose1d": ((2, 3, 5), (3, 2, 4), {"strides": [3], "pads": [1, 0]}),
    "conv_transpose3d": ((1, 2, 3, 4, 3), (2, 2, 2, 3, 2), {"strides": [2, 1, 2]}),
}


@pytest.mark.parametrize("case", CONV_TRANSPOSE_CASES)
def test_conv_transpose_forward_matches_onnxruntime(case: str) -> None:
    xs, ws, attrs = CONV_TRANSPOSE_CASES[case]
    group = attrs.get("group", 1)
    inputs = [f32(*xs), f32(*ws), f32(ws[1] * group)]
    (expected,) = run_ort("ConvTranspose", inputs, attrs)
    (got,) = run_mconv("ConvTranspose", inputs, attrs)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", CONV_TRANSPOSE_CASES)
def test_conv_transpose_vjp_matches_finite_differences(case: str) -> None:
    xs, ws, attrs = CONV_TRANSPOSE_CASES[case]
    group = attrs.get("group", 1)
    check_vjp("ConvTranspose", [f32(1, *xs[1:]), f32(*ws), f32(ws[1] * group)], attrs)


def test_conv_transpose_is_the_adjoint_of_conv() -> None:
    """<Conv(x, w), y> == <x, ConvTranspose(y, w)> for matching geometry (hand identity)."""
    attrs = {"strides": [2, 2], "pads": [1, 1, 1, 1]}
    x, w = f32(1, 3, 7, 7), f32(4, 3, 3, 3)
    (cx,) = run_mconv("Conv", [x, w], attrs)
    y = f32(*cx.shape)
    (ty,) = run_mconv("ConvTranspose", [y, w], dict(attrs, output_shape=[7, 7]))
    assert np.isclose(np.vdot(cx.astype(np.float64), y), np.vdot(x.astype(np.float64), ty), rtol=1e-4)


def conv_integer_exact(x, w, x_zero=0, w_zero=0, attrs=None) -> np.ndarray:
    """ConvInteger (2-D, NCHW) in int64 arithmetic: subtract the zero points, pad with zeros, and
    sum window by window. ONNX Runtime is no oracle for integer ops (saturating kernels)."""
    attrs = attrs or {}
    group = attrs.get("group", 1)
    sh, sw = attrs.get("strides", [1, 1])
    dh, dw = attrs.get("dilations", [1, 1])
    pt, pl, pb, pr = attrs.get("pads", [0, 0, 0, 0])
    xi = np.pad(x.astype(np.int64) - np.int64(x_zero), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    wz = np.asarray(w_zero, np.int64).reshape(-1, *([1] * 3)) if np.ndim(w_zero) else np.int64(w_zero)
    wi = w.astype(np.int64) - wz
    n, c, hp, wp = xi.shape
    m, cg, kh, kw = wi.shape
    oh, ow = (hp - dh * (kh - 1) - 1) // sh + 1, (wp - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, m, oh, ow), np.int64)
    per_group = m // group
    for o in range(m):
        g = o // per_group
        for i in range(oh):
            for j in range(ow):
                win = xi[
                    :, g * cg : (g + 1) * cg, i * sh : i * sh + dh * kh : dh, j * sw : j * sw + dw * kw : dw
                ]
                out[:, o, i, j] = (win * wi[o]).sum(axis=(1, 2, 3))
    assert np.abs(out).max() < 2**31
    return out.astype(np.int32)


@pytest.mark.parametrize(
    ("x_zero", "w_zero", "attrs"),
    [(None, None, {}), (3, 100, {"pads": [1, 1, 1, 1]}), (128, 7, {"strides": [2, 2], "group": 2})],
)
def test_conv_integer_matches_exact_integer_arithmetic(x_zero, w_zero, attrs) -> None:
    rng = np.random.default_rng(21)
    x = rng.integers(0, 255, (1, 4, 6, 6), endpoint=True).astype(np.uint8)
    w = rng.integers(0, 255, (2, 4 // attrs.get("group", 1), 3, 3), endpoint=True).astype(np.uint8)
    inputs = [x, w]
    expected = conv_integer_exact(x, w, attrs=attrs)
    if x_zero is not None:
        inputs += [np.array(x_zero, np.uint8), np.array(w_zero, np.uint8)]
        expected = conv_integer_exact(x, w, x_zero, w_zero, attrs)
    (got,) = run_mconv("ConvInteger", inputs, attrs, opset=10)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, expected)


def test_conv_integer_exact_oracle_agrees_with_onnx_reference() -> None:
    """The oracle itself: strides, dilations, pads and groups against onnx.reference's ConvInteger."""
    rng = np.random.default_rng(22)
    x = rng.integers(0, 256, (2, 4, 7, 6)).astype(np.uint8)
    w = rng.integers(0, 256, (4, 2, 2, 3)).astype(np.uint8)
    attrs = {"strides": [2, 1], "dilations": [2, 1], "pads": [1, 0, 2, 1], "group": 2}
    inputs = [x, w, np.array(9, np.uint8), np.array(250, np.uint8)]
    (want,) = run_onnx_reference("ConvInteger", inputs, attrs, opset=10)
    np.testing.assert_array_equal(conv_integer_exact(x, w, 9, 250, attrs), want)


def test_conv_integer_per_channel_weight_zero_point_matches_hand_math() -> None:
    x = RNG.integers(0, 255, (1, 2, 4, 4)).astype(np.uint8)
    w = RNG.integers(0, 255, (3, 2, 2, 2)).astype(np.uint8)
    wz = np.array([1, 50, 200], np.uint8)
    (got,) = run_mconv("ConvInteger", [x, w, np.array(5, np.uint8), wz], {}, opset=10)
    xi = x.astype(np.int64) - 5
    wi = w.astype(np.int64) - wz.astype(np.int64)[:, None, None, None]
    expected = np.zeros((1, 3, 3, 3), np.int64)
    for m in range(3):
        for i in range(3):
            for j in range(3):
                expected[0, m, i, j] = (xi[0, :, i : i + 2, j : j + 2] * wi[m]).sum()
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(
    ("attrs", "with_bias_mask"),
    [({"group": 2, "offset_group": 2}, True), ({"group": 2, "pads": [1, 1, 1, 1]}, False)],
)
def test_deform_conv_matches_onnxruntime(attrs, with_bias_mask) -> None:
    x, w = f32(1, 4, 5, 6), f32(6, 2, 3, 3)
    pads = attrs.get("pads", [0, 0, 0, 0])
    oh, ow = 5 + pads[0] + pads[2] - 2, 6 + pads[1] + pads[3] - 2
    og = attrs.get("offset_group", 1)
    inputs = [x, w, (f32(1, og * 2 * 9, oh, ow) * 0.7)]
    if with_bias_mask:
        inputs += [f32(6), RNG.random((1, og * 9, oh, ow)).astype(np.float32)]
    (expected,) = run_ort("DeformConv", inputs, attrs, opset=19)
    (got,) = run_mconv("DeformConv", inputs, attrs, opset=19)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_deform_conv_with_zero_offsets_is_conv() -> None:
    x, w = f32(1, 2, 5, 5), f32(3, 2, 3, 3)
    (got,) = run_mconv(
        "DeformConv", [x, w, np.zeros((1, 18, 5, 5), np.float32)], {"pads": [1, 1, 1, 1]}, opset=19
    )
    (expected,) = run_onnx_reference("Conv", [x, w], {"pads": [1, 1, 1, 1]})
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("image", "block", "attrs"),
    [
        ((5, 6), (2, 3), {}),
        ((5, 6), (2, 3), {"pads": [1, 0, 0, 1]}),
        ((7, 8), (3, 2), {"strides": [2, 2], "dilations": [1, 2], "pads": [1, 1, 1, 1]}),
    ],
)
def test_col2im_matches_onnxruntime(image, block, attrs) -> None:
    pads = attrs.get("pads", [0, 0, 0, 0])
    s, d = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
    blocks = 1
    for a in range(2):
        blocks *= (image[a] + pads[a] + pads[a + 2] - d[a] * (block[a] - 1) - 1) // s[a] + 1
    inputs = [f32(2, 3 * block[0] * block[1], blocks), np.array(image, np.int64), np.array(block, np.int64)]
    (expected,) = run_ort("Col2Im", inputs, attrs, opset=18)
    (got,) = run_mconv("Col2Im", inputs, attrs, opset=18)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
