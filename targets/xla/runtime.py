"""Loading and running an xla bundle with nothing but jax, numpy and the weight container.

This module is the deployable loader: it imports only jax, numpy, the standard library and
:mod:`mconv.container` / :mod:`mconv.errors` (which import no ONNX), so a serving process
needs neither onnx nor onnxruntime nor the rest of mconv.

Rules:

1. Every file listed in ``manifest.json`` is checked (size and sha256) before use; a mismatch
   raises :class:`mconv.errors.IntegrityError` naming the file. Directories and ``.zip``
   bundles both load.
2. ``xla.json`` gives the calling convention: graph inputs first, then the weight arguments in
   order; the weights are decoded from ``weights.mcw`` once, permuted once where the weight
   argument records a ``layout`` (the exporter's rule 9), and kept on the device.
3. ``model.jax_export`` is read and checked before anything of it is deserialized for a call
   (:mod:`mconv.targets.xla.check`): its header against ``xla.json`` and the manifest, every
   operation of its StableHLO module against an allowlist, custom calls only to the targets
   mconv's exporter writes, in the form it writes them; anything else is an InputError (exit 2)
   naming what was found. Then ``jax.export.deserialize`` reads it and its ``call`` is jitted;
   feeds are checked (names, dtype, rank, fixed dimensions) before the call.
4. Programs are jitted with :func:`mconv.engines.xla.jit.jit`, which turns XLA's CPU YNNPACK fusions off
   (``xla_cpu_experimental_ynn_fusion_type`` empty): jaxlib 0.10's CPU compiler fuses a chain
   of dots and the reduction after it (a classifier's Gemms and its Softmax) into one YNN
   fusion that runs 10-25x slower than the dots alone (a light AlexNet call falls well behind
   ONNX Runtime's; ``bench/xla_cpu.py``). Left to the user when ``XLA_FLAGS`` names the option,
   and skipped where this jaxlib has no such option.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np
from mconv.container import container_from_bytes, read_container
from mconv.engines.xla.jit import compiler_options, jit  # noqa: F401  (rule 4)
from mconv.errors import InputError, IntegrityError
from mconv.targets.xla.check import load_exported

PAYLOAD = "model.jax_export"
CONVENTION = "xla.json"
_HINT = "the bundle was modified or truncated; re-export it"


@dataclass(frozen=True)
class Spec:
    """An input of the runner: name, numpy dtype name, shape (ints and symbolic names)."""

    name: str
    dtype: str
    shape: tuple | None


class _Files:
    """Read a bundle's files from a directory or a zip, each checked against the manifest."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.label = str(path)
        self.zip: zipfile.ZipFile | None = None
        self.prefix = ""
        if path.is_dir():
            raw = self._raw("manifest.json")
        elif path.is_file() and zipfile.is_zipfile(path):
            self.zip = zipfile.ZipFile(path)
            names = self.zip.namelist()
            tops = [
                n
                for n in names
                if n == "manifest.json" or (n.count("/") == 1 and n.endswith("/manifest.json"))
            ]
            if not tops:
                raise InputError(
                    "not a bundle: the zip holds no manifest.json",
                    path=self.label,
                    hint="zip the bundle directory",
                )
            self.prefix = tops[0][: -len("manifest.json")]
            raw = self._raw("manifest.json")
        else:
            raise InputError("bundle not found", path=self.label, hint="give an xla bundle directory or .zip")
        try:
            self.manifest = json.loads(raw.decode("utf-8"))
        except ValueError:
            raise InputError("manifest.json is not valid JSON", path=self.label, hint=_HINT) from None
        if not isinstance(self.manifest, dict) or not isinstance(self.manifest.get("files"), dict):
            raise InputError("manifest.json is not an mconv manifest", path=self.label, hint=_HINT)

    def _raw(self, rel: str) -> bytes:
        try:
            if self.zip is not None:
                return self.zip.read(self.prefix + rel)
            return (self.path / rel).read_bytes()
        except (KeyError, OSError):
            raise IntegrityError(f"{rel}: missing", path=self.label, hint=_HINT) from None

    def read(self, rel: str) -> bytes:
        meta = self.manifest["files"].get(rel)
        if meta is None or "/" in rel or rel.startswith("."):
            raise InputError(f"bundle has no file '{rel}'", path=self.label, hint="re-export the bundle")
        data = self._raw(rel)
        if len(data) != meta.get("bytes"):
            raise IntegrityError(
                f"{rel}: size mismatch (expected {meta.get('bytes')} bytes, got {len(data)})",
                path=self.label,
                hint=_HINT,
            )
        got = hashlib.sha256(data).hexdigest()
        if got != meta.get("sha256"):
            raise IntegrityError(
                f"{rel}: sha256 mismatch (expected {str(meta.get('sha256'))[:12]}..., got {got[:12]}...)",
                path=self.label,
                hint=_HINT,
            )
        return data

    def verify_all(self) -> None:
        for rel in sorted(self.manifest["files"]):
            if rel != "weights.mcw":  # the container is read (and hashed) below
                self.read(rel)


