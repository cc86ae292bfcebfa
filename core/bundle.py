"""Bundles: what a target exports and a deployer ships.

A bundle is a directory (or a ``.zip`` of one) holding:

- ``manifest.json``: format name and version, target, model name, inputs and outputs, every
  other file with its size and sha256, the codec and bytes of every weight, provenance, the
  verification summary and the export options, and the byte account's summary (``account``:
  ``total`` and one row per codec; the per-tensor rows are ``weights.mcw``'s index, read back
  by ``Bundle.account``). Sorted keys, compact separators, no timestamps.
- ``weights.mcw``: the weight container (:mod:`mconv.container`), absent when every weight
  lives in the payload (``codec: "dense"``).
- the target payload (``model.onnx`` for cpu, ...).

Rules:

1. The same inputs give byte-identical files (manifest and container are deterministic).
2. ``write_bundle`` writes into a temporary directory and renames it into place: nothing
   appears at ``out_dir`` unless the bundle is complete.
3. ``load_bundle`` checks that every listed file exists with its recorded size and sha256
   before anything uses it; a mismatch raises :class:`mconv.errors.IntegrityError` naming the
   file. Files the manifest does not list are ignored and reported in ``Bundle.extra_files``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import mconv
import numpy as np
import onnx_ir as ir
from mconv.container import (
    LATEST,
    Container,
    check_zip_ratio,
    choose_codec,
    container_from_zip,
    read_container,
    write_container,
)
from mconv.errors import InputError, IntegrityError, show
from mconv.fileio import atomic_dir, atomic_path, load_json, sha256_file

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "MANIFEST",
    "WEIGHTS",
    "DENSE",
    "Bundle",
    "TensorSpec",
    "choose_codec",
    "is_bundle",
    "load_bundle",
    "provenance_from_model",
    "write_bundle",
    "zip_bundle",
]

FORMAT = "mconv-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
WEIGHTS = "weights.mcw"
# Codec name for a weight that stays inside the payload (a self-contained model.onnx).
DENSE = "dense"
_HINT_TAMPERED = "the bundle was modified or truncated; re-export it"
# manifest.json is small; refuse a huge one before reading it (bounded reads).
_MANIFEST_MAX_BYTES = 64 << 20


def _dtype_name(dtype: ir.DataType | None) -> str:
    """numpy's name for an ONNX element type ("float32", "int64"; "bfloat16" for ml_dtypes)."""
    if dtype is None:
        return "unknown"
    try:
        return np.dtype(dtype.numpy()).name
    except Exception:  # element types without a numpy dtype (strings, ...)
        return dtype.name.lower()


@dataclass(frozen=True)
class TensorSpec:
    """Name, element type (numpy's name) and shape of a graph input or output.

    A dimension is an int, a symbolic name (str) or None when unknown.
    """

    name: str
    dtype: str
    shape: tuple[int | str | None, ...] | None

    @classmethod
    def from_value(cls, value: ir.Value) -> TensorSpec:
        shape = None
        if value.shape is not None:
            shape = tuple(
                (d if d >= 0 else None) if isinstance(d, int) else (d.value if d.value is not None else None)
                for d in value.shape
            )
        assert value.name is not None, "a graph input or output has a name"
        return cls(value.name, _dtype_name(value.dtype), shape)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TensorSpec:
        shape = d.get("shape")
        return cls(str(d["name"]), str(d["dtype"]), tuple(shape) if shape is not None else None)

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape) if self.shape is not None else None,
        }


