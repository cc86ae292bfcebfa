"""Keras importer: whole-model HDF5, architecture JSON + weights HDF5, and Keras 3 ``.keras`` zips.

No TensorFlow and no Keras at import time: the config is JSON, the weights are HDF5 (h5py).

Rules:

1. Files. ``model.h5`` with a ``model_config`` attribute is a whole model (Keras 2 / tf.keras, or
   Keras 3's legacy HDF5). ``model.json`` + ``weights.h5`` (either order) is the split form.
   ``model.keras`` is a zip holding ``config.json`` and ``model.weights.h5``. A weights-only
   ``.h5`` given alone is refused with a hint to pass the JSON too.
2. Weight layouts. Legacy HDF5: one group per layer with a ``weight_names`` attribute that lists
   the layer's arrays in order (a nested model's group lists all of its layers' arrays, each name
   holding the inner layer's name). Keras 3: ``layers/<key>/vars/0..n`` where ``vars`` carries the
   layer's name as attribute ``name``; sub-objects (``cell``, ``layer``, ``forward_layer``,
   ``backward_layer``) follow the layer's own vars.
3. Keras version matters for ``hard_sigmoid`` (Keras 2: ``0.2x + 0.5``; Keras 3: ``relu6(x+3)/6``).
4. Nothing from the file is executed: ``Lambda`` layers are refused, custom objects are unknown
   layers, and every unknown layer is named in one ``UnsupportedError``.
5. Hostile files fail with ``InputError`` naming the file and the layer, member or HDF5 path:
   bounded JSON depth and size, bounded model nesting. HDF5 is read by ``_hdf5_safe`` in a child
   process under CPU, memory and wall-clock limits (libhdf5 can loop or allocate gigabytes on one
   damaged byte); nothing from other files (external links, external storage, virtual datasets),
   no filter plugins, sizes of attributes and datasets checked before reading. ``.keras`` zips
   are checked from the central directory before inflating (names, duplicates, encryption,
   disks, every member's ratio, the total against the archive's size) and inflate at most the
   declared sizes.
"""

from __future__ import annotations

import json
import re
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from mconv.errors import InputError, UnsupportedError, show
from mconv.formats import Format
from mconv.formats.keras.layers import (
    LAYERS,
    GraphBuilder,
    KTensor,
    LayerCall,
    WeightList,
    known_layer,
)
from mconv.irio import from_proto
from onnx import TensorProto, helper

OPSET = 21
HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
ZIP_MAGIC = b"PK\x03\x04"
MAX_JSON_BYTES = 64 << 20
MAX_JSON_DEPTH = 200
MAX_MODEL_NESTING = 16
MAX_ZIP_MEMBER = 4 << 30
MAX_ZIP_RATIO = 200  # declared uncompressed / compressed; HDF5 of random floats barely compresses
MAX_ZIP_MEMBERS = 64
MIN_ZIP_TOTAL = 64 << 10  # a tiny archive may still declare this much in all
MAX_WEIGHT_GROUPS = 4096  # groups under one Keras 3 layer (cell, forward_layer, ...)

# h5py raises many exception types on corrupt files; all of them mean "bad input" here.
_H5_ERRORS = (
    OSError,
    KeyError,
    ValueError,
    TypeError,
    RuntimeError,
    IndexError,
    AttributeError,
    UnicodeDecodeError,
    AssertionError,
)

_IGNORED_CALL_KWARGS = {"training", "mask"}


# ------------------------------------------------------------------------------------------ files


def _json_depth_ok(text: str) -> bool:
    depth = 0
    in_str = esc = False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return False
        elif ch in "]}":
            depth -= 1
    return True


def _parse_json(data: bytes | str, path: str, where: str) -> dict:
    if len(data) > MAX_JSON_BYTES:
        raise InputError(
            f"JSON of {len(data)} bytes is over the {MAX_JSON_BYTES} byte limit",
            path=path,
            where=where,
            hint="this is not a Keras model config",
        )
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise InputError(
            f"not UTF-8 text (byte {exc.start})",
            path=path,
            where=where,
            hint="expected a Keras model config in JSON",
        ) from None
    if not _json_depth_ok(text):
        raise InputError(
            f"JSON nests deeper than {MAX_JSON_DEPTH} levels",
            path=path,
            where=where,
            hint="this is not a Keras model config",
        )
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise InputError(
            f"invalid JSON: {getattr(exc, 'msg', exc)} at char {getattr(exc, 'pos', '?')}",
            path=path,
            where=where,
            hint="expected a Keras model config in JSON",
        ) from None
    if not isinstance(obj, dict) or not isinstance(obj.get("class_name"), str) or "config" not in obj:
        raise InputError(
            "JSON is not a Keras model config (no class_name/config)",
            path=path,
            where=where,
            hint="give the file written by model.to_json() or the model's .h5/.keras",
        )
    return obj


