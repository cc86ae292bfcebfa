"""``mconv.sorting``: float16 sorts and uniques that are exact where numpy's float16 quicksort
misorders (AVX512_ICL without AVX512_SPR: this file's 19,200 values from 16 distinct ones sort
out of order there, and a plain ``np.unique`` finds 20). The expected results are built from the table
the values were drawn from, by counting, never by a sort."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from mconv import sorting

sys.path.insert(0, str(Path(__file__).resolve().parent / "targets" / "reference"))
from onenode import ours  # noqa: E402

TABLE = np.linspace(-0.06, 0.06, 16).astype(np.float16)  # ascending, 16 distinct float16 values


def drawn(seed: int = 16, n: int = 19_200) -> tuple[np.ndarray, np.ndarray]:
    code = np.random.default_rng(seed).integers(0, TABLE.size, n)
    return TABLE[code], code


def test_sort_is_ascending_and_holds_each_value_as_often_as_drawn():
    v, code = drawn()
    s = sorting.sort(v)
    assert s.dtype == np.float16
    want = np.repeat(TABLE, np.bincount(code, minlength=TABLE.size))
    assert s.tobytes() == want.tobytes()


def test_unique_returns_the_table_with_first_indices_inverse_and_counts():
    v, code = drawn()
    vals, first, inverse, counts = sorting.unique(
        v, return_index=True, return_inverse=True, return_counts=True
    )
    assert vals.dtype == np.float16 and vals.tobytes() == TABLE.tobytes()
    assert first.tolist() == [int(np.flatnonzero(code == k)[0]) for k in range(TABLE.size)]
    assert inverse.tolist() == code.tolist()
    assert counts.tolist() == np.bincount(code, minlength=TABLE.size).tolist()
    assert sorting.unique(v).tobytes() == TABLE.tobytes()


def test_other_dtypes_are_numpys_own():
    x = np.array([3, 1, 2, 1], np.int64)
    assert sorting.sort(x).tolist() == [1, 1, 2, 3]
    assert sorting.unique(x).tolist() == [1, 2, 3]


@pytest.mark.parametrize("sorted_", [1, 0])
def test_the_reference_executors_unique_on_float16(sorted_):
    v, code = drawn()
    vals, first, inverse, counts = ours("Unique", [v], {"sorted": sorted_})
    firsts = [int(np.flatnonzero(code == k)[0]) for k in range(TABLE.size)]
    order = list(range(TABLE.size)) if sorted_ else sorted(range(TABLE.size), key=firsts.__getitem__)
    rank = {k: i for i, k in enumerate(order)}
    assert vals.dtype == np.float16 and vals.tolist() == [float(TABLE[k]) for k in order]
    assert first.tolist() == [firsts[k] for k in order]
    assert inverse.tolist() == [rank[int(k)] for k in code]
    assert counts.tolist() == [int(np.sum(code == k)) for k in order]


def test_the_reference_executors_unique_on_float16_rows():
    rows = np.stack([TABLE[::-1], TABLE, TABLE[::-1]]).astype(np.float16)
    vals, first, inverse, counts = ours("Unique", [rows], {"sorted": 1, "axis": 0})
    assert vals.tolist() == [TABLE.tolist(), TABLE[::-1].tolist()]  # rows compare by their first value
    assert first.tolist() == [1, 0] and inverse.tolist() == [1, 0, 1] and counts.tolist() == [1, 2]
