"""``weights.mcw``: the weight container of a bundle.

Layout (all integers little-endian; offsets are absolute from the start of the file)::

    0   4  magic  b"MCW1"
    4   4  version  u32 (1)
    8   8  index length  u64 (bytes of the JSON index that follows)
    16  n  index  UTF-8 JSON, sorted keys, compact separators
    ..     zero padding up to the next multiple of 64
    ..     blobs, each starting at a multiple of 64, zero-padded to the next one

The index is ``{"version": 1, "tensors": [{"name", "offset", "nbytes", "sha256", "record"}, ...]}``
with the tensors in the order they were given; ``record`` is the codec record of
:mod:`mconv.codecs` (codec, params, shape, dtype, streams). ``sha256`` is over the blob bytes.

Version 2 (``write_container(..., version=2)``; a small bundle's index must not outweigh its
weights) keeps the header and replaces the JSON index with a binary one, and aligns blobs to 8 bytes::

    varint count
    per tensor: varint name length, name (UTF-8), varint nbytes, sha256 (32 raw bytes), record
    record: varint fields, then per field a word (the key) and a value
    word:   varint k; k < len(WORDS) is WORDS[k], else a literal of k - len(WORDS) UTF-8 bytes
    value:  u8 tag: 0 varint, 1 word, 2 false, 3 true, 4 varint list (varint length first),
            5 object of word -> varint (varint length first)

Varints are LEB128 (7 bits a byte, low first, at most 9 bytes, below 2**63). Offsets are not
stored: the blobs follow the index in order, each at the next multiple of ``ALIGNMENT_V2``
after the previous one (the first after the index). A tensor then costs its name, its sha256 and
a few bytes of record instead of about 250 bytes of JSON. The C decoder ``mcw_decode`` reads
every version. The metal and webgpu targets still write version 1 (their Swift and JavaScript
readers parse the JSON index).

Version 3 (a small quantized model has a hundred tensors of a few bytes each, where version 2's
names and hashes outweigh the weights)::

    varint count
    per tensor: varint shared, varint suffix length, suffix (the name is the first ``shared``
                bytes of the previous name, then the suffix), varint nbytes, u32 CRC-32 of the
                blob (zlib's), varint back, and when back = 0 a record as in version 2; back =
                k > 0 repeats the record of the tensor k places before (k <= 64)

A record leaves out ``streams`` when it is ``{"data": nbytes}`` (raw, fp16); the reader puts it
back.

Version 4 (a model of a few dozen small tensors spends more on version 3's per-tensor CRC-32s
and records than on its weights) is version 3 with two changes:

- a blob of fewer than ``SMALL_BLOB`` (16) bytes has no CRC-32 of its own; one CRC-32 over
  all such blobs, concatenated in order, ends the index (present when there is one);
- a record's field count is ``varint (fields << 1) | slim``. A slim record leaves out the
  fields the reader derives (``_derived``): ``dtype`` float32; for palettes ``groups`` 1,
  ``huffman`` false, ``codebook_dtype`` float16 and ``streams`` (the codebook is ``groups x
  codebook_size`` values of ``codebook_dtype``, the indices the rest of the blob); for raw and
  fp16 blobs ``streams`` (as version 3); for sparse blobs ``huffman`` false. The writer leaves a
  field out only when the reader's derivation gives it back exactly, and marks a record slim
  only when it left one out, so every record reads back as written. Blobs follow in order, each at the next multiple of its alignment: the element size for
raw blobs (1, 2, 4, 8), 2 for fp16, 1 for coded blobs (read byte by byte). The CRC-32 catches a
damaged blob; a bundle's manifest holds the sha256 of the whole file against tampering.

Version 5 (``LATEST``: what cpu, xla and weights bundles write; a compressed model of a few KB
still spends about 30 bytes a tensor on a version 4 index) is version 4 with two changes:

- blobs of fewer than ``SMALL_BLOB_V5`` (1,024) bytes share the index's last CRC-32 (a CRC of
  its own is under 0.4% of a larger blob);
- a record starts with a varint ``head``: 0, a version 4 record follows (field count, fields);
  1, a palette in a few bytes: shape, varint bits, varint codebook size, u8 flags (bit 0:
  ``rans``), every other field the version 4 reader derives (float32 values, one group, no
  Huffman, float16 codebook, the streams); 2, fp16 and 3, raw float32: the shape alone; ``k + 3``
  (k >= 1) repeats the record of the tensor k places before (k <= 64). A shape is a varint
  count, then each dimension. The writer uses a short form only when it reads back as the
  record it was given.

Rules:

1. The same tensors and specs give byte-identical files (no timestamps, sorted JSON keys).
2. Reads are bounded: the index length and every blob's ``offset + nbytes`` are checked
   against the real file size before anything is read; a bad file raises
   :class:`mconv.errors.InputError` naming the file and the byte offset.
3. Tensors decode lazily, one at a time, from a memory map; the blob's sha256 is checked on
   decode, or its CRC-32 from version 3 on (:class:`mconv.errors.IntegrityError` when it does not
   match).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
import tempfile
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from mconv import codecs
from mconv.codecs.choose import choose_spec, compression_hints
from mconv.errors import InputError, IntegrityError, show
from mconv.fileio import atomic_path, load_json

MAGIC = b"MCW1"
VERSION = 1
VERSIONS = (1, 2, 3, 4, 5)  # what this mconv reads
LATEST = 5  # what bundles whose readers follow (Python, mcw_decode) are written with
SMALL_BLOB = 16  # version 4: blobs shorter than this share one CRC-32 at the end of the index
SMALL_BLOB_V5 = 1024  # version 5: the same, for blobs shorter than this
_HEAD_GENERIC, _HEAD_PALETTE, _HEAD_FP16, _HEAD_RAW = 0, 1, 2, 3  # version 5 record heads; k + 3: k back
ALIGNMENT = 64
ALIGNMENT_V2 = 8
_RECORD_BACKREF = 64  # a version 3 record may repeat one of the last 64 tensors' records
# The words of a version 2 index, by number (never reorder: files name them by position).
WORDS: tuple[str, ...] = (
    "codec", "dtype", "shape", "streams", "bits", "codebook_size", "codebook_dtype", "groups",
    "huffman", "index_bits", "entries", "nonzeros", "values", "chunk", "raw", "fp16", "palette",
    "sparse", "float32", "float16", "float64", "bfloat16", "int8", "uint8", "int16", "uint16",
    "int32", "uint32", "int64", "uint64", "bool", "codebook", "indices", "gaps", "data", "symbols",
    "rans",
)  # fmt: skip
_WORD_NUMBER = {w: i for i, w in enumerate(WORDS)}
HEADER = struct.Struct("<4sIQ")  # magic, version, index length
_HINT_CORRUPT = "the weights file is truncated or corrupt; re-export the bundle"


def _pad(n: int) -> int:
    """Bytes of zero padding that bring ``n`` up to the next multiple of ``ALIGNMENT``."""
    return -n % ALIGNMENT


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def choose_codec(
    array: np.ndarray, model_metadata: Mapping[str, str] | None = None, name: str | None = None
) -> dict:
    """The codec spec export stores weight tensor ``name`` with: the hints the prune and cluster
    passes recorded for it in ``model_metadata`` (the model's ``metadata_props``), then the one
    choice of :func:`mconv.codecs.choose.choose_spec` (the smallest lossless candidate)."""
    return choose_spec(array, compression_hints(model_metadata, name))


@dataclass
class TensorEntry:
    """One tensor of the index: where its blob lies and how to decode it."""

    name: str
    offset: int
    nbytes: int
    sha256: str  # hex; "" in version 3, which keeps a CRC-32 per blob instead
    record: dict
    crc32: int | None = None
    # version 4: a small blob's CRC is its group's
    group: _SmallBlobs | None = field(default=None, repr=False, compare=False)

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "offset": self.offset,
            "nbytes": self.nbytes,
            "sha256": self.sha256,
            "record": self.record,
        }


@dataclass(eq=False)
class _SmallBlobs:
    """Version 4's blobs under ``SMALL_BLOB`` bytes and their one CRC-32 (checked once)."""

    crc32: int
    entries: list[TensorEntry]
    checked: bool = False


@dataclass
class ContainerInfo:
    """What ``write_container`` wrote: the file, its entries, and byte totals."""

    path: Path
    tensors: list[TensorEntry] = field(default_factory=list)
    total_bytes: int = 0  # size of the whole file
    blob_bytes: int = 0  # sum of blob sizes, without header, index and padding

    def entry(self, name: str) -> TensorEntry:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)


