"""The one codec choice: ``predict_bytes`` sizes a spec without encoding, ``choose_spec`` picks.

Every exporter (cpu, xla, metal, weights) and ``mconv optimize``'s predicted account decide a
tensor's codec here, through :func:`choose_spec` (or :func:`mconv.container.choose_codec`, which
reads the hints out of a model's metadata first).

Rules:
1. ``predict_bytes(array, spec)`` is the analytical size of ``encode(array, spec)``'s blob, from
   counts alone: element counts times bit widths for packed streams, symbol histograms times
   canonical Huffman code lengths (plus header, lengths table and sync table) for Huffman streams,
   normalised frequencies' bound (:mod:`mconv.codecs.rans` rule 4, plus header, frequency table
   and lane states) for rANS streams. No bit stream is built. It is exact, so "predicted vs actual bytes" differ only if a codec
   changes without its prediction.
2. ``choose_spec(array, hints)`` sizes every encoding that can hold the tensor and returns the
   smallest, lossless by construction. Candidates, in this order (ties go to the one listed
   first, the simpler): ``raw``; ``fp16`` when every value is fp16-exact (floats wider than 16
   bits); a dense ``palette`` when the distinct values (zero included) fit a palette; a grouped
   palette (:mod:`mconv.codecs.palette` rule 5) when the cluster pass used ``groups``
   output-channel groups along its recorded ``axis`` (0 when absent: Conv, Gemm; 1 for a
   MatMul's ``[in, out]`` weight), any axis of the tensor at least ``groups`` long, with
   ``axis`` in the spec when it is not 0, and every group's values fit a palette; a
   per-block palette (:mod:`mconv.codecs.palette` rule 7) when it used ``block`` values per
   codebook and every block's values fit a palette; ``sparse``
   with raw, fp16 (when exact) or palette values for the recorded ``index_bits``, else each of
   2..8; every palette and sparse candidate packed, then with canonical Huffman, then with rANS. A
   palette's width is the recorded ``bits`` when its values fit them, else the fewest bits that
   fit (at most 8, 256 values). A codec that cannot hold the tensor is no candidate: each
   condition is checked explicitly, and sizing never fails. Tensors other than bool, integer
   and float (up to 8 bytes), and empty ones, are ``raw``.
3. Hints are the facts the prune and cluster passes recorded per tensor in the model's
   ``metadata_props[COMPRESSION_KEY]`` (:mod:`mconv.edit.weights`): ``bits``,
   ``index_bits``, ``groups``, ``axis``, ``block``. They only narrow widths and add the grouped
   and per-block palettes; a hint of the wrong type or out of range (a damaged or hostile file;
   an ``axis`` that is not an axis of the tensor) is ignored, which still gives a lossless
   choice.
4. The tensor is analysed once: nonzero positions and value histograms are shared by every
   candidate. Before that, two linear checks skip the analysis (the sort) when no coded
   candidate could be smaller than raw or fp16: the nonzero values alone are at least that
   large, and a prefix of the tensor already holds more than 257 distinct bit patterns (more
   than any palette, sparse or dense, can hold). Skipping never changes the result. A
   ``groups`` or ``block`` hint always analyses (a per-group or per-block palette can hold a
   tensor with far more distinct values than 257).
5. Sparse candidates are sized from one histogram of the gaps (gaps below 256 counted, the
   few larger ones kept), so the 7 index widths x value codecs x Huffman candidates cost a
   few thousand operations each, not a pass over every nonzero (a 37.7M-weight fc6 tensor has
   60 candidates; a pass over its nonzeros costs about 0.25 s each).
6. "Smallest" counts what the candidate's record adds to the container's index
   (:func:`record_extra`, a constant per codec and per optional field: ``rans``, a per-block
   palette's ``block``, a grouped palette's ``axis`` (7 bytes); within a few bytes of the real
   record): a sparse record of an all-zero scalar costs about 20 bytes more than a raw one, so a
   tensor of a few bytes stays raw (quantized models have dozens of one-element zero points). On tensors
   of more than a few dozen bytes the records' few bytes rarely matter: the choice is in effect
   the smallest blob.
7. Stream sizes are memoised by coder and symbol counts (a bounded table): the budget search
   sizes the same gap histogram under every bit width of a sparsity and the same index
   histogram under several specs, and planning a rANS or Huffman stream is most of a
   candidate's cost (without the table the digits MLP's search sizes about 3x slower,
   ``bench/deep_compression.py``). Sizes are a pure function of the counts, so the cache never
   changes a result.
8. A tensor whose histogram a pass left (:mod:`mconv.codecs.palette` rule 8, the cluster pass)
   is not counted again: its palettes are sized from that histogram, fp16 exactness is its
   distinct values', rule 4's checks are not needed, and when it holds no ``+0.0`` (every gap
   0) its values are not read at all (an array spilled to a scratch file stays unread).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from mconv.codecs import rans
from mconv.codecs.bitstream import packed_nbytes
from mconv.codecs.huffman import HEADER_BYTES, encoded_nbytes
from mconv.codecs.palette import (
    BlockPalettes,
    GroupPalettes,
    bit_view,
    bits_for,
    block_palettes,
    check_axis,
    check_block,
    codebook_storage,
    group_palettes,
    known_histogram,
    palette_indices,
    value_histogram,
)
from mconv.errors import InputError

# Gaps below this are counted in a histogram (index_bits <= 8, so every span fits in it).
_GAP_SPLIT = 256

# Elements per chunk of TensorStats.of's scan (a few MB of temporaries however large the tensor).
_STATS_CHUNK = 1 << 22


def _add_gap(small: np.ndarray, large: list[np.ndarray], gap: int) -> None:
    if gap < _GAP_SPLIT:
        small[gap] += 1
    else:
        large.append(np.array([gap], dtype=np.int64))


# The model metadata key under which the prune and cluster passes record per-tensor facts.
COMPRESSION_KEY = "mconv.compression"


@dataclass
class TensorStats:
    """What sizing needs of one tensor, computed once, chunk by chunk (rules 4, 5)."""

    array: np.ndarray
    count: int
    nonzero_values: np.ndarray
    fp16_exact: bool
    # counts of the gaps (implied zeros before each nonzero, rule 2 of sparse) below
    # _GAP_SPLIT, and the larger gaps themselves
    small_gaps: np.ndarray
    large_gaps: np.ndarray
    _hist: dict = field(default_factory=dict)

    @classmethod
    def of(
        cls, array: np.ndarray, fp16: bool | None = None, known: tuple[np.ndarray, np.ndarray] | None = None
    ) -> TensorStats:
        """The stats of ``array``; ``known`` (default: what :func:`known_histogram` has for it) is
        its value histogram, exact (rule 8)."""
        known = known if known is not None else known_histogram(array)
        if known is not None and int(known[1].sum()) != np.size(array):
            known = None  # not this array's (a caller's mistake): count it
        if known is not None:
            book, counts = known
            if fp16 is None:
                fp16 = fp16_exact(book)
            if not np.any(bit_view(book) == 0):  # no +0.0: every gap is 0, nothing to read
                small = np.zeros(_GAP_SPLIT, dtype=np.int64)
                small[0] = int(counts.sum())
                stats = cls(
                    np.asarray(array), int(counts.sum()), np.ravel(array), fp16, small, np.zeros(0, np.int64)
                )
                stats._hist["dense"] = stats._hist["nonzero"] = known
                return stats
        stats = cls._scan(array, fp16)
        if known is not None:
            stats._hist["dense"] = known
            nonzero = bit_view(known[0]) != 0
            stats._hist["nonzero"] = (known[0][nonzero], known[1][nonzero])
        return stats

    @classmethod
    def _scan(cls, array: np.ndarray, fp16: bool | None) -> TensorStats:
        flat = np.ascontiguousarray(array).ravel()
        bits = bit_view(flat)
        small = np.zeros(_GAP_SPLIT, dtype=np.int64)
        large: list[np.ndarray] = []
        values: list[np.ndarray] = []
        previous = -1  # position of the last nonzero so far
        for start in range(0, flat.size, _STATS_CHUNK):
            part = bits[start : start + _STATS_CHUNK]
            if np.all(part != 0):  # dense: every gap 0, the values are the chunk itself
                _add_gap(small, large, start - previous - 1)
                small[0] += part.size - 1
                values.append(flat[start : start + _STATS_CHUNK])
                previous = start + part.size - 1
                continue
            positions = np.flatnonzero(part) + start
            if positions.size == 0:
                continue
            gaps = np.diff(positions, prepend=previous) - 1
            big = gaps >= _GAP_SPLIT
            small += np.bincount(gaps[~big], minlength=_GAP_SPLIT)
            if big.any():
                large.append(gaps[big])
            values.append(flat[positions])
            previous = int(positions[-1])
        nonzeros = sum(v.size for v in values)
        # a tensor without zeros is its own list of nonzero values (no copy)
        nonzero_values = flat if nonzeros == flat.size else np.concatenate(values) if values else flat[:0]
        return cls(
            np.asarray(array),
            flat.size,
            nonzero_values,
            fp16_exact(flat) if fp16 is None else fp16,
            small,
            np.concatenate(large).astype(np.int64) if large else np.zeros(0, dtype=np.int64),
        )

    @property
    def nonzeros(self) -> int:
        return int(self.nonzero_values.size)

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

    def gap_counts(self, span: int) -> tuple[int, np.ndarray]:
        """Fillers and the histogram of stored gaps (``gap % span``, fillers counted at
        ``span - 1``) of a sparse stream with ``span = 2**index_bits`` (rule 5): from the
        histogram of the gaps, never another pass over them."""
        key = ("gaps", span)
        if key not in self._hist:
            small, large = self.small_gaps, self.large_gaps
            values = np.arange(small.size)
            fillers = int((small * (values // span)).sum()) + int((large // span).sum())
            counts = np.bincount(values % span, weights=small, minlength=span).astype(np.int64)
            counts += np.bincount(large % span, minlength=span)
            counts[span - 1] += fillers
            self._hist[key] = (fillers, counts)
        return self._hist[key]

    def block_palettes(self, block: int) -> BlockPalettes:
        """Rule 7 of :mod:`mconv.codecs.palette`: every block's codebook and the index counts
        (no indices), for blocks of ``block`` values; ``overflow`` when a block holds more than
        256 values."""
        key = ("block", block)
        if key not in self._hist:
            self._hist[key] = block_palettes(self.array, block, 256, want_indices=False)
        return self._hist[key]

    def group_palettes(self, groups: int, axis: int) -> GroupPalettes:
        """Rule 5 of :mod:`mconv.codecs.palette`: every group's codebook and the index counts
        (no indices), for ``groups`` groups along ``axis``; ``overflow`` when a group holds more
        than 256 values."""
        key = ("groups", groups, axis)
        if key not in self._hist:
            self._hist[key] = group_palettes(self.array, groups, axis, 256, want_indices=False)
        return self._hist[key]

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


def _coder(spec: Mapping) -> str:
    """The entropy coder of a spec: ``packed``, ``huffman`` or ``rans``."""
    return "rans" if spec.get("rans") else "huffman" if spec.get("huffman") else "packed"


# Stream sizes by (coder, counts): the budget search sizes the same gap and index histograms
# under many candidates (one sparsity's gap stream under every bit width, the same palette under
# sparse and dense specs), and planning a stream is most of a candidate's cost (rule 7).
_STREAM_CACHE: dict[tuple[str, bytes], int] = {}
_STREAM_CACHE_MAX = 1 << 14


def _stream_bytes(counts: np.ndarray, coder: str) -> int:
    """Bytes of a Huffman or rANS stream with these symbol counts (the whole alphabet)."""
    counts = np.asarray(counts, dtype=np.int64)
    key = (coder, counts.tobytes())
    size = _STREAM_CACHE.get(key)
    if size is None:
        size = rans.encoded_nbytes(counts) if coder == "rans" else encoded_nbytes(counts)
        if len(_STREAM_CACHE) >= _STREAM_CACHE_MAX:
            _STREAM_CACHE.clear()
        _STREAM_CACHE[key] = size
    return size


def _index_stream_bytes(counts: np.ndarray, bits: int, coder: str) -> int:
    if coder != "packed":
        return _stream_bytes(np.pad(counts, (0, (1 << bits) - counts.size)), coder)
    return packed_nbytes(int(counts.sum()), bits)


def _palette_part(book: np.ndarray, counts: np.ndarray, spec: dict, huffman: str, groups: int = 1) -> int:
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


def _block_palette_bytes(stats: TensorStats, spec: dict, huffman: str) -> int:
    """A per-block palette (palette rule 7): one codebook per block, each as long as the
    largest, and the index stream over every block's index counts."""
    block = min(check_block(spec["block"]), stats.count)
    if int(spec.get("groups", 1)) > 1 or spec.get("codebook") is not None:
        raise InputError("block cannot be combined with groups or a codebook")
    return _palettes_bytes(stats.block_palettes(block), spec, huffman, "block")


