"""Codec choice for compressed tensors and the per-layer byte account (core/account.py)."""

from __future__ import annotations

import json

import numpy as np
from mconv import codecs
from mconv.account import byte_account, choose_compressed_spec, compression_hints
from mconv.container import choose_codec, write_container


def _pruned_clustered(seed=0, density=0.1, distinct=31, shape=(64, 300)):
    rng = np.random.default_rng(seed)
    book = np.sort(rng.standard_normal(distinct)).astype(np.float32)
    w = book[rng.integers(0, distinct, shape)]
    w[rng.random(shape) > density] = 0.0
    return w


def test_chosen_spec_is_no_larger_than_any_alternative_and_lossless():
    # at 2 % (random positions) a rANS-coded dense palette is smaller, its record counted
    w = _pruned_clustered(density=0.01)
    spec = choose_compressed_spec(w, {"bits": 5, "index_bits": 8, "pruned": True})
    blob, record = codecs.encode(w, spec)
    np.testing.assert_array_equal(codecs.decode(blob, record), w)
    alternatives = [
        {"codec": "raw"},
        {"codec": "palette", "bits": 6},
        {"codec": "palette", "bits": 6, "huffman": True},
        {"codec": "sparse", "index_bits": 8, "values": "raw"},
        {"codec": "sparse", "index_bits": 8, "values": "palette", "bits": 6},
        {"codec": "sparse", "index_bits": 8, "values": "palette", "bits": 6, "huffman": True},
        {"codec": "sparse", "index_bits": 8, "values": "palette", "bits": 6, "rans": True},
        {"codec": "palette", "bits": 6, "rans": True},
    ]
    for alt in alternatives:
        assert len(blob) <= len(codecs.encode(w, alt)[0]), alt
    assert spec["codec"] == "sparse" and spec["index_bits"] == 8


def test_chosen_spec_counts_its_index_record(tmp_path):
    """Issue 14 item 5: the choice is the smallest container file, record included; a zero
    scalar (a quantized model's zero point) stays raw, where a 0-byte sparse blob took a
    record of about 30 bytes."""

    def file_bytes(a, spec):
        return write_container(tmp_path / "w.mcw", [("W", a, spec)], version=4).total_bytes

    for a in (np.zeros((), np.int8), np.zeros((), np.float32), np.zeros(3, np.int32)):
        spec = choose_codec(a)
        assert spec["codec"] in ("raw", "fp16"), (a, spec)  # fp16: a float32 0 in 2 bytes
        assert file_bytes(a, spec) < file_bytes(a, {"codec": "sparse", "index_bits": 2}), a
    w = _pruned_clustered(density=0.02)
    spec = choose_compressed_spec(w, {"bits": 5, "index_bits": 8, "pruned": True})
    alternatives = [
        {"codec": "sparse", "index_bits": 8, "values": "palette", "bits": 5, **coder}
        for coder in ({}, {"huffman": True}, {"rans": True})
    ] + [{"codec": "palette", "bits": 5, "rans": True}, {"codec": "raw"}]
    for alt in alternatives:  # the record's size is estimated within a few bytes (rule 6)
        assert file_bytes(w, spec) <= file_bytes(w, alt) + 4, alt
    zeros = np.zeros((64, 64), np.float32)  # large enough that the blob decides: 0 bytes sparse
    assert choose_codec(zeros)["codec"] == "sparse"


def test_choose_codec_reads_hints_by_tensor_name_only():
    w = _pruned_clustered(1, density=0.02)
    # the recorded width: 7 bits, where the tensor's 20 values need 5 (a rANS-coded dense
    # palette is the smallest container here with version 4's slim records, hints or none)
    meta = {"mconv.compression": json.dumps({"W": {"bits": 7, "pruned": True, "index_bits": 8}})}
    assert choose_codec(w, meta, "W")["bits"] == 7
    # no hints: the same one choice with free widths (issue 13 item 4: it used to be raw here)
    assert choose_codec(w, meta, "other") == codecs.choose_spec(w) != choose_codec(w, meta, "W")
    assert compression_hints({"mconv.compression": "not json"}, "W") == {}


def test_byte_account_reports_real_blob_sizes_and_kept_fraction():
    w = _pruned_clustered(2)
    spec = choose_compressed_spec(w, {"bits": 5})
    blob, record = codecs.encode(w, spec)
    account = byte_account([("W", w, spec)], {"W": {**record, "nbytes": len(blob)}})
    row = account["layers"][0]
    assert row["bytes"] == len(blob) == row["predicted_bytes"]
    assert row["kept"] == np.count_nonzero(w) / w.size
    assert row["original_bytes"] == w.size * 4
    assert account["total"]["bytes"] == len(blob)


def test_codec_labels_name_groups_blocks_and_the_grouping_axis():
    from mconv.account import codec_label

    assert codec_label({"codec": "palette", "groups": 4}) == "palette+g4"
    assert codec_label({"codec": "palette", "groups": 4, "axis": 1, "rans": True}) == "palette+g4a1+rans"
    assert codec_label({"codec": "palette", "groups": 8, "block": 16}) == "palette+b16"
    assert codec_label({"codec": "sparse", "values": "palette", "huffman": True}) == "sparse+palette+huffman"
