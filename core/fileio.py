"""Atomic outputs and bounded inputs.

Every output is written next to its final place under a temporary name and renamed into place
when complete, so an interrupted or failed run leaves nothing half-written and never touches
its input.

Rules:

1. Temporaries are named ``.{dest.name}.{pid}.{random}.tmp`` (``.old`` for a directory being
   replaced on the fallback path) and the writer holds an ``flock`` on them while it lives. The
   next write of the same ``dest`` removes the ones whose writer is gone (its pid is not alive
   and the lock is free), so a killed run leaves no garbage behind for long, and a concurrent
   writer's temporaries are never touched (:func:`clean_stale`). Scratch folders
   (``.mconv-spill-{pid}-*``, :func:`mconv.irio.spilling`) follow the same rule.
2. A directory output replaces an existing one with one ``renameat2(RENAME_EXCHANGE)``: at every
   instant ``dest`` holds the old complete directory or the new one. Where the kernel or the
   file system cannot exchange, two renames are used and the next run restores a complete
   ``.old`` if it finds ``dest`` missing (:func:`recover_dir`).
3. An ``OSError`` while writing (a full disk, a read-only file system, a parent that is a file,
   no permission, ...) becomes one :class:`mconv.errors.InputError` naming the output and what
   failed (:func:`output_errors`).
4. Cleanup never raises and never hides the error that made it run (:func:`remove_quietly`).
5. An existing output is replaced only by its own kind (a file by a file, a folder by a folder)
   and a folder only when mconv wrote it (:func:`mconv_listing`: a bundle's manifest, a sharded
   checkpoint's index with ``"producer": "mconv"`` in its metadata, or the :data:`OUTPUT_MARKER`
   of another folder mconv writes) and it holds nothing else (the listed files, the folders
   above them and temporaries of them). An empty folder is replaced; any other folder is
   refused (:func:`check_output`). An existing regular file is replaced (reruns of a Makefile).
6. Nothing the command reads is replaced: the inputs a command names (:func:`reading`) and the
   files its readers open (:func:`note_input`: shards, external data) are compared with the
   output and everything the swap would replace, by resolved path and by ``(st_dev, st_ino)``
   (links of either kind), and an output folder holding an input is refused too.
7. A file a command reads must be a regular file (or a folder where one is expected): a FIFO,
   a device or a socket is refused before it is opened for reading, so nothing hangs
   (:func:`note_input`, :func:`read_regular`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import math
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mconv.errors import InputError, show

try:  # POSIX only; elsewhere temporaries are told apart by their pid alone
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

_WRITE_HINTS = {
    errno.ENOSPC: "free space on the device and run again",
    errno.EDQUOT: "the disk quota is exhausted; free space or raise the quota",
    errno.EROFS: "the file system is read-only; choose another -o path",
    errno.EACCES: "no permission to write there; choose another -o path",
    errno.EPERM: "no permission to write there; choose another -o path",
    errno.ENOTDIR: "a parent of the output path is not a directory; choose another -o path",
    errno.EISDIR: "the output path is a directory; choose another -o path",
    errno.ENAMETOOLONG: "shorten the output path",
    errno.EFBIG: "the file is too large for this file system; choose another -o path",
    errno.EEXIST: "a parent of the output path is a file; choose another -o path",
    errno.ENOENT: "the output folder cannot be created there; choose another -o path",
}


def write_error(exc: OSError, dest: str | os.PathLike, what: str = "write the output") -> InputError:
    """The one-line error for an ``OSError`` raised while writing ``dest``."""
    reason = exc.strerror or type(exc).__name__
    code = errno.errorcode.get(exc.errno or 0, "")
    hint = _WRITE_HINTS.get(exc.errno or 0, "check the output path and the device")
    return InputError(f"cannot {what} ({code + ': ' if code else ''}{reason})", path=str(dest), hint=hint)


def _inside(name: str | None, roots: tuple[Path, ...]) -> bool:
    if name is None:
        return True
    try:
        p = Path(os.fsdecode(name)).absolute()
    except (TypeError, ValueError):
        return True
    return any(p == r or r in p.parents for r in roots)


@contextlib.contextmanager
def output_errors(dest: str | os.PathLike, *also: str | os.PathLike, what: str = "write the output"):
    """Turn an ``OSError`` about ``dest`` (or ``also``: its temporaries), or one naming no file
    (``os.write``, ``file.write``), into an :class:`InputError` naming ``dest``. An ``OSError``
    about another file (an input read inside the block) passes through unchanged."""
    roots = tuple(Path(p).absolute() for p in (dest, *also))
    try:
        yield
    except InputError:
        raise
    except OSError as exc:
        names = [n for n in (exc.filename, exc.filename2) if n is not None]
        if names and not any(_inside(n, roots) for n in names):
            raise
        raise write_error(exc, dest, what) from None


def remove_quietly(path: str | os.PathLike) -> None:
    """Remove a file, a link or a whole tree at ``path``; never raise (cleanup in ``finally``)."""
    p = Path(path)
    try:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink()
    except OSError:
        pass


# --------------------------------------------------------------------------- temporaries
def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not ours to judge
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, owned by someone else
        return True
    return True


def _lock(fd: int) -> None:
    if fcntl is not None:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _lock_free(path: Path) -> bool:
    """Whether no process holds an flock on ``path`` (the writer of a temporary holds one)."""
    if fcntl is None:
        return True
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return True  # gone already, or unopenable: the pid decides
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def _stale_pattern(name: str) -> re.Pattern:
    return re.compile(rf"^\.{re.escape(name)}\.(\d+)\.[A-Za-z0-9_]+\.(tmp|old)$")


def _dead_entries(parent: Path, pattern: re.Pattern) -> list[tuple[Path, str]]:
    out: list[tuple[Path, str]] = []
    try:
        names = os.listdir(parent)
    except OSError:
        return out
    for n in names:
        m = pattern.match(n)
        if m is None:
            continue
        p = parent / n
        if not _pid_alive(int(m.group(1))) and not p.is_symlink() and _lock_free(p):
            out.append((p, m.group(m.lastindex or 1)))
    return out


def recover_dir(dest: str | os.PathLike) -> bool:
    """Where a replacement on the two-rename fallback was killed between its renames (``dest``
    missing, the old directory complete under ``.{name}.{pid}.*.old``), put the old one back.
    True when something was restored."""
    dest = Path(dest)
    if os.path.lexists(dest):
        return False
    olds = [p for p, kind in _dead_entries(dest.parent, _stale_pattern(dest.name)) if kind == "old"]
    # An .old is complete from the moment it has that name (one rename of the whole directory);
    # an empty one is the placeholder made just before that rename.
    olds = [p for p in olds if p.is_dir() and any(p.iterdir())]
    for old in sorted(olds, key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            os.rename(old, dest)
            return True
        except OSError:
            continue
    return False


def clean_stale(dest: str | os.PathLike) -> list[Path]:
    """Remove ``dest``'s temporaries left by writers that are gone (rule 1); return them."""
    dest = Path(dest)
    removed = []
    for p, _kind in _dead_entries(dest.parent, _stale_pattern(dest.name)):
        remove_quietly(p)
        removed.append(p)
    return removed