def _varint(n: int) -> bytes:
    if not 0 <= n < 1 << 63:
        raise ValueError(n)
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _word(w: str) -> bytes:
    if w in _WORD_NUMBER:
        return _varint(_WORD_NUMBER[w])
    raw = w.encode("utf-8")
    return _varint(len(WORDS) + len(raw)) + raw


def _is_uint(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 63


def _value_v2(v: object) -> bytes:
    if isinstance(v, bool):
        return bytes([3 if v else 2])
    if _is_uint(v):
        return b"\0" + _varint(int(v))  # type: ignore[call-overload]
    if isinstance(v, str):
        return b"\1" + _word(v)
    if isinstance(v, list) and all(_is_uint(x) for x in v):
        return b"\4" + _varint(len(v)) + b"".join(_varint(x) for x in v)
    if isinstance(v, dict) and all(isinstance(k, str) and _is_uint(x) for k, x in v.items()):
        return b"\5" + _varint(len(v)) + b"".join(_word(k) + _varint(x) for k, x in sorted(v.items()))
    raise ValueError(f"record value {v!r} has no version 2 form")


def _index_v2(entries: list[TensorEntry]) -> bytes:
    out = [_varint(len(entries))]
    for e in entries:
        name = e.name.encode("utf-8")
        fields = sorted(e.record.items())
        out += [_varint(len(name)), name, _varint(e.nbytes), bytes.fromhex(e.sha256), _varint(len(fields))]
        out += [_word(k) + _value_v2(v) for k, v in fields]
    return b"".join(out)


def _pad_to(n: int, alignment: int) -> int:
    return -n % alignment


def _alignment_v3(record: Mapping) -> int:
    """A version 3 blob's alignment: its element size for raw (1, 2, 4 or 8) and fp16 (2)
    blobs, which readers may view in place; 1 for coded blobs, which are read byte by byte."""
    if record.get("codec") == "fp16":
        return 2
    if record.get("codec") == "raw":
        dtype = numeric_dtype(record.get("dtype"))
        return dtype.itemsize if dtype is not None and dtype.itemsize in (1, 2, 4, 8) else 8
    return 1


def _v3_record(record: dict, nbytes: int) -> dict:
    """The record as version 3 stores it: ``streams`` left out when it is ``{"data": nbytes}``
    (raw and fp16; the reader puts it back)."""
    if record.get("streams") == {"data": nbytes}:
        return {k: v for k, v in record.items() if k != "streams"}
    return record


_CODEBOOK_DTYPES = {
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1, "int16": 2,
    "uint16": 2, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
}  # fmt: skip
_FIELD_DEFAULTS: dict[str, dict[str, object]] = {  # version 4: per codec, what a slim record may leave out
    "palette": {"groups": 1, "huffman": False, "codebook_dtype": "float16"},
    "sparse": {"huffman": False},
}


def _derived(record: Mapping, nbytes: int) -> dict:
    """The fields a version 4 reader puts back into a slim ``record`` (module docstring)."""
    out: dict[str, object] = {"dtype": "float32"}
    codec = record.get("codec")
    out.update(_FIELD_DEFAULTS.get(str(codec), {}))
    full = {**out, **record}
    if codec in ("raw", "fp16"):
        out["streams"] = {"data": nbytes}
    elif codec == "palette" and "block" not in full:
        groups, size = full.get("groups"), full.get("codebook_size")
        item = _CODEBOOK_DTYPES.get(str(full.get("codebook_dtype")))
        if isinstance(groups, int) and isinstance(size, int) and _is_uint(groups) and _is_uint(size) and item:
            book = groups * size * item
            if book <= nbytes:
                out["streams"] = {"codebook": book, "indices": nbytes - book}
    return out


def _restore_v4(record: dict, nbytes: int) -> dict:
    """A slim record with its derived fields put back."""
    return {**record, **{k: v for k, v in _derived(record, nbytes).items() if k not in record}}


def _slim_v4(record: dict, nbytes: int) -> tuple[dict, bool]:
    """``record`` without the fields the reader derives exactly, and whether any was left out."""
    slim = dict(record)
    for key in _derived(record, nbytes):
        if key in slim:
            trial = {k: v for k, v in slim.items() if k != key}
            if _restore_v4(trial, nbytes) == record:
                slim = trial
    if slim == record:
        return record, False
    return slim, True


def _small_limit(version: int) -> int:
    """Blobs shorter than this share the index's last CRC-32 (0: none do)."""
    return {4: SMALL_BLOB, 5: SMALL_BLOB_V5}.get(version, 0)


def _shape_bytes(shape: list) -> bytes:
    return _varint(len(shape)) + b"".join(_varint(d) for d in shape)


def _short_v5(record: dict, nbytes: int) -> bytes | None:
    """Version 5's short form of ``record`` (head, shape, ...), or None when it has none that
    reads back as ``record``."""
    slim, is_slim = _slim_v4(record, nbytes)
    shape = slim.get("shape")
    if not is_slim or not isinstance(shape, list) or not all(_is_uint(d) for d in shape):
        return None
    codec, keys = slim.get("codec"), set(slim)
    out = None
    if codec == "palette" and keys - {"rans"} == {"codec", "shape", "bits", "codebook_size"}:
        bits, size, rans = slim["bits"], slim["codebook_size"], slim.get("rans", True)
        if _is_uint(bits) and _is_uint(size) and rans is True:
            out = _varint(_HEAD_PALETTE) + _shape_bytes(shape) + _varint(bits) + _varint(size)
            out += bytes([1 if "rans" in slim else 0])
    elif codec in ("fp16", "raw") and keys == {"codec", "shape"}:
        out = _varint(_HEAD_FP16 if codec == "fp16" else _HEAD_RAW) + _shape_bytes(shape)
    if out is None or _restore_v4(_read_short(slim), nbytes) != record:
        return None
    return out


def _read_short(slim: dict) -> dict:
    """The slim record a short form stands for (its fields as written)."""
    out = {"codec": slim["codec"], "shape": list(slim["shape"])}
    for key in ("bits", "codebook_size", "rans"):
        if key in slim:
            out[key] = slim[key]
    return out


def _index_v3(entries: list[TensorEntry], crcs: list[int], version: int = 3) -> bytes:
    """The binary index of version 3, of version 4 (small blobs' CRC shared, slim records) or of
    version 5 (more blobs share the CRC, short records)."""
    out = [_varint(len(entries))]
    previous = b""
    recent: list[bytes] = []  # the encoded records of the last _RECORD_BACKREF tensors
    for e, crc in zip(entries, crcs):
        name = e.name.encode("utf-8")
        shared = 0
        limit = min(len(name), len(previous))
        while shared < limit and name[shared] == previous[shared]:
            shared += 1
        short = _short_v5(e.record, e.nbytes) if version == 5 else None
        if short is not None:
            body = short
        else:
            if version >= 4:
                record, slim = _slim_v4(e.record, e.nbytes)
                fields = sorted(record.items())
                count = len(fields) << 1 | slim
            else:
                fields = sorted(_v3_record(e.record, e.nbytes).items())
                count = len(fields)
            body = _varint(count) + b"".join(_word(k) + _value_v2(v) for k, v in fields)
            if version == 5:
                body = _varint(_HEAD_GENERIC) + body
        back = next((i + 1 for i, r in enumerate(reversed(recent)) if r == body), 0)
        out += [_varint(shared), _varint(len(name) - shared), name[shared:], _varint(e.nbytes)]
        if e.nbytes >= _small_limit(version) or version == 3:
            out.append(crc.to_bytes(4, "little"))
        if version == 5:
            out.append(_varint(back + _HEAD_RAW) if back else body)
        else:
            out.append(_varint(back))
            if not back:
                out.append(body)
        recent = [*recent[-(_RECORD_BACKREF - 1) :], body]
        previous = name
    return b"".join(out)


def _small_crc(blobs: list[bytes], version: int = 4) -> int:
    """Versions 4 and 5: the CRC-32 of the blobs under the version's small-blob limit,
    concatenated in order."""
    crc = 0
    for b in blobs:
        if len(b) < _small_limit(version):
            crc = zlib.crc32(b, crc)
    return crc


def write_container(
    path: str | os.PathLike, tensors: list[tuple[str, np.ndarray, dict | None]], version: int = VERSION
) -> ContainerInfo:
    """Encode ``tensors`` (name, array, codec spec) into ``path`` atomically, in the order given.

    ``version`` 2 writes the binary index (the module's docstring); a record that has no
    version 2 form (none of mconv's codecs makes one) falls back to version 1."""
    if version not in VERSIONS:
        raise InputError(f"container version {version}", hint=f"write one of {VERSIONS}")
    path = Path(path)
    seen: set[str] = set()
    blobs: list[bytes] = []
    entries: list[TensorEntry] = []
    for name, array, spec in tensors:
        if name in seen:
            raise InputError(
                f"tensor '{show(name)}' given twice", path=str(path), hint="weight names must be unique"
            )
        seen.add(name)
        blob, record = codecs.encode(np.asarray(array), spec or {"codec": "raw"})
        blobs.append(blob)
        entries.append(TensorEntry(name, 0, len(blob), hashlib.sha256(blob).hexdigest(), record))

    if version in (2, 3, 4, 5):
        try:
            if version == 2:
                index = _index_v2(entries)
            else:
                index = _index_v3(entries, [zlib.crc32(b) for b in blobs], version)
                if any(len(b) < _small_limit(version) for b in blobs):
                    index += _small_crc(blobs, version).to_bytes(4, "little")
        except ValueError:
            version = 1
    if version in (2, 3, 4, 5):
        offset = HEADER.size + len(index)
        for e, blob in zip(entries, blobs):
            offset += _pad_to(offset, ALIGNMENT_V2 if version == 2 else _alignment_v3(e.record))
            e.offset = offset
            offset += len(blob)
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            f.write(HEADER.pack(MAGIC, version, len(index)))
            f.write(index)
            for e, blob in zip(entries, blobs):
                f.write(b"\0" * (e.offset - f.tell()))
                f.write(blob)
            total = f.tell()
            os.chmod(tmp, 0o644)  # mkstemp makes it owner-only
        return ContainerInfo(
            path=path, tensors=entries, total_bytes=total, blob_bytes=sum(len(b) for b in blobs)
        )

    # Offsets depend on the index length and the index holds the offsets: iterate until the
    # index stops growing (offsets' digit counts settle in two or three rounds).
    index = b""
    while True:
        start = HEADER.size + len(index)
        offset = start + _pad(start)
        for e, blob in zip(entries, blobs):
            e.offset = offset
            offset += len(blob) + _pad(len(blob))
        new_index = _dumps({"version": VERSION, "tensors": [e.as_dict() for e in entries]})
        if len(new_index) == len(index):
            index = new_index
            break
        index = new_index

    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(HEADER.pack(MAGIC, VERSION, len(index)))
        f.write(index)
        f.write(b"\0" * _pad(HEADER.size + len(index)))
        for e, blob in zip(entries, blobs):
            assert f.tell() == e.offset
            f.write(blob)
            f.write(b"\0" * _pad(len(blob)))
        total = f.tell()
        os.chmod(tmp, 0o644)  # mkstemp makes it owner-only
    return ContainerInfo(path=path, tensors=entries, total_bytes=total, blob_bytes=sum(len(b) for b in blobs))


class Container:
    """A read-only view of a ``weights.mcw`` held in a buffer (an mmap or bytes).

    Decoding is lazy: ``array(name)`` decodes one tensor when asked.
    """

    def __init__(self, buffer: mmap.mmap | bytes, label: str, start: int = 0) -> None:
        self._buffer = buffer
        self._view = memoryview(buffer)[start:] if start else memoryview(buffer)
        self.label = label
        try:
            self.entries: dict[str, TensorEntry] = _parse_index(self._view, label)
        except BaseException:
            self._view.release()  # so that the caller can close the map
            raise

    # -- access ------------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return list(self.entries)

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def _entry(self, name: str) -> TensorEntry:
        if name not in self.entries:
            raise InputError(
                f"no tensor named '{show(name)}' in the weights container",
                path=self.label,
                hint="the bundle and the graph do not match; re-export the bundle",
            )
        return self.entries[name]

    def record(self, name: str) -> dict:
        return self._entry(name).record

    def blob(self, name: str) -> memoryview:
        e = self._entry(name)
        return self._view[e.offset : e.offset + e.nbytes]

    def array(self, name: str, *, verify: bool = True) -> np.ndarray:
        """Decode one tensor (bit-identical to what was written); check its sha256 or CRC-32 first.

        Every error names the container (``label``: the bundle's ``weights.mcw``), the tensor
        and the blob's byte offset."""
        e = self._entry(name)
        blob = self.blob(name)
        tensor = f"tensor '{show(name)}'"
        if verify and e.group is not None:
            self._check_small(e.group, tensor)
        elif verify and e.crc32 is not None:
            crc = zlib.crc32(blob)
            if crc != e.crc32:
                raise IntegrityError(
                    f"{tensor}: CRC-32 mismatch (expected {e.crc32:08x}, got {crc:08x})",
                    path=self.label,
                    where=f"byte offset {e.offset}",
                    hint="the weights file was modified or truncated; re-export the bundle",
                )
        elif verify:
            got = hashlib.sha256(blob).hexdigest()
            if got != e.sha256:
                raise IntegrityError(
                    f"{tensor}: sha256 mismatch (expected {show(e.sha256, 12)}..., got {got[:12]}...)",
                    path=self.label,
                    where=f"byte offset {e.offset}",
                    hint="the weights file was modified or truncated; re-export the bundle",
                )
        try:
            array = codecs.decode(blob, e.record)
        except InputError as exc:  # the codec's own message, placed in this file and tensor
            where = f"{tensor}, blob at byte offset {e.offset}" + (f", {exc.where}" if exc.where else "")
            raise type(exc)(
                f"{tensor}: {exc.message}", path=self.label, where=where, hint=exc.hint or _HINT_CORRUPT
            ) from None
        except MemoryError:
            raise InputError(
                f"{tensor}: shape {e.record.get('shape')} is too large to decode in memory",
                path=self.label,
                where=f"byte offset {e.offset}",
                hint=_HINT_CORRUPT,
            ) from None
        except Exception as exc:  # noqa: BLE001 - a record that does not fit its blob
            raise InputError(
                f"{tensor} cannot be decoded ({type(exc).__name__}: {str(exc)[:120]})",
                path=self.label,
                where=f"byte offset {e.offset}",
                hint=_HINT_CORRUPT,
            ) from None
        if list(array.shape) != e.record["shape"] or array.dtype != numeric_dtype(e.record["dtype"]):
            raise InputError(
                f"{tensor} decodes to {array.dtype.name}{list(array.shape)}, its record says "
                f"{show(e.record['dtype'])}{e.record['shape']}",
                path=self.label,
                where=f"byte offset {e.offset}",
                hint=_HINT_CORRUPT,
            )
        return array

    def _check_small(self, group: _SmallBlobs, tensor: str) -> None:
        """Version 4: the CRC-32 of every small blob, once a container (they are a few bytes each)."""
        if group.checked:
            return
        crc = 0
        for e in group.entries:
            crc = zlib.crc32(self._view[e.offset : e.offset + e.nbytes], crc)
        if crc != group.crc32:
            raise IntegrityError(
                f"{tensor}: the CRC-32 of the {len(group.entries)} blobs under {SMALL_BLOB} bytes "
                f"does not match (expected {group.crc32:08x}, got {crc:08x})",
                path=self.label,
                where=f"byte offset {group.entries[0].offset}",
                hint="the weights file was modified or truncated; re-export the bundle",
            )
        group.checked = True

    def items(self) -> Iterator[tuple[str, np.ndarray]]:
        for name in self.entries:
            yield name, self.array(name)

    # -- lifetime ----------------------------------------------------------------------------
    def close(self) -> None:
        # Blob views handed out keep the map alive; then the garbage collector closes it later.
        try:
            self._view.release()
            if isinstance(self._buffer, mmap.mmap):
                self._buffer.close()
        except BufferError:
            pass

    def __enter__(self) -> Container:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _parse_index(view: memoryview, label: str) -> dict[str, TensorEntry]:
    size = len(view)
    if size < HEADER.size:
        raise InputError(
            f"file is {size} bytes, shorter than the {HEADER.size}-byte header",
            path=label,
            where="byte offset 0",
            hint=_HINT_CORRUPT,
        )
    magic, version, index_len = HEADER.unpack_from(view, 0)
    if magic != MAGIC:
        raise InputError(
            f"bad magic {bytes(magic)!r}, expected {MAGIC!r}",
            path=label,
            where="byte offset 0",
            hint="this is not an mconv weights.mcw file",
        )
    if version not in VERSIONS:
        raise InputError(
            f"container version {version} is not supported (this mconv reads versions 1 to 5)",
            path=label,
            where="byte offset 4",
            hint="upgrade mconv or re-export the bundle",
        )
    if index_len > size - HEADER.size:
        raise InputError(
            f"index length {index_len} runs past the end of the {size}-byte file",
            path=label,
            where=f"byte offset 8 (index ends at {HEADER.size + index_len})",
            hint=_HINT_CORRUPT,
        )
    where_index = f"byte offset {HEADER.size} (index)"
    if version == 2:
        return _parse_index_v2(view, label, index_len)
    if version in (3, 4, 5):
        return _parse_index_v3(view, label, index_len, version)

    def bad(what: str, where: str = where_index) -> InputError:
        return InputError(what, path=label, where=where, hint=_HINT_CORRUPT)

    index = load_json(
        bytes(view[HEADER.size : HEADER.size + index_len]), "index", label, _HINT_CORRUPT, where_index
    )
    if not isinstance(index, dict) or not isinstance(index.get("tensors"), list):
        raise bad("index is not an object with a 'tensors' list")
    data_start = HEADER.size + index_len
    out: dict[str, TensorEntry] = {}
    for i, t in enumerate(index["tensors"]):
        if not isinstance(t, dict):
            raise bad(f"index entry {i} is {_kind(t)}, expected an object")
        name = t.get("name")
        if not isinstance(name, str):
            raise bad(f"index entry {i}: 'name' is {_kind(name)}, expected a string")
        tensor = f"tensor '{show(name)}'"
        for key in ("offset", "nbytes"):
            if not _is_count(t.get(key)):
                raise bad(f"{tensor}: '{key}' is {_kind(t.get(key))}, expected a non-negative integer")
        sha = t.get("sha256", "")
        if not isinstance(sha, str):
            raise bad(f"{tensor}: 'sha256' is {_kind(sha)}, expected a string")
        record = t.get("record")
        if not isinstance(record, dict):
            raise bad(f"{tensor}: 'record' is {_kind(record)}, expected an object")
        e = TensorEntry(name, t["offset"], t["nbytes"], sha, record)
        if e.offset < data_start or e.offset + e.nbytes > size:
            raise InputError(
                f"{tensor} blob [{e.offset}, {e.offset + e.nbytes}) lies outside the data "
                f"area [{data_start}, {size})",
                path=label,
                where=f"byte offset {e.offset}",
                hint=_HINT_CORRUPT,
            )
        _check_record(record, tensor, bad)
        if name in out:
            raise bad(f"{tensor} listed twice")
        out[name] = e
    return out


class _V2Reader:
    """Bounded reads of a version 2 index: every length is checked against what is left."""

    def __init__(self, view: memoryview, start: int, end: int, label: str) -> None:
        self.view, self.at, self.end, self.label = view, start, end, label

    def bad(self, what: str, at: int | None = None) -> InputError:
        return InputError(
            f"index: {what}", path=self.label, where=f"byte offset {self.at if at is None else at}",
            hint=_HINT_CORRUPT,
        )  # fmt: skip

    def take(self, n: int, what: str) -> bytes:
        if n > self.end - self.at:
            raise self.bad(f"{what} needs {n} bytes, {self.end - self.at} left in the index")
        out = bytes(self.view[self.at : self.at + n])
        self.at += n
        return out

    def varint(self, what: str) -> int:
        value = shift = 0
        start = self.at
        while True:
            if self.at >= self.end:
                raise self.bad(f"{what} runs past the end of the index", start)
            byte = self.view[self.at]
            self.at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
            if shift >= 63:
                raise self.bad(f"{what} is not a varint below 2**63", start)
        if value >= 1 << 63:
            raise self.bad(f"{what} is not a varint below 2**63", start)
        return value

    def text(self, n: int, what: str) -> str:
        start = self.at
        try:
            return self.take(n, what).decode("utf-8")
        except UnicodeDecodeError:
            raise self.bad(f"{what} is not UTF-8", start) from None

    def word(self, what: str) -> str:
        k = self.varint(what)
        return WORDS[k] if k < len(WORDS) else self.text(k - len(WORDS), what)

    def value(self, key: str) -> object:
        start = self.at
        tag = self.take(1, f"'{show(key)}' tag")[0]
        if tag == 0:
            return self.varint(f"'{show(key)}'")
        if tag == 1:
            return self.word(f"'{show(key)}'")
        if tag in (2, 3):
            return tag == 3
        if tag in (4, 5):
            n = self.varint(f"'{show(key)}' length")
            if n > self.end - self.at:  # every item takes a byte at least
                raise self.bad(f"'{show(key)}' claims {n} items, more than the index holds", start)
            if tag == 4:
                return [self.varint(f"'{show(key)}' item") for _ in range(n)]
            out: dict[str, int] = {}
            for _ in range(n):
                k = self.word(f"'{show(key)}' key")
                if k in out:
                    raise self.bad(f"'{show(key)}' lists '{show(k)}' twice", start)
                out[k] = self.varint(f"'{show(key)}.{show(k)}'")
            return out
        raise self.bad(f"'{show(key)}' has unknown value tag {tag}", start)


def _parse_index_v2(view: memoryview, label: str, index_len: int) -> dict[str, TensorEntry]:
    r = _V2Reader(view, HEADER.size, HEADER.size + index_len, label)
    count = r.varint("tensor count")
    if count > index_len:  # every tensor takes 35 bytes at least
        raise r.bad(f"tensor count {count} is more than the index can hold", HEADER.size)
    size = len(view)
    offset = HEADER.size + index_len
    out: dict[str, TensorEntry] = {}
    for i in range(count):
        start = r.at
        name = r.text(r.varint(f"entry {i} name length"), f"entry {i} name")
        tensor = f"tensor '{show(name)}'"
        nbytes = r.varint(f"{tensor} nbytes")
        sha = r.take(32, f"{tensor} sha256").hex()
        record: dict[str, object] = {}
        fields = r.varint(f"{tensor} record fields")
        if fields > r.end - r.at:
            raise r.bad(f"{tensor} claims {fields} record fields, more than the index holds", start)
        for _ in range(fields):
            key = r.word(f"{tensor} record key")
            if key in record:
                raise r.bad(f"{tensor} record lists '{show(key)}' twice", start)
            record[key] = r.value(key)
        offset += _pad_to(offset, ALIGNMENT_V2)
        if nbytes > size - offset:
            raise InputError(
                f"{tensor} blob [{offset}, {offset + nbytes}) runs past the end of the {size}-byte file",
                path=label,
                where=f"byte offset {offset}",
                hint=_HINT_CORRUPT,
            )
        _check_record(record, tensor, lambda what, at=start: r.bad(what, at))
        if name in out:
            raise r.bad(f"{tensor} listed twice", start)
        out[name] = TensorEntry(name, offset, nbytes, sha, record)
        offset += nbytes
    if r.at != r.end:
        raise r.bad(f"{r.end - r.at} bytes after the last entry")
    return out


def _parse_index_v3(view: memoryview, label: str, index_len: int, version: int = 3) -> dict[str, TensorEntry]:
    r = _V2Reader(view, HEADER.size, HEADER.size + index_len, label)
    small: list[TensorEntry] = []  # version 4: the blobs that share the index's last CRC-32
    count = r.varint("tensor count")
    if count > index_len:  # every tensor takes 8 bytes at least
        raise r.bad(f"tensor count {count} is more than the index can hold", HEADER.size)
    size = len(view)
    offset = HEADER.size + index_len
    out: dict[str, TensorEntry] = {}
    previous = b""
    recent: list[tuple[dict[str, object], bool]] = []  # the last records read, and whether slim
    for i in range(count):
        start = r.at
        shared = r.varint(f"entry {i} shared name prefix")
        if shared > len(previous):
            raise r.bad(f"entry {i} shares {shared} bytes of a {len(previous)}-byte previous name", start)
        suffix = r.take(r.varint(f"entry {i} name length"), f"entry {i} name")
        raw_name = previous[:shared] + suffix
        try:
            name = raw_name.decode("utf-8")
        except UnicodeDecodeError:
            raise r.bad(f"entry {i} name is not UTF-8", start) from None
        tensor = f"tensor '{show(name)}'"
        nbytes = r.varint(f"{tensor} nbytes")
        crc: int | None = None
        if version == 3 or nbytes >= _small_limit(version):
            crc = int.from_bytes(r.take(4, f"{tensor} crc32"), "little")
        head = _HEAD_GENERIC
        if version == 5:
            head = r.varint(f"{tensor} record head")
            back = head - _HEAD_RAW if head > _HEAD_RAW else 0
        else:
            back = r.varint(f"{tensor} record reference")
        record: dict[str, object]
        slim = False
        if back:
            if back > len(recent):
                raise r.bad(f"{tensor} repeats the record {back} tensors back, of {len(recent)}", start)
            shared_record, slim = recent[-back]
            record = json.loads(json.dumps(shared_record))  # a copy: records are mutable dicts
        elif head != _HEAD_GENERIC:  # version 5's short forms
            ndim = r.varint(f"{tensor} shape length")
            if ndim > r.end - r.at:
                raise r.bad(f"{tensor} claims {ndim} dimensions, more than the index holds", start)
            shape = [r.varint(f"{tensor} dimension {d}") for d in range(ndim)]
            codec = {_HEAD_PALETTE: "palette", _HEAD_FP16: "fp16", _HEAD_RAW: "raw"}[head]
            record, slim = {"codec": codec, "shape": shape}, True
            if head == _HEAD_PALETTE:
                record["bits"] = r.varint(f"{tensor} bits")
                record["codebook_size"] = r.varint(f"{tensor} codebook size")
                flags = r.take(1, f"{tensor} palette flags")[0]
                if flags & ~1:
                    raise r.bad(f"{tensor} palette flags {flags:#04x} name no known option", start)
                if flags & 1:
                    record["rans"] = True
        else:
            record = {}
            fields = r.varint(f"{tensor} record fields")
            if version >= 4:
                fields, slim = fields >> 1, bool(fields & 1)
            if fields > r.end - r.at:
                raise r.bad(f"{tensor} claims {fields} record fields, more than the index holds", start)
            for _ in range(fields):
                key = r.word(f"{tensor} record key")
                if key in record:
                    raise r.bad(f"{tensor} record lists '{show(key)}' twice", start)
                record[key] = r.value(key)
        recent = [*recent[-(_RECORD_BACKREF - 1) :], (json.loads(json.dumps(record)), slim)]
        full = _restore_v4(record, nbytes) if slim else dict(record)
        full.setdefault("streams", {"data": nbytes})
        _check_record(full, tensor, lambda what, at=start: r.bad(what, at))
        offset += _pad_to(offset, _alignment_v3(full))
        if nbytes > size - offset:
            raise InputError(
                f"{tensor} blob [{offset}, {offset + nbytes}) runs past the end of the {size}-byte file",
                path=label,
                where=f"byte offset {offset}",
                hint=_HINT_CORRUPT,
            )
        if name in out:
            raise r.bad(f"{tensor} listed twice", start)
        out[name] = TensorEntry(name, offset, nbytes, "", full, crc32=crc)
        if crc is None:
            small.append(out[name])
        offset += nbytes
        previous = raw_name
    if small:  # version 4: the small blobs' CRC-32, checked on the first decode of one of them
        group = _SmallBlobs(int.from_bytes(r.take(4, "small blobs' crc32"), "little"), small)
        for e in small:
            e.group = group
    if r.at != r.end:
        raise r.bad(f"{r.end - r.at} bytes after the last entry")
    return out


_MAX_ELEMENTS = 1 << 62


def _kind(v: object) -> str:
    if v is None:
        return "null"
    kinds = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }
    return kinds.get(type(v), type(v).__name__)


