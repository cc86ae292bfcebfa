"""The full-int8 gate: which rule judges each output of an int8 LiteRT model against its float
oracle.

Rules:

1. ``top1`` for class scores: a 2-D ``[N, K]`` float output whose oracle rows are probability
   vectors (all in [0, 1], each summing to 1 within 1e-3) with 2 <= K <= 256. Gate: argmax
   agreement >= ``TOP1`` (0.99) over the N samples.
2. ``top1/position`` for a sequence of class scores: a 3-D ``[N, T, K]`` float output whose
   oracle rows over the last axis are probability vectors (each in [0, 1], summing to 1 within
   1e-3), K >= 2 (an OCR recognizer's per-position characters, which CTC decoding reads by argmax
   position by position). Gate: argmax agreement >= ``TOP1`` over the N x T positions (with 40
   positions, every one). Wide K is fine here: the writer's rule 8 sends a softmax whose int8
   output cannot resolve the float one to float, and a file whose argmaxes differ fails.
2b. ``probability`` for a single probability per sample: a 2-D ``[N, 1]`` float output whose
   oracle values all lie in [0, 1] (a sigmoid's presence, handedness or "is it X" score). Its
   users threshold it, and a relative error means nothing on a probability near 0 (LiteRT's int8
   LOGISTIC output steps by 1/256, a quarter of a probability of 0.016). Gate: the decisions at
   0.5 agree on >= ``TOP1`` of the samples, and the error is within rule 3's relative bound
   (``rel`` <= ``REL``) or, where the probabilities are too near 0 for that to mean anything,
   the largest absolute error is <= ``PROB_ABS`` (0.02, five of those steps).
3. ``cosine`` for every other output (regressions, landmarks, box offsets, embeddings, logits,
   and softmaxes wider than 256 classes: LiteRT's int8 softmax output has a fixed step of 1/256,
   so a 1,000-way distribution's probabilities mostly round to zero and its argmax is not
   resolved). Gate: cosine >= ``COSINE`` (0.99) and relative L2 error ``||q - f|| / ||f||`` <=
   ``REL`` (0.15), both over the whole output.
4. A model passes when every output passes its own rule; the rule used is reported per output.
5. ``detections`` for an anchor detector's pair of outputs (boxes ``[N, A, >=4]`` whose first
   four values are the centre-size box ``cx, cy, w, h`` relative to anchor ``a``, scores ``[N, A,
   1]`` as logits), where the caller names the pair and the model's score threshold
   (:func:`detections`): the detections are the anchors scoring above the threshold; a float
   detection is matched when the int8 file detects at the same anchor with a box of IoU >=
   ``IOU`` (0.5) to the float one (both boxes share the anchor's offset, so the IoU of the offsets
   is the IoU of the decoded boxes). Gate: ``matched / max(float detections, int8 detections)``
   >= ``TOP1``, with at least one float detection (no detection in the float output: the rule
   cannot judge, and the caller keeps rules 1-3). This is the measure users of a detector judge
   it by: which objects it finds, where; the raw logits of background anchors (most of a
   cosine over the whole output) are not. Given the anchors' centres, each side's detections are
   decoded and reduced by non-maximum suppression (IoU 0.3) first and objects are matched
   (``detections/nms``): many anchors fire for one object, and one near the threshold flipping
   does not change what the user gets.
6. ``regions`` for a segmentation-style text detector's probability map ``[N, 1, H, W]`` or
   ``[N, H, W, 1]`` (DB's, as PaddleOCR/RapidOCR decode it), where the caller names the output
   and the model's binarization threshold (:func:`regions`): the text regions are the connected
   components (8-connected) of ``map > threshold`` whose bounding box is at least ``MIN_SIDE``
   (3) pixels on its shorter side (DB's ``min_size``); a float region is matched by an int8 one
   whose box has IoU >= ``IOU``. Gate: ``matched / max(float regions, int8 regions)`` >=
   ``TOP1``, with at least one float region (none: the caller keeps rules 1-3).
7. :func:`score` orders two files' records (the writer's choice among calibrations): more outputs
   kept first, then the smaller worst shortfall, an output's shortfall being ``1 - top1`` (rule 1)
   or the larger of ``(1 - cosine) / (1 - COSINE)`` and ``rel / REL`` (rule 2, in units of its bounds);
   under rule 2b the larger of ``(1 - top1) / (1 - TOP1)`` and the smaller of ``rel / REL`` and
   ``abs / PROB_ABS``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

TOP1 = 0.99
COSINE = 0.99
REL = 0.15
MAX_CLASSES = 256
PROB_ABS = 0.02  # rule 2b: a probability's largest absolute error
IOU = 0.5
MIN_SIDE = 3  # DB's min_size: a text box's shorter side, in map pixels
NMS_IOU = 0.3  # MediaPipe's detectors' min_suppression_threshold


def rule_of(oracle: np.ndarray) -> str:
    """Rule 1, 2 or 3 for one output, from the float oracle's values."""
    a = np.asarray(oracle, np.float64)
    probs = a.size and a.min() >= 0 and a.max() <= 1 and np.allclose(a.sum(-1), 1.0, atol=1e-3)
    if a.ndim == 2 and 2 <= a.shape[1] <= MAX_CLASSES and probs:
        return "top1"
    if a.ndim == 3 and a.shape[2] >= 2 and probs:
        return "top1/position"
    if a.ndim == 2 and a.shape[1] == 1 and a.size and a.min() >= 0 and a.max() <= 1:
        return "probability"
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
        if rule in ("top1", "top1/position"):
            top1 = float((q64.argmax(-1) == f64.argmax(-1)).mean())
            rec.update(top1=top1, ok=top1 >= TOP1)
        elif rule == "probability":
            top1 = float(((q64 > 0.5) == (f64 > 0.5)).mean())
            err = float(np.abs(q64 - f64).max()) if np.isfinite(q64).all() else float("nan")
            rec.update(top1=top1, abs=err, ok=top1 >= TOP1 and (rel <= REL or err <= PROB_ABS))
        else:
            rec["ok"] = cos >= COSINE and rel <= REL
        out.append(rec)
    return out


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of centre-size boxes ``[..., 4]`` (cx, cy, w, h), elementwise over the leading axes."""
    ax0, ax1 = a[..., 0] - np.abs(a[..., 2]) / 2, a[..., 0] + np.abs(a[..., 2]) / 2
    ay0, ay1 = a[..., 1] - np.abs(a[..., 3]) / 2, a[..., 1] + np.abs(a[..., 3]) / 2
    bx0, bx1 = b[..., 0] - np.abs(b[..., 2]) / 2, b[..., 0] + np.abs(b[..., 2]) / 2
    by0, by1 = b[..., 1] - np.abs(b[..., 3]) / 2, b[..., 1] + np.abs(b[..., 3]) / 2
    iw = np.clip(np.minimum(ax1, bx1) - np.maximum(ax0, bx0), 0, None)
    ih = np.clip(np.minimum(ay1, by1) - np.maximum(ay0, by0), 0, None)
    inter = iw * ih
    union = (ax1 - ax0) * (ay1 - ay0) + (bx1 - bx0) * (by1 - by0) - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def ssd_anchor_centres(size: int, strides: list[int], per_layer: int = 2) -> np.ndarray:
    """Anchor centres ``[A, 2]`` (x, y in input pixels) of an SSD anchor grid as MediaPipe's
    ``SsdAnchorsCalculator`` lays it out (``fixed_anchor_size``, aspect ratio 1): consecutive
    layers of one stride share its cells, each layer giving ``per_layer`` anchors per cell (2
    with the interpolated scale, 1 without), cells row by row with their centres at
    ``(x + 0.5) * stride``."""
    centres: list[tuple[float, float]] = []
    i = 0
    while i < len(strides):
        stride, n = strides[i], 0
        while i < len(strides) and strides[i] == stride:
            n, i = n + 1, i + 1
        cells = -(-size // stride)
        for y in range(cells):
            for x in range(cells):
                centres += [((x + 0.5) * stride, (y + 0.5) * stride)] * (n * per_layer)
    return np.asarray(centres, np.float64)


def _nms(boxes: np.ndarray, scores: np.ndarray, overlap: float) -> np.ndarray:
    """Greedy non-maximum suppression: indices of the kept boxes, best score first."""
    order = list(np.argsort(-scores, kind="stable"))
    kept: list[int] = []
    while order:
        k = order.pop(0)
        kept.append(k)
        order = [j for j in order if _iou(boxes[k], boxes[j]) < overlap]
    return np.asarray(kept, np.int64)


def detections(
    boxes: np.ndarray,
    scores: np.ndarray,
    float_boxes: np.ndarray,
    float_scores: np.ndarray,
    threshold: float = 0.0,
    centres: np.ndarray | None = None,
) -> dict[str, Any]:
    """Rule 5: one record for an anchor detector's boxes and score logits (int8, then float);
    ``threshold`` is the model's score threshold as a logit (0.0: a sigmoid score of 0.5).
    With the anchors' ``centres`` (:func:`ssd_anchor_centres`) the boxes are decoded and each
    output's detections go through non-maximum suppression (IoU ``NMS_IOU``) first, as the
    model's users run it: objects are matched, not anchors. Without, anchors are matched."""
    fb = np.asarray(float_boxes, np.float64)
    fs = np.asarray(float_scores, np.float64).reshape(fb.shape[:-1])
    qb = np.asarray(boxes, np.float64).reshape(fb.shape)
    qs = np.asarray(scores, np.float64).reshape(fs.shape)
    if centres is None:
        fdet, qdet = fs > threshold, qs > threshold
        ious = _iou(fb[..., :4], qb[..., :4])
        matched = int((fdet & qdet & (ious >= IOU)).sum())
        nf, nq = int(fdet.sum()), int(qdet.sum())
    else:
        matched = nf = nq = 0
        for n in range(fb.shape[0]):  # per sample: NMS on each side, then greedy IoU matching
            sides = []
            for b, sc in ((fb[n], fs[n]), (qb[n], qs[n])):
                box = b[:, :4].copy()
                box[:, :2] += centres
                keep = np.nonzero(sc > threshold)[0]
                sides.append(box[keep][_nms(box[keep], sc[keep], NMS_IOU)] if keep.size else box[:0])
            f_obj, q_obj = sides
            nf, nq = nf + len(f_obj), nq + len(q_obj)
            matched += _matched(f_obj, q_obj)
    agreement = matched / max(nf, nq) if max(nf, nq) else 1.0
    return {
        "rule": "detections" if centres is None else "detections/nms",
        "float": nf,
        "int8": nq,
        "matched": matched,
        "agreement": agreement,
        "ok": nf > 0 and agreement >= TOP1,
    }


