"""Bounded reading of NumPy ``.npz`` archives and ``.npy`` files (model files and user data).

``mconv.formats.npz_format`` (weight-only models) and ``--data``/``--input`` files read through it.

Rules:

1. An ``.npz`` is a zip of ``.npy`` members; each member ``NAME.npy`` becomes the initializer
   ``NAME`` (archive order). Nothing is unpickled: object arrays are refused, and only numeric
   dtypes (bool, integers, float16/32/64, complex64/128) are read.
2. The zip directory is checked against the real file before any member is opened: one disk
   only (the end record's and each entry's disk numbers are 0), no encrypted entry, stored or
   deflated members only (numpy writes nothing else; bzip2/lzma inflate unbounded chunks), no
   name that is absolute, holds a ``..`` part or a NUL, or is given twice, and every member's
   data lies inside the file before the central directory without overlapping another's.
3. Sizes are bounded before inflating: a stored member's sizes agree, and a deflated member
   inflates to at most ``max(RATIO_FLOOR, MAX_RATIO * compressed size)`` bytes (deflate itself
   tops out near 1032x, reached only by runs of one byte), as do all members together against
   the file size. Each member's ``.npy`` header (magic, version, dtype, shape) is then parsed and
   ``prod(shape) * itemsize`` must equal the member's declared size less the header.
4. Data is read in 1 MiB chunks into an array of exactly that size; the reader stops at the
   declared size whatever the deflate stream holds, and a stream that ends early or fails its
   CRC is refused. Every violation is one :class:`mconv.errors.InputError` naming the file, the
   member and (for the directory) the byte offset.

Writing (:func:`write_npz`): numpy.savez's archive, for any array names.
"""

from __future__ import annotations

import re
import struct
import tokenize
import zipfile
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

import numpy as np
from mconv.errors import InputError, show
from mconv.fileio import check_shape

_HINT = "the archive is truncated or corrupt; re-save it with numpy.savez"
MAX_RATIO = 1000
RATIO_FLOOR = 1 << 20
_CHUNK = 1 << 20
_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # zipfile's structFileHeader, 30 bytes
_END_RECORD = struct.Struct("<4s4H2LH")  # end of central directory, 22 bytes
# Numeric dtypes onnx_ir holds, by kind and item size.
_NUMERIC = {"b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16"}
_DRIVE = re.compile(r"^[A-Za-z]:")


# zipfile raises these for damaged archives (ValueError covers UnicodeDecodeError, struct.error is
# its own class, NotImplementedError an unknown zip version, RuntimeError a password question).
_ZIP_ERRORS = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    ValueError,
    OSError,
    EOFError,
    NotImplementedError,
    RuntimeError,
    struct.error,
    zlib.error,
    KeyError,
    IndexError,
    OverflowError,
)


def _refuse(message: str, path: Path, where: str | None = None, hint: str = _HINT) -> InputError:
    return InputError(message, path=str(path), where=where, hint=hint)


def _end_record(path: Path, size: int) -> None:
    """Rule 2: the end-of-central-directory record claims a single disk."""
    with open(path, "rb") as f:
        tail_len = min(size, _END_RECORD.size + 0xFFFF)
        f.seek(size - tail_len)
        tail = f.read(tail_len)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or at + _END_RECORD.size > len(tail):
        return  # zipfile says "not a zip file" with its own words
    _, disk, cd_disk, here, total, _, _, _ = _END_RECORD.unpack_from(tail, at)
    if (disk, cd_disk) not in ((0, 0), (0xFFFF, 0xFFFF)) or here != total:
        raise _refuse(
            f"the archive claims to span several disks (disk {disk}, directory on disk {cd_disk}, "
            f"{here} of {total} entries here)",
            path,
            where=f"byte offset {size - tail_len + at}",
            hint="join a split archive into one file first (numpy writes single-file archives)",
        )


