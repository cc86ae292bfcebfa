"""Targets: tensor implementations behind one API (Swift for TensorFlow's many-Tensors idea).

Each target is one subpackage exposing a module-level ``TARGET`` object with:

- ``name: str``
- ``export(model: onnx_ir.Model, out_dir: Path, options: dict) -> mconv.bundle.Bundle``
- ``load(bundle: mconv.bundle.Bundle) -> Runner`` (where this machine can run it)

A ``Runner`` has ``inputs`` (list of ``mconv.bundle.TensorSpec``), ``outputs`` (list of names)
and ``run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]``.
"""

from __future__ import annotations

import importlib
from typing import Any

from mconv.errors import InputError

# One line per target: name -> module. A new target is one new folder plus one line here.
_TARGETS = {
    "reference": "mconv.targets.reference",
    "cpu": "mconv.targets.cpu",
    "xla": "mconv.targets.xla",
    "metal": "mconv.targets.metal",
    "webgpu": "mconv.targets.webgpu",
    "weights": "mconv.targets.weights",  # weight-only bundles (export only)
}


def names() -> list[str]:
    return list(_TARGETS)


def get_target(name: str) -> Any:
    if name not in _TARGETS:
        raise InputError(f"unknown target '{name}'", hint=f"choose one of: {', '.join(_TARGETS)}")
    module = importlib.import_module(_TARGETS[name])
    return module.TARGET
