"""``mconv import``: any supported format to ONNX."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx_ir as ir
from mconv.api.common import PathLike, _guards, _load, _note_model_files


@dataclass
class ConvertResult:
    """``mconv import``: the model read and written (``as_dict()`` is its ``--json``)."""

    output: str
    files: list[str]
    source_format: str | None
    seconds: float
    stats: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    model: ir.Model | None = field(default=None, repr=False, compare=False)

    def as_dict(self) -> dict[str, Any]:
        doc = {
            "output": self.output,
            "files": self.files,
            "source_format": self.source_format,
            "seconds": self.seconds,
            **self.stats,
        }
        if self.notes:
            doc["notes"] = self.notes
        return doc


@_guards("src", "example_inputs", output="output", kind="file")
def convert(
    src: PathLike | Sequence[PathLike],
    output: PathLike,
    *,
    format: str | None = None,
    input_shapes=None,
    input_values=None,
    example_inputs: PathLike | None = None,
    options: Mapping[str, Any] | None = None,
) -> ConvertResult:
    """``mconv import SRC -o OUTPUT``: read ``src`` (one path, or two for split formats), write
    ``output`` (.onnx), and check that ONNX's checker and ONNX Runtime accept what was written."""
    from mconv.formats.weights import is_weight_only
    from mconv.irio import model_stats, save_onnx
    from mconv.targets.validity import check_written

    t0 = time.perf_counter()
    paths = [Path(src)] if isinstance(src, str | Path) else [Path(p) for p in src]
    output = Path(output)
    model, shape_notes = _load(paths, format, input_shapes, input_values, example_inputs, options)
    _note_model_files(model)
    written = save_onnx(model, output)
    check_written(
        output, paths[0] if len(paths) == 1 else None, what="import", graph=not is_weight_only(model)
    )
    notes = model.metadata_props.get("mconv.import_notes")
    return ConvertResult(
        output=str(output),
        files=[str(p) for p in written],
        source_format=model.metadata_props.get("mconv.source_format"),
        seconds=round(time.perf_counter() - t0, 3),
        stats=model_stats(model).as_dict(),
        notes=(notes.split("\n") if notes else []) + shape_notes,
        model=model,
    )
