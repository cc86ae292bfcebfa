"""MSL kernel generators: one rule per ONNX op type, op families in files named as the reference
executor's (conv.py, pooling.py, activation.py, ...: the same op in the same family everywhere).

A rule ``lower(ctx, node, act) -> Layer`` writes one ``kernel void`` specialized for the node:
shapes, strides and padding are ``constant`` values baked in the source under the layer's
prefix (``L3_OH``), so the Metal compiler (and g++ in the Linux harness) folds them.

Kernel conventions (the Swift host and the harness both rely on them):

1. Parameters are the layer's buffers, in the plan's binding order, ``[[buffer(i)]]`` numbered
   0..n-1: inputs first, then weights in the node's input order, the output last.
2. Storage type ``T`` (``half`` by default, ``float`` with precision fp32); every sum and every
   transcendental is computed in ``float``.
3. No threadgroup memory, no barriers: each thread computes its outputs from device memory
   alone, so grid points may run in any order (the harness runs them sequentially).
4. A thread outside the output returns at once (grids are exact, the guard is for safety).
5. A fused activation is an expression of the float ``v`` (:func:`activation_expr`).
"""

from __future__ import annotations

from collections.abc import Callable

from mconv.targets.gpu import expr
from mconv.targets.gpu.ops import (
    ACTIVATIONS,
    FUSIBLE,
    INTEGER_OPS,
    UNARY_ACTIVATIONS,
    Activation,
    KernelSource,
    exact_integer_limit,
    flit,
)
from mconv.targets.gpu.ops import LowerContext as _Context

__all__ = [
    "ACTIVATIONS",
    "CHECKS",
    "FUSIBLE",
    "INTEGER_OPS",
    "LOWER",
    "UNARY_ACTIVATIONS",
    "Activation",
    "KernelSource",
    "LowerContext",
    "activation_expr",
    "exact_integer_limit",
    "flit",
    "register",
]


class LowerContext(_Context):
    """The planner's context with MSL's kernel signature (convention 1)."""

    def buffer_param(self, index: int, name: str, *, out: bool = False) -> str:
        qual = "device" if out else "device const"
        return f"{qual} {self.storage}* {name} [[buffer({index})]]"

    def signature(self, kernel: str, params: list[str]) -> str:
        joined = ",\n    ".join([*params, "uint3 gid [[thread_position_in_grid]]"])
        return f"kernel void {kernel}(\n    {joined})"


def activation_expr(act: Activation | None, v: str = "v") -> str:
    """The MSL expression of ``act`` applied to the float ``v``."""
    return expr.activation_expr(act, v, expr.MSL)


# op_type -> rule(ctx, node, kernel_name, act) -> KernelSource (or a list: one per output);
# filled by the family modules.
LOWER: dict[str, Callable] = {}
# op_type -> check(ctx, node) -> None (lowerable) or the reason it is not; consulted by the
# planner before lowering so that every unsupported node is named at once.
CHECKS: dict[str, Callable] = {}


def register(
    *op_types: str, fusible: bool = False, check: Callable | None = None, integers: bool = False
) -> Callable[[Callable], Callable]:
    """A rule for ``op_types``; ``fusible`` and ``integers`` restate the planner's op classes
    (:data:`~mconv.targets.gpu.ops.FUSIBLE`, :data:`~mconv.targets.gpu.ops.INTEGER_OPS`) and
    are checked against them."""

    def deco(fn: Callable) -> Callable:
        for op in op_types:
            LOWER[op] = fn
            if fusible != (op in FUSIBLE) or integers != (op in INTEGER_OPS):
                raise AssertionError(f"{op}: the MSL rule's op classes are not the planner's")
            if check is not None:
                CHECKS[op] = check
        return fn

    return deco


# One line per family module.
from mconv.targets.metal.msl import (  # noqa: E402,F401
    activation,
    conv,
    elementwise,
    indexing,
    matmul,
    normalization,
    pooling,
    quantization,
    recurrent,
    reduction,
    sampling,
    shape,
)
