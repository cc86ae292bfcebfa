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
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir
from mconv.targets.metal.values import static_dims

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


@dataclass(frozen=True)
class Activation:
    """A fused activation (an elementwise function of one float): kind (relu, clip, leaky, sigmoid,
    tanh, gelu, gelu_tanh, swish, hardsigmoid, hardswish, elu, selu, celu, softplus, softsign,
    mish, neg, exp, log, sqrt, abs, reciprocal, erf, floor, ceil, round, sin, cos, identity; mul,
    add, div: by a constant scalar; quantize, dequantize: per-tensor Q/DQ) and
    params."""

    kind: str
    params: tuple[float, ...] = ()
    nodes: tuple[str, ...] = ()
    then: Activation | None = None  # applied to this one's result (a fused chain)

    def then_apply(self, other: Activation) -> Activation:
        """This activation followed by ``other``; ``kind`` names the chain (``relu+clip``)."""
        tail = other if self.then is None else self.then.then_apply(other)
        return Activation(f"{self.kind.split('+')[0]}+{tail.kind}", self.params, self.nodes, tail)


def flit(x: float) -> str:
    """A float32 literal for MSL/C++ (``1.5f``); infinities as ``INFINITY``."""
    v = float(np.float32(x))
    if np.isinf(v):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    text = repr(v)
    if "e" not in text and "." not in text:
        text += ".0"
    return f"({text}f)" if text.startswith("-") else f"{text}f"


def activation_expr(act: Activation | None, v: str = "v") -> str:
    """The MSL expression of ``act`` applied to the float ``v``."""
    if act is None:
        return v
    if act.then is not None:
        base = Activation(act.kind.split("+")[0], act.params, act.nodes)
        return activation_expr(act.then, activation_expr(base, v))
    k, p = act.kind, act.params
    if k == "relu":
        return f"max({v}, 0.0f)"
    if k == "clip":
        lo, hi = p
        out = v
        if np.isfinite(lo):
            out = f"max({out}, {flit(lo)})"
        if np.isfinite(hi):
            out = f"min({out}, {flit(hi)})"
        return out
    if k == "leaky":
        return f"({v} >= 0.0f ? {v} : {flit(p[0])} * {v})"
    if k == "sigmoid":
        return f"(1.0f / (1.0f + exp(-{v})))"
    if k == "tanh":
        return f"tanh({v})"
    if k == "gelu":
        return f"(0.5f * {v} * (1.0f + mconv_erf({v} * 0.70710678118654752f)))"
    if k == "gelu_tanh":
        return f"(0.5f * {v} * (1.0f + tanh(0.79788456080286536f * ({v} + 0.044715f * {v} * {v} * {v}))))"
    if k == "swish":
        return f"({v} / (1.0f + exp(-{v})))"
    if k == "hardsigmoid":
        return f"min(max({flit(p[0])} * {v} + {flit(p[1])}, 0.0f), 1.0f)"
    if k == "hardswish":
        return f"({v} * min(max({v} * {flit(1 / 6)} + 0.5f, 0.0f), 1.0f))"
    if k == "elu":
        return f"({v} >= 0.0f ? {v} : {flit(p[0])} * (exp({v}) - 1.0f))"
    if k == "celu":
        return f"(max({v}, 0.0f) + min(0.0f, {flit(p[0])} * (exp({v} / {flit(p[0])}) - 1.0f)))"
    if k == "selu":
        a, g = p
        return f"({v} > 0.0f ? {flit(g)} * {v} : {flit(g * a)} * (exp({v}) - 1.0f))"
    if k == "softplus":  # log(1 + e^v) without overflow
        return f"(max({v}, 0.0f) + log(1.0f + exp(-fabs({v}))))"
    if k == "softsign":
        return f"({v} / (1.0f + fabs({v})))"
    if k == "quantize":  # QuantizeLinear per tensor: scale, zero point, code range
        sc, zp, lo, hi = p
        return f"min(max(rint({v} / {flit(sc)}) + {flit(zp)}, {flit(lo)}), {flit(hi)})"
    if k == "dequantize":  # DequantizeLinear per tensor: scale, zero point
        return f"(({v} - {flit(p[1])}) * {flit(p[0])})"
    if k in ("mul", "add", "div"):  # x * c, x + c, x / c by a constant scalar (a literal)
        return f"({v} {dict(mul='*', add='+', div='/')[k]} {flit(p[0])})"
    if k == "mish":
        return f"({v} * tanh(max({v}, 0.0f) + log(1.0f + exp(-fabs({v})))))"
    simple = {
        "neg": "(-{v})",
        "exp": "exp({v})",
        "log": "log({v})",
        "sqrt": "sqrt({v})",
        "abs": "fabs({v})",
        "reciprocal": "(1.0f / {v})",
        "erf": "mconv_erf({v})",
        "floor": "floor({v})",
        "ceil": "ceil({v})",
        "round": "rint({v})",
        "sin": "sin({v})",
        "cos": "cos({v})",
        "identity": "{v}",
    }
    if k in simple:
        return simple[k].format(v=v)
    raise ValueError(f"unknown activation {k}")


