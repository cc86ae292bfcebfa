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
5. ``groups=G`` splits axis ``axis=A`` (default 0, the output channels of a Conv ``[out, in,
   kh, kw]`` or a Gemm ``[out, in]``; 1 for a MatMul's ``[in, out]`` weight) into G contiguous
   groups the way ``np.array_split`` does: the element at multi-index ``i`` belongs to group
   ``g(i[A])``. Each group has its own codebook, its distinct values in rule 2's order;
   codebooks are padded to the largest group's size with zeros that no index refers to. The
   index stream stays in element (C) order. ``axis`` is an int ``0 <= A < ndim``, only
   meaningful with ``groups > 1``, and combines neither with ``block`` nor with a ``codebook``.
   The record has ``axis`` only when ``A != 0`` and ``groups > 1``, so axis-0 records are
   unchanged. Decoders that predate ``axis`` ignore it and would read such a record as axis-0
   groups (wrong values, no error, whenever ``groups <= shape[0]``): records with ``axis``
   need this module's decoders (Python, decoder.c, mcw.js, the metal bundle's Swift).
6. Indices are packed LSB-first at exactly ``bits`` bits (``bitstream.pack_bits``), or with
   ``huffman=True`` coded by canonical Huffman over the 2**bits index alphabet, or with
   ``rans=True`` by interleaved rANS (:mod:`mconv.codecs.rans`) over it. The record always has
   ``huffman`` and has ``rans: true`` only when rANS is used.