@dataclass
class Bundle:
    """A bundle on disk: its root (a directory or a .zip) and its manifest.

    ``path(rel)`` gives a ``Path`` for a directory bundle and a ``zipfile.Path`` for a zipped
    one; both have ``read_bytes()`` and ``open()``. ``read_bytes(rel)`` and ``container()``
    work for both.
    """

    root: Path
    manifest: dict
    extra_files: list[str] = field(default_factory=list)
    zip_prefix: str | None = None  # member prefix inside a .zip ("" or "name/"); None for a dir
    _weights: list[dict] | None = field(default=None, repr=False, compare=False)
    # the per-tensor byte account of the export that wrote the bundle (with predictions)
    _account: dict | None = field(default=None, repr=False, compare=False)

    @property
    def is_zip(self) -> bool:
        return self.zip_prefix is not None

    @property
    def target(self) -> str:
        return self.manifest["target"]

    @property
    def model_name(self) -> str:
        return self.manifest.get("model_name", "")

    @property
    def inputs(self) -> list[TensorSpec]:
        return [TensorSpec.from_dict(d) for d in self.manifest.get("inputs", [])]

    @property
    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec.from_dict(d) for d in self.manifest.get("outputs", [])]

    @property
    def files(self) -> dict[str, dict]:
        return self.manifest.get("files", {})

    @property
    def weights(self) -> list[dict]:
        """Per stored tensor ``name, codec, bytes, streams, shape, dtype``: the tensors in
        ``weights.mcw`` from its index (the manifest does not repeat it: a small bundle stays small), then
        the manifest's ``weights`` not in it (dense tensors in the payload; older bundles list
        every tensor there)."""
        if self._weights is None:
            entries: list[dict] = []
            if WEIGHTS in self.files:
                with self.container() as c:
                    for e in c.entries.values():
                        r = e.record
                        entries.append(
                            {
                                "name": e.name,
                                "codec": r["codec"],
                                "bytes": e.nbytes,
                                "streams": r.get("streams", {"data": e.nbytes}),
                                "shape": r["shape"],
                                "dtype": r["dtype"],
                            }
                        )
            names = {w["name"] for w in entries}
            entries += [w for w in self.manifest.get("weights", []) if w.get("name") not in names]
            self._weights = entries
        return self._weights

    @property
    def account(self) -> dict | None:
        """The per-tensor byte account: the export's own (with ``predicted_bytes``) on the
        bundle ``write_bundle`` returns, else rebuilt from ``weights.mcw``'s index
        (:func:`mconv.account.container_account`; the manifest keeps only its summary). An
        older manifest that lists the rows itself is read as it is; ``None`` without weights."""
        if self._account is None:
            stored = self.manifest.get("account")
            if isinstance(stored, dict) and "layers" in stored:
                self._account = stored
            elif WEIGHTS in self.files:
                from mconv.account import container_account

                with self.container() as c:
                    self._account = container_account(list(c.entries.values()))
        return self._account

    @property
    def options(self) -> dict:
        return self.manifest.get("options", {})

    def path(self, rel: str):
        if self.zip_prefix is None:
            return self.root / rel
        return zipfile.Path(self.root, self.zip_prefix + rel)

    def read_bytes(self, rel: str) -> bytes:
        """A listed file's bytes (checked to be a regular file inside the bundle); one-line errors."""
        label = str(self.root)
        if rel not in self.files and rel != MANIFEST:
            raise InputError(
                f"bundle has no file '{show(rel)}'",
                path=label,
                hint=f"the {self.target} target needs it; re-export the bundle",
            )
        if self.zip_prefix is None:
            return _read_member(self.root, rel, label)
        try:
            with zipfile.ZipFile(self.root) as zf:
                info = zf.getinfo(self.zip_prefix + rel)
                declared = self.files[rel]["bytes"] if rel != MANIFEST else _MANIFEST_MAX_BYTES
                if info.file_size > declared:  # zipfile inflates no more than the directory says
                    raise _mismatch(label, rel, "size", declared, info.file_size)
                check_zip_ratio(info, label, show(rel))
                return zf.read(info)
        except KeyError:
            raise IntegrityError(
                f"{show(rel)}: listed in manifest.json but missing", path=label, hint=_HINT_TAMPERED
            ) from None
        except _ZIP_ERRORS as exc:
            raise InputError(
                f"cannot read {show(rel)} from the bundle zip ({type(exc).__name__}: {str(exc)[:80]})",
                path=label,
                where=show(rel),
                hint=_HINT_TAMPERED,
            ) from None

    def arrays(self, names: Sequence[str], dtype: Any = np.float32) -> dict[str, np.ndarray]:
        """The tensors ``names`` decoded from ``weights.mcw`` (each checked) as ``dtype`` arrays,
        by name: the weight buffers of the metal and webgpu runners (one reader for the three
        that decoded them the same way)."""
        if not names:
            return {}
        with self.container() as container:
            return {name: np.array(container.array(name), dtype=dtype) for name in names}

    def container(self) -> Container:
        """The bundle's ``weights.mcw`` (memory-mapped for a directory, in memory for a zip)."""
        if WEIGHTS not in self.files:
            raise InputError(
                f"bundle has no {WEIGHTS} (its weights are dense in the payload)",
                path=str(self.root),
                hint="load it with its target",
            )
        if self.zip_prefix is None:
            return read_container(_member_path(self.root, WEIGHTS, str(self.root)))
        label = f"{self.root}!{WEIGHTS}"
        try:  # never whole in memory: mapped in place, or inflated to a temporary file
            return container_from_zip(
                self.root, self.zip_prefix + WEIGHTS, self.files[WEIGHTS]["bytes"], label
            )
        except _ZIP_ERRORS as exc:
            raise InputError(
                f"cannot read {WEIGHTS} from the bundle zip ({type(exc).__name__}: {show(str(exc), 80)})",
                path=str(self.root),
                hint=_HINT_TAMPERED,
            ) from None


