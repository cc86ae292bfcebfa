"""Integer weights split into two digits so that each integer product stays exact in float32.

An integer product ``x @ B`` (codes held as floats) is exact while every partial sum stays within
2^24; its bound per output column is ``sum_k |B[k, n]| * span`` with ``span`` the largest
``|x - zp|`` of the codes. Writing ``B = base * B_hi + B_lo`` with ``B_lo = B mod base`` (digits
``0 .. base - 1``) and ``B_hi = (B - B_lo) / base`` divides both bounds by about ``base`` and
``|B| / base``: :func:`split_weights` picks the power-of-two ``base`` that minimises the larger
of the two, and returns ``None`` when even that one is over the limit.
"""

from __future__ import annotations

import numpy as np

__all__ = ["split_weights"]


def split_weights(b: np.ndarray, span: float, limit: float) -> tuple[np.ndarray, np.ndarray, int] | None:
    """``(b_hi, b_lo, base)`` with ``b == base * b_hi + b_lo`` exactly and both products' bounds
    (over the reduction axis, ``-2``) within ``limit``; ``None`` when no power of two does."""
    bi = np.asarray(b, np.float64)
    if not np.array_equal(bi, np.round(bi)):
        return None
    best: tuple[float, int] | None = None
    for k in range(1, 16):
        base = 2**k
        lo = np.mod(bi, base)
        hi = (bi - lo) / base
        worst = max(_bound(lo, span), _bound(hi, span))
        if best is None or worst < best[0]:
            best = (worst, base)
    if best is None or best[0] > limit:
        return None
    base = best[1]
    lo = np.mod(bi, base)
    return (bi - lo) / base, lo, base


def _bound(w: np.ndarray, span: float) -> float:
    return float((np.abs(w).sum(axis=-2) * span).max(initial=0))
