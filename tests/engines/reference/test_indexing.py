"""Gather/scatter/selection ops: forward against onnxruntime, VJPs by finite differences."""

from __future__ import annotations

import numpy as np
import pytest
from gradcheck import check_vjp
from mconv.errors import InputError
from onenode import assert_same, oracle, ours

RNG = np.random.default_rng(0)


def f32(*shape, lo=-2.0, hi=2.0):
    return RNG.uniform(lo, hi, shape).astype(np.float32)


def i64(*v):
    return np.array(v, np.int64)


# --------------------------------------------------------------------------- forward


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_with_negative_and_repeated_indices(axis):
    assert_same("Gather", [f32(3, 4, 2), np.array([[0, -1], [1, 1]], np.int64)], {"axis": axis})
    assert_same("Gather", [f32(3, 4), np.array(2, np.int32)], {"axis": axis})


def test_gather_out_of_range_is_input_error():
    with pytest.raises(InputError, match="Gather"):
        ours("Gather", [f32(3), i64(3)], {})


@pytest.mark.parametrize("axis", [0, 1])
def test_gather_elements(axis):
    idx = RNG.integers(-3, 3, (3, 3)).astype(np.int64)
    assert_same("GatherElements", [f32(3, 3), idx], {"axis": axis})


@pytest.mark.parametrize(
    "shape,idx,b",
    [
        ((2, 2), [[0, 0], [1, 1]], 0),
        ((2, 2), [[1], [0]], 0),
        ((2, 2, 2), [[0, 1], [1, 0]], 0),
        ((2, 2, 2), [[1], [0]], 1),
        ((2, 3, 4), [[[1, 2]], [[0, 3]]], 1),
    ],
)
def test_gather_nd_batch_dims(shape, idx, b):
    assert_same("GatherND", [f32(*shape), np.array(idx, np.int64)], {"batch_dims": b})


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements_reductions(reduction):
    data = f32(3, 4)
    idx = np.array([[1, 0, 2, 0], [2, 1, 0, 1]], np.int64)
    if reduction == "none":
        idx = np.array([[1, 0, 2, 0], [2, 1, 0, 1]], np.int64)  # unique per column
    assert_same("ScatterElements", [data, idx, f32(2, 4)], {"axis": 0, "reduction": reduction}, opset=18)
    assert_same("ScatterElements", [data, i64(-1, 0).reshape(1, 2), f32(1, 2)], {"axis": 1}, opset=18)


def test_old_scatter_is_scatter_elements():
    assert_same("Scatter", [f32(3, 3), i64(1, 0, 2).reshape(1, 3), f32(1, 3)], {"axis": 0}, opset=10)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd_reductions(reduction):
    data = f32(4, 3)
    idx = np.array([[1], [3]], np.int64) if reduction == "none" else np.array([[1], [3], [1]], np.int64)
    assert_same("ScatterND", [data, idx, f32(len(idx), 3)], {"reduction": reduction}, opset=18)
    assert_same("ScatterND", [data, np.array([[0, 1], [2, 2]], np.int64), f32(2)], {}, opset=18)


def test_where_broadcasts_and_keeps_dtype():
    c = RNG.random((2, 1, 4)) > 0.5
    assert_same("Where", [c, f32(3, 4), f32(2, 3, 1)])
    assert_same("Where", [c, np.array(1, np.int64), i64(5, 6, 7, 8)])


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot_with_negative_and_out_of_range_indices(axis):
    idx = np.array([[0, -1, 2], [5, 1, -4]], np.int64)
    assert_same("OneHot", [idx, np.array(4, np.int64), np.array([0.5, 2.0], np.float32)], {"axis": axis})


def test_nonzero_compress_unique():
    x = (RNG.random((3, 4)) > 0.5).astype(np.float32)
    assert_same("NonZero", [x])
    assert_same("Compress", [f32(3, 4), np.array([True, False, True])], {"axis": 0})
    assert_same("Compress", [f32(3, 4), np.array([False, True, True, False, True])])
    assert_same("Compress", [f32(3, 4), np.array([True, False])], {"axis": 1})
    v = np.array([2, 1, 1, 3, 4, 3], np.float32)
    for sorted_ in (0, 1):
        want = oracle("Unique", [v], {"sorted": sorted_}, n_out=4)
        got = ours("Unique", [v], {"sorted": sorted_})
        for w, g in zip(want, got):
            np.testing.assert_array_equal(g, w)
            assert g.dtype == w.dtype
    m = np.array([[1, 0, 0], [1, 0, 0], [2, 3, 4]], np.float32)
    want = oracle("Unique", [m], {"sorted": 1, "axis": 0}, n_out=4)
    for w, g in zip(want, ours("Unique", [m], {"sorted": 1, "axis": 0})):
        np.testing.assert_array_equal(g, w)