def _check_relpath(rel: str, root: str) -> str:
    p = PurePosixPath(rel)
    if not rel or p.is_absolute() or ".." in p.parts or "\\" in rel or rel != p.as_posix():
        raise InputError(
            f"file name '{show(rel)}' is not a plain relative path",
            path=root,
            hint="bundle files must stay inside the bundle",
        )
    return rel


def _jsonable(obj: Any) -> Any:
    """Options and reports as JSON: Paths as strings, numpy scalars as numbers, tuples as lists."""
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)


def manifest_bytes(manifest: dict) -> bytes:
    return (json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n").encode(
        "utf-8"
    )


def provenance_from_model(model: ir.Model) -> dict:
    """Provenance recorded by importers and passes in ``metadata_props`` (mconv.source_*, mconv.passes)."""
    props = model.metadata_props
    passes: Any = []
    if "mconv.passes" in props:
        try:
            passes = json.loads(props["mconv.passes"])
        except ValueError:
            passes = props["mconv.passes"]
    return {
        "source_name": props.get("mconv.source_name"),
        "source_sha256": props.get("mconv.source_sha256"),
        "source_format": props.get("mconv.source_format"),
        "mconv_version": mconv.__version__,
        "passes": passes,
    }


def _spec_list(specs: Sequence[TensorSpec | Mapping]) -> list[dict]:
    return [s.as_dict() if isinstance(s, TensorSpec) else TensorSpec.from_dict(s).as_dict() for s in specs]


# Targets whose bundles are read by a reader of the version 1 (JSON) weights index.
_JSON_INDEX = ("metal", "webgpu")


