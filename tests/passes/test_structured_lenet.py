"""Structured sparsity on the Caffe LeNet-5: whole filters go, consumers are rewired, and the
rewired model computes what the masked one (those filters and biases zeroed) computes (ORT)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir
from mconv.passes.base import PassContext
from mconv.passes.pipeline import make_spec, run_pipeline, snapshot_model

from tests.passes.conftest import _run_ort


def _lenet(shared: Path) -> ir.Model:
    from mconv.formats import import_model

    caffe = shared / "models" / "caffe"
    return import_model([str(caffe / "lenet.prototxt"), str(caffe / "lenet_iter_10000.caffemodel")])


def _digits(shared: Path, n: int) -> np.ndarray:
    with np.load(shared / "data" / "mnist5k.npz") as z:
        return (z["images"][:n, None].astype(np.float32) / 256.0), z["labels"][:n]


def _w(model: ir.Model, name: str) -> np.ndarray:
    value = model.graph.initializers[name].const_value
    assert value is not None
    return np.array(value.numpy())


def test_structured_prune_removes_filters_and_matches_the_masked_model(shared):
    model = _lenet(shared)
    # channel pruning follows the feature count through Flatten: it needs every dimension known
    model.graph.inputs[0].shape = ir.Shape([1, 1, 28, 28])
    original = snapshot_model(model)
    spec = make_spec("prune", {"op_name": {"conv2": {"structured": "l1", "sparsity": 0.6}}})
    pruned, _ = run_pipeline(model, [make_spec("shape-inference", {}), spec], PassContext(seed=0))
    w0, w1 = _w(original, "conv2.weight"), _w(pruned, "conv2.weight")
    assert w0.shape[0] == 50 and w1.shape[0] == 20  # whole filters removed
    # which filters stayed: each kept row is one of the original's, in order
    kept = [int(np.flatnonzero([np.array_equal(r, o) for o in w0])[0]) for r in w1]
    assert kept == sorted(kept) and len(set(kept)) == 20
    # consumers rewired: the bias sliced, ip1's input features (50 channels x 4 x 4) sliced
    assert _w(pruned, "conv2.bias").shape == (20,)
    assert _w(pruned, "ip1.weight").shape == (500, 20 * 16)
    # the masked model: the same filters zeroed (weights and bias), nothing removed
    masked = snapshot_model(original)
    drop = np.setdiff1d(np.arange(50), kept)
    for name in ("conv2.weight", "conv2.bias"):
        a = _w(masked, name)
        a[drop] = 0.0
        masked.graph.initializers[name].const_value = ir.tensor(a, name=name)
    x, labels = _digits(shared, 100)
    got = np.concatenate([_run_ort(pruned, {"data": x[i : i + 1]})["prob"] for i in range(len(x))])
    want = np.concatenate([_run_ort(masked, {"data": x[i : i + 1]})["prob"] for i in range(len(x))])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # and the filters chosen were the least used: the masked model still reads digits
    assert np.mean(got.argmax(1) == labels) > 0.5
