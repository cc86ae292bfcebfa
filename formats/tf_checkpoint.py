"""TensorFlow checkpoints (tensor bundle v2: ``PREFIX.index`` + ``PREFIX.data-NNNNN-of-NNNNN``).

The format TensorFlow's ``tf.train.Checkpoint`` / ``Saver`` V2 and Swift for TensorFlow write,
read here without TensorFlow as a weight-only model (:mod:`mconv.formats.weights`).

``.index`` rules (an SSTable in LevelDB's table format, ``tensorflow/core/lib/io/table*``):

1. The last 48 bytes are the footer: the metaindex and index *block handles* (each a varint
   offset and a varint size), zero padding up to byte 40, then the magic number
   ``0xdb4775248b80fb57`` as a little-endian u64.
2. Every block is followed by a 5-byte trailer: a compression byte (0 = none, 1 = snappy,
   decoded by :func:`snappy_decompress`; TensorFlow's bundle writer does not compress) and the
   masked CRC-32C of the stored block + compression byte, which is checked.
3. A block is a run of entries ``varint shared, varint non_shared, varint value_len,
   key[non_shared], value[value_len]`` (the key shares its first ``shared`` bytes with the
   previous key), then ``u32 restart offsets[n]`` and ``u32 n``.
4. The index block maps a separator key to the handle of each data block; the data blocks hold
   the bundle's entries in key order. Data blocks lie one after another: a handle that points
   back into an earlier block (or repeats one) is refused, so no table makes more work than its
   own size.
5. Reads are bounded: a key is at most ``MAX_KEY`` bytes, and the keys a table's prefix
   compression expands to total at most ``KEY_EXPANSION`` times the file (plus 1 MiB), so a
   table of 3-byte entries that each share a long prefix cannot expand into gigabytes.

Bundle rules (``tensorflow/core/protobuf/tensor_bundle.proto``), decoded by hand from the
protobuf wire format:

1. Key ``""`` holds ``BundleHeaderProto`` (num_shards=1, endianness=2 (0 little, 1 big),
   version=3). Every other key is a tensor name holding ``BundleEntryProto`` (dtype=1,
   shape=2 (``TensorShapeProto``: dim=2 {size=1, name=2}, unknown_rank=3), shard_id=3,
   offset=4, size=5, crc32c=6 (fixed32, masked CRC-32C of the tensor bytes), slices=7).
   Every known field must come with its declared wire type (an integer where a message
   belongs, or bytes where an integer belongs, is refused naming the field); int32 fields are
   sign-extended as protobuf writes them; ``num_shards`` is 1 to 99999 and ``endianness`` 0 or 1.
2. A tensor's bytes are ``data-<shard_id>`` at ``[offset, offset + size)``; the shape must pass
   :func:`mconv.fileio.check_shape`, ``size`` must equal ``prod(shape) * itemsize`` and
   lie inside the shard file (bounded reads). Big-endian
   bundles are byte-swapped. The CRC is checked (``options["verify_crc"]``, default on).
3. String tensors (the object graph ``_CHECKPOINTABLE_OBJECT_GRAPH`` of TF2 checkpoints) are
   metadata, not weights: skipped and named in the import notes. Sliced (partitioned)
   tensors are refused, naming every one.

Keys are kept verbatim (``dense/kernel/.ATTRIBUTES/VARIABLE_VALUE`` in TF2 checkpoints).
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx_ir as ir
from mconv.errors import InputError, UnsupportedError, show
from mconv.fileio import check_shape
from mconv.formats import Format
from mconv.formats.weights import weight_only_model
from mconv.wire import WireError, iter_fields, read_varint

TABLE_MAGIC = 0xDB4775248B80FB57
FOOTER_SIZE = 48
BLOCK_TRAILER_SIZE = 5
_HINT = "the checkpoint is truncated or corrupt; re-save it"
_DATA_RE = re.compile(r"\.data-(\d{5})-of-(\d{5})$")
MAX_KEY = 1 << 16
KEY_EXPANSION = 16
MAX_SHARDS = 99_999

# TensorFlow DataType enum (types.proto) -> numpy; DT_STRING (7) is handled apart.
DT_STRING = 7
TF_DTYPES: dict[int, str] = {
    1: "float32",
    2: "float64",
    3: "int32",
    4: "uint8",
    5: "int16",
    6: "int8",
    8: "complex64",
    9: "int64",
    10: "bool",
    14: "bfloat16",
    17: "uint16",
    18: "complex128",
    19: "float16",
    22: "uint32",
    23: "uint64",
}


# --- CRC-32C (Castagnoli), as LevelDB / TensorFlow mask it ---------------------------------------


def _crc_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc_table()
_CRC_NP = np.array(_CRC_TABLE, dtype=np.uint32)


def crc32c(data: bytes | memoryview, crc: int = 0) -> int:
    """CRC-32C of ``data``. Long inputs are cut into 4,096 to 65,536 contiguous lanes whose CRC
    registers numpy advances together; the lanes are then combined with the zero-extension
    operator (the CRC is linear over GF(2)), as zlib's crc32_combine does."""
    data = memoryview(data).cast("B")
    n = len(data)
    if n < 1 << 16:
        c = crc ^ 0xFFFFFFFF
        t = _CRC_TABLE
        for b in bytes(data):
            c = t[(c ^ b) & 0xFF] ^ (c >> 8)
        return c ^ 0xFFFFFFFF
    lanes = min(max(4096, math.isqrt(n // 4)), 1 << 16)  # balances the two loops below
    lane_len = n // lanes
    head = np.frombuffer(data[: lanes * lane_len], dtype=np.uint8).reshape(lanes, lane_len)
    # Each lane's raw register (no pre/post inversion) over its own bytes. Column j touches the
    # same cache lines as column j - 1, so the strided reads stay cheap.
    reg = np.zeros(lanes, dtype=np.uint32)
    for j in range(lane_len):
        reg = _CRC_NP[(reg ^ head[:, j]) & 0xFF] ^ (reg >> 8)
    # crc(A || B) in register form: shift(reg_A, len(B)) ^ reg_B, with the initial register
    # ~crc folded into the first lane.
    c = _shift(crc ^ 0xFFFFFFFF, lane_len) ^ int(reg[0])
    shift_op = _shift_matrix(lane_len)
    for k in range(1, lanes):
        c = _apply(shift_op, c) ^ int(reg[k])
    t = _CRC_TABLE
    for b in bytes(data[lanes * lane_len :]):
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _apply(matrix: list[int], vec: int) -> int:
    out = 0
    i = 0
    while vec:
        if vec & 1:
            out ^= matrix[i]
        vec >>= 1
        i += 1
    return out


def _square(matrix: list[int]) -> list[int]:
    return [_apply(matrix, matrix[i]) for i in range(32)]


def _shift_matrix(nbytes: int) -> list[int]:
    """The GF(2) matrix that advances a raw CRC register over ``nbytes`` zero bytes."""
    one_bit = [0x82F63B78] + [1 << i for i in range(31)]  # one zero bit
    result = [1 << i for i in range(32)]  # identity
    power = _square(_square(_square(one_bit)))  # one zero byte
    while nbytes:
        if nbytes & 1:
            result = [_apply(power, result[i]) for i in range(32)]
        nbytes >>= 1
        if nbytes:
            power = _square(power)
    return result


def _shift(reg: int, nbytes: int) -> int:
    return _apply(_shift_matrix(nbytes), reg)


def mask_crc(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def unmask_crc(masked: int) -> int:
    rot = (masked - 0xA282EAD8) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


# --- varints and protobuf wire format ------------------------------------------------------------


_Truncated = WireError  # args[0] is the byte offset


def proto_fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) pairs of a protobuf message: varints as ints, fixed32/64 as ints,
    length-delimited fields as bytes."""
    return [(num, val) for num, _, val in _typed_fields(buf)]


def _typed_fields(buf: bytes) -> list[tuple[int, int, int | bytes]]:
    out: list[tuple[int, int, int | bytes]] = []
    for num, wire, _, payload, end in iter_fields(buf):
        val: int | bytes
        if wire == 0:
            val = read_varint(buf, payload)[0]
        elif wire == 1:
            (val,) = struct.unpack_from("<Q", buf, payload)
        elif wire == 2:
            val = bytes(buf[payload:end])
        else:
            (val,) = struct.unpack_from("<I", buf, payload)
        out.append((num, wire, val))
    return out


class FieldError(ValueError):
    """A known field with the wrong wire type (or out of range): ``args[0]`` says which."""


_WIRE_NAMES = {0: "an integer (varint)", 1: "8 fixed bytes", 2: "bytes/a message", 5: "4 fixed bytes"}


def _fields(buf: bytes, message: str, expected: dict[int, tuple[str, int]]) -> list[tuple[int, int | bytes]]:
    """Fields of ``message`` whose numbers ``expected`` knows, each checked for its wire type."""
    out = []
    for num, wire, val in _typed_fields(buf):
        if num not in expected:
            continue  # unknown fields are skipped, as protobuf does
        name, want = expected[num]
        if wire != want:
            raise FieldError(
                f"{message}.{name} (field {num}) is {_WIRE_NAMES.get(wire, wire)}, expected {_WIRE_NAMES[want]}"
            )
        out.append((num, val))
    return out


def _int32(v: int | bytes) -> int:
    """An int32/enum varint: negative values are written as 10-byte sign extensions. A value
    outside int32 is returned as it is, for the range checks to refuse by its own number."""
    return _int64(v)


def _int64(v: int | bytes) -> int:
    if isinstance(v, bytes):  # _fields checked the wire type: a varint is an int
        raise FieldError("an integer field holds bytes")
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def _message(v: int | bytes) -> bytes:
    """A nested message's bytes (a length-delimited field; _fields checked the wire type)."""
    if not isinstance(v, bytes):
        raise FieldError("a message field holds an integer")
    return v


_HEADER_FIELDS = {1: ("num_shards", 0), 2: ("endianness", 0), 3: ("version", 2)}
_ENTRY_FIELDS = {
    1: ("dtype", 0),
    2: ("shape", 2),
    3: ("shard_id", 0),
    4: ("offset", 0),
    5: ("size", 0),
    6: ("crc32c", 5),
    7: ("slices", 2),
}
_SHAPE_FIELDS = {2: ("dim", 2), 3: ("unknown_rank", 0)}
_DIM_FIELDS = {1: ("size", 0), 2: ("name", 2)}


@dataclass
class BundleHeader:
    """``BundleHeaderProto``: how many shards, which byte order."""

    num_shards: int = 1
    endianness: int = 0

    @classmethod
    def parse(cls, buf: bytes) -> BundleHeader:
        h = cls()
        for num, val in _fields(buf, "BundleHeaderProto", _HEADER_FIELDS):
            if num == 1:
                h.num_shards = _int32(val) or 1  # proto3 leaves 0 out; TensorFlow writes >= 1
            elif num == 2:
                h.endianness = _int32(val)
        if not 1 <= h.num_shards <= MAX_SHARDS:
            raise FieldError(f"BundleHeaderProto.num_shards is {h.num_shards}, not 1 to {MAX_SHARDS}")
        if h.endianness not in (0, 1):
            raise FieldError(f"BundleHeaderProto.endianness is {h.endianness}, not 0 (little) or 1 (big)")
        return h


@dataclass
class BundleEntry:
    """``BundleEntryProto``: where one tensor lies and what it is."""

    dtype: int = 0
    shape: list[int] = field(default_factory=list)
    unknown_rank: bool = False
    shard_id: int = 0
    offset: int = 0
    size: int = 0
    crc32c: int | None = None
    sliced: bool = False

    @classmethod
    def parse(cls, buf: bytes) -> BundleEntry:
        e = cls()
        for num, val in _fields(buf, "BundleEntryProto", _ENTRY_FIELDS):
            if num == 1:
                e.dtype = _int32(val)
            elif num == 2:
                for snum, sval in _fields(_message(val), "TensorShapeProto", _SHAPE_FIELDS):
                    if snum == 2:
                        dim = _fields(_message(sval), "TensorShapeProto.Dim", _DIM_FIELDS)
                        e.shape.append(next((_int64(v) for n, v in dim if n == 1), 0))
                    elif snum == 3:
                        e.unknown_rank = bool(sval)
            elif num == 3:
                e.shard_id = _int32(val)
            elif num == 4:
                e.offset = _int64(val)
            elif num == 5:
                e.size = _int64(val)
            elif num == 6:
                e.crc32c = int(val)
            elif num == 7:
                e.sliced = True
        return e


# --- SSTable -------------------------------------------------------------------------------------


def _block(data: bytes, handle: tuple[int, int], path: Path, what: str) -> bytes:
    offset, size = handle
    end = offset + size + BLOCK_TRAILER_SIZE
    if offset < 0 or end > len(data) - FOOTER_SIZE:
        raise InputError(
            f"{what} block [{offset}, {end}) runs past the table's {len(data)} bytes",
            path=str(path),
            where=f"byte offset {offset}",
            hint=_HINT,
        )
    contents = data[offset : offset + size]
    kind = data[offset + size]
    (stored,) = struct.unpack_from("<I", data, offset + size + 1)
    if unmask_crc(stored) != crc32c(data[offset : offset + size + 1]):
        raise InputError(
            f"{what} block checksum does not match", path=str(path), where=f"byte offset {offset}", hint=_HINT
        )
    if kind == 1:
        try:
            return snappy_decompress(contents)
        except ValueError as exc:
            raise InputError(
                f"{what} block is not valid snappy ({exc})",
                path=str(path),
                where=f"byte offset {offset}",
                hint=_HINT,
            ) from None
    if kind != 0:
        raise InputError(
            f"{what} block has unknown compression type {kind}",
            path=str(path),
            where=f"byte offset {offset}",
            hint="only uncompressed and snappy blocks exist in LevelDB tables",
        )
    return contents


def snappy_decompress(data: bytes) -> bytes:
    """Raw snappy (the block format LevelDB tables use), bounded by the declared length.

    A varint uncompressed length, then elements: literals (tag & 3 == 0; length in the tag or
    in 1-4 following bytes) and back-references (tag & 3 == 1, 2, 3: 1-, 2- or 4-byte offsets).
    """
    try:
        total, pos = read_varint(data, 0)
    except _Truncated:
        raise ValueError("truncated length") from None
    if total > 64 * max(len(data), 1):  # snappy cannot expand more than ~21x; refuse lies
        raise ValueError(f"declared length {total} is impossible for {len(data)} bytes")
    out = bytearray()
    n = len(data)
    while pos < n:
        tag = data[pos]
        pos += 1
        kind = tag & 3
        if kind == 0:
            length = (tag >> 2) + 1
            if length > 60:
                extra = length - 60
                if pos + extra > n:
                    raise ValueError("truncated literal length")
                length = int.from_bytes(data[pos : pos + extra], "little") + 1
                pos += extra
            if pos + length > n:
                raise ValueError("literal runs past the block")
            out += data[pos : pos + length]
            pos += length
            continue
        if kind == 1:
            if pos + 1 > n:
                raise ValueError("truncated copy")
            length = ((tag >> 2) & 7) + 4
            back = ((tag >> 5) << 8) | data[pos]
            pos += 1
        else:
            width = 2 if kind == 2 else 4
            if pos + width > n:
                raise ValueError("truncated copy")
            length = (tag >> 2) + 1
            back = int.from_bytes(data[pos : pos + width], "little")
            pos += width
        if back == 0 or back > len(out):
            raise ValueError(f"copy offset {back} outside the {len(out)} bytes written")
        start = len(out) - back
        if back >= length:
            out += out[start : start + length]
        else:  # overlaps its own output (run-length style): the last ``back`` bytes repeat
            out += (out[start:] * (length // back + 1))[:length]
        if len(out) > total:
            raise ValueError("output exceeds the declared length")
    if len(out) != total:
        raise ValueError(f"decoded {len(out)} bytes, declared {total}")
    return bytes(out)


class _KeyBudget:
    """Rule 5: what a table's keys may expand to, in all."""

    def __init__(self, table_size: int) -> None:
        self.left = KEY_EXPANSION * table_size + (1 << 20)


def block_entries(
    block: bytes, path: Path, where: int, budget: _KeyBudget | None = None
) -> list[tuple[bytes, bytes]]:
    """Rule 3: the (key, value) pairs of one block."""
    budget = budget or _KeyBudget(len(block))
    try:
        if len(block) < 4:
            raise _Truncated(0)
        (n_restarts,) = struct.unpack_from("<I", block, len(block) - 4)
        limit = len(block) - 4 * (n_restarts + 1)
        if limit < 0:
            raise _Truncated(len(block))
        out = []
        pos = 0
        key = b""
        while pos < limit:
            start = pos
            shared, pos = read_varint(block, pos)
            non_shared, pos = read_varint(block, pos)
            value_len, pos = read_varint(block, pos)
            if shared > len(key) or pos + non_shared + value_len > limit:
                raise _Truncated(pos)
            if shared + non_shared > MAX_KEY or shared + non_shared > budget.left:
                raise InputError(
                    f"block entry's key of {shared + non_shared} bytes exceeds what the table can hold "
                    f"(keys at most {MAX_KEY} bytes, {KEY_EXPANSION}x the file in all)",
                    path=str(path),
                    where=f"byte offset {where + start}",
                    hint=_HINT,
                )
            budget.left -= shared + non_shared
            key = key[:shared] + block[pos : pos + non_shared]
            pos += non_shared
            out.append((key, block[pos : pos + value_len]))
            pos += value_len
        return out
    except _Truncated as exc:
        raise InputError(
            "block entries are malformed",
            path=str(path),
            where=f"byte offset {where + exc.args[0]}",
            hint=_HINT,
        ) from None


def read_table(path: Path) -> list[tuple[bytes, bytes]]:
    """Every (key, value) of an SSTable file, in key order (rules 1-5)."""
    data = path.read_bytes()
    if len(data) < FOOTER_SIZE:
        raise InputError(
            f"file is {len(data)} bytes, shorter than the {FOOTER_SIZE}-byte table footer",
            path=str(path),
            where="byte offset 0",
            hint=_HINT,
        )
    foot = len(data) - FOOTER_SIZE
    (magic,) = struct.unpack_from("<Q", data, len(data) - 8)
    if magic != TABLE_MAGIC:
        raise InputError(
            f"bad table magic {magic:#018x}",
            path=str(path),
            where=f"byte offset {len(data) - 8}",
            hint="not a TensorFlow checkpoint .index file",
        )
    try:
        pos = foot
        handles = []
        for _ in range(4):
            v, pos = read_varint(data, pos)
            handles.append(v)
    except _Truncated:
        raise InputError(
            "footer block handles are malformed", path=str(path), where=f"byte offset {foot}", hint=_HINT
        ) from None
    budget = _KeyBudget(len(data))
    index = _block(data, (handles[2], handles[3]), path, "index")
    entries = []
    next_free = 0
    for _sep, handle in block_entries(index, path, handles[2], budget):
        try:
            off, p = read_varint(handle, 0)
            size, _ = read_varint(handle, p)
        except _Truncated:
            raise InputError(
                "index entry is malformed", path=str(path), where=f"byte offset {handles[2]}", hint=_HINT
            ) from None
        if off < next_free:
            raise InputError(
                f"data block at byte {off} overlaps the previous data block (which ends at byte {next_free})",
                path=str(path),
                where=f"byte offset {handles[2]}",
                hint=_HINT,
            )
        entries.extend(block_entries(_block(data, (off, size), path, "data"), path, off, budget))
        next_free = off + size + BLOCK_TRAILER_SIZE
    return entries


# --- the bundle ----------------------------------------------------------------------------------


def _paths(given: list[Path]) -> tuple[Path, str]:
    """The .index file and the checkpoint prefix from whatever files the user gave."""
    for p in given:
        if p.name.endswith(".index"):
            return p, str(p)[: -len(".index")]
    p = given[0]
    m = _DATA_RE.search(p.name)
    if m:
        prefix = str(p)[: m.start() + len(str(p)) - len(p.name)]
        index = Path(prefix + ".index")
        if index.is_file():
            return index, prefix
    raise InputError(
        "no .index file given", path=str(p), hint="give PREFIX.index (the data shards are found beside it)"
    )


def read_checkpoint(
    paths: list[Path], *, verify_crc: bool = True
) -> tuple[list[tuple[str, np.ndarray]], list[str]]:
    """Tensors of a checkpoint (memory-mapped, key order) and the names of skipped string tensors."""
    index_path, prefix = _paths(paths)
    table = read_table(index_path)
    header = next((v for k, v in table if k == b""), None)
    if header is None:
        raise InputError(
            'table has no bundle header (key "")', path=str(index_path), hint="not a tensor bundle index"
        )
    try:
        hdr = BundleHeader.parse(header)
    except (_Truncated, FieldError) as exc:
        raise InputError(
            f"bundle header is malformed ({exc})", path=str(index_path), where='key ""', hint=_HINT
        ) from None
    entries = []
    for k, v in table:
        if k == b"":
            continue
        try:
            name = k.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(
                f"tensor name '{show(k)}' is not UTF-8", path=str(index_path), hint=_HINT
            ) from None
        try:
            entries.append((name, BundleEntry.parse(v)))
        except (_Truncated, FieldError) as exc:
            raise InputError(
                f"BundleEntryProto is malformed ({exc})",
                path=str(index_path),
                where=f"tensor '{show(name)}'",
                hint=_HINT,
            ) from None
    num_shards = hdr.num_shards
    big_endian = hdr.endianness == 1
    sliced = [(show(name), "sliced tensor") for name, e in entries if e.sliced]
    if sliced:
        raise UnsupportedError(
            sliced, what="tensor", path=str(index_path), hint="save the variables unpartitioned"
        )
    shards: dict[int, np.ndarray] = {}
    arrays: list[tuple[str, np.ndarray]] = []
    skipped: list[str] = []
    for name, e in entries:
        where = f"tensor '{show(name)}'"
        if e.dtype == DT_STRING:
            skipped.append(name)
            continue
        if e.dtype not in TF_DTYPES:
            raise UnsupportedError(
                [(show(name), f"DataType {e.dtype}")],
                what="tensor dtype",
                path=str(index_path),
                hint="mconv reads the numeric TensorFlow dtypes (float, int, uint, bool, complex, bfloat16)",
            )
        if e.unknown_rank or any(d < 0 for d in e.shape):
            raise InputError(f"{where} has no full shape {e.shape}", path=str(index_path), hint=_HINT)
        if not 0 <= e.shard_id < num_shards:
            raise InputError(
                f"{where} names shard {e.shard_id} of {num_shards}", path=str(index_path), hint=_HINT
            )
        dtype = np.dtype(TF_DTYPES[e.dtype]) if e.dtype != 14 else _bfloat16()
        need = check_shape(e.shape, dtype.itemsize, what=where, path=str(index_path), where=None, hint=_HINT)
        if e.size != need:
            raise InputError(
                f"{where} holds {e.size} bytes but shape {e.shape} of {dtype} needs {need}",
                path=str(index_path),
                hint=_HINT,
            )
        shard = f"{prefix}.data-{e.shard_id:05d}-of-{num_shards:05d}"
        if e.shard_id not in shards:
            shards[e.shard_id] = _open_shard(Path(shard))
        blob = shards[e.shard_id]
        if e.offset < 0 or e.offset + e.size > blob.size:
            raise InputError(
                f"{where} bytes [{e.offset}, {e.offset + e.size}) run past the {blob.size}-byte data shard",
                path=shard,
                where=f"byte offset {e.offset}",
                hint=_HINT,
            )
        raw = blob[e.offset : e.offset + e.size]
        if verify_crc and e.crc32c is not None and crc32c(raw.data) != unmask_crc(e.crc32c):
            raise InputError(
                f"{where} checksum does not match its bytes",
                path=shard,
                where=f"byte offset {e.offset}",
                hint=_HINT,
            )
        array = raw.view(dtype).reshape(e.shape) if raw.size else np.zeros(e.shape, dtype)
        if big_endian and dtype.itemsize > 1:
            array = array.view(dtype.newbyteorder(">")).astype(dtype)
        arrays.append((name, array))
    return arrays, skipped


def _open_shard(shard: Path) -> np.ndarray:
    if not shard.is_file():
        raise InputError(
            "data shard not found", path=str(shard), hint="keep the .data-* files beside the .index"
        )
    try:
        return np.memmap(shard, dtype=np.uint8, mode="r") if shard.stat().st_size else np.zeros(0, np.uint8)
    except (OSError, ValueError) as exc:
        raise InputError(
            f"data shard cannot be read ({show(str(exc), 100)})",
            path=str(shard),
            hint="check its permissions",
        ) from None


def _bfloat16() -> np.dtype:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def _load(paths: list[Path], options: dict) -> ir.Model:
    arrays, skipped = read_checkpoint(paths, verify_crc=bool(options.get("verify_crc", True)))
    index_path, prefix = _paths(paths)
    if not arrays:
        raise InputError(
            "checkpoint holds no numeric tensors", path=str(index_path), hint="nothing to import"
        )
    model = weight_only_model(arrays, name=Path(prefix).name, path=str(index_path))
    if skipped:
        model.metadata_props["mconv.import_notes"] = (
            f"skipped string tensor(s): {', '.join(map(show, skipped))}"
        )
    return model


def _sniff(head: bytes, path: Path) -> bool:
    if path.name.endswith(".index") and path.stat().st_size >= FOOTER_SIZE:
        with open(path, "rb") as f:
            f.seek(-8, 2)
            return struct.unpack("<Q", f.read(8))[0] == TABLE_MAGIC
    return False


FORMAT = Format(
    name="tf-checkpoint",
    description="TensorFlow checkpoint v2 (PREFIX.index + PREFIX.data-*; weight-only model)",
    extensions=(".index", ".data-00000-of-00001"),
    load=_load,
    sniff=_sniff,
    max_files=2,
)