def write_bundle(
    out_dir: str | os.PathLike,
    *,
    target: str,
    model_name: str,
    inputs: Sequence[TensorSpec | Mapping],
    outputs: Sequence[TensorSpec | Mapping],
    weights: Sequence[tuple[str, np.ndarray, dict | None]],
    payload: Mapping[str, bytes],
    options: Mapping | None,
    provenance: Mapping | None,
    verification: Mapping | None = None,
    notes: Sequence[str] = (),
) -> Bundle:
    """Write a complete bundle directory at ``out_dir`` atomically and return it.

    ``notes``: what the target decided that the user should know (the manifest's ``notes``, only
    when there are some).

    ``weights`` are (name, array, codec spec); a spec ``{"codec": "dense"}`` marks a weight that
    the payload already holds (it is listed in the manifest, not stored in ``weights.mcw``).
    ``payload`` maps relative paths to file contents.
    """
    out_dir = Path(out_dir)
    for rel in payload:
        _check_relpath(rel, str(out_dir))
        if rel in (MANIFEST, WEIGHTS):
            raise InputError(
                f"payload may not contain '{rel}'", path=str(out_dir), hint="the bundle writer makes it"
            )
    stored = [(n, a, s) for n, a, s in weights if (s or {}).get("codec") != DENSE]
    with atomic_dir(out_dir) as tmp:
        weight_entries: list[dict] = []
        records: dict[str, dict] = {}
        if stored:
            # the latest binary index (version 5) where the readers are mconv's own (Python,
            # mcw_decode); the Swift and JavaScript readers of metal and webgpu bundles parse
            # version 1's JSON. Sorted by name: the binary index front-codes each name against the
            # one before (a quantized model's t12/scale, t12/zero_point, ... cost a few bytes each)
            info = write_container(
                tmp / WEIGHTS,
                sorted(stored, key=lambda t: t[0]),
                version=1 if target in _JSON_INDEX else LATEST,
            )
            records = {e.name: e.record | {"nbytes": e.nbytes} for e in info.tensors}
        for name, array, _spec in weights:
            if name in records:
                continue  # weights.mcw's index lists it (Bundle.weights reads it there)
            else:
                a = np.asarray(array)
                weight_entries.append(
                    {
                        "name": name,
                        "codec": DENSE,
                        "bytes": int(a.nbytes),
                        "streams": {"data": int(a.nbytes)},
                        "shape": [int(d) for d in a.shape],
                        "dtype": a.dtype.name,
                        # what the target recorded beyond the codec (tflite: what a palette became)
                        **{k: v for k, v in (_spec or {}).items() if k != "codec"},
                    }
                )
        for rel, data in sorted(payload.items()):
            dest = tmp / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        files = {}
        for f in sorted(p for p in tmp.rglob("*") if p.is_file()):
            rel = f.relative_to(tmp).as_posix()
            files[rel] = {"bytes": f.stat().st_size, "sha256": sha256_file(f)}
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "target": target,
            "model_name": model_name,
            "inputs": _spec_list(inputs),
            "outputs": _spec_list(outputs),
            "files": files,
            "weights": weight_entries,
            "provenance": _jsonable(dict(provenance or {})),
            "verification": _jsonable(dict(verification)) if verification is not None else None,
            "options": _jsonable(dict(options or {})),
        }
        if notes:
            manifest["notes"] = [str(n) for n in notes]
        account = None
        if records:  # the per-layer byte account (Deep Compression's Table 4), mconv.account
            from mconv.account import account_summary, byte_account

            account = byte_account(stored, records)
            manifest["account"] = account_summary(account)
        (tmp / MANIFEST).write_bytes(manifest_bytes(manifest))
        # mkdtemp/mkstemp make owner-only entries; a bundle is meant to be shipped and read.
        for f in tmp.rglob("*"):
            f.chmod(0o755 if f.is_dir() else 0o644)
        tmp.chmod(0o755)
    return Bundle(out_dir, manifest, _account=account)


def _zip_prefix(zf: zipfile.ZipFile) -> str | None:
    """Where manifest.json sits in a zip: at the root ("") or in one top-level folder ("x/")."""
    names = set(zf.namelist())
    if MANIFEST in names:
        return ""
    tops = [n for n in names if n.count("/") == 1 and n.endswith("/" + MANIFEST)]
    return tops[0][: -len(MANIFEST)] if len(tops) == 1 else None


def is_bundle(path: str | os.PathLike) -> bool:
    """True for a directory holding manifest.json or a .zip holding one."""
    p = Path(path)
    if p.is_dir():
        return (p / MANIFEST).is_file()
    if p.is_file() and zipfile.is_zipfile(p):
        try:
            with zipfile.ZipFile(p) as zf:
                return _zip_prefix(zf) is not None
        except (zipfile.BadZipFile, OSError):
            return False
    return False