def _check_directory(zf: zipfile.ZipFile, path: Path, size: int) -> list[zipfile.ZipInfo]:
    """Rules 2 and 3 from the central directory and the local headers, before any inflating."""
    infos = zf.infolist()
    seen: set[str] = set()
    spans = []
    total = 0
    for info in infos:
        name = info.filename
        where = f"member '{show(name)}' (directory entry at byte offset {info.header_offset})"
        parts = re.split(r"[/\\]", name)
        if name.startswith(("/", "\\")) or _DRIVE.match(name) or ".." in parts or "\0" in name:
            raise _refuse(
                "member name is absolute, climbs out of the archive ('..') or holds a NUL",
                path,
                where=where,
                hint="numpy names members after the arrays; re-save with numpy.savez",
            )
        if name in seen:
            raise _refuse("member name appears twice in the archive", path, where=where)
        seen.add(name)
        if info.flag_bits & 0x41:  # bit 0: encrypted, bit 6: strong encryption
            raise _refuse(
                "member is encrypted",
                path,
                where=where,
                hint="mconv reads unencrypted archives only; re-save with numpy.savez",
            )
        if info.volume != 0:
            raise _refuse(
                f"member claims to start on disk {info.volume}",
                path,
                where=where,
                hint="join a split archive into one file first (numpy writes single-file archives)",
            )
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise _refuse(
                f"member uses compression method {info.compress_type}",
                path,
                where=where,
                hint="numpy writes stored or deflated members only; re-save with numpy.savez",
            )
        if info.compress_type == zipfile.ZIP_STORED and info.compress_size != info.file_size:
            raise _refuse(
                f"stored member claims {info.compress_size} bytes stored but {info.file_size} bytes of data",
                path,
                where=where,
            )
        limit = max(RATIO_FLOOR, MAX_RATIO * info.compress_size)
        if info.file_size > limit:
            raise _refuse(
                f"member claims to inflate {info.compress_size} bytes to {info.file_size} "
                f"(more than {MAX_RATIO}x): a decompression bomb or a corrupt directory",
                path,
                where=where,
                hint="re-save the arrays with numpy.savez (uncompressed)",
            )
        total += info.file_size
        if info.header_offset + _LOCAL_HEADER.size > zf.start_dir:
            raise _refuse(
                f"member's local header at byte {info.header_offset} lies past the central directory "
                f"(byte {zf.start_dir})",
                path,
                where=where,
            )
        fp = zf.fp
        assert fp is not None, "the archive is open"
        fp.seek(info.header_offset)
        local = _LOCAL_HEADER.unpack(fp.read(_LOCAL_HEADER.size))
        if local[0] != b"PK\x03\x04":
            raise _refuse(f"no local file header at byte offset {info.header_offset}", path, where=where)
        data_start = info.header_offset + _LOCAL_HEADER.size + local[9] + local[10]
        data_end = data_start + info.compress_size
        if data_end > zf.start_dir:
            raise _refuse(
                f"member data [{data_start}, {data_end}) runs past the central directory at byte "
                f"{zf.start_dir} of the {size}-byte file",
                path,
                where=where,
            )
        spans.append((info.header_offset, data_end, name))
    if total > max(RATIO_FLOOR, MAX_RATIO * size):
        raise _refuse(
            f"members claim {total} bytes in all, more than {MAX_RATIO}x the {size}-byte file",
            path,
            hint="re-save the arrays with numpy.savez (uncompressed)",
        )
    spans.sort()
    for (_, end, name), (start, _, other) in zip(spans, spans[1:]):
        if start < end:
            raise _refuse(
                f"member '{show(other)}' at byte {start} overlaps the data of member '{show(name)}' "
                f"(which ends at byte {end})",
                path,
                hint="members of a zip never share bytes; re-save with numpy.savez",
            )
    return [i for i in infos if not i.is_dir()]


def _member_header(
    zf: zipfile.ZipFile, info: zipfile.ZipInfo, path: Path
) -> tuple[tuple, bool, np.dtype, int]:
    """Rule 3: the member's ``.npy`` header, checked against its declared size."""
    where = f"member '{show(info.filename)}'"
    try:
        with zf.open(info) as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version in ((2, 0), (3, 0)):  # 3.0 differs only in UTF-8 field names
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"unknown .npy format version {version[0]}.{version[1]}")
            header_len = f.tell()
    except InputError:
        raise
    except (*_ZIP_ERRORS, TypeError, SyntaxError, tokenize.TokenError, RecursionError, MemoryError) as exc:
        raise _refuse(f"not a valid .npy member ({show(str(exc), 100)})", path, where=where) from None
    if dtype.hasobject:
        raise _refuse(
            "holds Python objects (a pickled array)",
            path,
            where=where,
            hint="mconv reads numeric arrays only (allow_pickle=False)",
        )
    if (
        dtype.fields is not None
        or dtype.subdtype is not None
        or f"{dtype.kind}{dtype.itemsize}" not in _NUMERIC
    ):
        raise _refuse(
            f"holds dtype {show(str(dtype))}, not a numeric array",
            path,
            where=where,
            hint="mconv reads bool, integer, float16/32/64 and complex arrays",
        )
    need = check_shape(shape, dtype.itemsize, what=where, path=str(path), where=None, hint=_HINT)
    have = info.file_size - header_len
    if need != have:
        raise _refuse(
            f"header claims shape {shape} of {dtype} ({need} bytes) but the member holds {have}",
            path,
            where=where,
        )
    return shape, fortran, dtype, header_len


