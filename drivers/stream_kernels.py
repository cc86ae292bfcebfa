"""Fast numpy kernels for streamed weight compression (:mod:`mconv.drivers.weights_stream`).

Each kernel gives the same bytes as the straightforward code it replaces, in fewer passes over
memory and in pieces small enough to stay in cache (``SUB`` values at a time):

* :func:`hist16`: the histogram of a 16-bit float tensor's bit patterns (65,536 counts) in
  one pass; a 16-bit tensor has at most 65,536 distinct values, so 1-D k-means on this
  histogram is k-means on the tensor itself.
* :func:`lookup16`: codes through a 65,536-entry table indexed by the bit pattern.
* :func:`hist_error`: MSE terms of a palette from the histogram alone (exact, float64): no
  pass over the tensor is needed for the report.
* :func:`pack4`: two 4-bit codes per byte, LSB first, as one operation on the uint16 view.
* :func:`rtn_blocks`: round-to-nearest blockwise codes of a run of whole blocks with per-block
  max/min from ``np.maximum.reduceat`` (no ``argmax`` per block), the same scales, zero points
  and codes as :func:`mconv.passes.blockwise.quantize_rtn`, and the squared error of the
  dequantized values.

numpy releases the GIL in all of these, so a thread pool runs them on every core.
"""

from __future__ import annotations

import functools

import numpy as np
from mconv.errors import InputError

SUB = 1 << 18  # values per piece: float32 temporaries of 1 MB


@functools.lru_cache(maxsize=4)
def values16(dtype: np.dtype) -> np.ndarray:
    """float64 value of every 16-bit pattern of ``dtype`` (float16 or bfloat16)."""
    with np.errstate(invalid="ignore"):  # bfloat16's nan patterns
        return np.arange(1 << 16, dtype=np.uint16).view(dtype).astype(np.float64)


@functools.lru_cache(maxsize=4)
def _f32_table(dtype: np.dtype) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.arange(1 << 16, dtype=np.uint16).view(dtype).astype(np.float32)