7. ``block=B`` (an int >= 1; not with ``groups > 1`` nor with a ``codebook``) cuts the tensor,
   flattened in C order, into consecutive blocks of B values (the last one shorter when B does
   not divide the size), each with its own codebook: the block's distinct values in rule 2's
   order (by value, then bit pattern, NaNs last by bit pattern; :func:`order_keys` is that
   order as unsigned integers), found for all blocks at once, :data:`BLOCK_CHUNK` values at a
   time. For a row-major ``[rows, cols]`` weight with B dividing ``cols`` a block is B
   consecutive values of one row. ``codebook_size`` is the most distinct values of any block,
   shorter codebooks padded with zeros no index refers to (as rule 5); with ``bits`` given, a
   block holding more than ``2**bits`` values is an ``InputError`` naming it. The index stream
   is the blocks' indices in element order, coded as rule 6 says. The record has
   ``block = min(B, count)`` and ``groups`` = the number of blocks, ``ceil(count / block)``
   (the codebook layout of rule 5); it has no ``block`` when none was asked for, nor for an
   empty tensor (nothing to split), and such records decode exactly as before. Decoders that
   predate ``block`` refuse a record whose ``groups`` exceeds ``shape[0]`` (any B smaller than
   a row), but one with fewer blocks than rows they would read as axis-0 groups, which is
   right only when the blocks are those groups: records with ``block`` need this module's
   decoders (Python, decoder.c, mcw.js, the metal bundle's Swift).

8. Histograms known without counting: a pass that writes a tensor and knows its values'
   histogram exactly (the cluster pass, from its bins) leaves it with
   :func:`remember_histogram` on the array it wrote (made read-only, so that it cannot change
   under the histogram) and the IR tensor that holds it; :func:`value_histogram` of that array
   and :func:`known_histogram` of either answer from it while the object lives. A tensor
   spilled to the scratch folder is a file written once. Nothing is kept across processes.

Blob: ``codebook[groups * codebook_size]`` (little-endian ``codebook_dtype``; group or block
``g``'s entries at ``g * codebook_size``), then the index stream. Record: ``bits,
codebook_size, codebook_dtype, groups, huffman``, ``axis`` (rule 5), ``block`` (rule 7) and
``rans`` (rule 6) when used, and ``streams = {"codebook": bytes, "indices": bytes}``.
"""

from __future__ import annotations

import math
import weakref
from typing import NamedTuple

import numpy as np
from mconv.codecs import Codec, register
from mconv.codecs import rans as rans_codec
from mconv.codecs.bitstream import BlobReader, pack_bits, packed_nbytes, unpack_bits
from mconv.codecs.huffman import decode_symbols, encode_symbols
from mconv.errors import InputError

PALETTE_PARAMS = ("bits", "codebook", "codebook_dtype", "huffman", "rans", "groups", "axis", "block")


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
    return _merge_histograms(keys, counts, bits[:0])


def _merge_histograms(
    keys: list[np.ndarray], counts: list[np.ndarray], empty: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """One histogram (patterns ascending) of several, each with its patterns ascending."""
    if not keys:
        return empty.copy(), np.zeros(0, dtype=np.int64)
    if len(keys) == 1:
        return keys[0], counts[0].astype(np.int64)
    merged, inverse = np.unique(np.concatenate(keys), return_inverse=True)
    return merged, np.bincount(inverse, weights=np.concatenate(counts), minlength=merged.size).astype(
        np.int64
    )


def _ordered(patterns: np.ndarray, counts: np.ndarray, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Values with these distinct bit patterns (ascending) in rule 2's order, and their counts."""
    udtype = bit_view(np.zeros(0, dtype)).dtype
    uniq = patterns.astype(udtype, copy=False).view(dtype)
    order = np.lexsort((bit_view(uniq), uniq))
    return uniq[order], counts[order]


# rule 8: id(object) -> (a weak reference to it, distinct values, counts)
_KNOWN: dict[int, tuple[weakref.ref, np.ndarray, np.ndarray]] = {}


def remember_histogram(obj: object, values: np.ndarray, counts: np.ndarray) -> None:
    """Rule 8: ``values`` (in rule 2's order) and ``counts`` are the exact histogram of ``obj``,
    an array (made read-only here) or the IR tensor holding one."""
    held = getattr(obj, "raw", None)  # an IR tensor over an array: that array too
    for array in (obj, held):
        if isinstance(array, np.ndarray):
            array.flags.writeable = False
    values, counts = np.array(values), np.array(counts, dtype=np.int64)
    values.flags.writeable = counts.flags.writeable = False
    key = id(obj)

    def forget(_ref: weakref.ref, key: int = key) -> None:
        _KNOWN.pop(key, None)

    _KNOWN[key] = (weakref.ref(obj, forget), values, counts)


def known_histogram(obj: object) -> tuple[np.ndarray, np.ndarray] | None:
    """The histogram :func:`remember_histogram` left for this very object, or None (rule 8)."""
    entry = _KNOWN.get(id(obj))
    if entry is None or entry[0]() is not obj:
        return None
    if isinstance(obj, np.ndarray) and obj.flags.writeable:  # made writable again: not trusted
        return None
    return entry[1], entry[2]


def counted_histogram(
    values: np.ndarray, counts: np.ndarray, dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray]:
    """The histogram, in :func:`value_histogram`'s form, of a tensor that holds ``counts[i]``
    copies of ``values[i]`` (cast to ``dtype``; repeated values and zero counts allowed)."""
    bits = bit_view(np.asarray(values).astype(dtype, copy=False)).ravel()
    counts = np.asarray(counts, dtype=np.int64).ravel()
    keep = counts > 0
    patterns, inverse = np.unique(bits[keep], return_inverse=True)
    summed = np.bincount(inverse.ravel(), weights=counts[keep], minlength=patterns.size)
    return _ordered(patterns, summed.astype(np.int64), np.dtype(dtype))


def value_histogram(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``distinct_values(values)`` and how often each occurs, in the same order."""
    known = known_histogram(values)
    if known is not None:
        return known
    flat = np.ascontiguousarray(values).ravel()
    return _ordered(*_bit_histogram(bit_view(flat)), flat.dtype)


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


def group_sizes(shape: tuple[int, ...], groups: int, axis: int = 0) -> list[int]:
    """Elements per group when axis ``axis`` is split like ``np.array_split`` (rule 5)."""
    rows = shape[axis] if shape else 1
    rest = int(np.prod(shape[:axis] + shape[axis + 1 :], dtype=np.int64)) if shape else 1
    base, extra = divmod(rows, groups)
    return [(base + (g < extra)) * rest for g in range(groups)]


def axis_bounds(length: int, groups: int) -> list[int]:
    """The first position of each of ``groups`` groups of ``length`` positions split like
    ``np.array_split``, then ``length`` (rule 5)."""
    base, extra = divmod(length, groups)
    return [g * base + min(g, extra) for g in range(groups + 1)]


def check_axis(axis: object, shape: tuple[int, ...]) -> int:
    """An ``axis`` parameter (rule 5): an int ``0 <= axis < ndim``."""
    ndim = len(shape)
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not 0 <= axis < ndim:
        raise InputError(
            f"axis={axis!r} is not an axis of shape {list(shape)}",
            hint=f"use an integer 0 .. {ndim - 1}" if ndim else "a 0-d tensor has no axis: omit axis",
        )
    return int(axis)


def _cube(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    """``(outer, length, inner)``: the shape as ``[prod(shape[:axis]), shape[axis],
    prod(shape[axis+1:])]``, the layout rule 5's groups are taken from."""
    if not shape:
        return 1, 1, 1
    return (
        int(np.prod(shape[:axis], dtype=np.int64)),
        shape[axis],
        int(np.prod(shape[axis + 1 :], dtype=np.int64)),
    )


def _group_pieces(cube: tuple[int, int, int], lo: int, hi: int) -> list[tuple[slice, slice]]:
    """Positions ``lo .. hi`` of the axis in an ``[outer, length, inner]`` layout, as
    ``(outer slice, axis slice)`` pieces of about :data:`HISTOGRAM_CHUNK` elements (a piece is at
    least one row of ``inner``): a few MB of temporaries however large the group."""
    outer, _, inner = cube
    span = (hi - lo) * inner
    if span <= HISTOGRAM_CHUNK:
        step = max(1, HISTOGRAM_CHUNK // max(span, 1))
        return [(slice(o, o + step), slice(lo, hi)) for o in range(0, outer, step)]
    rows = max(1, HISTOGRAM_CHUNK // max(inner, 1))
    return [(slice(o, o + 1), slice(r, min(hi, r + rows))) for o in range(outer) for r in range(lo, hi, rows)]


# Tensors of at most this many bits per element count a group's bit patterns in a table
# (np.bincount: no sort) and index through it, when the group holds at least an eighth as many
# elements as the table has entries; smaller groups and wider dtypes sort. Both give the same.
_TABLE_BITS = 16


class GroupPalettes(NamedTuple):
    """Rule 5's codebooks of a tensor, from :func:`group_palettes`."""

    table: np.ndarray | None  # [groups, size] in the tensor's dtype, zero-padded
    counts: np.ndarray | None  # int64 [size]: how often each index occurs, over every group
    indices: np.ndarray | None  # uint8, one per element in C order (when asked for)
    size: int  # the most distinct values of any group
    overflow: tuple[int, int] | None  # (group, its distinct values): the first over the limit


def group_palettes(
    values: np.ndarray, groups: int, axis: int = 0, limit: int = 256, want_indices: bool = True
) -> GroupPalettes:
    """Rule 5's codebooks and indices of ``values``, axis ``axis`` split into ``groups`` groups
    (``1 <= groups <= max(1, shape[axis])``): a loop over the groups, each read in pieces of its
    ``[outer, positions, inner]`` slab (:func:`_group_pieces`), never a transposed copy of the
    tensor. Stops at the first group holding more than ``limit`` values (``overflow``)."""
    a = np.ascontiguousarray(values)
    cube = _cube(a.shape, axis)
    elements, patterns = a.reshape(cube), bit_view(a).reshape(cube)
    width = 8 * a.dtype.itemsize
    bounds = axis_bounds(cube[1], groups)
    indices = np.empty(cube, dtype=np.uint8) if want_indices else None
    counts = np.zeros(max(limit, 1), dtype=np.int64)
    books: list[np.ndarray] = []
    for g in range(groups):
        lo, hi = bounds[g], bounds[g + 1]
        pieces = _group_pieces(cube, lo, hi)
        table = width <= _TABLE_BITS and cube[0] * (hi - lo) * cube[2] >= (1 << width) >> 3
        if table:
            hist = np.zeros(1 << width, dtype=np.int64)
            for at in pieces:
                hist += np.bincount(patterns[at].ravel(), minlength=1 << width)
            found = np.flatnonzero(hist)
            book, book_counts = _ordered(found, hist[found], a.dtype)
        else:
            parts = [_bit_histogram(patterns[at].ravel()) for at in pieces]
            merged = _merge_histograms([k for k, _ in parts], [c for _, c in parts], patterns.ravel()[:0])
            book, book_counts = _ordered(*merged, a.dtype)
        if book.size > limit:
            return GroupPalettes(None, None, None, int(book.size), (g, int(book.size)))
        counts[: book.size] += book_counts
        books.append(book)
        if indices is None:
            continue
        if table:
            lut = np.zeros(1 << width, dtype=np.uint8)
            lut[bit_view(book)] = np.arange(book.size)
            for at in pieces:
                indices[at] = lut[patterns[at]]
        else:
            for at in pieces:
                indices[at] = palette_indices(elements[at], book).reshape(indices[at].shape)
    size = max(b.size for b in books)
    codebooks = np.zeros((groups, size), dtype=a.dtype)
    for g, b in enumerate(books):
        codebooks[g, : b.size] = b
    return GroupPalettes(codebooks, counts[:size], None if indices is None else indices.ravel(), size, None)


# Values per piece of the per-block analysis (rule 7): whole blocks, so that sorting and the
# index temporaries stay a few MB however large the tensor; a longer block is one piece.
BLOCK_CHUNK = 1 << 20


def _order_constants(dtype: np.dtype) -> tuple[int, int]:
    """The sign bit and the +inf pattern of a float dtype's bit patterns."""
    udtype = bit_view(np.zeros(1, dtype)).dtype
    sign = 1 << (8 * dtype.itemsize - 1)
    return sign, int(np.array([np.inf], dtype).view(udtype)[0])


def order_keys(patterns: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Unsigned keys (the patterns' own width) whose ascending order is rule 2's order of the
    values with these bit patterns: by value, then bit pattern (+0.0 before -0.0), NaNs last by
    bit pattern. A bijection on the patterns (:func:`pattern_of_keys` inverts it). Floats:
    negatives from -inf up take keys ``0 .. E-1`` (``E`` the +inf pattern), +0.0 ``E``, -0.0
    ``E+1``, positive values and positive NaNs ``pattern + E + 1``, negative NaNs keep their
    pattern. Signed ints flip the sign bit; unsigned ints and bools are their own keys."""
    u = np.asarray(patterns)
    if dtype.kind == "i":
        return u ^ u.dtype.type(1 << (8 * dtype.itemsize - 1))
    if dtype.kind != "f":
        return u.copy()
    sign, inf = _order_constants(dtype)
    t = u.dtype.type
    keys = np.where(u < t(sign), u + t(inf + 1), np.where(u <= t(sign + inf), t(sign + inf) - u, u))
    keys[u == 0] = inf
    keys[u == t(sign)] = inf + 1
    return keys.astype(u.dtype, copy=False)


def pattern_of_keys(keys: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The bit patterns whose :func:`order_keys` are ``keys``."""
    k = np.asarray(keys)
    if dtype.kind == "i":
        return k ^ k.dtype.type(1 << (8 * dtype.itemsize - 1))
    if dtype.kind != "f":
        return k.copy()
    sign, inf = _order_constants(dtype)
    t = k.dtype.type
    u = np.where(k < t(inf), t(sign + inf) - k, np.where(k <= t(sign + inf), k - t(inf + 1), k))
    u[k == inf] = 0
    u[k == inf + 1] = sign
    return u.astype(k.dtype, copy=False)


class BlockPalettes(NamedTuple):
    """Rule 7's codebooks of a tensor, from :func:`block_palettes`."""

    table: np.ndarray | None  # [blocks, size] in the tensor's dtype, zero-padded
    counts: np.ndarray | None  # int64 [size]: how often each index occurs, over every block
    indices: np.ndarray | None  # uint8, one per element (when asked for)
    size: int  # the most distinct values of any block
    overflow: tuple[int, int] | None  # (block, its distinct values): the first over the limit


def check_block(block: object) -> int:
    """A ``block`` parameter (rule 7): an int >= 1."""
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 1:
        raise InputError(
            f"block={block!r} is not a block length",
            hint="use an integer >= 1: values per codebook (e.g. 64 .. 4096)",
        )
    return int(block)


def _piece_palettes(
    keys: np.ndarray, limit: int, counts: np.ndarray, indices: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """One piece of blocks of equal length, ``keys`` (:func:`order_keys`) ``[blocks, length]``:
    each row sorted (stable: a radix sort for 16-bit keys), cut into runs of equal keys, a
    run's rank in its row the index of its elements. Returns the distinct values per block and,
    block after block, their keys ascending; adds to ``counts`` and fills ``indices``
    (row-major) unless a block holds more than ``limit`` values."""
    order = np.argsort(keys, axis=1, kind="stable")
    ordered = np.take_along_axis(keys, order, axis=1)
    new = np.empty(keys.shape, dtype=bool)
    new[:, 0] = True
    np.not_equal(ordered[:, 1:], ordered[:, :-1], out=new[:, 1:])
    rank = np.cumsum(new, axis=1, dtype=np.int32)
    rank -= 1
    distinct = rank[:, -1].astype(np.int64) + 1
    if int(distinct.max()) > limit:
        return distinct, ordered[:0, 0]
    counts += np.bincount(rank.ravel(), minlength=counts.size)
    if indices is not None:
        np.put_along_axis(indices.reshape(keys.shape), order, rank, axis=1)
    return distinct, ordered[new]


def block_palettes(
    values: np.ndarray, block: int, limit: int = 256, want_indices: bool = True
) -> BlockPalettes:
    """Rule 7's codebooks and indices of ``values`` (flattened, C order) in blocks of ``block``,
    all blocks at once, :data:`BLOCK_CHUNK` values at a time (a longer block alone, through
    :func:`value_histogram`). Stops at the first block holding more than ``limit`` values
    (``overflow``), before any index could exceed a byte."""
    flat = np.ascontiguousarray(values).ravel()
    patterns = bit_view(flat)
    n = flat.size
    nblocks = -(-n // block)
    distinct = np.zeros(nblocks, dtype=np.int64)
    counts = np.zeros(max(limit, 1), dtype=np.int64)
    indices = np.empty(n, dtype=np.uint8) if want_indices else None
    books: list[np.ndarray] = []
    full = n // block
    per = max(1, BLOCK_CHUNK // block)
    # pieces: runs of whole blocks, then the shorter last block
    pieces = [(b0, min(full, b0 + per)) for b0 in range(0, full, per)]
    if full < nblocks:
        pieces.append((full, nblocks))
    for b0, b1 in pieces:
        lo, hi = b0 * block, min(n, b1 * block)
        if hi - lo > BLOCK_CHUNK:  # one block, longer than a piece
            book, book_counts = value_histogram(flat[lo:hi])
            if book.size > limit:
                return BlockPalettes(None, None, None, int(book.size), (b0, int(book.size)))
            distinct[b0] = book.size
            counts[: book.size] += book_counts
            books.append(order_keys(bit_view(book), flat.dtype))
            if indices is not None:
                for s in range(lo, hi, BLOCK_CHUNK):
                    e = min(hi, s + BLOCK_CHUNK)
                    indices[s:e] = palette_indices(flat[s:e], book)
            continue
        keys = order_keys(patterns[lo:hi], flat.dtype).reshape(b1 - b0, -1)
        d, book_keys = _piece_palettes(keys, limit, counts, None if indices is None else indices[lo:hi])
        if int(d.max()) > limit:
            at = int(np.argmax(d > limit))
            return BlockPalettes(None, None, None, int(d.max()), (b0 + at, int(d[at])))
        distinct[b0:b1] = d
        books.append(book_keys)
    size = int(distinct.max()) if nblocks else 0
    table = np.zeros((nblocks, size), dtype=patterns.dtype)
    if nblocks:
        table[np.arange(size) < distinct[:, None]] = pattern_of_keys(np.concatenate(books), flat.dtype)
    return BlockPalettes(table.view(flat.dtype), counts[:size], indices, size, None)


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
    axis = params.get("axis")
    if axis is not None:  # rule 5
        axis = check_axis(axis, array.shape)
        if params.get("block") is not None or params.get("codebook") is not None:
            raise InputError(
                "axis cannot be combined with block or an explicit codebook",
                hint="axis places groups=G (rule 5): omit block and codebook",
            )
    axis = axis or 0
    groups = params.get("groups", 1)
    if (
        isinstance(groups, bool)
        or not isinstance(groups, (int, np.integer))
        or groups < 1
        or (groups > 1 and (array.ndim == 0 or groups > array.shape[axis]))
    ):
        raise InputError(
            f"groups={groups!r} does not split axis {axis} of shape {list(array.shape)}",
            hint=f"use 1 .. shape[{axis}] groups",
        )
    groups = int(groups)
    flat = np.ascontiguousarray(array).ravel()
    block = params.get("block")
    if block is not None:
        block = check_block(block)
        if groups > 1:
            raise InputError("block and groups cannot be combined", hint="use one of them (rule 7)")
        if params.get("codebook") is not None:
            raise InputError("an explicit codebook cannot be combined with block", hint="omit codebook")
        if flat.size:
            return _block_encode(flat, min(block, flat.size), params)
    if groups > 1:
        if params.get("codebook") is not None:
            raise InputError("an explicit codebook cannot be combined with groups", hint="omit codebook")
        return _grouped_encode(array, groups, axis, params)
    if params.get("codebook") is not None:
        book = np.asarray(params["codebook"], dtype=array.dtype).ravel()
    else:
        book = distinct_values(flat)
    size = book.size
    bits = params.get("bits")
    bits = bits_for(size) if bits is None else check_bits(bits)
    if size > min(1 << bits, 256):
        raise _palette_overflow(size, bits)
    indices = palette_indices(flat, book) if flat.size else np.zeros(0, dtype=np.uint8)
    return _palette_blob(book.reshape(1, size), indices, bits, params, {})


def _palette_overflow(size: int, bits: int, where: str = "") -> InputError:
    """``size`` distinct values (in ``where``) are more than a ``bits``-bit palette holds."""
    return InputError(
        f"{size} distinct values{where} do not fit a {bits}-bit palette (at most {min(1 << bits, 256)})",
        hint=f"cluster to {1 << bits} values first, or use bits={bits_for(size)}"
        if size <= 256
        else "cluster the tensor first (at most 256 values)",
    )


def _grouped_encode(array: np.ndarray, groups: int, axis: int, params: dict) -> tuple[bytes, dict]:
    """Rule 5: one codebook per group of positions along ``axis`` (``groups > 1``)."""
    bits = params.get("bits")
    bits = None if bits is None else check_bits(bits)
    found = group_palettes(array, groups, axis, 256 if bits is None else 1 << bits)
    if found.overflow is not None:
        g, size = found.overflow
        raise _palette_overflow(
            size, bits_for(size) if bits is None else bits, f" in group {g} of axis {axis}"
        )
    assert found.table is not None and found.indices is not None
    bits = bits_for(found.size) if bits is None else bits
    return _palette_blob(found.table, found.indices, bits, params, {"axis": axis} if axis else {})


def _palette_blob(
    table: np.ndarray, indices: np.ndarray, bits: int, params: dict, extra: dict
) -> tuple[bytes, dict]:
    """Codebook table (``[groups, size]``) and index stream as the blob, and the record."""
    store = codebook_storage(table.ravel(), params.get("codebook_dtype"))
    huffman, rans = entropy_coder(params)
    codebook_blob = table.ravel().astype(store.newbyteorder("<")).tobytes()
    index_blob = encode_index_stream(indices, bits, huffman, rans)
    record = {
        "bits": bits,
        **extra,
        "codebook_size": int(table.shape[1]),
        "codebook_dtype": store.name,
        "groups": int(table.shape[0]),
        **coder_fields(huffman, rans),
        "streams": {"codebook": len(codebook_blob), "indices": len(index_blob)},
    }
    return codebook_blob + index_blob, record


def block_overflow_error(block: int, values: int, bits: int | None) -> InputError:
    """Rule 7: block ``block`` holds ``values`` distinct values, more than ``bits`` can index."""
    if bits is None:
        return InputError(
            f"block {block} holds {values} distinct values, more than a palette holds (256)",
            hint="cluster each block first (cluster block=...), or use a shorter block",
        )
    return InputError(
        f"block {block} holds {values} distinct values, more than a {bits}-bit palette holds ({1 << bits})",
        hint=f"cluster each block to {1 << bits} values first, or use bits={bits_for(values)}"
        if values <= 256
        else "cluster each block first (at most 256 values)",
    )


def _block_encode(flat: np.ndarray, block: int, params: dict) -> tuple[bytes, dict]:
    """Rule 7: one codebook per block of ``block`` values (``flat`` not empty)."""
    bits = params.get("bits")
    bits = None if bits is None else check_bits(bits)
    found = block_palettes(flat, block, 256 if bits is None else 1 << bits)
    if found.overflow is not None:
        raise block_overflow_error(*found.overflow, bits)
    assert found.table is not None and found.indices is not None
    bits = bits_for(found.size) if bits is None else bits
    return _palette_blob(found.table, found.indices, bits, params, {"block": block})


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
    axis = record_int(record, "axis", 0, len(shape) - 1) if "axis" in record else 0  # rule 5
    rows = shape[axis] if shape else 1
    block = None
    if "block" in record:  # rule 7
        if axis:
            raise InputError(
                f"record has both block={record['block']!r} and axis={axis}",
                hint="the weights index is damaged",
            )
        block = record_int(record, "block", 1, max(1, count))
        groups = record_int(record, "groups", 0, max(1, count))
        if groups != -(-count // block):
            raise InputError(
                f"record field groups={groups} is not the {-(-count // block)} blocks of "
                f"{block} values in {count}",
                hint="the weights index is damaged",
            )
    else:
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
    if block is not None:  # codebook[flat_index // block, index], a piece at a time
        book, out = codebook.ravel(), np.empty(count, dtype=dtype)
        for start in range(0, count, BLOCK_CHUNK):
            end = min(count, start + BLOCK_CHUNK)
            at = np.arange(start, end, dtype=np.intp) // block * size
            at += indices[start:end]
            np.take(book, at, out=out[start:end])
        return out.reshape(shape)
    if not count:
        return np.zeros(shape, dtype=dtype)
    if groups == 1:
        return codebook[0, indices].reshape(shape)
    cube = _cube(shape, axis)  # rule 5: the groups split positions along axis
    out, at = np.empty(cube, dtype=dtype), indices.reshape(cube)
    bounds = axis_bounds(cube[1], groups)
    for g in range(groups):
        out[:, bounds[g] : bounds[g + 1]] = codebook[g][at[:, bounds[g] : bounds[g + 1]]]
    return out.reshape(shape)


register(Codec("palette", _palette_encode, _palette_decode))
