"""``sparse``: a pruned tensor as (relative index, value) entries, Deep Compression style.

Han et al. 2016, section 2 and figure 2: the nonzero weights of the flattened tensor are stored
with the *difference* of their position from the previous entry in ``index_bits`` bits; a gap
that does not fit gets a filler zero entry.

Rules:
1. The tensor is flattened in C order. An element is an entry when its bit pattern is not all
   zero, so -0.0 (and NaN) is an entry and only +0.0 is implied. Decode is bit-identical.
2. An entry's gap is the number of implied zeros between it and the previous entry (the first
   entry counts from the start), 0 .. 2**index_bits - 1. A gap ``g`` larger than that is cut by
   ``g // 2**index_bits`` filler entries, each with the largest gap and the value +0.0 (an
   explicit zero value, exactly as in the paper), and the entry keeps ``g % 2**index_bits``.
   Zeros after the last entry are implied by the shape.
3. Values go through an inner codec: ``values="raw"`` (the tensor's dtype), ``"fp16"`` (must be
   fp16-exact) or ``"palette"`` (``bits``, ``codebook``, ``codebook_dtype`` as in the palette
   codec; the fillers' +0.0 needs a codebook slot of its own when there are fillers).
4. ``huffman=True`` codes the gap stream, and the palette index stream, with canonical Huffman,
   ``rans=True`` with interleaved rANS (at most one of the two); otherwise both are packed
   LSB-first at their bit width.

Blob: the gap stream, then either ``values`` or ``codebook`` + ``indices``. Record:
``index_bits, entries (fillers included), nonzeros, values, huffman`` (+ palette fields) and
``streams`` with one byte count per stream, for the per-layer account (the paper's Table 4).
"""

from __future__ import annotations

import numpy as np
from mconv.codecs import Codec, register
from mconv.codecs.bitstream import BlobReader
from mconv.codecs.palette import (
    bit_view,
    bits_for,
    check_bits,
    codebook_storage,
    coder_fields,
    decode_index_stream,
    distinct_values,
    encode_index_stream,
    entropy_coder,
    palette_indices,
    read_codebook,
    record_int,
)
from mconv.errors import InputError

SPARSE_PARAMS = ("index_bits", "values", "bits", "codebook", "codebook_dtype", "huffman", "rans")
VALUE_CODECS = ("raw", "fp16", "palette")