def to_float32(raw: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``raw`` (the bytes of a 1-D float16, bfloat16 or float32 array) as float32: 16-bit
    values through the exact 65,536-entry table (one path for both 16-bit types: bfloat16 has no
    fast numpy cast at all, and for float16 the table is at least as fast as numpy's cast)."""
    if dtype.itemsize == 4:
        return raw.view(np.float32)
    return np.take(_f32_table(dtype), raw.view(np.uint16).astype(np.intp))


@functools.lru_cache(maxsize=16)
def _starts(n: int, block: int) -> np.ndarray:
    return np.arange(0, n, block)


def hist16(raw: np.ndarray) -> np.ndarray:
    """Counts of each uint16 bit pattern in ``raw`` (int64 ``[65536]``)."""
    flat = raw.reshape(-1)
    out = np.zeros(1 << 16, np.int64)
    for i in range(0, flat.size, SUB):
        # bincount casts to intp itself, twice as slowly as an explicit cast
        out += np.bincount(flat[i : i + SUB].astype(np.intp), minlength=1 << 16)
    return out


def lookup16(raw: np.ndarray, table: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``table[raw]`` (uint8) for a uint16 ``raw``, piece by piece (into ``out``, contiguous and
    of ``raw``'s size, when given)."""
    flat = raw.reshape(-1)
    out = np.empty(flat.size, table.dtype) if out is None else out.reshape(-1)
    for i in range(0, flat.size, SUB):
        np.take(table, flat[i : i + SUB].astype(np.intp), out=out[i : i + SUB])
    return out.reshape(raw.shape)


def hist_error(hist: np.ndarray, values: np.ndarray, approx: np.ndarray) -> tuple[float, float]:
    """(sum of squares, sum of squared errors) over a tensor given by its histogram ``hist`` of
    codes whose values are ``values`` and reconstructions ``approx`` (both per code)."""
    used = np.flatnonzero(hist)
    n = hist[used].astype(np.float64)
    v = values[used]
    d = approx[used].astype(np.float64) - v
    # not np.dot: BLAS threads fight the pool's threads on a busy machine
    return float(np.sum(n * v * v)), float(np.sum(n * d * d))


def pack4(codes: np.ndarray) -> np.ndarray:
    """Rows of 4-bit codes (uint8 < 16) packed two per byte, LSB first; rows of odd length get a
    zero nibble at the end (as ``weights_stream._pack``)."""
    r, k = codes.shape
    if k % 2:
        codes = np.concatenate([codes, np.zeros((r, 1), np.uint8)], axis=1)
        k += 1
    p = np.ascontiguousarray(codes).reshape(-1).view(np.uint16)  # little-endian: low byte first
    return (p | (p >> 4)).astype(np.uint8).reshape(r, k // 2)


def _f16(x: np.ndarray) -> np.ndarray:
    """As :func:`mconv.passes.blockwise._f16`: float16-rounded magnitudes in [2**-24, 65504]."""
    y = np.clip(np.abs(x), 2.0**-24, 65504.0).astype(np.float16).astype(np.float32)
    return np.where(x < 0, -y, y)


def block_params(x: np.ndarray, bits: int, block: int, sym: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """Per-block float32 scale and zero point (asymmetric) of ``x`` (float32, a whole number of
    blocks), as ``blockwise._rtn_params``; inf or nan is an InputError."""
    starts = _starts(x.size, block)
    mx = np.maximum.reduceat(x, starts)
    mn = np.minimum.reduceat(x, starts)
    # one test for both: inf - inf and nan give nan, inf - finite gives inf (then the exact test)
    if not np.isfinite(mx - mn).all() and not (np.isfinite(mx).all() and np.isfinite(mn).all()):
        raise InputError("weights hold inf or nan", hint="clean the weights before quantizing")
    if sym:
        # the value of largest magnitude, the first one on a tie of +a and -a (as argmax)
        m = np.where(mx >= -mn, mx, mn)
        tie = np.flatnonzero((mx == -mn) & (mx != 0))
        if tie.size:
            blocks = x.reshape(-1, block)[tie]
            m[tie] = blocks[np.arange(tie.size), np.abs(blocks).argmax(axis=1)]
        scale = np.where(m == 0, np.float32(1.0), m / np.float32(-(1 << (bits - 1))))
        return _f16(scale), None
    qmax = (1 << bits) - 1
    lo = np.minimum(mn, 0.0)
    hi = np.maximum(mx, 0.0)
    scale = _f16(np.where(hi > lo, (hi - lo) / qmax, np.float32(1.0)))
    zero = np.clip(np.rint(-lo / scale), 0, qmax)
    return scale, zero


def rtn_blocks(
    x: np.ndarray, scale: np.ndarray, zero: np.ndarray | None, bits: int, block: int
) -> tuple[np.ndarray, float, float]:
    """Stored codes (uint8: symmetric codes offset by 2**(bits-1)) of ``x`` (float32, whole
    blocks) for per-block ``scale`` / ``zero``, with the sums of squares of ``x`` and of the
    dequantization error."""
    v = x.reshape(-1, block) / scale[:, None]
    np.rint(v, out=v)
    v += (1 << (bits - 1)) if zero is None else zero[:, None]
    np.clip(v, 0, (1 << bits) - 1, out=v)
    codes = v.astype(np.uint8).reshape(-1)
    # dequantized as blockwise.dequantize does: (code - offset) * scale in float32
    v -= (1 << (bits - 1)) if zero is None else zero[:, None]
    v *= scale[:, None]
    d = v.reshape(-1)
    d -= x
    # einsum's own SIMD loop, not BLAS: BLAS threads fight the pool's threads
    return codes, float(np.einsum("i,i->", x, x)), float(np.einsum("i,i->", d, d))
