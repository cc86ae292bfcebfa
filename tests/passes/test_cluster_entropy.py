"""cluster pass, method="entropy": entropy-constrained scalar quantization (passes/cluster.py rule 10)
on the Caffe LeNet-5's own weights, bytes measured as export codes them (codecs/choose.py)."""

from __future__ import annotations

from pathlib import Path

import mconv.passes as P
import numpy as np
import onnx_ir as ir
import pytest
from mconv.codecs.choose import best_spec
from mconv.errors import InputError
from mconv.passes.cluster import _distinct_bins, cluster_array, ecsq_bins, kmeans_1d
from mconv.passes.prune import magnitude_mask

from tests.passes.test_structured_lenet import _digits, _lenet, _w


def _coded(a: np.ndarray, bits: int) -> int:
    """The bytes export writes for ``a`` (float16 values, palette of ``bits`` or sparse codec)."""
    return int(best_spec(a.astype(np.float16).astype(np.float32), {"bits": bits, "pruned": True})[1])


def _pruned_ip1(shared: Path) -> np.ndarray:
    w = _w(_lenet(shared), "ip1.weight")
    keep, _ = magnitude_mask(w, 0.9)
    return np.where(keep, w, np.float32(0))


def _mse(a: np.ndarray, w: np.ndarray) -> float:
    return float(np.mean(np.square(a.astype(np.float64) - w)))


def test_lam_zero_loop_is_lloyds_fixed_point_and_the_pass_equals_kmeans(shared):
    w = _w(_lenet(shared), "conv2.weight")  # 25,000 weights: exact bins
    bins = _distinct_bins(w.ravel())
    c0 = kmeans_1d(w, 16)
    c, labels = ecsq_bins(bins, c0, 0.0)
    np.testing.assert_allclose(c, c0, rtol=0, atol=1e-7)
    # each bin at its nearest centroid
    nearest = np.argmin(np.abs(bins.mean[:, None] - c[None, :]), axis=1)
    assert np.array_equal(labels, nearest)
    np.testing.assert_array_equal(cluster_array(w, 4, lam=0.0), cluster_array(w, 4))


def test_ecsq_codes_smaller_than_kmeans_at_comparable_error_on_lenet_ip1(shared):
    w = _pruned_ip1(shared)  # 400,000 weights, 90% pruned: the budget's typical input
    plain = {b: cluster_array(w, b) for b in (3, 4, 5)}
    # ECSQ with one or two bits more room, lam chosen on the data: at no more coded bytes than
    # plain k-means it leaves clearly less error (the rate-distortion frontier moved)
    for b in (3,):
        limit = _coded(plain[b], b)
        errors = [
            _mse(a, w)
            for cap in (b + 1, b + 2)
            for lam in (0.0003, 0.001, 0.002, 0.003)
            for a in [cluster_array(w, cap, lam=lam)]
            if _coded(a, cap) <= limit
        ]
        assert min(errors) < 0.8 * _mse(plain[b], w)
    # at equal bits, a larger lam: fewer clusters, fewer coded bytes, more error
    a1, a2 = cluster_array(w, 5, lam=0.001), cluster_array(w, 5, lam=0.01)
    assert np.unique(a2).size < np.unique(a1).size <= 32
    assert _coded(a2, 5) < _coded(a1, 5) < _coded(plain[5], 5)
    assert _mse(plain[5], w) < _mse(a1, w) < _mse(a2, w)
    assert np.array_equal(a1 == 0, w == 0)  # the pruning mask survives (rule 1)


def test_entropy_method_through_the_pass_keeps_lenet_accurate_and_refuses_block(shared):
    model = _lenet(shared)
    x, y = _digits(shared, 300)
    from mconv.engines.reference.executor import Executor

    def accuracy(m: ir.Model) -> float:
        ex = Executor(m)
        out = ex.run({m.graph.inputs[0].name: x})
        return float(np.mean(next(iter(out.values())).argmax(1) == y))

    before = accuracy(model)
    out, reports = P.run_pipeline(model, P.parse_spec("cluster(bits=5,method='entropy',lam=0.05)"))
    rows = {t["name"]: t for t in reports[0].tensors}
    assert rows["ip1.weight"]["method"] == "entropy" and rows["ip1.weight"]["codebook_size"] <= 32
    assert accuracy(out) >= before - 0.02
    with pytest.raises(InputError, match="block"):
        P.run_pipeline(_lenet(shared), P.parse_spec("cluster(bits=4,block=32,method='entropy',lam=0.1)"))