# What a damaged zip can raise while its directory or a member is read.
_ZIP_ERRORS = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    OSError,
    EOFError,
    zlib.error,
    NotImplementedError,
    RuntimeError,
    ValueError,
)
_MAX_INT = (1 << 63) - 1
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class _Schema:
    """Type checks of a parsed manifest; every failure is one line naming the field."""

    def __init__(self, label: str) -> None:
        self.label = label

    def bad(self, field: str, what: str) -> InputError:
        return InputError(
            f"field '{field}' {what}",
            path=self.label,
            where=MANIFEST,
            hint=_HINT_TAMPERED,
        )

    def typed(self, v: Any, field: str, types: tuple, what: str) -> Any:
        if isinstance(v, bool) and bool not in types:
            raise self.bad(field, f"is {json.dumps(v)}, expected {what}")
        if not isinstance(v, types):
            raise self.bad(field, f"is {_kind(v)}, expected {what}")
        return v

    def string(self, v: Any, field: str) -> str:
        return self.typed(v, field, (str,), "a string")

    def count(self, v: Any, field: str) -> int:
        self.typed(v, field, (int,), "a non-negative integer")
        if not 0 <= v <= _MAX_INT:
            raise self.bad(field, f"is {str(v)[:30]}, expected a non-negative integer below 2**63")
        return v

    def number(self, v: Any, field: str) -> float:
        return self.typed(v, field, (int, float), "a number")

    def obj(self, v: Any, field: str) -> dict:
        return self.typed(v, field, (dict,), "an object")

    def array(self, v: Any, field: str) -> list:
        return self.typed(v, field, (list,), "a list")

    def optional(self, m: Mapping, key: str, check, field: str) -> None:
        if key in m and m[key] is not None:
            check(m[key], field)

    def spec(self, v: Any, field: str) -> None:
        self.obj(v, field)
        for key in ("name", "dtype"):
            if key not in v:
                raise self.bad(f"{field}.{key}", "is missing")
            self.string(v[key], f"{field}.{key}")
        shape = v.get("shape")
        if shape is not None:
            self.array(shape, f"{field}.shape")
            for j, d in enumerate(shape):
                if d is not None and not isinstance(d, str):
                    self.count(d, f"{field}.shape[{j}]")

    def shape(self, v: Any, field: str) -> None:
        self.array(v, field)
        elements = 1
        for j, d in enumerate(v):
            elements *= self.count(d, f"{field}[{j}]")
        if elements > _MAX_INT:
            raise self.bad(field, "has more than 2**63 elements")

    def weight(self, v: Any, field: str) -> None:
        self.obj(v, field)
        for key, check in (
            ("name", self.string),
            ("codec", self.string),
            ("bytes", self.count),
            ("dtype", self.string),
            ("shape", self.shape),
        ):
            if key not in v:
                raise self.bad(f"{field}.{key}", "is missing")
            check(v[key], f"{field}.{key}")
        if "streams" in v:
            for k, n in self.obj(v["streams"], f"{field}.streams").items():
                self.count(n, f"{field}.streams.{show(k, 30)}")

    def account(self, v: Any, field: str) -> None:
        self.obj(v, field)
        rows = self.array(v.get("layers", []), f"{field}.layers")
        for i, row in enumerate(rows):
            where = f"{field}.layers[{i}]"
            self.obj(row, where)
            for key in ("name", "bytes", "original_bytes"):
                if key not in row:
                    raise self.bad(f"{where}.{key}", "is missing")
            self.string(row["name"], f"{where}.name")
            self.optional(row, "codec", self.string, f"{where}.codec")
            for key in ("bytes", "original_bytes", "elements", "predicted_bytes", "codebook_bytes"):
                self.optional(row, key, self.count, f"{where}.{key}")
            for key in ("weight_bits", "index_bits", "kept"):
                self.optional(row, key, self.number, f"{where}.{key}")
        for label, row in self.obj(v.get("codecs", {}), f"{field}.codecs").items():
            where = f"{field}.codecs['{show(label, 30)}']"
            for key, n in self.obj(row, where).items():
                self.count(n, f"{where}.{show(key, 30)}")
        if "total" in v:
            total = self.obj(v["total"], f"{field}.total")
            for key in ("bytes", "original_bytes"):
                if key not in total:
                    raise self.bad(f"{field}.total.{key}", "is missing")
            for key, val in total.items():
                if val is not None:
                    self.number(val, f"{field}.total.{show(key, 30)}")

    def manifest(self, m: Any) -> dict:
        if not isinstance(m, dict) or m.get("format") != FORMAT:
            raise InputError(
                f"manifest.json is not an {FORMAT} manifest",
                path=self.label,
                hint="give a bundle made by mconv export",
            )
        version = m.get("format_version")
        if isinstance(version, bool) or version != FORMAT_VERSION:
            raise InputError(
                f"bundle format_version {show(json.dumps(version), 30)} is not supported "
                f"(this mconv reads {FORMAT_VERSION})",
                path=self.label,
                hint="upgrade mconv or re-export the bundle",
            )
        for key in ("target", "files"):
            if key not in m:
                raise InputError(f"manifest.json lacks '{key}'", path=self.label, hint=_HINT_TAMPERED)
        self.string(m["target"], "target")
        self.optional(m, "model_name", self.string, "model_name")
        for rel, meta in self.obj(m["files"], "files").items():
            where = f"files['{show(rel, 40)}']"
            _check_relpath(rel, self.label)
            self.obj(meta, where)
            for key in ("bytes", "sha256"):
                if key not in meta:
                    raise self.bad(f"{where}.{key}", "is missing")
            self.count(meta["bytes"], f"{where}.bytes")
            if not isinstance(meta["sha256"], str) or not _SHA256.match(meta["sha256"]):
                raise self.bad(f"{where}.sha256", "is not a sha256 hex digest")
        for key in ("inputs", "outputs"):
            if key in m:
                for i, spec in enumerate(self.array(m[key], key)):
                    self.spec(spec, f"{key}[{i}]")
        if "weights" in m:
            for i, w in enumerate(self.array(m["weights"], "weights")):
                self.weight(w, f"weights[{i}]")
        for key in ("options", "provenance", "verification"):
            self.optional(m, key, self.obj, key)
        self.optional(m, "account", self.account, "account")
        return m


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }.get(type(v), type(v).__name__)