def _check_dataset(ds, file_size: int, path: str, where: str) -> np.ndarray:
    """The array of a weight dataset; the HDF5 snapshot has checked its storage and size already."""
    from mconv.formats._hdf5_safe import Dataset

    if not isinstance(ds, Dataset):
        raise InputError(
            "weight entry is not an HDF5 dataset", path=path, where=where, hint="the weights file is damaged"
        )
    arr = ds.array()
    if arr.dtype.kind not in "fiu" or arr.dtype.itemsize > 8:
        raise InputError(
            f"weight has dtype {arr.dtype}, expected numbers",
            path=path,
            where=where,
            hint="the weights file is damaged",
        )
    if arr.ndim > 8:
        raise InputError(
            f"weight has absurd shape {arr.shape}", path=path, where=where, hint="the weights file is damaged"
        )
    return arr


class _LegacyWeights:
    """Keras 2 / tf.keras layout: a group per layer with ``weight_names``."""

    def __init__(self, root, path: str, file_size: int, names: list[str] | None = None) -> None:
        self.root, self.path, self.file_size, self.names = root, path, file_size, names

    def _names(self, group) -> list[str]:
        raw = group.attrs.get("weight_names", [])
        return [n.decode("utf-8") if isinstance(n, bytes) else str(n) for n in np.asarray(raw).reshape(-1)]

    def layer(self, name: str) -> list[np.ndarray] | None:
        if self.names is None:
            if name not in self.root:
                return None
            group = self.root[name]
            names = self._names(group)
        else:
            group = self.root
            names = [n for n in self.names if name in n.split("/")[:-1]]
        out = []
        for n in names:
            where = f"layer '{show(name)}', weight '{show(n)}'"
            ds = group.get(n)
            if ds is None:
                raise InputError(
                    "weight listed in weight_names is not in the file (or is a dangling link)",
                    path=self.path,
                    where=where,
                    hint="the weights file is damaged",
                )
            out.append(_check_dataset(ds, self.file_size, self.path, where))
        return out

    def sub(self, name: str) -> _LegacyWeights:
        if self.names is None:
            if name not in self.root:
                return _LegacyWeights(self.root, self.path, self.file_size, [])
            group = self.root[name]
            return _LegacyWeights(group, self.path, self.file_size, self._names(group))
        return _LegacyWeights(
            self.root, self.path, self.file_size, [n for n in self.names if name in n.split("/")[:-1]]
        )


_CHILD_ORDER = ("cell", "layer", "forward_layer", "backward_layer")


class _Keras3Weights:
    """Keras 3 layout: ``layers/<key>/vars/<i>``; ``vars`` carries the layer name as attribute."""

    def __init__(self, group, path: str, file_size: int, layer_order: list[tuple[str, str]]) -> None:
        from mconv.formats._hdf5_safe import Group

        self.group, self.path, self.file_size = group, path, file_size
        self.by_name: dict[str, object] = {}
        layers = group.get("layers") if isinstance(group, Group) else None
        if isinstance(layers, Group):
            unnamed = []
            for key in layers:
                g = layers.get(key)
                vars_ = g.get("vars") if isinstance(g, Group) else None
                nm = vars_.attrs.get("name") if vars_ is not None else None
                if isinstance(nm, bytes):
                    nm = nm.decode("utf-8")
                if isinstance(nm, str):
                    self.by_name[nm] = g
                else:
                    unnamed.append(key)
            if unnamed:  # older Keras 3 files: keys are snake_case class names, numbered in order
                counts: dict[str, int] = {}
                for lname, cls in layer_order:
                    base = re.sub(r"(?<!^)(?=[A-Z])", "_", cls).lower()
                    i = counts.get(base, 0)
                    counts[base] = i + 1
                    key = base if i == 0 else f"{base}_{i}"
                    if key in layers and lname not in self.by_name:
                        self.by_name[lname] = layers[key]

    def _collect(self, g, where: str, seen: set | None = None) -> list[np.ndarray]:
        from mconv.formats._hdf5_safe import Group

        seen = set() if seen is None else seen
        if id(g) in seen or len(seen) > MAX_WEIGHT_GROUPS:  # hard links can make the tree a cyclic graph
            raise InputError(
                "layer's weight groups link back into themselves or are too many",
                path=self.path,
                where=where,
                hint="the weights file is damaged or hostile",
            )
        seen.add(id(g))
        out = []
        vars_ = g.get("vars")
        if isinstance(vars_, Group):
            keys = sorted((k for k in vars_ if k.isdigit()), key=int)
            out += [_check_dataset(vars_[k], self.file_size, self.path, f"{where}, var {k}") for k in keys]
        children = [k for k in g if k not in ("vars", "layers") and isinstance(g.get(k), Group)]
        children.sort(key=lambda k: (_CHILD_ORDER.index(k) if k in _CHILD_ORDER else 99, k))
        for k in children:
            out += self._collect(g[k], where, seen)
        return out

    def layer(self, name: str) -> list[np.ndarray] | None:
        g = self.by_name.get(name)
        return None if g is None else self._collect(g, f"layer '{show(name)}'")

    def sub(self, name: str, layer_order: list[tuple[str, str]]) -> _Keras3Weights:
        g = self.by_name.get(name)
        return _Keras3Weights(g if g is not None else {}, self.path, self.file_size, layer_order)


