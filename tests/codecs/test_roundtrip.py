"""Property tests: decode(encode(w)) is bit-identical for every codec and parameter mix."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mconv.codecs import decode, encode, predict_bytes
from mconv.errors import InputError


def bits_of(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.dtype(f"u{a.dtype.itemsize}"))


@st.composite
def clustered_tensors(draw, max_values: int = 256):
    """Small tensors with few distinct values, zeros (pruning), -0.0 and repeats."""
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=0, max_size=4)))
    n_values = draw(st.integers(1, max_values))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    pool = rng.standard_normal(n_values).astype(np.float32)
    pool[0] = -0.0 if draw(st.booleans()) else pool[0]
    w = pool[rng.integers(0, n_values, shape)] if shape else np.float32(pool[0]).reshape(())
    sparsity = draw(st.floats(0, 1))
    w = np.where(rng.random(shape) < sparsity, np.float32(0), w).astype(np.float32)
    return w


def assert_roundtrip(w: np.ndarray, spec: dict) -> dict:
    blob, record = encode(w, spec)
    back = decode(blob, record)
    assert back.dtype == w.dtype and back.shape == w.shape
    assert np.array_equal(bits_of(back), bits_of(w))
    assert predict_bytes(w, spec) == len(blob)
    assert sum(record["streams"].values()) == len(blob)
    return record


@settings(max_examples=120, deadline=None)
@given(w=clustered_tensors(), huffman=st.booleans(), extra_bits=st.integers(0, 3))
def test_palette_roundtrip_is_bit_identical(w, huffman, extra_bits):
    distinct = np.unique(bits_of(w)).size
    bits = min(8, max(1, int(np.ceil(np.log2(max(distinct, 2))))) + extra_bits)
    assert_roundtrip(w, {"codec": "palette", "bits": bits, "huffman": huffman})


@settings(max_examples=60, deadline=None)
@given(w=clustered_tensors(max_values=16), huffman=st.booleans(), groups=st.integers(1, 6))
def test_grouped_palette_roundtrip_is_bit_identical(w, huffman, groups):
    groups = min(groups, w.shape[0]) if w.ndim and w.shape[0] else 1
    assert_roundtrip(w, {"codec": "palette", "groups": groups, "huffman": huffman})


@settings(max_examples=150, deadline=None)
@given(
    w=clustered_tensors(max_values=64),
    huffman=st.booleans(),
    index_bits=st.integers(2, 8),
    values=st.sampled_from(["raw", "palette", "fp16"]),
)
def test_sparse_roundtrip_is_bit_identical(w, huffman, index_bits, values):
    if values == "fp16":
        w = w.astype(np.float16).astype(np.float32)
    assert_roundtrip(w, {"codec": "sparse", "index_bits": index_bits, "values": values, "huffman": huffman})


@pytest.mark.parametrize("dtype", ["float16", "float64", "int8", "int64"])
def test_palette_and_sparse_keep_other_dtypes_exact(dtype):
    w = np.array([[0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -2]], dtype=dtype)
    assert_roundtrip(w, {"codec": "palette", "huffman": True})
    assert_roundtrip(w, {"codec": "sparse", "index_bits": 2, "values": "palette", "huffman": True})


def test_negative_zero_and_nan_payloads_survive():
    w = np.array([0.0, -0.0, np.nan, 1.5, -0.0, 0.0], dtype=np.float32)
    w.view(np.uint32)[2] = 0x7FC00123  # a NaN with a payload
    for spec in (
        {"codec": "palette"},
        {"codec": "sparse", "values": "palette", "index_bits": 2},
        {"codec": "sparse", "values": "raw", "huffman": True},
    ):
        assert_roundtrip(w, spec)


def test_palette_codebook_is_the_sorted_distinct_values_in_fp16_when_exact():
    w = np.array([[0.5, -1.0], [0.5, 0.25]], dtype=np.float32)
    blob, record = encode(w, {"codec": "palette", "bits": 2})
    assert record["codebook_dtype"] == "float16"  # all three values are fp16-exact
    assert np.frombuffer(blob[:6], "<f2").tolist() == [-1.0, 0.25, 0.5]
    # indices 2, 0, 2, 1 at 2 bits LSB-first: 0b01_10_00_10
    assert blob[6:] == bytes([0b01100010])


def test_palette_with_a_given_codebook_uses_its_order():
    w = np.array([3.0, 1.0, 3.0], dtype=np.float32)
    blob, record = encode(
        w, {"codec": "palette", "bits": 1, "codebook": [3.0, 1.0], "codebook_dtype": "float32"}
    )
    assert np.frombuffer(blob[:8], "<f4").tolist() == [3.0, 1.0]
    assert blob[8:] == bytes([0b010])
    assert np.array_equal(decode(blob, record), w)


def test_sparse_inserts_filler_zeros_when_a_gap_overflows():
    # Nonzeros at 0 and 15 with 3-bit gaps: gap 14 > 7 needs one filler (gap 7, at position 8),
    # then the entry keeps gap 6: three entries, as in the paper's figure 2.
    w = np.zeros(16, dtype=np.float32)
    w[[0, 15]] = [1.0, 2.0]
    blob, record = encode(w, {"codec": "sparse", "index_bits": 3, "values": "raw"})
    assert (record["entries"], record["nonzeros"]) == (3, 2)
    gaps = int.from_bytes(blob[:2], "little")
    assert [(gaps >> (3 * i)) & 7 for i in range(3)] == [0, 7, 6]
    assert np.frombuffer(blob[2:], "<f4").tolist() == [1.0, 0.0, 2.0]


@pytest.mark.parametrize(
    "spec",
    [
        {"codec": "palette", "bits": 2},  # 5 distinct values
        {"codec": "palette", "bits": 9},
        {"codec": "palette", "bits": 0},
        {"codec": "palette", "groups": 0},
        {"codec": "palette", "colour": 1},
        {"codec": "palette", "codebook": [1.0, 2.0]},  # values missing from it
        {"codec": "palette", "codebook_dtype": "float16"},  # 0.1 is not fp16-exact
        {"codec": "sparse", "index_bits": 0},
        {"codec": "sparse", "index_bits": 9},
        {"codec": "sparse", "values": "int4"},
        {"codec": "sparse", "values": "fp16"},
        {"codec": "sparse", "values": "palette", "bits": 2},
        {"codec": "sparse", "bits": 4},
        {"codec": "fp16"},
        {"codec": "nope"},
    ],
)
def test_bad_params_raise_input_error(spec):
    w = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.0], dtype=np.float32)
    with pytest.raises(InputError):
        encode(w, spec)


def test_sparse_palette_names_the_filler_slot_when_it_overflows():
    w = np.zeros(40, dtype=np.float32)
    w[[0, 39]] = [1.0, 2.0]  # 2 nonzero values fill 1 bit, the gap of 38 needs fillers
    with pytest.raises(InputError, match="fillers"):
        encode(w, {"codec": "sparse", "index_bits": 2, "values": "palette", "bits": 1})
