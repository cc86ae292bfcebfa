"""The deep-compression recipe end to end through the CLI: optimize, export, inspect, verify."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[2]


def mconv(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "mconv", *args], capture_output=True, text=True, env=env, timeout=300
    )


def _cnn(path: Path) -> Path:
    rng = np.random.default_rng(0)
    inits = {
        "w1": rng.laplace(size=(16, 1, 3, 3)).astype(np.float32) * 0.3,
        "b1": rng.standard_normal(16).astype(np.float32) * 0.1,
        "fc": rng.laplace(size=(10, 16 * 8 * 8)).astype(np.float32) * 0.05,
        "fcb": rng.standard_normal(10).astype(np.float32) * 0.1,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu1"),
        helper.make_node("Flatten", ["r"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 10])],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_deep_compression_recipe_optimizes_exports_inspects_and_verifies(tmp_path):
    src = _cnn(tmp_path / "cnn.onnx")
    opt = tmp_path / "dc.onnx"
    r = mconv("optimize", str(src), "--recipe", "deep-compression", "-o", str(opt), "--json", "--force")
    assert r.returncode == 0, r.stderr
    reports = {p["name"]: p for p in json.loads(r.stdout)["passes"]}
    kept = {t["name"]: t["kept"] for t in reports["prune"]["tensors"]}
    assert kept == {"w1": 55 / 144, "fc": 0.1}  # conv keeps 38%: round(0.62 * 144) = 89 pruned; fc 10%
    model = onnx.load(opt)
    weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert np.unique(weights["fc"][weights["fc"] != 0]).size <= 31  # 5 bits: zero + 31 centroids

    bundle = tmp_path / "bundle"
    r = mconv("export", str(opt), "--target", "cpu", "-o", str(bundle), "--json")
    assert r.returncode == 0, r.stderr
    account = json.loads(r.stdout)["account"]
    rows = {row["name"]: row for row in account["layers"]}
    assert rows["fc"]["codec"].startswith(("sparse", "palette"))
    assert abs(rows["fc"]["kept"] - 0.1) < 1e-9
    assert rows["fc"]["bytes"] == rows["fc"]["predicted_bytes"]
    assert rows["fc"]["bytes"] < rows["fc"]["original_bytes"] / 10
    # the manifest's blob sizes are the real ones: the container holds exactly these bytes
    assert account["total"]["bytes"] <= (bundle / "weights.mcw").stat().st_size

    r = mconv("inspect", str(bundle))
    assert r.returncode == 0, r.stderr
    assert "weight storage" in r.stderr + r.stdout and "fc" in r.stderr + r.stdout

    r = mconv("verify", str(opt), str(bundle), "--min-cosine", "0.999999", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["passed"] is True
