"""The budget search's trials on Ray (issue 15 item 4): each layer's candidate settings run as
Ray tasks on a local Ray of 2 workers and give the in-process search, value for value; the
options reach it from the API and the CLI; bad values are one line and exit 2."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import mconv.fixtures
import numpy as np
import onnx_ir as ir
import pytest
import ray  # in .[test]: a missing ray fails here, never skips
from mconv.drivers import budget as B
from mconv.errors import InputError
from mconv.irio import load_onnx

FIXTURES = Path(mconv.fixtures.__file__).resolve().parent
FAST = {"epochs": 1, "attempts": 1, "sparsities": (0.5, 0.8, 0.9), "bits": (6, 4)}


def _data(n: int, seed: int) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / "digits_train.npz") as z:
        x = z["images"].reshape(len(z["labels"]), 64).astype(np.float32) / 16.0
        labels = z["labels"]
    idx = np.sort(np.random.default_rng(seed).permutation(len(labels))[:n])
    return {"input": x[idx], "labels": labels[idx]}


def _mlp() -> ir.Model:
    return load_onnx(FIXTURES / "digits_mlp.onnx")


def _timeless(doc):
    """The report without its wall-clock fields (the only values allowed to differ)."""
    if isinstance(doc, dict):
        return {k: _timeless(v) for k, v in doc.items() if k != "seconds"}
    if isinstance(doc, list):
        return [_timeless(v) for v in doc]
    return doc


def _search(data, **kw) -> B.BudgetResult:
    """The search's result, met or not (an unmet budget carries the best result found)."""
    try:
        return B.compress_to_budget(_mlp(), data, **kw)
    except B.BudgetNotMet as exc:
        return exc.result


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray of 2 workers for the module (map_trials leaves a Ray it did not start)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()


def _options(layers) -> dict:
    return {layer.tensor: (dict(layer.options), dict(layer.snr)) for layer in layers}


@pytest.mark.parametrize("estimator", ["fisher", "sweep"])
def test_each_layers_options_on_two_workers_are_the_in_process_ones(local_ray, estimator):
    data = _data(96, seed=4)
    model = _mlp()
    feeds, labels, n = B._check_data(model, data)
    train, _ = B.split_indices(n, 0.25, 0)
    out = B._score_value(model)
    ev0 = B._Evaluator(feeds, out, np.zeros((0,)), labels)
    ev = B._Evaluator(feeds, out, ev0.outputs(model, np.arange(n)), labels)
    seen: list[str] = []
    here, _ = B._candidates(model, ev, train, estimator, None, (0.0, 0.5, 0.9), (6, 3))
    there, _ = B._candidates(
        model,
        ev,
        train,
        estimator,
        lambda what, done, total: seen.append(what),
        (0.0, 0.5, 0.9),
        (6, 3),
        workers=2,
    )
    assert any("on Ray" in s for s in seen)  # the trials went through map_trials' Ray path
    assert [layer.name for layer in there] == [layer.name for layer in here] and len(here) >= 2
    assert _options(there) == _options(here)
    # the estimate measured something: 90% pruning with 3 bits costs more than 50% with 6
    for layer in here:
        assert layer.options[(0.9, 3)][1] > layer.options[(0.5, 6)][1] > 0.0
        assert layer.options[(0.9, 3)][0] < layer.options[(0.0, None)][0]


def test_a_whole_budget_search_on_two_workers_is_the_in_process_one(local_ray):
    data = _data(160, seed=1)
    here = _search(data, max_drop=0.05, seed=0, **FAST)
    there = _search(data, max_drop=0.05, seed=0, workers=2, **FAST)
    assert here.attempts and here.layers and here.stages
    assert _timeless(there.as_dict()) == _timeless(here.as_dict())
    a = ir.serde.serialize_model(here.model).SerializeToString()
    assert ir.serde.serialize_model(there.model).SerializeToString() == a


def test_the_data_free_mode_on_two_workers_is_the_in_process_one(local_ray):
    kw = {"sparsities": (0.3, 0.5, 0.9), "bits": (8, 3)}
    here = B.compress_to_budget(_mlp(), None, **kw)
    there = B.compress_to_budget(_mlp(), None, workers=2, **kw)
    assert _timeless(there.as_dict()) == _timeless(here.as_dict())
    assert any(row["sparsity"] > 0 or row["bits"] is not None for row in here.layers)


@pytest.mark.parametrize(
    "kwargs, words",
    [({"workers": -1}, "negative"), ({"workers": 2, "ray_address": "auto"}, "both given")],
)
def test_bad_worker_options_are_input_errors(kwargs, words):
    with pytest.raises(InputError, match=words):
        B.compress_to_budget(_mlp(), _data(40, seed=5), max_drop=0.01, **kwargs)


def test_cli_optimize_with_workers_is_the_plain_run_and_refuses_bad_uses(tmp_path, monkeypatch):
    from mconv.cli.app import app
    from typer.testing import CliRunner

    # the CLI's own defaults train for minutes: the same search with one short attempt
    monkeypatch.setattr(B, "compress_to_budget", functools.partial(B.compress_to_budget, **FAST))
    data = tmp_path / "d.npz"
    np.savez(data, **_data(160, seed=1))
    model = FIXTURES / "digits_mlp.onnx"
    runner = CliRunner()

    def optimize(name: str, *extra: str):
        args = ["optimize", str(model), "-o", str(tmp_path / name), "--recipe", "deep-compression"]
        return runner.invoke(app, [*args, "--data", str(data), "--max-drop", "0.05", "--json", *extra])

    plain = optimize("plain.onnx")
    assert plain.exit_code in (0, 1), plain.output  # 1: budget not met, the best result written
    on_ray = optimize("ray.onnx", "--workers", "2")  # starts and stops its own local Ray
    assert on_ray.exit_code == plain.exit_code, on_ray.output
    a, b = json.loads(plain.stdout), json.loads(on_ray.stdout)
    assert _timeless(b["budget"]) == _timeless(a["budget"]) and a["budget"]["layers"]
    assert (tmp_path / "ray.onnx").read_bytes() == (tmp_path / "plain.onnx").read_bytes()

    bad = optimize("bad.onnx", "--workers", "-2")
    assert bad.exit_code == 2 and "--workers" in bad.output and "Traceback" not in bad.output
    no_budget = runner.invoke(
        app, ["optimize", str(model), "-o", str(tmp_path / "x.onnx"), "--passes", "fold", "--workers", "2"]
    )
    assert no_budget.exit_code == 2 and "budget" in no_budget.output
    assert not (tmp_path / "x.onnx").exists()