def _open_h5(data: bytes | Path, path: str):
    """The root group of a checked snapshot of the HDF5 file (see ``_hdf5_safe``)."""
    from mconv.formats._hdf5_safe import open_tree

    return open_tree(data, path, skip=("optimizer_weights", "optimizer")).root


def _zip_refuse(path: str, name: str, msg: str, hint: str = "the file is hostile or damaged") -> InputError:
    return InputError(msg, path=path, where=f"member '{show(name)}'", hint=hint)


def _check_zip_members(infos: list[zipfile.ZipInfo], path: str, archive_size: int) -> None:
    """Refuse hostile entries from the central directory alone, before anything is inflated."""
    if len(infos) > MAX_ZIP_MEMBERS:
        raise InputError(
            f"zip holds {len(infos)} members (limit {MAX_ZIP_MEMBERS})",
            path=path,
            hint="this is not a Keras 3 model file",
        )
    seen: set[str] = set()
    total = 0
    for info in infos:
        n = info.filename
        if n.startswith(("/", "\\")) or ".." in re.split(r"[/\\]", n) or re.match(r"^[A-Za-z]:", n):
            raise _zip_refuse(
                path,
                n,
                "zip member name escapes the archive",
                "refusing a path-traversal entry; the file is hostile or damaged",
            )
        if n in seen:
            raise _zip_refuse(
                path, n, "zip holds two members of this name", "a .keras file names each member once"
            )
        seen.add(n)
        if info.flag_bits & 0x1:
            raise _zip_refuse(path, n, "zip member is encrypted", "a .keras file is never encrypted")
        if info.volume != 0:
            raise _zip_refuse(path, n, f"zip member starts on disk {info.volume} (multi-disk archive)")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise _zip_refuse(
                path,
                n,
                f"zip member uses compression method {info.compress_type}",
                "Keras writes stored or deflated members",
            )
        if info.compress_size > archive_size:
            raise _zip_refuse(
                path,
                n,
                f"member claims {info.compress_size} compressed bytes, more than the archive holds ({archive_size})",
            )
        if info.file_size > MAX_ZIP_MEMBER or info.file_size > info.compress_size * MAX_ZIP_RATIO + 4096:
            raise _zip_refuse(
                path,
                n,
                f"member declares {info.file_size} bytes from {info.compress_size} compressed (zip bomb limit)",
            )
        total += info.file_size
    limit = max(MIN_ZIP_TOTAL, MAX_ZIP_RATIO * archive_size)
    if total > limit:
        raise InputError(
            f"zip members declare {total} bytes in all from a {archive_size} byte archive "
            f"(limit {limit}: zip bomb)",
            path=path,
            hint="the file is hostile or damaged",
        )


def _check_zip_end(p: Path, path: str) -> None:
    """Refuse multi-disk archives from the end-of-central-directory record (zipfile does not)."""
    size = p.stat().st_size
    with open(p, "rb") as f:
        f.seek(max(0, size - (22 + 0xFFFF)))
        tail = f.read(22 + 0xFFFF)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or at + 22 > len(tail):
        return  # zipfile reports it
    disk, cd_disk, here, total = struct.unpack_from("<HHHH", tail, at + 4)
    if disk != 0 or cd_disk != 0 or here != total:
        raise InputError(
            f"zip spans several disks (disk {disk}, central directory on disk {cd_disk})",
            path=path,
            hint="a .keras file is one archive",
        )


def _read_zip(p: Path) -> tuple[dict, bytes]:
    path = str(p)
    _check_zip_end(p, path)
    try:
        zf = zipfile.ZipFile(p)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as exc:
        raise InputError(
            f"not a readable zip: {exc}", path=path, hint="a .keras file is a zip archive"
        ) from None
    with zf:
        infos = zf.infolist()
        _check_zip_members(infos, path, p.stat().st_size)
        names = {i.filename for i in infos}
        for need in ("config.json", "model.weights.h5"):
            if need not in names:
                raise InputError(
                    f"zip has no '{need}'",
                    path=path,
                    where=f"member '{need}'",
                    hint="a .keras file holds config.json and model.weights.h5",
                )
        try:
            config = _parse_json(_read_member(zf, "config.json"), path, "member 'config.json'")
            weights = _read_member(zf, "model.weights.h5")
        except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, zlib.error) as exc:
            raise InputError(f"cannot read member: {exc}", path=path, hint="the zip is damaged") from None
    return config, weights


def _read_member(zf: zipfile.ZipFile, name: str) -> bytes:
    info = zf.getinfo(name)
    with zf.open(info) as f:
        # inflates at most the declared size (+1 to notice a central directory that lies)
        data = f.read(info.file_size + 1)
    if len(data) != info.file_size:
        raise zipfile.BadZipFile(f"member '{name}' is not the size its header declares")
    return data


@dataclass
class _Source:
    config: dict
    weights: object | None  # _LegacyWeights / _Keras3Weights / None
    keras3: bool
    path: str  # the file named in errors about weights
    config_path: str  # the file named in errors about the architecture