def _matched(float_boxes: np.ndarray, int8_boxes: np.ndarray) -> int:
    """Float objects matched one to one, greedily, by an int8 object at IoU >= :data:`IOU`."""
    matched, free = 0, list(range(len(int8_boxes)))
    for box in float_boxes:
        best = max(free, key=lambda j: float(_iou(box, int8_boxes[j])), default=None)
        if best is not None and _iou(box, int8_boxes[best]) >= IOU:
            matched += 1
            free.remove(best)
    return matched


def _region_boxes(mask: np.ndarray) -> np.ndarray:
    """Boxes (cx, cy, w, h) of the 8-connected components of a 2-D mask, shorter side >= MIN_SIDE."""
    from scipy import ndimage

    labels, _ = ndimage.label(mask, structure=np.ones((3, 3)))
    boxes = []
    for sl in ndimage.find_objects(labels):
        if sl is None:
            continue
        h, w = sl[0].stop - sl[0].start, sl[1].stop - sl[1].start
        if min(h, w) >= MIN_SIDE:
            boxes.append(((sl[1].start + sl[1].stop) / 2, (sl[0].start + sl[0].stop) / 2, w, h))
    return np.asarray(boxes, np.float64).reshape(-1, 4)


def regions(got: np.ndarray, oracle: np.ndarray, threshold: float) -> dict[str, Any]:
    """Rule 6: one record for a text detector's probability map (int8, then float)."""
    f = np.asarray(oracle, np.float64)
    q = np.asarray(got, np.float64).reshape(f.shape)
    f = f.reshape(f.shape[0], *[d for d in f.shape[1:] if d != 1][:2]) if f.ndim == 4 else f
    q = q.reshape(f.shape)
    matched = nf = nq = 0
    for n in range(f.shape[0]):
        fb, qb = _region_boxes(f[n] > threshold), _region_boxes(q[n] > threshold)
        nf, nq = nf + len(fb), nq + len(qb)
        matched += _matched(fb, qb)
    agreement = matched / max(nf, nq) if max(nf, nq) else 1.0
    return {
        "rule": "regions",
        "float": nf,
        "int8": nq,
        "matched": matched,
        "agreement": agreement,
        "ok": nf > 0 and agreement >= TOP1,
    }


