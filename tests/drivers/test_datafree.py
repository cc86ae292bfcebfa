"""A lossy recipe never destroys a model silently.

Without --data, ``--recipe deep-compression`` backs prune and cluster off per layer until the
data-free weight check holds, and says that accuracy was not measured; the held-out digits
(never shown to the product) check that the trained models still agree with themselves. Data too
few to measure anything is refused before any work, one line, exit 2, unless --force."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import mconv.drivers.budget as B
import numpy as np
import onnxruntime as ort
import pytest
from mconv.api.demo import fixture_path
from mconv.cli.app import app
from typer.testing import CliRunner


def _cli(*args: str):
    return CliRunner().invoke(app, list(args))


def _held_out_digits(model: Path) -> dict[str, np.ndarray]:
    with np.load(fixture_path("digits_test.npz")) as z:
        x = z["images"].astype(np.float32) / 16.0
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    shape = sess.get_inputs()[0].shape
    return {sess.get_inputs()[0].name: x.reshape(-1, 64) if len(shape) == 2 else x[:, None]}


def _top1(model: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0].argmax(1)


def _error_line(r) -> str:
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    return lines[0]


@pytest.mark.parametrize("name", ["digits_mlp.onnx", "digits_dwcnn.onnx"])
def test_without_data_the_recipe_stops_where_the_data_free_check_holds(name, tmp_path):
    src, out = fixture_path(name), tmp_path / "dc.onnx"
    r = _cli("optimize", str(src), "--recipe", "deep-compression", "-o", str(out), "--json")
    assert r.exit_code == 0, r.output
    assert "accuracy was not measured" in r.stderr.lower()
    doc = json.loads(r.stdout)
    assert doc["accuracy_measured"] is False
    assert any("NOT MEASURED" in w for w in doc["warnings"])
    plan = doc["datafree"]
    layers = plan["layers"]
    assert layers and plan["layers_backed_off"] >= 1
    # every layer meets the per-layer limit, and what it kept is no more aggressive than asked
    assert all(row["weight_snr_db"] is None or row["weight_snr_db"] >= plan["snr_db_min"] for row in layers)
    assert all(row["sparsity"] <= row["asked_sparsity"] for row in layers)
    assert all(row["bits"] is None or row["bits"] >= row["asked_bits"] for row in layers)
    assert doc["predicted_bundle_weight_bytes"] < doc["weight_bytes_before"] / 2  # still compressed
    feeds = _held_out_digits(src)  # real digits the product never saw
    assert np.mean(_top1(out, feeds) == _top1(src, feeds)) >= 0.99


def test_force_without_data_runs_the_recipe_as_written_and_still_warns(tmp_path):
    src, out = fixture_path("digits_mlp.onnx"), tmp_path / "dc.onnx"
    r = _cli("optimize", str(src), "--recipe", "deep-compression", "-o", str(out), "--json", "--force")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["accuracy_measured"] is False and "datafree" not in doc
    assert "accuracy was not measured" in r.stderr.lower()
    kept = {t["name"]: t["kept"] for p in doc["passes"] if p["name"] == "prune" for t in p["tensors"]}
    assert kept and all(abs(k - 0.1) < 1e-3 for k in kept.values())  # the recipe's 90%, unchecked


def test_a_lossless_recipe_claims_nothing(tmp_path):
    r = _cli(
        "optimize",
        str(fixture_path("digits_mlp.onnx")),
        "--recipe",
        "lossless",
        "-o",
        str(tmp_path / "l.onnx"),
        "--json",
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert "accuracy_measured" not in doc and doc["warnings"] == []


def _tiny(tmp_path: Path, n: int = 3) -> Path:
    with np.load(fixture_path("digits_train.npz")) as z:
        x = z["images"][:n].reshape(n, 64).astype(np.float32) / 16.0
    np.savez(tmp_path / "tiny.npz", input=x)
    return tmp_path / "tiny.npz"


@pytest.mark.parametrize("n", [3, 8])
@pytest.mark.parametrize("budget", [["--max-drop", "0.005"], []], ids=["max-drop", "plain-recipe"])
def test_too_few_samples_are_refused_before_any_work(budget, n, tmp_path, monkeypatch):
    def no_work(*a, **k):
        raise AssertionError("the work started")

    monkeypatch.setattr(B.evaluation, "_run_specs", no_work)  # the budget search's first step
    monkeypatch.setattr("mconv.passes.pipeline.run_pipeline", no_work)
    out, data = tmp_path / "c.onnx", _tiny(tmp_path, n)
    args = ["optimize", str(fixture_path("digits_mlp.onnx")), "--recipe", "deep-compression"]
    r = _cli(*args, "--data", str(data), *budget, "-o", str(out))
    assert r.exit_code == 2, r.output
    line = _error_line(r)
    if n == 3:  # fewer than the 8 any data set needs
        assert "samples" in line
    else:  # enough to train on, too few to measure: the held-out split cannot resolve the drop
        assert "cannot resolve" in line and "tiny.npz" in line and "--force" in line
    assert not out.exists()


def test_force_goes_on_with_too_few_samples(tmp_path, monkeypatch):
    fast = {"epochs": 1, "attempts": 1, "sparsities": (0.5,), "bits": (6,)}
    monkeypatch.setattr(B, "compress_to_budget", functools.partial(B.compress_to_budget, **fast))
    out, data = tmp_path / "c.onnx", _tiny(tmp_path, 8)
    args = ["optimize", str(fixture_path("digits_mlp.onnx")), "--recipe", "deep-compression"]
    r = _cli(*args, "--data", str(data), "--max-drop", "0.005", "--force", "-o", str(out), "--json")
    assert r.exit_code in (0, 1), r.output  # 1: the budget was not met (the best result written)
    doc = json.loads(r.stdout)
    assert doc["accuracy_measured"] is True and doc["budget"]["split"]["held_out"] == 2
    assert out.is_file()


def test_the_gate_resolution_rule():
    assert B.too_few_samples(3, 0.005) is not None
    assert B.too_few_samples(199, 0.005) is not None and B.too_few_samples(200, 0.005) is None
    assert B.too_few_samples(B.MIN_HELD_OUT - 1, 0.5) is not None
    assert B.too_few_samples(B.MIN_HELD_OUT, 0.0) is None  # no net loss: any split counts it


def test_a_recipe_whose_data_no_pass_uses_is_limited_too(tmp_path):
    """Data given but no finetune pass to measure with: the data-free check still limits."""
    recipe = tmp_path / "r.toml"
    recipe.write_text('[[pass]]\nname = "prune"\nsparsity = 0.95\n\n[[pass]]\nname = "cluster"\nbits = 3\n')
    with np.load(fixture_path("digits_train.npz")) as z:
        np.savez(tmp_path / "d.npz", input=z["images"][:400].reshape(400, 64).astype(np.float32) / 16.0)
    src, out = fixture_path("digits_mlp.onnx"), tmp_path / "c.onnx"
    r = _cli(
        "optimize",
        str(src),
        "--recipe",
        str(recipe),
        "--data",
        str(tmp_path / "d.npz"),
        "-o",
        str(out),
        "--json",
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["accuracy_measured"] is False and "no finetune pass" in doc["warnings"][0]
    assert doc["datafree"]["layers_backed_off"] == len(
        doc["datafree"]["layers"]
    )  # 95% / 3 bits: far too much
    feeds = _held_out_digits(src)
    assert np.mean(_top1(out, feeds) == _top1(src, feeds)) >= 0.99


def test_a_gradient_step_in_micro_batches_is_the_batch_step():
    """Memory: a batch whose recorded activations exceed GRAD_STEP_BYTES runs as micro-batches;
    their weighted sum is the batch's loss and gradient."""
    import mconv.api as api
    from mconv.engines.reference.executor import Executor
    from mconv.passes.finetune import distillation_kl, micro_batch, value_and_grad_micro

    model = api.load(fixture_path("digits_mlp.onnx"))
    ex = Executor(model)
    with np.load(fixture_path("digits_train.npz")) as z:
        x = z["images"][:10].reshape(10, 64).astype(np.float32) / 16.0
    out = ex.output_names[0]
    target = ex.run({"input": x})[out] * 0.5

    def loss_of(t):
        def fn(outputs):
            value, g = distillation_kl(outputs[out], t, 2.0)
            return value, {out: g}

        return fn

    wrt = ["fc1.weight", "fc3.bias"]
    whole = value_and_grad_micro(ex, {"input": x}, loss_of, target, wrt, 10)
    parts = value_and_grad_micro(ex, {"input": x}, loss_of, target, wrt, 3)  # 3 + 3 + 3 + 1
    assert parts[0] == pytest.approx(whole[0], rel=1e-5)
    for name in wrt:
        np.testing.assert_allclose(parts[1][name], whole[1][name], rtol=1e-4, atol=1e-7)
    assert micro_batch(1 << 30, 32) == 1 and micro_batch(1, 32) == 32