def _parse_manifest(data: bytes, label: str) -> dict:
    manifest = load_json(data, "manifest.json", label, _HINT_TAMPERED)
    return _Schema(label).manifest(manifest)


def _mismatch(label: str, rel: str, what: str, expected: Any, got: Any) -> IntegrityError:
    if what == "sha256":
        detail = f"expected {str(expected)[:12]}..., got {str(got)[:12]}..."
    else:
        detail = f"expected {expected} bytes, got {got}"
    return IntegrityError(f"{show(rel)}: {what} mismatch ({detail})", path=label, hint=_HINT_TAMPERED)


def _sha256_zip_member(zf: zipfile.ZipFile, name: str) -> str:
    h = hashlib.sha256()
    with zf.open(name) as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _member_error(exc: OSError, label: str, rel: str) -> InputError:
    reason = exc.strerror or type(exc).__name__
    return InputError(
        f"cannot read {show(rel)} ({reason})",
        path=label,
        where=show(rel),
        hint="check that the bundle's files are readable regular files; re-export it",
    )


def _member_path(root: Path, rel: str, label: str) -> Path:
    """``root / rel`` for a listed file: a regular file inside the bundle (no symlink out of it)."""
    _check_relpath(rel, label)
    f = root / rel
    try:
        if not os.path.lexists(f):
            raise IntegrityError(
                f"{show(rel)}: listed in manifest.json but missing", path=label, hint=_HINT_TAMPERED
            )
        real_root = root.resolve()
        real = f.resolve()
        if real != real_root and real_root not in real.parents:
            raise InputError(
                f"{show(rel)} is a link that points outside the bundle",
                path=label,
                where=show(rel),
                hint="bundle files must stay inside the bundle; re-export it",
            )
        if not f.is_file():
            raise InputError(
                f"{show(rel)} is not a regular file (a directory, a FIFO or a device in its place)",
                path=label,
                where=show(rel),
                hint=_HINT_TAMPERED,
            )
    except OSError as exc:
        raise _member_error(exc, label, rel) from None
    return f


def _stat_member(f: Path, rel: str, label: str) -> os.stat_result:
    try:
        return f.stat()
    except OSError as exc:
        raise _member_error(exc, label, rel) from None


