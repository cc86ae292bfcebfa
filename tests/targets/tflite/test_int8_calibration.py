"""Full-int8 LiteRT files (issue 46 item 4): the ``auto`` calibration (minmax, then per-tensor
MSE, then percentile, the first the int8 gate keeps), the MSE range search, and the gate's
detection rule for anchor detectors.

LeNet-5 (Caffe) on real MNIST digits, run by LiteRT; the detection rule on boxes whose IoU is
worked out by hand in the test.
"""

from __future__ import annotations

import ai_edge_litert.interpreter  # noqa: E402, F401  (the test extra installs LiteRT: absent is a failure)
import numpy as np
import pytest


@pytest.fixture(scope="module")
def lenet(lenet_mnist):
    """The LeNet-5 and its digits in the file's order (sorted by label: strided picks mix them)."""
    return lenet_mnist[:2]


def test_auto_calibration_keeps_mse_where_minmax_fails_the_gate(lenet, tmp_path):
    """Two over-exposed frames (40x) among 100 calibration digits stretch the input's min-max
    range 40-fold: the min-max file fails the int8 gate on the calibration samples, ``auto``
    keeps the per-tensor MSE ranges (which clip the stray frames), the notes say which and what
    each method measured, and on 500 held-out digits it agrees with float to 0.97. With
    ``--calibration minmax`` named, the int8 file is not kept and the 16x8 one (int16
    activations hold the 40-fold range) is written: 0.99 on the held-out digits."""
    from mconv.targets import get_target

    model, x = lenet
    calib = x[::50].copy()  # 100 digits of every class
    calib[:2] *= 40.0
    held = x[25::10]  # 500 others
    t = get_target("tflite")
    want = t.load(t.export(model, tmp_path / "f32", {})).run({"data": held})["prob"].argmax(1)

    def agreement(name: str, **opts) -> tuple[float, str]:
        # the calibration methods alone: the weights' codes the nearest ones (GPTQ: test_gptq.py)
        b = t.export(
            model,
            tmp_path / name,
            {"precision": "int8", "data": {"data": calib}, "rounding": "nearest", **opts},
        )
        got = t.load(b).run({"data": held})["prob"].argmax(1)
        return float((got == want).mean()), " ".join(b.manifest["notes"])

    minmax, minmax_notes = agreement("minmax", calibration="minmax")
    auto, notes = agreement("auto")
    # min-max's int8 file is not kept; a named method is used alone, then 16x8 (writer rule 8)
    assert "minmax top1" in minmax_notes and "no int8 file was kept" in minmax_notes
    assert "mse" not in minmax_notes and "percentile" not in minmax_notes
    assert "activation ranges from mse calibration" in notes and "(kept;" in notes
    assert "calibrations tried" in notes and "minmax top1" in notes
    assert auto >= 0.97 and minmax >= 0.99, (auto, minmax)


def test_detection_rule_matches_anchors_by_iou():
    """Gate rule 4 on five anchors (boxes cx, cy, w, h; scores as logits, threshold 0): float
    detects anchors 0, 2, 4; int8 detects 0, 2, 3. Anchor 0: the same box (IoU 1). Anchor 2:
    10x10 boxes 5 apart in x, intersection 5 x 10 = 50, union 150, IoU 1/3 < 0.5: not matched.
    So 1 of 3 matched: not kept. With anchor 2's box 1 apart (IoU 90/110 = 0.82) and anchors 3
    and 4 agreeing, 3 of 3: kept. With no float detection the rule cannot keep anything."""
    from mconv.targets.tflite import gate

    fb = np.zeros((1, 5, 16))
    fb[0, :, 2:4] = 10.0
    qb = fb.copy()
    qb[0, 2, 0] = 5.0
    fs = np.array([2.0, -3.0, 1.0, -1.0, 0.5]).reshape(1, 5, 1)
    qs = np.array([1.5, -2.0, 0.8, 0.2, -0.1]).reshape(1, 5, 1)
    r = gate.detections(qb, qs, fb, fs)
    assert (r["float"], r["int8"], r["matched"], r["ok"]) == (3, 3, 1, False)
    assert r["agreement"] == pytest.approx(1 / 3)
    assert "detections 1 of 3 matched" in gate.summary([r])

    qb[0, 2, 0] = 1.0
    qs = np.array([1.5, -2.0, 0.8, -0.2, 0.1]).reshape(1, 5, 1)
    r = gate.detections(qb, qs, fb, fs)
    assert (r["matched"], r["agreement"], r["ok"]) == (3, 1.0, True)

    r = gate.detections(qb, qs - 10.0, fb, fs - 10.0)
    assert (r["float"], r["ok"]) == (0, False)


