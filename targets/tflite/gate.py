"""The full-int8 gate: which rule judges each output of an int8 LiteRT model against its float
oracle.

Rules:

1. ``top1`` for class scores: a 2-D ``[N, K]`` float output whose oracle rows are probability
   vectors (all in [0, 1], each summing to 1 within 1e-3) with 2 <= K <= 256. Gate: argmax
   agreement >= ``TOP1`` (0.99) over the N samples.
2. ``cosine`` for every other output (regressions, landmarks, box offsets, embeddings, logits,
   and softmaxes wider than 256 classes: LiteRT's int8 softmax output has a fixed step of 1/256,
   so a 1,000-way distribution's probabilities mostly round to zero and its argmax is not
   resolved). Gate: cosine >= ``COSINE`` (0.99) and relative L2 error ``||q - f|| / ||f||`` <=
   ``REL`` (0.15), both over the whole output.
3. A model passes when every output passes its own rule; the rule used is reported per output.
4. :func:`score` orders two files' records (the writer's choice among calibrations): more outputs
   kept first, then the smaller worst shortfall, an output's shortfall being ``1 - top1`` (rule 1)
   or the larger of ``(1 - cosine) / (1 - COSINE)`` and ``rel / REL`` (rule 2, in units of its bounds).
"""

from __future__ import annotations

from typing import Any

import numpy as np

TOP1 = 0.99
COSINE = 0.99
REL = 0.15
MAX_CLASSES = 256


def rule_of(oracle: np.ndarray) -> str:
    """Rule 1 or 2 for one output, from the float oracle's values."""
    a = np.asarray(oracle, np.float64)
    if a.ndim == 2 and 2 <= a.shape[1] <= MAX_CLASSES and a.size:
        if a.min() >= 0 and a.max() <= 1 and np.allclose(a.sum(1), 1.0, atol=1e-3):
            return "top1"
    return "cosine"


def judge(got: list[np.ndarray], oracle: list[np.ndarray]) -> list[dict[str, Any]]:
    """One record per output: rule, figures, ``ok`` (rules 1-3)."""
    out = []
    for q, f in zip(got, oracle):
        f64 = np.asarray(f, np.float64)
        q64 = np.asarray(q, np.float64).reshape(f64.shape)
        rule = rule_of(f64)
        a, b = q64.ravel(), f64.ravel()
        den = float(np.linalg.norm(a) * np.linalg.norm(b))
        cos = float(a @ b / den) if den else (1.0 if not a.any() and not b.any() else 0.0)
        nb = float(np.linalg.norm(b))
        rel = float(np.linalg.norm(a - b) / nb) if nb else float(np.linalg.norm(a))
        rec: dict[str, Any] = {"rule": rule, "cosine": cos, "rel": rel}
        if rule == "top1":
            top1 = float((q64.argmax(1) == f64.argmax(1)).mean())
            rec.update(top1=top1, ok=top1 >= TOP1)
        else:
            rec["ok"] = cos >= COSINE and rel <= REL
        out.append(rec)
    return out


def score(records: list[dict[str, Any]]) -> tuple[int, float]:
    """Rule 4: larger is better."""
    worst = 0.0
    for r in records:
        if r["rule"] == "top1":
            worst = max(worst, (1.0 - r["top1"]) / (1.0 - TOP1))
        else:
            worst = max(worst, (1.0 - r["cosine"]) / (1.0 - COSINE), r["rel"] / REL)
    return sum(bool(r["ok"]) for r in records), -worst


def summary(records: list[dict[str, Any]]) -> str:
    """``top1 1.000; cosine 0.9991 rel 0.041`` style, one item per output."""
    parts = []
    for r in records:
        if r["rule"] == "top1":
            parts.append(f"top1 {r['top1']:.3f}")
        else:
            parts.append(f"cosine {r['cosine']:.5f} rel {r['rel']:.3f}")
    return "; ".join(parts)
