"""A raw output of three or more dimensions (a detector's ``[N, 4 + classes, anchors]``): the
budget's gate compares it channel by channel, and its retraining distils the same thing.

nudenet's YOLOv8 (boxes in pixels, 0-320, beside class scores in [0, 1]) showed both faults:
the whole tensor's cosine stayed at 0.988 while the compressed model found none of the
original's detections on 200 photos, and the budget's per-position KL was a softmax over the
2,100 anchors, blind to the scores (bench/RESULTS.md, real_compress)."""

from __future__ import annotations

import numpy as np
import pytest
from mconv.drivers.budget.evaluation import _Evaluator
from mconv.drivers.budget.schedule import _schedule
from mconv.metrics import balanced_cosine, channel_weights
from mconv.passes.finetune import mean_squared_error


def _detector_like() -> np.ndarray:
    """[2, 3, 4]: channel 0 a coordinate near 100, channels 1 and 2 scores near 0.5."""
    ref = np.empty((2, 3, 4))
    ref[:, 0] = 100.0
    ref[:, 1] = 0.5
    ref[:, 2] = 0.5
    return ref


def test_scores_lost_beside_boxes_cost_the_balanced_cosine_what_they_weigh():
    ref = _detector_like()
    got = ref.copy()
    got[:, 1:] = 0.0  # every score gone, the boxes kept
    plain = float(got.ravel() @ ref.ravel() / (np.linalg.norm(got) * np.linalg.norm(ref)))
    # by hand: the plain cosine is 100 / sqrt(100**2 + 2 * 0.5**2) = 0.99998
    assert plain == pytest.approx(100 / np.sqrt(100**2 + 0.5), rel=1e-12)
    # balanced, each channel carries a third of the energy: only one of three agrees, 1 / sqrt(3)
    assert balanced_cosine(got, ref) == pytest.approx(1 / np.sqrt(3), rel=1e-9)
    assert balanced_cosine(ref, ref) == pytest.approx(1.0, rel=1e-12)
    # scores damped to a third (no longer over a 0.25 threshold): 5 / sqrt(3 * 11 / 3) / sqrt(3)
    damped = ref.copy()
    damped[:, 1:] /= 3
    assert balanced_cosine(damped, ref) == pytest.approx((1 + 2 / 3) / np.sqrt(3 * (1 + 2 / 9)), rel=1e-9)


def test_below_three_dimensions_nothing_is_weighted():
    rng = np.random.default_rng(5)
    ref, got = rng.standard_normal((6, 1)), rng.standard_normal((6, 1))
    assert np.all(channel_weights(ref) == 1.0)
    plain = float(got.ravel() @ ref.ravel() / (np.linalg.norm(got) * np.linalg.norm(ref)))
    assert balanced_cosine(got, ref) == pytest.approx(plain, rel=1e-12)
    # a channel that is zero throughout gets a bounded weight, not a division by zero
    z = _detector_like()
    z[:, 2] = 0.0
    w = channel_weights(z).ravel()
    assert np.isfinite(w).all() and w[2] == pytest.approx(1e6, rel=1e-9)


def test_the_budget_gate_on_a_raw_output_is_the_balanced_cosine():
    ref = _detector_like()
    ev = _Evaluator(feeds={"x": np.zeros((2, 1), np.float32)}, output="y", reference=ref, labels=None)
    got = ref.copy()
    got[:, 1:] = 0.0
    idx = np.arange(2)
    assert ev.metric_name == "cosine"
    assert ev.metric(got, idx) == pytest.approx(1 / np.sqrt(3), rel=1e-9)
    assert ev.losses(got, idx) == pytest.approx(1 - 1 / np.sqrt(3), rel=1e-9)


def test_the_mse_weighs_each_channel_by_its_energy_and_its_gradient_is_exact():
    ref = _detector_like()
    student = ref.copy()
    student[:, 0] += 1.0  # one pixel off on every box coordinate
    student[:, 1] -= 0.5  # one score channel gone
    value, grad = mean_squared_error(student, ref)
    # by hand: the weights are mean energy / channel energy; energies 1e4, 0.25, 0.25
    mean = (1e4 + 0.25 + 0.25) / 3
    w = np.array([mean / 1e4, mean / 0.25, mean / 0.25])
    want = (8 * w[0] * 1.0 + 8 * w[1] * 0.25) / 24
    assert value == pytest.approx(want, rel=1e-9)
    # the lost score channel now costs 10,000 times the pixel of error on every box (unweighted: 1/4)
    assert (w[1] * 0.25) / (w[0] * 1.0) == pytest.approx(1e4, rel=1e-9)
    eps = 1e-6  # the gradient against a central difference, element [1, 1, 2]
    plus, minus = student.copy(), student.copy()
    plus[1, 1, 2] += eps
    minus[1, 1, 2] -= eps
    numeric = (mean_squared_error(plus, ref)[0] - mean_squared_error(minus, ref)[0]) / (2 * eps)
    assert grad[1, 1, 2] == pytest.approx(numeric, rel=1e-6)


def test_the_xla_mse_is_the_reference_mse():
    from mconv.engines.xla.engine import loss_value  # jax: the test extra installs it

    rng = np.random.default_rng(9)
    t = rng.standard_normal((4, 5, 7)) * np.array([300.0, 1, 1, 0.1, 1])[None, :, None]
    s = t + rng.standard_normal(t.shape)
    want, _ = mean_squared_error(s, t)
    got = float(loss_value(s.astype(np.float32), t.astype(np.float32), "mse"))
    assert got == pytest.approx(want, rel=1e-4)


def test_the_schedule_retrains_with_the_loss_it_is_given():
    alloc = {"fc1": (0.9, 4), "fc2": (0.0, 5)}  # (sparsity, bits)
    for loss in ("kl", "mse"):
        stages = _schedule(alloc, 2, 0, 0.0, 8, loss=loss)
        losses = [s.config["loss"] for _, specs in stages for s in specs if s.name == "finetune"]
        assert len(losses) >= 3 and set(losses) == {loss}


def test_the_search_distils_a_raw_output_with_the_mse_and_class_scores_with_the_kl():
    from types import SimpleNamespace

    from mconv.drivers.budget.attempt import Search

    raw = _Evaluator(feeds={}, output="y", reference=_detector_like(), labels=None)
    scores = _Evaluator(feeds={}, output="y", reference=np.eye(3), labels=None)
    assert Search.loss.fget(SimpleNamespace(ev=raw)) == "mse"
    assert Search.loss.fget(SimpleNamespace(ev=scores)) == "kl"