# numpy's float16 quicksort misorders on AVX512_ICL CPUs without AVX512_SPR (mconv.sorting); the
# executor's Unique sorts stably (np.unique with return_index), and these hold it to results
# counted from the 16-value table the 19,200 values were drawn from, never from a sort.
F16_TABLE = np.linspace(-0.06, 0.06, 16).astype(np.float16)


def f16_drawn(seed: int = 16, n: int = 19_200) -> tuple[np.ndarray, np.ndarray]:
    code = np.random.default_rng(seed).integers(0, F16_TABLE.size, n)
    return F16_TABLE[code], code


@pytest.mark.parametrize("sorted_", [1, 0])
def test_the_reference_executors_unique_on_float16(sorted_):
    v, code = f16_drawn()
    vals, first, inverse, counts = ours("Unique", [v], {"sorted": sorted_})
    firsts = [int(np.flatnonzero(code == k)[0]) for k in range(F16_TABLE.size)]
    order = list(range(F16_TABLE.size)) if sorted_ else sorted(range(F16_TABLE.size), key=firsts.__getitem__)
    rank = {k: i for i, k in enumerate(order)}
    assert vals.dtype == np.float16 and vals.tolist() == [float(F16_TABLE[k]) for k in order]
    assert first.tolist() == [firsts[k] for k in order]
    assert inverse.tolist() == [rank[int(k)] for k in code]
    assert counts.tolist() == [int(np.sum(code == k)) for k in order]


def test_the_reference_executors_unique_on_float16_rows():
    rows = np.stack([F16_TABLE[::-1], F16_TABLE, F16_TABLE[::-1]]).astype(np.float16)
    vals, first, inverse, counts = ours("Unique", [rows], {"sorted": 1, "axis": 0})
    assert vals.tolist() == [
        F16_TABLE.tolist(),
        F16_TABLE[::-1].tolist(),
    ]  # rows compare by their first value
    assert first.tolist() == [1, 0] and inverse.tolist() == [1, 0, 1] and counts.tolist() == [1, 2]


# --------------------------------------------------------------------------- VJPs


def g64(*shape):
    return RNG.standard_normal(shape)


@pytest.mark.parametrize("axis", [0, 1])
def test_gather_vjp_accumulates_repeated_indices(axis):
    check_vjp("Gather", [g64(3, 4), np.array([[0, 2], [2, -1]], np.int64)], {"axis": axis}, wrt=[0])


def test_gather_elements_and_nd_vjps():
    check_vjp("GatherElements", [g64(3, 3), np.array([[0, 0, 2], [1, 1, 1]], np.int64)], {"axis": 0}, wrt=[0])
    check_vjp(
        "GatherND",
        [
            g64(2, 3, 4),
            np.array(
                [
                    [[1, 2]],
                    [[0, 3]],
                ],
                np.int64,
            ),
        ],
        {"batch_dims": 1},
        wrt=[0],
    )
    check_vjp("GatherND", [g64(3, 2), np.array([[1], [1], [0]], np.int64)], {}, wrt=[0])


@pytest.mark.parametrize("reduction", ["none", "add"])
def test_scatter_vjps(reduction):
    idx = np.array([[1, 0, 2, 0], [2, 1, 0, 1]], np.int64)
    check_vjp("ScatterElements", [g64(3, 4), idx, g64(2, 4)], {"axis": 0, "reduction": reduction}, wrt=[0, 2])
    check_vjp(
        "ScatterND",
        [g64(4, 3), np.array([[1], [3]], np.int64), g64(2, 3)],
        {"reduction": reduction},
        wrt=[0, 2],
    )


def test_scatter_vjp_refuses_mul_with_a_clear_error():
    with pytest.raises(InputError, match="reduction='mul'"):
        check_vjp("ScatterND", [g64(4, 3), np.array([[1]], np.int64), g64(1, 3)], {"reduction": "mul"})


def test_where_compress_vjps():
    c = RNG.random((2, 1, 4)) > 0.5
    check_vjp("Where", [c, g64(3, 4), g64(2, 3, 1)], {})
    check_vjp("Compress", [g64(3, 4), np.array([True, False, True])], {"axis": 0}, wrt=[0])
    check_vjp("Compress", [g64(3, 4), np.array([False, True, True, False, True])], {}, wrt=[0])
