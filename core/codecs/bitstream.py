"""Fixed-width bit packing and bounded blob reading, shared by the codecs.

Rules:
1. ``pack_bits(values, bits)`` stores each value in exactly ``bits`` bits, LSB-first: value ``i``
   occupies stream bits ``i*bits .. i*bits+bits-1`` and stream bit ``k`` is bit ``k % 8`` of byte
   ``k // 8``. The last byte is zero-padded. ``ceil(n*bits/8)`` bytes in all.
2. ``unpack_bits`` is its exact inverse and refuses a buffer of the wrong length.
3. ``BlobReader.take`` hands out consecutive sections of a blob and raises ``InputError`` naming
   the byte offset and the section when the blob is shorter than its record says; ``finish``
   refuses trailing bytes. No codec indexes a blob past its end.
"""

from __future__ import annotations

import numpy as np
from mconv.errors import InputError

# Elements per chunk when packing, so a 38M-element tensor never materialises 38M*8 bits at once.
_PACK_CHUNK = 1 << 20  # a multiple of 8, so every chunk starts on a byte boundary


def packed_nbytes(count: int, bits: int) -> int:
    return (count * bits + 7) // 8


def pack_bits(values: np.ndarray, bits: int) -> bytes:
    """Pack unsigned ints (each < 2**bits, 1 <= bits <= 8) LSB-first at ``bits`` bits each."""
    values = np.ascontiguousarray(values, dtype=np.uint8).ravel()
    if bits == 8:
        return values.tobytes()
    shifts = np.arange(bits, dtype=np.uint8)
    parts = []
    for start in range(0, values.size, _PACK_CHUNK):
        chunk = values[start : start + _PACK_CHUNK]
        plane = (chunk[:, None] >> shifts) & 1  # (n, bits), least significant bit first
        parts.append(np.packbits(plane.ravel(), bitorder="little"))
    # Chunks hold a multiple of 8 values, hence a whole number of bytes, except the last one.
    return b"".join(p.tobytes() for p in parts)


def unpack_bits(buf: bytes | memoryview | np.ndarray, bits: int, count: int) -> np.ndarray:
    """Inverse of ``pack_bits``: ``count`` values of ``bits`` bits each, as uint8."""
    raw = np.frombuffer(buf, dtype=np.uint8)
    if raw.size != packed_nbytes(count, bits):
        raise InputError(
            f"packed {bits}-bit stream holds {raw.size} bytes, expected {packed_nbytes(count, bits)}",
            hint="the blob is truncated or its record does not belong to it",
        )
    if bits == 8:
        return raw.copy()
    weights = (1 << np.arange(bits, dtype=np.uint8)).astype(np.uint8)
    out = np.empty(count, dtype=np.uint8)
    step = _PACK_CHUNK
    for start in range(0, count, step):
        n = min(step, count - start)
        lo = start * bits // 8
        plane = np.unpackbits(raw[lo : lo + packed_nbytes(n, bits)], bitorder="little", count=n * bits)
        out[start : start + n] = plane.reshape(n, bits) @ weights
    return out


class BlobReader:
    """Consecutive, bounds-checked sections of one codec blob."""

    def __init__(self, blob: bytes | memoryview, codec: str) -> None:
        self.blob = memoryview(blob).cast("B") if not isinstance(blob, bytes) else memoryview(blob)
        self.codec = codec
        self.offset = 0

    def take(self, nbytes: int, what: str) -> memoryview:
        if nbytes < 0 or self.offset + nbytes > len(self.blob):
            raise InputError(
                f"{self.codec} blob truncated: {what} needs {nbytes} bytes, "
                f"{len(self.blob) - self.offset} left",
                where=f"byte offset {self.offset}",
                hint="the weights file is damaged or was cut short; re-export it",
            )
        part = self.blob[self.offset : self.offset + nbytes]
        self.offset += nbytes
        return part

    def u32(self, what: str) -> int:
        return int.from_bytes(self.take(4, what), "little")

    def finish(self) -> None:
        if self.offset != len(self.blob):
            raise InputError(
                f"{self.codec} blob has {len(self.blob) - self.offset} unexpected trailing bytes",
                where=f"byte offset {self.offset}",
                hint="the record does not match the blob; the weights file may be damaged",
            )