def test_a_sequence_of_class_probabilities_is_judged_per_position():
    """Gate rule 2 on a recognizer's [1, 4, 3] softmax output: positions 0-3 of the float oracle
    read classes 2, 0, 0, 1; an int8 output reading 2, 0, 1, 1 agrees at 3 of 4 positions (0.75,
    not kept) though its cosine over the whole output is 0.98; reading 2, 0, 0, 1 with coarser
    probabilities agrees at all 4 (kept)."""
    from mconv.targets.tflite import gate

    f = np.array([[[0.1, 0.1, 0.8], [0.7, 0.2, 0.1], [0.6, 0.3, 0.1], [0.1, 0.8, 0.1]]])
    q = np.array([[[0.1, 0.1, 0.8], [0.7, 0.2, 0.1], [0.4, 0.5, 0.1], [0.1, 0.8, 0.1]]])
    r = gate.judge([q], [f])[0]
    assert (r["rule"], r["top1"], r["ok"]) == ("top1/position", 0.75, False)
    assert r["cosine"] > 0.98
    q2 = np.array([[[0.0, 0.25, 0.75], [0.75, 0.25, 0.0], [0.5, 0.25, 0.25], [0.0, 1.0, 0.0]]])
    r = gate.judge([q2], [f])[0]
    assert (r["top1"], r["ok"]) == (1.0, True)
    assert gate.summary([r]).startswith("top1/position 1.000")


def test_detections_after_nms_match_objects_not_anchors():
    """Gate rule 5 with anchor centres: a 16x16 input, stride 8, one anchor per cell: centres
    (4, 4), (12, 4), (4, 12), (12, 12). Float detects anchors 0 and 1 with offsets that decode
    both to one 10x10 box at (8, 4) (offsets +4 and -4): NMS keeps one object. The int8 file
    detects anchor 1 only, decoding to (8.5, 4): IoU 9.5 x 10 / (200 - 95) = 0.905. Objects: 1 of 1
    matched (kept); anchors: 1 of 2 (not kept)."""
    from mconv.targets.tflite import gate

    centres = gate.ssd_anchor_centres(16, [8], 1)
    assert centres.tolist() == [[4, 4], [12, 4], [4, 12], [12, 12]]
    fb = np.zeros((1, 4, 4))
    fb[0, :, 2:] = 10.0
    fb[0, 0, 0], fb[0, 1, 0] = 4.0, -4.0
    qb = fb.copy()
    qb[0, 1, 0] = -3.5
    fs = np.array([1.0, 2.0, -5.0, -5.0]).reshape(1, 4, 1)
    qs = np.array([-0.5, 1.0, -5.0, -5.0]).reshape(1, 4, 1)
    r = gate.detections(qb, qs, fb, fs, 0.0, centres)
    assert (r["rule"], r["float"], r["int8"], r["matched"], r["ok"]) == ("detections/nms", 1, 1, 1, True)
    r = gate.detections(qb, qs, fb, fs, 0.0)
    assert (r["float"], r["int8"], r["matched"], r["ok"]) == (2, 1, 1, False)
    assert gate.ssd_anchor_centres(224, [8, 16, 32, 32, 32], 2).shape == (2254, 2)  # pose detection's


def _log_energy_net():
    """Real digits through a log-energy front end: a 3x3 conv, its square plus 1e-6, LOG, then a
    1x1 conv mixing the 4 log maps (a log-spectrogram's shape of arithmetic)."""
    import onnx_ir as ir
    from mconv.irio import from_proto
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    w = (rng.standard_normal((4, 1, 3, 3)) * 0.5).astype(np.float32)
    w2 = (rng.standard_normal((4, 4, 1, 1)) * 0.5).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["c", "c"], ["e"]),
        helper.make_node("Add", ["e", "eps"], ["e1"]),
        helper.make_node("Log", ["e1"], ["l"]),
        helper.make_node("Conv", ["l", "w2"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "logfe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 28, 28])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 28, 28])],
        [
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(w2, "w2"),
            numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
        ],
    )
    model: ir.Model = from_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    return model


def test_a_log_front_end_runs_in_float_where_int8_loses_it(lenet, tmp_path):
    """Writer rule 7: squared conv responses of real digits span 1e-6 .. ~10; int8's step on that
    range rounds the small ones to zero, which LOG turns into -13.8: no calibration method's file
    is kept. With the ops computing LOG's input in float (TRANSPOSE, conv, MUL, ADD) it is kept,
    the notes count them, and on 200 held-out digits the output is within the cosine rule."""
    from mconv.targets import get_target

    _, x = lenet
    model = _log_energy_net()
    t = get_target("tflite")
    want = t.load(t.export(model, tmp_path / "f32", {})).run({"x": x[7::25]})["y"]
    b = t.export(model, tmp_path / "q", {"precision": "int8", "data": {"x": x[::50][:64]}})
    notes = " ".join(b.manifest["notes"])
    got = t.load(b).run({"x": x[7::25]})["y"]
    assert "with the LOG front end in float" in notes and "(kept;" in notes
    assert "4 computing a LOG's input" in notes  # the input's NCHW->NHWC TRANSPOSE too
    assert "minmax cosine" in notes  # the pure int8 files were measured first
    cos = float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want))
    rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    assert cos >= 0.99 and rel <= 0.15, (cos, rel)