@dataclass
class KernelSource:
    """A generated kernel: name, MSL text, the values it reads (binding order) and grid size.

    The output value is bound last, after ``reads``. A rule for a node with several outputs
    (Split) returns one KernelSource per output, each naming its ``output``.
    """

    name: str
    source: str
    reads: list[ir.Value]
    grid: tuple[int, int, int]
    threadgroup: tuple[int, int, int] = field(default=(1, 1, 1))
    output: ir.Value | None = None  # the value written; None: the node's first output

    def __post_init__(self) -> None:
        if self.threadgroup == (1, 1, 1):
            self.threadgroup = threadgroup_for(self.grid)


class LowerContext:
    """What a rule may ask about the graph: static shapes, constants, the storage type."""

    def __init__(self, storage: str, opset: int) -> None:
        self.storage = storage  # "half" or "float"
        self.opset = opset

    def shape(self, value: ir.Value) -> list[int]:
        """The static shape of ``value`` (the planner bakes every shape before lowering)."""
        assert value.shape is not None
        return static_dims(value.shape)

    @staticmethod
    def const(value: ir.Value | None) -> np.ndarray | None:
        if value is None or value.const_value is None:
            return None
        return value.const_value.numpy()

    def buffer_param(self, index: int, name: str, *, out: bool = False) -> str:
        qual = "device" if out else "device const"
        return f"{qual} {self.storage}* {name} [[buffer({index})]]"

    def signature(self, kernel: str, params: list[str]) -> str:
        joined = ",\n    ".join([*params, "uint3 gid [[thread_position_in_grid]]"])
        return f"kernel void {kernel}(\n    {joined})"


def threadgroup_for(grid: tuple[int, int, int]) -> tuple[int, int, int]:
    """A threadgroup of at most 256 threads that fits the grid (dispatchThreads trims edges)."""
    x = min(grid[0], 256)
    y = min(grid[1], max(1, 256 // x))
    z = min(grid[2], max(1, 256 // (x * y)))
    return (x, y, z)


# op_type -> rule(ctx, node, kernel_name, act) -> KernelSource (or a list: one per output);
# filled by the family modules.
LOWER: dict[str, Callable] = {}
# op_type -> check(ctx, node) -> None (lowerable) or the reason it is not; consulted by the
# planner before lowering so that every unsupported node is named at once.
CHECKS: dict[str, Callable] = {}
# op types whose kernel may apply a following activation node.
FUSIBLE: set[str] = set()
# activation op types (standalone: the unary kernel; after a FUSIBLE op: fused).
ACTIVATIONS = (
    "Relu",
    "Clip",
    "LeakyRelu",
    "Sigmoid",
    "Tanh",
    "Gelu",
    "HardSigmoid",
    "HardSwish",
    "Elu",
    "Celu",
    "Selu",
    "Softplus",
    "Softsign",
    "Mish",
    "Neg",
    "Exp",
    "Log",
    "Sqrt",
    "Abs",
    "Reciprocal",
    "Erf",
    "Floor",
    "Ceil",
    "Round",
    "Sin",
    "Cos",
)
# the activation family's ops among them (kernels/activation.py); the rest are elementwise math
UNARY_ACTIVATIONS = (
    "Relu",
    "LeakyRelu",
    "Sigmoid",
    "Tanh",
    "Gelu",
    "HardSigmoid",
    "HardSwish",
    "Elu",
    "Celu",
    "Selu",
    "Softplus",
    "Softsign",
    "Mish",
)


# op types whose kernels are exact on integer-valued tensors held as floats (data movement,
# comparisons, logic, Where, Cast, Q/DQ, +, -, *, min, max); the planner refuses integer or bool
# values in any other kernel.
INTEGER_OPS: set[str] = set()


def exact_integer_limit(storage: str) -> int:
    """The largest integer magnitude below which every integer is exact in ``storage``."""
    return 2**11 if storage == "half" else 2**24


def register(
    *op_types: str, fusible: bool = False, check: Callable | None = None, integers: bool = False
) -> Callable[[Callable], Callable]:
    def deco(fn: Callable) -> Callable:
        for op in op_types:
            LOWER[op] = fn
            if fusible:
                FUSIBLE.add(op)
            if integers:
                INTEGER_OPS.add(op)
            if check is not None:
                CHECKS[op] = check
        return fn

    return deco


# One line per family module.
from mconv.targets.metal.kernels import (  # noqa: E402,F401
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