def _is_count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < (1 << 63)


def numeric_dtype(name: object) -> np.dtype | None:
    """The numpy dtype a record names when it is a plain numeric one (bool, ints, floats,
    complex, and ml_dtypes' bfloat16), else None (object, strings, void/structured, datetimes, unknown names)."""
    if not isinstance(name, str) or len(name) > 32:
        return None
    if name == "bfloat16":  # ml_dtypes' (kind "V"): safetensors checkpoints of LLMs hold it
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    try:
        dtype = np.dtype(name)
    except Exception:  # noqa: BLE001 - numpy raises TypeError, ValueError, SyntaxError, ...
        return None
    if (
        dtype.kind not in "biufc"
        or dtype.fields is not None
        or dtype.subdtype is not None
        or dtype.itemsize == 0
    ):
        return None
    return dtype


def _check_record(record: dict, tensor: str, bad) -> None:
    """Every field a decoder reads has the right type (rule 2): codec, shape, dtype, streams."""
    for key in ("codec", "shape", "dtype"):
        if key not in record:
            raise bad(f"{tensor} record lacks '{key}'")
    if not isinstance(record["codec"], str):
        raise bad(f"{tensor}: codec is {_kind(record['codec'])}, expected a string")
    if record["codec"] not in codecs.CODECS:
        raise bad(
            f"{tensor}: unknown codec '{show(record['codec'])}'",
        )
    shape = record["shape"]
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise bad(f"{tensor}: shape {show(json.dumps(shape), 40)} is not a list of non-negative integers")
    elements = 1
    for d in shape:
        elements *= d
    if elements > _MAX_ELEMENTS:
        raise bad(f"{tensor}: shape {show(json.dumps(shape), 40)} has more than 2**62 elements")
    if numeric_dtype(record["dtype"]) is None:
        raise bad(f"{tensor}: dtype '{show(record['dtype'])}' is not a numeric dtype")
    streams = record.get("streams", {})
    if not isinstance(streams, dict) or not all(_is_count(n) for n in streams.values()):
        raise bad(f"{tensor}: 'streams' is not an object of byte counts")


