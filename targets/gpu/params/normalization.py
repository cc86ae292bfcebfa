"""Normalization parameters: LayerNormalization's conditions, the softmax family's axis."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from mconv.targets.gpu.ops import LowerContext
from mconv.targets.gpu.values import required, static_dims


def check_layernorm(ctx: LowerContext, node: ir.Node) -> str | None:
    xs = required(node.inputs[0], node).shape
    if xs is None:
        return None
    axis = node.attributes.get_int("axis", -1)
    axis = axis + len(xs) if axis < 0 else axis
    size = int(np.prod(static_dims(xs)[axis:]))
    for v in node.inputs[1:3]:
        if v is not None and v.shape is not None and int(np.prod(static_dims(v.shape))) not in (1, size):
            return "scale or bias not of the normalized shape"
    if any(o is not None and o.uses() for o in node.outputs[1:]):
        return "mean or inv_std_dev output used"
    return None


def softmax_axis(node: ir.Node) -> int | None:
    """A softmax-family node's ``axis`` attribute, None when absent (its default depends on the
    opset: :func:`mconv.onnx_rules.softmax_axes`)."""
    a = node.attributes.get("axis")
    return None if a is None else a.as_int()
