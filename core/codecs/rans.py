"""Interleaved rANS coding of a stream of small symbols, with a static frequency table.

Issue 14 item 6: canonical Huffman spends a whole number of bits per symbol and is 3-5 % above
the zero-order entropy of the gap and index streams; range ANS (Duda 2013) spends fractions of a
bit and stays within a few tenths of a percent of it, tables and states included.

Rules:
1. Frequencies are the stream's symbol counts normalised to ``M = 2**k`` (``k`` in
   ``PROB_BITS``): every symbol that occurs gets at least 1, the sum is exactly ``M``, and the
   rounding is the greedy one that minimises the coded size (deterministic tie-breaks by
   symbol). ``k`` is the one giving the smallest stream, table bytes included.
2. The stream is cut into ``lanes = ceil(count / LANE_SYMBOLS)`` interleaved rANS coders:
   symbol ``i`` belongs to lane ``i % lanes`` and is that lane's step ``i // lanes``. Each lane
   has a 32-bit state in ``[L, 256 L)``, ``L = 2**23``; it starts (at the encoder) at ``L``.
   Encoding symbol ``s`` (frequency ``f``, cumulative frequency ``c``): while ``x >= (L >> k)
   * 256 * f``, emit ``x & 255`` and shift ``x`` right by 8; then ``x = (x // f) * M + x % f + c``.
   Decoding: ``slot = x % M``, ``s`` the symbol with ``c <= slot < c + f``, ``x = f * (x >> k) +
   slot - c``; while ``x < L``: ``x = (x << 8) | next byte``.
3. Byte order of the payload, as the decoder reads it: step by step (step 0 first); within a
   step, first the first byte of every lane that needs one (in lane order), then the second
   byte of every lane that needs two (a lane needs at most two). The decoder starts from the
   stored final encoder states and must end with every lane at ``L``.
4. The payload's length is fixed by the counts alone: ``floor(B / 8)`` bytes, where ``B`` is the
   sum over symbols of ``cost(f) = ceil(2**24 log2(M / f)) / 2**24`` bits plus ``EPS(k)`` bits
   each, an upper bound on what rANS emits (every emitted byte takes 8 bits off ``log2 x``, every
   encoded symbol adds at most ``log2(M / f) + log2(1 + 2**k / L)``). The encoder pads its output
   with zero bytes up to that length (the few bytes the bound over-estimates), so the byte
   account predicts the stream exactly from a histogram.

Stream layout (little-endian, byte-aligned)::

    u32 count        symbols in the stream
    u32 lanes        interleaved coders (0 for an empty stream)
    u32 payload      bytes of payload
    u16 alphabet     symbol values are 0 .. alphabet-1 (2 .. 256)
    u8  k            log2 of the frequency total (PROB_BITS), 0 for an empty stream
    u8  reserved     0
    varint freq[alphabet]   LEB128, the normalised frequencies (sum 2**k)
    u32 state[lanes]        final encoder states = the decoder's initial ones
    u8  payload[payload]

Decoding checks every count, frequency, state and offset against the blob, and that every lane
ends at ``L`` and the padding is zero, so a damaged stream raises ``InputError``.
"""

from __future__ import annotations

import heapq
import math

import numpy as np
from mconv.codecs.bitstream import BlobReader
from mconv.errors import InputError

HEADER_BYTES = 16
LANE_SYMBOLS = 8192
PROB_BITS = (10, 11, 12, 13, 14, 15)
STATE_LOW = 1 << 23
_FP = 1 << 24  # fixed-point units of a bit in the size bound


def _cost_table(k: int) -> list[int]:
    """``cost[f] = ceil(2**24 log2(2**k / f))`` for f in 1 .. 2**k (index 0 unused)."""
    m = 1 << k
    f = np.arange(1, m + 1, dtype=np.float64)
    cost = np.ceil((k - np.log2(f)) * _FP).astype(np.int64) + 1  # +1: a margin for rounding
    cost[-1] = 0  # f = M: log2(1) = 0 exactly
    return [0, *cost.tolist()]


_COSTS: dict[int, list[int]] = {}


def _costs(k: int) -> list[int]:
    if k not in _COSTS:
        _COSTS[k] = _cost_table(k)
    return _COSTS[k]


def _eps(k: int) -> int:
    """Fixed-point bound of the per-symbol excess ``log2(1 + 2**k / L)`` (rule 4)."""
    return math.ceil(math.log2(1 + (1 << k) / STATE_LOW) * _FP) + 1