def _is_keras3_config(cfg: dict) -> bool:
    text = json.dumps(cfg)[:200000]
    return '"module": "keras' in text or '"batch_shape"' in text or '"__keras_tensor__"' in text


def _version_major(v) -> int | None:
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    m = re.match(r"\s*(\d+)", str(v)) if v is not None else None
    return int(m.group(1)) if m else None


def _kind(p: Path) -> str:
    with open(p, "rb") as f:
        head = f.read(8)
    if head.startswith(ZIP_MAGIC):
        return "zip"
    if head == HDF5_MAGIC:
        return "h5"
    if p.suffix.lower() in (".keras",):
        return "zip"
    if p.suffix.lower() in (".h5", ".hdf5"):
        return "h5"
    return "json"


def _weights_from_h5(f, path: str, file_size: int, root=None):
    g = root if root is not None else f
    if "layer_names" in g.attrs:
        return _LegacyWeights(g, path, file_size), _version_major(g.attrs.get("keras_version"))
    if "layers" in g or "vars" in g:
        return "keras3", 3
    raise InputError(
        "HDF5 file holds no Keras weights (no layer_names attribute, no layers group)",
        path=path,
        hint="give the weights file saved by Keras",
    )


def _open_sources(paths: list[Path], handles: list) -> _Source:
    """Classify the files and read the config; open HDF5 handles go to ``handles`` (closed by the caller)."""
    kinds = [(p, _kind(p)) for p in paths]
    if len(paths) == 1:
        p, k = kinds[0]
        if k == "zip":
            config, wbytes = _read_zip(p)
            f = _open_h5(wbytes, f"{p}:model.weights.h5")
            return _Source(config, ("keras3", f, len(wbytes)), True, f"{p}:model.weights.h5", str(p))
        if k == "json":
            raise InputError(
                "architecture JSON given without its weights",
                path=str(p),
                hint="pass the weights .h5 too: mconv import model.json weights.h5",
            )
        f = _open_h5(p, str(p))
        try:
            raw = f.attrs.get("model_config")
        except _H5_ERRORS:
            raw = None
        if raw is None:
            raise InputError(
                "HDF5 file holds weights only (no model_config attribute)",
                path=str(p),
                hint="pass the architecture JSON too: mconv import model.json weights.h5",
            )
        config = _parse_json(
            raw if isinstance(raw, bytes | str) else bytes(raw), str(p), "attribute 'model_config'"
        )
        try:
            root = f["model_weights"]
        except _H5_ERRORS:
            raise InputError(
                "whole-model HDF5 has no 'model_weights' group",
                path=str(p),
                hint="the file is damaged or was saved without weights",
            ) from None
        w, ver = _weights_from_h5(f, str(p), p.stat().st_size, root)
        ver = _version_major(f.attrs.get("keras_version")) or ver
        keras3 = (ver or 0) >= 3 or (ver is None and _is_keras3_config(config))
        if w == "keras3":
            w = ("keras3", root, p.stat().st_size)
        return _Source(config, w, keras3, str(p), str(p))
    jsons = [p for p, k in kinds if k == "json"]
    h5s = [p for p, k in kinds if k == "h5"]
    if len(paths) != 2 or len(jsons) != 1 or len(h5s) != 1:
        raise InputError(
            "expected one architecture .json and one weights .h5",
            path=", ".join(map(str, paths)),
            hint="mconv import model.json weights.h5",
        )
    jp, hp = jsons[0], h5s[0]
    if jp.stat().st_size > MAX_JSON_BYTES:
        raise InputError("JSON over the size limit", path=str(jp), hint="this is not a Keras model config")
    config = _parse_json(jp.read_bytes(), str(jp), "top level")
    f = _open_h5(hp, str(hp))
    try:
        root = f["model_weights"] if "model_weights" in f else f
        w, ver = _weights_from_h5(f, str(hp), hp.stat().st_size, root)
    except InputError:
        raise
    except _H5_ERRORS as exc:
        raise InputError(
            f"cannot read HDF5 structure: {exc}", path=str(hp), hint="the file is damaged"
        ) from None
    if w == "keras3":
        w = ("keras3", root, hp.stat().st_size)
    jver = _version_major(config.get("keras_version"))
    ver = jver or ver
    keras3 = (ver or 0) >= 3 or (ver is None and _is_keras3_config(config))
    return _Source(config, w, keras3, str(hp), str(jp))


# ------------------------------------------------------------------------------------------ graph


_MODEL_CLASSES = {"Sequential", "Functional", "Model"}


def _config(obj: dict) -> dict:
    """A layer's or model's ``config`` entry; ``{}`` when it is missing or not an object."""
    cfg = obj.get("config")
    return cfg if isinstance(cfg, dict) else {}


