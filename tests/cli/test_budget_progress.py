"""Issue 44 items 2 and 3 from the CLI: the budget search names the engine it ran on (printed and
in the JSON), shows each stage with its epoch, metric and ETA on stderr, and ``--json`` keeps
stdout to the one document."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from mconv.api.demo import fixture_path
from mconv.cli.app import app
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A 64 -> 10 linear classifier fitted to 300 real digits by least squares, and its data."""
    with np.load(fixture_path("digits_train.npz")) as z:
        x = (z["images"][:300].reshape(300, -1) / 16.0).astype(np.float32)
        y = z["labels"][:300]
    a = np.hstack([x, np.ones((300, 1), np.float32)])
    coef = np.linalg.lstsq(a, np.eye(10)[y], rcond=None)[0].astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Gemm", ["input", "w", "b"], ["logits"], name="fc")],
        "linear",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(coef[:-1], "w"), numpy_helper.from_array(coef[-1], "b")],
    )
    d = tmp_path_factory.mktemp("budget_progress")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), d / "m.onnx")
    np.savez(d / "data.npz", input=x, labels=y)
    return d / "m.onnx", d / "data.npz"


@pytest.mark.parametrize(("engine", "expected"), [("xla", "xla-cpu"), ("auto", "reference")])
def test_budget_json_stays_clean_and_progress_shows_stage_epoch_metric_and_eta(
    small, tmp_path, engine, expected
):
    """auto on this small classifier is the reference: its stages are cheaper than xla's compiles."""
    model, data = small
    r = CliRunner(env={"MCONV_PROGRESS_INTERVAL": "0"}).invoke(
        app,
        [
            "optimize", str(model), "--recipe", "deep-compression", "--data", str(data),
            "--max-drop", "0.03", "--epochs", "3", "--engine", engine, "-o", str(tmp_path / "c.onnx"), "--json",
        ],
    )  # fmt: skip
    assert r.exit_code in (0, 1), r.output
    doc = json.loads(r.stdout)  # the whole of stdout is the one document
    assert doc["budget"]["engine"] == expected
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("progress: ")]
    assert any(f"(engine {expected})" in ln for ln in lines), r.stderr
    epochs = [ln for ln in lines if "attempt 1/" in ln and "epoch 2/3" in ln]
    assert epochs and all("ETA " in ln for ln in epochs), r.stderr
    assert any("accuracy" in ln and "after epoch" in ln for ln in epochs), r.stderr
    assert "progress:" not in r.stdout
