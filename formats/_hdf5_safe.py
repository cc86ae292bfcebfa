"""Reading an untrusted HDF5 file: libhdf5 runs in a bounded child process, never in mconv's own.

Why a child process: libhdf5 trusts the structures it parses. One flipped bit in a global heap
collection makes it loop forever; a damaged variable-length descriptor makes it allocate (and
clear) gigabytes before it notices; a damaged B-tree can send it anywhere. None of that can be
validated from the outside through h5py, so every libhdf5 call happens in a child interpreter
(``python <this file>``, importing only h5py and numpy) that runs under a CPU-time limit, an
address-space limit and a wall-clock timeout. A hang, a crash or an exhausted limit there is one
``InputError`` here.

What the child refuses, before any data is read (each refusal names the HDF5 path):

- data from other files: external links, external raw storage (``H5Pset_external``), virtual
  datasets (VDS), user-defined links; soft links are not followed by libhdf5 at all: they are
  handed over as paths and resolved here, inside the snapshot, with a hop limit (dangling or
  looping links are errors, not hangs);
- filters other than HDF5's built-ins and h5py's lzf (so no filter plugin is ever looked up;
  the child also runs with ``HDF5_PLUGIN_PRELOAD=::``, which turns plugin loading off);
- attributes whose declared size (elements x element size) exceeds the file, and attribute types
  other than numbers and strings; global heap collections (where variable-length strings live)
  are checked to be well formed before the first variable-length value is read;
- datasets whose declared bytes exceed the file (unfiltered), whose stored bytes exceed the file,
  that expand more than ``MAX_RATIO`` times their stored bytes (filtered), or whose storage
  overlaps another dataset's (the sum of all stored bytes exceeds the file).

The child sends back a snapshot: the group tree, every attribute, and the datasets' arrays, as a
JSON index followed by raw array bytes (no pickle). ``open_tree`` returns it as ``Group`` /
``Dataset`` objects with the small part of h5py's interface that the importers use.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # imported in the child only (h5py has no type information: Any)
    import h5py

MAGIC = b"MCH5SNAP"
MAX_RATIO = 1100  # deflate's best case is about 1032:1; any legitimate filtered dataset passes
MAX_LINK_HOPS = 16
MAX_DEPTH = 64  # group nesting in the walk
MAX_OBJECTS = 1 << 20
MAX_RANK = 32
TIMEOUT_S = 30.0  # plus a second per 50 MB of file
CHILD_BASE_AS = 768 << 20  # address space for the child's bookkeeping above its start-up size
ALLOWED_FILTERS = {
    1: "deflate",
    2: "shuffle",
    3: "fletcher32",
    4: "szip",
    5: "nbit",
    6: "scaleoffset",
    32000: "lzf",
}
_SCRUBBED_ENV = (
    "HDF5_PLUGIN_PATH",
    "HDF5_EXT_PREFIX",
    "HDF5_VDS_PREFIX",
    "HDF5_EXTFILE_PREFIX",
    "HDF5_DRIVER",
    "HDF5_DRIVER_CONFIG",
    "HDF5_VOL_CONNECTOR",
    "HDF5_USE_FILE_LOCKING",
)


# ------------------------------------------------------------------------------- parent side


class Dataset:
    """A dataset of the snapshot: its array (already checked and read) or why it was not read."""

    def __init__(self, tree: Tree, node: dict, where: str) -> None:
        self.tree, self.where = tree, where
        self.attrs = Attrs(tree, node.get("attrs") or {}, where)
        self.shape = tuple(node.get("shape") or ())
        self.dtype = node.get("dtype")
        self.unread = node.get("unread")
        self._blob = node.get("blob")

    def array(self) -> np.ndarray:
        from mconv.errors import InputError, show

        if self._blob is None:
            raise InputError(
                f"dataset '{show(self.where)}' {self.unread or 'was not read'}",
                path=self.tree.path,
                where=f"dataset '{show(self.where)}'",
                hint="the weights file is damaged or not from Keras",
            )
        return self.tree.blob(self._blob)


class Attrs:
    """Attributes of one object: ``get``, ``in``, ``[]``; values as h5py returns them."""

    def __init__(self, tree: Tree, raw: dict, where: str) -> None:
        self.tree, self.raw, self.where = tree, raw, where

    def __contains__(self, name: str) -> bool:
        return name in self.raw

    def __iter__(self):
        return iter(self.raw)

    def get(self, name: str, default=None):
        if name not in self.raw:
            return default
        return self[name]

    def __getitem__(self, name: str):
        from mconv.errors import InputError, show

        a = self.raw[name]
        t = a.get("t")
        if t == "x":
            raise InputError(
                f"attribute '{show(name)}' {a.get('why')}",
                path=self.tree.path,
                where=f"object '{show(self.where)}', attribute '{show(name)}'",
                hint="the file is damaged or not from Keras",
            )
        shape = tuple(a.get("shape") or ())
        if t == "n":
            arr = self.tree.blob(a["blob"])
            return arr[()] if shape == () else arr
        vals = [v.encode("latin-1") if t == "b" else v for v in a["v"]]
        if shape == ():
            return vals[0] if vals else (b"" if t == "b" else "")
        arr = np.empty(len(vals), dtype=object)
        arr[:] = vals
        return arr.reshape(shape)


class Group:
    """A group of the snapshot: links by name (soft links resolved inside the snapshot only)."""

    def __init__(self, tree: Tree, node: dict, where: str) -> None:
        self.tree, self.node, self.where = tree, node, where
        self.attrs = Attrs(tree, node.get("attrs") or {}, where)
        self.links: dict = node.get("links") or {}

    def __iter__(self):
        return iter(self.links)

    def keys(self) -> list[str]:
        return list(self.links)

    def __len__(self) -> int:
        return len(self.links)

    def __contains__(self, name: str) -> bool:
        return self.get(name) is not None

    def __getitem__(self, name: str):
        from mconv.errors import show

        obj = self.get(name)
        if obj is None:
            raise KeyError(f"no object '{show(name)}' in group '{show(self.where)}'")
        return obj

    def get(self, name: str, default=None):
        """The object at ``name`` (a link name or a relative/absolute path), or ``default``."""
        obj = self.tree.resolve(self, str(name), hops=[0])
        return default if obj is None else obj


class Tree:
    """The snapshot of one HDF5 file."""

    def __init__(self, path: str, index: dict, data: memoryview) -> None:
        self.path, self.index, self.data = path, index, data
        self.nodes: list[dict] = index["nodes"]
        self._objs: dict[int, object] = {}
        self._arrays: dict[int, np.ndarray] = {}

    @property
    def root(self) -> Group:
        return self.obj(0)

    def obj(self, i: int):
        got = self._objs.get(i)
        if got is None:
            node = self.nodes[i]
            cls = Group if node["kind"] == "group" else Dataset if node["kind"] == "dataset" else None
            got = cls(self, node, node.get("path", "?")) if cls else node
            self._objs[i] = got
        return got

    def blob(self, i: int) -> np.ndarray:
        arr = self._arrays.get(i)
        if arr is None:
            off, n, dtype, shape = self.index["blobs"][i]
            arr = np.frombuffer(self.data[off : off + n], dtype=np.dtype(dtype)).reshape(shape).copy()
            self._arrays[i] = arr
        return arr

    def resolve(self, group: Group, name: str, hops: list[int]):
        from mconv.errors import InputError, show

        cur = self.root if name.startswith("/") else group
        parts = [p for p in name.split("/") if p and p != "."]
        if len(parts) > MAX_DEPTH:
            return None
        for k, part in enumerate(parts):
            if not isinstance(cur, Group):
                return None
            link = cur.links.get(part)
            if link is None:
                return None
            kind = link[0]
            if kind == "hard":
                cur = self.obj(link[1])
            elif kind == "soft":
                hops[0] += 1
                if hops[0] > MAX_LINK_HOPS:
                    raise InputError(
                        f"soft link '{show(part)}' leads through more than {MAX_LINK_HOPS} links (a loop)",
                        path=self.path,
                        where=f"link '{show(cur.where.rstrip('/') + '/' + part)}'",
                        hint="the file is damaged or hostile",
                    )
                cur = self.resolve(cur, link[1], hops)
                if cur is None:
                    return None
            else:  # never produced: the child refuses other link kinds
                return None
            if k < len(parts) - 1 and not isinstance(cur, Group):
                return None
        return cur


def _child_limits(size: int) -> tuple[float, int]:
    return TIMEOUT_S + size / (50 << 20), int(CHILD_BASE_AS + 2 * size)


def open_tree(src: Path | bytes, label: str, skip: tuple[str, ...] = ()) -> Tree:
    """Snapshot the HDF5 file ``src`` (a path or the bytes of an archive member); errors name ``label``.

    Datasets under the top-level groups named in ``skip`` (optimizer state) are listed, not read.
    """
    from mconv.errors import InputError, show

    size = len(src) if isinstance(src, bytes) else Path(src).stat().st_size
    timeout, _ = _child_limits(size)
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
    env.update(
        HDF5_PLUGIN_PRELOAD="::",
        OPENBLAS_NUM_THREADS="1",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        PYTHONDONTWRITEBYTECODE="1",
    )
    args = [sys.executable, str(Path(__file__).resolve()), "--child", str(size), json.dumps(list(skip))]
    args.append("-" if isinstance(src, bytes) else str(Path(src)))
    try:
        proc = subprocess.run(
            args,
            input=src if isinstance(src, bytes) else b"",
            capture_output=True,
            timeout=timeout,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise InputError(
            f"libhdf5 did not finish reading the file in {timeout:.0f} s (a damaged structure makes it loop)",
            path=label,
            hint="the file is damaged or hostile",
        ) from None
    out = proc.stdout
    if proc.returncode != 0 or not out.startswith(MAGIC) or len(out) < len(MAGIC) + 8:
        why = (
            f"was killed by signal {-proc.returncode}"
            if proc.returncode < 0
            else f"failed (exit {proc.returncode})"
        )
        if b"MemoryError" in proc.stderr[-4000:]:
            why = "ran out of its memory bound"
        raise InputError(f"libhdf5 {why} reading the file", path=label, hint="the file is damaged or hostile")
    (n,) = struct.unpack_from("<Q", out, len(MAGIC))
    start = len(MAGIC) + 8
    index = json.loads(out[start : start + n])
    if not index.get("ok"):
        where, what = index.get("where"), index.get("what") or "object"
        place: str | None
        if isinstance(where, list):
            place = f"object '{show(where[0])}', attribute '{show(where[1])}'"
        else:
            place = f"{what} '{show(where)}'" if where else None
        names = [f"'{show(n)}'" for n in index.get("names") or []]
        raise InputError(
            str(index.get("message", "cannot read the file")).format(*names),
            path=label,
            where=place,
            hint=index.get("hint") or "the file is damaged or hostile",
        )
    return Tree(label, index, memoryview(out)[start + n :])


# -------------------------------------------------------------------------------- child side


class _Refuse(Exception):
    """A refusal: ``message`` may hold ``{}`` fields for ``names`` (taken from the file, shown safely
    by the parent); ``where`` is an HDF5 path, or (object path, attribute name); ``what`` its kind."""

    def __init__(
        self,
        message: str,
        where: str | tuple[str, str] | None = None,
        hint: str | None = None,
        what: str = "object",
        names: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message)
        self.message, self.hint, self.what, self.names = message, hint, what, list(names)
        self.where = list(where) if isinstance(where, tuple) else where


def _names(iterate) -> list[bytes]:
    """The names an h5py ``iterate`` visits (its callback returns None to go on)."""
    names: list[bytes] = []

    def visit(name, *_):
        names.append(name)

    iterate(visit)
    return names


def _scan_global_heaps(buf, size: int) -> None:
    """Check every global heap collection the way libhdf5 will walk it, so that its walk ends."""
    sig = b"GCOL\x01\x00\x00\x00"
    pos = buf.find(sig)
    while pos >= 0:
        if pos + 16 > size:
            raise _Refuse(f"global heap collection at byte {pos} is cut off", hint="the file is truncated")
        (csize,) = struct.unpack_from("<Q", buf, pos + 8)
        if csize < 4096 or pos + csize > size:
            raise _Refuse(
                f"global heap collection at byte {pos} claims {csize} bytes ({size - pos} left in the file)",
                hint="the file is damaged",
            )
        p, end = pos + 16, pos + csize
        while p < end:
            if p + 16 > end:
                break  # tail too small for an object header: free space
            idx, _, _, osize = struct.unpack_from("<HHIQ", buf, p)
            need = 16 + ((osize + 7) & ~7) if idx else osize
            if need <= 0 or need > end - p:
                raise _Refuse(
                    f"global heap collection at byte {pos}: object {idx} at byte {p} claims {osize} bytes",
                    hint="the file is damaged",
                )
            p += need
        pos = buf.find(sig, pos + 8)


class _Walker:
    def __init__(self, f, size: int, skip: list[str], buf) -> None:
        self.f, self.size, self.skip, self.buf = f, size, set(skip), buf
        self.nodes: list[dict] = []
        self.by_addr: dict = {}
        self.blobs: list[np.ndarray] = []
        self.stored = 0
        self.heaps_checked = False
        self.plan: list[tuple[h5py.Dataset, dict, tuple, np.dtype]] = []
        self.at: tuple[str, str | tuple[str, str]] = ("object", "/")  # for errors from libhdf5

    def walk(self) -> None:
        self._object(self.f, "/", 0, reading=True)

    def _object(self, obj, path: str, depth: int, reading: bool) -> int:
        import h5py

        addr = (obj.id.fileno, h5py.h5o.get_info(obj.id).addr)
        if addr in self.by_addr:
            return self.by_addr[addr]
        if len(self.nodes) >= MAX_OBJECTS:
            raise _Refuse(
                f"more than {MAX_OBJECTS} objects", what="group", where=path, hint="the file is hostile"
            )
        i = len(self.nodes)
        node: dict = {"path": path}
        self.at = ("object", path)
        self.nodes.append(node)
        self.by_addr[addr] = i
        node["attrs"] = self._attrs(obj, path)
        if isinstance(obj, h5py.Group):
            node["kind"] = "group"
            if depth > MAX_DEPTH:
                raise _Refuse(
                    f"groups nest deeper than {MAX_DEPTH} levels",
                    what="group",
                    where=path,
                    hint="the file is hostile",
                )
            node["links"] = self._links(obj, path, depth, reading)
        elif isinstance(obj, h5py.Dataset):
            node["kind"] = "dataset"
            self._dataset(obj, path, node, reading)
        else:
            node["kind"] = "other"
        return i

    def _links(self, g, path: str, depth: int, reading: bool) -> dict:
        import h5py

        n = g.id.get_num_objs()
        if n > self.size // 8 + 16:
            raise _Refuse(f"group claims {n} links", what="group", where=path, hint="the file is damaged")
        out = {}
        names = _names(g.id.links.iterate)
        if len(names) > n + 16:
            raise _Refuse(
                "group lists more links than it declares",
                what="group",
                where=path,
                hint="the file is damaged",
            )
        for bname in names:
            name = bname.decode("utf-8", "surrogateescape")
            sub = path.rstrip("/") + "/" + name
            info = g.id.links.get_info(bname)
            if info.type == h5py.h5l.TYPE_HARD:
                child = g[bname]
                rd = reading and not (depth == 0 and name in self.skip)
                out[name] = ["hard", self._object(child, sub, depth + 1, rd)]
            elif info.type == h5py.h5l.TYPE_SOFT:
                target = g.id.links.get_val(bname)
                out[name] = ["soft", target.decode("utf-8", "surrogateescape")]
            elif info.type == h5py.h5l.TYPE_EXTERNAL:
                fname, oname = g.id.links.get_val(bname)[:2]
                raise _Refuse(
                    "external link to file {} object {}: mconv never reads data from other files",
                    names=(fname.decode("utf-8", "replace"), oname.decode("utf-8", "replace")),
                    what="link",
                    where=sub,
                    hint="save the model again without external links",
                )
            else:
                raise _Refuse(
                    f"user-defined link (type {info.type}): only hard and soft links are read",
                    what="link",
                    where=sub,
                    hint="the file is hostile or not from Keras",
                )
        return out

    def _attrs(self, obj, path: str) -> dict:
        import h5py

        out = {}
        for bname in _names(lambda fn: h5py.h5a.iterate(obj.id, fn)):
            name = bname.decode("utf-8", "surrogateescape")
            out[name] = self._attr(obj, bname, (path, name))  # "object P, attribute N"
        return out

    def _attr(self, obj, bname: bytes, where: tuple[str, str]) -> dict:
        import h5py
        from h5py import h5s, h5t

        self.at = ("attribute", where)
        aid = h5py.h5a.open(obj.id, bname)
        tid = aid.get_type()
        space = aid.get_space()
        stype = space.get_simple_extent_type()
        if stype == h5s.NULL:
            return {"t": "x", "why": "has no value (null dataspace)"}
        shape = tuple(space.shape) if stype == h5s.SIMPLE else ()
        if len(shape) > MAX_RANK:
            raise _Refuse(f"has rank {len(shape)}", where=where, hint="the file is damaged")
        count = 1
        for d in shape:
            count *= int(d)
        cls = tid.get_class()
        vlen = cls == h5t.STRING and tid.is_variable_str()
        item = 16 if vlen else tid.get_size()
        declared = count * item
        if declared > self.size or (not vlen and declared and aid.get_storage_size() > self.size):
            raise _Refuse(
                f"declares {declared} bytes ({count} x {item}), more than the file holds ({self.size})",
                where=where,
                hint="the file is damaged",
            )
        if cls == h5t.STRING:
            if vlen and not self.heaps_checked:
                _scan_global_heaps(self.buf, self.size)
                self.heaps_checked = True
            arr = np.zeros(shape, dtype=aid.dtype)
            aid.read(arr, mtype=h5t.py_create(aid.dtype))
            flat = arr.reshape(-1).tolist()
            if all(isinstance(v, str) for v in flat):
                return {"t": "s", "v": flat, "shape": list(shape)}
            vals = [v if isinstance(v, bytes) else str(v).encode("utf-8", "surrogateescape") for v in flat]
            return {"t": "b", "v": [v.decode("latin-1") for v in vals], "shape": list(shape)}
        if cls in (h5t.INTEGER, h5t.FLOAT) and item <= 8:
            arr = np.empty(shape, dtype=aid.dtype)
            aid.read(arr)
            return {"t": "n", "blob": self._blob(arr), "shape": list(shape)}
        return {"t": "x", "why": f"has an HDF5 type of class {cls} (only numbers and strings are read)"}

    def _blob(self, arr: np.ndarray) -> int:
        self.blobs.append(np.ascontiguousarray(arr))
        return len(self.blobs) - 1

    def _dataset(self, ds, path: str, node: dict, reading: bool) -> None:
        import h5py

        dcpl = ds.id.get_create_plist()
        layout = dcpl.get_layout()
        if layout == h5py.h5d.VIRTUAL:
            raise _Refuse(
                "virtual dataset (its data lives in other files): mconv never reads data from other files",
                what="dataset",
                where=path,
                hint="save the model again with plain datasets",
            )
        if dcpl.get_external_count() > 0:
            name = dcpl.get_external(0)[0].decode("utf-8", "replace")
            raise _Refuse(
                "stored in external file {}: mconv never reads data from other files",
                names=(name,),
                what="dataset",
                where=path,
                hint="save the model again with plain datasets",
            )
        filters = []
        for k in range(dcpl.get_nfilters()):
            code = dcpl.get_filter(k)[0]
            if code not in ALLOWED_FILTERS or not h5py.h5z.filter_avail(code):
                raise _Refuse(
                    f"uses HDF5 filter {code}, not one of the built-in ones "
                    f"({', '.join(ALLOWED_FILTERS.values())})",
                    what="dataset",
                    where=path,
                    hint="mconv loads no HDF5 filter plugins; save the weights uncompressed or with gzip",
                )
            filters.append(code)
        shape = tuple(int(d) for d in (ds.shape or ()))
        if len(shape) > MAX_RANK:
            raise _Refuse(f"has rank {len(shape)}", what="dataset", where=path, hint="the file is damaged")
        node["shape"] = list(shape)
        dt = ds.dtype
        node["dtype"] = dt.str
        count = 1
        for d in shape:
            count *= d
        if dt.kind not in "fiub" or dt.itemsize > 8 or dt.fields is not None or dt.subdtype is not None:
            node["unread"] = f"has dtype {dt}, expected numbers"
            return
        nbytes = count * dt.itemsize
        stored = ds.id.get_storage_size()
        if stored > self.size:
            raise _Refuse(
                f"claims {stored} stored bytes, more than the file holds ({self.size})",
                what="dataset",
                where=path,
                hint="the file is truncated or damaged",
            )
        if filters:
            if nbytes > max(stored, 1) * MAX_RATIO:
                raise _Refuse(
                    f"expands {stored} stored bytes to {nbytes} (more than {MAX_RATIO} x)",
                    what="dataset",
                    where=path,
                    hint="the file is damaged or a decompression bomb",
                )
        else:
            if nbytes > self.size:
                raise _Refuse(
                    f"declares {nbytes} bytes, more than the file holds ({self.size})",
                    what="dataset",
                    where=path,
                    hint="the file is truncated or damaged",
                )
            if stored < nbytes:
                raise _Refuse(
                    f"stores {stored} of its {nbytes} bytes (never written)",
                    what="dataset",
                    where=path,
                    hint="the file is damaged or was not saved completely",
                )
            if layout == h5py.h5d.CONTIGUOUS:
                off = ds.id.get_offset()
                if off is None or off + nbytes > self.size:
                    raise _Refuse(
                        f"data at byte {off} runs past the end of the file ({self.size})",
                        what="dataset",
                        where=path,
                        hint="the file is truncated or damaged",
                    )
        self.stored += stored
        if self.stored > self.size:
            raise _Refuse(
                f"datasets store {self.stored} bytes in all, more than the file holds ({self.size}): "
                "their storage overlaps",
                what="dataset",
                where=path,
                hint="the file is damaged or hostile",
            )
        if reading:
            self.plan.append((ds, node, shape, dt))

    def read(self) -> None:
        for ds, node, shape, dt in self.plan:
            self.at = ("dataset", node["path"])
            arr = np.empty(shape, dtype=dt)
            if arr.size:
                ds.read_direct(arr)
            node["blob"] = self._blob(arr)


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0][:160] if text.strip() else "(no message)"


def _vm_bytes() -> int | None:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _set_as(limit: int) -> None:
    try:
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ImportError, ValueError, OSError):
        pass


def _child(argv: list[str]) -> int:
    size, skip, src = int(argv[0]), json.loads(argv[1]), argv[2]
    timeout, _ = _child_limits(size)
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CPU, (int(timeout) + 1, int(timeout) + 2))
    except (ImportError, ValueError, OSError):
        pass
    import io
    import mmap

    import h5py

    fobj: io.BytesIO | str
    if src == "-":
        data = sys.stdin.buffer.read(size + 1)
        if len(data) != size:
            raise SystemExit(4)
        buf = data
        fobj = io.BytesIO(data)
    else:
        fh = open(src, "rb")  # noqa: SIM115 - kept open for the child's life
        buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        if len(buf) != size:
            raise SystemExit(4)
        fobj = src
    base = _vm_bytes()
    if base is not None:
        _set_as(base + CHILD_BASE_AS + 2 * size)
    try:
        try:
            f = h5py.File(fobj, "r", locking=False) if src != "-" else h5py.File(fobj, "r")
        except (OSError, ValueError, RuntimeError) as exc:
            raise _Refuse(
                f"cannot open as HDF5: {_first_line(exc)}",
                hint="the file is truncated, damaged, or not HDF5",
            ) from None
        w = _Walker(f, size, skip, buf)
        try:
            w.walk()
        except (OSError, KeyError, ValueError, TypeError, RuntimeError, IndexError, UnicodeError) as exc:
            raise _Refuse(
                f"cannot read HDF5 structure: {type(exc).__name__}: {_first_line(exc)}",
                what=w.at[0],
                where=w.at[1],
                hint="the file is damaged",
            ) from None
        planned = sum(int(np.prod(s, dtype=np.float64)) * dt.itemsize for _, _, s, dt in w.plan)
        if base is not None:
            _set_as(base + CHILD_BASE_AS + 2 * size + 2 * planned)
        try:
            w.read()
        except (OSError, ValueError, TypeError, RuntimeError) as exc:
            raise _Refuse(
                f"cannot read data: {type(exc).__name__}: {_first_line(exc)}",
                what=w.at[0],
                where=w.at[1],
                hint="the file is damaged",
            ) from None
        blobs, off = [], 0
        for arr in w.blobs:
            blobs.append([off, arr.nbytes, arr.dtype.str, list(arr.shape)])
            off += arr.nbytes
        index = {"ok": True, "nodes": w.nodes, "blobs": blobs}
        payload = w.blobs
    except _Refuse as exc:
        index = {
            "ok": False,
            "message": exc.message,
            "names": exc.names,
            "where": exc.where,
            "what": exc.what,
            "hint": exc.hint,
        }
        payload = []
    head = json.dumps(index).encode("utf-8")
    out = sys.stdout.buffer
    out.write(MAGIC + struct.pack("<Q", len(head)) + head)
    for arr in payload:
        out.write(arr.data.cast("B") if arr.nbytes else b"")
    out.flush()
    return 0


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--child":
    sys.exit(_child(sys.argv[2:]))
