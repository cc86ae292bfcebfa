"""NumPy ``.npz`` weight archives (import and export) as weight-only models.

Rules (1-4 are :mod:`mconv.npzio`'s, the bounded reader):

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
5. ``save`` writes every initializer as ``numpy.savez`` does (uncompressed; any names, through
   :func:`mconv.npzio.write_npz`), atomically.
"""

from __future__ import annotations

from pathlib import Path

import onnx_ir as ir
from mconv.errors import InputError
from mconv.fileio import atomic_path
from mconv.formats import Format
from mconv.formats.weights import weight_only_model, writable_arrays
from mconv.npzio import read_npz, write_npz


def _load(paths: list[Path], options: dict) -> ir.Model:
    arrays = read_npz(paths[0])
    if not arrays:
        raise InputError("archive holds no arrays", path=str(paths[0]), hint="save weights with numpy.savez")
    return weight_only_model(arrays, name=paths[0].stem, path=str(paths[0]))


def _save(model: ir.Model, dest: Path, options: dict) -> list[Path]:
    arrays = writable_arrays(model)
    if not arrays:
        raise InputError("model has no weights to write", path=str(dest), hint="npz holds initializers only")
    with atomic_path(dest) as tmp, open(tmp, "wb") as f:
        write_npz(f, dict(arrays).items())
    return [Path(dest)]


def _sniff(head: bytes, path: Path) -> bool:
    return head[:4] == b"PK\x03\x04" and b".npy" in head[:200]


FORMAT = Format(
    name="npz",
    description="NumPy .npz weight archive (weight-only model)",
    extensions=(".npz",),
    load=_load,
    save=_save,
    sniff=_sniff,
)