class _Importer:
    def __init__(self, src: _Source) -> None:
        self.src = src
        self.b = GraphBuilder()
        self.unsupported: list[tuple[str, str]] = []
        self.graph_inputs: list[onnx.ValueInfoProto] = []
        self.calls: dict[str, int] = {}  # layer path -> number of calls so far (shared layers)

    def fail(self, msg: str, where: str | None = None, hint: str | None = None) -> InputError:
        return InputError(
            msg,
            path=self.src.config_path,
            where=where,
            hint=hint or "the model config is not a valid Keras model",
        )

    # -- scanning: collect every unsupported layer before building anything
    def scan(self, model: dict, depth: int = 0) -> None:
        if depth > MAX_MODEL_NESTING:
            raise self.fail(
                f"models nest deeper than {MAX_MODEL_NESTING} levels", hint="refusing a hostile config"
            )
        for lay in self._layers(model):
            cls = lay.get("class_name")
            cfg = _config(lay)
            name = str(cfg.get("name", lay.get("name", "?")))
            if cls in _MODEL_CLASSES:
                self.scan(lay, depth + 1)
            elif cls == "Lambda":
                raise InputError(
                    f"Lambda layer '{name}' holds Python code; mconv never executes code from a model file",
                    path=self.src.config_path,
                    where=f"layer '{show(name)}'",
                    hint="replace the Lambda with standard layers and save the model again",
                )
            elif cls != "InputLayer" and not known_layer(str(cls), lay):
                self.unsupported.append((name, str(cls)))

    def _layers(self, model: dict) -> list[dict]:
        cfg = model.get("config")
        layers = cfg if isinstance(cfg, list) else (cfg.get("layers") if isinstance(cfg, dict) else None)
        if not isinstance(layers, list) or not all(isinstance(x, dict) for x in layers):
            raise self.fail(f"model '{self._name(model)}' has no list of layers")
        return layers

    def _name(self, model: dict) -> str:
        cfg = model.get("config")
        return str(cfg.get("name", "model")) if isinstance(cfg, dict) else "model"

    # -- building
    def build_top(self, model: dict) -> tuple[list[KTensor], list[str]]:
        return self.build(model, None, self.src.weights, prefix="", depth=0)

    def _input_spec(self, cfg: dict, where: str) -> tuple[tuple, int]:
        shape = cfg.get("batch_shape", cfg.get("batch_input_shape"))
        if shape is None and cfg.get("input_shape") is not None:
            shape = [None, *cfg["input_shape"]]
        if (
            not isinstance(shape, list)
            or not shape
            or len(shape) > 8
            or not all(v is None or (isinstance(v, int) and 0 <= v < 1 << 31) for v in shape)
        ):
            raise self.fail(
                f"input shape {shape!r} is not a list of sizes",
                where=where,
                hint="the model needs a declared input shape",
            )
        dtype = cfg.get("dtype", "float32")
        if isinstance(dtype, dict):
            dtype = (dtype.get("config") or {}).get("name", "float32")
        onnx_dtype = {
            "float32": TensorProto.FLOAT,
            "float16": TensorProto.FLOAT,
            "float64": TensorProto.FLOAT,
            "int32": TensorProto.INT32,
            "int64": TensorProto.INT64,
            "uint8": TensorProto.INT32,
            "mixed_float16": TensorProto.FLOAT,
        }.get(str(dtype), TensorProto.FLOAT)
        return tuple(shape), onnx_dtype

    def _graph_input(self, name: str, shape: tuple, dtype: int) -> KTensor:
        vname = self.b.unique(name)
        dims = [
            "batch" if i == 0 and d is None else (f"{name}_dim{i}" if d is None else d)
            for i, d in enumerate(shape)
        ]
        self.graph_inputs.append(helper.make_tensor_value_info(vname, dtype, dims))
        return KTensor(vname, shape, False, dtype)

    def _weights_for(self, wsrc, name: str, where: str) -> list[np.ndarray]:
        if wsrc is None:
            return []
        try:
            arrays = wsrc.layer(name)
        except InputError:
            raise
        except _H5_ERRORS as exc:
            raise InputError(
                f"cannot read weights: {str(exc).splitlines()[0][:120]}",
                path=self.src.path,
                where=where,
                hint="the weights file is damaged",
            ) from None
        return arrays if arrays is not None else []

    def _sub_weights(self, wsrc, name: str, model: dict):
        if wsrc is None:
            return None
        try:
            if isinstance(wsrc, _Keras3Weights):
                return wsrc.sub(name, self._order(model))
            return wsrc.sub(name)
        except _H5_ERRORS as exc:
            raise InputError(
                f"cannot read weights: {exc}",
                path=self.src.path,
                where=f"model '{show(name)}'",
                hint="the weights file is damaged",
            ) from None

    def _order(self, model: dict) -> list[tuple[str, str]]:
        out = []
        for lay in self._layers(model):
            cfg = _config(lay)
            out.append((str(cfg.get("name", lay.get("name"))), str(lay.get("class_name"))))
        return out

    def _needs_weights(self, cls: str, cfg: dict) -> bool:
        if cls in ("Normalization",):
            return cfg.get("mean") is None
        return cls in (
            "Dense",
            "Conv1D",
            "Conv2D",
            "Conv3D",
            "Convolution1D",
            "Convolution2D",
            "Convolution3D",
            "DepthwiseConv2D",
            "DepthwiseConv1D",
            "SeparableConv2D",
            "SeparableConv1D",
            "Conv2DTranspose",
            "Conv1DTranspose",
            "Conv3DTranspose",
            "BatchNormalization",
            "LayerNormalization",
            "Embedding",
            "LSTM",
            "GRU",
            "SimpleRNN",
            "Bidirectional",
            "TimeDistributed",
            "CuDNNLSTM",
            "CuDNNGRU",
        )

    def call_layer(self, lay: dict, inputs: list[KTensor], wsrc, prefix: str, depth: int) -> list[KTensor]:
        cls = str(lay.get("class_name"))
        cfg = _config(lay)
        lname = str(cfg.get("name", lay.get("name", "?")))
        key = prefix + lname
        n = self.calls.get(key, 0)
        self.calls[key] = n + 1
        call_name = key if n == 0 else f"{key}_{n}"
        if cls in _MODEL_CLASSES:
            sub = self._sub_weights(wsrc, lname, lay)
            outs, _ = self.build(lay, inputs, sub, prefix=f"{call_name}/", depth=depth + 1)
            return outs
        if cls == "InputLayer":
            return inputs
        arrays = self._weights_for(wsrc, lname, f"layer '{lname}'")
        if wsrc is not None and not arrays and self._needs_weights(cls, cfg):
            raise InputError(
                "weights file has no weights for this layer",
                path=self.src.path,
                where=f"layer '{lname}' ({cls})",
                hint="the weights file does not belong to this architecture",
            )
        call = LayerCall(
            self.b,
            call_name,
            key,
            cls,
            cfg,
            WeightList(arrays, key, self.src.path),
            self.src.keras3,
            self.src.config_path,
        )
        n_before = len(self.b.nodes)
        try:
            outs = LAYERS[cls](call, inputs)
        except InputError:
            raise
        except (
            KeyError,
            TypeError,
            ValueError,
            IndexError,
            AttributeError,
            ZeroDivisionError,
            OverflowError,
        ) as exc:
            raise InputError(
                f"config cannot be read: {type(exc).__name__}: {exc}",
                path=self.src.config_path,
                where=f"layer '{lname}' ({cls})",
                hint="the model config is damaged",
            ) from None
        # name the layer's outputs after the layer
        made = {v for node in self.b.nodes[n_before:] for v in node.output}
        for i, t in enumerate(outs):
            want = call_name if len(outs) == 1 else f"{call_name}/output_{i}"
            if t.name not in made or t.name == want or t.name in self.b.other_layout:
                continue
            if want in made:  # the main node's value holds the name: it becomes a helper value
                self.b.names.discard(want)
                self.b.rename(want, self.b.fresh(f"{want}/pre_activation"))
                made.discard(want)
            if want not in self.b.names:
                self.b.names.discard(t.name)
                outs[i] = KTensor(self.b.rename(t.name, want), t.shape, t.cf, t.dtype)
        return outs

    def build(
        self, model: dict, inputs: list[KTensor] | None, wsrc, prefix: str, depth: int
    ) -> tuple[list[KTensor], list[str]]:
        if depth > MAX_MODEL_NESTING:
            raise self.fail(f"models nest deeper than {MAX_MODEL_NESTING} levels")
        layers = self._layers(model)
        cfg = _config(model)
        if model.get("class_name") == "Sequential":
            return self._build_sequential(layers, cfg, inputs, wsrc, prefix, depth)
        return self._build_functional(layers, cfg, inputs, wsrc, prefix, depth)

    def _build_sequential(self, layers, cfg, inputs, wsrc, prefix, depth):
        if not layers:
            raise self.fail("Sequential model has no layers")
        first_cfg = _config(layers[0])
        names = []
        if inputs is None:
            spec_cfg = first_cfg
            if layers[0].get("class_name") != "InputLayer" and not (
                "batch_input_shape" in first_cfg or "batch_shape" in first_cfg
            ):
                shape = cfg.get("build_input_shape")
                if shape is None:
                    raise self.fail(
                        "Sequential model declares no input shape",
                        where=f"layer '{first_cfg.get('name')}'",
                        hint="build the model with an Input first",
                    )
                spec_cfg = {"batch_input_shape": shape, "dtype": first_cfg.get("dtype")}
            shape, dtype = self._input_spec(spec_cfg, f"layer '{first_cfg.get('name')}'")
            in_name = (
                first_cfg.get("name")
                if layers[0].get("class_name") == "InputLayer"
                else f"{first_cfg.get('name')}_input"
            )
            inputs = [self._graph_input(prefix + str(in_name), shape, dtype)]
            names = [inputs[0].name]
        x = inputs
        for lay in layers:
            if len(x) != 1:
                raise self.fail("a Sequential layer got several tensors", where=f"layer '{lay.get('name')}'")
            x = self.call_layer(lay, x, wsrc, prefix, depth)
        return x, names

    def _build_functional(self, layers, cfg, inputs, wsrc, prefix, depth):
        by_name = {}
        for lay in layers:
            lcfg = _config(lay)
            by_name[str(lay.get("name", lcfg.get("name")))] = lay
        in_refs = _refs(cfg.get("input_layers"))
        out_refs = _refs(cfg.get("output_layers"))
        if not in_refs or not out_refs:
            raise self.fail(f"functional model '{cfg.get('name')}' lists no inputs or outputs")
        tensors: dict[tuple[str, int, int], KTensor] = {}
        names = []
        if inputs is not None and len(inputs) != len(in_refs):
            raise self.fail(f"model '{cfg.get('name')}' takes {len(in_refs)} input(s), got {len(inputs)}")
        for i, ref in enumerate(in_refs):
            lay = by_name.get(ref[0])
            if lay is None:
                raise self.fail(f"input layer '{ref[0]}' is not among the layers")
            if inputs is None:
                shape, dtype = self._input_spec(lay.get("config") or {}, f"layer '{ref[0]}'")
                t = self._graph_input(prefix + ref[0], shape, dtype)
                names.append(t.name)
            else:
                t = inputs[i]
            tensors[(ref[0], 0, 0)] = t
        pending = []
        for lay in layers:
            if lay.get("class_name") == "InputLayer":
                continue
            nodes = lay.get("inbound_nodes") or []
            if not isinstance(nodes, list):
                raise self.fail("inbound_nodes is not a list", where=f"layer '{lay.get('name')}'")
            for k, node in enumerate(nodes):
                refs = _node_inputs(node, self, lay)
                for r in refs:
                    if r[0].startswith(_CONST_REF) and r not in tensors:  # a 0-d float constant
                        value = np.float32(float(r[0][len(_CONST_REF) :]))
                        tensors[r] = KTensor(self.b.f32(f"{prefix}{lay.get('name')}/const", value), ())
                pending.append((lay, k, refs))
        progress = True
        while pending and progress:
            progress = False
            rest = []
            for lay, k, refs in pending:
                if all(r in tensors for r in refs):
                    outs = self.call_layer(lay, [tensors[r] for r in refs], wsrc, prefix, depth)
                    lname = str(lay.get("name", (lay.get("config") or {}).get("name")))
                    for j, t in enumerate(outs):
                        tensors[(lname, k, j)] = t
                    progress = True
                else:
                    rest.append((lay, k, refs))
            pending = rest
        if pending:
            lay, _, refs = pending[0]
            missing = [r for r in refs if r not in tensors]
            raise self.fail(f"layer inputs {missing} are never produced", where=f"layer '{lay.get('name')}'")
        outs = []
        for ref in out_refs:
            if ref not in tensors:
                raise self.fail(f"output {ref} is never produced")
            outs.append(tensors[ref])
        return outs, names