def clean_stale_scratch(parent: str | os.PathLike, prefix: str) -> list[Path]:
    """Remove ``{prefix}{pid}-*`` scratch folders in ``parent`` whose writer is gone."""
    pattern = re.compile(rf"^{re.escape(prefix)}(\d+)-[A-Za-z0-9_]+$")
    removed = []
    for p, _kind in _dead_entries(Path(parent), pattern):
        remove_quietly(p)
        removed.append(p)
    return removed


# --------------------------------------------------------------------------- what may be replaced
# Rule 5: how a folder tells that mconv wrote it.
BUNDLE_FORMAT = "mconv-bundle"  # a bundle's manifest.json "format" (mconv.bundle.FORMAT)
BUNDLE_MANIFEST = "manifest.json"
INDEX_SUFFIX = ".safetensors.index.json"
PRODUCER = "mconv"
# Any other folder mconv writes holds this JSON file: {"producer": "mconv", "files": [...]}.
OUTPUT_MARKER = ".mconv-output.json"
_MAX_RECORD_BYTES = 64 << 20
_MAX_WALK = 100_000


def read_regular(path: str | os.PathLike, limit: int, what: str = "file", *, follow: bool = True) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes (rule 7). A FIFO, a
    device or a socket is refused without blocking (opened with ``O_NONBLOCK``, then
    ``fstat``); with ``follow=False`` a symbolic link is refused too."""
    p = Path(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(p, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise InputError(f"{what} is a symbolic link", path=str(p), hint="give the file itself") from None
        raise read_error(exc, p, what) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise not_regular(p, what, st.st_mode)
        if st.st_size > limit:
            raise InputError(
                f"{what} is {st.st_size} bytes, more than {limit}", path=str(p), hint="check the file"
            )
        chunks, left = [], limit + 1
        while left > 0:
            block = os.read(fd, min(left, 1 << 20))
            if not block:
                break
            chunks.append(block)
            left -= len(block)
    except OSError as exc:
        raise read_error(exc, p, what) from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise InputError(
            f"{what} grew past {limit} bytes while being read", path=str(p), hint="check the file"
        )
    return data


def not_regular(path: str | os.PathLike, what: str, mode: int) -> InputError:
    """The one-line refusal of a file that is not a regular file (rule 7)."""
    kind = (
        "a FIFO"
        if stat.S_ISFIFO(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "a device"
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
        else "a directory"
        if stat.S_ISDIR(mode)
        else "not a regular file"
    )
    return InputError(f"{what} is {kind}, not a regular file", path=str(path), hint="give a regular file")


def _record(path: Path) -> Any:
    """A listing record (JSON) of a folder, or None where it is missing, not a regular file
    (no link), too large or not JSON: then the folder is not known to be mconv's."""
    try:
        data = read_regular(path, _MAX_RECORD_BYTES, follow=False)
        obj = json.loads(data.decode("utf-8"))
    except (InputError, ValueError, RecursionError):
        return None
    return obj if json_depth_ok(obj) else None


