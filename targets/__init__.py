"""Targets: tensor implementations behind one API (Swift for TensorFlow's many-Tensors idea).

Each target is one subpackage exposing a module-level ``TARGET`` that keeps the protocol of
:mod:`mconv.targets.base` (``name``, ``Options``, ``export``, ``load``, ``load_model``, optional
``to_model``); a built-in target's ``TARGET`` is its package module. Its export options are a
dataclass in ``<package>/options.py`` (:func:`options_class`), which the command line reads
without importing the target.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any

from mconv.errors import InputError

# One line per target: name -> module. A new target is one new folder plus one line here.
_TARGETS = {
    "reference": "mconv.targets.reference",
    "cpu": "mconv.targets.cpu",
    "xla": "mconv.targets.xla",
    "metal": "mconv.targets.metal",
    "webgpu": "mconv.targets.webgpu",
    "tflite": "mconv.targets.tflite",  # LiteRT flatbuffers
    "weights": "mconv.targets.weights",  # weight-only bundles (export only)
}


def names() -> list[str]:
    return list(_TARGETS)


def get_target(name: str) -> Any:
    if name not in _TARGETS:
        raise InputError(f"unknown target '{name}'", hint=f"choose one of: {', '.join(_TARGETS)}")
    module = importlib.import_module(_TARGETS[name])
    return module.TARGET


def options_class(name: str) -> type:
    """The ``Options`` dataclass of target ``name`` (from ``<package>/options.py``, so a runtime
    such as ONNX Runtime or jax is not imported for it)."""
    if name not in _TARGETS:
        raise InputError(f"unknown target '{name}'", hint=f"choose one of: {', '.join(_TARGETS)}")
    module = f"{_TARGETS[name]}.options"
    if module not in sys.modules:
        # the options file alone, without its package's __init__, which imports the target's
        # runtime (ONNX Runtime, onnx, the executor): every command builds its flags from these,
        # and a command that never exports should not pay 2 s of imports for them
        package = importlib.util.find_spec(_TARGETS[name])
        assert package is not None and package.submodule_search_locations
        path = os.path.join(list(package.submodule_search_locations)[0], "options.py")
        spec = importlib.util.spec_from_file_location(module, path)
        assert spec is not None and spec.loader is not None
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[module] = loaded
        try:
            spec.loader.exec_module(loaded)
        except BaseException:
            del sys.modules[module]
            raise
    return sys.modules[module].Options


def check_export_options(name: str, options: dict, *, path: str | None = None) -> dict:
    """The options given for an export to ``name``, each one the target declares (else one line,
    exit 2, naming the target); None and False mean not given."""
    from mconv.targets.base import check_options

    return check_options(name, options_class(name), options, path=path)