_CONST_REF = "\0const:"  # a reference to a Python number given to a Keras op (never a layer name)


def _refs(v) -> list[tuple[str, int, int]]:
    """input_layers/output_layers: [[name, node, tensor], ...] or a single [name, node, tensor]."""
    if not isinstance(v, list):
        return []
    if len(v) == 3 and isinstance(v[0], str):
        v = [v]
    out = []
    for r in v:
        if isinstance(r, list) and len(r) >= 3 and isinstance(r[0], str):
            out.append((r[0], int(r[1]), int(r[2])))
    return out


def _node_inputs(node, imp: _Importer, lay: dict) -> list[tuple[str, int, int]]:
    where = f"layer '{lay.get('name')}'"
    refs: list[tuple[str, int, int]] = []
    if isinstance(node, dict):  # Keras 3: {"args": [...], "kwargs": {...}}
        # A Python number is an argument of a Keras op (``x + 3.0``): the op's module says so in a
        # .keras file; legacy HDF5 drops modules, and there an op is told by the number being a
        # positional argument of its own (a merge layer takes one list of tensors).
        module = lay.get("module")
        op_layer = str(module).startswith("keras.src.ops.")
        loose_number_ok = op_layer or "module" not in lay
        kwargs = node.get("kwargs") or {}
        bad = [k for k, v in kwargs.items() if k not in _IGNORED_CALL_KWARGS and v is not None]
        if bad:
            raise imp.fail(
                f"call arguments {bad} are not supported",
                where=where,
                hint="only plain layer calls are imported",
            )

        def walk(a, depth=0):
            if depth > 8:
                raise imp.fail("call arguments nest too deep", where=where)
            if isinstance(a, dict) and a.get("class_name") == "__keras_tensor__":
                h = (a.get("config") or {}).get("keras_history")
                if not (isinstance(h, list) and len(h) == 3 and isinstance(h[0], str)):
                    raise imp.fail("a tensor reference has no keras_history", where=where)
                refs.append((h[0], int(h[1]), int(h[2])))
            elif isinstance(a, list):
                for x in a:
                    walk(x, depth + 1)
            elif isinstance(a, dict):
                raise imp.fail("call argument is not a tensor", where=where)
            elif (
                (op_layer or (loose_number_ok and depth == 1))
                and isinstance(a, int | float)
                and not isinstance(a, bool)
            ):
                # a Keras op with a Python number (MobileNetV3's hard sigmoid: x + 3.0, x * (1/6))
                refs.append((f"{_CONST_REF}{float(a)!r}", 0, 0))

        walk(node.get("args") or [])
        return refs
    if not isinstance(node, list):
        raise imp.fail("inbound node is neither a list nor a dict", where=where)
    for r in node:  # Keras 2: [[name, node_index, tensor_index, kwargs], ...]
        if not (isinstance(r, list) and len(r) >= 3 and isinstance(r[0], str)):
            raise imp.fail(f"inbound reference {r!r} is not [layer, node, tensor]", where=where)
        if len(r) > 3 and isinstance(r[3], dict):
            bad = [k for k, v in r[3].items() if k not in _IGNORED_CALL_KWARGS and v is not None]
            if bad:
                raise imp.fail(
                    f"call arguments {bad} are not supported",
                    where=where,
                    hint="only plain layer calls are imported",
                )
        refs.append((r[0], int(r[1]), int(r[2])))
    return refs


