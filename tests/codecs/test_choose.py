"""choose_spec picks the smallest encoding; predict_bytes equals the encoder's real size."""

from __future__ import annotations

import numpy as np
from mconv.codecs import choose_spec, decode, encode, predict_bytes


def pruned_clustered(shape, density, bits, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # 2**bits - 1 nonzero centroids: zero (pruned weights and sparse fillers) takes the last slot
    centroids = np.linspace(-1, 1, 1 << bits).astype(np.float32)[1:]
    assert np.all(centroids != 0)
    w = centroids[rng.integers(0, centroids.size, shape)]
    w[rng.random(shape) >= density] = 0
    return w


def entropy_bits(symbols: np.ndarray) -> float:
    p = np.unique(symbols, return_counts=True)[1] / symbols.size
    return float(-(p * np.log2(p)).sum() * symbols.size)


def test_sparse_palette_huffman_is_below_the_fixed_width_and_entropy_bounds():
    # 90 % sparse, 5-bit clusters, 4-bit gaps. Fixed width costs (5 + 4) bits per entry; the
    # entries (fillers included) and their entropies are re-derived here from the paper's rule.
    w = pruned_clustered((1000, 1000), 0.1, 5)
    spec = {"codec": "sparse", "index_bits": 4, "values": "palette", "bits": 5, "huffman": True}
    blob, record = encode(w, spec)
    positions = np.flatnonzero(w.ravel())
    gaps = np.diff(positions, prepend=-1) - 1
    n_fillers = int((gaps // 16).sum())
    entries = positions.size + n_fillers
    assert (record["nonzeros"], record["entries"]) == (positions.size, entries)
    overhead = 2 * (16 + 32 + 4 * (-(-entries // 8192))) + 32 * 4  # headers, tables, codebook
    assert len(blob) <= 1.05 * (entries * (5 + 4) / 8) + overhead
    gap_symbols = np.concatenate([gaps % 16, np.full(n_fillers, 15)])
    value_symbols = np.concatenate([w.ravel()[positions], np.zeros(n_fillers, np.float32)])
    entropy = entropy_bits(gap_symbols) + entropy_bits(value_symbols)
    assert len(blob) <= 1.05 * entropy / 8 + overhead
    assert np.array_equal(decode(blob, record).view(np.uint32), w.view(np.uint32))


def test_choose_spec_prefers_sparse_for_pruned_and_palette_for_dense_clustered():
    sparse = pruned_clustered((200, 100), 0.05, 4)
    assert choose_spec(sparse)["codec"] == "sparse"
    dense = pruned_clustered((200, 100), 1.0, 2)
    assert choose_spec(dense)["codec"] == "palette"
    noise = np.random.default_rng(0).standard_normal((50, 50)).astype(np.float32)
    assert choose_spec(noise) == {"codec": "raw"}


def test_choose_spec_result_is_the_smallest_of_all_candidates():
    w = pruned_clustered((60, 70), 0.3, 3, seed=4)
    best = choose_spec(w)
    best_size = len(encode(w, best)[0])
    for spec in [{"codec": "raw"}, {"codec": "palette", "huffman": True}, {"codec": "palette"}]:
        assert best_size <= len(encode(w, spec)[0])
    for ib in range(2, 9):
        for values in ("raw", "palette"):
            spec = {"codec": "sparse", "index_bits": ib, "values": values, "huffman": True}
            assert best_size <= len(encode(w, spec)[0])


def test_predict_bytes_equals_encoded_size_for_grouped_and_given_codebooks():
    w = pruned_clustered((12, 30), 0.4, 3, seed=2)
    book = sorted(set(w.ravel().tolist()), reverse=True)
    for spec in [
        {"codec": "palette", "groups": 5, "huffman": True},
        {"codec": "palette", "codebook": book, "huffman": True, "bits": 4},
        {"codec": "sparse", "index_bits": 2, "values": "palette", "codebook": book, "huffman": True},
    ]:
        assert predict_bytes(w, spec) == len(encode(w, spec)[0])


def test_chunked_histograms_and_fp16_check_match_whole_array_oracles(monkeypatch):
    import mconv.codecs.palette as palette
    from mconv.codecs.choose import TensorStats, fp16_exact

    monkeypatch.setattr(palette, "HISTOGRAM_CHUNK", 7)  # many chunks on a small tensor
    rng = np.random.default_rng(5)
    a = rng.choice(np.array([0.0, -0.0, 0.5, -1.25, 3.0, np.float32(0.1)], dtype=np.float32), size=501)
    stats = TensorStats.of(a)
    bits = a.view(np.uint32)
    want_bits, want_counts = np.unique(bits, return_counts=True)  # oracle: whole-array unique
    book, counts = stats.dense_histogram()
    assert sorted(zip(book.view(np.uint32).tolist(), counts.tolist())) == list(
        zip(want_bits.tolist(), want_counts.tolist())
    )
    assert list(book) == sorted(book)  # by value (then bit pattern: +0.0 before -0.0)
    nz_book, nz_counts = stats.nonzero_histogram()
    assert int(nz_counts.sum()) == int(np.count_nonzero(bits))
    assert not fp16_exact(a, chunk=5)  # 0.1 is not a float16
    assert fp16_exact(a[a != np.float32(0.1)], chunk=5)
