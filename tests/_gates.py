"""The tests' numeric gate: cosine AND the error relative to the output's scale.

Cosine alone lets a uniform scale error through (every output 6% low keeps it at 1.0), so a
float output is also held to ``max|got - ref| / max|ref|`` (the worst element against the
output's scale: a wrong border or channel shows here) and ``||got - ref|| / ||ref||`` (the
relative L2 error, what ``mconv verify`` gates as ``rel_l2``). Bounds follow the storage
precision of the kernels under test: float32 storage computes as the reference does up to
rounding order (lavapipe: errors under 1e-6 of the scale; the bound 1e-4); float16 storage
rounds every stored value to 11 bits (under 1.3e-3 of the scale; the bound 1e-2).

``from _gates import assert_close`` (``tests/`` is on ``sys.path`` for the target tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Tolerance:
    min_cos: float
    rel_max: float  # max |got - ref| / max |ref|
    rel_l2: float  # ||got - ref|| / ||ref||


TOLERANCES = {
    "fp32": Tolerance(min_cos=0.9999, rel_max=1e-4, rel_l2=1e-4),
    "fp16": Tolerance(min_cos=0.999, rel_max=1e-2, rel_l2=1e-2),
}


@dataclass(frozen=True)
class Figures:
    cosine: float
    rel_max: float
    rel_l2: float
    max_abs: float
    scale: float  # max |ref|

    def __str__(self) -> str:
        return (
            f"cosine {self.cosine:.7f}, max error {self.max_abs:.3g} = {self.rel_max:.3g} of the "
            f"scale {self.scale:.3g}, relative L2 error {self.rel_l2:.3g}"
        )


def figures(ref, got) -> Figures:
    """Cosine and the errors relative to ``ref``'s scale (float64; NaN or inf: the worst)."""
    r = np.asarray(ref, np.float64).ravel()
    g = np.asarray(got, np.float64).ravel()
    assert r.shape == g.shape, (r.shape, g.shape)
    if r.size == 0:
        return Figures(1.0, 0.0, 0.0, 0.0, 0.0)
    with np.errstate(all="ignore"):
        same = (r == g) | (np.isnan(r) & np.isnan(g))
        diff = np.where(same, 0.0, np.abs(r - g))
        diff[np.isnan(diff)] = np.inf
        max_abs = float(diff.max())
        finite = r[np.isfinite(r)]
        scale = float(np.abs(finite).max()) if finite.size else 0.0
        nr, ng = float(np.linalg.norm(finite)), float(np.linalg.norm(g))
        noise = float(np.linalg.norm(diff))
        if nr == 0 and ng == 0:
            cos = 1.0
        elif nr == 0 or ng == 0 or not math.isfinite(ng):
            cos = 0.0
        else:
            cos = float(np.dot(r, g) / (nr * ng))
    if not math.isfinite(cos):
        cos = 1.0 if bool(same.all()) else 0.0

    def rel(err: float, of: float) -> float:
        if err == 0:
            return 0.0
        return err / of if of > 0 and math.isfinite(err) else math.inf

    return Figures(cos, rel(max_abs, scale), rel(noise, nr), max_abs, scale)


def assert_close(
    ref,
    got,
    precision: str = "fp32",
    *,
    min_cos: float | None = None,
    rel_max: float | None = None,
    rel_l2: float | None = None,
    what: str = "",
) -> Figures:
    """``got`` agrees with ``ref``: same shape, cosine, max error relative to the scale and the
    relative L2 error within the ``precision``'s :data:`TOLERANCES` (each overridable, e.g. a
    looser cosine for a deep fp16 stack). Returns the figures."""
    tol = TOLERANCES[precision]
    ref_a, got_a = np.asarray(ref), np.asarray(got)
    assert ref_a.shape == got_a.shape, (what, ref_a.shape, got_a.shape)
    f = figures(ref_a, got_a)
    want_cos = tol.min_cos if min_cos is None else min_cos
    want_max = tol.rel_max if rel_max is None else rel_max
    want_l2 = tol.rel_l2 if rel_l2 is None else rel_l2
    assert f.cosine >= want_cos and f.rel_max <= want_max and f.rel_l2 <= want_l2, (
        f"{what + ': ' if what else ''}{f} (gate {precision}: cosine >= {want_cos}, "
        f"max error <= {want_max:g} of the scale, relative L2 <= {want_l2:g})"
    )
    return f