def _grouped_palette_bytes(stats: TensorStats, spec: dict, groups: int, huffman: str) -> int:
    """A grouped palette (palette rule 5): one codebook per group along ``axis``, each as long as
    the largest, and the index stream over every group's index counts."""
    shape = stats.array.shape
    axis = 0 if spec.get("axis") is None else check_axis(spec["axis"], shape)
    if not shape or groups > shape[axis] or spec.get("codebook") is not None:
        raise InputError(f"groups={groups} does not split axis {axis} of shape {list(shape)}")
    return _palettes_bytes(stats.group_palettes(groups, axis), spec, huffman, "group")


def _palettes_bytes(found, spec: dict, huffman: str, what: str) -> int:
    """The blob of per-block or per-group palettes ``found``: every codebook as long as the
    largest, then the index stream over their index counts."""
    bits = spec.get("bits")
    if found.overflow is not None or (bits is not None and found.size > 1 << int(bits)):
        raise InputError(f"a {what}'s {found.size} distinct values do not fit a palette of bits={bits}")
    assert found.table is not None and found.counts is not None
    bits = bits_for(found.size) if bits is None else int(bits)
    store = codebook_storage(found.table.ravel(), spec.get("codebook_dtype"))
    return found.table.size * store.itemsize + _index_stream_bytes(found.counts, bits, huffman)


