"""soft-share: the mixture prior pulls the weights to its components (the digits MLP, real digits)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir
from mconv.irio import load_onnx
from mconv.passes.base import PassContext
from mconv.passes.pipeline import make_spec, run_pipeline, snapshot_model
from mconv.passes.soft_share import MixturePrior, SoftShare, initial_prior, soft_share

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def _digits(name: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / f"{name}.npz") as z:
        x = z["images"].reshape(len(z["images"]), -1).astype(np.float32) / 16.0
        return {"input": x, "labels": z["labels"].astype(np.int64)}


def _mlp() -> ir.Model:
    return load_onnx(FIXTURES / "digits_mlp.onnx")


def _accuracy(model: ir.Model, data: dict[str, np.ndarray]) -> float:
    from mconv.engines.xla.engine import XlaEngine

    engine = XlaEngine(model)
    out = engine.run({"input": data["input"]})
    scores = next(iter(out.values()))
    return float(np.mean(scores.argmax(1) == data["labels"]))


def _weight(model: ir.Model, name: str) -> np.ndarray:
    value = model.graph.initializers[name].const_value
    assert value is not None
    return np.asarray(value.numpy())


def _distance_to_components(w: np.ndarray, means: np.ndarray) -> float:
    """Mean distance of the weights to the nearest of ``means``."""
    return float(np.mean(np.min(np.abs(w.reshape(-1, 1) - means[None, :]), axis=1)))


def test_mixture_prior_pulls_weights_to_its_components():
    train, test = _digits("digits_train"), _digits("digits_test")
    model = _mlp()
    names = ("fc1.weight", "fc2.weight", "fc3.weight")
    before = {n: _weight(model, n) for n in names}
    cfg = SoftShare.Config(epochs=20, tau=0.5, components=8, sparsity=0.8, quantize=False, seed=0)
    out = soft_share(model, train, cfg, reference=snapshot_model(_mlp()), seed=0)
    priors: dict[str, MixturePrior] = out["priors"]
    after = {n: _weight(model, n) for n in names}
    for name in names:
        means = priors[name].means
        assert means[0] == 0.0 and len(means) <= 9
        # the learned components measure both: the retrained weights sit on them, the
        # original ones do not
        d0 = _distance_to_components(before[name], means)
        d1 = _distance_to_components(after[name], means)
        assert d1 < 0.35 * d0, (name, d0, d1)
        # the zero component holds most of them
        assert np.mean(np.abs(after[name]) < 1e-3) > 2 * np.mean(np.abs(before[name]) < 1e-3)
    assert _accuracy(model, test) >= _accuracy(_mlp(), test) - 0.1


def test_pass_quantizes_to_the_mixture_means_and_records_clustering():
    train, test = _digits("digits_train"), _digits("digits_test")
    model = _mlp()
    ctx = PassContext(data=train, seed=0)
    specs = [
        make_spec("soft-share", {"epochs": 20, "components": 8, "tau": 0.5, "sparsity": 0.8}),
        # centroid fine-tuning: the clustering the pass recorded keeps each layer's codebook
        make_spec("finetune", {"epochs": 10, "lr": 1e-3, "holdout": 0.0, "engine": "xla"}),
    ]
    model, reports = run_pipeline(model, specs, ctx)
    report = reports[0]
    kept = []
    for t in report.tensors:
        w = _weight(model, t["name"])
        nz = w[w != 0]
        kept.append(nz.size / w.size)
        assert t["distinct"] == np.unique(nz).size <= 8  # each layer's codebook: its mixture's means
    assert max(kept) < 0.5  # the zero component pruned most weights
    # no reference model: cross-entropy on the labels; with its centroids retrained the
    # quantized model (over 80% zeros, 8 values a layer, after 20 epochs) still classifies
    # the unseen digits (0.81 against the original's 0.98; 0.49 before the centroid training)
    assert _accuracy(model, test) >= 0.75
    # the finetune pass sees the layers as clustered (centroid mode): metadata recorded
    assert "mconv.cluster" in model.graph.initializers["fc1.weight"].metadata_props


def test_initial_prior_spreads_means_over_the_range_with_zero_first():
    w = np.linspace(-1.0, 2.0, 101).astype(np.float32)
    p = initial_prior([w], 6, 0.99, 0.05, sparsity=0.5)
    assert p.means[0] == 0.0 and p.mixing[0] == 0.99
    assert np.isclose(p.mixing.sum(), 1.0)
    t = np.quantile(np.abs(w[w != 0]), 0.5)
    # the nonzero means lie outside the zero component's share, spread over the range
    assert np.all(np.abs(p.means[1:]) >= t - 1e-6) and p.means[1:].min() >= -1.0 and p.means[1:].max() <= 2.0
    # the sides share the means by their lengths outside t (about 0.25 and 1.25): 1 and 5
    assert np.sum(p.means[1:] < 0) == 1 and np.sum(p.means[1:] > 0) == 5
    q = p.quantize(np.array([0.001, p.means[2] + 1e-3], np.float32))
    assert q[0] == 0.0 and np.isclose(q[1], p.means[2])


def test_three_ratios_of_a_compressed_model_and_its_bundle(tmp_path):
    import mconv
    from mconv.drivers.budget.ratios import three_ratios

    original = _mlp()
    model = snapshot_model(original)
    ctx = PassContext(seed=0)
    model, _ = run_pipeline(
        model, [make_spec("prune", {"sparsity": 0.9}), make_spec("cluster", {"bits": 4})], ctx
    )
    mconv.export(model, "cpu", tmp_path / "b")
    source = (FIXTURES / "digits_mlp.onnx").stat().st_size
    r = three_ratios(original, model, source, tmp_path / "b")
    # counted independently: the fixture's six tensors, weights 90% zero, biases dense
    assert r["parameters"] == 64 * 300 + 300 + 300 * 100 + 100 + 100 * 10 + 10
    weights = 64 * 300 + 300 * 100 + 100 * 10
    kept = sum(int(np.count_nonzero(_weight(model, n))) for n in ("fc1.weight", "fc2.weight", "fc3.weight"))
    assert abs(kept - 0.1 * weights) <= 30  # 10% of each layer kept (k-means may zero a few more)
    biases = sum(int(np.count_nonzero(_weight(original, n))) for n in ("fc1.bias", "fc2.bias", "fc3.bias"))
    assert r["nonzero_parameters"] == kept + biases
    assert r["ratio_nonzero"] == round(r["parameters"] / r["nonzero_parameters"], 2) and weights > 0
    files = sorted(p for p in (tmp_path / "b").rglob("*") if p.is_file())
    assert r["bundle_bytes"] == sum(p.stat().st_size for p in files)
    assert r["weights_mcw_bytes"] == (tmp_path / "b" / "weights.mcw").stat().st_size < r["bundle_bytes"]
    assert r["ratio_bundle"] < r["ratio_weights_mcw"]
    assert r["ratio_weights_mcw"] == round(source / r["weights_mcw_bytes"], 2)