@dataclass
class XlaRunner:
    """A deserialized ``jax.export`` artifact plus its weights: the Runner API."""

    call: Callable
    inputs: list[Spec]
    outputs: list[str]
    weights: list[Any]
    x64: bool = False
    label: str = "bundle"
    exported: Any = field(default=None, repr=False)

    def _check(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        names = [s.name for s in self.inputs]
        unknown = sorted(set(feeds) - set(names))
        missing = [n for n in names if n not in feeds]
        if unknown or missing:
            raise InputError(
                f"feeds do not match the inputs (unknown: {', '.join(unknown) or '-'}; missing: {', '.join(missing) or '-'})",
                path=self.label,
                hint=f"the model's inputs are: {', '.join(names)}",
            )
        out = []
        for spec in self.inputs:
            arr = np.asarray(feeds[spec.name])
            where = f"input '{spec.name}'"
            if arr.dtype.name != spec.dtype:
                raise InputError(
                    f"dtype {arr.dtype.name}, expected {spec.dtype}",
                    path=self.label,
                    where=where,
                    hint=f"cast the feed to {spec.dtype}",
                )
            if spec.shape is not None:
                ok = arr.ndim == len(spec.shape) and all(
                    not isinstance(w, int) or w == g for g, w in zip(arr.shape, spec.shape)
                )
                if not ok:
                    raise InputError(
                        f"shape {list(arr.shape)}, expected {list(spec.shape)}",
                        path=self.label,
                        where=where,
                        hint="only symbolic dimensions may vary",
                    )
            out.append(arr)
        return out

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        args = self._check(feeds)
        with jax.enable_x64(self.x64):
            try:
                values = self.call(*args, *self.weights)
            except (TypeError, ValueError) as exc:
                raise InputError(
                    f"XLA refused the feeds ({str(exc).splitlines()[0][:200]})",
                    path=self.label,
                    hint="check the feed shapes against the manifest's inputs",
                ) from None
            values = [np.asarray(v) for v in values]
        return dict(zip(self.outputs, values))


def runner_from_parts(
    manifest: dict, read: Callable[[str], bytes], open_container: Callable[[], Any], label: str
) -> XlaRunner:
    """Build the runner from a manifest, a checked file reader and a container opener."""
    if manifest.get("target") != "xla":
        raise InputError(
            f"bundle is for target '{manifest.get('target')}', not 'xla'",
            path=label,
            hint=f"run it with --target {manifest.get('target')}",
        )
    try:
        conv = json.loads(read(CONVENTION).decode("utf-8"))
        weight_args = conv["weight_args"]
    except (ValueError, KeyError, TypeError):
        raise InputError(f"{CONVENTION} is not valid", path=label, hint=_HINT) from None
    x64 = conv.get("x64", False) if isinstance(conv, dict) else None
    if not isinstance(x64, bool):
        raise InputError(f"{CONVENTION} is not valid ('x64' is not a boolean)", path=label, hint=_HINT)
    with jax.enable_x64(x64):
        # rule 3: nothing of the program is deserialized for a call before it is checked
        exported = load_exported(read(PAYLOAD), conv, manifest, label)
        weights: list[Any] = []
        if weight_args:
            with open_container() as container:
                for w in weight_args:
                    arr = container.array(w["name"])
                    if arr.dtype.name != w["dtype"] or list(arr.shape) != list(w["shape"]):
                        raise IntegrityError(
                            f"weight '{w['name']}' is {arr.dtype.name}{list(arr.shape)}, the program expects "
                            f"{w['dtype']}{list(w['shape'])}",
                            path=label,
                            hint=_HINT,
                        )
                    layout = w.get("layout")
                    if layout is not None:  # the program takes this weight permuted (exporter rule 9)
                        if sorted(layout) != list(range(arr.ndim)):
                            raise IntegrityError(
                                f"weight '{w['name']}' has layout {layout}, not a permutation of its {arr.ndim} axes",
                                path=label,
                                hint=_HINT,
                            )
                        arr = np.ascontiguousarray(np.transpose(arr, layout))
                    weights.append(jax.device_put(arr))
    inputs = [
        Spec(d["name"], d["dtype"], tuple(d["shape"]) if d.get("shape") is not None else None)
        for d in conv["inputs"]
    ]
    return XlaRunner(
        call=jit(exported.call),
        inputs=inputs,
        outputs=list(conv["outputs"]),
        weights=weights,
        x64=x64,
        label=label,
        exported=exported,
    )


def load_bundle_path(path: str | os.PathLike) -> XlaRunner:
    """Load an xla bundle directory or .zip with this module alone (no mconv.bundle, no onnx)."""
    files = _Files(Path(path))
    files.verify_all()

    def open_container():
        if files.zip is None:
            return read_container(files.path / "weights.mcw")
        return container_from_bytes(files.read("weights.mcw"), f"{files.label}!weights.mcw")

    if "weights.mcw" in files.manifest["files"]:
        files.read("weights.mcw")  # size + sha256 of the whole file before decoding
    return runner_from_parts(files.manifest, files.read, open_container, files.label)
