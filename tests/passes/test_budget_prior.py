"""The budget search's pre-training choice (drivers/budget/softshare.py): when the mixture prior
runs, and the options it opens to the allocation."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from mconv.drivers.budget import BudgetConfig
from mconv.drivers.budget import softshare as S
from mconv.errors import InputError
from mconv.irio import load_onnx

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def _search(**options):
    options.setdefault("prior", "auto")
    return SimpleNamespace(config=BudgetConfig(**options), memo={})


def test_auto_takes_the_prior_only_past_deep_compression_ratios():
    model = load_onnx(FIXTURES / "digits_mlp.onnx")  # 50,200 weights: 200,800 B of float32 layers
    far = _search(target_size=3163)  # 63x: past what L2 and magnitude pruning reach
    near = _search(target_size=20000)  # 10x
    none = _search(max_drop=0.005)
    assert S.uses_prior(far, model) and S.sparsities_for(far)[-1] == 0.995 and 2 in S.bits_for(far)
    assert not S.uses_prior(near, model) and S.sparsities_for(near)[-1] == 0.97 and 2 not in S.bits_for(near)
    assert not S.uses_prior(none, model)
    assert S.uses_prior(_search(target_size=20000, prior="gmm"), model)
    assert not S.uses_prior(_search(target_size=3163, prior="l2"), model)
    # the default is the paper's L2 stage: the prior did not beat it on LeNet-5 (docs/passes.md)
    assert BudgetConfig(target_size=3163).prior == "l2"


def test_a_bad_prior_is_one_input_error():
    with pytest.raises(InputError, match="prior"):
        BudgetConfig(prior="laplace")