def predict(stats: TensorStats, spec: dict) -> int:
    """Blob bytes of ``spec`` for the analysed tensor (rule 1)."""
    codec = spec.get("codec", "raw")
    itemsize = stats.array.dtype.itemsize
    huffman = _coder(spec)
    if codec == "raw":
        return stats.count * itemsize
    if codec == "fp16":
        return stats.count * 2
    if codec == "palette":
        if spec.get("axis") is not None:  # palette rule 5, refused as encode refuses it
            check_axis(spec["axis"], stats.array.shape)
            if spec.get("block") is not None or spec.get("codebook") is not None:
                raise InputError("axis cannot be combined with block or an explicit codebook")
        if spec.get("block") is not None and stats.count:
            return _block_palette_bytes(stats, spec, huffman)
        groups = int(spec.get("groups", 1))
        if groups > 1:
            return _grouped_palette_bytes(stats, spec, groups, huffman)
        book, counts = stats.dense_histogram()
        if spec.get("codebook") is not None:
            book, counts = _explicit_counts(book, counts, spec["codebook"])
        return _palette_part(book, counts, spec, huffman)
    if codec == "sparse":
        index_bits = int(spec.get("index_bits", 4))
        span = 1 << index_bits
        fillers, gap_counts = stats.gap_counts(span)
        entries = stats.nonzeros + fillers
        if huffman != "packed":
            total = _stream_bytes(gap_counts, huffman)
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