def relative_entries(flat: np.ndarray, index_bits: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Gaps and values of the entries of ``flat``, fillers included (rules 1-2), and the nonzeros."""
    positions = np.flatnonzero(bit_view(flat) != 0)
    span = 1 << index_bits  # a filler covers its largest gap plus its own slot
    gaps = np.diff(positions, prepend=-1) - 1
    fillers = gaps // span
    real_at = np.cumsum(fillers + 1) - 1  # where each real entry lands among all entries
    entries = int(real_at[-1]) + 1 if positions.size else 0
    entry_gaps = np.full(entries, span - 1, dtype=np.uint8)
    entry_gaps[real_at] = gaps % span
    entry_values = np.zeros(entries, dtype=flat.dtype)
    entry_values[real_at] = flat[positions]
    return entry_gaps, entry_values, int(positions.size)


def _sparse_encode(array: np.ndarray, params: dict) -> tuple[bytes, dict]:
    unknown = set(params) - set(SPARSE_PARAMS)
    if unknown:
        raise InputError(
            f"unknown sparse parameter(s): {', '.join(sorted(unknown))}",
            hint=f"sparse takes {', '.join(SPARSE_PARAMS)}",
        )
    index_bits = check_bits(params.get("index_bits", 4), "index_bits")
    value_codec = params.get("values", "raw")
    if value_codec not in VALUE_CODECS:
        raise InputError(f"sparse values={value_codec!r}", hint=f"use one of {', '.join(VALUE_CODECS)}")
    if value_codec != "palette" and any(k in params for k in ("bits", "codebook", "codebook_dtype")):
        raise InputError("bits/codebook/codebook_dtype need values='palette'", hint="set values='palette'")
    huffman, rans = entropy_coder(params)
    flat = np.ascontiguousarray(array).ravel()
    gaps, values, nonzeros = relative_entries(flat, index_bits)
    gap_blob = encode_index_stream(gaps, index_bits, huffman, rans)
    record = {
        "index_bits": index_bits,
        "entries": int(gaps.size),
        "nonzeros": nonzeros,
        "values": value_codec,
        **coder_fields(huffman, rans),
    }
    streams = {"gaps": len(gap_blob)}
    if value_codec == "raw":
        value_blob = values.astype(values.dtype.newbyteorder("<")).tobytes()
        streams["values"] = len(value_blob)
    elif value_codec == "fp16":
        if values.dtype.kind != "f":
            raise InputError(f"sparse values='fp16' needs a float tensor, got {values.dtype}", hint="use raw")
        half = values.astype("<f2")
        if not np.array_equal(bit_view(half.astype(values.dtype)), bit_view(values)):
            raise InputError(
                "fp16 values would change the tensor", hint="round to fp16 first (the fp16 pass)"
            )
        value_blob = half.tobytes()
        streams["values"] = len(value_blob)
    else:
        value_blob = _palette_values(values, params, record, streams, gaps.size != nonzeros)
    record["streams"] = streams
    return gap_blob + value_blob, record


def _palette_values(values: np.ndarray, params: dict, record: dict, streams: dict, fillers: bool) -> bytes:
    if params.get("codebook") is not None:
        codebook = np.asarray(params["codebook"], dtype=values.dtype).ravel()
    else:
        codebook = distinct_values(values)
    bits = params.get("bits")
    bits = bits_for(codebook.size) if bits is None else check_bits(bits)
    if codebook.size > 1 << bits:
        why = " (one of them the fillers' 0.0)" if fillers else ""
        raise InputError(
            f"{codebook.size} distinct entry values{why} do not fit a {bits}-bit palette",
            hint=f"use bits={bits_for(codebook.size)} or more index_bits (fewer fillers)"
            if codebook.size <= 256
            else "cluster the tensor first (at most 256 values)",
        )
    indices = palette_indices(values, codebook)
    store = codebook_storage(codebook, params.get("codebook_dtype"))
    codebook_blob = codebook.astype(store.newbyteorder("<")).tobytes()
    index_blob = encode_index_stream(indices, bits, bool(record["huffman"]), bool(record.get("rans")))
    record.update(bits=bits, codebook_size=int(codebook.size), codebook_dtype=store.name)
    streams.update(codebook=len(codebook_blob), indices=len(index_blob))
    return codebook_blob + index_blob


def _sparse_decode(blob: memoryview, record: dict) -> np.ndarray:
    shape = tuple(record["shape"])
    dtype = np.dtype(record["dtype"])
    count = int(np.prod(shape, dtype=np.int64))
    index_bits = record_int(record, "index_bits", 1, 8)
    entries = record_int(record, "entries", 0, count)
    huffman, rans = entropy_coder(record)
    reader = BlobReader(blob, "sparse")
    gaps = decode_index_stream(reader, entries, index_bits, huffman, "sparse gaps", rans)
    value_codec = record.get("values")
    if value_codec == "raw":
        raw = reader.take(entries * dtype.itemsize, "values")
        values = np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype)
    elif value_codec == "fp16":
        values = np.frombuffer(reader.take(entries * 2, "values"), dtype="<f2").astype(dtype)
    elif value_codec == "palette":
        bits = record_int(record, "bits", 1, 8)
        size = record_int(record, "codebook_size", 0 if entries == 0 else 1, 1 << bits)
        codebook = read_codebook(reader, size, record.get("codebook_dtype"), dtype)
        indices = decode_index_stream(reader, entries, bits, huffman, "sparse indices", rans)
        if entries and int(indices.max()) >= size:
            raise InputError(
                f"sparse palette index {int(indices.max())} beyond the {size}-entry codebook",
                hint="the weights file is damaged",
            )
        values = codebook[indices]
    else:
        raise InputError(f"record field values={value_codec!r} is unknown", hint="upgrade mconv")
    reader.finish()
    out = np.zeros(count, dtype=dtype)
    if entries:
        positions = np.cumsum(gaps.astype(np.int64) + 1) - 1
        if positions[-1] >= count:
            raise InputError(
                f"sparse gaps run to element {int(positions[-1])} of {count}",
                hint="the weights file is damaged",
            )
        out[positions] = values
    return out.reshape(shape)


register(Codec("sparse", _sparse_encode, _sparse_decode))
