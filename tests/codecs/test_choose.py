"""choose_spec picks the smallest encoding; predict_bytes equals the encoder's real size."""

from __future__ import annotations

import numpy as np
import pytest
from mconv.codecs import choose_spec, decode, encode, predict_bytes
from mconv.container import write_container


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


def test_choose_spec_prefers_sparse_for_pruned_and_palette_for_dense_clustered(tmp_path):
    # pruned but not clustered (more values than a palette holds): the gaps and the values
    rng = np.random.default_rng(3)
    unclustered = rng.standard_normal((200, 100)).astype(np.float32) * (rng.random((200, 100)) < 0.1)
    assert choose_spec(unclustered)["codec"] == "sparse"
    # pruned to 1 % and clustered: a rANS-coded dense palette's zeros cost as little as the gaps
    # (with version 4's slim records the two containers are the same size, 466 B); the choice
    # is the smallest container of the candidates
    sparse = pruned_clustered((200, 100), 0.01, 4)
    sizes = {}
    for key, spec in (
        ("chosen", choose_spec(sparse)),
        ("palette", {"codec": "palette", "rans": True}),
        ("sparse", {"codec": "sparse", "index_bits": 8, "values": "palette"}),
    ):
        sizes[key] = write_container(tmp_path / f"{key}.mcw", [("w", sparse, spec)], version=4).total_bytes
    assert sizes["chosen"] <= min(sizes["palette"], sizes["sparse"]), sizes
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
        {"codec": "palette", "groups": 7, "axis": 1, "rans": True},  # palette rule 5: column groups
        {"codec": "palette", "groups": 12, "axis": 0, "bits": 4},
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


# --- one choice (issue 13 item 4): the union of both former enumerations, no swallowed errors


def _former_candidates(w: np.ndarray, hints: dict) -> list[dict]:
    """Every spec either former chooser sized: the account's enumeration (container.choose_codec
    for tensors with hints) and the weights target's choose_spec, re-derived as the oracle."""
    from mconv.codecs.palette import bits_for, distinct_values

    flat = w.ravel()
    positions = np.flatnonzero(flat.view(np.uint32))
    gaps = np.diff(positions, prepend=-1) - 1
    dense, nonzero = distinct_values(flat).size, distinct_values(flat[positions]).size
    index_widths = [hints["index_bits"]] if hints.get("index_bits") else range(2, 9)

    def enumerate_(bits, grouped, huffmans):
        limit = 256 if bits is None else 1 << bits
        specs = [{"codec": "raw"}, {"codec": "fp16"}]
        if dense <= limit:
            specs.append({"codec": "palette", "bits": bits or bits_for(dense)})
        if grouped:
            specs.append({"codec": "palette", "bits": bits or 8, "groups": hints["groups"]})
        for ib in index_widths:
            specs += [{"codec": "sparse", "index_bits": ib, "values": v} for v in ("raw", "fp16")]
            need = nonzero + bool((gaps >= 1 << ib).any())
            if need <= limit:
                specs.append(
                    {"codec": "sparse", "index_bits": ib, "values": "palette", "bits": bits or bits_for(need)}
                )
        return [{**c, "huffman": h} for c in specs for h in huffmans]

    bits = hints.get("bits")
    account = enumerate_(bits, hints.get("groups", 1) > 1, (False, True))
    weights = enumerate_(bits if bits is not None and dense <= 1 << bits else None, False, (True,))
    return account + weights


def _encoded_sizes(w: np.ndarray, specs: list[dict]) -> list[int]:
    from mconv.errors import InputError

    sizes = []
    for spec in specs:
        try:
            sizes.append(len(encode(w, spec)[0]))
        except InputError:  # the oracle may try specs a codec refuses
            pass
    return sizes


def _file_sizes(w, specs, path) -> list[int]:
    """Bytes of a version 3 container holding ``w`` alone, per spec: blob and index record."""
    from mconv.container import write_container
    from mconv.errors import InputError

    sizes = []
    for spec in specs:
        try:
            sizes.append(write_container(path, [("w", w, spec)], version=3).total_bytes)
        except InputError:  # the oracle may try specs a codec refuses
            pass
    return sizes


def test_one_choice_is_no_larger_than_anything_either_former_chooser_offered(tmp_path):
    from mconv.codecs import best_spec

    rng = np.random.default_rng(11)
    cases = [
        (pruned_clustered((40, 60), 0.1, 5, seed=1), {"bits": 5, "index_bits": 4, "pruned": True}),
        (pruned_clustered((40, 60), 0.1, 5, seed=1), {}),  # the same tensor without hints
        (pruned_clustered((40, 60), 0.5, 3, seed=2), {"bits": 4}),  # fewer values than recorded
        (pruned_clustered((40, 60), 1.0, 4, seed=3), {"bits": 4, "groups": 4, "axis": 0}),
        (rng.standard_normal((30, 30)).astype(np.float16).astype(np.float32), {}),
        (np.where(rng.random((50, 20)) < 0.8, 0, rng.standard_normal((50, 20))).astype(np.float32), {}),
    ]
    for w, hints in cases:
        spec, size = best_spec(w, hints)
        blob, record = encode(w, spec)
        assert len(blob) == size  # the prediction is the real size
        assert np.array_equal(decode(blob, record).view(np.uint32), w.view(np.uint32))
        # rule 6: the smallest container file (blob and its record; the record's size is
        # estimated within a few bytes), not only the smallest blob
        former = _former_candidates(w, hints)
        mcw = tmp_path / "w.mcw"
        assert _file_sizes(w, [spec], mcw)[0] <= min(_file_sizes(w, former, mcw)) + 4, (hints, spec)
        assert size <= min(_encoded_sizes(w, former)) + 32, (hints, spec)  # a record's worth