def _read_member(root: Path, rel: str, label: str, limit: int | None = None) -> bytes:
    """The bytes of ``root / rel`` (a regular file inside the bundle), at most ``limit`` of them."""
    f = _member_path(root, rel, label)
    try:
        with open(f, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if limit is not None and size > limit:
                raise InputError(
                    f"{show(rel)} is {size} bytes, too large (at most {limit})",
                    path=label,
                    where=show(rel),
                    hint=_HINT_TAMPERED,
                )
            data = fh.read(size + 1)
    except OSError as exc:
        raise _member_error(exc, label, rel) from None
    return data


def _walk_files(root: Path) -> set[str]:
    """Relative paths of the regular files under ``root`` (symlinked folders are not followed)."""
    out = set()
    for dirpath, _dirs, files in os.walk(root, onerror=lambda e: None):
        for n in files:
            f = Path(dirpath) / n
            if f.is_file() and not f.is_symlink():
                out.add(f.relative_to(root).as_posix())
    return out


def load_bundle(path: str | os.PathLike, *, verify: bool = True) -> Bundle:
    """Open a bundle directory or .zip; check every listed file's size and sha256 (``verify``)."""
    p = Path(path)
    label = str(p)
    if p.is_dir():
        mpath = p / MANIFEST
        if not mpath.is_file():
            raise InputError(
                "not a bundle: no manifest.json", path=label, hint="give a directory made by mconv export"
            )
        manifest = _parse_manifest(_read_member(p, MANIFEST, label, _MANIFEST_MAX_BYTES), label)
        for rel, meta in sorted(manifest["files"].items()):
            f = _member_path(p, rel, label)
            if verify:
                size = _stat_member(f, rel, label).st_size
                if size != meta["bytes"]:
                    raise _mismatch(label, rel, "size", meta["bytes"], size)
                try:
                    got = sha256_file(f)
                except OSError as exc:
                    raise _member_error(exc, label, rel) from None
                if got != meta["sha256"]:
                    raise _mismatch(label, rel, "sha256", meta["sha256"], got)
        extra = sorted(_walk_files(p) - set(manifest["files"]) - {MANIFEST})
        return Bundle(p, manifest, extra_files=extra)

    if p.is_file() and zipfile.is_zipfile(p):
        try:
            with zipfile.ZipFile(p) as zf:
                prefix = _zip_prefix(zf)
                if prefix is None:
                    raise InputError(
                        "not a bundle: the zip holds no manifest.json",
                        path=label,
                        hint="zip the bundle directory itself",
                    )
                infos = {i.filename: i for i in zf.infolist()}
                minfo = infos[prefix + MANIFEST]
                if minfo.file_size > _MANIFEST_MAX_BYTES:
                    raise InputError(
                        f"manifest.json is {minfo.file_size} bytes, too large",
                        path=label,
                        hint=_HINT_TAMPERED,
                    )
                manifest = _parse_manifest(zf.read(minfo), label)
                for rel, meta in sorted(manifest["files"].items()):
                    _check_relpath(rel, label)
                    info = infos.get(prefix + rel)
                    if info is None or info.is_dir():
                        raise IntegrityError(
                            f"{show(rel)}: listed in manifest.json but missing",
                            path=label,
                            hint=_HINT_TAMPERED,
                        )
                    # The size is checked from the zip directory before any byte is inflated.
                    if info.file_size != meta["bytes"]:
                        raise _mismatch(label, rel, "size", meta["bytes"], info.file_size)
                    check_zip_ratio(info, label, show(rel))
                    if verify:
                        got = _sha256_zip_member(zf, info.filename)
                        if got != meta["sha256"]:
                            raise _mismatch(label, rel, "sha256", meta["sha256"], got)
                present = {n[len(prefix) :] for n in infos if n.startswith(prefix) and not n.endswith("/")}
                extra = sorted(present - set(manifest["files"]) - {MANIFEST})
        except _ZIP_ERRORS as exc:
            raise InputError(
                f"cannot read the bundle zip ({type(exc).__name__}: {str(exc)[:80]})",
                path=label,
                hint=_HINT_TAMPERED,
            ) from None
        return Bundle(p, manifest, extra_files=extra, zip_prefix=prefix)

    if p.is_file():
        raise InputError(
            "not a bundle: expected a directory or a .zip with manifest.json",
            path=label,
            hint="give the directory written by mconv export",
        )
    raise InputError("bundle not found", path=label, hint="check the path")


def zip_bundle(bundle_dir: str | os.PathLike, dest: str | os.PathLike) -> Path:
    """Zip a bundle directory into ``dest`` atomically and deterministically.

    Members sit at the zip's root in sorted order with a fixed timestamp (1980-01-01), so the
    same bundle gives a byte-identical zip. ``weights.mcw`` is stored uncompressed (its blobs are
    already coded); other files are deflated.
    """
    src = Path(bundle_dir)
    bundle = load_bundle(src)
    dest = Path(dest)
    with atomic_path(dest) as tmp, zipfile.ZipFile(tmp, "w") as zf:
        for rel in sorted([*bundle.files, MANIFEST]):
            info = zipfile.ZipInfo(rel, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED if rel == WEIGHTS else zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, bundle.read_bytes(rel))
    return dest
