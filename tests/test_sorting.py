"""``mconv.sorting``: float16 sorts that are exact where numpy's float16 quicksort
misorders (AVX512_ICL without AVX512_SPR: this file's 19,200 values from 16 distinct ones sort
out of order there, and a plain ``np.unique`` finds 20). The expected results are built from the table
the values were drawn from, by counting, never by a sort."""

from __future__ import annotations

import numpy as np
from mconv import sorting

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


def test_other_dtypes_are_numpys_own():
    x = np.array([3, 1, 2, 1], np.int64)
    assert sorting.sort(x).tolist() == [1, 1, 2, 3]