def mconv_listing(folder: str | os.PathLike) -> set[str] | None:
    """The relative paths mconv wrote in ``folder`` by the folder's own record (rule 5): a
    bundle's manifest, a sharded checkpoint's index whose metadata says ``"producer":
    "mconv"``, or :data:`OUTPUT_MARKER`. None where there is no such record."""
    folder = Path(folder)
    doc = _record(folder / BUNDLE_MANIFEST)
    if isinstance(doc, dict) and doc.get("format") == BUNDLE_FORMAT and isinstance(doc.get("files"), dict):
        return {BUNDLE_MANIFEST, *(str(k) for k in doc["files"])}
    doc = _record(folder / OUTPUT_MARKER)
    if isinstance(doc, dict) and doc.get("producer") == PRODUCER and isinstance(doc.get("files"), list):
        return {OUTPUT_MARKER, *(str(k) for k in doc["files"])}
    try:
        indexes = [n for n in os.listdir(folder) if n.endswith(INDEX_SUFFIX)]
    except OSError:
        return None
    if len(indexes) == 1:
        doc = _record(folder / indexes[0])
        meta = doc.get("metadata") if isinstance(doc, dict) else None
        wmap = doc.get("weight_map") if isinstance(doc, dict) else None
        if isinstance(meta, dict) and meta.get("producer") == PRODUCER and isinstance(wmap, dict):
            return {indexes[0], *(str(v) for v in wmap.values())}
    return None


def _foreign_entry(folder: Path) -> str | None:
    """The first entry of ``folder`` that mconv did not write there (rule 5), or None."""
    try:
        entries = os.listdir(folder)
    except OSError as exc:
        return f"(unreadable: {exc.strerror})"
    if not entries:
        return None
    listed = mconv_listing(folder)
    if listed is None:
        return sorted(entries)[0]
    parents = {str(Path(rel).parent) for rel in listed} | {
        str(p) for rel in listed for p in Path(rel).parents
    }
    temporaries = re.compile(r"^\.(.+)\.\d+\.[A-Za-z0-9_]+\.(tmp|old)$")
    seen = 0
    for dirpath, dirs, files in os.walk(folder, onerror=None):
        base = Path(dirpath)
        for name in sorted(dirs + files):
            seen += 1
            if seen > _MAX_WALK:
                return "(too many entries)"
            p = base / name
            rel = p.relative_to(folder).as_posix()
            try:
                st = os.lstat(p)
            except OSError:
                return rel
            if stat.S_ISDIR(st.st_mode):
                if rel not in parents:
                    m = temporaries.match(name)
                    if m is None or str(Path(rel).parent / m.group(1)) not in listed | parents:
                        return rel
                    dirs.remove(name)  # a temporary of a listed folder: its contents are mconv's
                continue
            if not stat.S_ISREG(st.st_mode):
                return rel
            if rel in listed:
                continue
            m = temporaries.match(name)
            if m is None or (Path(rel).parent / m.group(1)).as_posix() not in listed:
                return rel
    return None


