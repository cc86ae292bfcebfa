"""cluster: weight sharing by 1-D k-means (Deep Compression, Han et al. 2016, section 3).

Every selected weight tensor (see :mod:`mconv.passes._weights`) is replaced by the nearest of a
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
3. Centroid initialisation ``init``: ``linear`` (default, the paper's winner: evenly spaced
   between min and max), ``density`` (evenly spaced quantiles of the values' CDF),
   ``kmeans++`` (seeded D² sampling on at most 65,536 sampled values), ``optimal`` (exact
   1-D k-means by dynamic programming over the sorted distinct values weighted by their counts;
   a tensor with more than 65,536 distinct values is first binned by rounding to float16, the
   DP is exact on those bins, and Lloyd iterations on the exact values follow).
4. Lloyd iterations (all inits but a solved ``optimal``) run on the sorted values with prefix
   sums: each iteration is O(k log n), the sort is done once. Empty clusters keep their centroid.
5. The assignment is to the nearest centroid; a value exactly between two goes to the lower.
   Centroids are float32 means of their members; the tensor keeps its dtype.
6. The saved model holds the clustered values as plain dense initializers (any ONNX tool runs
   it); each tensor's settings go to its metadata (``mconv.cluster`` = bits, init, groups, axis;
   model-level ``mconv.compression``) so export re-derives the codebook (distinct values ->
   palette) and fine-tuning can update centroids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import onnx_ir as ir
from mconv.errors import InputError
from mconv.passes._weights import (
    WEIGHT_OPS,
    WeightRef,
    record_compression,
    snr_db,
    squared_error,
    weight_refs,
)
from mconv.passes.base import Pass, PassContext, PassReport, register_pass

Init = Literal["linear", "density", "kmeans++", "optimal"]
MAX_DP_VALUES = 1 << 16
_CHUNK = 1024


# --- sorted data with chunked prefix sums ----------------------------------------------------


class _SortedValues:
    """Sorted values with prefix sums at any position in O(chunk) (no O(n) float64 cumsum)."""

    def __init__(self, values: np.ndarray) -> None:
        self.s = np.sort(values.ravel())
        n = self.s.size
        full = n // _CHUNK * _CHUNK
        chunks = self.s[:full].reshape(-1, _CHUNK).sum(axis=1, dtype=np.float64)
        self.chunk_prefix = np.concatenate([[0.0], np.cumsum(chunks)])

    @property
    def n(self) -> int:
        return int(self.s.size)

    def prefix(self, positions: np.ndarray) -> np.ndarray:
        """Sum of s[:p] for each p: chunk prefix plus a masked gather of the partial chunk."""
        positions = np.asarray(positions, dtype=np.int64)
        chunk = positions // _CHUNK
        offsets = np.arange(_CHUNK)
        idx = chunk[:, None] * _CHUNK + offsets[None, :]
        inside = offsets[None, :] < (positions - chunk * _CHUNK)[:, None]
        part = np.where(inside, self.s[np.minimum(idx, self.n - 1)], 0).sum(axis=1, dtype=np.float64)
        return self.chunk_prefix[chunk] + part


def lloyd_sorted(data: _SortedValues, centroids: np.ndarray, max_iter: int = 300) -> np.ndarray:
    """Lloyd iterations on sorted values (rule 4); returns sorted float64 centroids."""
    c = np.sort(np.asarray(centroids, dtype=np.float64))
    for _ in range(max_iter):
        mids = ((c[1:] + c[:-1]) / 2).astype(data.s.dtype)  # in the data's dtype: no O(n) upcast
        bounds = np.concatenate([[0], np.searchsorted(data.s, mids, side="right"), [data.n]])
        counts = np.diff(bounds)
        sums = np.diff(data.prefix(bounds))
        new = np.where(counts > 0, sums / np.maximum(counts, 1), c)
        new = np.sort(new)
        if np.array_equal(new, c):
            break
        c = new
    return c


# --- exact 1-D k-means ----------------------------------------------------------------------


def optimal_kmeans_1d(values: np.ndarray, weights: np.ndarray, k: int) -> np.ndarray:
    """Exact weighted 1-D k-means of sorted distinct ``values`` (rule 3, ``optimal``).

    Dynamic programming D[j][i] = min_a D[j-1][a] + cost(a, i) over the first i values, with the
    divide-and-conquer optimisation (the best split a is monotone in i), one recursion level at
    a time, vectorized over all segments of the level: O(k n log n) numpy work, deterministic
    (ties go to the smallest split). Returns the sorted centroids (fewer when n < k).
    """
    x = np.asarray(values, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    n = x.size
    if n <= k:
        return x.copy()
    pw = np.concatenate([[0.0], np.cumsum(w)])
    ps = np.concatenate([[0.0], np.cumsum(w * x)])
    pq = np.concatenate([[0.0], np.cumsum(w * x * x)])

    def cost(a: np.ndarray, b: np.ndarray) -> np.ndarray:  # items a..b-1
        cw = pw[b] - pw[a]
        cs = ps[b] - ps[a]
        return np.maximum(pq[b] - pq[a] - cs * cs / np.where(cw > 0, cw, 1.0), 0.0)

    idx = np.arange(n + 1)
    prev = cost(np.zeros(n + 1, dtype=np.int64), idx)
    splits = np.zeros((k, n + 1), dtype=np.int64)
    for j in range(2, k + 1):
        cur = np.full(n + 1, np.inf)
        lo, hi = np.array([j]), np.array([n])
        optlo, opthi = np.array([j - 1]), np.array([n - 1])
        while lo.size:
            mid = (lo + hi) // 2
            last = np.minimum(mid - 1, opthi)
            lengths = last - optlo + 1
            seg = np.repeat(np.arange(mid.size), lengths)
            starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
            a = optlo[seg] + (np.arange(seg.size) - starts[seg])
            vals = prev[a] + cost(a, mid[seg])
            best = np.minimum.reduceat(vals, starts)
            first = np.flatnonzero(vals == best[seg])
            _, pick = np.unique(seg[first], return_index=True)
            arg = a[first[pick]]
            cur[mid] = best
            splits[j - 1, mid] = arg
            left = lo <= mid - 1
            right = mid + 1 <= hi
            lo, hi, optlo, opthi = (
                np.concatenate([lo[left], mid[right] + 1]),
                np.concatenate([mid[left] - 1, hi[right]]),
                np.concatenate([optlo[left], arg[right]]),
                np.concatenate([arg[left], opthi[right]]),
            )
        prev = cur
    ends = [n]
    for j in range(k, 1, -1):
        ends.append(int(splits[j - 1, ends[-1]]))
    ends.append(0)
    bounds = np.array(ends[::-1])
    return (ps[bounds[1:]] - ps[bounds[:-1]]) / (pw[bounds[1:]] - pw[bounds[:-1]])


# --- initialisations ------------------------------------------------------------------------


def _unique_counts(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct values of a sorted array and their counts."""
    starts = np.concatenate([[0], np.flatnonzero(s[1:] != s[:-1]) + 1])
    counts = np.diff(np.concatenate([starts, [s.size]]))
    return s[starts], counts


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


