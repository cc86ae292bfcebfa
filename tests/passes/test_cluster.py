"""cluster pass: k-means weight sharing (passes/cluster.py)."""

from __future__ import annotations

import itertools

import mconv.passes as P
import numpy as np
import pytest
from mconv.edit.weights import CLUSTER_KEY, compression_info
from mconv.errors import InputError
from mconv.passes.cluster import (
    assign_nearest,
    cluster_array,
    kmeans_1d,
    optimal_kmeans_1d,
    optimal_partition,
    value_bins,
)
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


def _quadratic_dp_sse(values: np.ndarray, counts: np.ndarray, k: int) -> float:
    """Least within-cluster sum of squares of sorted weighted values into at most k intervals,
    by the textbook O(k n^2) DP with costs from prefix sums of w, w*x, w*x^2."""
    x, w = values.astype(np.float64), counts.astype(np.float64)
    pw, ps, pq = (np.concatenate([[0.0], np.cumsum(t)]) for t in (w, w * x, w * x * x))
    n = x.size
    a, b = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")  # cluster = items a..b-1
    with np.errstate(divide="ignore", invalid="ignore"):
        cost = pq[b] - pq[a] - (ps[b] - ps[a]) ** 2 / (pw[b] - pw[a])
    cost = np.where(b > a, np.maximum(cost, 0.0), np.inf)
    best = cost[0].copy()
    for _ in range(1, k):
        best = np.minimum(best, np.min(best[:, None] + cost, axis=0))
    return float(best[n])


def _sse(values: np.ndarray, counts: np.ndarray, centroids: np.ndarray) -> float:
    d = values[:, None].astype(np.float64) - np.asarray(centroids, dtype=np.float64)[None, :]
    return float((np.min(d * d, axis=1) * counts).sum())


@pytest.mark.parametrize("seed", range(4))
def test_optimal_partition_matches_quadratic_dp_on_weighted_items(seed):
    rng = np.random.default_rng(seed)
    values = np.sort(rng.choice(rng.standard_t(3, 400), 40, replace=False))
    counts = rng.integers(1, 50, values.size)
    for k in (2, 3, 5, 9):
        bounds = optimal_partition(counts, values * counts, k)
        c = np.add.reduceat(values * counts, bounds[:-1]) / np.add.reduceat(counts, bounds[:-1])
        assert _sse(values, counts, c) == pytest.approx(
            _quadratic_dp_sse(values, counts, k), rel=1e-9, abs=1e-12
        )


def test_bins_of_a_large_float32_tensor_hold_exactly_the_values_in_their_range():
    rng = np.random.default_rng(10)
    x = (rng.standard_t(3, 200_000) * 0.02).astype(np.float32)
    x[:5000] = x[5000:10000]  # repeated values
    bins = value_bins(x)
    assert bins.codes is not None and not bins.exact
    assert np.all(bins.lo <= bins.hi) and np.all(bins.hi[:-1] < bins.lo[1:])  # sorted, disjoint
    s = np.sort(x)
    first, last = np.searchsorted(s, bins.lo, side="left"), np.searchsorted(s, bins.hi, side="right")
    np.testing.assert_array_equal(bins.count, last - first)
    assert bins.count.sum() == x.size
    np.testing.assert_allclose(bins.total, np.add.reduceat(s.astype(np.float64), first), rtol=1e-12)
    # a bin is one float16 ulp wide: 2**-10 of its magnitude at most
    assert np.all(bins.hi - bins.lo <= np.maximum(np.abs(bins.lo), np.abs(bins.hi)) * 2.0**-10)


def test_float16_rounded_weights_get_one_exact_bin_per_distinct_value():
    x = (np.random.default_rng(11).standard_normal(150_000) * 0.05).astype(np.float16).astype(np.float32)
    bins = value_bins(x)
    want, counts = np.unique(x, return_counts=True)
    assert bins.exact
    np.testing.assert_array_equal(bins.mean, want)
    np.testing.assert_array_equal(bins.count, counts)


def test_optimal_on_a_large_tensor_of_few_values_is_the_exact_optimum():
    rng = np.random.default_rng(12)
    x = (rng.integers(1, 300, 120_000) * rng.choice([-1, 1], 120_000) / 64).astype(np.float32)  # no zeros
    out = cluster_array(x, 3, "optimal")
    values, counts = np.unique(x, return_counts=True)
    sse = float(((out.astype(np.float64) - x) ** 2).sum())
    assert sse == pytest.approx(_quadratic_dp_sse(values, counts, 8), rel=1e-9)


@pytest.mark.parametrize("init", ["linear", "density", "kmeans++", "optimal"])
def test_large_tensor_values_sit_at_their_nearest_shared_value(init):
    x = np.random.default_rng(13).laplace(scale=0.01, size=(300, 700)).astype(np.float32)
    out = cluster_array(x, 4, init)
    book = np.unique(out)
    assert book.size <= 16
    nearest = book[np.argmin(np.abs(x.reshape(-1, 1).astype(np.float64) - book[None, :]), axis=1)]
    np.testing.assert_array_equal(out.ravel(), nearest)


