"""Sorting float16 arrays exactly on every CPU numpy runs on.

numpy 2.4's AVX-512 float16 quicksort misorders on CPUs numpy finds AVX512_ICL but not
AVX512_SPR on (no AVX512-FP16): 19,200 values drawn from 16 distinct float16 values sort out
of order there, and a plain ``np.unique``, which sorts that way, returns 20 "distinct" values.
Its stable sort, argsort and partition are not affected, nor ``np.unique(return_index=True)``,
which sorts stably (so the reference executor's ONNX ``Unique`` is exact;
tests/engines/reference/test_indexing.py holds it to that).

Rules:

1. float16 sorts as float32. The conversion is exact and keeps order and equality (-0.0 equals
   0.0, NaNs compare as NaNs), so the result is the one an exact float16 sort would give, as
   float16.
2. Every other dtype goes straight to numpy.
"""

from __future__ import annotations

import numpy as np


def sort(values: np.ndarray, axis: int | None = -1) -> np.ndarray:
    """``np.sort`` (ascending), exact for float16 (rule 1)."""
    a = np.asarray(values)
    if a.dtype == np.float16:
        return np.sort(a.astype(np.float32), axis=axis).astype(np.float16)
    return np.sort(a, axis=axis)
