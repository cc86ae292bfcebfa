"""Canonical Huffman: code lengths, canonical codes, stream round trips and damage handling."""

from __future__ import annotations

import numpy as np
import pytest
from mconv.codecs import decode, encode
from mconv.codecs.bitstream import BlobReader
from mconv.codecs.huffman import MAX_LEN, canonical_codes, code_lengths, decode_symbols, encode_symbols
from mconv.errors import InputError


def test_code_lengths_match_a_hand_built_tree():
    # counts 1,1,2,4: merge 1+1 -> 2, 2+2 -> 4, 4+4 -> root: depths 3,3,2,1
    assert code_lengths(np.array([1, 1, 2, 4, 0])).tolist() == [3, 3, 2, 1, 0]


def test_canonical_codes_follow_rfc1951_example():
    # RFC 1951 section 3.2.2: lengths (3,3,3,3,3,2,4,4) -> 010 011 100 101 110 00 1110 1111
    codes = canonical_codes(np.array([3, 3, 3, 3, 3, 2, 4, 4]))
    assert codes.tolist() == [0b010, 0b011, 0b100, 0b101, 0b110, 0b00, 0b1110, 0b1111]


def test_code_lengths_are_limited_and_still_complete():
    counts = np.array([2**i for i in range(40)])  # a Fibonacci-like skew wants 39-bit codes
    lengths = code_lengths(counts)
    assert lengths.max() <= MAX_LEN
    assert sum(2.0 ** -int(n) for n in lengths) == 1.0  # Kraft equality: a complete code


def test_payload_is_within_one_bit_per_symbol_of_the_entropy():
    rng = np.random.default_rng(0)
    symbols = np.minimum(rng.geometric(0.2, 50_000) - 1, 31)
    blob = encode_symbols(symbols, 32)
    p = np.bincount(symbols, minlength=32) / symbols.size
    entropy_bits = -(p[p > 0] * np.log2(p[p > 0])).sum() * symbols.size
    overhead = 16 + 32 + 4 * (-(-symbols.size // 8192))
    assert entropy_bits / 8 <= len(blob) - overhead <= (entropy_bits + symbols.size) / 8 + 1


@pytest.mark.parametrize("n", [0, 1, 2, 8191, 8192, 8193, 20000])
@pytest.mark.parametrize("alphabet", [2, 16, 256])
def test_streams_round_trip_across_chunk_boundaries(n, alphabet):
    rng = np.random.default_rng(n + alphabet)
    symbols = np.minimum(rng.geometric(0.3, n) - 1, alphabet - 1)
    reader = BlobReader(encode_symbols(symbols, alphabet, chunk=8192), "test")
    assert np.array_equal(decode_symbols(reader, n, alphabet, "test"), symbols)
    reader.finish()


def test_one_symbol_stream_spends_no_payload_bits():
    blob = encode_symbols(np.full(1000, 5), 8)
    assert len(blob) == 16 + 8 + 4  # header, lengths table, one sync entry, no payload
    assert decode_symbols(BlobReader(blob, "t"), 1000, 8, "t").tolist() == [5] * 1000


def test_byte_tensor_codec_round_trips_int8():
    w = np.array([[-128, 0, 0, 5], [127, 0, 0, 0]], dtype=np.int8)
    blob, record = encode(w, {"codec": "huffman"})
    assert np.array_equal(decode(blob, record), w)
    with pytest.raises(InputError):
        encode(w.astype(np.float32), {"codec": "huffman"})