def normalize(counts: np.ndarray, k: int) -> np.ndarray:
    """Frequencies summing to ``2**k``, >= 1 for every symbol that occurs (rule 1)."""
    counts = np.asarray(counts, dtype=np.int64)
    m = 1 << k
    used = np.flatnonzero(counts)
    freq = np.zeros(counts.size, dtype=np.int64)
    if used.size == 0:
        return freq
    if used.size > m:
        raise InputError(f"{used.size} symbols do not fit a frequency total of {m}")
    total = int(counts.sum())
    c = counts[used]
    f = np.maximum(1, (c * m) // total)
    left = m - int(f.sum())
    cnt = c.tolist()
    fl = f.tolist()
    if left > 0:  # give the slots with the largest gain first: c * log2((f + 1) / f)
        heap = [(-cnt[i] * math.log2((fl[i] + 1) / fl[i]), i) for i in range(len(fl))]
        heapq.heapify(heap)
        for _ in range(left):
            _, i = heapq.heappop(heap)
            fl[i] += 1
            heapq.heappush(heap, (-cnt[i] * math.log2((fl[i] + 1) / fl[i]), i))
    elif left < 0:  # take back where it costs least: c * log2(f / (f - 1)), f > 1
        heap = [(cnt[i] * math.log2(fl[i] / (fl[i] - 1)), i) for i in range(len(fl)) if fl[i] > 1]
        heapq.heapify(heap)
        for _ in range(-left):
            _, i = heapq.heappop(heap)
            fl[i] -= 1
            if fl[i] > 1:
                heapq.heappush(heap, (cnt[i] * math.log2(fl[i] / (fl[i] - 1)), i))
    freq[used] = fl
    return freq


def _varint_len(values: np.ndarray) -> int:
    v = np.asarray(values, dtype=np.int64)
    return int(np.sum(1 + (v >= 1 << 7) + (v >= 1 << 14) + (v >= 1 << 21)))


def _varints(values: np.ndarray) -> bytes:
    out = bytearray()
    for n in np.asarray(values, dtype=np.int64).tolist():
        while True:
            byte, n = n & 0x7F, n >> 7
            out.append(byte | (0x80 if n else 0))
            if not n:
                break
    return bytes(out)


def payload_bound(counts: np.ndarray, freq: np.ndarray, k: int) -> int:
    """The payload's bytes (rule 4), from the counts and the normalised frequencies."""
    costs = _costs(k)
    eps = _eps(k)
    bits = 0
    for c, f in zip(np.asarray(counts).tolist(), np.asarray(freq).tolist()):
        if c:
            bits += c * (costs[f] + eps)
    return bits // (8 * _FP)


def plan(counts: np.ndarray) -> tuple[int, np.ndarray, int]:
    """``(k, freq, stream bytes)`` of the smallest stream for these counts (rule 1)."""
    counts = np.asarray(counts, dtype=np.int64)
    n = int(counts.sum())
    if n == 0:
        return 0, np.zeros(counts.size, dtype=np.int64), HEADER_BYTES + counts.size
    lanes = -(-n // LANE_SYMBOLS)
    best: tuple[int, np.ndarray, int] | None = None
    used = int(np.count_nonzero(counts))
    for k in PROB_BITS:
        if used > 1 << k:
            continue
        freq = normalize(counts, k)
        size = HEADER_BYTES + _varint_len(freq) + 4 * lanes + payload_bound(counts, freq, k)
        if best is None or size < best[2]:
            best = (k, freq, size)
    if best is None:
        raise InputError(f"{used} symbols do not fit a frequency total of {1 << PROB_BITS[-1]}")
    return best


def encoded_nbytes(counts: np.ndarray) -> int:
    """Exact size of ``encode_symbols`` output for a stream with these symbol counts."""
    return plan(counts)[2]


def encode_symbols(symbols: np.ndarray, alphabet: int) -> bytes:
    """rANS-code ``symbols`` (ints in 0..alphabet-1) into a self-describing stream."""
    symbols = np.ascontiguousarray(symbols).ravel().astype(np.int64)
    if not 2 <= alphabet <= 256:
        raise InputError(f"rANS alphabet of {alphabet} symbols", hint="use 2 .. 256 symbols")
    if symbols.size and (symbols.min() < 0 or symbols.max() >= alphabet):
        raise InputError(f"rANS symbol out of range 0..{alphabet - 1}")
    if symbols.size >= 1 << 32:
        raise InputError("rANS stream of 2**32 symbols or more", hint="store this tensor with a dense codec")
    counts = np.bincount(symbols, minlength=alphabet)
    k, freq, size = plan(counts)
    n = int(symbols.size)
    lanes = -(-n // LANE_SYMBOLS) if n else 0
    table = _varints(freq)
    if n == 0:
        header = np.array([0, 0, 0], dtype="<u4").tobytes() + int(alphabet).to_bytes(2, "little") + b"\0\0"
        return header + table
    payload_len = size - HEADER_BYTES - len(table) - 4 * lanes
    states, payload = _encode(symbols, freq, k, lanes)
    if len(payload) > payload_len:  # rule 4's bound cannot be exceeded; never write a wrong stream
        raise AssertionError(f"rANS payload {len(payload)} bytes above its bound {payload_len}")
    header = np.array([n, lanes, payload_len], dtype="<u4").tobytes()
    header += int(alphabet).to_bytes(2, "little") + bytes([k, 0])
    return header + table + states.astype("<u4").tobytes() + payload + b"\0" * (payload_len - len(payload))


# Streams of at most this many lanes are coded symbol by symbol in Python (faster than numpy
# steps over a handful of lanes); both paths write and read the same bytes.
_SCALAR_LANES = 2


def _encode(symbols: np.ndarray, freq: np.ndarray, k: int, lanes: int) -> tuple[np.ndarray, bytes]:
    if lanes <= _SCALAR_LANES:
        return _encode_scalar(symbols.tolist(), freq.tolist(), k, lanes)
    n = symbols.size
    steps = -(-n // lanes)
    padded = np.zeros(steps * lanes, dtype=np.int64)
    padded[:n] = symbols
    grid = padded.reshape(steps, lanes)
    cum = np.concatenate([[0], np.cumsum(freq)[:-1]]).astype(np.uint64)
    f64 = freq.astype(np.uint64)
    m = np.uint64(1 << k)
    x = np.full(lanes, STATE_LOW, dtype=np.uint64)
    x_max_unit = np.uint64((STATE_LOW >> k) << 8)
    chunks: list[bytes] = []
    for t in range(steps - 1, -1, -1):
        active = lanes if t < steps - 1 else n - (steps - 1) * lanes
        s = grid[t, :active]
        f = f64[s]
        xa = x[:active]
        x_max = x_max_unit * f
        e1 = xa >= x_max
        b1 = (xa & np.uint64(255)).astype(np.uint8)
        xa = np.where(e1, xa >> np.uint64(8), xa)
        e2 = xa >= x_max
        b2 = (xa & np.uint64(255)).astype(np.uint8)
        xa = np.where(e2, xa >> np.uint64(8), xa)
        x[:active] = (xa // f) * m + xa % f + cum[s]
        # The decoder reads, in this step: the last byte each lane emitted (lane order), then
        # the first byte of the lanes that emitted two (rule 3).
        first = np.where(e2, b2, b1)[e1]
        second = b1[e2]
        chunks.append(first.tobytes() + second.tobytes())
    chunks.reverse()
    return x, b"".join(chunks)


def _encode_scalar(symbols: list[int], freq: list[int], k: int, lanes: int) -> tuple[np.ndarray, bytes]:
    n = len(symbols)
    steps = -(-n // lanes)
    cum = [0] * len(freq)
    for s in range(1, len(freq)):
        cum[s] = cum[s - 1] + freq[s - 1]
    unit = (STATE_LOW >> k) << 8
    x = [STATE_LOW] * lanes
    chunks: list[bytes] = []
    for t in range(steps - 1, -1, -1):
        first = bytearray()
        second = bytearray()
        for lane in range(min(lanes, n - t * lanes)):
            s = symbols[t * lanes + lane]
            f = freq[s]
            xl = x[lane]
            x_max = unit * f
            if xl >= x_max:
                b1 = xl & 255
                xl >>= 8
                if xl >= x_max:
                    first.append(xl & 255)
                    second.append(b1)
                    xl >>= 8
                else:
                    first.append(b1)
            x[lane] = (xl // f << k) + xl % f + cum[s]
        chunks.append(bytes(first + second))
    chunks.reverse()
    return np.array(x, dtype=np.uint64), b"".join(chunks)


def decode_symbols(reader: BlobReader, count: int, alphabet: int, what: str) -> np.ndarray:
    """Read one stream from ``reader``; it must hold exactly ``count`` symbols < ``alphabet``."""
    at = reader.offset

    def bad(message: str) -> InputError:
        return InputError(
            f"corrupt {what} rANS stream: {message}",
            where=f"byte offset {at}",
            hint="the weights file is damaged; re-export it",
        )

    head = np.frombuffer(reader.take(12, f"{what} rANS header"), dtype="<u4")
    n, lanes, payload_len = (int(x) for x in head)
    alpha = int.from_bytes(reader.take(2, f"{what} rANS header"), "little")
    k, _reserved = bytes(reader.take(2, f"{what} rANS header"))
    if n != count or alpha != alphabet:
        raise bad(f"header says {n} symbols of {alpha}, record says {count} of {alphabet}")
    if lanes != (-(-n // LANE_SYMBOLS) if n else 0) or (n and k not in PROB_BITS) or (not n and k):
        raise bad(f"header has {lanes} lanes and k={k} for {n} symbols")
    freq = np.zeros(alpha, dtype=np.int64)
    for s in range(alpha):
        value = shift = 0
        while True:
            if shift > 14:  # at most 3 bytes
                raise bad("a frequency is not a varint below 2**21")
            byte = reader.take(1, f"{what} rANS frequency table")[0]
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        freq[s] = value
    states = np.frombuffer(reader.take(4 * lanes, f"{what} rANS states"), dtype="<u4").astype(np.uint64)
    payload = np.frombuffer(reader.take(payload_len, f"{what} rANS payload"), dtype=np.uint8)
    if n == 0:
        if freq.any() or payload_len:
            raise bad("an empty stream has frequencies or a payload")
        return np.zeros(0, dtype=np.uint8)
    if int(freq.sum()) != 1 << k:
        raise bad(f"frequencies sum to {int(freq.sum())}, not 2**{k}")
    if np.any(states < STATE_LOW) or np.any(states >= STATE_LOW << 8):
        raise bad("a lane state lies outside [2**23, 2**31)")
    return _decode(payload, freq, k, states, n, bad)


def _decode_scalar(payload: np.ndarray, freq: np.ndarray, k: int, x: np.ndarray, n: int, bad) -> np.ndarray:
    lanes = x.size
    m = 1 << k
    slot_sym = np.repeat(np.arange(freq.size, dtype=np.uint8), freq).tolist()
    cum = np.concatenate([[0], np.cumsum(freq)[:-1]]).tolist()
    fr = freq.tolist()
    data = payload.tobytes()
    size = len(data)
    state = x.tolist()
    out = bytearray(n)
    pos = 0
    for t in range(-(-n // lanes)):
        active = min(lanes, n - t * lanes)
        need: list[int] = []
        for lane in range(active):
            xl = state[lane]
            slot = xl & (m - 1)
            s = slot_sym[slot]
            out[t * lanes + lane] = s
            xl = fr[s] * (xl >> k) + slot - cum[s]
            state[lane] = xl
            if xl < STATE_LOW:
                need.append(lane)
        for _ in range(2):
            if not need:
                break
            if pos + len(need) > size:
                raise bad(f"payload ends inside step {t}")
            still: list[int] = []
            for lane in need:
                xl = state[lane] << 8 | data[pos]
                pos += 1
                state[lane] = xl
                if xl < STATE_LOW:
                    still.append(lane)
            need = still
    if any(v != STATE_LOW for v in state):
        raise bad("the lanes do not end at their initial state")
    if any(data[pos:]):
        raise bad("padding after the payload is not zero")
    return np.frombuffer(bytes(out), dtype=np.uint8)


def _decode(payload: np.ndarray, freq: np.ndarray, k: int, x: np.ndarray, n: int, bad) -> np.ndarray:
    lanes = x.size
    if lanes <= _SCALAR_LANES:
        return _decode_scalar(payload, freq, k, x, n, bad)
    steps = -(-n // lanes)
    m = 1 << k
    cum = np.concatenate([[0], np.cumsum(freq)[:-1]])
    slot_sym = np.repeat(np.arange(freq.size, dtype=np.uint8), freq)
    f_of = freq.astype(np.uint64)[slot_sym]  # per slot: its symbol's frequency and start
    c_of = cum.astype(np.uint64)[slot_sym]
    kk, mask, low = np.uint64(k), np.uint64(m - 1), np.uint64(STATE_LOW)
    buf = np.concatenate([payload, np.zeros(2 * lanes, dtype=np.uint8)]).astype(np.uint64)
    out = np.empty((steps, lanes), dtype=np.uint8)
    pos = 0
    for t in range(steps):
        active = lanes if t < steps - 1 else n - (steps - 1) * lanes
        xa = x[:active]
        slot = (xa & mask).astype(np.int64)
        out[t, :active] = slot_sym[slot]
        xa = f_of[slot] * (xa >> kk) + (xa & mask) - c_of[slot]
        for _ in range(2):
            need = xa < low
            k_need = int(np.count_nonzero(need))
            if not k_need:
                break
            xa[need] = (xa[need] << np.uint64(8)) | buf[pos : pos + k_need]
            pos += k_need
        if pos > payload.size:
            raise bad(f"payload ends inside step {t}")
        x[:active] = xa
    if np.any(x != low):
        raise bad("the lanes do not end at their initial state")
    if np.any(payload[pos:]):
        raise bad("padding after the payload is not zero")
    return out.ravel()[:n]
