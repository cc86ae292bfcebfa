"""Integer quantization arithmetic shared by the static quantize pass and the tflite writer.

``symmetric`` (int8 codes in [-127, 127], zero point 0, per tensor or per channel), ``affine``
(an int8 range widened to hold 0: ``scale = (max - min) / 255``, ``zero_point = round(-128 -
min / scale)``) ``entropy_range`` (TensorRT's KL calibration: the clip of |x| minimizing the KL divergence
between the 128-level quantized histogram and the float one) and ``mse_range`` (the clip whose
int8 round trip, clipping included, has the least mean squared error on the tensor's values).
"""

from __future__ import annotations

import numpy as np

SAMPLE_VALUES = 4096  # values kept per tensor per sample for percentile/entropy


def symmetric(w: np.ndarray, axis: int | None) -> tuple[np.ndarray, np.ndarray]:
    """int8 codes in [-127, 127] and scales (per tensor, or one per index of ``axis``)."""
    w = w.astype(np.float64)
    if axis is None:
        m = np.array([np.abs(w).max()])
        view = m.reshape(())
    else:
        red = tuple(i for i in range(w.ndim) if i != axis)
        m = np.abs(w).max(axis=red)
        view = m.reshape([-1 if i == axis else 1 for i in range(w.ndim)])
    scale = np.where(m > 0, m / 127.0, 1.0)
    sv = np.where(view > 0, view / 127.0, 1.0)
    q = np.clip(np.round(w / sv), -127, 127).astype(np.int8)
    return q, scale.astype(np.float32)


def affine(lo: float, hi: float) -> tuple[float, int]:
    """Rule 3: int8 scale and zero point of the range [lo, hi] widened to hold 0."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if hi - lo <= 0:
        return 1.0, 0
    scale = (hi - lo) / 255.0
    zp = int(np.clip(np.round(-128 - lo / scale), -128, 127))
    return scale, zp


# ---- fp16 and dynamic range ------------------------------------------------------------------


def entropy_range(
    values: np.ndarray, lo: float, hi: float, bins: int = 2048, levels: int = 128
) -> tuple[float, float]:
    """Rule 3 ``entropy``: TensorRT's KL calibration on |x| (both sides clipped at the best bound)."""
    amax = float(np.abs(values).max())
    if amax == 0:
        return lo, hi
    hist, edges = np.histogram(np.abs(values), bins=bins, range=(0, amax))
    hist = hist.astype(np.float64)
    best, best_kl = bins, np.inf
    for i in range(levels, bins + 1, 16):
        p = hist[:i].copy()
        p[i - 1] += hist[i:].sum()
        chunks = np.array_split(hist[:i], levels)
        q = np.concatenate([np.where(c > 0, c.sum() / max((c > 0).sum(), 1), 0.0) for c in chunks])
        p /= p.sum()
        qs = q.sum()
        if qs == 0:
            continue
        q /= qs
        mask = p > 0
        kl = float(np.sum(p[mask] * np.log(p[mask] / np.maximum(q[mask], 1e-12))))
        if kl < best_kl:
            best, best_kl = i, kl
    bound = float(edges[best])
    return max(lo, -bound), min(hi, bound)


MSE_VALUES = 16384  # values the mse search measures each candidate range on
MSE_FACTORS = tuple(float(f) for f in np.geomspace(1.0, 1 / 64, 31))


def mse_range(
    values: np.ndarray, lo: float, hi: float, rng: np.random.Generator | None = None
) -> tuple[float, float]:
    """Rule 3 ``mse``: among the ranges ``[lo * a, hi * b]`` (``a``, ``b`` from
    :data:`MSE_FACTORS`, 1 down to 1/64: the extremes shrunk toward 0, each side on its own), the
    one whose :func:`affine` int8 round trip (codes clipped to [-128, 127]) has the least mean
    squared error on ``values`` (at most :data:`MSE_VALUES` of them, a seeded sample). The
    extremes themselves are a candidate, so the result is never worse than min-max on them."""
    v = np.asarray(values, np.float64).ravel()
    if v.size > MSE_VALUES:
        v = (rng or np.random.default_rng(0)).choice(v, MSE_VALUES, replace=False)
    if v.size == 0 or hi - lo <= 0:
        return lo, hi

    def err(a: float, b: float) -> float:
        scale, zp = affine(lo * a, hi * b)
        q = np.clip(np.round(v / scale) + zp, -128, 127)
        return float(np.mean(((q - zp) * scale - v) ** 2))

    # coordinate search: both sides together, then each side with the other fixed
    best_f = min(MSE_FACTORS, key=lambda f: err(f, f))
    a = min(MSE_FACTORS, key=lambda f: err(f, best_f))
    b = min(MSE_FACTORS, key=lambda f: err(a, f))
    return lo * a, hi * b


# ---- full integer -----------------------------------------------------------------------------