def _member_array(zf: zipfile.ZipFile, info: zipfile.ZipInfo, path: Path, header: tuple) -> np.ndarray:
    """Rule 4: the member's data, read in bounded chunks up to its declared size."""
    shape, fortran, dtype, header_len = header
    where = f"member '{show(info.filename)}'"
    need = info.file_size - header_len
    buf = np.empty(need, dtype=np.uint8)
    view = buf.data  # a writable view of buf
    pos = 0
    try:
        with zf.open(info) as f:
            f.read(header_len)
            while pos < need:
                chunk = f.read(min(_CHUNK, need - pos))
                if not chunk:
                    break
                view[pos : pos + len(chunk)] = chunk
                pos += len(chunk)
            f.read(1)  # at the declared end: zipfile checks the CRC here
    except _ZIP_ERRORS as exc:
        raise _refuse(f"member data is damaged ({show(str(exc), 100)})", path, where=where) from None
    if pos != need:
        raise _refuse(f"member data ends after {pos} of its {need} bytes", path, where=where)
    array = buf.view(dtype)
    array = array.reshape(shape[::-1]).T if fortran else array.reshape(shape)
    if not dtype.isnative:
        array = array.astype(dtype.newbyteorder("="))
    return array


def read_npz(path: str | Path) -> list[tuple[str, np.ndarray]]:
    """Arrays of an ``.npz`` in archive order (rules 1-4)."""
    path = Path(path)
    size = path.stat().st_size
    _end_record(path, size)
    try:
        zf = zipfile.ZipFile(path)
    except _ZIP_ERRORS as exc:
        raise _refuse(f"not a readable .npz ({type(exc).__name__}: {show(str(exc), 100)})", path) from None
    with zf:
        try:
            infos = _check_directory(zf, path, size)
        except InputError:
            raise
        except _ZIP_ERRORS as exc:
            raise _refuse(
                f"not a readable .npz ({type(exc).__name__}: {show(str(exc), 100)})", path
            ) from None
        for info in infos:
            if not info.filename.endswith(".npy"):
                raise _refuse("member is not a .npy array", path, where=f"member '{show(info.filename)}'")
        headers = [_member_header(zf, info, path) for info in infos]
        return [
            (info.filename[: -len(".npy")], _member_array(zf, info, path, header))
            for info, header in zip(infos, headers)
        ]


def read_npy(path: str | Path) -> np.ndarray:
    """One ``.npy`` file (rules 1 and 3: numeric dtypes only, the header's size equals the file's)."""
    path = Path(path)
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version in ((2, 0), (3, 0)):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"unknown .npy format version {version[0]}.{version[1]}")
            header_len = f.tell()
            if dtype.hasobject or f"{dtype.kind}{dtype.itemsize}" not in _NUMERIC or dtype.fields:
                raise _refuse(
                    f"holds dtype {show(str(dtype))}, not a numeric array",
                    path,
                    hint="mconv reads bool, integer, float16/32/64 and complex arrays (no pickles)",
                )
            need = check_shape(shape, dtype.itemsize, what="array", path=str(path), where=None, hint=_HINT)
            if need != size - header_len:
                raise _refuse(
                    f"header claims shape {shape} of {dtype} ({need} bytes) but the file holds "
                    f"{size - header_len} after its {header_len}-byte header",
                    path,
                    hint="the file is truncated or corrupt; re-save it with numpy.save",
                )
            buf = np.fromfile(f, dtype=np.uint8, count=need)
    except InputError:
        raise
    except (*_ZIP_ERRORS, TypeError, SyntaxError, tokenize.TokenError, RecursionError, MemoryError) as exc:
        raise _refuse(
            f"not a readable .npy ({show(str(exc), 100)})", path, hint="write it with numpy.save"
        ) from None
    array = buf.view(dtype)
    array = array.reshape(shape[::-1]).T if fortran else array.reshape(shape)
    if not dtype.isnative:
        array = array.astype(dtype.newbyteorder("="))
    return array


def write_npz(fh: BinaryIO, arrays: Iterable[tuple[str, np.ndarray]]) -> None:
    """What ``numpy.savez(fh, **arrays)`` writes (stored ``NAME.npy`` members, zip64 headers), for
    any names: savez takes the arrays as keyword arguments, so an array named ``file`` is a
    TypeError there and one named ``allow_pickle`` is swallowed as that flag. Nothing is pickled."""
    with zipfile.ZipFile(fh, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, value in arrays:
            with zf.open(name + ".npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)
