"""A zip reader for hostile files: the central directory is checked against the real file before
anything else reads the archive, and a member is read with its size bounded.

Rules (every refusal is one :class:`mconv.errors.InputError` naming the file and the byte offset):

1. One end-of-central-directory record (ZIP64 when its fields say so) in the last 64 KiB; no
   disk numbers other than 0 (an archive spanning disks), entry counts that agree, and a
   central directory that lies inside the file, before the record.
2. Every entry: stored (0) or deflated (8), not encrypted, a name of at most ``MAX_NAME`` bytes
   that decodes (UTF-8 when flagged, else CP437) and holds no NUL, no duplicate names; its
   local header is where the entry says, carries the same name, and its data ends inside the
   file; no two members' byte ranges overlap (no zip bombs made of shared data).
3. Sizes: a stored member's sizes are equal; a deflated member expands at most
   ``MAX_DEFLATE_RATIO`` times (deflate's own limit is about 1032), and all deflated members
   together to at most ``MAX_INFLATED`` bytes. So whatever reads the archive later allocates
   no more than the file size plus that bound for any member it extracts.
4. :func:`read_member` reads one member with a byte limit checked before reading, inflates with
   ``max_length`` (never more than declared) and checks the length and the CRC-32.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from mconv.errors import InputError, show

MAX_MEMBERS = 200_000
MAX_NAME = 1024
MAX_DEFLATE_RATIO = 1100
MAX_INFLATED = 512 << 20  # all deflated members together (TorchScript code and debug tables)

_EOCD = b"PK\x05\x06"
_EOCD64 = b"PK\x06\x06"
_LOC64 = b"PK\x06\x07"
_CEN = b"PK\x01\x02"
_LOC = b"PK\x03\x04"
_HINT = "the zip archive is damaged; re-save the model"


@dataclass(frozen=True)
class ZipEntry:
    name: str
    method: int
    flags: int
    crc: int
    csize: int
    usize: int
    header_offset: int
    data_offset: int
    index: int


def looks_like_zip(head: bytes) -> bool:
    return head[:4] in (_LOC, _EOCD)


def _bad(path: Path, message: str, where: str, hint: str = _HINT) -> InputError:
    return InputError(message, path=str(path), where=where, hint=hint)


def _read_at(f, offset: int, n: int) -> bytes:
    f.seek(offset)
    return f.read(n)


def _zip64_fields(extra: bytes, want: list[str]) -> dict[str, int]:
    """The ZIP64 extended-information field (0x0001): the 8-byte values for ``want``, in order."""
    pos = 0
    while pos + 4 <= len(extra):
        tag, size = struct.unpack_from("<HH", extra, pos)
        body = extra[pos + 4 : pos + 4 + size]
        if tag == 1:
            if len(body) < 8 * len(want):
                raise ValueError("ZIP64 extra field too short")
            return {k: struct.unpack_from("<Q", body, 8 * i)[0] for i, k in enumerate(want)}
        pos += 4 + size
    raise ValueError("ZIP64 extra field missing")


def read_directory(path: Path) -> list[ZipEntry]:
    """Rules 1-3: the checked central directory of the zip archive at ``path``."""
    path = Path(path)
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        try:
            return _read_directory(f, path, size)
        except struct.error as exc:  # a record cut short: every field read is bounded by the file
            raise _bad(path, f"zip record cut short ({exc})", "zip directory") from None


def _read_directory(f, path: Path, size: int) -> list[ZipEntry]:
    if size < 22:
        raise _bad(path, f"too short for a zip archive ({size} bytes)", "whole file")
    tail_start = max(0, size - (22 + 0xFFFF))
    tail = _read_at(f, tail_start, size - tail_start)
    at = tail.rfind(_EOCD)
    # The record's comment must end the file; a signature too near the end to hold a record is not one.
    while at >= 0 and (
        at + 22 > len(tail) or at + 22 + struct.unpack_from("<H", tail, at + 20)[0] != len(tail)
    ):
        at = tail.rfind(_EOCD, 0, at)
    if at < 0:
        raise _bad(path, "no zip end-of-central-directory record", "last 64 KiB")
    eocd = tail_start + at
    where = f"zip end of central directory at byte {eocd}"
    disk, cd_disk, n_disk, n_total, cd_size, cd_offset = struct.unpack_from("<4H2L", tail, at + 4)
    zip64 = 0xFFFF in (disk, cd_disk, n_disk, n_total) or 0xFFFFFFFF in (cd_size, cd_offset)
    limit = eocd
    if zip64:
        loc = eocd - 20
        if loc < 0 or _read_at(f, loc, 4) != _LOC64:
            raise _bad(path, "ZIP64 fields without a ZIP64 locator", where)
        loc_disk, rec_offset, n_disks = struct.unpack("<LQL", _read_at(f, loc + 4, 16))
        if loc_disk != 0 or n_disks not in (0, 1):
            raise _bad(
                path, f"archive spans {n_disks} disks (ZIP64 locator), which PyTorch never writes", where
            )
        if rec_offset + 56 > loc:
            raise _bad(path, f"ZIP64 record offset {rec_offset} lies outside the file", where)
        rec = _read_at(f, rec_offset, 56)
        if rec[:4] != _EOCD64:
            raise _bad(path, f"no ZIP64 end-of-central-directory record at byte {rec_offset}", where)
        disk, cd_disk, n_disk, n_total, cd_size, cd_offset = struct.unpack_from("<2L4Q", rec, 16)
        where = f"zip64 end of central directory at byte {rec_offset}"
        limit = rec_offset
    if disk != 0 or cd_disk != 0:
        raise _bad(
            path,
            f"archive claims to span disks (disk {disk}, central directory on disk {cd_disk}); "
            "PyTorch never writes split archives",
            where,
        )
    if n_disk != n_total:
        raise _bad(path, f"entry counts disagree ({n_disk} on this disk, {n_total} in all)", where)
    if n_total > MAX_MEMBERS:
        raise _bad(path, f"{n_total} members (at most {MAX_MEMBERS})", where)
    if cd_offset + cd_size > limit or cd_size < 46 * n_total:
        raise _bad(
            path,
            f"central directory ({cd_size} bytes at byte {cd_offset}) does not fit {n_total} entries "
            f"before byte {limit}",
            where,
        )
    cd = _read_at(f, cd_offset, cd_size)
    entries: list[ZipEntry] = []
    names: set[str] = set()
    inflated = 0
    pos = 0
    for index in range(n_total):
        at_byte = cd_offset + pos
        where = f"zip entry {index} (central directory byte {at_byte})"
        if pos + 46 > len(cd) or cd[pos : pos + 4] != _CEN:
            raise _bad(path, "central directory entry is missing or truncated", where)
        # signature, versions (2), flags, method, time, date, crc, sizes, name/extra/comment lengths,
        # start disk, attributes (2), local header offset
        (_, _, _, flags, method, _, _, crc, csize, usize, n_name, n_extra, n_comment, e_disk, _, _, ho) = (
            struct.unpack_from("<4s6H3L5H2L", cd, pos)
        )
        end = pos + 46 + n_name + n_extra + n_comment
        if end > len(cd):
            raise _bad(path, "central directory entry runs past the directory", where)
        raw_name = cd[pos + 46 : pos + 46 + n_name]
        extra = cd[pos + 46 + n_name : pos + 46 + n_name + n_extra]
        pos = end
        if n_name == 0 or n_name > MAX_NAME:
            raise _bad(path, f"member name of {n_name} bytes (1 to {MAX_NAME} allowed)", where)
        try:
            name = raw_name.decode("utf-8" if flags & 0x800 else "cp437")
        except UnicodeDecodeError:
            raise _bad(path, f"member name '{show(raw_name)}' is not valid UTF-8", where) from None
        where = f"zip member '{show(name)}' (central directory byte {at_byte})"
        if "\x00" in name:
            raise _bad(path, "member name holds a NUL byte", where)
        if name in names:
            raise _bad(path, "member name appears twice", where)
        names.add(name)
        want = [k for k, v in (("usize", usize), ("csize", csize), ("ho", ho)) if v == 0xFFFFFFFF]
        if want:
            try:
                values = _zip64_fields(extra, want)
            except ValueError as exc:
                raise _bad(path, str(exc), where) from None
            usize, csize, ho = values.get("usize", usize), values.get("csize", csize), values.get("ho", ho)
        if e_disk not in (0, 0xFFFF):
            raise _bad(path, f"member starts on disk {e_disk}; PyTorch never writes split archives", where)
        if flags & 0x41:
            raise _bad(path, "member is encrypted", where)
        if method not in (0, 8):
            raise _bad(path, f"compression method {method} (only stored and deflated are read)", where)
        if method == 0 and csize != usize:
            raise _bad(path, f"stored member with sizes {csize} and {usize} that differ", where)
        if method == 8:
            if usize > MAX_DEFLATE_RATIO * csize + 64:
                raise _bad(
                    path,
                    f"deflated member claims {usize} bytes from {csize} (a ratio no deflate stream has)",
                    where,
                )
            inflated += usize
            if inflated > MAX_INFLATED:
                raise _bad(path, f"deflated members expand to more than {MAX_INFLATED} bytes", where)
        if ho + 30 > cd_offset:
            raise _bad(path, f"local header offset {ho} lies outside the archive's data", where)
        local = _read_at(f, ho, 30)
        if local[:4] != _LOC:
            raise _bad(path, f"no local header at byte {ho}", where)
        l_name, l_extra = struct.unpack_from("<HH", local, 26)
        if _read_at(f, ho + 30, l_name) != raw_name:
            raise _bad(path, f"local header at byte {ho} names a different member", where)
        data_offset = ho + 30 + l_name + l_extra
        if data_offset + csize > cd_offset:
            raise _bad(
                path,
                f"member data ({csize} bytes at byte {data_offset}) runs past the archive's data "
                f"(central directory at byte {cd_offset}, file {size} bytes)",
                where,
            )
        entries.append(ZipEntry(name, method, flags, crc, csize, usize, ho, data_offset, index))
    ranges = sorted(entries, key=lambda e: e.header_offset)
    for a, b in zip(ranges, ranges[1:]):
        if a.data_offset + a.csize > b.header_offset:
            raise _bad(
                path,
                f"members '{show(a.name)}' and '{show(b.name)}' overlap",
                f"zip local headers at bytes {a.header_offset} and {b.header_offset}",
            )
    return entries


def read_member(path: Path, entry: ZipEntry, limit: int) -> bytes:
    """Rule 4: the bytes of ``entry`` (at most ``limit``), inflated and CRC-checked."""
    where = f"zip member '{show(entry.name)}' at byte {entry.data_offset}"
    if entry.usize > limit:
        raise _bad(path, f"member of {entry.usize} bytes is larger than the {limit} allowed", where)
    with open(path, "rb") as f:
        raw = _read_at(f, entry.data_offset, entry.csize)
    if len(raw) != entry.csize:
        raise _bad(path, "member data is truncated", where)
    if entry.method == 0:
        data = raw
    else:
        inflater = zlib.decompressobj(-15)
        try:
            data = inflater.decompress(raw, entry.usize + 1)
        except zlib.error as exc:
            raise _bad(path, f"deflate stream is damaged ({exc})", where) from None
    if len(data) != entry.usize:
        raise _bad(path, f"member holds {len(data)} bytes, the directory says {entry.usize}", where)
    if zlib.crc32(data) != entry.crc:
        raise _bad(path, "member fails its CRC-32 check", where)
    return data
