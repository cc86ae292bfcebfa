"""``palette``: weights as n-bit indices into a codebook of shared values (weight sharing).

Deep Compression's second stage (Han et al. 2016, section 3): after k-means clustering a tensor
holds at most 2**bits distinct values, so each weight is stored as a ``bits``-bit index into a
small table of those values.

Rules:
1. Values are compared by their bit pattern, so -0.0 and 0.0 (and distinct NaN payloads) are
   different codebook entries and decode is bit-identical.
2. Without a ``codebook`` param the codebook is exactly the tensor's distinct values, sorted
   (by value, then by bit pattern; NaNs last). The cluster pass writes clustered values as plain
   dense floats, and this re-derives the table losslessly. More distinct values than 2**bits is
   an ``InputError``. Without ``bits`` the fewest bits that fit are used.
3. With a ``codebook`` param every value must be one of its entries, bit for bit.
4. The codebook is stored as float16 when every entry survives float16 bit-exactly
   (``codebook_dtype="auto"``, the default), else in the tensor's own dtype; a caller may force
   one, which must also be exact.
5. ``groups=G`` splits axis 0 (output channels) into G contiguous groups the way
   ``np.array_split`` does, each with its own codebook; codebooks are padded to the largest
   group's size with zeros that no index refers to.
6. Indices are packed LSB-first at exactly ``bits`` bits (``bitstream.pack_bits``), or with
   ``huffman=True`` coded by canonical Huffman over the 2**bits index alphabet, or with
   ``rans=True`` by interleaved rANS (:mod:`mconv.codecs.rans`) over it. The record always has
   ``huffman`` and has ``rans: true`` only when rANS is used.

Blob: ``codebook[groups * codebook_size]`` (little-endian ``codebook_dtype``), then the index
stream. Record: ``bits, codebook_size, codebook_dtype, groups, huffman`` and
``streams = {"codebook": bytes, "indices": bytes}``.
"""

from __future__ import annotations

import math

import numpy as np
from mconv.codecs import Codec, register
from mconv.codecs import rans as rans_codec
from mconv.codecs.bitstream import BlobReader, pack_bits, packed_nbytes, unpack_bits
from mconv.codecs.huffman import decode_symbols, encode_symbols
from mconv.errors import InputError

PALETTE_PARAMS = ("bits", "codebook", "codebook_dtype", "huffman", "rans", "groups")


def bit_view(values: np.ndarray) -> np.ndarray:
    """The raw bit patterns of ``values`` as unsigned ints of the same width."""
    values = np.ascontiguousarray(values)
    if values.dtype.kind not in "fiub" or values.dtype.itemsize > 8:
        raise InputError(f"palette and sparse codecs do not take {values.dtype} tensors", hint="use raw")
    return values.view(np.dtype(f"<u{values.dtype.itemsize}") if values.dtype.itemsize > 1 else np.uint8)


# Histograms of tensors above this many elements are taken chunk by chunk, so the sort's
# temporaries stay a few MB however large the tensor (AlexNet's fc6 has 37.7M elements).
HISTOGRAM_CHUNK = 1 << 18  # 1 MB of float32: sorts in cache, 2x faster than 16 MB chunks


