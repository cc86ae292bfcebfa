"""The lowering registry of the xla target: one rule per ONNX op, mapping it to ``jax.lax`` calls.

It mirrors the reference executor's op registry (:mod:`mconv.engines.reference.ops`): an op
family lives in one module of this package and registers its rules with :func:`lower`; the
graph lowering (:func:`lower_graph`) knows nothing about particular ops.

Conventions
-----------
rule(inputs, attrs, ctx) -> tuple of outputs
    ``inputs``: one entry per node input: a jax array (traced), an ``np.ndarray`` (a value known
    at trace time: a constant, a shape) or ``None`` for an omitted optional input. ``attrs``:
    the node's attributes as plain Python values; absent attributes are absent, so rules apply
    their ONNX defaults.

Static values
-------------
1. A rule declares with ``static=(i, ...)`` the inputs it needs as concrete values at trace
   time (Reshape's shape, Slice's starts, Pad's pads, ...). The lowering walks back from those
   inputs: every value they depend on is evaluated with numpy at trace time (the reference
   executor's kernels), and initializers among them are embedded in the program instead of
   becoming weight arguments.
2. A node whose inputs are all static is itself evaluated with numpy (constant folding at trace
   time), so Shape -> Gather -> Concat -> Reshape chains reach Reshape as numbers.
3. Under a symbolic batch, ``Shape`` yields an object array holding jax's symbolic dimension;
   the shape arithmetic ops below evaluate such arrays with numpy's object dtype.
4. A rule marked ``shape_only`` reads only its input's shape (Shape, Size): nothing upstream of
   it has to be static.
5. A rule may *prefer* inputs static (``prefer_static=(i, ...)``: the scales and zero points of
   quantized ops): an initializer there is embedded as a static value, so the rule can compute
   with numpy what depends only on it (a requantization table); any other value stays traced
   and the rule computes the same with jax.

Domains
-------
Ops of the default domain are keyed by their name; ops of another domain (``com.microsoft``)
by ``"domain::name"``, as the reference executor's registry names them. :func:`lookup` is the
one way to find a node's rule.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Rule = Callable[[list, dict, "LowerContext"], Sequence[Any]]


@dataclass
class LowerContext:
    """What a rule may need beyond its inputs and attributes."""

    opset: int = 21
    node_name: str = ""
    num_outputs: int = 1
    # The element type of each input as the graph declares it (``onnx_ir.DataType`` names, None
    # where unknown): 4-bit codes reach rules widened to 8 bits, and some rules must know which.
    input_types: list = field(default_factory=list)
    # The static batch the model declared (its inputs' leading dimension) and the dimension
    # that replaces it in the exported function (a symbolic dimension, or the static batch).
    declared_batch: int | None = None
    batch_dim: Any = None
    lower_subgraph: Any = None  # callable(graph, inputs, scope) -> outputs (Loop/Scan bodies)
    scope: dict = field(default_factory=dict)


@dataclass
class LowerRule:
    op_type: str
    fn: Rule
    static: tuple[int, ...] = ()
    shape_only: bool = False
    prefer_static: tuple[int, ...] = ()


REGISTRY: dict[str, LowerRule] = {}


def key(op_type: str, domain: str = "") -> str:
    """The registry key of ``domain::op_type`` (the bare name for the default domain)."""
    return op_type if domain in ("", "ai.onnx") else f"{domain}::{op_type}"


def lower(
    *op_types: str,
    static: tuple[int, ...] = (),
    shape_only: bool = False,
    domain: str = "",
    prefer_static: tuple[int, ...] = (),
) -> Callable[[Rule], Rule]:
    """Register ``fn`` as the lowering of each op type of ``domain`` in ``op_types``."""

    def deco(fn: Rule) -> Rule:
        for op in op_types:
            REGISTRY[key(op, domain)] = LowerRule(op, fn, tuple(static), shape_only, tuple(prefer_static))
        return fn

    return deco


def lookup(op_type: str, domain: str = "") -> LowerRule | None:
    return REGISTRY.get(key(op_type, domain))


def is_static(x: Any) -> bool:
    return x is None or isinstance(x, (np.ndarray, np.generic))


def static_ints(x: Any) -> list:
    """A static 1-D value as a list of Python ints (symbolic dimensions pass through)."""
    arr = np.asarray(x).reshape(-1)
    if arr.dtype == object:
        return [v if not isinstance(v, (np.integer, int)) else int(v) for v in arr]
    return [int(v) for v in arr]


# One line per op family. A new family is one new module plus one line here.
_FAMILIES = (
    "conv",
    "pooling",
    "normalization",
    "matmul",
    "elementwise",
    "activation",
    "reduction",
    "shape",
    "indexing",
    "recurrent",
    "controlflow",
    "quantization",
    "signal",
    "sampling",
    "misc",
    "contrib",
)

for _family in _FAMILIES:
    importlib.import_module(f"{__name__}.{_family}")

from mconv.engines.xla.lower.graph import LoweredGraph, lower_graph  # noqa: E402

__all__ = ["REGISTRY", "LowerContext", "LowerRule", "LoweredGraph", "key", "lookup", "lower", "lower_graph"]
