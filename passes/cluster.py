"""cluster: weight sharing by 1-D k-means (Deep Compression, Han et al. 2016, section 3).

Every selected weight tensor (see :mod:`mconv.edit.weights`) is replaced by the nearest of a
few shared values (centroids)::

    before: W = initializer float32[4096, 9216]   (37.7M distinct values)
    after:  W = initializer float32[4096, 9216]   (<= 2**bits distinct nonzero values)

Rules:

1. Exact zeros are not clustered and stay +0.0 (a pruning mask survives; -0.0 becomes +0.0).
   A tensor that holds zeros gets ``2**bits - 1`` nonzero centroids, one without zeros gets
   ``2**bits``. So zero plus the centroids always fit ``bits``-bit codes, whether export stores
   the tensor as a dense palette (the zero is a codebook entry) or as sparse relative indices
   with filler zeros (the fillers' zero is a codebook entry): lossless and within ``bits``.
2. ``groups = G`` splits the output-channel axis into G contiguous groups (as
   ``np.array_split``), each with its own centroids (grouped-channel palettization).
3. k-means works on bins, the sufficient statistics of the sorted values: per bin the count
   and the float64 sum of the exact values (every 1-D k-means cluster is an interval of the
   sorted values, and a cluster's cost is sumsq - sum**2 / count). A tensor of at most 65,536
   values, or one not float32, has one bin per distinct value (a sort). A larger float32 tensor
   is binned in one O(n) pass by its bit pattern with the low 13 mantissa bits dropped: sign,
   exponent and float16's 10 mantissa bits, so a bin is one float16 ulp wide at any magnitude
   and float16-rounded weights get exactly one bin per distinct value.
4. Centroid initialisation ``init``: ``linear`` (default, the paper's winner: evenly spaced
   between the lowest and highest bin mean, the min and max when those bins hold one value),
   ``density`` (evenly spaced quantiles of the values' CDF), ``kmeans++`` (seeded D² sampling
   on at most 65,536 sampled values), ``optimal`` (1-D k-means by dynamic programming, exact
   when the bins are single distinct values and at most 65,536 of them, e.g. any small tensor
   or float16-rounded weights; otherwise the DP runs on the bins merged to a grid 512 steps per
   octave down to 2**-10 of the largest magnitude, linear below, and Lloyd on the bins follows).
5. Lloyd iterations (all inits but an exact ``optimal``) run on the bins with prefix sums, each
   O(k log bins); a bin goes to the centroid nearest its mean. Empty clusters keep their
   centroid. On single-value bins (small tensors) this is Lloyd on the exact values.
6. The assignment is exact: each value goes to its nearest centroid (a value exactly between
   two goes to the lower), through a lookup table from bin to centroid where no midpoint falls
   inside the bin, and a binary search for the few values in bins that hold a midpoint.
   Centroids are float32 means of their members' bins; the tensor keeps its dtype. The
   assignment counts its values as it goes (a sure bin's count, the searched values one by
   one), and the clustered tensor's histogram is remembered (:mod:`mconv.codecs.palette` rule
   8): the pass's report, the predicted account and export do not count it again.
7. The saved model holds the clustered values as plain dense initializers (any ONNX tool runs
   it); each tensor's settings go to its metadata (``mconv.cluster`` = bits, init, groups, axis;
   model-level ``mconv.compression``) so export re-derives the codebook (distinct values ->
   palette) and fine-tuning can update centroids.
8. ``block = B`` (per-block palettes; not with ``groups``): the tensor as stored, flattened
   (C order), is cut into blocks of B consecutive values (the last one shorter when B does not
   divide the size); each block gets its own ``2**bits`` centroids (``2**bits - 1`` and the
   zero when the block holds exact zeros), by Lloyd on the block's exact values (rules 1, 5,
   6), all blocks at once (:func:`block_palettes`), from ``init`` ``linear`` (default, as
   above), ``density`` (the block's quantiles) or ``optimal`` (the exact DP of rule 4 on the
   block merged into at most 8 k equal-length runs of its sorted values, exact when the block
   has no more values than that, then Lloyd; 2-5 dB better than ``linear`` on heavy-tailed
   weights, 2-7x slower). For a row-major
   ``[out, in]`` weight (``nn.Linear``, a Gemm with ``transB``, safetensors files) with B
   dividing ``in``, a block is B inputs of one output channel; for a MatMul's ``[in, out]``
   weight it is B output channels of one input. The metadata records ``block`` (no
   ``groups``/``axis``); export stores the tensor with the palette codec's ``block``.
9. Embedding tables are weights too (``op_types`` includes ``Gather`` by default, as
   coremltools' palettizer takes an embedding's table): a Gather whose ``data`` (input 0) is a
   float initializer of rank 2 gathered along axis 0 (a row per token), ``[vocab, dim]``,
   grouped along axis 0 (rows); a table that is also some node's weight is clustered once, as
   that weight.
10. ``method="entropy"`` with ``lam`` (entropy-constrained scalar quantization, ECSQ: Chou,
    Lookabaugh and Gray 1989; Choi, El-Khamy and Lee 2017, "Towards the limit of network
    quantization"): export codes the palette indices with an entropy coder (Huffman or rANS,
    whichever is smaller; :mod:`mconv.codecs.choose`), so an index costs about ``-log2 p_k``
    bits, ``p_k`` its cluster's share of the tensor's values (the zeros count as their own
    code). k-means (rules 4-5) starts, then each value goes to the cluster minimising
    ``(x - c_k)**2 + lam * ms * -log2 p_k`` (``ms``: the nonzero values' mean square, so
    ``lam`` is unitless: the squared error, relative to ``ms``, one bit is worth), centroids
    and shares are updated, until no value moves. Clusters that empty are dropped: a larger
    ``lam`` leaves fewer, more unequal clusters and fewer coded bytes at more error; the
    result still fits ``bits``-bit codes (at most ``2**bits`` clusters). ``lam = 0`` is plain
    k-means (rules 4-6). Each cluster is an interval of the sorted values, found by the lower
    envelope of the cost parabolas; a value takes its bin's cluster (a bin of rule 3 holds
    values within one float16 ulp: for a large float32 tensor that is the assignment's
    resolution, exact otherwise). Zeros stay zero (rule 1); groups cluster each on their own
    (rule 2); not with ``block``. The metadata records ``bits``/``init``/``groups`` as before:
    export needs nothing else.
11. Weights stored as ``Constant`` nodes become initializers of the same name first, and a
    model whose weights are all computed from constants (Transpose, DequantizeLinear, ...) is
    refused with one line naming them and what to run first, as ``prune`` rule 7 says.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt
import onnx_ir as ir
from mconv import sorting
from mconv.codecs.palette import (
    bit_view,
    counted_histogram,
    order_keys,
    remember_histogram,
    value_histogram,
)
from mconv.edit.weights import (
    WEIGHT_OPS,
    WeightRef,
    gather_tables,
    layer_weights,
    record_compression,
    snr_db,
    squared_error,
)
from mconv.errors import InputError
from mconv.passes.base import MAX_COUNT, Pass, PassContext, PassReport, bounded, register_pass

Init = Literal["linear", "density", "kmeans++", "optimal"]
MAX_DP_VALUES = 1 << 16
_CHUNK = 1 << 20  # values per pass over a large tensor: float64 temporaries stay at 8 MB
_DROP = 13  # float32 mantissa bits a bin ignores (rule 3)
_NCODES = 1 << (32 - _DROP)
_NEGATIVE = 1 << (31 - _DROP)  # codes at or above hold negative values
_NONFINITE = 0xFF << (23 - _DROP)  # exponent all ones: inf or nan
_GRID_STEPS = 9  # the DP grid: 2**9 steps per octave ...
_GRID_OCTAVES = 10  # ... down to 2**-10 of the largest magnitude (rule 4)


# --- bins -----------------------------------------------------------------------------------


@dataclass
class ValueBins:
    """Sorted bins of a tensor's values (rule 3): ``count`` and float64 ``total`` of the values in
    each, ``lo``/``hi`` the range a bin can hold; ``codes`` the bit-pattern code of each bin
    (large float32 tensors) or None (one bin per distinct value); ``exact`` when every bin holds
    a single distinct value."""

    count: np.ndarray
    total: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    codes: np.ndarray | None
    exact: bool
    dtype: np.dtype

    @property
    def mean(self) -> np.ndarray:
        return self.total / self.count


def _distinct_bins(values: np.ndarray) -> ValueBins:
    """One bin per distinct value (a sort; float16 through ``mconv.sorting``, exact on every CPU)."""
    flat = values.ravel()
    s = sorting.sort(flat)
    starts = np.concatenate([[0], np.flatnonzero(s[1:] != s[:-1]) + 1])
    counts = np.diff(np.concatenate([starts, [s.size]]))
    u = s[starts]
    return ValueBins(counts, u.astype(np.float64) * counts, u, u, None, True, s.dtype)


def _code_bins(flat: np.ndarray, zeros: int) -> ValueBins | None:
    """Bins of a float32 array by bit pattern (rule 3) in one chunked O(n) pass; ``zeros``
    exact zeros are left out. None when a bin mixes zeros with nonzero values (float32
    subnormals below 2**-136 share the zero code): the caller then bins the nonzero values."""
    bits = flat.view(np.uint32)
    count = np.zeros(_NCODES, dtype=np.int64)
    total = np.zeros(_NCODES)
    for i in range(0, flat.size, _CHUNK):
        code = (bits[i : i + _CHUNK] >> _DROP).astype(np.intp)
        count += np.bincount(code, minlength=_NCODES)
        total += np.bincount(code, weights=flat[i : i + _CHUNK], minlength=_NCODES)
    if count[_NONFINITE:_NEGATIVE].any() or count[_NEGATIVE + _NONFINITE :].any():
        raise InputError("weights hold inf or nan", hint="clean the model's weights before clustering")
    if zeros:
        if count[0] + count[_NEGATIVE] != zeros:
            return None
        count[0] = count[_NEGATIVE] = 0
    occupied = np.flatnonzero(count)
    # Negative codes grow with magnitude: descending codes are ascending values.
    codes = np.concatenate([occupied[occupied >= _NEGATIVE][::-1], occupied[occupied < _NEGATIVE]])
    low_bits = codes.astype(np.uint32) << _DROP
    near_zero = low_bits.view(np.float32)  # the bin's smallest magnitude
    far = (low_bits | ((1 << _DROP) - 1)).view(np.float32)
    n, t = count[codes], total[codes]
    # Values of one bin share an exponent, so their float64 sum is exact: it equals count times
    # the smallest magnitude only when every value is that one.
    exact = bool(np.array_equal(t, n * near_zero.astype(np.float64)))
    return ValueBins(n, t, np.minimum(near_zero, far), np.maximum(near_zero, far), codes, exact, flat.dtype)


def value_bins(values: np.ndarray, zeros: int = 0) -> ValueBins | None:
    """Bins of ``values`` without ``zeros`` exact zeros (rule 3); None as in :func:`_code_bins`."""
    flat = values.ravel()
    if flat.dtype == np.float32 and flat.size > MAX_DP_VALUES:
        return _code_bins(flat, zeros)
    if not np.isfinite(flat).all():
        raise InputError("weights hold inf or nan", hint="clean the model's weights before clustering")
    return _distinct_bins(flat[flat != 0] if zeros else flat)


def _midpoints(c: np.ndarray, dtype: npt.DTypeLike) -> np.ndarray:
    """Midpoints between sorted centroids in the values' dtype: Lloyd and the assignment compare
    against the very same numbers."""
    return ((c[1:] + c[:-1]) / 2).astype(dtype)


def lloyd_bins(bins: ValueBins, centroids: np.ndarray, max_iter: int = 300) -> np.ndarray:
    """Lloyd iterations on bins (rule 5); returns sorted float64 centroids."""
    mean = bins.mean
    pc = np.concatenate([[0], np.cumsum(bins.count)])
    pt = np.concatenate([[0.0], np.cumsum(bins.total)])
    c = np.sort(np.asarray(centroids, dtype=np.float64))
    # The loop runs hundreds of times on small arrays (grouped palettes: once per group), so it
    # avoids numpy's Python-level helpers (diff, array_equal: ~20 us a call each); the
    # arithmetic is the same, so are the centroids.
    bounds = np.empty(c.size + 1, dtype=np.intp)
    bounds[0], bounds[-1] = 0, mean.size
    dtype = bins.dtype
    for _ in range(max_iter):
        bounds[1:-1] = mean.searchsorted(((c[1:] + c[:-1]) / 2).astype(dtype), side="right")
        cb, tb = pc[bounds], pt[bounds]
        counts = cb[1:] - cb[:-1]
        new = np.where(counts > 0, (tb[1:] - tb[:-1]) / np.maximum(counts, 1), c)
        new.sort()
        if (new == c).all():
            break
        c = new
    return c


# --- exact 1-D k-means ----------------------------------------------------------------------


def optimal_partition(counts: np.ndarray, sums: np.ndarray, k: int) -> np.ndarray:
    """Bounds (``k + 1`` indices, fewer when there are fewer items) of the contiguous partition
    of sorted weighted items into k clusters with the least within-cluster sum of squares.

    The squares of the items are the same for every partition, so the DP maximises the sum of
    sum**2 / count over clusters: G[j][i] = max_a G[j-1][a] + gain(a, i) over the first i items,
    with the divide-and-conquer optimisation (the best split a is monotone in i), one recursion
    level at a time, vectorized over all segments of the level: O(k n log n) numpy work,
    deterministic (ties go to the smallest split). Sums are centred first for conditioning.
    """
    w = np.asarray(counts, dtype=np.float64)
    n = w.size
    if n <= k:
        return np.arange(n + 1)
    return partition_rows(w[None, :], np.asarray(sums, dtype=np.float64)[None, :], k)[0]


def partition_rows(w: np.ndarray, s: np.ndarray, k: int) -> np.ndarray:
    """:func:`optimal_partition` of every row of ``w`` (weights, float64 ``[R, n]``, ``n > k``;
    a weight of 0 leaves an item out) and ``s`` (the items' sums) at once: the segments of every
    row's recursion level in one array, row ``r``'s prefix sums at offset ``r * (n + 1)``.
    Returns the bounds ``[R, k + 1]``."""
    rows, n = w.shape
    s = s - w * (s.sum(axis=1) / np.maximum(w.sum(axis=1), 1e-300))[:, None]  # centred per row
    stride = n + 1
    pw = np.zeros((rows, stride))
    np.cumsum(w, axis=1, out=pw[:, 1:])
    ps = np.zeros((rows, stride))
    np.cumsum(s, axis=1, out=ps[:, 1:])
    pw, ps = pw.ravel(), ps.ravel()

    def gain(at: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:  # items a..b-1 of rows at
        d = ps[at + b] - ps[at + a]
        den = pw[at + b] - pw[at + a]
        return np.where(den > 0, d * d / np.maximum(den, 1e-300), 0.0)

    off = np.arange(rows, dtype=np.int64) * stride
    prev = np.full(rows * stride, -np.inf)
    i = np.arange(1, stride, dtype=np.int64)
    prev.reshape(rows, stride)[:, 1:] = gain(off[:, None], np.zeros_like(i)[None, :], i[None, :])
    splits = np.zeros((k + 1, rows * stride), np.int32 if n < 1 << 31 else np.int64)
    for j in range(2, k + 1):
        cur = np.full(rows * stride, -np.inf)
        # The last layer is needed at i = n only; the others for i up to n - (k - j).
        at = off.copy()
        lo = np.full(rows, n if j == k else j, np.int64)
        hi = np.full(rows, n if j == k else n - (k - j), np.int64)
        optlo, opthi = np.full(rows, j - 1, np.int64), hi - 1
        while lo.size:
            mid = (lo + hi) // 2
            lengths = np.minimum(mid - 1, opthi) - optlo + 1
            starts = np.zeros(mid.size, dtype=np.int64)
            np.cumsum(lengths[:-1], out=starts[1:])
            seg = np.repeat(np.arange(mid.size), lengths)
            a = np.arange(seg.size) - np.repeat(starts - optlo, lengths)
            base = at[seg]
            vals = prev[base + a] + gain(base, a, mid[seg])
            best = np.maximum.reduceat(vals, starts)
            hit = np.flatnonzero(vals == best[seg])
            first = np.ones(hit.size, dtype=bool)
            first[1:] = seg[hit[1:]] != seg[hit[:-1]]
            arg = a[hit[first]]
            cur[at + mid] = best
            splits[j, at + mid] = arg
            left, right = lo <= mid - 1, mid + 1 <= hi
            lo, hi, optlo, opthi, at = (
                np.concatenate([lo[left], mid[right] + 1]),
                np.concatenate([mid[left] - 1, hi[right]]),
                np.concatenate([optlo[left], arg[right]]),
                np.concatenate([arg[left], opthi[right]]),
                np.concatenate([at[left], at[right]]),
            )
        prev = cur
    bounds = np.empty((rows, k + 1), np.int64)
    bounds[:, k], bounds[:, 0] = n, 0
    for j in range(k, 1, -1):
        bounds[:, j - 1] = splits[j, off + bounds[:, j]]
    return bounds


def _segment_means(counts: np.ndarray, sums: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    pc = np.concatenate([[0], np.cumsum(counts)])
    ps = np.concatenate([[0.0], np.cumsum(sums, dtype=np.float64)])
    return np.diff(ps[bounds]) / np.diff(pc[bounds])


def optimal_kmeans_1d(values: np.ndarray, weights: np.ndarray, k: int) -> np.ndarray:
    """Exact weighted 1-D k-means of sorted distinct ``values`` (rule 4, ``optimal``): the sorted
    centroids (fewer when there are fewer than k values)."""
    x = np.asarray(values, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    return _segment_means(w, w * x, optimal_partition(w, w * x, k))


def _dp_grid(mean: np.ndarray) -> np.ndarray:
    """Starts of groups of sorted bins for the DP (rule 4): 2**9 steps per octave of magnitude
    down to 2**-10 of the largest, 2**9 equal steps below that, each sign on its own."""
    a = np.abs(mean)
    floor = np.float32(a.max() * 2.0**-_GRID_OCTAVES)
    step = float(floor) * 2.0**-_GRID_STEPS
    if step == 0.0:
        return np.arange(mean.size)
    octave = np.maximum(a, floor).astype(np.float32).view(np.int32).astype(np.int64) - int(
        floor.view(np.int32)
    )
    mag = np.where(a < floor, np.floor(a / step), (1 << _GRID_STEPS) + (octave >> (23 - _GRID_STEPS)))
    key = np.where(mean < 0, -mag - 1, mag)
    return np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]]))


# --- initialisations ------------------------------------------------------------------------


def _kmeans_pp(sample: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    chosen = [float(sample[rng.integers(sample.size)])]
    d2 = (sample - chosen[0]) ** 2
    for _ in range(1, k):
        total = float(d2.sum())
        if total == 0.0:
            break
        pick = int(np.searchsorted(np.cumsum(d2), rng.random() * total, side="right"))
        chosen.append(float(sample[min(pick, sample.size - 1)]))
        d2 = np.minimum(d2, (sample - chosen[-1]) ** 2)
    return np.array(chosen)


def bin_centroids(
    bins: ValueBins, k: int, init: Init = "linear", *, max_iter: int = 300, seed: int = 0
) -> np.ndarray:
    """Sorted float64 centroids of 1-D k-means over binned values (rules 4-5)."""
    mean = bins.mean
    if mean.size == 0:
        return np.zeros(0)
    if mean[0] == mean[-1]:
        return mean[:1].copy()
    position = np.cumsum(bins.count)  # values up to and including each bin
    if init == "linear":
        c0 = np.linspace(mean[0], mean[-1], k)
    elif init == "density":
        c0 = mean[
            np.searchsorted(
                position, ((np.arange(k) + 0.5) / k * position[-1]).astype(np.int64), side="right"
            )
        ]
    elif init == "kmeans++":
        rng = np.random.default_rng(seed)
        if position[-1] <= MAX_DP_VALUES:
            sample = np.repeat(mean, bins.count)
        else:
            sample = mean[
                np.searchsorted(position, np.sort(rng.integers(0, position[-1], MAX_DP_VALUES)), side="right")
            ]
        c0 = _kmeans_pp(sample, k, rng)
    elif init == "optimal":
        if bins.exact and mean.size <= MAX_DP_VALUES:
            return _segment_means(bins.count, bins.total, optimal_partition(bins.count, bins.total, k))
        starts = _dp_grid(mean)
        count, total = np.add.reduceat(bins.count, starts), np.add.reduceat(bins.total, starts)
        c0 = _segment_means(count, total, optimal_partition(count, total, k))
    else:
        raise InputError(f"unknown init {init!r}", hint="use linear, density, kmeans++ or optimal")
    return lloyd_bins(bins, c0, max_iter)


def kmeans_1d(
    values: np.ndarray, k: int, init: Init = "linear", *, max_iter: int = 300, seed: int = 0
) -> np.ndarray:
    """Sorted float64 centroids of 1-D k-means over ``values`` (rules 3-5)."""
    values = np.asarray(values).ravel()
    if values.size == 0:
        return np.zeros(0)
    bins = value_bins(values)
    assert bins is not None  # None only when exact zeros are left out (zeros > 0)
    return bin_centroids(bins, k, init, max_iter=max_iter, seed=seed)


# --- assignment -----------------------------------------------------------------------------


def assign_nearest(
    values: np.ndarray, centroids: np.ndarray, lo: float | None = None, hi: float | None = None
) -> np.ndarray:
    """Index of the nearest sorted centroid for each value (rule 6).

    A 65,536-bin lookup table over [lo, hi] (the values' range) decides most values in one
    gather; only values in bins next to a midpoint are placed by binary search.
    """
    x = np.asarray(values).ravel()
    c = np.asarray(centroids, dtype=np.float64)
    if c.size <= 1 or x.size == 0:
        return np.zeros(x.size, dtype=np.int16)
    mids = _midpoints(c, x.dtype)
    if x.size < 1 << 16 or x.dtype != np.float32:
        return np.searchsorted(mids, x, side="left").astype(np.int16)
    lo = float(x.min()) if lo is None else float(lo)
    hi = float(x.max()) if hi is None else float(hi)
    nb = 1 << 16
    width = (hi - lo) / nb if hi > lo else 1.0
    edges = (lo + width * np.arange(nb + 1)).astype(x.dtype)
    below = np.searchsorted(mids, edges, side="left")  # midpoints below each bin edge
    # A bin is certain when no midpoint lies within one bin of it (float32 binning may be off
    # by one); uncertain bins map to -1 and their values are placed exactly.
    i = np.arange(nb)
    certain = below[np.minimum(i + 2, nb)] == below[np.maximum(i - 1, 0)]
    lut = np.where(certain, below[:nb], -1).astype(np.int16)
    t = x - np.float32(lo)
    t *= np.float32(1.0 / width)
    bins = t.astype(np.int32)
    del t
    np.clip(bins, 0, nb - 1, out=bins)
    labels = lut[bins]
    del bins
    unsure = np.flatnonzero(labels < 0)
    labels[unsure] = np.searchsorted(mids, x[unsure], side="left")
    return labels


Histogram = tuple[np.ndarray, np.ndarray]  # distinct values in rule 2's order, their counts


def _clustered_by_code(
    flat: np.ndarray, bins: ValueBins, centroids: np.ndarray
) -> tuple[np.ndarray, Histogram]:
    """``flat`` (float32) with every value replaced by its nearest centroid (rule 6), zeros kept:
    a bin whose range holds no midpoint maps to its centroid in a table indexed by code; the
    table holds nan for the rest, whose values are placed by binary search."""
    c = centroids.astype(np.float32)
    mids = _midpoints(centroids, np.float32)
    low, high = np.searchsorted(mids, bins.lo, side="left"), np.searchsorted(mids, bins.hi, side="left")
    table = np.zeros(_NCODES, dtype=np.float32)  # zero codes map to zero (rule 1)
    table[bins.codes] = np.where(low == high, c[low], np.nan)
    out = np.empty_like(flat)
    bits = flat.view(np.uint32)
    # rule 6's counts as they fall out: a sure bin's values all go to its centroid, an unsure
    # value to the one its search finds; the rest are the zeros
    sure = low == high
    counts = np.bincount(low[sure], weights=bins.count[sure], minlength=c.size).astype(np.int64)
    for i in range(0, flat.size, _CHUNK):
        part = out[i : i + _CHUNK]
        np.take(table, (bits[i : i + _CHUNK] >> _DROP).astype(np.intp), out=part)
        unsure = np.flatnonzero(np.isnan(part))
        if unsure.size:
            at = np.searchsorted(mids, flat[i + unsure], side="left")
            part[unsure] = c[at]
            counts += np.bincount(at, minlength=c.size)
    zeros = flat.size - int(counts.sum())
    hist = counted_histogram(np.append(c, np.float32(0)), np.append(counts, zeros), np.dtype(np.float32))
    return out, hist


def _cluster_flat(
    flat: np.ndarray, k: int, init: Init, max_iter: int, seed: int, zeros: int
) -> tuple[np.ndarray, Histogram]:
    """A 1-D array clustered (rules 1, 3-6) and its value histogram, counted as the values are
    assigned; ``zeros`` is its count of exact zeros."""
    if zeros == flat.size:
        out = np.zeros_like(flat)
        return out, counted_histogram(out[:1], np.array([flat.size]), flat.dtype)
    bins = value_bins(flat, zeros)
    if bins is None:  # subnormals share the zero code: cluster the nonzero values alone
        keep = flat != 0
        out = np.zeros_like(flat)
        out[keep], (book, counts) = _cluster_flat(flat[keep], k, init, max_iter, seed, 0)
        zero = flat.dtype.type(0)
        return out, counted_histogram(
            np.append(book, zero), np.append(counts, flat.size - counts.sum()), flat.dtype
        )
    centroids = bin_centroids(bins, k, init, max_iter=max_iter, seed=seed)
    if bins.codes is not None:
        return _clustered_by_code(flat, bins, centroids)
    c = centroids.astype(flat.dtype)
    if not zeros:
        at = assign_nearest(flat, centroids)
        return c[at], counted_histogram(c, np.bincount(at, minlength=c.size), flat.dtype)
    keep = flat != 0
    out = np.zeros_like(flat)
    at = assign_nearest(flat[keep], centroids)
    out[keep] = c[at]
    counts = np.append(np.bincount(at, minlength=c.size), flat.size - at.size)
    return out, counted_histogram(np.append(c, flat.dtype.type(0)), counts, flat.dtype)


# --- entropy-constrained clustering (rule 10) ------------------------------------------------


def _envelope_labels(mean: np.ndarray, c: np.ndarray, rate: np.ndarray) -> np.ndarray:
    """For each sorted ``mean`` the index of the centroid minimising ``(x - c_k)**2 + rate_k``
    (``c`` sorted and distinct, ``rate`` finite), a tie to the lower: the cost is the upper
    envelope of the lines ``2 c_k x - (c_k**2 + rate_k)`` (slopes increasing with k), so every
    cluster takes one interval of x, found by the convex hull trick in O(k) and a search."""
    m, q = 2.0 * c, -(c * c + rate)
    hull: list[int] = []

    def cross(a: int, b: int) -> float:  # x where line b (steeper) overtakes line a
        return float((q[a] - q[b]) / (m[b] - m[a]))

    for j in range(c.size):
        while len(hull) >= 2 and cross(hull[-2], j) <= cross(hull[-2], hull[-1]):
            hull.pop()
        hull.append(j)
    keep = np.array(hull, dtype=np.intp)
    breaks = np.array([cross(a, b) for a, b in zip(hull[:-1], hull[1:])])
    return keep[np.searchsorted(breaks, mean, side="left")]


def ecsq_bins(
    bins: ValueBins, centroids: np.ndarray, lam: float, zeros: int = 0, *, max_iter: int = 300
) -> tuple[np.ndarray, np.ndarray]:
    """Entropy-constrained scalar quantization (rule 10) of binned values from ``centroids``:
    returns the sorted float64 centroids of the clusters still used and each bin's cluster.

    Alternates (Chou, Lookabaugh and Gray 1989; Choi, El-Khamy and Lee 2017) the assignment
    minimising ``(x - c_k)**2 + lam * ms * -log2(p_k)`` (``ms`` the mean square of the values,
    ``p_k`` cluster k's share of all ``count + zeros`` values, the zeros being their own code),
    the centroids' update (their members' means) and the shares' update: each step lowers
    distortion + lam * rate, so it ends; a cluster left empty is dropped."""
    mean, count = bins.mean, bins.count.astype(np.float64)
    total_values = float(count.sum()) + zeros
    ms = float(np.sum(bins.total * mean) / max(count.sum(), 1.0))  # ~ mean square (bin means)
    c = np.unique(np.asarray(centroids, dtype=np.float64))
    labels = _envelope_labels(mean, c, np.zeros(c.size))
    for _ in range(max_iter):
        n = np.bincount(labels, weights=count, minlength=c.size)
        t = np.bincount(labels, weights=bins.total, minlength=c.size)
        used = n > 0
        c, n, t = c[used], n[used], t[used]
        c = t / n  # clusters are disjoint intervals of the sorted bins: strictly increasing
        rate = lam * ms * -np.log2(n / total_values)
        new = _envelope_labels(mean, c, rate)
        if new.size == labels.size and np.array_equal(new, labels):
            break
        labels = new
    n = np.bincount(labels, weights=count, minlength=c.size)
    t = np.bincount(labels, weights=bins.total, minlength=c.size)
    live = np.flatnonzero(n > 0)
    remap = np.full(c.size, -1, np.intp)
    remap[live] = np.arange(live.size)
    return t[live] / n[live], remap[labels]


def _ecsq_flat(
    flat: np.ndarray, k: int, init: Init, lam: float, max_iter: int, seed: int, zeros: int
) -> tuple[np.ndarray, Histogram]:
    """:func:`_cluster_flat` by entropy-constrained clustering (rule 10) from k centroids."""
    if zeros == flat.size or lam == 0.0:
        return _cluster_flat(flat, k, init, max_iter, seed, zeros)
    bins = value_bins(flat, zeros)
    if bins is None:  # subnormals share the zero code: the nonzero values alone (as above)
        keep = flat != 0
        out = np.zeros_like(flat)
        nz = flat[keep]
        sub = _distinct_bins(nz)
        c, labels = ecsq_bins(sub, bin_centroids(sub, k, init, max_iter=max_iter, seed=seed), lam, zeros)
        cc = c.astype(flat.dtype)
        pos = np.searchsorted(sub.lo, nz)
        out[keep] = cc[labels[pos]]
        counts = np.bincount(labels, weights=sub.count, minlength=c.size).astype(np.int64)
        return out, counted_histogram(
            np.append(cc, flat.dtype.type(0)), np.append(counts, flat.size - counts.sum()), flat.dtype
        )
    c, labels = ecsq_bins(bins, bin_centroids(bins, k, init, max_iter=max_iter, seed=seed), lam, zeros)
    cc = c.astype(flat.dtype)
    counts = np.bincount(labels, weights=bins.count, minlength=c.size).astype(np.int64)
    if bins.codes is not None:
        table = np.zeros(_NCODES, dtype=flat.dtype)  # zero codes stay zero (rule 1)
        table[bins.codes] = cc[labels]
        out = np.empty_like(flat)
        bits = flat.view(np.uint32)
        for i in range(0, flat.size, _CHUNK):
            np.take(table, (bits[i : i + _CHUNK] >> _DROP).astype(np.intp), out=out[i : i + _CHUNK])
    else:
        out = np.zeros_like(flat)
        keep = flat != 0 if zeros else slice(None)
        out[keep] = cc[labels[np.searchsorted(bins.lo, flat[keep])]]
    return out, counted_histogram(
        np.append(cc, flat.dtype.type(0)), np.append(counts, flat.size - counts.sum()), flat.dtype
    )


BLOCK_CHUNK = 1 << 20  # values per piece of block_palettes: whole blocks, bounded temporaries


def _row_keys(x: np.ndarray, row: np.ndarray) -> np.ndarray:
    """int64 keys of finite float32 values ``x`` ``[n, m]`` in the values' order within each row
    (the palette codec's :func:`~mconv.codecs.palette.order_keys`, zeros of either sign as +0.0)
    and every row's keys above the row before's, flattened."""
    bits = bit_view(x + np.float32(0.0))  # -0.0 + 0.0 is +0.0
    return (order_keys(bits, np.dtype(np.float32)).astype(np.int64) + (row << 32)).ravel()


BLOCK_INITS = ("linear", "density", "optimal")  # rule 8
GRID_PER_CLUSTER = 8  # block palettes, init="optimal": the DP runs on at most 8 k bins of a block


def _grid_optimal_rows(xs: np.ndarray, live: np.ndarray, k: int) -> np.ndarray:
    """Initial centroids for Lloyd: the exact DP (:func:`_optimal_weighted`) on each row's
    sorted values merged into at most :data:`GRID_PER_CLUSTER` ``* k`` bins of equal length
    (a bin's weight is its live values' count, its item their mean): exact k-means when the
    row has no more values than bins."""
    rows, width = xs.shape
    m = -(-width // (GRID_PER_CLUSTER * k))
    if m <= 1:
        return _optimal_rows(xs, live, k)
    pad = -width % m
    x = np.where(live, xs.astype(np.float64), 0.0)
    w = live.astype(np.float64)
    if pad:
        x = np.concatenate([x, np.zeros((rows, pad))], axis=1)
        w = np.concatenate([w, np.zeros((rows, pad))], axis=1)
    ws = w.reshape(rows, -1, m).sum(axis=2)
    xs_ = x.reshape(rows, -1, m).sum(axis=2)
    return _optimal_weighted(np.where(ws > 0, xs_ / np.maximum(ws, 1e-300), 0.0), ws, k)


def _lloyd_rows(xs: np.ndarray, live: np.ndarray, k: int, max_iter: int, init: str = "linear") -> np.ndarray:
    """1-D k-means of every row of ``xs`` (float32 ``[n, B]``, each row sorted) at once, over
    the values where ``live`` (the others, exact zeros, are left out), as :func:`lloyd_bins`
    does per tensor: centroids start evenly spaced between the row's least and greatest live
    value (``linear``); Lloyd steps until no row changes (a row at its fixed point stays there,
    so stepping the others further changes nothing) or ``max_iter``. A value exactly between
    two centroids goes to the lower; an empty cluster keeps its centroid. Each step is a binary
    search per midpoint in the rows' prefix sums: O(n k log(n B)), not O(n B k). Returns the
    centroids ``[n, k]`` (float64, sorted per row)."""
    n, width = xs.shape
    x64 = xs.astype(np.float64)
    pc = np.zeros((n, width + 1), np.int64)
    np.cumsum(live, axis=1, out=pc[:, 1:])
    pt = np.zeros((n, width + 1))
    np.cumsum(np.where(live, x64, 0.0), axis=1, out=pt[:, 1:])
    big = np.where(live, x64, np.inf).min(axis=1)
    small = np.where(live, x64, -np.inf).max(axis=1)
    dead = ~np.isfinite(big)  # rows without a live value
    big[dead] = small[dead] = 0.0
    row = np.arange(n, dtype=np.int64)[:, None]
    if init == "optimal":
        c = _grid_optimal_rows(xs, live, k)
    elif init == "density":  # the live values' quantiles (k of them, at (j + 0.5) / k)
        nlive = pc[:, -1]
        below = (xs < 0).sum(axis=1)  # the zeros sit between the negatives and the positives
        p = ((np.arange(k) + 0.5)[None, :] / k * nlive[:, None]).astype(np.int64)
        p = np.where(p >= below[:, None], p + (width - nlive)[:, None], p)
        c = np.take_along_axis(x64, np.minimum(p, width - 1), axis=1)
        c[nlive == 0] = 0.0
    else:
        c = big[:, None] + (small - big)[:, None] * np.linspace(0.0, 1.0, k)[None, :]
        c[:, -1] = small  # exact ends, as np.linspace
    keys = _row_keys(xs, row)  # ascending: rows sorted, row-major
    bounds = np.empty((n, k + 1), np.int64)
    bounds[:, 0], bounds[:, -1] = 0, width
    for _ in range(max_iter):
        mids = (c[:, 1:] + c[:, :-1]) / 2
        # values <= mid are the float32 values <= mid rounded down to float32
        f = mids.astype(np.float32)
        f = np.where(f > mids, np.nextafter(f, np.float32(-np.inf)), f)
        at = np.searchsorted(keys, _row_keys(f, row), side="right")
        bounds[:, 1:-1] = at.reshape(n, k - 1) - row * width
        cb = np.take_along_axis(pc, bounds, axis=1)
        tb = np.take_along_axis(pt, bounds, axis=1)
        counts = cb[:, 1:] - cb[:, :-1]
        new = np.where(counts > 0, (tb[:, 1:] - tb[:, :-1]) / np.maximum(counts, 1), c)
        new.sort(axis=1)
        if (new == c).all():
            break
        c = new
    return c


def _optimal_rows(xs: np.ndarray, live: np.ndarray, k: int) -> np.ndarray:
    """Exact 1-D k-means of every row of ``xs`` (float32 ``[n, B]``, each row sorted) over its
    ``live`` values, all rows at once: :func:`optimal_partition`'s divide-and-conquer DP with
    the segments of every row in one array per level (dead values weigh nothing). Returns the
    centroids ``[n, k]`` (float64, sorted; a cluster left without a live value repeats its
    neighbour's centroid)."""
    return _optimal_weighted(np.where(live, xs.astype(np.float64), 0.0), live.astype(np.float64), k)


def _optimal_weighted(x: np.ndarray, w: np.ndarray, k: int) -> np.ndarray:
    """:func:`_optimal_rows` on weighted items: ``x`` the items' means (float64, sorted per
    row), ``w`` their weights (0: left out)."""
    rows, width = x.shape
    x = x * (w > 0)
    live = w > 0
    if width <= k:  # every value its own cluster
        c = np.where(live, x, np.nan)
        c = np.concatenate([c, np.full((rows, k - width), np.nan)], axis=1)
        return _fill_empty(c)
    bounds = partition_rows(w, x * w, k)
    stride = width + 1
    px = np.zeros((rows, stride))
    np.cumsum(x * w, axis=1, out=px[:, 1:])
    pw = np.zeros((rows, stride))
    np.cumsum(w, axis=1, out=pw[:, 1:])
    count = np.diff(np.take_along_axis(pw, bounds, axis=1), axis=1)
    total = np.diff(np.take_along_axis(px, bounds, axis=1), axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        c = np.where(count > 0, total / count, np.nan)
    return _fill_empty(c)


def _fill_empty(c: np.ndarray) -> np.ndarray:
    """Rows of centroids with nan (empty clusters) filled from the nearest finite one before
    (else after; 0 in a row without any), then sorted."""
    c = c.copy()
    bad = np.isnan(c)
    if bad.any():
        idx = np.where(~bad, np.arange(c.shape[1])[None, :], 0)
        np.maximum.accumulate(idx, axis=1, out=idx)
        filled = np.take_along_axis(c, idx, axis=1)
        c = np.where(bad, filled, c)
        # leading nans (no finite value before): the first finite value of the row
        first = np.where(np.isnan(c), np.inf, 0.0)
        fin = np.where(np.isnan(c), np.nan, c)
        lead = np.nanmin(np.where(np.isnan(fin), np.inf, fin), axis=1)
        lead[~np.isfinite(lead)] = 0.0
        c = np.where(np.isinf(first), lead[:, None], c)
    c.sort(axis=1)
    return c


def block_palettes(
    array: np.ndarray, bits: int, block: int, *, init: str = "linear", max_iter: int = 100
) -> tuple[np.ndarray, np.ndarray]:
    """Per-block palettes (rule 8): ``array`` flattened (C order) cut into blocks of ``block``
    values (the last one shorter when the size is not a multiple), each clustered on its own.
    Returns the palettes (``[blocks, 2**bits]`` in ``array``'s dtype: a block's centroids
    sorted, zero first when the block holds exact zeros, unused entries zero) and the codes
    (uint8, ``array``'s shape) with ``palettes[flat_index // block, code]`` the clustered value.
    Vectorised over blocks, piece by piece (:data:`BLOCK_CHUNK` values)."""
    flat = np.ascontiguousarray(array).reshape(-1)
    n = flat.size
    nb = -(-n // block) if n else 0
    dtype = array.dtype
    if not np.isfinite(flat).all():
        raise InputError("weights hold inf or nan", hint="clean the weights before clustering")
    lut = np.zeros((nb, 1 << bits), dtype)
    codes = np.zeros(n, np.uint8)
    full = n // block
    step = max(BLOCK_CHUNK // block, 1)

    def run(lo: int, hi: int, width: int) -> None:  # blocks lo..hi-1, each ``width`` values
        x = flat[lo * block : lo * block + (hi - lo) * width].reshape(hi - lo, width).astype(np.float32)
        xs = np.sort(x, axis=1)
        holds_zero = (xs == 0).any(axis=1)
        code = np.zeros(x.shape, np.uint8)
        for zero in (False, True):  # blocks without zeros: 2**bits centroids; with: the zero + 2**bits - 1
            rows = np.flatnonzero(holds_zero == zero)
            if rows.size == 0:
                continue
            k, base = ((1 << bits) - 1, 1) if zero else (1 << bits, 0)
            c = _lloyd_rows(xs[rows], xs[rows] != 0, k, max_iter, init)
            lut[lo + rows, base : base + k] = c.astype(dtype)
            # each value to its nearest centroid, a value between two to the lower (as above)
            mids = (c[:, 1:] + c[:, :-1]) / 2
            part = x[rows]
            got = np.full(part.shape, base, np.uint8)
            for m in range(k - 1):
                got += part > mids[:, m : m + 1]
            got[part == 0] = 0
            code[rows] = got
        codes[lo * block : lo * block + x.size] = code.ravel()

    for lo in range(0, full, step):
        run(lo, min(lo + step, full), block)
    if full < nb:
        run(full, nb, n - full * block)
    return lut, codes.reshape(array.shape)


def cluster_blocks(
    array: np.ndarray, bits: int, block: int, *, init: str = "linear", max_iter: int = 100
) -> np.ndarray:
    """``array`` with each block's values replaced by their block's centroids (rule 8)."""
    lut, codes = block_palettes(array, bits, block, init=init, max_iter=max_iter)
    if array.size == 0:
        return array.copy()
    at = np.arange(array.size) // block
    return lut[at, codes.reshape(-1)].reshape(array.shape)


def cluster_array(
    array: np.ndarray,
    bits: int,
    init: Init = "linear",
    *,
    groups: int = 1,
    axis: int = 0,
    max_iter: int = 300,
    seed: int = 0,
    lam: float = 0.0,
) -> np.ndarray:
    """``array`` with its nonzero values replaced by their cluster centroids (rules 1-6; with
    ``lam > 0`` by entropy-constrained clustering, rule 10)."""
    if array.size == 0:
        return array.copy()
    nonzero = np.count_nonzero(array)
    k = max((1 << bits) - 1 if nonzero != array.size else 1 << bits, 1)
    groups = min(groups, array.shape[axis]) if array.ndim else 1  # no group without a channel
    if groups <= 1:
        flat = array.ravel()
        clustered, hist = _ecsq_flat(flat, k, init, lam, max_iter, seed, int(flat.size - nonzero))
        out = clustered.reshape(array.shape)
    else:
        out = np.empty_like(array)
        moved = np.moveaxis(array, axis, 0)
        target = np.moveaxis(out, axis, 0)
        hists = []
        for g, channels in enumerate(np.array_split(np.arange(moved.shape[0]), groups)):
            if channels.size == 0:
                continue
            part = moved[channels[0] : channels[-1] + 1]
            flat = np.ascontiguousarray(part).ravel()
            clustered, h = _ecsq_flat(
                flat, k, init, lam, max_iter, seed + g, int(flat.size - np.count_nonzero(flat))
            )
            target[channels[0] : channels[-1] + 1] = clustered.reshape(part.shape)
            hists.append(h)
        values, counts = (np.concatenate(parts) for parts in zip(*hists))
        hist = counted_histogram(values, counts, out.dtype)  # the whole tensor's, from its parts'
    remember_histogram(out, *hist)  # palette rule 8: the report, account and export count no more
    return out


_FREE_TENSOR = "Initializer"  # op type that tensors="all" reports for a tensor no node uses as weight


def _tensor_owner(name: str) -> ir.Node:
    """Stands in for a node when a tensor is clustered on its own (``tensors="all"``), a node
    outside any graph: overrides by op_name match the tensor's name, by op_type the word
    ``Initializer``."""
    return ir.Node("", _FREE_TENSOR, [], name=name, num_outputs=0)


def _free_tensor_refs(model: ir.Model, taken: list[WeightRef]) -> list[WeightRef]:
    """Float initializers of ndim >= 1 that are not already some node's weight (axis 0)."""
    seen = {id(r.value) for r in taken}
    refs = []
    for name, value in model.graph.initializers.items():
        t = value.const_value
        if id(value) in seen or t is None or len(t.shape) < 1:
            continue
        if t.dtype in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE):
            refs.append(WeightRef(_tensor_owner(name), value, 0, min(1, len(t.shape) - 1)))
    return refs


@register_pass("cluster")
class Cluster(Pass):
    """Weight sharing by k-means per tensor or per output-channel group (rules in the module doc)."""

    lossless = False

    @dataclass
    class Config:
        bits: int = bounded(5, 1, 8)
        init: Init = "linear"
        # "entropy": entropy-constrained clustering with ``lam`` (rule 10); "kmeans": plain k-means
        method: Literal["kmeans", "entropy"] = "kmeans"
        lam: float = bounded(0.0, 0.0, 1e6)
        groups: int = bounded(1, 1, MAX_COUNT)  # at most the tensor's channels are used
        # > 0: one palette per ``block`` consecutive values of the stored tensor (rule 8)
        block: int = bounded(0, 0, MAX_COUNT)
        max_iter: int = bounded(300, 0, 10**6)
        min_elements: int = bounded(16, 0, None)
        skip: bool = False
        op_types: list[str] = field(default_factory=lambda: [*WEIGHT_OPS, "Gather"])  # rule 9
        index_bits: int | None = bounded(None, 1, 8)
        # "weights": the weights of op_types nodes; "all": also every other float initializer of
        # ndim >= 1 (global config, axis 0). A weight-only model (no nodes: a safetensors /
        # npz / checkpoint import) always uses "all".
        tensors: Literal["weights", "all"] = "weights"

    def run(self, model: ir.Model, config: Config, ctx: PassContext) -> PassReport:
        lifted, refs = layer_weights(model, "cluster", required=config.tensors != "all")  # rule 11
        refs = refs + gather_tables(model, refs)  # rule 9
        if config.tensors == "all" or len(model.graph) == 0:
            refs = refs + _free_tensor_refs(model, refs)
        tensors, notes = [], []
        for i, ref in enumerate(refs):
            cfg = ctx.config_for(ref.node) if ctx.spec is not None else config
            if cfg.skip or (ref.node.op_type not in cfg.op_types and ref.node.op_type != _FREE_TENSOR):
                continue
            if not 1 <= cfg.bits <= 8:
                raise InputError(f"bits={cfg.bits}", where=f"node {ref.node.name}", hint="use 1 .. 8")
            if cfg.groups < 1:
                raise InputError(f"groups={cfg.groups}", where=f"node {ref.node.name}", hint="use 1 or more")
            if isinstance(cfg.block, bool) or not isinstance(cfg.block, int) or cfg.block < 0:
                raise InputError(
                    f"block={cfg.block!r}", where=f"node {ref.node.name}", hint="use 0 (off) or a block size"
                )
            if cfg.block and cfg.groups > 1:
                raise InputError(
                    f"block={cfg.block} with groups={cfg.groups}",
                    where=f"node {ref.node.name}",
                    hint="one palette per block or per group of channels, not both",
                )
            if cfg.method not in ("kmeans", "entropy"):
                raise InputError(
                    f"method={cfg.method!r}", where=f"node {ref.node.name}", hint="use kmeans or entropy"
                )
            if cfg.method == "entropy" and cfg.block:
                raise InputError(
                    f"method=entropy with block={cfg.block}",
                    where=f"node {ref.node.name}",
                    hint="entropy-constrained clustering works per tensor or per group of channels",
                )
            if cfg.block and cfg.init not in BLOCK_INITS:
                raise InputError(
                    f"init={cfg.init!r} with block={cfg.block}",
                    where=f"node {ref.node.name}",
                    hint=f"per-block palettes take init {', '.join(BLOCK_INITS)}",
                )
            w = ref.array()
            if w.size < cfg.min_elements:
                continue
            ctx.tick(f"cluster {ref.name}", i, len(refs))
            # more groups than channels: every channel is its own group (the rest would be empty)
            groups = min(cfg.groups, w.shape[ref.out_axis]) if w.ndim else 1
            if cfg.block:
                clustered = cluster_blocks(w, cfg.bits, cfg.block, init=cfg.init, max_iter=cfg.max_iter)
            else:
                clustered = cluster_array(
                    w,
                    cfg.bits,
                    cfg.init,
                    groups=groups,
                    axis=ref.out_axis,
                    max_iter=cfg.max_iter,
                    seed=ctx.seed + i,
                    lam=float(cfg.lam) if cfg.method == "entropy" else 0.0,
                )
            ref.set_array(clustered)
            facts = {"block": cfg.block} if cfg.block else {"groups": groups, "axis": ref.out_axis}
            record_compression(
                model,
                ref.value,
                bits=cfg.bits,
                init=cfg.init,
                index_bits=cfg.index_bits,
                **facts,
            )
            book = value_histogram(clustered)[0]  # cluster_array's own counts (palette rule 8)
            tensors.append(
                {
                    "name": ref.name,
                    "node": ref.node.name,
                    "op": ref.node.op_type,
                    "shape": list(w.shape),
                    "bits": cfg.bits,
                    "init": cfg.init,
                    **({"method": "entropy", "lam": cfg.lam} if cfg.method == "entropy" else {}),
                    "groups": groups,
                    **({"block": cfg.block} if cfg.block else {}),
                    "codebook_size": int(np.count_nonzero(book)),
                    "mse": squared_error(w, clustered) / max(w.size, 1),
                    "snr_db": snr_db(w, clustered),
                }
            )
            del w, clustered  # before the next tensor is read: one large weight in memory at a time
        notes.append(f"{len(tensors)} tensors clustered")
        if lifted:
            notes.append(f"{len(lifted)} weights stored as Constant nodes became initializers (rule 11)")
        return self.report(bool(tensors), notes=notes, tensors=tensors)
