"""ONNX semantics every engine reads from one place: attribute defaults of the activations and
the opset-dependent axis rule of the softmax family.

Rules:

1. :data:`DEFAULTS` holds ONNX's default of each attribute an engine reads here (the values
   ``onnx.defs`` declares; ``tests/test_onnx_rules.py`` checks them against it); :func:`attr`
   reads an attribute from a node's attribute mapping, else its default.
2. Softmax, LogSoftmax and Hardmax (:func:`softmax_axes`): before opset 13 the input is coerced
   to 2-D at ``axis`` (default 1) and normalized over every axis from ``axis`` on; from opset
   13, over the one ``axis`` (default -1).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["DEFAULTS", "attr", "default", "softmax_axes"]

DEFAULTS: dict[tuple[str, str], float] = {
    ("LeakyRelu", "alpha"): 0.01,
    ("Elu", "alpha"): 1.0,
    ("Celu", "alpha"): 1.0,
    ("Selu", "alpha"): 1.67326319217681884765625,
    ("Selu", "gamma"): 1.05070102214813232421875,
    ("HardSigmoid", "alpha"): 0.2,
    ("HardSigmoid", "beta"): 0.5,
}


def default(op: str, name: str) -> float:
    """ONNX's default of attribute ``name`` of ``op`` (rule 1)."""
    return DEFAULTS[op, name]


def attr(attrs: Mapping, op: str, name: str) -> float:
    """``attrs[name]``, else ONNX's default (rule 1)."""
    return attrs.get(name, DEFAULTS[op, name])


def softmax_axes(rank: int, axis: int | None, opset: int) -> tuple[int, ...]:
    """The axes (non-negative, ascending) a softmax-family op normalizes over (rule 2);
    ``axis`` is the node's attribute, None when absent."""
    if opset < 13:
        a = 1 if axis is None else axis
        a = a + rank if a < 0 else a
        return tuple(range(a, rank))
    a = -1 if axis is None else axis
    return (a + rank if a < 0 else a,)
