"""The budget search with the mixture prior through the CLI on the Caffe LeNet-5 and real MNIST
digits (few digits, one epoch a stage: the flow, not the record)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np


def mconv(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "mconv", *args], capture_output=True, text=True, env=env, timeout=600
    )


def test_prior_pretraining_then_budget_on_lenet(tmp_path, shared):
    caffe = shared / "models" / "caffe"
    files = [caffe / "lenet.prototxt", caffe / "lenet_iter_10000.caffemodel"]
    with np.load(shared / "data" / "mnist5k.npz") as z:
        x, y = z["images"][:, None].astype(np.float32) / 256.0, z["labels"]
    rng = np.random.default_rng(0)
    order = rng.permutation(len(y))
    np.savez(tmp_path / "tune.npz", data=x[order[:300]], labels=y[order[:300]])
    np.savez(tmp_path / "val.npz", data=x[order[300:500]], labels=y[order[300:500]])
    lenet = tmp_path / "lenet.onnx"
    r = mconv("import", *map(str, files), "-o", str(lenet))
    assert r.returncode == 0, r.stderr
    out = tmp_path / "small.onnx"
    r = mconv(
        "optimize", str(lenet), "--recipe", "deep-compression", "--data", str(tmp_path / "tune.npz"),
        "--val-data", str(tmp_path / "val.npz"), "--target-size", "40KB", "--target-of", "bundle",
        "--prior", "gmm", "--epochs", "1", "--engine", "xla", "-o", str(out), "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    budget = json.loads(r.stdout)["budget"]
    stages = [s["stage"] for s in budget["stages"]]
    assert "mixture-prior pre-training" in stages
    assert budget["size"]["bundle"] <= 40 * 1024
    assert budget["split"]["validation"] and budget["split"]["held_out"] == 200
    # the stage's spec goes into the chosen recipe when it was kept
    kept = not next(s for s in budget["stages"] if s["stage"] == "mixture-prior pre-training")["rolled_back"]
    assert ("soft-share" in json.dumps(budget["recipe"])) == kept
    # the bundle holds it: export and count
    bundle = tmp_path / "b"
    r = mconv("export", str(out), "--target", "cpu", "-o", str(bundle))
    assert r.returncode == 0, r.stderr
    assert sum(f.stat().st_size for f in bundle.rglob("*") if f.is_file()) == budget["size"]["bundle"]
