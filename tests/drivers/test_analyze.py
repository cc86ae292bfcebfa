"""mconv analyze: per-layer sensitivity sweeps and the recipe they suggest."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from mconv.drivers.analyze import analyze_sensitivity, sparkline, write_recipe
from mconv.errors import InputError
from mconv.irio import from_proto
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(11)
SWEEP = (0.3, 0.5, 0.7, 0.9)


def tiny_proto(w1: np.ndarray, w2: np.ndarray) -> onnx.ModelProto:
    """x[N,8] -> fc1 (Gemm 16x8) -> Relu -> fc2 (Gemm 4x16) -> logits[N,4]."""
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1", transB=1),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["logits"], name="fc2", transB=1),
    ]
    inits = [
        numpy_helper.from_array(w1, "w1"),
        numpy_helper.from_array(np.full(16, 0.1, np.float32), "b1"),
        numpy_helper.from_array(w2, "w2"),
        numpy_helper.from_array(np.zeros(4, np.float32), "b2"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 4])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


W1 = RNG.standard_normal((16, 8)).astype(np.float32)
W2 = RNG.standard_normal((4, 16)).astype(np.float32)
X = RNG.standard_normal((300, 8)).astype(np.float32)


def ort_logits(w1: np.ndarray, w2: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(tiny_proto(w1, w2).SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": X})[0]


def noisy_labels() -> np.ndarray:
    """The model's own classes with a quarter of them replaced: a baseline accuracy below 1."""
    labels = ort_logits(W1, W2).argmax(1)
    flip = RNG.random(len(labels)) < 0.25
    labels[flip] = RNG.integers(0, 4, int(flip.sum()))
    return labels.astype(np.int64)


LABELS = noisy_labels()


def hand_pruned(w: np.ndarray, sparsity: float) -> np.ndarray:
    out = w.copy().ravel()
    out[np.argsort(np.abs(out), kind="stable")[: int(round(sparsity * out.size))]] = 0
    return out.reshape(w.shape)


@pytest.fixture(scope="module")
def report():
    model = from_proto(tiny_proto(W1, W2))
    return analyze_sensitivity(model, {"x": X, "labels": LABELS}, sweep=SWEEP, bits=(4, 2), max_drop=0.03)


def test_sweep_at_sparsity_zero_equals_the_baseline_from_onnxruntime(report):
    expected = float(np.mean(ort_logits(W1, W2).argmax(1) == LABELS))
    assert 0.5 < expected < 1.0
    assert report.metric == "accuracy"
    assert report.baseline == pytest.approx(expected, abs=1e-12)
    for layer in report.layers:
        (zero,) = [p for p in layer.sweep if p.sparsity == 0.0 and p.bits is None]
        assert zero.metric == pytest.approx(expected, abs=1e-12) and zero.drop == pytest.approx(
            0.0, abs=1e-12
        )


def test_each_sweep_point_matches_onnxruntime_on_hand_pruned_weights(report):
    fc1, fc2 = report.layers
    assert (fc1.name, fc1.op_type, fc1.params, fc2.name, fc2.params) == ("fc1", "Gemm", 128, "fc2", 64)
    for s in SWEEP:
        for layer, logits in (
            (fc1, ort_logits(hand_pruned(W1, s), W2)),
            (fc2, ort_logits(W1, hand_pruned(W2, s))),
        ):
            (point,) = [p for p in layer.sweep if p.sparsity == s and p.bits is None]
            assert point.metric == pytest.approx(float(np.mean(logits.argmax(1) == LABELS)), abs=1e-12)


def test_written_recipe_loads_with_the_most_aggressive_settings_within_budget(report, tmp_path):
    from mconv import passes as P

    path = write_recipe(report, tmp_path / "recipe.toml")
    specs = P.load_recipe(path)
    assert [s.name for s in specs] == ["prune", "finetune", "cluster", "finetune"] or [
        s.name for s in specs
    ] == ["prune", "finetune"]
    prune = specs[0]
    cluster = next((s for s in specs if s.name == "cluster"), None)
    budget = report.max_drop
    for layer in report.layers:
        plain = {p.sparsity: p.drop for p in layer.sweep if p.bits is None}
        # the sweep table read by hand: the largest sparsity within the budget
        best = max(s for s, d in plain.items() if d <= budget + 1e-12)
        assert all(d > budget for s, d in plain.items() if s > best)
        got = prune.op_name.get(layer.name, {}).get("sparsity", prune.config.get("sparsity"))
        assert got == pytest.approx(best)
        at_best = {p.bits: p.drop for p in layer.sweep if p.bits is not None and p.sparsity == best}
        ok_bits = [b for b, d in at_best.items() if d <= budget + 1e-12]
        if not ok_bits:
            assert cluster is None or layer.name not in cluster.op_name
            continue
        assert cluster is not None
        override = cluster.op_name[layer.name]
        assert override == {"skip": False, "bits": min(ok_bits)}
    if cluster is not None:
        assert cluster.config.get("skip") is True  # layers without an override stay unclustered


def test_json_output_has_the_stable_keys(tmp_path):
    model = tmp_path / "tiny.onnx"
    onnx.save(tiny_proto(W1, W2), model)
    data = tmp_path / "data.npz"
    np.savez(data, x=X[:64])
    env = {**os.environ, "COLUMNS": "200"}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "mconv",
            "analyze",
            str(model),
            "--data",
            str(data),
            "--sweep",
            "0.5,0.9",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["baseline"] == 1.0 and doc["metric"] == "top1_agreement"  # no labels: vs the original
    (layer, _) = doc["layers"]
    assert {"name", "op_type", "params", "sweep"} <= set(layer)
    assert [p["sparsity"] for p in layer["sweep"]] == [0.0, 0.5, 0.9]
    assert {"sparsity", "metric", "drop"} <= set(layer["sweep"][0])


def test_cli_recipe_runs_in_mconv_optimize(tmp_path):
    model = tmp_path / "tiny.onnx"
    onnx.save(tiny_proto(W1, W2), model)
    data = tmp_path / "data.npz"
    np.savez(data, x=X, labels=LABELS)
    recipe = tmp_path / "recipe.toml"
    env = {**os.environ, "COLUMNS": "200"}

    def mconv(*args):
        return subprocess.run(
            [sys.executable, "-m", "mconv", *args], capture_output=True, text=True, env=env, timeout=120
        )

    res = mconv(
        "analyze", str(model), "--data", str(data), "--bits", "4", "--max-drop", "0.05", "-o", str(recipe)
    )
    assert res.returncode == 0, res.stderr
    assert "fc1" in res.stderr and recipe.is_file()  # the table went to stderr
    res = mconv("optimize", str(model), "--recipe", str(recipe), "-o", str(tmp_path / "out.onnx"), "--json")
    assert res.returncode == 0, res.stderr
    names = [p["name"] for p in json.loads(res.stdout)["passes"]]
    assert names[0] == "prune" and "finetune" in names


def test_sparkline_scales_between_low_and_high():
    assert sparkline([0.0, 0.5, 1.0]) == "▁▅█"
    assert sparkline([0.9, 0.9], 0.0, 0.9) == "██"


def test_budget_that_is_not_a_fraction_is_an_input_error():
    model = from_proto(tiny_proto(W1, W2))
    with pytest.raises(InputError, match="fraction"):
        analyze_sensitivity(model, {"x": X}, max_drop=5.0)


def test_data_without_the_model_input_is_an_input_error():
    model = from_proto(tiny_proto(W1, W2))
    with pytest.raises(InputError, match="'x'|x"):
        analyze_sensitivity(model, {"images": X})
