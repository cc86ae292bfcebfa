"""rANS streams (issue 14 item 6): lossless, exactly predicted, near the zero-order bound, and
damaged streams refused with one InputError."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from mconv import codecs
from mconv.codecs import huffman, rans
from mconv.codecs.bitstream import BlobReader
from mconv.container import read_container, write_container
from mconv.errors import InputError


def _geometric(rng: np.random.Generator, n: int, p: float, alphabet: int) -> np.ndarray:
    return np.minimum(rng.geometric(p, n) - 1, alphabet - 1)


def _decode(blob: bytes, n: int, alphabet: int) -> np.ndarray:
    reader = BlobReader(blob, "test")
    out = rans.decode_symbols(reader, n, alphabet, "symbols")
    reader.finish()
    return out


@pytest.mark.parametrize("n", [0, 1, 2, 7, 8192, 8193, 16385, 3 * 8192 + 5])
def test_round_trip_and_exact_size(n):
    rng = np.random.default_rng(n)
    symbols = _geometric(rng, n, 0.15, 32)
    blob = rans.encode_symbols(symbols, 32)
    assert len(blob) == rans.encoded_nbytes(np.bincount(symbols, minlength=32))
    assert np.array_equal(_decode(blob, n, 32), symbols)
    assert rans.encode_symbols(symbols, 32) == blob  # deterministic


def test_one_symbol_and_full_alphabet_streams():
    rng = np.random.default_rng(1)
    for symbols, alphabet in [
        (np.full(30_000, 3), 4),
        (rng.integers(0, 256, 40_000), 256),
        (np.array([255, 0, 255]), 256),
    ]:
        blob = rans.encode_symbols(symbols, alphabet)
        assert len(blob) == rans.encoded_nbytes(np.bincount(symbols, minlength=alphabet))
        assert np.array_equal(_decode(blob, symbols.size, alphabet), symbols)


def test_within_two_percent_of_the_zero_order_bound_and_below_huffman():
    # A Laplace-like index stream (clustered weights) and a geometric gap stream (pruning).
    rng = np.random.default_rng(2)
    laplace = np.clip(np.round(rng.laplace(0, 2.5, 200_000)) + 16, 0, 31).astype(np.int64)
    for symbols in (laplace, _geometric(rng, 200_000, 0.1, 32)):
        counts = np.bincount(symbols, minlength=32)
        p = counts[counts > 0] / symbols.size
        bound = float(-(counts[counts > 0] * np.log2(p)).sum()) / 8
        size = rans.encoded_nbytes(counts)
        assert size <= 1.02 * bound, (size, bound)
        assert size < huffman.encoded_nbytes(counts)


def _stream(n=20_000, seed=3) -> tuple[bytes, np.ndarray]:
    symbols = _geometric(np.random.default_rng(seed), n, 0.2, 16)
    return rans.encode_symbols(symbols, 16), symbols


def _fields(blob: bytes) -> tuple[int, int]:
    """Offsets of the lane states and of the payload in a 16-symbol stream."""
    at = rans.HEADER_BYTES
    for _ in range(16):
        while blob[at] & 0x80:
            at += 1
        at += 1
    lanes = struct.unpack_from("<I", blob, 4)[0]
    return at, at + 4 * lanes


def test_damaged_streams_raise_input_error():
    blob, symbols = _stream()
    states_at, payload_at = _fields(blob)
    cases = {
        "count": (0, struct.pack("<I", symbols.size + 1)),
        "lanes": (4, struct.pack("<I", 1)),
        "payload length": (8, struct.pack("<I", 1 << 30)),
        "k": (14, bytes([9])),
        "frequency": (rans.HEADER_BYTES, bytes([0x7F])),
        "state": (states_at, struct.pack("<I", 5)),
    }
    for at, patch in cases.values():
        bad = bytearray(blob)
        bad[at : at + len(patch)] = patch
        with pytest.raises(InputError, match="rANS|truncated"):
            _decode(bytes(bad), symbols.size, 16)
    with pytest.raises(InputError):
        _decode(blob[:-1], symbols.size, 16)  # truncated
    padded = bytearray(blob)
    padded[-1] |= 1  # the last byte is padding or payload; either way the stream is wrong now
    with pytest.raises(InputError):
        _decode(bytes(padded), symbols.size, 16)
    rng = np.random.default_rng(4)
    for _ in range(30):  # flipped payload bytes: refused or decoded, never a crash or a hang
        bad = bytearray(blob)
        bad[int(rng.integers(payload_at, len(blob)))] ^= int(rng.integers(1, 256))
        try:
            _decode(bytes(bad), symbols.size, 16)
        except InputError:
            pass


def test_codecs_take_rans_and_refuse_it_with_huffman():
    rng = np.random.default_rng(5)
    w = rng.choice(np.array([0, 0, 0, 0.5, -0.25, 1.5], np.float32), (300, 70))
    for spec in (
        {"codec": "palette", "rans": True},
        {"codec": "palette", "groups": 3, "rans": True},
        {"codec": "sparse", "index_bits": 3, "values": "palette", "rans": True},
        {"codec": "sparse", "index_bits": 4, "values": "raw", "rans": True},
    ):
        blob, record = codecs.encode(w, spec)
        assert record["rans"] is True and record["huffman"] is False
        assert len(blob) == codecs.predict_bytes(w, spec)
        assert np.array_equal(codecs.decode(blob, record).view(np.uint32), w.view(np.uint32))
    with pytest.raises(InputError, match="at most one"):
        codecs.encode(w, {"codec": "palette", "rans": True, "huffman": True})
    blob, record = codecs.encode(w, {"codec": "palette"})
    assert "rans" not in record  # older readers never see the field


def test_chooser_picks_rans_where_smaller():
    rng = np.random.default_rng(6)
    book = np.linspace(-1, 1, 32).astype(np.float32)
    idx = np.clip(np.round(rng.laplace(0, 3, (256, 512))) + 16, 0, 31).astype(np.int64)
    spec = codecs.choose_spec(book[idx])
    assert spec.get("rans") is True, spec


def test_damaged_rans_tensor_in_a_container_names_file_and_tensor(tmp_path):
    rng = np.random.default_rng(7)
    w = rng.choice(np.array([0, 0.5, -0.25, 1.5], np.float32), (200, 50))
    path = tmp_path / "weights.mcw"
    info = write_container(path, [("w", w, {"codec": "palette", "rans": True})], version=2)
    data = bytearray(path.read_bytes())
    entry = info.tensors[0]
    data[entry.offset + entry.record["streams"]["codebook"] + 4] ^= 0x40  # the lane count
    path.write_bytes(bytes(data))
    with read_container(path) as c, pytest.raises(InputError) as err:
        c.array("w", verify=False)
    assert str(path) in str(err.value) and "rANS" in str(err.value) and "'w'" in str(err.value)