def read_container(path: str | os.PathLike) -> Container:
    """Open ``path`` as a memory-mapped container (validated header and index, lazy tensors)."""
    p = Path(path)
    if not p.is_file():
        raise InputError("weights container not found", path=str(p), hint="check the bundle path")
    with open(p, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            raise InputError(
                "file is 0 bytes, shorter than the 16-byte header",
                path=str(p),
                where="byte offset 0",
                hint=_HINT_CORRUPT,
            )
        buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return Container(buffer, str(p))
    except BaseException:
        buffer.close()
        raise


# A weights container is coded blobs: it deflates little. One that inflates more than this many
# times its stored size (and past ZIP_RATIO_FLOOR bytes) is refused before inflating.
ZIP_RATIO = 100
ZIP_RATIO_FLOOR = 64 << 20
_INFLATE_CHUNK = 1 << 20


def check_zip_ratio(info: zipfile.ZipInfo, label: str, where: str) -> None:
    """Refuse a zip member that inflates past ``ZIP_RATIO`` times its stored size (a zip bomb)."""
    if info.file_size > ZIP_RATIO_FLOOR and info.file_size > ZIP_RATIO * max(info.compress_size, 1):
        raise InputError(
            f"{where} inflates from {info.compress_size} to {info.file_size} bytes "
            f"(more than {ZIP_RATIO} times)",
            path=label,
            where=where,
            hint="a bundle's files compress little; zip the bundle with mconv (weights.mcw stored)",
        )


def container_from_zip(zip_path: str | os.PathLike, member: str, declared: int, label: str) -> Container:
    """The container ``member`` of the zip ``zip_path``, of ``declared`` bytes (the manifest's
    size), never whole in memory: memory-mapped in place when stored uncompressed (as mconv
    zips it), else inflated in chunks into an unnamed temporary file, stopping at the declared
    size. A member larger than declared, or that inflates past :data:`ZIP_RATIO`, is refused."""
    zip_path = Path(zip_path)
    with zipfile.ZipFile(zip_path) as zf:
        info = zf.getinfo(member)
        if info.file_size != declared:
            raise InputError(
                f"weights container is {info.file_size} bytes, the manifest says {declared}",
                path=label,
                hint="the bundle was modified or truncated; re-export it",
            )
        check_zip_ratio(info, str(zip_path), member)
        if info.compress_type == zipfile.ZIP_STORED and info.compress_size == info.file_size and declared:
            with open(zip_path, "rb") as f:
                f.seek(info.header_offset)
                head = f.read(30)
            if len(head) == 30 and head[:4] == b"PK\x03\x04":
                name_len, extra_len = struct.unpack_from("<HH", head, 26)
                return read_container_at(
                    zip_path, info.header_offset + 30 + name_len + extra_len, declared, label
                )
        tmp = tempfile.TemporaryFile()
        try:
            left = declared
            with zf.open(info) as src:
                while chunk := src.read(min(_INFLATE_CHUNK, left + 1)):
                    left -= len(chunk)
                    if left < 0:
                        raise InputError(
                            f"weights container inflates past its declared {declared} bytes",
                            path=label,
                            hint="the bundle was modified or truncated; re-export it",
                        )
                    tmp.write(chunk)
            tmp.flush()
            if declared == 0 or left:
                raise InputError(
                    f"weights container holds {declared - left} of its {declared} bytes",
                    path=label,
                    hint="the bundle was modified or truncated; re-export it",
                )
            buffer = mmap.mmap(tmp.fileno(), 0, access=mmap.ACCESS_READ)
        finally:
            tmp.close()  # unnamed: its blocks are freed when the map is closed
    try:
        return Container(buffer, label)
    except BaseException:
        buffer.close()
        raise


def read_container_at(path: str | os.PathLike, offset: int, length: int, label: str) -> Container:
    """The container held in bytes ``offset .. offset + length`` of ``path``, memory-mapped."""
    base = offset - offset % mmap.ALLOCATIONGRANULARITY
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if length <= 0 or offset + length > size:
            raise InputError(
                f"weights container of {length} bytes at offset {offset} runs past the file's {size}",
                path=label,
                hint=_HINT_CORRUPT,
            )
        buffer = mmap.mmap(f.fileno(), offset - base + length, access=mmap.ACCESS_READ, offset=base)
    try:
        return Container(buffer, label, start=offset - base)
    except BaseException:
        buffer.close()
        raise


def container_from_bytes(data: bytes, label: str) -> Container:
    """A container held in memory (a bundle read from a .zip); ``label`` names it in errors."""
    return Container(bytes(data), label)