# Rule 6: the inputs of the running command.
@dataclass(frozen=True)
class _Input:
    path: Path  # resolved
    dev: int
    ino: int
    given: str


_INPUTS: ContextVar[list[_Input] | None] = ContextVar("mconv_inputs", default=None)


@contextlib.contextmanager
def reading(*paths: str | os.PathLike | None, what: str = "input") -> Iterator[None]:
    """The command inside reads ``paths`` (None entries are skipped): every output prepared
    inside must not replace any of them, nor anything :func:`note_input` adds (rule 6). Each
    existing path must be a regular file or a folder (rule 7)."""
    token = _INPUTS.set(list(_INPUTS.get() or []))
    try:
        for p in paths:
            if p is not None:
                note_input(p, what)
        yield
    finally:
        _INPUTS.reset(token)


def note_input(path: str | os.PathLike, what: str = "input") -> None:
    """Record ``path`` as read by the running command (rule 6); refuse a FIFO, a device or a
    socket (rule 7). A path that does not exist is left to its reader to report."""
    p = Path(path)
    try:
        st = os.stat(p)
        real = p.resolve()
    except (OSError, RuntimeError, ValueError):
        return
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        raise not_regular(p, what, st.st_mode)
    inputs = _INPUTS.get()
    if inputs is not None:
        inputs.append(_Input(real, st.st_dev, st.st_ino, str(p)))


def _ids(path: Path) -> set[tuple[int, int]]:
    out = set()
    for fn in (os.stat, os.lstat):
        with contextlib.suppress(OSError, ValueError):
            st = fn(path)
            out.add((st.st_dev, st.st_ino))
    return out


def _clashing_input(dest: Path) -> tuple[_Input, str] | None:
    """The input that writing ``dest`` would replace, and how (rule 6), or None."""
    inputs = _INPUTS.get()
    if not inputs:
        return None
    try:
        places = {dest.parent.resolve() / dest.name, dest.resolve()}
    except (OSError, RuntimeError, ValueError):
        places = {dest.absolute()}
    own = _ids(dest)
    inside: set[tuple[int, int]] = set()
    if dest.is_dir() and not dest.is_symlink():
        seen = 0
        for dirpath, dirs, files in os.walk(dest):
            for name in dirs + files:
                seen += 1
                if seen > _MAX_WALK:
                    break
                inside |= _ids(Path(dirpath) / name)
    for inp in inputs:
        for place in places:
            if inp.path == place:
                return inp, "is"
            if place in inp.path.parents:
                return inp, "holds"
        if (inp.dev, inp.ino) in own:
            return inp, "same"
        if (inp.dev, inp.ino) in inside:
            return inp, "links"
    return None


def check_output(dest: str | os.PathLike, kind: str | None = None) -> Path:
    """Refuse an output that would destroy what is not mconv's to replace (rules 5 and 6):
    an input of the running command, a folder mconv did not write, a file where a folder is
    expected or a folder where a file is, a device, a FIFO or a socket. ``kind``: ``"file"``,
    ``"dir"`` or None (not known yet: an existing folder must then be mconv's)."""
    dest = Path(dest)
    clash = _clashing_input(dest)
    if clash is not None:
        inp, how = clash
        what = {
            "is": f"the output is the input '{show(inp.given, 200)}'",
            "holds": f"the output folder holds the input '{show(inp.given, 200)}'",
            "same": f"the output is the same file as the input '{show(inp.given, 200)}' (a link)",
            "links": f"the output folder holds a link to the input '{show(inp.given, 200)}'",
        }[how]
        raise InputError(
            what + "; writing it would destroy the input",
            path=str(dest),
            hint="write to another -o path, then move it over the input if you want",
        )
    if not os.path.lexists(dest):
        return dest
    is_dir = dest.is_dir()
    if kind == "dir" and not is_dir:
        raise InputError(
            "output exists and is not a folder", path=str(dest), hint="choose a new -o path or remove it"
        )
    if kind == "file" and is_dir:
        raise InputError(
            "output is a folder, expected a file path", path=str(dest), hint="choose a new -o path"
        )
    if kind == "file" and not dest.is_file():  # a link is followed: /dev/stdout is a link
        raise InputError(
            "output exists and is not a regular file (a device, a FIFO or a socket)",
            path=str(dest),
            hint="choose another -o path",
        )
    if is_dir:
        foreign = _foreign_entry(dest)
        if foreign is not None:
            raise InputError(
                f"output folder exists and is not one mconv wrote (it holds '{show(foreign)}')",
                path=str(dest),
                hint="choose a new -o path or remove the folder",
            )
    return dest


