"""``mconv export``: a model to a target's bundle."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx_ir as ir
from mconv.api.common import (
    ModelLike,
    PathLike,
    _as_model,
    _guards,
    _progress,
    _shapes,
    naming_the_file,
    save,
)
from mconv.errors import InputError


def input_file_bytes(path: PathLike | None, model: ir.Model | None = None) -> int:
    """Bytes on disk of a model as given: the file (every file of a directory), plus the
    external-data files its tensors point at outside it."""
    seen: set[Path] = set()
    total = 0

    def add(f: Path) -> None:
        nonlocal total
        try:
            r = f.resolve()
            if r not in seen and r.is_file():
                seen.add(r)
                total += r.stat().st_size
        except OSError:
            pass

    if path is not None:
        p = Path(path)
        if p.is_dir():
            for f in sorted(p.rglob("*")):
                add(f)
        else:
            add(p)
    if model is not None:
        for value in model.graph.initializers.values():
            t = value.const_value
            if isinstance(t, ir.ExternalTensor):
                add(Path(t.path))
    return total


def bundle_file_bytes(output: PathLike, files: dict) -> int:
    """Bytes of a bundle on disk: its files (the manifest lists them) and the manifest itself."""
    total = sum(int(f.get("bytes", 0)) for f in files.values())
    manifest = Path(output) / "manifest.json"
    return total + (manifest.stat().st_size if manifest.is_file() else 0)


@dataclass
class ExportResult:
    """``mconv export``: the bundle (or model file) written, with like-for-like byte counts."""

    output: str
    target: str | None
    weight_bytes_before: int
    weight_bytes_after: int
    file_bytes_before: int
    file_bytes_after: int
    files: Any
    seconds: float | None = None
    account: dict | None = None
    notes: list[str] = field(default_factory=list)
    manifest: dict | None = field(default=None, repr=False)
    format: str | None = None

    def as_dict(self) -> dict[str, Any]:
        if self.format is not None:  # a model file
            return {
                "output": self.output,
                "bytes_before": self.weight_bytes_before,  # weight bytes of the input model
                "bytes_after": self.file_bytes_after,  # a model file holds its weights: its bytes
                "weight_bytes_before": self.weight_bytes_before,
                "file_bytes_before": self.file_bytes_before,
                "file_bytes_after": self.file_bytes_after,
                "passes": [],
                "files": self.files,
            }
        return {
            "output": self.output,
            "target": self.target,
            # like for like (README, "JSON keys"): weights before and after (the stored
            # blobs), and the input's file bytes before, the bundle's (manifest included) after
            "bytes_before": self.weight_bytes_before,
            "bytes_after": self.weight_bytes_after,
            "weight_bytes_before": self.weight_bytes_before,
            "weight_bytes_after": self.weight_bytes_after,
            "weights_bytes": self.weight_bytes_after,
            "file_bytes_before": self.file_bytes_before,
            "file_bytes_after": self.file_bytes_after,
            "files": self.files,
            "passes": [],
            "seconds": self.seconds,
            "account": self.account,
            "notes": self.notes,
        }


@_guards("model", output="out_dir", kind=lambda a: "file" if a.get("format") else "dir")
def export(
    model: ModelLike,
    target: str = "cpu",
    out_dir: PathLike = "bundle",
    *,
    format: str | None = None,
    input_shapes=None,
    input_values: Mapping[str, Any] | Sequence[str] | None = None,
    progress=None,
    **options: Any,
) -> ExportResult:
    """``mconv export``: a deployable bundle for ``target`` (cpu, xla, metal, weights) in
    ``out_dir``, or with ``format`` a model file. ``options``: the target's ``Options`` fields
    (:mod:`mconv.targets.base`: ``dense``, ``batch``, ``precision``, ``bake_weights``,
    ``mlir_text``, ``codec``, ...; one it does not declare is an InputError naming it);
    ``input_shapes`` fixes symbolic dims first; ``input_values`` (``{"sr": 16000}`` or the CLI's
    ``["sr=16000"]``) then bakes graph inputs as constants, folds and inlines the Ifs they decide
    (:func:`mconv.passes.inline_if.bake_input_values`)."""
    from mconv.irio import model_stats
    from mconv.targets import check_export_options, get_target

    t0 = time.perf_counter()
    output = Path(out_dir)
    shapes = _shapes(input_shapes)
    m, source = _as_model(model)
    before = model_stats(m).bytes
    notes: list[str] = []
    if shapes:
        from mconv.edit.input_shapes import fix_input_shapes

        notes = fix_input_shapes(m, shapes, path=str(source) if source else None)
    if input_values:
        from mconv.passes.inline_if import bake_input_values

        if isinstance(input_values, Mapping):
            values = {str(k): str(v) for k, v in input_values.items()}
        else:
            from mconv.formats.pytorch import parse_input_values

            values = parse_input_values(list(input_values))
        m, baked = bake_input_values(m, values, path=str(source) if source else None)
        notes += baked
    if not format and target != "weights":
        from mconv.formats.weights import is_weight_only

        if is_weight_only(m):
            raise InputError(
                f"holds tensors only; the {target} target needs a graph",
                path=str(source) if source else None,
                hint="use --target weights (a weights bundle) or --format safetensors",
            )
    file_before = input_file_bytes(source, m)
    if format:
        # the tflite format is the tflite target's file: it takes that target's options
        opts = (
            check_export_options("tflite", options, path=str(source) if source else None)
            if format == "tflite"
            else {}
        )
        written = save(m, output, format, source=source, options=opts)
        size = sum(p.stat().st_size for p in written)
        return ExportResult(
            output=str(output),
            target=None,
            weight_bytes_before=before,
            weight_bytes_after=size,
            file_bytes_before=file_before,
            file_bytes_after=size,
            files=[str(p) for p in written],
            notes=notes,
            format=format,
        )
    # each option one the target declares (mconv.targets.base); None/False: not given
    opts = check_export_options(target, options, path=str(source) if source else None)
    with _progress(progress)(f"export {target}", None), naming_the_file(source or output):
        bundle = get_target(target).export(m, output, opts)
    if target == "cpu":
        from mconv.targets.validity import check_written

        check_written(output, source, what="export")
    notes += [str(n) for n in bundle.manifest.get("notes") or []]  # the target's decisions
    files = bundle.manifest.get("files", {})
    weights_bytes = sum(w.get("bytes", 0) for w in bundle.weights)
    return ExportResult(
        output=str(output),
        target=target,
        weight_bytes_before=before,
        weight_bytes_after=weights_bytes,
        file_bytes_before=file_before,
        file_bytes_after=bundle_file_bytes(output, files),
        files=files,
        seconds=round(time.perf_counter() - t0, 3),
        account=bundle.account,  # per tensor (the manifest keeps its summary)
        notes=notes,
        manifest=bundle.manifest,
    )