def compression_hints(model_metadata: Mapping[str, str] | None, name: str | None) -> dict:
    """The facts the prune and cluster passes recorded for tensor ``name`` under
    ``model_metadata[COMPRESSION_KEY]`` (rule 3), or {} (no record, or one that is not JSON)."""
    if not model_metadata or not name or COMPRESSION_KEY not in model_metadata:
        return {}
    try:
        info = json.loads(model_metadata[COMPRESSION_KEY])
    except (TypeError, ValueError, RecursionError):
        return {}
    entry = info.get(name) if isinstance(info, dict) else None
    return dict(entry) if isinstance(entry, dict) else {}


def _hint_int(hints: Mapping, key: str, lo: int, hi: int) -> int | None:
    """``hints[key]`` when it is an integer in ``lo .. hi``, else None (rule 3: hints are advice)."""
    value = hints.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
        return None
    return int(value)


def _width(entries: int, recorded: int | None) -> int | None:
    """Index bits for a codebook of ``entries`` values (rule 2): the recorded width when they fit
    it, else the fewest that fit; None when more than 256 values (no palette)."""
    if entries < 1:
        return None
    if recorded is not None and entries <= 1 << recorded:
        return recorded
    return bits_for(entries) if entries <= 256 else None


# The prefix whose distinct bit patterns are counted before the tensor is analysed (rule 4).
_PREFIX = 1 << 14