def kmeans_1d(
    values: np.ndarray, k: int, init: Init = "linear", *, max_iter: int = 300, seed: int = 0
) -> np.ndarray:
    """Sorted float64 centroids of 1-D k-means over ``values`` (rules 3-4)."""
    values = np.asarray(values).ravel()
    if values.size == 0:
        return np.zeros(0)
    return _kmeans_sorted(_SortedValues(values), k, init, max_iter, seed)


def _fp16_histogram(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Counts of sorted ``s`` rounded to float16, without converting ``s``: the thresholds halfway
    between neighbouring float16 values are searched in ``s`` (O(65536 log n) instead of an O(n)
    conversion). Returns the occupied float16 values (as float64) and their counts."""
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    h = np.unique(h[np.isfinite(h)].astype(np.float64))
    mids = ((h[1:] + h[:-1]) / 2).astype(s.dtype)  # exact in float32
    # A value exactly halfway rounds to the neighbour with the even float16 bit pattern.
    lower_even = (h[:-1].astype(np.float16).view(np.uint16) & 1) == 0
    cut = np.where(lower_even, np.searchsorted(s, mids, side="right"), np.searchsorted(s, mids, side="left"))
    bounds = np.concatenate([[0], cut, [s.size]])
    counts = np.diff(bounds)
    keep = counts > 0
    return h[keep], counts[keep]


def _kmeans_sorted(data: _SortedValues, k: int, init: Init, max_iter: int, seed: int) -> np.ndarray:
    s = data.s
    if s[0] == s[-1]:
        return np.array([float(s[0])])
    if init == "linear":
        c0 = np.linspace(float(s[0]), float(s[-1]), k)
    elif init == "density":
        c0 = s[np.minimum(((np.arange(k) + 0.5) / k * s.size).astype(np.int64), s.size - 1)].astype(
            np.float64
        )
    elif init == "kmeans++":
        rng = np.random.default_rng(seed)
        sample = s if s.size <= MAX_DP_VALUES else s[np.sort(rng.integers(0, s.size, MAX_DP_VALUES))]
        c0 = _kmeans_pp(sample.astype(np.float64), k, rng)
    elif init == "optimal":
        # Few distinct values (e.g. fp16-rounded weights): exact DP on them; otherwise the DP runs
        # on the float16 histogram and Lloyd iterations on the real values finish the job.
        if s.size <= MAX_DP_VALUES or np.count_nonzero(s[1:] != s[:-1]) < MAX_DP_VALUES:
            u, counts = _unique_counts(s)
            return optimal_kmeans_1d(u, counts, k)
        u, counts = _fp16_histogram(s)
        c0 = optimal_kmeans_1d(u, counts, k)
    else:
        raise InputError(f"unknown init {init!r}", hint="use linear, density, kmeans++ or optimal")
    return lloyd_sorted(data, c0, max_iter)


def assign_nearest(
    values: np.ndarray, centroids: np.ndarray, lo: float | None = None, hi: float | None = None
) -> np.ndarray:
    """Index of the nearest sorted centroid for each value (rule 5).

    A 65,536-bin lookup table over [lo, hi] (the values' range) decides most values in one
    gather; only values in bins next to a midpoint are placed by binary search.
    """
    x = np.asarray(values).ravel()
    c = np.asarray(centroids, dtype=np.float64)
    if c.size <= 1 or x.size == 0:
        return np.zeros(x.size, dtype=np.int16)
    mids = ((c[1:] + c[:-1]) / 2).astype(x.dtype)  # the same midpoints as lloyd_sorted
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


def cluster_array(
    array: np.ndarray,
    bits: int,
    init: Init = "linear",
    *,
    groups: int = 1,
    axis: int = 0,
    max_iter: int = 300,
    seed: int = 0,
) -> np.ndarray:
    """``array`` with its nonzero values replaced by their cluster centroids (rules 1, 2, 5)."""
    has_zeros = np.count_nonzero(array) != array.size
    k = max((1 << bits) - 1 if has_zeros else 1 << bits, 1)
    if groups <= 1 and not has_zeros:  # the common dense case: no masks, no copies
        if array.size == 0:
            return array.copy()
        data = _SortedValues(array)
        centroids = _kmeans_sorted(data, k, init, max_iter, seed)
        labels = assign_nearest(array, centroids, float(data.s[0]), float(data.s[-1]))
        del data
        return centroids.astype(array.dtype)[labels].reshape(array.shape)
    out = np.zeros_like(array)
    moved = np.moveaxis(array, axis, 0)
    target = np.moveaxis(out, axis, 0)
    for g, channels in enumerate(np.array_split(np.arange(moved.shape[0]), max(1, groups))):
        if channels.size == 0:
            continue
        part = moved[channels[0] : channels[-1] + 1]
        into = target[channels[0] : channels[-1] + 1]  # a view of ``out``
        nz = (part != 0) if has_zeros else None
        values = part[nz] if has_zeros else part.ravel()
        if values.size == 0:
            continue
        data = _SortedValues(values)
        centroids = _kmeans_sorted(data, k, init, max_iter, seed + g)
        labels = assign_nearest(values, centroids, float(data.s[0]), float(data.s[-1]))
        del data, values
        clustered = centroids.astype(array.dtype)[labels]
        if has_zeros:
            into[nz] = clustered
        else:
            into[...] = clustered.reshape(part.shape)
    return out


_FREE_TENSOR = "Initializer"  # op type that tensors="all" reports for a tensor no node uses as weight


@dataclass
class _TensorOwner:
    """Stands in for a node when a tensor is clustered on its own (``tensors="all"``): overrides
    by op_name match the tensor's name, by op_type the word ``Initializer``."""

    name: str
    op_type: str = _FREE_TENSOR
    domain: str = ""


def _free_tensor_refs(model: ir.Model, taken: list[WeightRef]) -> list[WeightRef]:
    """Float initializers of ndim >= 1 that are not already some node's weight (axis 0)."""
    seen = {id(r.value) for r in taken}
    refs = []
    for name, value in model.graph.initializers.items():
        t = value.const_value
        if id(value) in seen or t is None or len(t.shape) < 1:
            continue
        if t.dtype in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE):
            refs.append(WeightRef(_TensorOwner(name), value, 0, min(1, len(t.shape) - 1)))
    return refs


@register_pass("cluster")
class Cluster(Pass):
    """Weight sharing by k-means per tensor or per output-channel group (rules in the module doc)."""

    lossless = False

    @dataclass
    class Config:
        bits: int = 5
        init: Init = "linear"
        groups: int = 1
        max_iter: int = 300
        min_elements: int = 16
        skip: bool = False
        op_types: list[str] = field(default_factory=lambda: list(WEIGHT_OPS))
        index_bits: int | None = None
        # "weights": the weights of op_types nodes; "all": also every other float initializer of
        # ndim >= 1 (global config, axis 0). A weight-only model (no nodes: a safetensors /
        # npz / checkpoint import) always uses "all".
        tensors: Literal["weights", "all"] = "weights"

    def run(self, model: ir.Model, config: Config, ctx: PassContext) -> PassReport:
        refs = weight_refs(model)
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
            w = ref.array()
            if w.size < cfg.min_elements:
                continue
            ctx.tick(f"cluster {ref.name}", i, len(refs))
            clustered = cluster_array(
                w,
                cfg.bits,
                cfg.init,
                groups=cfg.groups,
                axis=ref.out_axis,
                max_iter=cfg.max_iter,
                seed=ctx.seed + i,
            )
            ref.set_array(clustered)
            record_compression(
                model,
                ref.value,
                bits=cfg.bits,
                init=cfg.init,
                groups=cfg.groups,
                axis=ref.out_axis,
                index_bits=cfg.index_bits,
            )
            nz = clustered[clustered != 0]
            tensors.append(
                {
                    "name": ref.name,
                    "node": ref.node.name,
                    "op": ref.node.op_type,
                    "shape": list(w.shape),
                    "bits": cfg.bits,
                    "init": cfg.init,
                    "groups": cfg.groups,
                    "codebook_size": int(np.unique(nz).size),
                    "mse": squared_error(w, clustered) / max(w.size, 1),
                    "snr_db": snr_db(w, clustered),
                }
            )
        notes.append(f"{len(tensors)} tensors clustered")
        return self.report(bool(tensors), notes=notes, tensors=tensors)