def _output_values(imp: _Importer, outs: list[KTensor], names: list[str]) -> list[onnx.ValueInfoProto]:
    """Graph outputs in Keras layout, each value named after the layer that made it."""
    b = imp.b
    infos: list[onnx.ValueInfoProto] = []
    for t in outs:
        k = b.as_keras(t)
        if k.name != t.name:  # the channels-first value gets a helper name, the output the layer's
            base = t.name
            tmp = b.rename(base, f"{base}/channels_first")
            b.names.discard(base)
            new = b.rename(k.name, base)
            b.other_layout[tmp] = new
            k = KTensor(new, k.shape)
        elif k.name in names or any(i.name == k.name for i in infos):
            k = KTensor(b.node1("Identity", [k.name], f"{k.name}/output"), k.shape, False, k.dtype)
        dims = [
            "batch" if i == 0 and d is None else (f"{k.name}_dim{i}" if d is None else d)
            for i, d in enumerate(k.shape)
        ]
        infos.append(helper.make_tensor_value_info(k.name, k.dtype, dims))
    return infos


def load(paths: list[Path], options: dict) -> ir.Model:
    """Read a Keras model (see the module rules) into the IR."""
    handles: list = []
    try:
        return _load(paths, handles)
    except InputError:
        raise
    except _CONFIG_ERRORS as exc:
        # a config value of the wrong type or a damaged HDF5 structure met outside the guarded reads
        raise InputError(
            f"model cannot be read: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            if str(exc)
            else f"model cannot be read: {type(exc).__name__}",
            path=", ".join(map(str, paths)),
            hint="the model config or weights file is damaged or not from Keras",
        ) from None
    finally:
        for h in handles:
            try:
                h.close()
            except Exception:  # noqa: BLE001 - closing a damaged file must not mask the real error
                pass