def test_skipping_the_analysis_never_changes_the_choice(monkeypatch):
    import mconv.codecs.choose as choose

    rng = np.random.default_rng(3)
    dense = rng.standard_normal((64, 64)).astype(np.float32)
    tensors = [
        dense,
        dense.astype(np.float16).astype(np.float32),
        dense.astype(np.float16),
        np.where(dense > 0.3, dense, 0).astype(np.float32),  # ~38 % nonzero, all distinct
        np.where(dense > 2.5, dense, 0).astype(np.float32),  # ~1 % nonzero
        np.round(dense).astype(np.float32),  # few values, fp16-exact
        rng.integers(-3, 4, (40, 40)).astype(np.int8),
        rng.integers(0, 1 << 40, 300).astype(np.int64),
        rng.random(500) < 0.1,
        np.zeros(257, np.float32),
        rng.standard_normal(5).astype(np.float64),
        np.array([0.0, 1.0, -0.0, np.nan], np.float32),
        rng.standard_normal(300).astype(np.float32),  # small: every value distinct
    ]
    gated = [choose.best_spec(t) for t in tensors]
    monkeypatch.setattr(choose, "_coded_may_win", lambda *a: True)  # always analyse
    assert [choose.best_spec(t) for t in tensors] == gated
    monkeypatch.undo()
    monkeypatch.setattr(choose, "_PREFIX", 7)  # a short prefix: bounds looser, never wrong
    assert [choose.best_spec(t) for t in tensors] == gated


def test_a_grouped_palette_over_its_recorded_bits_takes_the_width_that_fits():
    # Former enumeration: groups=2 at the recorded 2 bits was sized (packed) although each group
    # holds 5 values; the smallest candidate then failed to encode. Now every candidate encodes.
    from mconv.codecs import best_spec

    rng = np.random.default_rng(5)
    rows = [np.array([1, 2, 3, 4, 5], np.float32), np.array([10, 20, 30, 40, 50], np.float32)]
    w = np.stack([r[rng.integers(0, 5, 1000)] for r in rows])
    spec, size = best_spec(w, {"bits": 2, "groups": 2, "axis": 0})
    assert spec["codec"] == "palette" and spec.get("groups") == 2 and spec["bits"] == 3
    blob, record = encode(w, spec)
    assert len(blob) == size and np.array_equal(decode(blob, record), w)


def test_damaged_hints_are_ignored_and_the_choice_stays_lossless():
    from mconv.codecs import best_spec, compression_hints

    w = pruned_clustered((20, 30), 0.2, 4, seed=6)
    want = best_spec(w)
    for hints in [
        {"bits": "4"},
        {"bits": 99},
        {"bits": True},
        {"index_bits": -1},
        {"index_bits": 2.5},
        {"groups": "2"},
        {"groups": 10**9},
        {"groups": 4, "axis": [0]},
        {"groups": 4, "axis": "0"},
    ]:
        spec, size = best_spec(w, hints)
        assert (spec, size) == want, hints
    key = "mconv.compression"
    assert compression_hints({key: "[" * 100000}, "W") == {}  # too deep for json: no hints
    assert compression_hints({key: '{"W": 3}'}, "W") == {}
    assert compression_hints({key: '{"W": {"bits": 4}}'}, "W") == {"bits": 4}


def test_compression_key_is_defined_once():
    import ast
    from pathlib import Path

    import mconv.account
    import mconv.codecs.choose
    import mconv.edit.weights

    assert mconv.edit.weights.COMPRESSION_KEY is mconv.codecs.choose.COMPRESSION_KEY
    assert mconv.account.COMPRESSION_KEY is mconv.codecs.choose.COMPRESSION_KEY
    root = Path(__file__).resolve().parents[2]
    defined = [
        str(path.relative_to(root))
        for folder in ("core", "cli", "passes", "formats", "targets", "fixtures")
        for path in sorted((root / folder).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "COMPRESSION_KEY" for t in node.targets)
    ]
    assert defined == ["core/codecs/choose.py"]


# --- issue 14 item 4: the account sizes from histograms, chunk by chunk, exactly


