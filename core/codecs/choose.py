"""Codec choice by size: ``predict_bytes`` sizes a spec without encoding, ``choose_spec`` picks.

Rules:
1. ``predict_bytes(array, spec)`` is the analytical size of ``encode(array, spec)``'s blob, from
   counts alone: element counts times bit widths for packed streams, symbol histograms times
   canonical Huffman code lengths (plus header, lengths table and sync table) for Huffman streams.
   No bit stream is built. It is exact, so "predicted vs actual bytes" differ only if a codec
   changes without its prediction.
2. ``choose_spec(array, bits=, index_bits=, huffman=)`` sizes every applicable encoding and
   returns the smallest spec: ``raw``; ``fp16`` when every value is fp16-exact; dense ``palette``
   when the distinct values fit ``bits`` (any bits up to 8 when ``bits`` is None); ``sparse`` with
   raw, fp16 or palette values for each ``index_bits`` (2..8 when None). Ties go to the simpler
   codec (listed first). The tensor is analysed once: nonzero positions and value histograms are
   shared by every candidate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from mconv.codecs.bitstream import packed_nbytes
from mconv.codecs.huffman import encoded_nbytes
from mconv.codecs.palette import (
    bit_view,
    bits_for,
    codebook_storage,
    group_sizes,
    palette_indices,
    value_histogram,
)
from mconv.errors import InputError


@dataclass
class TensorStats:
    """What sizing needs of one tensor, computed once."""

    array: np.ndarray
    count: int
    gaps: np.ndarray  # implied zeros before each nonzero (rule 2 of sparse)
    nonzero_values: np.ndarray
    fp16_exact: bool
    _hist: dict = field(default_factory=dict)

    @classmethod
    def of(cls, array: np.ndarray) -> TensorStats:
        flat = np.ascontiguousarray(array).ravel()
        positions = np.flatnonzero(bit_view(flat) != 0)
        gaps = np.diff(positions, prepend=-1) - 1
        return cls(np.asarray(array), flat.size, gaps, flat[positions], fp16_exact(flat))

    def dense_histogram(self) -> tuple[np.ndarray, np.ndarray]:
        """Histogram of every element: the nonzero one plus the all-zero bit pattern, so the
        tensor itself is never sorted (the nonzeros of a pruned tensor are a few percent)."""
        if "dense" not in self._hist:
            book, counts = self.nonzero_histogram()
            zeros = self.count - self.nonzero_values.size
            if zeros:
                book = np.concatenate([book, np.zeros(1, dtype=book.dtype)])
                counts = np.concatenate([counts, [zeros]])
                order = np.lexsort((bit_view(book), book))  # the order distinct_values gives
                book, counts = book[order], counts[order]
            self._hist["dense"] = (book, counts)
        return self._hist["dense"]

    def nonzero_histogram(self) -> tuple[np.ndarray, np.ndarray]:
        if "nonzero" not in self._hist:
            self._hist["nonzero"] = value_histogram(self.nonzero_values)
        return self._hist["nonzero"]


def fp16_exact(flat: np.ndarray, chunk: int = 1 << 20) -> bool:
    """Whether every element round-trips through float16 bit for bit (chunked: no full copies)."""
    if flat.dtype.kind != "f":
        return False
    with np.errstate(over="ignore"):
        for start in range(0, flat.size, chunk):
            part = flat[start : start + chunk]
            if not np.array_equal(bit_view(part.astype(np.float16).astype(flat.dtype)), bit_view(part)):
                return False
    return True


def _index_stream_bytes(counts: np.ndarray, bits: int, huffman: bool) -> int:
    if huffman:
        return encoded_nbytes(np.pad(counts, (0, (1 << bits) - counts.size)))
    return packed_nbytes(int(counts.sum()), bits)


def _palette_part(book: np.ndarray, counts: np.ndarray, spec: dict, huffman: bool, groups: int = 1) -> int:
    bits = spec.get("bits")
    bits = bits_for(book.size) if bits is None else int(bits)
    if book.size > 1 << bits:
        raise InputError(f"{book.size} distinct values do not fit a {bits}-bit palette")
    store = codebook_storage(book, spec.get("codebook_dtype"))
    return groups * book.size * store.itemsize + _index_stream_bytes(counts, bits, huffman)


def _explicit_counts(values: np.ndarray, counts: np.ndarray, codebook) -> tuple[np.ndarray, np.ndarray]:
    book = np.asarray(codebook, dtype=values.dtype).ravel()
    return book, np.bincount(palette_indices(values, book), weights=counts, minlength=book.size).astype(
        np.int64
    )


def predict(stats: TensorStats, spec: dict) -> int:
    """Blob bytes of ``spec`` for the analysed tensor (rule 1)."""
    codec = spec.get("codec", "raw")
    itemsize = stats.array.dtype.itemsize
    huffman = bool(spec.get("huffman", False))
    if codec == "raw":
        return stats.count * itemsize
    if codec == "fp16":
        return stats.count * 2
    if codec == "palette":
        groups = int(spec.get("groups", 1))
        if groups > 1:
            flat = np.ascontiguousarray(stats.array).ravel()
            parts = np.split(flat, np.cumsum(group_sizes(stats.array.shape, groups))[:-1])
            hists = [value_histogram(p) for p in parts]
            size = max(h[0].size for h in hists)
            counts = np.zeros(size, dtype=np.int64)
            table = np.zeros((groups, size), dtype=flat.dtype)
            for g, (book, c) in enumerate(hists):
                counts[: c.size] += c
                table[g, : book.size] = book
            bits = spec.get("bits")
            bits = bits_for(size) if bits is None else int(bits)
            store = codebook_storage(table.ravel(), spec.get("codebook_dtype"))
            return groups * size * store.itemsize + _index_stream_bytes(counts, bits, huffman)
        book, counts = stats.dense_histogram()
        if spec.get("codebook") is not None:
            book, counts = _explicit_counts(book, counts, spec["codebook"])
        return _palette_part(book, counts, spec, huffman)
    if codec == "sparse":
        index_bits = int(spec.get("index_bits", 4))
        span = 1 << index_bits
        fillers = int((stats.gaps // span).sum())
        entries = stats.gaps.size + fillers
        if huffman:
            gap_counts = np.bincount(stats.gaps % span, minlength=span)
            gap_counts[span - 1] += fillers
            total = encoded_nbytes(gap_counts)
        else:
            total = packed_nbytes(entries, index_bits)
        values = spec.get("values", "raw")
        if values == "raw":
            return total + entries * itemsize
        if values == "fp16":
            return total + entries * 2
        book, counts = stats.nonzero_histogram()
        if fillers:  # the fillers' +0.0 is one more codebook value (never among the nonzeros)
            book = np.concatenate([book, np.zeros(1, dtype=book.dtype)])
            counts = np.concatenate([counts, [fillers]])
            order = np.lexsort((bit_view(book), book))  # the order distinct_values gives
            book, counts = book[order], counts[order]
        if spec.get("codebook") is not None:
            book, counts = _explicit_counts(book, counts, spec["codebook"])
        return total + _palette_part(book, counts, spec, huffman)
    raise InputError(f"cannot size codec {codec!r}", hint="use raw, fp16, palette or sparse")


def predict_bytes(array: np.ndarray, spec: dict) -> int:
    """Analytical blob size of ``encode(array, spec)`` (rule 1)."""
    return predict(TensorStats.of(np.asarray(array)), spec)


def choose_spec(
    array: np.ndarray, *, bits: int | None = None, index_bits: int | None = None, huffman: bool = True
) -> dict:
    """The smallest applicable spec for ``array`` (rule 2)."""
    array = np.asarray(array)
    if array.dtype.kind not in "fiub" or array.dtype.itemsize > 8:
        return {"codec": "raw"}
    stats = TensorStats.of(array)
    candidates: list[dict] = [{"codec": "raw"}]
    if stats.fp16_exact and array.dtype.itemsize > 2:
        candidates.append({"codec": "fp16"})
    distinct = stats.dense_histogram()[0].size
    limit = 256 if bits is None else 1 << bits
    if 0 < distinct <= limit:
        candidates.append({"codec": "palette", "bits": bits or bits_for(distinct), "huffman": huffman})
    nonzero_distinct = stats.nonzero_histogram()[0].size
    for ib in [index_bits] if index_bits else range(2, 9):
        base = {"codec": "sparse", "index_bits": ib, "huffman": huffman}
        candidates.append({**base, "values": "raw"})
        if stats.fp16_exact and array.dtype.itemsize > 2:
            candidates.append({**base, "values": "fp16"})
        fillers = bool((stats.gaps >= 1 << ib).any())
        need = nonzero_distinct + fillers
        if need <= limit:
            candidates.append({**base, "values": "palette", "bits": bits or bits_for(need)})
    sizes = [predict(stats, c) for c in candidates]
    return candidates[int(np.argmin(sizes))]
