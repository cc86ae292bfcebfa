"""Reductions, ArgMax/ArgMin, CumSum, TopK: forward against onnxruntime, VJPs by finite differences."""

from __future__ import annotations

import numpy as np
import pytest
from gradcheck import check_vjp
from onenode import assert_same, oracle, ours

RNG = np.random.default_rng(0)


def f32(*shape, lo=-2.0, hi=2.0):
    return RNG.uniform(lo, hi, shape).astype(np.float32)


# --------------------------------------------------------------------------- forward

REDUCE = [
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceSumSquare",
    "ReduceLogSum",
    "ReduceLogSumExp",
]
AXES = [None, [1], [0, 2], [-1]]


@pytest.mark.parametrize("op", REDUCE)
@pytest.mark.parametrize("axes", AXES)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_with_axes_input_opset18(op, axes, keepdims):
    x = f32(2, 3, 4, lo=0.2, hi=1.5)
    inputs = [x] if axes is None else [x, np.array(axes, np.int64)]
    assert_same(op, inputs, {"keepdims": keepdims}, opset=18, rtol=1e-5)


@pytest.mark.parametrize("op", REDUCE)
def test_reduce_with_axes_attribute_before_the_move(op):
    x = f32(2, 3, 4, lo=0.2, hi=1.5)
    if op == "ReduceSum":
        assert_same(op, [x], {"axes": [0, 2], "keepdims": 0}, opset=11, rtol=1e-5)
    else:
        assert_same(op, [x], {"axes": [0, 2], "keepdims": 0}, opset=13, rtol=1e-5)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceSumSquare", "ReduceL1", "ReduceMax"])
def test_noop_with_empty_axes_is_identity_or_pointwise(op):
    x = f32(2, 3)
    assert_same(op, [x, np.array([], np.int64)], {"noop_with_empty_axes": 1}, opset=18)
    assert_same(op, [x], {"noop_with_empty_axes": 1}, opset=18)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceProd", "ReduceMin"])
def test_reduce_keeps_integer_dtype(op):
    x = RNG.integers(-5, 6, (3, 4)).astype(np.int32)
    assert_same(op, [x, np.array([1], np.int64)], {"keepdims": 0}, opset=18)


def test_reduce_over_empty_set_gives_monoid_identity():
    x = np.zeros((2, 0, 3), np.float32)
    ax = np.array([1], np.int64)
    for op, want in [("ReduceSum", 0.0), ("ReduceProd", 1.0), ("ReduceMax", -np.inf), ("ReduceMin", np.inf)]:
        (y,) = ours(op, [x, ax], {}, opset=18)
        assert y.shape == (2, 1, 3) and y.dtype == np.float32
        np.testing.assert_array_equal(y, np.full((2, 1, 3), want, np.float32))


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("attrs", [{}, {"axis": 1, "keepdims": 0}, {"axis": -1, "select_last_index": 1}])
def test_argmax_argmin_with_ties(op, attrs):
    x = RNG.integers(0, 3, (3, 4)).astype(np.float32)  # many ties
    assert_same(op, [x], attrs)


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, -1])
def test_cumsum_variants(exclusive, reverse, axis):
    assert_same("CumSum", [f32(3, 4), np.array(axis, np.int64)], {"exclusive": exclusive, "reverse": reverse})
    x = RNG.integers(-5, 5, (3, 4)).astype(np.int64)
    assert_same("CumSum", [x, np.array(axis, np.int32)], {"exclusive": exclusive, "reverse": reverse})


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("axis", [0, -1])
def test_topk_values_and_indices_with_ties(largest, axis):
    x = RNG.integers(0, 4, (4, 5)).astype(np.float32)
    want = oracle("TopK", [x, np.array([3], np.int64)], {"axis": axis, "largest": largest}, n_out=2)
    got = ours("TopK", [x, np.array([3], np.int64)], {"axis": axis, "largest": largest})
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert got[1].dtype == np.int64 and got[0].dtype == np.float32


# --------------------------------------------------------------------------- VJPs


@pytest.mark.parametrize("op", REDUCE)
@pytest.mark.parametrize("axes,keepdims", [(None, 1), ([1], 0), ([0, 2], 1), ([-1], 0)])
def test_reduce_vjp(op, axes, keepdims):
    x = RNG.uniform(0.3, 1.5, (2, 3, 4))
    inputs = [x] if axes is None else [x, np.array(axes, np.int64)]
    check_vjp(op, inputs, {"keepdims": keepdims}, opset=18, wrt=[0])


def test_reduce_prod_vjp_with_a_zero():
    x = RNG.uniform(0.5, 1.5, (2, 3))
    x[0, 1] = 0.0
    check_vjp("ReduceProd", [x, np.array([1], np.int64)], {}, opset=18, wrt=[0])


def test_reduce_vjp_with_noop_empty_axes():
    check_vjp("ReduceSumSquare", [RNG.standard_normal((2, 3))], {"noop_with_empty_axes": 1}, opset=18)


def test_reduce_sum_vjp_opset13_attribute_free():
    check_vjp("ReduceMean", [RNG.standard_normal((2, 3))], {"axes": [1]}, opset=13)


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumsum_vjp(exclusive, reverse):
    check_vjp(
        "CumSum",
        [RNG.standard_normal((3, 4)), np.array(1, np.int64)],
        {"exclusive": exclusive, "reverse": reverse},
    )


@pytest.mark.parametrize("largest", [0, 1])
def test_topk_vjp_scatters_onto_values(largest):
    x = RNG.permutation(20).reshape(4, 5).astype(np.float64) * 0.1  # distinct: no ties
    check_vjp("TopK", [x, np.array([2], np.int64)], {"axis": 1, "largest": largest}, outputs=[0])


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, -1])
def test_cumprod_matches_a_hand_loop(exclusive, reverse, axis):
    x = RNG.uniform(-2, 2, (3, 4)).astype(np.float32)
    x[1, 1] = 0.0
    (got,) = ours("CumProd", [x, np.array(axis, np.int64)], {"exclusive": exclusive, "reverse": reverse})
    xm = np.moveaxis(x.astype(np.float64), axis, 0)
    want = np.empty_like(xm)
    n = xm.shape[0]
    for j in range(n):  # the definition, term by term
        ks = range(j, n) if reverse else range(0, j + 1)
        ks = [k for k in ks if not (exclusive and k == j)]
        want[j] = np.prod([xm[k] for k in ks], axis=0) if ks else 1.0
    np.testing.assert_allclose(got, np.moveaxis(want, 0, axis), rtol=1e-6)
    assert got.dtype == np.float32


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumprod_vjp_including_zeros(exclusive, reverse):
    x = RNG.standard_normal((4, 3))
    x[2, 1] = 0.0
    check_vjp("CumProd", [x, np.array(0, np.int64)], {"exclusive": exclusive, "reverse": reverse}, wrt=[0])
