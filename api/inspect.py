"""``mconv inspect``: what a model or bundle holds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mconv.api.common import PathLike, _guards, _shapes


@dataclass
class InspectResult:
    """``mconv inspect``: ops, parameters, bytes by dtype, inputs/outputs, largest tensors, and a
    bundle's manifest."""

    doc: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return self.doc

    def write_report(self, path: PathLike, *, layers: int = 6) -> Path:
        """The self-contained HTML report of what ``path`` holds (:mod:`mconv.report`)."""
        from mconv.bundle import is_bundle
        from mconv.report import write_report

        source = self.doc.get("path")
        model = None
        if source is not None and not is_bundle(Path(source)) and not Path(source).is_dir():
            from mconv.api.common import open_model

            model = open_model(source)  # the weights the histograms draw
        return write_report(path, "inspect", self.as_dict(), inputs=[source], after=model, layers=layers)


@_guards("path")
def inspect(path: PathLike, *, top: int = 10, input_shapes=None) -> InspectResult:
    """``mconv inspect PATH``: a model file or a bundle (``input_shapes`` fixes a model's
    symbolic dims and is checked against a bundle's inputs)."""
    from mconv.api.inspection import inspect_model, inspect_path
    from mconv.bundle import is_bundle

    p = Path(path)
    shapes = _shapes(input_shapes)
    if shapes and not is_bundle(p) and not p.is_dir():
        from mconv.formats import open_model_with_shapes

        model = open_model_with_shapes(p, shapes)  # shapes fixed, downstream dims inferred
        kind = model.metadata_props.get("mconv.source_format", "onnx")
        return InspectResult({"path": str(p), "kind": kind, **inspect_model(model, top=top)})
    doc = inspect_path(p, top=top)
    if shapes:  # a bundle's inputs are what they are: the shapes are checked only
        from mconv.bundle import TensorSpec
        from mconv.edit.input_shapes import check_input_shapes

        specs = [TensorSpec.from_dict(d) for d in doc.get("inputs") or []]
        check_input_shapes(specs, shapes, path=str(p))
    return InspectResult(doc)
