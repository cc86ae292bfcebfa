"""The xla target: the graph lowered to ``jax.lax`` and exported with ``jax.export`` as StableHLO.

- :mod:`mconv.engines.xla.lower`: the lowering registry (one rule per ONNX op, families in files)
  and the graph lowering.
- :mod:`mconv.targets.xla.exporter`: ``export(model, out_dir, options) -> Bundle``.
- :mod:`mconv.targets.xla.runtime`: the loader, which imports only jax, numpy and the weight
  container, so that a serving process needs no ONNX.
- :mod:`mconv.targets.xla.check`: what the loader checks in a bundle's program before anything
  of it is deserialized for a call (custom calls and operations mconv's exporter writes, the
  header against ``xla.json`` and the manifest).

This module imports nothing heavy itself: importing the loader must not pull in onnx.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from mconv.targets.xla.options import Options as Options  # the export options

NAME = "xla"


def export(model: Any, out_dir: str | os.PathLike, options: Mapping | None = None) -> Any:
    """Write an xla bundle (see :mod:`mconv.targets.xla.exporter`)."""
    from mconv.targets.xla.exporter import export as _export

    return _export(model, out_dir, options)


def load(bundle: Any) -> Any:
    """An :class:`~mconv.targets.xla.runtime.XlaRunner` for a bundle (a ``Bundle`` or a path)."""
    from mconv.targets.xla.runtime import load_bundle_path, runner_from_parts

    if isinstance(bundle, (str, os.PathLike)):
        return load_bundle_path(bundle)
    # An mconv.bundle.Bundle: its files were checked by load_bundle.
    return runner_from_parts(bundle.manifest, bundle.read_bytes, bundle.container, str(bundle.root))


def load_model(model: Any, label: str = "model", options: Mapping | None = None) -> Any:
    """Run a bare IR model on XLA without writing a bundle (lower, export, call in memory)."""
    import jax
    from mconv.targets.xla.exporter import export_program
    from mconv.targets.xla.runtime import Spec, XlaRunner, jit

    exported, lowered, shapes, x64 = export_program(model, options)
    if lowered.shape_note:
        import sys

        print(lowered.shape_note, file=sys.stderr)
    n_in = len(lowered.input_names)
    with jax.enable_x64(x64):
        weights = [jax.device_put(a) for _, a in lowered.weights()]
    inputs = [
        Spec(n, a.dtype.name, tuple(d if isinstance(d, int) else str(d) for d in a.shape))
        for n, a in zip(lowered.input_names, exported.in_avals[:n_in])
    ]
    return XlaRunner(jit(exported.call), inputs, list(lowered.output_names), weights, x64, label, exported)


# The target (the protocol of mconv.targets.base) is this module.
name = NAME
TARGET = sys.modules[__name__]
