"""The reference target: the numpy interpreter that verification trusts.

It runs an ``onnx_ir.Model`` in memory (:class:`~mconv.engines.reference.executor.Executor`) and
differentiates it (reverse mode), which calibration, sensitivity analysis and fine-tuning use.
It has no bundle: deploy with the ``cpu`` target.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx_ir as ir
from mconv.bundle import TensorSpec
from mconv.engines.reference.executor import Executor, run_node
from mconv.errors import InputError
from mconv.irio import real_inputs
from mconv.targets.reference.options import Options

__all__ = ["TARGET", "Executor", "Options", "ReferenceRunner", "export", "load", "load_model", "run_node"]


class ReferenceRunner:
    """The Runner API (``inputs``, ``outputs``, ``run``) over an :class:`Executor`."""

    def __init__(self, model: ir.Model, *, dtype_check: bool = True) -> None:
        self.executor = Executor(model, dtype_check=dtype_check)
        self.inputs: list[TensorSpec] = [TensorSpec.from_value(v) for v in real_inputs(model.graph)]
        self.outputs: list[str] = list(self.executor.output_names)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.executor.run(feeds)


NAME = "reference"
name = NAME


def load_model(model: ir.Model, label: str = "model") -> ReferenceRunner:
    return ReferenceRunner(model)


def export(model: ir.Model, out_dir: str | os.PathLike, options: Mapping | None = None) -> Any:
    raise InputError("reference target has no bundle; use cpu", hint="mconv export --target cpu")


def load(bundle: Any) -> ReferenceRunner:
    raise InputError(
        "reference target has no bundle; use cpu",
        hint="load the bundle with the cpu target, or pass a model to load_model",
    )


# The target (the protocol of mconv.targets.base) is this module.
TARGET = sys.modules[__name__]
