"""Transformers and data-dependent ops on the webgpu target (wgpu; lavapipe in CI), against ONNX
Runtime and the reference executor: the metal target's cases (``transformer_models``), and
``mconv run`` of a webgpu bundle keeps stderr empty whatever XDG_RUNTIME_DIR holds.

Every comparison bounds cosine AND the max error relative to the output's scale.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mconv.errors import UnsupportedError
from mconv.irio import load_onnx
from mconv.targets import get_target
from mconv.targets.reference import ReferenceRunner

sys.path.insert(0, str(Path(__file__).parents[1] / "metal"))
sys.path.insert(0, str(Path(__file__).parents[2]))  # tests/
from _system import needs_webgpu_adapter  # noqa: E402
from transformer_models import (  # noqa: E402
    VOCAB,
    close,
    data_if_model,
    embedding_model,
    export_transformers,
    special_values_model,
    transformer_feeds,
)

ROOT = Path(__file__).parents[3]
TARGET = get_target("webgpu")


pytestmark = needs_webgpu_adapter


@pytest.fixture(scope="module")
def transformers(tmp_path_factory):
    return export_transformers(tmp_path_factory.mktemp("transformers"))


@pytest.mark.parametrize("name", ["bert", "llama"])
def test_torch_transformer_runs_on_webgpu_and_matches_ort(transformers, name, tmp_path):
    import onnxruntime as ort

    path = transformers[name]
    feeds = transformer_feeds(name)
    session = ort.InferenceSession(str(path))
    expected = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    bundle = TARGET.export(load_onnx(path), tmp_path / "bundle", {"precision": "fp16"})
    plan = json.loads((bundle.root / "webgpu_plan.json").read_text())
    assert plan["dtype"] == "float"  # ids up to 2999 would not be exact in f16
    got = TARGET.load(bundle).run(feeds)
    assert set(got) == set(expected)
    for out, ref in expected.items():
        close(ref, got[out], 1e-4)


def test_gather_of_runtime_ids_beyond_half_is_exact_and_bounded(tmp_path):
    model, table = embedding_model(VOCAB)
    ids = np.array([[2999, 2049, -1, 0, 2047], [3000, -3001, 2048, 7, -3000]], np.int64)
    bundle = TARGET.export(model, tmp_path / "b", {"precision": "fp16"})
    assert json.loads((bundle.root / "webgpu_plan.json").read_text())["dtype"] == "float"
    y = TARGET.load(bundle).run({"ids": ids})["y"]
    np.testing.assert_array_equal(y[0], table[[2999, 2049, VOCAB - 1, 0, 2047]])
    np.testing.assert_array_equal(y[1, 2:], table[[2048, 7, 0]])
    np.testing.assert_array_equal(y[1, :2], 0)  # out of range: zeros, never a read outside the table


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_isnan_isinf_and_clip_with_input_bounds(precision, tmp_path):
    model = special_values_model()
    x = np.array([[np.nan, np.inf, -np.inf, 0.0], [1, -2, 3, 600], [-0.5, 0.25, 5, -7]], np.float32)
    feeds = {"x": x, "lo": np.float32(-1.5), "hi": np.float32(2.0)}
    expected = ReferenceRunner(model).run(feeds)
    got = TARGET.load(TARGET.export(model, tmp_path / "b", {"precision": precision})).run(feeds)
    for name in ("nan", "inf", "pinf"):
        np.testing.assert_array_equal(got[name], expected[name])
    for name in ("clipped", "clipped_hi"):
        np.testing.assert_array_equal(np.isnan(got[name]), np.isnan(expected[name]))
        np.testing.assert_array_equal(np.nan_to_num(got[name]), np.nan_to_num(expected[name]))


def test_if_from_input_runs_both_branches_and_selects(tmp_path):
    model = data_if_model()
    bundle = TARGET.export(model, tmp_path / "b", {"precision": "fp32"})
    assert "Where" in [
        layer["op"] for layer in json.loads((bundle.root / "webgpu_plan.json").read_text())["layers"]
    ]
    runner = TARGET.load(bundle)
    rng = np.random.default_rng(0)
    for sign in (1.0, -1.0):
        x = (np.abs(rng.standard_normal((2, 6))) * sign).astype(np.float32)
        close(ReferenceRunner(model).run({"x": x})["p"], runner.run({"x": x})["p"], 1e-5)


def test_if_from_input_with_a_costly_branch_is_refused(tmp_path):
    with pytest.raises(UnsupportedError) as info:
        TARGET.export(data_if_model(big_branch=True), tmp_path / "b", {"precision": "fp32"})
    assert "If" in str(info.value.items)


@pytest.mark.parametrize("xdg", [None, "", "relative/dir"])
def test_mconv_run_of_a_webgpu_bundle_keeps_stderr_empty(xdg, tmp_path):
    """The window-system probe at adapter creation prints on stderr when XDG_RUNTIME_DIR is
    unset or not absolute; a successful run prints nothing there (a real process: the message
    comes from C code writing to fd 2)."""
    bundle = tmp_path / "mlp"
    TARGET.export(load_onnx(str(ROOT / "fixtures" / "digits_mlp.onnx")), bundle, {})
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    if xdg is not None:
        env["XDG_RUNTIME_DIR"] = xdg
    proc = subprocess.run(
        [sys.executable, "-m", "mconv", "run", str(bundle), "--samples", "2", "--json", "-q"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert isinstance(json.loads(proc.stdout), dict)
