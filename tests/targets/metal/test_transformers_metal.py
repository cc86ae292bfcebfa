"""Transformers and data-dependent ops on the metal target (C++ harness), against ONNX Runtime
and the reference executor.

A BERT-style encoder and a Llama-style decoder (vocabulary 3000) exported by torch: token
embeddings are Gathers with indices from the input; ids beyond 2^11 are not exact in half
storage, so such a graph is planned in float storage (the plan's rule 6) and must agree to
float precision. Small graphs: Gather with runtime (negative, out-of-range) indices, IsNaN,
IsInf, Clip with input bounds, an If whose condition comes from the input. Every comparison
bounds cosine AND the max error relative to the output's scale.
"""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
from mconv.errors import UnsupportedError
from mconv.irio import load_onnx
from mconv.targets.metal import TARGET
from mconv.targets.reference import ReferenceRunner
from metal_models import needs_cxx
from transformer_models import (
    VOCAB,
    close,
    data_if_model,
    embedding_model,
    export_transformers,
    special_values_model,
    transformer_feeds,
)

pytestmark = needs_cxx


@pytest.fixture(scope="module")
def transformers(tmp_path_factory):
    return export_transformers(tmp_path_factory.mktemp("transformers"))


@pytest.mark.parametrize("name", ["bert", "llama"])
def test_torch_transformer_runs_on_metal_in_float_storage_and_matches_ort(transformers, name, tmp_path):
    path = transformers[name]
    feeds = transformer_feeds(name)
    session = ort.InferenceSession(str(path))
    expected = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    bundle = TARGET.export(load_onnx(path), tmp_path / "bundle", {"precision": "fp16"})
    plan = json.loads((bundle.root / "metal_plan.json").read_text())
    assert plan["dtype"] == "float"  # ids up to 2999 would not be exact in half
    assert any("Gather" in n and str(VOCAB) in n for n in plan["notes"])
    assert any(layer["op"] == "Gather" and len(layer["bindings"]) == 3 for layer in plan["layers"])
    got = TARGET.load(bundle).run(feeds)
    assert set(got) == set(expected)
    for out, ref in expected.items():
        close(ref, got[out], 1e-4)


def test_gather_of_runtime_ids_beyond_half_is_exact_and_bounded(tmp_path):
    model, table = embedding_model(VOCAB)
    ids = np.array([[2999, 2049, -1, 0, 2047], [3000, -3001, 2048, 7, -3000]], np.int64)
    bundle = TARGET.export(model, tmp_path / "b", {"precision": "fp16"})
    y = TARGET.load(bundle).run({"ids": ids})["y"]
    assert json.loads((bundle.root / "metal_plan.json").read_text())["dtype"] == "float"
    np.testing.assert_array_equal(y[0], table[[2999, 2049, VOCAB - 1, 0, 2047]])
    np.testing.assert_array_equal(y[1, 2:], table[[2048, 7, 0]])
    np.testing.assert_array_equal(y[1, :2], 0)  # out of range: zeros, never a read outside the table


def test_gather_of_runtime_ids_within_half_keeps_half_storage(tmp_path):
    model, table = embedding_model(2048)
    ids = np.array([[2047, 0, -1, 1000, 5], [1, 2, 3, 2046, -2048]], np.int64)
    bundle = TARGET.export(model, tmp_path / "b", {"precision": "fp16"})
    plan = json.loads((bundle.root / "metal_plan.json").read_text())
    assert plan["dtype"] == "half" and "notes" not in plan
    y = TARGET.load(bundle).run({"ids": ids})["y"]
    np.testing.assert_array_equal(y, table.astype(np.float16).astype(np.float32)[ids])


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_isnan_isinf_and_clip_with_input_bounds(precision, tmp_path):
    model = special_values_model()
    x = np.array([[np.nan, np.inf, -np.inf, 0.0], [1, -2, 3, 600], [-0.5, 0.25, 5, -7]], np.float32)
    feeds = {"x": x, "lo": np.float32(-1.5), "hi": np.float32(2.0)}
    expected = ReferenceRunner(model).run(feeds)
    got = TARGET.load(TARGET.export(model, tmp_path / "b", {"precision": precision})).run(feeds)
    for name in ("nan", "inf", "pinf"):
        np.testing.assert_array_equal(got[name], expected[name])
    for name in ("clipped", "clipped_hi"):  # NaN stays NaN, -inf only clipped from below
        np.testing.assert_array_equal(np.isnan(got[name]), np.isnan(expected[name]))
        np.testing.assert_array_equal(np.nan_to_num(got[name]), np.nan_to_num(expected[name]))
    feeds["lo"], feeds["hi"] = np.float32(0.0), np.float32(0.5)  # bounds are read at run time
    again = TARGET.load(TARGET.export(model, tmp_path / "c", {"precision": precision})).run(feeds)
    np.testing.assert_array_equal(np.nan_to_num(again["clipped"]), np.nan_to_num(np.clip(x, 0, 0.5)))


def test_if_from_input_runs_both_branches_and_selects(tmp_path):
    model = data_if_model()
    runner = TARGET.load(bundle := TARGET.export(model, tmp_path / "b", {"precision": "fp32"}))
    ops = [layer["op"] for layer in json.loads((bundle.root / "metal_plan.json").read_text())["layers"]]
    assert "Where" in ops
    rng = np.random.default_rng(0)
    for sign in (1.0, -1.0):  # each branch taken once
        x = (np.abs(rng.standard_normal((2, 6))) * sign).astype(np.float32)
        close(ReferenceRunner(model).run({"x": x})["p"], runner.run({"x": x})["p"], 1e-5)


def test_if_from_input_with_a_costly_branch_is_refused_naming_the_input(tmp_path):
    with pytest.raises(UnsupportedError) as info:
        TARGET.export(data_if_model(big_branch=True), tmp_path / "b", {"precision": "fp32"})
    assert "condition from input x" in str(info.value.items) and "--input-value" in (info.value.hint or "")