def test_large_optimal_is_no_worse_than_scikit_learn_kmeans():
    import sklearn.cluster as sklearn_cluster  # a test dependency (the [test] extra): never skipped

    x = (np.random.default_rng(14).standard_t(3, 150_000) * 0.01).astype(np.float32)
    km = sklearn_cluster.KMeans(8, n_init=3, random_state=0).fit(x.reshape(-1, 1).astype(np.float64))
    sk = float(np.sum(np.min((x[:, None] - km.cluster_centers_.ravel()[None, :]) ** 2, axis=1)))
    ours = float(((cluster_array(x, 3, "optimal").astype(np.float64) - x) ** 2).sum())
    assert ours <= sk * (1 + 1e-6)


def test_large_linear_lloyd_on_bins_matches_lloyd_on_exact_values():
    x = np.random.default_rng(15).standard_normal(200_000).astype(np.float32)
    xd = np.sort(x.astype(np.float64))
    c = np.linspace(xd[0], xd[-1], 16)
    for _ in range(300):  # plain Lloyd on the exact values, the same linear start
        labels = np.searchsorted((c[1:] + c[:-1]) / 2, xd)
        sums, counts = np.bincount(labels, xd, 16), np.bincount(labels, minlength=16)
        new = np.where(counts > 0, sums / np.maximum(counts, 1), c)
        if np.array_equal(new, c):
            break
        c = new
    exact = float(np.min((xd[:, None] - c[None, :]) ** 2, axis=1).sum())
    ours = float(((cluster_array(x, 4, "linear").astype(np.float64) - x) ** 2).sum())
    assert ours == pytest.approx(exact, rel=1e-4)


def test_large_pruned_tensor_keeps_exact_zeros_and_clusters_the_rest():
    rng = np.random.default_rng(16)
    x = rng.standard_normal(200_000).astype(np.float32)
    x[rng.random(x.size) < 0.7] = 0.0
    x[:100][x[:100] == 0] = -0.0
    x[100] = np.float32(1e-42)  # a subnormal that shares the zero bit-pattern bin
    out = cluster_array(x, 3, "optimal")
    np.testing.assert_array_equal(out == 0, x == 0)
    assert not np.signbit(out[x == 0]).any()  # -0.0 becomes +0.0
    assert np.unique(out[out != 0]).size <= 7


@pytest.mark.parametrize("size", [1000, 100_000])
def test_non_finite_weights_are_an_input_error(size):
    x = np.ones(size, dtype=np.float32)
    x[7] = np.nan
    with pytest.raises(InputError, match="inf or nan"):
        cluster_array(x, 4, "linear")
    x[7] = -np.inf
    with pytest.raises(InputError, match="inf or nan"):
        cluster_array(x, 4, "optimal")


def test_kmeans_pp_is_deterministic_for_a_seed_on_a_large_tensor():
    w = np.random.default_rng(17).standard_normal(100_000).astype(np.float32)
    a, b = kmeans_1d(w, 8, "kmeans++", seed=3), kmeans_1d(w, 8, "kmeans++", seed=3)
    assert a.size == 8 and np.array_equal(a, b)


def test_groups_along_axis_1_give_each_column_group_its_own_codebook():
    rng = np.random.default_rng(18)
    w = np.concatenate([rng.normal(0, 1, (50, 4)), rng.normal(10, 1, (50, 4))], axis=1).astype(np.float32)
    out = cluster_array(w, 2, "optimal", groups=2, axis=1)
    assert np.unique(out[:, :4]).size <= 4 and np.unique(out[:, 4:]).size <= 4
    assert set(np.unique(out[:, :4])).isdisjoint(np.unique(out[:, 4:]))


# --- per-block palettes (rule 8) --------------------------------------------------------------


@pytest.mark.parametrize("block", [64, 100])
def test_block_palettes_are_lloyd_per_block_from_the_per_tensor_code(block):
    """Each block (the last one shorter when ``block`` does not divide the size) equals
    :func:`kmeans_1d` run on that block alone (the per-tensor Lloyd on bins), zeros kept with
    one centroid less in a block that holds them."""
    from mconv.passes.cluster import cluster_blocks, kmeans_1d

    rng = np.random.default_rng(21)
    w = (rng.standard_t(4, size=(12, 50)) * 0.1).astype(np.float32)
    w[3, 5:30] = 0  # a block with zeros (and one all but empty of nonzeros is not needed)
    got = cluster_blocks(w, 3, block, init="linear", max_iter=300).reshape(-1)
    flat = w.reshape(-1)
    for lo in range(0, flat.size, block):
        part, out = flat[lo : lo + block], got[lo : lo + block]
        nz = part != 0
        k = 7 if (~nz).any() else 8
        c = kmeans_1d(part[nz], k, "linear", max_iter=300).astype(np.float32)
        mids = (c[1:].astype(np.float64) + c[:-1]) / 2
        want = c[np.searchsorted(mids, part[nz].astype(np.float64), side="left")]
        np.testing.assert_array_equal(out[nz], want)
        assert np.all(out[~nz] == 0)
        assert np.unique(out).size <= 8