def score(records: list[dict[str, Any]]) -> tuple[int, float]:
    """Rule 7: larger is better; a NaN figure (a NaN in either output) is the worst shortfall."""
    shortfalls = [0.0]
    for r in records:
        if r["rule"] in ("top1", "top1/position"):
            shortfalls.append((1.0 - r["top1"]) / (1.0 - TOP1))
        elif r["rule"] == "probability":
            shortfalls += [(1.0 - r["top1"]) / (1.0 - TOP1), min(r["rel"] / REL, r["abs"] / PROB_ABS)]
        elif r["rule"].startswith("detections") or r["rule"] == "regions":
            shortfalls.append((1.0 - r["agreement"]) / (1.0 - TOP1))
        else:
            shortfalls += [(1.0 - r["cosine"]) / (1.0 - COSINE), r["rel"] / REL]
    worst = max(np.inf if np.isnan(x) else x for x in shortfalls)
    return sum(bool(r["ok"]) for r in records), -worst


def summary(records: list[dict[str, Any]]) -> str:
    """``top1 1.000; cosine 0.9991 rel 0.041`` style, one item per output."""
    parts = []
    for r in records:
        if r["rule"] in ("top1", "top1/position"):
            parts.append(f"{r['rule']} {r['top1']:.3f}")
        elif r["rule"] == "probability":
            parts.append(f"probability {r['top1']:.3f} rel {r['rel']:.3f} abs {r['abs']:.4f}")
        elif r["rule"].startswith("detections") or r["rule"] == "regions":
            parts.append(
                f"{r['rule']} {r['matched']} of {max(r['float'], r['int8'])} matched "
                f"(float {r['float']}, int8 {r['int8']}; IoU >= {IOU})"
            )
        else:
            parts.append(f"cosine {r['cosine']:.5f} rel {r['rel']:.3f}")
    return "; ".join(parts)