_CONFIG_ERRORS = (*_H5_ERRORS, ZeroDivisionError, OverflowError, RecursionError)


def _load(paths: list[Path], handles: list) -> ir.Model:
    src = _open_sources([Path(p) for p in paths], handles)
    imp = _Importer(src)
    if isinstance(src.weights, tuple):  # Keras 3 layout: the key fallback needs the layer order
        _, group, size = src.weights
        try:
            src.weights = _Keras3Weights(group, src.path, size, imp._order(src.config))
        except _H5_ERRORS as exc:
            raise InputError(
                f"cannot read HDF5 structure: {exc}", path=src.path, hint="the file is damaged"
            ) from None
    if src.config.get("class_name") not in _MODEL_CLASSES:
        raise imp.fail(
            f"top-level class '{src.config.get('class_name')}' is not a Keras model",
            hint="give a Sequential or Functional model",
        )
    imp.scan(src.config)
    if imp.unsupported:
        raise UnsupportedError(
            imp.unsupported,
            what="layer",
            path=src.config_path,
            hint="these Keras layers have no ONNX mapping in mconv yet",
        )
    outs, input_names = imp.build_top(src.config)
    outputs = _output_values(imp, outs, input_names)
    graph = helper.make_graph(
        imp.b.nodes, imp._name(src.config), imp.graph_inputs, outputs, imp.b.initializers
    )
    proto = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="mconv-keras"
    )
    proto.ir_version = 10
    return from_proto(proto)


def sniff(head: bytes, path: Path) -> bool:
    name = path.name.lower()
    if head.startswith(ZIP_MAGIC):
        return name.endswith(".keras")
    if head.startswith(HDF5_MAGIC):
        return True
    if name.endswith(".json"):
        text = head.lstrip()[:4096].decode("utf-8", "replace")
        return (
            text.startswith("{")
            and '"class_name"' in text
            and (
                '"keras_version"' in text
                or '"layers"' in text
                or '"Sequential"' in text
                or '"Functional"' in text
                or '"Model"' in text
            )
        )
    return False


FORMAT = Format(
    name="keras",
    description="Keras: whole-model HDF5, architecture JSON + weights HDF5, Keras 3 .keras",
    extensions=(".h5", ".hdf5", ".keras", ".json"),
    load=load,
    sniff=sniff,
    max_files=2,
)