def prepare_output(dest: str | os.PathLike, kind: str = "file") -> Path:
    """Check that ``dest`` may be replaced (:func:`check_output`, rules 5 and 6), make its
    folder (one-line errors: a parent that is a file, /proc, no permission; a missing folder is
    created) and remove the temporaries that dead writers of ``dest`` left there (rule 1).

    ``kind``: ``"file"`` or ``"dir"``, what the writer puts there; a device, a FIFO or a socket
    is never replaced by a rename (as root that would swap ``/dev/null`` for a regular file)."""
    dest = check_output(dest, kind)
    with output_errors(dest, dest.parent, what="create the output folder"):
        for parent in (dest.parent, *dest.parent.parents):
            if os.path.lexists(parent):
                if not parent.is_dir():
                    raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(parent))
                break
        dest.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(dest)
    return dest


def temp_file(dest: str | os.PathLike) -> tuple[Path, int]:
    """A new locked temporary file beside ``dest`` (rule 1): its path and the fd holding the lock."""
    dest = Path(dest)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.{os.getpid()}.", suffix=".tmp", dir=dest.parent)
    _lock(fd)
    return Path(tmp), fd


def temp_dir(dest: str | os.PathLike, suffix: str = ".tmp") -> tuple[Path, int]:
    """A new locked temporary directory beside ``dest``: its path and the fd holding the lock."""
    dest = Path(dest)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.{os.getpid()}.", suffix=suffix, dir=dest.parent))
    return tmp, lock_fd(tmp)


def lock_fd(path: str | os.PathLike) -> int:
    """An fd holding an flock on ``path`` (a file or a folder) for as long as it stays open: what
    tells a live writer's temporary from a dead one's (rule 1). -1 where it cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return -1
    _lock(fd)
    return fd


def _close(fd: int) -> None:
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary file path beside ``dest``; rename it onto ``dest`` on success."""
    dest = prepare_output(dest)
    tmp_path = None
    fd = -1
    try:
        with output_errors(dest, dest.parent, what="create a temporary file beside the output"):
            tmp_path, fd = temp_file(dest)
        # Only errors about the output and its temporary are the output's: an input read
        # inside the block keeps its own error.
        with output_errors(dest, tmp_path):
            yield tmp_path
            if dest.is_dir() and not dest.is_symlink():
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(dest))
            os.replace(tmp_path, dest)
    finally:
        _close(fd)
        if tmp_path is not None and os.path.lexists(tmp_path):
            remove_quietly(tmp_path)


def atomic_write_bytes(dest: str | os.PathLike, data: bytes) -> None:
    with atomic_path(dest) as tmp, open(tmp, "wb") as f:
        f.write(data)


# --------------------------------------------------------------------------- directory exchange
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_renameat2 = None


def _libc_renameat2():
    global _renameat2
    if _renameat2 is None:
        fn = False
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                fn = getattr(libc, "renameat2", False)  # glibc >= 2.28
                if fn:
                    fn.argtypes = [
                        ctypes.c_int,
                        ctypes.c_char_p,
                        ctypes.c_int,
                        ctypes.c_char_p,
                        ctypes.c_uint,
                    ]
                    fn.restype = ctypes.c_int
            except OSError:
                fn = False
        _renameat2 = fn
    return _renameat2 or None


