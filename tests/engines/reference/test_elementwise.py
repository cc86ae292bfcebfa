"""Elementwise ops: forward against onnxruntime (exact dtypes), VJPs against finite differences."""

from __future__ import annotations

import numpy as np
import pytest
from gradcheck import check_vjp
from onenode import assert_same, ours
from onnx import TensorProto

RNG = np.random.default_rng(0)


def f32(*shape, lo=-2.0, hi=2.0):
    return RNG.uniform(lo, hi, shape).astype(np.float32)


# --------------------------------------------------------------------------- forward

BROADCASTS = [((2, 3), (2, 3)), ((2, 3), (3,)), ((4, 1, 3), (1, 5, 1)), ((2, 3), ())]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("shapes", BROADCASTS)
def test_binary_arithmetic_matches_onnxruntime_with_broadcasting(op, shapes):
    a, b = f32(*shapes[0]), f32(*shapes[1], lo=0.5, hi=2.0)
    assert_same(op, [a, b])


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_div_truncates_toward_zero(dtype):
    a = np.array([7, -7, 7, -7, 6, -1], dtype)
    b = np.array([2, 2, -2, -2, 3, 5], dtype)
    (y,) = ours("Div", [a, b], {})
    np.testing.assert_array_equal(y, np.array([3, -3, -3, 3, 2, 0], dtype))
    assert_same("Div", [a, b])


def test_pow_keeps_float32_with_int64_exponent():
    a = f32(3, 4, lo=0.1, hi=2.0)
    assert_same("Pow", [a, np.array([2], np.int64)])
    assert_same("Pow", [a, f32(4)])


@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_sign_follows_divisor_or_dividend(fmod):
    a = np.array([5, -5, 5, -5, 7], np.int32)
    b = np.array([3, 3, -3, -3, 2], np.int32)
    assert_same("Mod", [a, b], {"fmod": fmod})
    if fmod:
        assert_same("Mod", [f32(5, lo=-4, hi=4), f32(5, lo=0.5, hi=2)], {"fmod": 1})


UNARY = {
    "Neg": (-2, 2),
    "Abs": (-2, 2),
    "Reciprocal": (0.5, 2),
    "Sqrt": (0.1, 2),
    "Exp": (-2, 2),
    "Log": (0.1, 2),
    "Sin": (-2, 2),
    "Cos": (-2, 2),
    "Tan": (-1, 1),
    "Asin": (-0.9, 0.9),
    "Acos": (-0.9, 0.9),
    "Atan": (-2, 2),
    "Sinh": (-2, 2),
    "Cosh": (-2, 2),
    "Asinh": (-2, 2),
    "Acosh": (1.1, 3),
    "Atanh": (-0.9, 0.9),
    "Erf": (-2, 2),
    "Floor": (-2, 2),
    "Ceil": (-2, 2),
    "Sign": (-2, 2),
}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_math_matches_onnxruntime(op):
    assert_same(op, [f32(3, 4, lo=UNARY[op][0], hi=UNARY[op][1])], rtol=2e-6)


def test_round_is_half_to_even():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.4, 2.6], np.float32)
    (y,) = ours("Round", [x], {})
    np.testing.assert_array_equal(y, [0, 2, 2, -0, -2, 2, 3])
    assert_same("Round", [x])


def test_isnan_isinf_with_detect_flags():
    x = np.array([np.nan, np.inf, -np.inf, 1.0], np.float32)
    assert_same("IsNaN", [x])
    for pos, neg in [(1, 1), (1, 0), (0, 1)]:
        assert_same("IsInf", [x], {"detect_positive": pos, "detect_negative": neg})


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
def test_variadic_ops_broadcast_three_inputs(op):
    assert_same(op, [f32(2, 3), f32(3), f32(1, 3)])


def test_clip_with_input_bounds_and_old_attribute_bounds():
    x = f32(4, 5)
    assert_same("Clip", [x, np.array(-0.5, np.float32), np.array(0.7, np.float32)])
    assert_same("Clip", [x, None, np.array(0.7, np.float32)])
    assert_same("Clip", [np.arange(-3, 4, dtype=np.int32), np.array(-1, np.int32), np.array(2, np.int32)])
    assert_same("Clip", [x], {"min": -0.3, "max": 0.4}, opset=6)


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic_ops(op):
    a, b = RNG.random((3, 4)) > 0.5, RNG.random((4,)) > 0.5
    assert_same(op, [a, b])
    assert_same("Not", [a])


