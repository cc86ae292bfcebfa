"""optimize --recipe deep-compression --max-drop / --target-size / --save-recipe from the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from mconv.api.demo import fixture_path
from mconv.cli.app import app
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner


def _cli(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> tuple[Path, Path]:
    """A 64 -> 10 linear classifier fitted to 300 real digits by least squares, and its data."""
    with np.load(fixture_path("digits_train.npz")) as z:
        x = (z["images"][:300].reshape(300, -1) / 16.0).astype(np.float32)
        y = z["labels"][:300]
    a = np.hstack([x, np.ones((300, 1), np.float32)])
    coef = np.linalg.lstsq(a, np.eye(10)[y], rcond=None)[0].astype(np.float32)
    w, b = coef[:-1], coef[-1]
    g = helper.make_graph(
        [helper.make_node("Gemm", ["input", "w", "b"], ["logits"], name="fc")],
        "linear",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    d = tmp_path_factory.mktemp("budget")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), d / "m.onnx")
    np.savez(d / "data.npz", input=x, labels=y)
    return d / "m.onnx", d / "data.npz"


def test_max_drop_with_a_saved_recipe_that_rebuilds_the_same_bytes(small, tmp_path):
    model, data = small
    out, recipe = tmp_path / "c.onnx", tmp_path / "r.toml"
    r = _cli(
        "optimize", str(model), "--recipe", "deep-compression", "--data", str(data),
        "--max-drop", "0.02", "--save-recipe", str(recipe), "-o", str(out), "--json", "--seed", "1",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    budget = doc["budget"]
    assert budget["met"] and budget["accuracy_measured"]
    assert budget["held_out_drop"] <= 0.02 and budget["split"]["held_out"] > 0
    assert doc["predicted_bundle_weight_bytes"] < doc["weight_bytes_before"]
    assert recipe.is_file()
    again = tmp_path / "again.onnx"
    r = _cli(
        "optimize", str(model), "--recipe", str(recipe), "--data", str(data), "-o", str(again), "--seed", "1"
    )
    assert r.exit_code == 0, r.output
    assert again.read_bytes() == out.read_bytes()


def test_a_size_that_cannot_be_met_exits_1_with_the_best_result(small, tmp_path):
    model, data = small
    out = tmp_path / "c.onnx"
    r = _cli(
        "optimize", str(model), "--recipe", "deep-compression", "--data", str(data),
        "--max-drop", "0.0", "--target-size", "40", "-o", str(out), "--json",
    )  # fmt: skip
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    assert doc["budget"]["met"] is False and out.is_file()


def test_a_bundle_target_fits_the_exported_cpu_bundle_directory(small, tmp_path):
    model, data = small
    out, bundle = tmp_path / "c.onnx", tmp_path / "bundle"
    r = _cli(
        "optimize", str(model), "--recipe", "deep-compression", "--data", str(data),
        "--target-size", "2900", "--target-of", "bundle", "-o", str(out), "--json", "--seed", "1",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    budget = json.loads(r.stdout)["budget"]
    size = budget["size"]
    assert size["bundle"] <= 2900  # fits
    # one attempt spends the target within 4% (the bits are fitted on the export at clustering);
    # one that leaves more unspent is followed by a grown one, and the result is the one whose
    # gate drop is the smaller (that path with forced export errors: tests/drivers/test_budget.py)
    attempts = budget["attempts"]
    if len(attempts) == 1:
        assert size["bundle"] >= 0.96 * 2900, size
    else:
        first, grown = attempts
        assert grown["budget_bytes"] > first["budget_bytes"]
        assert budget["held_out_drop"] == min(first["held_out_drop"], grown["held_out_drop"])
    r = _cli("export", str(out), "--target", "cpu", "-o", str(bundle))
    assert r.exit_code == 0, r.output
    assert sum(f.stat().st_size for f in bundle.iterdir() if f.is_file()) == size["bundle"]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--passes", "dce", "--max-drop", "0.01"], "--recipe deep-compression"),
        (["--recipe", "lossless", "--max-drop", "0.01"], "--recipe deep-compression"),
        (["--recipe", "deep-compression", "--max-drop", "1.5"], "fraction"),
        (["--recipe", "deep-compression", "--target-size", "44 parsecs"], "not a size"),
        (["--recipe", "deep-compression", "--target-size", "0"], "not positive"),
        (["--recipe", "deep-compression", "--target-size", "9KB", "--target-of", "disk"], "--target-of"),
        (["--passes", "dce", "--val-data", "VAL"], "--val-data"),
        (["--passes", "dce", "--epochs", "3"], "--epochs"),
        (["--recipe", "deep-compression", "--max-drop", "0.01", "--epochs", "0"], "--epochs"),
        (["--recipe", "deep-compression", "--max-drop", "0.01", "--val-data", "MISSING"], "MISSING"),
        (["--recipe", "deep-compression", "--max-drop", "0.01", "--gate-se", "-1"], "--gate-se"),
    ],
)
def test_bad_budget_options_are_one_line_exit_2(small, tmp_path, args, needle):
    model, data = small
    args = [str(data) if a == "VAL" else str(tmp_path / "missing.npz") if a == "MISSING" else a for a in args]
    needle = "missing.npz" if needle == "MISSING" else needle
    r = _cli("optimize", str(model), *args, "--data", str(data), "-o", str(tmp_path / "x.onnx"))
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.output


def test_the_budget_search_fine_tunes_on_the_xla_engine_and_its_recipe_says_so(small, tmp_path):
    pytest.importorskip("jax")
    model, data = small
    out, recipe = tmp_path / "x.onnx", tmp_path / "x.toml"
    r = _cli(
        "optimize", str(model), "--recipe", "deep-compression", "--data", str(data), "--max-drop", "0.02",
        "--engine", "xla", "--epochs", "3", "--save-recipe", str(recipe), "-o", str(out), "--json",
        "--seed", "1",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    budget = json.loads(r.stdout)["budget"]
    assert budget["met"] and budget["held_out_drop"] <= 0.02
    text = recipe.read_text()
    assert 'engine = "xla"' in text and 'device = "cpu"' in text
    assert "epochs = 3" in text and "epochs = 6" in text  # --epochs per stage, the final retraining twice
    again = tmp_path / "again.onnx"  # the recipe replays on the engine it names, to the same bytes
    r = _cli(
        "optimize", str(model), "--recipe", str(recipe), "--data", str(data), "-o", str(again), "--seed", "1"
    )
    assert r.exit_code == 0, r.output
    assert again.read_bytes() == out.read_bytes()


def test_engine_applies_to_finetune_passes_that_name_none(small, tmp_path):
    pytest.importorskip("jax")
    model, data = small
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    common = ["optimize", str(model), "--data", str(data), "--seed", "3"]
    r = _cli(*common, "--passes", "prune(sparsity=0.5),finetune(epochs=1)", "--engine", "xla", "-o", str(a))
    assert r.exit_code == 0, r.output
    r = _cli(*common, "--passes", "prune(sparsity=0.5),finetune(epochs=1,engine='xla')", "-o", str(b))
    assert r.exit_code == 0, r.output
    assert a.read_bytes() == b.read_bytes()


@pytest.mark.parametrize(
    "args, needle",
    [(["--engine", "tpu"], "unknown engine"), (["--device", "cuda"], "needs the xla engine")],
)
def test_bad_engine_options_are_one_line_exit_2(small, tmp_path, args, needle):
    model, data = small
    r = _cli("optimize", str(model), "--recipe", "lossless", *args, "-o", str(tmp_path / "x.onnx"))
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], r.output


def test_validation_data_from_the_cli_is_the_gate_and_in_the_json(small, tmp_path):
    model, data = small
    with np.load(fixture_path("digits_test.npz")) as z:
        x = (z["images"][:120].reshape(120, -1) / 16.0).astype(np.float32)
        np.savez(tmp_path / "val.npz", input=x, labels=z["labels"][:120])
    out = tmp_path / "c.onnx"
    r = _cli(
        "optimize", str(model), "--recipe", "deep-compression", "--data", str(data),
        "--val-data", str(tmp_path / "val.npz"), "--max-drop", "0.02", "-o", str(out), "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    split = json.loads(r.stdout)["budget"]["split"]
    assert split == {**split, "validation": True, "train": 300, "held_out": 120, "holdout": 0.0}
