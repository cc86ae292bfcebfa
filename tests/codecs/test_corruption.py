"""Damaged blobs and records raise InputError: never a hang, a crash or a wrong tensor."""

from __future__ import annotations

import numpy as np
import pytest
from mconv.codecs import decode, encode
from mconv.errors import InputError

SPECS = [
    {"codec": "raw"},
    {"codec": "fp16"},
    {"codec": "palette", "bits": 3},
    {"codec": "palette", "bits": 3, "huffman": True},
    {"codec": "palette", "groups": 3, "huffman": True},
    {"codec": "sparse", "index_bits": 2, "values": "raw"},
    {"codec": "sparse", "index_bits": 3, "values": "palette", "huffman": True},
    {"codec": "sparse", "index_bits": 4, "values": "fp16", "huffman": True},
]


def tensor() -> np.ndarray:
    rng = np.random.default_rng(7)
    pool = np.array([0.5, -0.25, 1.0, 2.0, -0.0], dtype=np.float32)
    w = pool[rng.integers(0, 5, (6, 70))]
    w[rng.random(w.shape) < 0.8] = 0
    return w


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: "-".join(f"{v}" for v in s.values()))
def test_every_truncation_raises_input_error(spec):
    blob, record = encode(tensor(), spec)
    for cut in sorted({0, 1, 5, 15, 16, 17, len(blob) // 2, len(blob) - 1}):
        with pytest.raises(InputError):
            decode(blob[:cut], record)
    with pytest.raises(InputError):
        decode(blob + b"\0", record)


@pytest.mark.parametrize("spec", SPECS[2:], ids=lambda s: "-".join(f"{v}" for v in s.values()))
def test_flipped_bytes_raise_input_error_or_decode_to_the_same_shape(spec):
    w = tensor()
    blob, record = encode(w, spec)
    rng = np.random.default_rng(1)
    for _ in range(60):
        damaged = bytearray(blob)
        at = int(rng.integers(0, len(blob)))
        damaged[at] ^= int(rng.integers(1, 256))
        try:
            out = decode(bytes(damaged), record)
        except InputError:
            continue
        assert out.shape == w.shape  # payload damage may change values, never the contract


@pytest.mark.parametrize(
    "change",
    [
        {"bits": 0},
        {"bits": 99},
        {"codebook_size": 1000},
        {"groups": 10**9},
        {"codebook_dtype": "nonsense"},
        {"shape": [-1]},
        {"dtype": "nonsense"},
        {"codec": "lzma"},
    ],
)
def test_damaged_palette_records_raise_input_error(change):
    blob, record = encode(tensor(), {"codec": "palette", "bits": 3})
    with pytest.raises(InputError):
        decode(blob, {**record, **change})


@pytest.mark.parametrize("change", [{"entries": 10**9}, {"index_bits": 12}, {"values": "zstd"}])
def test_damaged_sparse_records_raise_input_error(change):
    blob, record = encode(tensor(), {"codec": "sparse", "values": "palette", "huffman": True})
    with pytest.raises(InputError):
        decode(blob, {**record, **change})
