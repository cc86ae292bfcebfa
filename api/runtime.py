"""Open anything runnable: a bundle (on its target) or a bare model (reference, or a named target)."""

from __future__ import annotations

from pathlib import Path

import onnx_ir as ir
from mconv.bundle import TensorSpec
from mconv.errors import InputError


def value_spec(value: ir.Value) -> TensorSpec:
    return TensorSpec.from_value(value)


def open_model(path: str | Path) -> ir.Model:
    """Load any importable model file (ONNX or any registered format) into the IR."""
    from mconv.formats import import_model

    p = Path(path)
    if p.suffix.lower() == ".onnx":
        from mconv.irio import load_onnx

        return load_onnx(p)
    return import_model([p])


def open_runner(path: str | Path, target: str | None = None):
    """A runner for ``path``: a bundle runs on its own target, a model on ``target`` (default reference)."""
    from mconv.bundle import is_bundle, load_bundle
    from mconv.targets import get_target

    p = Path(path)
    if is_bundle(p):
        bundle = load_bundle(p)
        if target and target != bundle.target:
            raise InputError(
                f"bundle is for target '{bundle.target}', not '{target}'",
                path=str(p),
                hint="drop --target or export the model for that target",
            )
        return get_target(bundle.target).load(bundle)
    if p.is_dir():
        raise InputError(
            "is a directory without manifest.json, not a bundle",
            path=str(p),
            hint="give a model file or a bundle directory",
        )
    model = open_model(p)
    return get_target(target or "reference").load_model(model)
