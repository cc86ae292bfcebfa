"""The protobuf wire format, read and written by hand where a parsed message would cost too much.

Rules:
1. A field is a varint key (``number << 3 | wire type``) then its payload: wire type 0 a varint,
   1 eight bytes, 2 a varint length and that many bytes, 5 four bytes. Groups (3, 4) are not
   read: no format mconv reads this way uses them.
2. Reading past the end of the buffer, or of the enclosing message, raises :class:`WireError`
   with the byte offset where the read went wrong (``args[0]``), for callers to name in their
   one-line errors.

Used by ``mconv.irio`` (the lazy ONNX loader walks ModelProto -> GraphProto -> TensorProto without
parsing the weights) and ``mconv.formats.tf_checkpoint`` (bundle headers and LevelDB varints).
"""

from __future__ import annotations

from collections.abc import Iterator


class WireError(ValueError):
    """Truncated or malformed wire data; ``args[0]`` is the byte offset."""

    def __init__(self, offset: int, reason: str = "truncated or malformed protobuf data") -> None:
        super().__init__(offset)
        self.offset = offset
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.reason} at byte {self.offset}"


def read_varint(buf, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it."""
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise WireError(pos, "truncated or overlong varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def encode_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if not n:
            out.append(b)
            return bytes(out)
        out.append(b | 0x80)


def length_delimited(number: int, payload: bytes) -> bytes:
    """One wire-type-2 field: key, length, payload."""
    return encode_varint(number << 3 | 2) + encode_varint(len(payload)) + payload


def iter_fields(buf, start: int = 0, end: int | None = None) -> Iterator[tuple[int, int, int, int, int]]:
    """``(number, wire type, field start, payload start, payload end)`` of each field of the
    message in ``buf[start:end]``. For a varint field the payload is the varint itself."""
    end = len(buf) if end is None else end
    pos = start
    while pos < end:
        field_start = pos
        key, pos = read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        payload = pos
        if wire == 0:
            _, pos = read_varint(buf, pos)
        elif wire == 1:
            pos += 8
        elif wire == 2:
            length, payload = read_varint(buf, pos)
            pos = payload + length
        elif wire == 5:
            pos += 4
        else:
            raise WireError(field_start, f"unsupported wire type {wire}")
        if pos > end:
            raise WireError(field_start, f"field {number} runs past its message's end ({end})")
        yield number, wire, field_start, payload, pos