def _coded_may_win(flat: np.ndarray, fp16: bool, best: int) -> bool:
    """Whether a palette or sparse spec can be smaller than ``best`` bytes (rule 4), from lower
    bounds that need no sort of the tensor: sparse values take 2 bytes (fp16) or the itemsize
    each; a palette stores a codebook entry (as narrow) per distinct value, nonzero ones for a
    sparse palette, counted in a prefix (no more than in the tensor), and its index stream
    takes at least a bit per element or a Huffman header."""
    narrow = 2 if fp16 else flat.dtype.itemsize
    nonzeros = int(np.count_nonzero(bit_view(flat)))
    if nonzeros * narrow < best:
        return True
    seen = np.sort(bit_view(flat[:_PREFIX]))  # a plain sort: np.unique hashes, slower here
    distinct = 1 + int(np.count_nonzero(seen[1:] != seen[:-1]))
    seen_nonzero = distinct - int(seen[0] == 0)  # ascending: the zero pattern comes first

    def palette_may_win(entries: int, indices: int) -> bool:
        return entries <= 256 and entries * narrow + min((indices + 7) // 8, HEADER_BYTES) < best

    return palette_may_win(distinct, int(flat.size)) or palette_may_win(seen_nonzero, nonzeros)


def _specs_and_sizes(
    array: np.ndarray, hints: Mapping | None, stats: TensorStats | None = None
) -> list[tuple[dict, int]]:
    """The candidates of rule 2 in their order, each with its predicted size; ``stats``, when
    given, are ``array``'s."""
    count = int(array.size)
    itemsize = array.dtype.itemsize
    out: list[tuple[dict, int]] = [({"codec": "raw"}, count * itemsize)]
    if count == 0 or array.dtype.kind not in "fiub" or itemsize > 8:
        return out
    hints = hints or {}
    bits = _hint_int(hints, "bits", 1, 8)
    index_bits = _hint_int(hints, "index_bits", 1, 8)
    groups = _hint_int(hints, "groups", 1, 1 << 62) or 1
    axis = _hint_int(hints, "axis", 0, array.ndim - 1) if "axis" in hints else 0
    grouped = groups > 1 and axis is not None and array.ndim >= 1 and array.shape[axis] >= groups
    block = _hint_int(hints, "block", 1, 1 << 62)
    wide_float = array.dtype.kind == "f" and itemsize > 2
    known = known_histogram(array) if stats is None else None
    if known is not None:
        stats = TensorStats.of(array, known=known)  # rule 8
    if stats is not None:
        fp16 = wide_float and stats.fp16_exact
        if fp16:
            out.append(({"codec": "fp16"}, count * 2))
    else:
        flat = np.ascontiguousarray(array).ravel()
        fp16 = wide_float and fp16_exact(flat)
        if fp16:
            out.append(({"codec": "fp16"}, count * 2))
        if not (grouped or block or _coded_may_win(flat, fp16, min(size for _, size in out))):
            return out  # rule 4
        stats = TensorStats.of(array, fp16 if wide_float else None)
    coded: list[dict] = []
    b = _width(stats.dense_histogram()[0].size, bits)
    if b is not None:
        coded.append({"codec": "palette", "bits": b})
    if grouped:
        assert axis is not None
        found_groups = stats.group_palettes(groups, axis)
        b = _width(found_groups.size, bits) if found_groups.overflow is None else None
        if b is not None:
            coded.append(
                {"codec": "palette", "bits": b, "groups": groups, **({"axis": axis} if axis else {})}
            )
    if block:
        found = stats.block_palettes(min(block, count))
        b = _width(found.size, bits) if found.overflow is None else None
        if b is not None:
            coded.append({"codec": "palette", "bits": b, "block": block})
    nonzero_distinct = stats.nonzero_histogram()[0].size
    for ib in [index_bits] if index_bits is not None else range(2, 9):
        sparse = {"codec": "sparse", "index_bits": ib}
        coded.append({**sparse, "values": "raw"})
        if fp16:
            coded.append({**sparse, "values": "fp16"})
        fillers = stats.gap_counts(1 << ib)[0] > 0
        b = _width(nonzero_distinct + fillers, bits)
        if b is not None:
            coded.append({**sparse, "values": "palette", "bits": b})
    for spec in coded:
        for coder in ({"huffman": False}, {"huffman": True}, {"huffman": False, "rans": True}):
            candidate = {**spec, **coder}
            out.append((candidate, predict(stats, candidate)))
    return out


# What a coded record costs in a version 4 container index beyond a raw one (rule 6): one to
# three bytes per field (a word, a tag, a small varint); a slim record leaves out the fields
# the reader derives (float32, a palette's groups 1, huffman false, float16 codebook, streams).
# Measured on version 4 records (within 3 bytes: varints of counts grow with the tensor).
_RECORD_EXTRA = {"palette": 6, "sparse": 23}
_PALETTE_VALUES_EXTRA = 11  # a sparse record's palette fields
_RANS_EXTRA = 2  # its "rans": true
_HUFFMAN_EXTRA = 2  # "huffman": true (false is left out)
_GROUPS_EXTRA = 3  # a grouped palette's "groups" (1 is left out)
_BLOCK_EXTRA = 21  # a per-block palette's "block" (a literal word), "groups" and its streams
_AXIS_EXTRA = 7  # a grouped palette's "axis" (a literal word, a tag and a one-byte varint)
_CODEBOOK_DTYPE_EXTRA = 3  # a codebook not in float16 (a tensor not float32): its dtype is stored


def record_extra(spec: Mapping, dtype: np.dtype | None = None) -> int:
    """Index bytes of ``spec``'s record beyond a raw record's, within a few bytes (rule 6), for
    a tensor of ``dtype`` (float32 when not given)."""
    extra = _RECORD_EXTRA.get(str(spec.get("codec")), 0)
    palette = spec.get("codec") == "palette" or spec.get("values") == "palette"
    if palette and dtype is not None and np.dtype(dtype) != np.float32:
        extra += _CODEBOOK_DTYPE_EXTRA
    if spec.get("codec") == "sparse" and spec.get("values") == "palette":
        extra += _PALETTE_VALUES_EXTRA
    if spec.get("rans"):
        extra += _RANS_EXTRA
    if spec.get("huffman"):
        extra += _HUFFMAN_EXTRA
    if spec.get("codec") == "palette" and spec.get("block") is not None:
        extra += _BLOCK_EXTRA
    elif spec.get("codec") == "palette" and spec.get("groups", 1) != 1:
        extra += _GROUPS_EXTRA
        if spec.get("axis"):
            extra += _AXIS_EXTRA  # palette rule 5: the record has "axis" only with groups > 1
    return extra


def best_spec(
    array: np.ndarray, hints: Mapping | None = None, stats: TensorStats | None = None
) -> tuple[dict, int]:
    """The smallest candidate spec for ``array`` (rule 2), its index record counted (rule 6),
    and its exact blob size (rule 1); ``stats``, when given, are ``array``'s."""
    candidates = _specs_and_sizes(np.asarray(array), hints, stats)
    dtype = np.asarray(array).dtype
    costs = [size + record_extra(spec, dtype) for spec, size in candidates]
    spec, size = candidates[costs.index(min(costs))]  # the first of the cheapest: the simplest
    return spec, size


def choose_spec(array: np.ndarray, hints: Mapping | None = None) -> dict:
    """The one codec choice for a weight tensor (rule 2); ``hints`` are its compression facts."""
    return best_spec(array, hints)[0]
