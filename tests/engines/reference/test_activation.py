"""Activation ops: forward against onnxruntime (exact dtypes), VJPs against finite differences."""

from __future__ import annotations

import numpy as np
import pytest
from gradcheck import check_vjp
from mconv.engines.reference.ops import OpContext, lookup
from onenode import assert_same, ours

RNG = np.random.default_rng(0)


def f32(*shape, lo=-2.0, hi=2.0):
    return RNG.uniform(lo, hi, shape).astype(np.float32)


# --------------------------------------------------------------------------- forward

POINTWISE = {
    "Relu": {},
    "LeakyRelu": {"alpha": 0.1},
    "Elu": {"alpha": 0.7},
    "Selu": {},
    "Celu": {"alpha": 1.5},
    "Sigmoid": {},
    "HardSigmoid": {"alpha": 0.3, "beta": 0.4},
    "HardSwish": {},
    "Mish": {},
    "Softplus": {},
    "Softsign": {},
    "ThresholdedRelu": {"alpha": 0.3},
    "Tanh": {},
    "Shrink": {"lambd": 0.6, "bias": 0.2},
}


@pytest.mark.parametrize("op", sorted(POINTWISE))
def test_pointwise_activation_matches_onnxruntime(op):
    x = f32(3, 5, lo=-4, hi=4)
    assert_same(op, [x], POINTWISE[op], rtol=1e-5, atol=1e-6)
    if op in ("Relu", "LeakyRelu", "Sigmoid", "Tanh", "Elu"):
        # ONNX stores float attributes as float32: give ours the same rounded values.
        attrs32 = {k: float(np.float32(v)) for k, v in POINTWISE[op].items()}
        assert_same(op, [x.astype(np.float64)], attrs32, engine="ref", rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_matches_onnxruntime(approximate):
    assert_same("Gelu", [f32(4, 6, lo=-4, hi=4)], {"approximate": approximate}, opset=20, rtol=1e-5)


def test_prelu_broadcasts_slope():
    assert_same("PRelu", [f32(2, 3, 4), f32(3, 1)])


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_family_along_one_axis(op, axis):
    assert_same(op, [f32(2, 3, 4, lo=-3, hi=3)], {"axis": axis}, rtol=1e-5)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("axis", [1, 2])
def test_softmax_family_before_opset13_coerces_to_2d(op, axis):
    x = f32(2, 3, 4, lo=-3, hi=3)
    assert_same(op, [x], {"axis": axis}, opset=11, rtol=1e-5)
    # Independent check: normalization over the whole trailing block.
    if op == "Softmax":
        (y,) = ours(op, [x], {"axis": axis}, opset=11)
        np.testing.assert_allclose(y.reshape(int(np.prod(x.shape[:axis])), -1).sum(1), 1, rtol=1e-5)


# --------------------------------------------------------------------------- VJPs


def _away_from_kinks(x, kinks, margin=0.05):
    for k in kinks:
        x = np.where(np.abs(x - k) < margin, k + 2 * margin, x)
    return x


KINKS = {
    "Relu": [0],
    "LeakyRelu": [0],
    "Elu": [0],
    "Selu": [0],
    "Celu": [0],
    "HardSigmoid": [(0 - 0.4) / 0.3, (1 - 0.4) / 0.3],
    "HardSwish": [-3, 3],
    "ThresholdedRelu": [0.3],
    "Shrink": [-0.6, 0.6],
}


@pytest.mark.parametrize("op", sorted(POINTWISE))
def test_pointwise_activation_vjp(op):
    x = _away_from_kinks(RNG.uniform(-4, 4, (3, 4)), KINKS.get(op, []))
    check_vjp(op, [x], POINTWISE[op])


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_vjp(approximate):
    check_vjp("Gelu", [RNG.uniform(-3, 3, (3, 4))], {"approximate": approximate}, opset=20)


def test_prelu_vjp_reduces_slope_gradient():
    x = _away_from_kinks(RNG.uniform(-2, 2, (2, 3, 4)), [0])
    check_vjp("PRelu", [x, RNG.uniform(0.1, 0.5, (3, 1))], {})


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis,opset", [(-1, 21), (1, 21), (0, 21), (1, 11)])
def test_softmax_vjp(op, axis, opset):
    check_vjp(op, [RNG.standard_normal((2, 3, 4))], {"axis": axis}, opset=opset)


def test_hardmax_vjp_is_zero():
    check_vjp("Hardmax", [RNG.standard_normal((3, 4))], {})


def test_prelu_before_opset_7_applies_a_1d_slope_per_channel():
    x = np.random.default_rng(3).standard_normal((2, 3, 4)).astype(np.float32)
    slope = np.array([0.1, 0.2, 0.3], np.float32)
    (y,) = lookup("PRelu").forward([x, slope], {}, OpContext(opset=6))
    want = np.where(x >= 0, x, x * slope[None, :, None])
    np.testing.assert_allclose(y, want, rtol=1e-6)
    check_vjp("PRelu", [x.astype(np.float64), slope.astype(np.float64)], {}, opset=6, wrt=[0, 1])
