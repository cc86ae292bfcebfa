"""Atomic outputs and bounded inputs.

Every output is written next to its final place under a temporary name and renamed into place
when complete, so an interrupted or failed run leaves nothing half-written and never touches
its input.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from mconv.errors import InputError


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary file path beside ``dest``; rename it onto ``dest`` on success."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, dest)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def atomic_write_bytes(dest: str | os.PathLike, data: bytes) -> None:
    with atomic_path(dest) as tmp:
        tmp.write_bytes(data)


@contextlib.contextmanager
def atomic_dir(dest: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory beside ``dest``; swap it into place on success.

    An existing ``dest`` directory is replaced only once the new one is complete.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists() and not dest.is_dir():
        raise InputError(
            "output exists and is not a directory", path=str(dest), hint="choose another -o path"
        )
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    try:
        yield tmp
        if dest.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".old", dir=dest.parent))
            os.rmdir(old)
            os.replace(dest, old)
            os.replace(tmp, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def require_file(path: str | os.PathLike, what: str = "file") -> Path:
    """Check that ``path`` is an existing, non-empty regular file; raise a one-line error if not."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{what} not found", path=str(p), hint="check the path")
    if p.is_dir():
        raise InputError(f"is a directory, expected a {what}", path=str(p), hint="give a file path")
    if p.stat().st_size == 0:
        raise InputError(
            f"{what} is empty (0 bytes)", path=str(p), hint="the file was truncated or not written"
        )
    return p


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
