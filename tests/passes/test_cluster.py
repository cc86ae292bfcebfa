"""cluster pass: k-means weight sharing (passes/cluster.py)."""

from __future__ import annotations

import itertools

import mconv.passes as P
import numpy as np
import pytest
from mconv.passes._weights import CLUSTER_KEY, compression_info
from mconv.passes.cluster import assign_nearest, cluster_array, kmeans_1d, optimal_kmeans_1d
from onnx import TensorProto


def _brute_force_sse(values: np.ndarray, k: int) -> float:
    """Smallest within-cluster sum of squares over EVERY labelling of the points (k**n)."""
    best = np.inf
    for labels in itertools.product(range(k), repeat=values.size):
        labels = np.array(labels)
        sse = 0.0
        for c in range(k):
            members = values[labels == c]
            if members.size:
                sse += float(((members - members.mean()) ** 2).sum())
        best = min(best, sse)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_optimal_dp_matches_exhaustive_search_on_tiny_inputs(seed):
    rng = np.random.default_rng(seed)
    values = np.round(rng.standard_normal(7), 2)
    for k in (2, 3):
        u, counts = np.unique(values, return_counts=True)
        centroids = optimal_kmeans_1d(u, counts, k)
        labels = np.argmin(np.abs(values[:, None] - centroids[None, :]), axis=1)
        sse = sum(float(((values[labels == c] - centroids[c]) ** 2).sum()) for c in range(centroids.size))
        assert sse == pytest.approx(_brute_force_sse(values, k), abs=1e-9)


def test_optimal_dp_weights_duplicate_values_by_count():
    # 0.0 x100 and 1.0, 2.0 once each: with k=2 the best split isolates the heavy value.
    centroids = optimal_kmeans_1d(np.array([0.0, 1.0, 2.0]), np.array([100, 1, 1]), 2)
    np.testing.assert_allclose(centroids, [0.0, 1.5])


@pytest.mark.parametrize("init", ["linear", "density", "kmeans++", "optimal"])
def test_each_init_gives_at_most_2_to_bits_distinct_values_and_keeps_zeros(init):
    rng = np.random.default_rng(1)
    w = rng.laplace(size=(16, 40)).astype(np.float32)
    w[rng.random(w.shape) < 0.6] = 0.0
    out = cluster_array(w, 3, init)
    assert np.array_equal(out == 0, w == 0)  # zeros stay zeros, nothing else becomes zero
    assert np.unique(out[out != 0]).size <= 2**3
    # every weight sits at its nearest shared value
    book = np.unique(out[out != 0])
    nearest = book[np.argmin(np.abs(w[w != 0][:, None] - book[None, :]), axis=1)]
    np.testing.assert_array_equal(out[w != 0], nearest)


def test_zero_plus_centroids_fit_the_bits_of_a_pruned_tensor():
    w = np.random.default_rng(2).standard_normal((64, 64)).astype(np.float32)
    w[::2] = 0.0
    out = cluster_array(w, 2, "linear")
    assert np.unique(out).size <= 4  # 3 nonzero centroids + the zero


def test_mse_decreases_as_bits_grow():
    w = np.random.default_rng(3).standard_normal(5000).astype(np.float32)
    mses = [float(np.mean((cluster_array(w, b, "linear") - w) ** 2)) for b in range(1, 7)]
    assert all(a > b for a, b in zip(mses, mses[1:]))


def test_optimal_is_no_worse_than_lloyd_from_linear_init():
    w = np.random.default_rng(4).standard_normal(3000).astype(np.float32)
    mse = {i: float(np.mean((cluster_array(w, 3, i) - w) ** 2)) for i in ("linear", "optimal")}
    assert mse["optimal"] <= mse["linear"] * (1 + 1e-6)


def test_kmeans_pp_is_deterministic_for_a_seed():
    w = np.random.default_rng(5).standard_normal(2000)
    assert np.array_equal(kmeans_1d(w, 8, "kmeans++", seed=3), kmeans_1d(w, 8, "kmeans++", seed=3))


def test_lookup_table_assignment_equals_binary_search_on_large_inputs():
    x = np.random.default_rng(6).laplace(size=300_000).astype(np.float32)
    c = np.sort(np.random.default_rng(7).standard_normal(31))
    mids = ((c[1:] + c[:-1]) / 2).astype(np.float32)
    np.testing.assert_array_equal(assign_nearest(x, c), np.searchsorted(mids, x, side="left"))


def test_groups_give_each_channel_group_its_own_codebook():
    rng = np.random.default_rng(8)
    w = np.concatenate([rng.normal(0, 1, (4, 50)), rng.normal(10, 1, (4, 50))]).astype(np.float32)
    out = cluster_array(w, 2, "linear", groups=2, axis=0)
    assert np.unique(out[:4]).size <= 4 and np.unique(out[4:]).size <= 4
    assert set(np.unique(out[:4])).isdisjoint(np.unique(out[4:]))


def test_pass_records_metadata_and_overrides_by_op_type(build, run_ort):
    rng = np.random.default_rng(9)
    w1 = rng.standard_normal((4, 2, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((64, 6)).astype(np.float32)
    from onnx import helper

    model = build(
        [
            helper.make_node("Conv", ["x", "W1"], ["c"], name="conv"),
            helper.make_node("Flatten", ["c"], ["f"], name="flat"),
            helper.make_node("MatMul", ["f", "W2"], ["y"], name="fc"),
        ],
        [("x", TensorProto.FLOAT, [1, 2, 6, 6])],
        [("y", TensorProto.FLOAT, [1, 6])],
        [("W1", w1), ("W2", w2)],
    )
    model, reports = P.run_pipeline(model, P.parse_spec("cluster(bits=2,op_type={'Conv': {'bits': 4}})"))
    g = model.graph.initializers
    assert np.unique(g["W1"].const_value.numpy()).size <= 16
    assert np.unique(g["W2"].const_value.numpy()).size <= 4
    assert '"bits": 4' in g["W1"].metadata_props[CLUSTER_KEY]
    assert compression_info(model)["W2"]["bits"] == 2
    rows = {t["name"]: t for t in reports[0].tensors}
    assert rows["W2"]["codebook_size"] <= 4 and rows["W2"]["snr_db"] > 0
    x = rng.standard_normal((1, 2, 6, 6)).astype(np.float32)
    assert run_ort(model, {"x": x})["y"].shape == (1, 6)  # still a plain, runnable ONNX model


def test_fp16_histogram_matches_numpy_float16_rounding():
    from mconv.passes.cluster import _fp16_histogram

    rng = np.random.default_rng(7)
    s = np.sort(
        np.concatenate([rng.standard_t(3, 200_000) * 0.02, [0.0, -0.0, 1e-9, 70000.0]]).astype(np.float32)
    )
    values, counts = _fp16_histogram(s)
    with np.errstate(over="ignore"):
        h = s.astype(np.float16)
    h = h[np.isfinite(h)].astype(np.float64)  # 70000 overflows float16: numpy gives inf
    want_values, want_counts = np.unique(h, return_counts=True)
    n = want_values.size
    np.testing.assert_array_equal(values[:n], want_values)
    np.testing.assert_array_equal(counts[:n], want_counts)