def test_block_palettes_codes_and_float16_tensors():
    from mconv.passes.cluster import block_palettes

    rng = np.random.default_rng(22)
    w = (rng.standard_normal((8, 256)) * 0.02).astype(np.float16)
    lut, codes = block_palettes(w, 4, 128)
    assert lut.shape == (16, 16) and lut.dtype == np.float16 and codes.dtype == np.uint8
    back = lut[np.arange(w.size) // 128, codes.reshape(-1)].reshape(w.shape)
    x = w.astype(np.float64)
    snr = 10 * np.log10((x**2).sum() / ((x - back) ** 2).sum())
    assert 18 < snr < 40  # 16 values per 128: better than one palette per tensor (~20 dB), not lossless
    # the nearest centroid of its own block (brute force; float16 centroids)
    blocks = np.arange(w.size) // 128
    d = np.abs(x.reshape(-1)[:, None] - lut[blocks].astype(np.float64))
    assert np.all(d[np.arange(w.size), codes.reshape(-1)] <= d.min(axis=1) + 1e-3 * np.abs(x).max())


def test_pass_block_option_records_block_and_refuses_groups(build, run_ort):
    rng = np.random.default_rng(23)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    from onnx import helper

    model = build(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="fc")],
        [("x", TensorProto.FLOAT, [1, 64])],
        [("y", TensorProto.FLOAT, [1, 32])],
        [("W", w)],
    )
    model, reports = P.run_pipeline(model, P.parse_spec("cluster(bits=2, block=64)"))
    out = model.graph.initializers["W"].const_value.numpy()
    assert all(np.unique(b).size <= 4 for b in out.reshape(-1, 64))
    assert np.unique(out).size > 4  # not one palette for the whole tensor
    assert compression_info(model)["W"]["block"] == 64 and "groups" not in compression_info(model)["W"]
    assert reports[0].tensors[0]["block"] == 64
    x = rng.standard_normal((1, 64)).astype(np.float32)
    np.testing.assert_allclose(run_ort(model, {"x": x})["y"], x @ out, rtol=1e-5, atol=1e-5)
    for bad in (
        "cluster(bits=2, block=64, groups=2)",
        "cluster(bits=2, block=-1)",
        "cluster(bits=2, block=8, init='kmeans++')",
    ):
        with pytest.raises(InputError):
            P.run_pipeline(model, P.parse_spec(bad))


def test_block_palettes_optimal_init_is_the_exact_optimum_on_short_blocks_and_beats_linear():
    """``init='optimal'``: on blocks of at most 8 k values the DP is exact, so each block's
    squared error equals the per-tensor exact DP (:func:`optimal_partition`) on that block;
    on longer heavy-tailed blocks it beats ``linear``."""
    from mconv.passes.cluster import _segment_means, cluster_blocks, optimal_partition

    rng = np.random.default_rng(24)
    w = (rng.standard_t(4, size=(6, 60)) * 0.1).astype(np.float32)
    got = cluster_blocks(w, 3, 60, init="optimal").astype(np.float64)
    for r in range(6):
        u, cnt = np.unique(w[r].astype(np.float64), return_counts=True)
        c = _segment_means(cnt, u * cnt, optimal_partition(cnt, u * cnt, 8))
        mids = (c[1:] + c[:-1]) / 2
        best = ((w[r] - c[np.searchsorted(mids, w[r].astype(np.float64))]) ** 2).sum()
        assert ((w[r] - got[r]) ** 2).sum() == pytest.approx(best, rel=1e-6)
    big = (rng.standard_t(5, size=(64, 1024)) * 0.02).astype(np.float32)
    err = {i: float(((cluster_blocks(big, 4, 512, init=i) - big) ** 2).sum()) for i in ("linear", "optimal")}
    assert err["optimal"] < 0.8 * err["linear"]


def test_float16_values_bin_in_order_where_numpys_float16_sort_does_not():
    """numpy 2.4's AVX-512 float16 sort misorders on AVX512_ICL CPUs without AVX512-FP16 (this
    test's 19,200 values from 16 came out as 20 bins, out of order, there). The bins must be the
    16 distinct values, ascending, with their counts."""
    rng = np.random.default_rng(16)
    table = np.linspace(-0.06, 0.06, 16).astype(np.float16)
    v = table[rng.integers(0, 16, 19_200)]
    bins = value_bins(v)
    assert bins.exact and bins.lo.tolist() == table.tolist()
    assert bins.count.tolist() == [int(np.sum(v == t)) for t in table]
