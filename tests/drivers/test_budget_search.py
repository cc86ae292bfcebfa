"""Rule 7's search with ``max_drop`` alone (mconv.drivers.budget.search): after a pass it goes on
toward smaller allocations, between the frontier's points, keeps the smallest that passes, and
never calls a failing one met.

The digits MLP on a few real digits, one epoch a stage: the attempts are real; where a test needs
to know where the boundary lies, the gate is replaced by a stand-in that passes exactly the
budgets of at least ``T`` bytes (a monotone gate whose answer the test knows beforehand)."""

from __future__ import annotations

import numpy as np
import pytest
from mconv.drivers import budget as B
from mconv.drivers.budget import attempt as A
from mconv.drivers.budget import search as S
from mconv.errors import GateFailed
from mconv.irio import load_onnx

from tests.drivers.test_budget import FAST, _subset, fixture_path

# options fine enough that allocations exist between the frontier's points
FINE: dict = {}


def _gate_at(monkeypatch, threshold: int) -> list[dict]:
    """The attempts' gate replaced: an attempt passes when its budget is at least ``threshold``
    bytes. Returns the attempts as they finish."""
    real = A._Attempt._finish
    seen: list[dict] = []

    def finish(self):
        r = real(self)
        r["ok"] = r["ok_drop"] = r["budget"] >= threshold
        seen.append(r)
        return r

    monkeypatch.setattr(A._Attempt, "_finish", finish)
    return seen


def _frontier_bytes(data) -> list[int]:
    """The frontier's predicted bytes for the MLP with these options (what the search bisects)."""
    seen: list[list[int]] = []
    real = S._allocations

    def grab(s, model):
        real(s, model)
        seen.append([B._alloc_bytes(s.layers, a) for a in s.fitting])
        raise StopIteration

    mp = pytest.MonkeyPatch()
    mp.setattr(S, "_allocations", grab)
    try:
        with pytest.raises(StopIteration):
            B.compress_to_budget(
                load_onnx(fixture_path("digits_mlp.onnx")), data, max_drop=0.05, seed=1, **{**FAST, **FINE}
            )
    finally:
        mp.undo()
    return seen[0]


def test_after_a_pass_the_search_goes_on_between_the_frontiers_points(monkeypatch):
    data = _subset(200, seed=6)
    points = _frontier_bytes(data)
    # the boundary inside the widest gap between two neighbouring points of the frontier's
    # smaller half: bisecting the points alone ends at the gap's upper end
    half = points[: len(points) // 2 + 1]
    gaps = [(half[i + 1] / half[i], i) for i in range(len(half) - 1)]
    ratio, i = max(gaps)
    assert ratio > 1.3, points  # a gap worth searching
    threshold = int(half[i] * ratio**0.6)
    seen = _gate_at(monkeypatch, threshold)
    model = load_onnx(fixture_path("digits_mlp.onnx"))
    result = B.compress_to_budget(model, data, max_drop=0.05, seed=1, **{**FAST, **FINE, "attempts": 8})
    budgets = [r["budget"] for r in seen]
    assert result.met
    chosen = next(a for a in result.attempts if a["chosen"])
    assert chosen["passed"] and chosen["budget_bytes"] >= threshold
    # the smallest passing attempt is the answer
    passing = [a for a in result.attempts if a["passed"]]
    assert chosen["weights_file"] == min(a["weights_file"] for a in passing)
    # some attempt lies strictly inside the gap, and the answer is far below the gap's upper end
    assert any(half[i] < b < half[i + 1] for b in budgets), (budgets, half[i], half[i + 1])
    assert chosen["budget_bytes"] < half[i + 1]
    assert chosen["budget_bytes"] <= threshold / (1 - S.REFINE_CLOSE) or len(seen) == 8, (budgets, threshold)
    # and every failing attempt below the answer is below the threshold (the stand-in's truth)
    assert all(b < threshold for b in budgets if b < chosen["budget_bytes"])


def test_a_failing_attempt_is_never_the_met_answer(monkeypatch):
    data = _subset(200, seed=6)
    # nothing passes: the search raises with the nearest attempt, never a met result
    seen = _gate_at(monkeypatch, 10**9)
    model = load_onnx(fixture_path("digits_mlp.onnx"))
    with pytest.raises(GateFailed) as err:
        B.compress_to_budget(model, data, max_drop=0.05, seed=1, **{**FAST, "attempts": 3})
    result = err.value.result
    assert not result.met and len(seen) >= 2
    assert not any(a["passed"] for a in result.attempts)
    # each failure sends it toward larger allocations
    budgets = [r["budget"] for r in seen]
    assert budgets == sorted(budgets) and len(set(budgets)) == len(budgets), budgets


def test_with_the_real_gate_the_answer_passes_it_and_is_the_smallest_that_does():
    data = _subset(240, seed=2)
    model = load_onnx(fixture_path("digits_mlp.onnx"))
    result = B.compress_to_budget(model, data, max_drop=0.03, seed=1, **{**FAST, "attempts": 4})
    assert result.met
    for a in result.attempts:  # the gate: drop plus one standard error within max_drop
        assert a["passed"] == (a["held_out_drop_bound"] <= 0.03 + 1e-12), a
    assert result.held_out_drop_bound <= 0.03 + 1e-12
    assert result.size["weights_file"] == min(a["weights_file"] for a in result.attempts if a["passed"])
    assert np.isfinite(result.held_out_drop_se)
