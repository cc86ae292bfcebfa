"""The values a kernel rule reads, typed: inputs a rule needs, shapes the planner baked; and
the outputs a runner gives back typed (integers and bool are held as floats in the buffers)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx_ir as ir
from mconv.errors import InputError, show


def required(value: ir.Value | None, node: ir.Node | None = None) -> ir.Value:
    """``value``, an input the op needs: absent, the model is bad (the planner names the node
    a rule lowers; ``node`` names it elsewhere)."""
    if value is None:
        raise InputError(
            "a required input is absent",
            where=f"node '{show(node.name)}'" if node is not None else None,
            hint="the model omits an input this op needs",
        )
    return value


def all_required(values: Iterable[ir.Value | None], node: ir.Node | None = None) -> list[ir.Value]:
    """Every one of ``values``, each an input the op needs (see :func:`required`)."""
    return [required(v, node) for v in values]


def static_dims(dims_in: ir.Shape) -> list[int]:
    """The dims of a shape the planner baked: all ints (a symbolic one left is bad input)."""
    dims = [d for d in dims_in if isinstance(d, int)]
    if len(dims) != len(dims_in):
        raise InputError(
            f"shape {dims_in} is not static",
            hint="the metal target bakes shapes: give them with export --input-shape NAME=DIMS",
        )
    return dims


def typed_output(values: np.ndarray, dtype: str | None) -> np.ndarray:
    """A float32 output as the model's output type: bool as nonzero, integers rounded (they are
    exact integers in the buffer), anything else float32."""
    if not dtype or dtype in ("float32", "float16", "float64", "bfloat16"):
        return values
    if dtype == "bool":
        return values != 0
    try:
        kind = np.dtype(dtype)
    except TypeError:
        return values
    if kind.kind not in "iu":
        return values
    info = np.iinfo(kind)
    return np.clip(np.rint(values), info.min, info.max).astype(kind)