@pytest.mark.parametrize("op", ["Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"])
def test_comparisons_give_bool(op):
    a = np.array([[1, 2, 3], [3, 2, 1]], np.float32)
    assert_same(op, [a, np.array([2], np.float32)])
    assert_same(op, [a.astype(np.int64), np.array([2], np.int64)])


@pytest.mark.parametrize(
    "src,to",
    [
        (np.float32, TensorProto.INT32),
        (np.float32, TensorProto.FLOAT16),
        (np.float32, TensorProto.DOUBLE),
        (np.int64, TensorProto.FLOAT),
        (np.float32, TensorProto.BOOL),
        (np.float32, TensorProto.UINT8),
    ],
)
def test_cast_numeric(src, to):
    x = (RNG.uniform(-3, 200, (3, 4))).astype(src)
    if to == TensorProto.UINT8:
        x = np.abs(x)
    assert_same("Cast", [x], {"to": to})


def test_cast_float8_saturates_by_default_and_not_when_asked():
    import ml_dtypes

    x = np.array([1.0, 500.0, -1000.0, np.inf], np.float32)
    (y,) = ours("Cast", [x], {"to": TensorProto.FLOAT8E4M3FN})
    assert y.dtype == ml_dtypes.float8_e4m3fn
    np.testing.assert_array_equal(y.astype(np.float32), [1.0, 448.0, -448.0, 448.0])
    (y,) = ours("Cast", [x[:2]], {"to": TensorProto.FLOAT8E4M3FN, "saturate": 0})
    assert np.isnan(y.astype(np.float32)[1])
    (b,) = ours("Cast", [np.array([1.00390625, 3.0], np.float32)], {"to": TensorProto.BFLOAT16})
    assert b.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(b.astype(np.float32), [1.0, 3.0])  # rounds to 8 mantissa bits


def test_cast_to_and_from_string():
    (s,) = ours("Cast", [np.array([1.5, -2.0], np.float32)], {"to": TensorProto.STRING})
    assert list(s) == ["1.5", "-2"]
    (f,) = ours("Cast", [np.array(["1.5", "-2", "1e3"], dtype=object)], {"to": TensorProto.FLOAT})
    assert f.dtype == np.float32
    np.testing.assert_array_equal(f, [1.5, -2.0, 1000.0])


def test_castlike_takes_target_dtype():
    assert_same("CastLike", [f32(3), np.zeros(1, np.float16)])


# --------------------------------------------------------------------------- VJPs

BROADCAST_GRAD = [((2, 3), (2, 3)), ((2, 3), (3,)), ((3, 1), (1, 4)), ((2, 3), ())]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("shapes", BROADCAST_GRAD)
def test_binary_vjp_reduces_over_broadcast_axes(op, shapes):
    a = RNG.uniform(-2, 2, shapes[0])
    b = RNG.uniform(0.5, 2, shapes[1])
    check_vjp(op, [a, b], {})


def test_pow_vjp_both_inputs():
    check_vjp("Pow", [RNG.uniform(0.5, 2, (2, 3)), RNG.uniform(-1, 2, (3,))], {})


def test_mod_vjp_fmod():
    check_vjp("Mod", [RNG.uniform(-4, 4, (2, 3)), RNG.uniform(0.7, 1.3, (2, 3))], {"fmod": 1})


@pytest.mark.parametrize("op", sorted(set(UNARY) - {"Floor", "Ceil", "Sign"}))
def test_unary_vjp(op):
    lo, hi = UNARY[op]
    x = RNG.uniform(lo, hi, (2, 3))
    if op == "Abs":
        x = np.where(np.abs(x) < 0.1, 0.5, x)
    check_vjp(op, [x], {})


@pytest.mark.parametrize("op", ["Floor", "Ceil", "Round", "Sign"])
def test_piecewise_constant_ops_have_zero_gradient(op):
    x = RNG.uniform(-2, 2, (2, 3))
    x = x + 0.25 - (x % 0.5)  # away from the jumps
    check_vjp(op, [x], {})


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
def test_variadic_vjp(op):
    check_vjp(op, [RNG.standard_normal((2, 3)), RNG.standard_normal((3,)), RNG.standard_normal((2, 1))], {})


def test_clip_vjp_for_x_and_bounds():
    x = RNG.uniform(-2, 2, (3, 4))
    x = np.where(np.abs(np.abs(x) - 0.5) < 0.05, 1.0, x)
    check_vjp("Clip", [x, np.array(-0.5), np.array(0.5)], {})
    check_vjp("Clip", [x], {"min": -0.5, "max": 0.5}, opset=6)


def test_cast_vjp_passes_gradient_between_float_types():
    check_vjp("Cast", [RNG.standard_normal((2, 3))], {"to": TensorProto.DOUBLE})