def test_text_regions_are_matched_as_boxes():
    """Gate rule 6 on a [1, 1, 20, 40] probability map, threshold 0.3: float has two text lines,
    rows 2-5 x cols 3-30 and rows 12-15 x cols 5-35, and a 2x2 speck (shorter side 2 < 3:
    not a region). An int8 map whose first line ends at col 28 (box IoU 26/28 = 0.93) and whose
    second line is gone matches 1 of 2 (not kept); with the second line back (one pixel row
    fewer: IoU 0.75), 2 of 2 (kept)."""
    from mconv.targets.tflite import gate

    f = np.zeros((1, 1, 20, 40))
    f[0, 0, 2:6, 3:31] = 0.9
    f[0, 0, 12:16, 5:36] = 0.8
    f[0, 0, 18:20, 0:2] = 0.9
    q = np.zeros_like(f)
    q[0, 0, 2:6, 3:29] = 0.7
    r = gate.regions(q, f, 0.3)
    assert (r["rule"], r["float"], r["int8"], r["matched"], r["ok"]) == ("regions", 2, 1, 1, False)
    q[0, 0, 12:15, 5:36] = 0.31
    r = gate.regions(q, f, 0.3)
    assert (r["matched"], r["agreement"], r["ok"]) == (2, 1.0, True)
    assert gate.summary([r]).startswith("regions 2 of 2 matched")


def test_a_nan_output_scores_below_any_finite_shortfall():
    """Gate rule 7 (the writer's choice among calibrations): an output with a NaN (cosine and rel
    NaN) ranks below one at cosine 0.5, rel 1.0, which ranks below a kept one."""
    from mconv.targets.tflite import gate

    nan = {"rule": "cosine", "cosine": float("nan"), "rel": float("nan"), "ok": False}
    bad = {"rule": "cosine", "cosine": 0.5, "rel": 1.0, "ok": False}
    good = {"rule": "cosine", "cosine": 0.999, "rel": 0.05, "ok": True}
    assert gate.score([nan]) < gate.score([bad]) < gate.score([good])


def test_a_single_probability_is_judged_by_its_decision_and_absolute_error():
    """Gate rule 2b on ``[N, 1]`` probabilities, figures worked by hand: a handedness score of
    0.016 read as 0.019 is 19% off relatively (rule 3 would fail it) but 0.003 absolutely, and
    both say "below 0.5": kept. 0.49 read as 0.51 flips the decision: not kept. 0.10 read as
    0.16: 60% and 0.06 off: not kept. A ``[N, 1]`` output with a value past 1 (a logit) stays
    under rule 3."""
    from mconv.targets.tflite import gate

    def judged(q: float, f: float) -> dict:
        return gate.judge([np.array([[q]])], [np.array([[f]])])[0]

    near_zero = judged(0.019, 0.016)
    assert near_zero["rule"] == "probability" and near_zero["ok"]
    assert abs(near_zero["rel"] - 0.1875) < 1e-9 and abs(near_zero["abs"] - 0.003) < 1e-9
    assert not judged(0.51, 0.49)["ok"] and judged(0.51, 0.49)["top1"] == 0.0
    assert not judged(0.16, 0.10)["ok"]
    assert gate.judge([np.array([[1.9]])], [np.array([[2.0]])])[0]["rule"] == "cosine"
    # rule 7: a kept probability scores above a failing one
    assert gate.score([near_zero]) > gate.score([judged(0.16, 0.10)])