def _bit_histogram(bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct bit patterns (ascending) and their counts, chunk by chunk over ``bits``: each
    chunk sorted and cut into runs of equal patterns (np.unique's extra passes skipped)."""
    keys, counts = [], []
    for start in range(0, max(bits.size, 1), HISTOGRAM_CHUNK):
        run = np.sort(bits[start : start + HISTOGRAM_CHUNK])
        if run.size == 0:
            continue
        starts = np.concatenate([[0], np.flatnonzero(run[1:] != run[:-1]) + 1])
        keys.append(run[starts])
        counts.append(np.diff(starts, append=run.size))
    if not keys:
        return bits[:0].copy(), np.zeros(0, dtype=np.int64)
    if len(keys) == 1:
        return keys[0], counts[0].astype(np.int64)
    merged, inverse = np.unique(np.concatenate(keys), return_inverse=True)
    return merged, np.bincount(inverse, weights=np.concatenate(counts), minlength=merged.size).astype(
        np.int64
    )


def value_histogram(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``distinct_values(values)`` and how often each occurs, in the same order."""
    flat = np.ascontiguousarray(values).ravel()
    patterns, counts = _bit_histogram(bit_view(flat))
    uniq = (
        patterns.view(flat.dtype) if flat.dtype.itemsize > 1 else patterns.astype(np.uint8).view(flat.dtype)
    )
    order = np.lexsort((bit_view(uniq), uniq))
    return uniq[order], counts[order]


def distinct_values(values: np.ndarray) -> np.ndarray:
    """Distinct values by bit pattern, sorted by value then bit pattern (rule 2)."""
    return value_histogram(values)[0]


def bits_for(count: int) -> int:
    """Fewest index bits (1..) that address ``count`` codebook entries."""
    return max(1, math.ceil(math.log2(count))) if count > 1 else 1


def check_bits(bits: object, name: str = "bits", lo: int = 1) -> int:
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not lo <= int(bits) <= 8:
        raise InputError(f"{name}={bits!r} is out of range", hint=f"use an integer {lo} .. 8")
    return int(bits)


def codebook_storage(codebook: np.ndarray, requested: str | None) -> np.dtype:
    """The dtype a codebook is stored in (rule 4)."""
    dtype = codebook.dtype

    def exact(store: np.dtype) -> bool:
        with np.errstate(over="ignore", invalid="ignore"):
            back = codebook.astype(store).astype(dtype)
        return bool(np.array_equal(bit_view(back), bit_view(codebook)))

    if requested in (None, "auto"):
        if dtype.kind == "f" and dtype.itemsize > 2 and exact(np.dtype("float16")):
            return np.dtype("float16")
        return dtype
    try:
        store = np.dtype(requested)
    except TypeError as exc:
        raise InputError(
            f"codebook_dtype={requested!r} is not a dtype", hint="use auto, float16 or float32"
        ) from exc
    if not exact(store):
        raise InputError(
            f"codebook values are not exact in {store.name}",
            hint="use codebook_dtype=auto (stores the tensor's own dtype when needed)",
        )
    return store


def palette_indices(values: np.ndarray, codebook: np.ndarray) -> np.ndarray:
    """Index of each value in ``codebook`` (bitwise match, rule 3)."""
    cb_bits = bit_view(codebook)
    order = np.argsort(cb_bits, kind="stable")
    sorted_bits = cb_bits[order]
    if sorted_bits.size and np.any(sorted_bits[1:] == sorted_bits[:-1]):
        raise InputError("palette codebook has duplicate entries", hint="list each value once")
    val_bits = bit_view(values).ravel()
    if not sorted_bits.size:
        if val_bits.size:
            raise InputError("palette codebook is empty")
        return np.zeros(0, dtype=np.uint8)
    pos = np.minimum(np.searchsorted(sorted_bits, val_bits), sorted_bits.size - 1)
    miss = sorted_bits[pos] != val_bits
    if np.any(miss):
        at = int(np.flatnonzero(miss)[0])
        raise InputError(
            f"{int(miss.sum())} value(s) are not in the palette codebook, "
            f"first {values.ravel()[at]!r} at flat index {at}",
            hint="cluster the tensor first, or omit codebook to derive it",
        )
    return order[pos].astype(np.uint8)


def group_sizes(shape: tuple[int, ...], groups: int) -> list[int]:
    """Elements per group when axis 0 is split like ``np.array_split`` (rule 5)."""
    rows = shape[0] if shape else 1
    inner = int(np.prod(shape[1:], dtype=np.int64)) if shape else 1
    base, extra = divmod(rows, groups)
    return [(base + (g < extra)) * inner for g in range(groups)]


def entropy_coder(params: dict) -> tuple[bool, bool]:
    """``(huffman, rans)`` of a spec or record (rule 6); both at once is refused."""
    huffman, rans = params.get("huffman", False), params.get("rans", False)
    if not isinstance(huffman, bool) or not isinstance(rans, bool) or (huffman and rans):
        raise InputError(
            f"huffman={huffman!r}, rans={rans!r}", hint="set at most one of huffman and rans to true"
        )
    return huffman, rans


def coder_fields(huffman: bool, rans: bool) -> dict:
    """The record's coder fields: ``huffman`` always, ``rans`` only when true (older readers
    never see it)."""
    return {"huffman": huffman, "rans": True} if rans else {"huffman": huffman}


def encode_index_stream(indices: np.ndarray, bits: int, huffman: bool, rans: bool = False) -> bytes:
    if rans:
        return rans_codec.encode_symbols(indices, 1 << bits)
    return encode_symbols(indices, 1 << bits) if huffman else pack_bits(indices, bits)


def decode_index_stream(
    reader: BlobReader, count: int, bits: int, huffman: bool, what: str, rans: bool = False
) -> np.ndarray:
    if rans:
        return rans_codec.decode_symbols(reader, count, 1 << bits, what)
    if huffman:
        return decode_symbols(reader, count, 1 << bits, what)
    return unpack_bits(reader.take(packed_nbytes(count, bits), f"{what} stream"), bits, count)


def _palette_encode(array: np.ndarray, params: dict) -> tuple[bytes, dict]:
    unknown = set(params) - set(PALETTE_PARAMS)
    if unknown:
        raise InputError(
            f"unknown palette parameter(s): {', '.join(sorted(unknown))}",
            hint=f"palette takes {', '.join(PALETTE_PARAMS)}",
        )
    bit_view(array)  # rejects dtypes the codec cannot hold
    groups = params.get("groups", 1)
    if (
        isinstance(groups, bool)
        or not isinstance(groups, (int, np.integer))
        or groups < 1
        or (groups > 1 and (array.ndim == 0 or groups > array.shape[0]))
    ):
        raise InputError(
            f"groups={groups!r} does not split axis 0 of shape {list(array.shape)}",
            hint="use 1 .. shape[0] groups",
        )
    groups = int(groups)
    flat = np.ascontiguousarray(array).ravel()
    sizes = group_sizes(array.shape, groups)
    parts = np.split(flat, np.cumsum(sizes)[:-1]) if groups > 1 else [flat]
    if params.get("codebook") is not None:
        if groups > 1:
            raise InputError("an explicit codebook cannot be combined with groups", hint="omit codebook")
        books = [np.asarray(params["codebook"], dtype=array.dtype).ravel()]
    else:
        books = [distinct_values(p) for p in parts]
    size = max(b.size for b in books)
    bits = params.get("bits")
    bits = bits_for(size) if bits is None else check_bits(bits)
    if size > 1 << bits:
        raise InputError(
            f"{size} distinct values do not fit a {bits}-bit palette (at most {1 << bits})",
            hint=f"cluster to {1 << bits} values first, or use bits={bits_for(size)}"
            if size <= 256
            else "cluster the tensor first (at most 256 values)",
        )
    indices = (
        np.concatenate([palette_indices(p, b) for p, b in zip(parts, books)])
        if flat.size
        else (np.zeros(0, dtype=np.uint8))
    )
    table = np.zeros((groups, size), dtype=array.dtype)
    for g, b in enumerate(books):
        table[g, : b.size] = b
    store = codebook_storage(table.ravel(), params.get("codebook_dtype"))
    huffman, rans = entropy_coder(params)
    codebook_blob = table.ravel().astype(store.newbyteorder("<")).tobytes()
    index_blob = encode_index_stream(indices, bits, huffman, rans)
    record = {
        "bits": bits,
        "codebook_size": int(size),
        "codebook_dtype": store.name,
        "groups": groups,
        **coder_fields(huffman, rans),
        "streams": {"codebook": len(codebook_blob), "indices": len(index_blob)},
    }
    return codebook_blob + index_blob, record


def read_codebook(reader: BlobReader, entries: int, dtype_name: object, dtype: np.dtype) -> np.ndarray:
    try:
        store = np.dtype(str(dtype_name))
    except TypeError as exc:
        raise InputError(f"record codebook_dtype {dtype_name!r} is not a dtype") from exc
    raw = reader.take(entries * store.itemsize, "codebook")
    return np.frombuffer(raw, dtype=store.newbyteorder("<")).astype(dtype)


def record_int(record: dict, key: str, lo: int, hi: int) -> int:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InputError(
            f"record field {key}={value!r} is out of range {lo} .. {hi}", hint="the weights index is damaged"
        )
    return value


def _palette_decode(blob: memoryview, record: dict) -> np.ndarray:
    shape = tuple(record["shape"])
    dtype = np.dtype(record["dtype"])
    count = int(np.prod(shape, dtype=np.int64))
    bits = record_int(record, "bits", 1, 8)
    size = record_int(record, "codebook_size", 0 if count == 0 else 1, 1 << bits)
    rows = shape[0] if shape else 1
    groups = record_int(record, "groups", 1, max(1, rows))
    reader = BlobReader(blob, "palette")
    codebook = read_codebook(reader, groups * size, record.get("codebook_dtype"), dtype).reshape(groups, size)
    huffman, rans = entropy_coder(record)
    indices = decode_index_stream(reader, count, bits, huffman, "palette indices", rans)
    reader.finish()
    if count and int(indices.max()) >= size:
        raise InputError(
            f"palette index {int(indices.max())} beyond the {size}-entry codebook",
            hint="the weights file is damaged",
        )
    group_of = np.repeat(np.arange(groups), group_sizes(shape, groups)) if groups > 1 else 0
    return codebook[group_of, indices].reshape(shape) if count else np.zeros(shape, dtype=dtype)


register(Codec("palette", _palette_encode, _palette_decode))
