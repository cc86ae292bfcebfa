"""Per-block palettes (palette rule 7): one codebook per run of ``block`` values, bit-exact."""

from __future__ import annotations

import mconv.codecs.palette as palette
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mconv.codecs import decode, encode, predict_bytes
from mconv.codecs.palette import (
    bit_view,
    block_palettes,
    distinct_values,
    order_keys,
    palette_indices,
    pattern_of_keys,
)
from mconv.errors import InputError


def bits_of(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.dtype(f"u{a.dtype.itemsize}"))


def assert_roundtrip(w: np.ndarray, spec: dict) -> tuple[bytes, dict]:
    blob, record = encode(w, spec)
    back = decode(blob, record)
    assert back.dtype == w.dtype and back.shape == w.shape
    assert np.array_equal(bits_of(back), bits_of(w))
    assert predict_bytes(w, spec) == len(blob)
    assert sum(record["streams"].values()) == len(blob)
    return blob, record


def per_block_oracle(flat: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Rule 7 the slow way: a Python loop over the blocks, rule 2's distinct_values each."""
    books = [distinct_values(flat[s : s + block]) for s in range(0, flat.size, block)]
    table = np.zeros((len(books), max(b.size for b in books)), flat.dtype)
    for g, book in enumerate(books):
        table[g, : book.size] = book
    indices = [palette_indices(flat[g * block : (g + 1) * block], b) for g, b in enumerate(books)]
    return table, np.concatenate(indices)


def blocky(shape, block, per_block, seed, dtype=np.float32) -> np.ndarray:
    """A tensor whose every block of ``block`` values holds at most ``per_block`` values of its
    own (different blocks, different values)."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    nblocks = -(-n // block)
    books = rng.standard_normal((nblocks, per_block)).astype(dtype)
    codes = rng.integers(0, per_block, nblocks * block)
    return books[np.arange(nblocks * block) // block, codes][:n].reshape(shape)


# --- the order: rule 2 as unsigned integers


def test_order_keys_are_rule_2_order_for_every_float16_pattern():
    patterns = np.arange(1 << 16, dtype=np.uint16)
    values = patterns.view(np.float16)
    rule2 = np.lexsort((patterns, values))  # value_histogram's order: by value, then pattern
    keys = order_keys(patterns, np.dtype(np.float16))
    assert np.array_equal(np.argsort(keys, kind="stable"), rule2)
    assert np.array_equal(np.sort(keys), patterns)  # a bijection
    assert np.array_equal(pattern_of_keys(keys, np.dtype(np.float16)), patterns)
    # the corners: -inf first, +0.0 just before -0.0, positive NaNs before negative ones
    ordered = patterns[rule2]
    assert ordered[0] == 0xFC00 and ordered[-1] == 0xFFFF
    zero = int(np.flatnonzero(ordered == 0)[0])
    assert ordered[zero + 1] == 0x8000


@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "int32", "uint16", "bool"])
def test_order_keys_are_rule_2_order_for_other_dtypes(dtype):
    rng = np.random.default_rng(7)
    dtype = np.dtype(dtype)
    width = dtype.itemsize * 8
    patterns = rng.integers(0, 1 << min(width, 63), 5000, dtype=np.uint64)
    if dtype.kind == "f":
        sign, inf = palette._order_constants(dtype)
        corners = [0, sign, inf, sign | inf, inf + 1, sign + inf + 1, (1 << width) - 1, sign - 1, 1, sign + 1]
        patterns = np.concatenate([patterns, np.array(corners, np.uint64)])
    patterns = np.unique(patterns.astype(bit_view(np.zeros(1, dtype)).dtype))
    if dtype.kind == "b":
        patterns = np.array([0, 1], np.uint8)
    values = patterns.view(dtype)
    keys = order_keys(patterns, dtype)
    assert np.array_equal(np.argsort(keys, kind="stable"), np.lexsort((patterns, values)))
    assert np.array_equal(pattern_of_keys(keys, dtype), patterns)


# --- the codebooks: exactly rule 2's per block, however the tensor is cut into pieces


@pytest.mark.parametrize("piece", [1 << 20, 7])  # 7: many pieces, and blocks longer than one
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int8", "uint8", "int64", "bool"])
def test_block_palettes_equal_the_per_block_loop(monkeypatch, piece, dtype):
    monkeypatch.setattr(palette, "BLOCK_CHUNK", piece)
    rng = np.random.default_rng(3)
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        pool = np.array([0.0, -0.0, np.inf, -np.inf, 1.5, -2.25, 1e-3], dtype)
        nan = np.array([0x7FC00123, 0xFFC00001, 0x7FC00000], np.uint32).view(np.float32)
        pool = np.concatenate([pool, nan.astype(dtype)])
        if dtype == np.float16:
            pool = np.concatenate([pool, np.array([0x7E01, 0xFE03], np.uint16).view(np.float16)])
        if dtype == np.float64:
            pool = np.concatenate([pool, np.array([0x7FF8000000000123], np.uint64).view(np.float64)])
    elif dtype.kind == "b":
        pool = np.array([True, False])
    else:
        info = np.iinfo(dtype)
        pool = np.array([info.min, info.max, 0, 1, 3], dtype)
    for n, block in [(1, 1), (40, 1), (40, 8), (41, 8), (37, 5), (100, 13), (30, 30), (30, 64), (200, 9)]:
        flat = pool[rng.integers(0, pool.size, n)]
        found = block_palettes(flat, block)
        table, indices = per_block_oracle(flat, block)
        assert found.overflow is None and found.table.dtype == dtype
        assert np.array_equal(bits_of(found.table), bits_of(table)), (n, block)
        assert np.array_equal(found.indices, indices), (n, block)
        assert np.array_equal(found.counts, np.bincount(indices, minlength=found.size))


def test_block_palettes_stop_at_the_first_block_over_the_limit(monkeypatch):
    flat = np.concatenate([np.zeros(8), np.arange(8), np.arange(8) + 0.5, np.zeros(4)]).astype(np.float32)
    for piece in (1 << 20, 8, 5):
        monkeypatch.setattr(palette, "BLOCK_CHUNK", piece)
        found = block_palettes(flat, 8, limit=4)
        assert found.overflow == (1, 8) and found.table is None and found.indices is None
        assert block_palettes(flat, 8, limit=8).overflow is None


# --- the codec: round trips, records, refusals


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("coder", [{}, {"huffman": True}, {"rans": True}])
def test_block_palette_roundtrips_bit_exactly(dtype, coder):
    w = blocky((24, 64), 64, 9, seed=1, dtype=dtype)  # B = one row, every row its own 9 values
    for block in (64, 32, 48, 1, 24 * 64, 10**6):
        _, record = assert_roundtrip(w, {"codec": "palette", "block": block, **coder})
        used = min(block, w.size)
        assert record["block"] == used and record["groups"] == -(-w.size // used)
        assert record["bits"] >= 1 and record["codebook_size"] <= 1 << record["bits"]
    _, record = assert_roundtrip(w, {"codec": "palette", "block": 64, "bits": 6, **coder})
    assert (record["bits"], record["codebook_size"], record["groups"]) == (6, 9, 24)


def test_a_block_not_dividing_the_size_leaves_a_shorter_last_block():
    w = blocky((7, 19), 10, 4, seed=2)  # 133 values: 13 blocks of 10 and one of 3
    blob, record = assert_roundtrip(w, {"codec": "palette", "block": 10})
    assert (record["block"], record["groups"], record["codebook_size"], record["bits"]) == (10, 14, 4, 2)
    table = np.frombuffer(blob[: record["streams"]["codebook"]], record["codebook_dtype"]).reshape(14, 4)
    flat = w.ravel()
    last = distinct_values(flat[130:])
    assert np.array_equal(table[13, : last.size].astype(np.float32), last)
    assert np.all(table[13, last.size :] == 0)  # padding no index refers to
    assert np.array_equal(
        table[0].astype(np.float32)[: distinct_values(flat[:10]).size], distinct_values(flat[:10])
    )


def test_block_of_one_and_single_value_blocks():
    w = np.array([[3.0, -0.0], [0.0, np.inf]], np.float32)
    _, record = assert_roundtrip(w, {"codec": "palette", "block": 1})
    assert (record["groups"], record["codebook_size"], record["bits"]) == (4, 1, 1)
    _, record = assert_roundtrip(w, {"codec": "palette", "block": 1, "rans": True})


def test_empty_tensors_have_no_block_to_record():
    for shape in [(0,), (0, 5), (3, 0)]:
        w = np.zeros(shape, np.float32)
        for coder in ({}, {"huffman": True}, {"rans": True}):
            _, record = assert_roundtrip(w, {"codec": "palette", "block": 4, **coder})
            assert "block" not in record and record["codebook_size"] == 0


def test_signed_zeros_and_nan_payloads_survive_per_block():
    w = np.array([0.0, -0.0, np.nan, 1.5, -0.0, 0.0, np.nan, -np.inf, 2.0, 0.0], np.float32)
    w.view(np.uint32)[2] = 0x7FC00123
    w.view(np.uint32)[6] = 0xFFC00001
    for block in (1, 2, 3, 4, 10):
        for coder in ({}, {"huffman": True}, {"rans": True}):
            blob, record = assert_roundtrip(w, {"codec": "palette", "block": block, **coder})
    blob, record = encode(w, {"codec": "palette", "block": 4, "codebook_dtype": "float32"})
    table = np.frombuffer(blob[: record["streams"]["codebook"]], "<u4").reshape(3, record["codebook_size"])
    # rule 2 in each block: +0.0 before -0.0, NaNs last by bit pattern
    assert table[0, :4].tolist() == [0x00000000, 0x80000000, 0x3FC00000, 0x7FC00123]
    assert table[1, :4].tolist() == [0xFF800000, 0x00000000, 0x80000000, 0xFFC00001]
    assert table[2, :2].tolist() == [0x00000000, 0x40000000]
    half = w.astype(np.float16)
    assert_roundtrip(half, {"codec": "palette", "block": 3, "huffman": True})


def test_a_block_over_its_bits_is_refused_by_name():
    w = blocky((8, 16), 16, 3, seed=4)
    w[5] = np.arange(16, dtype=np.float32) % 5 + 100  # block 5 holds 5 values, the others 3
    with pytest.raises(
        InputError, match=r"block 5 holds 5 distinct values.*2-bit palette holds \(4\)"
    ) as exc:
        encode(w, {"codec": "palette", "block": 16, "bits": 2})
    assert "bits=3" in exc.value.hint
    assert_roundtrip(w, {"codec": "palette", "block": 16, "bits": 3})
    wide = np.concatenate([np.zeros(300), np.arange(300)]).astype(np.float32)
    with pytest.raises(InputError, match="block 1 holds 300 distinct values.*256"):
        encode(wide, {"codec": "palette", "block": 300})
    assert_roundtrip(wide, {"codec": "palette", "block": 256})


@pytest.mark.parametrize(
    "spec,match",
    [
        ({"block": 0}, "block=0"),
        ({"block": -3}, "block=-3"),
        ({"block": True}, "block=True"),
        ({"block": 4.0}, "block=4.0"),
        ({"block": "4"}, "block='4'"),
        ({"block": 4, "groups": 2}, "block and groups"),
        ({"block": 4, "codebook": [1.0, 2.0, 3.0, 4.0]}, "codebook"),
    ],
)
def test_bad_block_params_are_one_input_error(spec, match):
    w = np.tile(np.array([1.0, 2.0, 3.0, 4.0], np.float32), (4, 2))
    with pytest.raises(InputError, match=match) as exc:
        encode(w, {"codec": "palette", **spec})
    assert exc.value.hint
    assert_roundtrip(w, {"codec": "palette", "block": 4, "groups": 1})  # groups=1 is no split


def test_corrupt_block_records_are_refused_never_crash():
    w = blocky((10, 30), 16, 5, seed=5)
    blob, record = encode(w, {"codec": "palette", "block": 16, "huffman": True})
    assert record["groups"] == 19 and record["block"] == 16
    for bad in [
        {"block": 0},
        {"block": 301},
        {"block": -16},
        {"block": True},
        {"block": None},
        {"block": 16.0},
        {"block": 15},  # 20 blocks, record says 19
        {"groups": 18},
        {"groups": 0},
        {"groups": 10**12},
        {"codebook_size": 4},  # the blob no longer matches
    ]:
        with pytest.raises(InputError):
            decode(blob, {**record, **bad})
    # a decoder that ignores "block" reads 19 groups of a 10-row tensor: refused, not mis-read
    old = {k: v for k, v in record.items() if k != "block"}
    with pytest.raises(InputError, match="groups=19"):
        decode(blob, old)
    rng = np.random.default_rng(6)
    for _ in range(40):  # flipped blob bytes: an InputError or some tensor, never another error
        damaged = bytearray(blob)
        damaged[int(rng.integers(0, len(blob)))] ^= int(rng.integers(1, 256))
        try:
            decode(bytes(damaged), record)
        except InputError:
            pass


@settings(max_examples=80, deadline=None)
@given(
    shape=st.lists(st.integers(0, 9), min_size=0, max_size=3),
    per_block=st.integers(1, 12),
    block=st.integers(1, 40),
    coder=st.sampled_from([{}, {"huffman": True}, {"rans": True}]),
    half=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_block_palette_roundtrip_property(shape, per_block, block, coder, half, seed):
    shape = tuple(shape)
    n = int(np.prod(shape))
    w = blocky((max(n, 1),), block, per_block, seed, np.float16 if half else np.float32)[:n].reshape(shape)
    rng = np.random.default_rng(seed)
    if n:
        w.ravel()[rng.integers(0, n, max(1, n // 5))] = 0  # pruned zeros, one more value per block
    _, record = assert_roundtrip(w, {"codec": "palette", "block": block, **coder})
    if n:
        assert record["groups"] == -(-n // min(block, n))


def test_per_block_palettes_round_trip_a_large_float16_weight():
    # 4096 x 1024 float16, 32768 blocks of 128 with 16 values each: vectorised over the blocks
    rng = np.random.default_rng(8)
    books = (rng.standard_normal((32768, 16)) * 0.05).astype(np.float16)
    w = np.take_along_axis(books, rng.integers(0, 16, (32768, 128)), axis=1).reshape(4096, 1024)
    blob, record = encode(w, {"codec": "palette", "block": 128})
    back = decode(blob, record)
    assert np.array_equal(back.view(np.uint16), w.view(np.uint16))
    assert (record["bits"], record["groups"], record["block"]) == (4, 32768, 128)
    assert record["codebook_size"] <= 16 and record["codebook_dtype"] == "float16"
    assert len(blob) == 32768 * record["codebook_size"] * 2 + w.size // 2
    assert predict_bytes(w, {"codec": "palette", "block": 128}) == len(blob)
