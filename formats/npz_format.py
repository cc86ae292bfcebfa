"""NumPy ``.npz`` weight archives (import and export) as weight-only models.

Rules:

1. An ``.npz`` is a zip of ``.npy`` members; each member ``NAME.npy`` becomes the initializer
   ``NAME`` (archive order). Read with ``allow_pickle=False``: object arrays are refused.
2. Reads are bounded: each member's ``.npy`` header (magic, version, dtype, shape) is parsed
   first and ``prod(shape) * itemsize`` is checked against the member's uncompressed size in
   the zip directory, so an absurd shape or a truncated member fails with a one-line
   :class:`mconv.errors.InputError` (file, member, hint) before any allocation.
3. ``save`` writes every initializer with ``numpy.savez`` (uncompressed), atomically.
"""

from __future__ import annotations

import math
import zipfile
import zlib
from pathlib import Path

import numpy as np
import onnx_ir as ir
from mconv.errors import InputError
from mconv.fileio import atomic_path
from mconv.formats import Format
from mconv.formats.weights import weight_only_model, writable_arrays

_HINT = "the archive is truncated or corrupt; re-save it with numpy.savez"


def _check_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, path: Path) -> None:
    """Rule 2: the header's shape must fit the member's real size."""
    where = f"member '{info.filename}'"
    try:
        with zf.open(info) as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(f)
            else:  # 2.0 and 3.0 share the 4-byte header length (3.0 allows UTF-8 names)
                shape, _, dtype = np.lib.format.read_array_header_2_0(f)
            header_len = f.tell()
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, NotImplementedError, zlib.error) as exc:
        raise InputError(
            f"not a valid .npy member ({str(exc)[:100]})", path=str(path), where=where, hint=_HINT
        ) from None
    if dtype.hasobject:
        raise InputError(
            "holds Python objects (a pickled array)",
            path=str(path),
            where=where,
            hint="mconv reads numeric arrays only (allow_pickle=False)",
        )
    need = math.prod(shape) * dtype.itemsize
    have = info.file_size - header_len
    if need != have:
        raise InputError(
            f"header claims shape {shape} of {dtype} ({need} bytes) but the member holds {have}",
            path=str(path),
            where=where,
            hint=_HINT,
        )


def read_npz(path: str | Path) -> list[tuple[str, np.ndarray]]:
    """Arrays of an ``.npz`` in archive order (rules 1 and 2)."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as zf:
            infos = [i for i in zf.infolist() if not i.is_dir()]
            for info in infos:
                if not info.filename.endswith(".npy"):
                    raise InputError(
                        "member is not a .npy array",
                        path=str(path),
                        where=f"member '{info.filename}'",
                        hint=_HINT,
                    )
                _check_member(zf, info, path)
        with np.load(path, allow_pickle=False) as npz:
            return [(info.filename[: -len(".npy")], npz[info.filename[: -len(".npy")]]) for info in infos]
    except InputError:
        raise
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, NotImplementedError, zlib.error) as exc:
        # NotImplementedError: zipfile's answer to an unknown zip version or compression method.
        raise InputError(
            f"not a readable .npz ({type(exc).__name__}: {str(exc)[:100]})", path=str(path), hint=_HINT
        ) from None


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
        np.savez(f, **dict(arrays))
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