def exchange(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Swap ``a`` and ``b`` in one step (``renameat2(RENAME_EXCHANGE)``). False where the kernel,
    the C library or the file system cannot; an ``OSError`` for any other failure."""
    fn = _libc_renameat2()
    if fn is None:
        return False
    rc = fn(_AT_FDCWD, os.fsencode(os.fspath(a)), _AT_FDCWD, os.fsencode(os.fspath(b)), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), os.fspath(b))


# Tests set this to False to exercise the two-rename fallback.
USE_EXCHANGE = True


@contextlib.contextmanager
def atomic_dir(dest: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory beside ``dest``; swap it into place on success.

    An existing ``dest`` directory is replaced only once the new one is complete, in one
    exchange (rule 2).
    """
    dest = prepare_output(dest, "dir")
    recover_dir(dest)
    tmp = None
    fd = -1
    try:
        with output_errors(dest, dest.parent, what="create a temporary folder beside the output"):
            tmp, fd = temp_dir(dest)
        with output_errors(dest, tmp):
            yield tmp
        with output_errors(dest, dest.parent, what="move the new folder into place"):
            if not os.path.lexists(dest):
                os.rename(tmp, dest)
            elif USE_EXCHANGE and exchange(tmp, dest):
                pass  # tmp now holds the old directory; removed below
            else:
                # Fallback (no renameat2 here): two renames. A run killed between them leaves
                # dest missing and the old directory complete as .old; recover_dir (run by the
                # next write of dest) puts it back.
                old, old_fd = temp_dir(dest, suffix=".old")
                _close(old_fd)
                os.rmdir(old)
                os.rename(dest, old)
                os.rename(tmp, dest)
                remove_quietly(old)
    finally:
        _close(fd)
        if tmp is not None and os.path.lexists(tmp):
            remove_quietly(tmp)


def require_file(path: str | os.PathLike, what: str = "file") -> Path:
    """Check that ``path`` is an existing, non-empty regular file; raise a one-line error if not."""
    p = Path(path)
    try:
        if not p.exists():
            raise InputError(f"{what} not found", path=str(p), hint="check the path")
        if p.is_dir():
            raise InputError(f"is a directory, expected a {what}", path=str(p), hint="give a file path")
        if not p.is_file():
            raise InputError(
                f"is not a regular file, expected a {what}", path=str(p), hint="give a file path"
            )
        size = p.stat().st_size
    except OSError as exc:
        raise read_error(exc, p, what) from None
    if size == 0:
        raise InputError(
            f"{what} is empty (0 bytes)", path=str(p), hint="the file was truncated or not written"
        )
    return p


def read_error(exc: OSError, path: str | os.PathLike, what: str = "file") -> InputError:
    """The one-line error for an ``OSError`` raised while reading ``path``."""
    code = errno.errorcode.get(exc.errno or 0, "")
    reason = exc.strerror or type(exc).__name__
    return InputError(
        f"cannot read the {what} ({code + ': ' if code else ''}{reason})",
        path=str(path),
        hint="check that it is a readable regular file",
    )


MAX_JSON_DEPTH = 64


def json_depth_ok(obj: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``obj`` (parsed JSON) nests at most ``limit`` levels (iterative: no recursion)."""
    stack = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, (dict, list)):
            if d > limit:
                return False
            stack.extend((v, d + 1) for v in (o.values() if isinstance(o, dict) else o))
    return True


def load_json(data: bytes, what: str, label: str, hint: str, where: str | None = None) -> Any:
    """Parse untrusted JSON: bad UTF-8, bad syntax and deep nesting are one-line errors naming
    ``label`` (the file), ``where`` and ``what`` (the part of the file)."""
    try:
        obj = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise InputError(f"{what} is nested too deeply", path=label, where=where, hint=hint) from None
    except ValueError as exc:
        raise InputError(
            f"{what} is not valid JSON ({str(exc)[:80]})", path=label, where=where, hint=hint
        ) from None
    if not json_depth_ok(obj):
        raise InputError(
            f"{what} nests more than {MAX_JSON_DEPTH} levels deep", path=label, where=where, hint=hint
        )
    return obj


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


# The most dimensions a tensor read from a file may have (numpy's own limit is 64).
MAX_NDIM = 64


def check_shape(
    shape: object, itemsize: int, *, what: str, path: str | None, where: str | None, hint: str
) -> int:
    """Rule 3: the bytes a tensor of ``shape`` needs, or an InputError naming ``what``."""
    if not isinstance(shape, (list, tuple)) or not all(type(d) is int and d >= 0 for d in shape):
        raise InputError(
            f"{what} has an invalid shape {show(repr(shape), 80)} (dimensions must be non-negative integers)",
            path=path,
            where=where,
            hint=hint,
        )
    if len(shape) > MAX_NDIM:
        raise InputError(
            f"{what} has {len(shape)} dimensions, more than {MAX_NDIM}", path=path, where=where, hint=hint
        )
    if math.prod(d for d in shape if d) * itemsize >= 1 << 63:
        raise InputError(
            f"{what} has shape {show(repr(list(shape)), 80)}, too large for any array",
            path=path,
            where=where,
            hint=hint,
        )
    return math.prod(shape) * itemsize