@pytest.mark.parametrize("chunk", [5, 64, 1 << 22])
def test_chunked_stats_size_every_candidate_exactly(monkeypatch, chunk):
    import mconv.codecs.choose as choose

    monkeypatch.setattr(choose, "_STATS_CHUNK", chunk)
    rng = np.random.default_rng(14)
    book = np.array([-0.5, 0.25, 0.75, 1.5], dtype=np.float32)
    dense = book[rng.integers(0, 4, 700)]  # no zeros: every gap 0, dense chunks
    pruned = dense.copy()
    pruned[rng.random(700) < 0.9] = 0.0
    gappy = np.zeros(3000, dtype=np.float32)
    gappy[[0, 1, 400, 401, 2999]] = [1.5, -0.5, 0.25, 0.25, 0.75]  # gaps of 398 and 2597
    late = np.zeros(1000, dtype=np.float32)
    late[-1] = 0.25  # a single entry after a long run of zeros
    for w in (dense, pruned, gappy, late, np.zeros(50, dtype=np.float32)):
        for spec, size in choose._specs_and_sizes(w, {}):
            assert size == len(encode(w, spec)[0]), spec
        positions = np.flatnonzero(w)
        gaps = np.diff(positions, prepend=-1) - 1
        stats = choose.TensorStats.of(w)
        for span in (4, 16, 256):
            fillers, counts = stats.gap_counts(span)
            assert fillers == int((gaps // span).sum())
            want = np.bincount(gaps % span, minlength=span)
            want[span - 1] += fillers
            np.testing.assert_array_equal(counts, want)


# --- per-block palettes (palette rule 7): exact sizes, and the ``block`` hint


def blockwise_clustered(rows, cols, block, per_block, seed=0, dtype=np.float32) -> np.ndarray:
    """Every run of ``block`` values (row-major) holds ``per_block`` values of its own."""
    rng = np.random.default_rng(seed)
    nblocks = -(-rows * cols // block)
    books = rng.standard_normal((nblocks, per_block)).astype(dtype)
    codes = rng.integers(0, per_block, nblocks * block)
    return books[np.arange(nblocks * block) // block, codes][: rows * cols].reshape(rows, cols)


def test_predict_bytes_equals_encoded_size_for_block_palettes():
    from mconv.errors import InputError

    refused = 0
    for dtype in (np.float32, np.float16):
        w = blockwise_clustered(12, 40, 20, 6, seed=3, dtype=dtype)
        w[w < -1] = 0  # pruned zeros: some blocks hold one more value
        for block in (1, 20, 30, 64, 480, 10**6):
            for extra in (
                {},
                {"huffman": True},
                {"rans": True},
                {"bits": 5},
                {"bits": 3, "rans": True},
                {"codebook_dtype": "float32"},
            ):
                spec = {"codec": "palette", "block": block, **extra}
                try:
                    blob = encode(w, spec)[0]
                except InputError:  # a block over bits=3: sizing refuses it too
                    with pytest.raises(InputError):
                        predict_bytes(w, spec)
                    refused += 1
                    continue
                assert predict_bytes(w, spec) == len(blob), spec
    assert refused > 0  # the refusals were exercised, not only the sizes
    empty = np.zeros((0, 8), np.float32)
    assert predict_bytes(empty, {"codec": "palette", "block": 4}) == len(
        encode(empty, {"codec": "palette", "block": 4})[0]
    )


def test_a_block_hint_adds_block_palette_candidates_sized_exactly():
    from mconv.codecs import best_spec
    from mconv.codecs.choose import _specs_and_sizes

    # 64 x 256 float32, 16 values per block of 128 but 2048 distinct in all: no dense palette,
    # and more than 257 distinct values in the prefix (rule 4 would stop at raw without the hint)
    w = blockwise_clustered(64, 256, 128, 16, seed=9)
    assert best_spec(w) == ({"codec": "raw"}, w.nbytes)
    candidates = _specs_and_sizes(w, {"block": 128, "bits": 4})
    blocks = [spec for spec, _ in candidates if spec.get("block")]
    base = {"codec": "palette", "bits": 4, "block": 128}
    assert blocks == [
        {**base, "huffman": False},
        {**base, "huffman": True},
        {**base, "huffman": False, "rans": True},
    ]
    for spec, size in candidates:
        assert size == len(encode(w, spec)[0]), spec
    spec, size = best_spec(w, {"block": 128, "bits": 4})
    assert spec["codec"] == "palette" and spec["block"] == 128 and spec["bits"] == 4
    blob, record = encode(w, spec)
    assert len(blob) == size and record["groups"] == 128
    assert np.array_equal(decode(blob, record).view(np.uint32), w.view(np.uint32))
    # the recorded width is taken when the blocks fit it, else the fewest bits that fit
    assert best_spec(w, {"block": 128, "bits": 2})[0]["bits"] == 4
    # a block hint whose blocks hold more than 256 values adds no candidate
    assert best_spec(w, {"block": 4096})[0] == {"codec": "raw"}


def test_damaged_block_hints_are_ignored():
    from mconv.codecs import best_spec

    w = blockwise_clustered(16, 64, 32, 4, seed=10)
    want = best_spec(w)
    for hints in [
        {"block": "32"},
        {"block": True},
        {"block": 0},
        {"block": -32},
        {"block": 2.5},
        {"block": [32]},
    ]:
        assert best_spec(w, hints) == want, hints
    assert best_spec(w, {"block": 32})[0].get("block") == 32
