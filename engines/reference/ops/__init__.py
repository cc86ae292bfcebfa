"""The op registry of the reference executor: one entry per ONNX op, forward and VJP side by side.

An op family (convolution, pooling, normalization, elementwise, ...) lives in one module of this
package; each module registers its ops with the decorators below. The interpreter
(:mod:`mconv.engines.reference.executor`) knows nothing about particular ops: it looks them up
here.

Conventions
-----------
forward(inputs, attrs, ctx) -> tuple of outputs
    ``inputs``: list of ``np.ndarray`` (or ``None`` for an omitted optional input; sequences are
    Python lists, optionals may be ``None``). ``attrs``: dict of Python values (int, float, str,
    list, ``np.ndarray`` for tensor attributes, ``onnx_ir.Graph`` for graph attributes); attributes
    absent from the node are absent from the dict, so ops apply their ONNX defaults.
vjp(inputs, attrs, outputs, grads, ctx) -> list with one gradient (or None) per input
    ``outputs`` are the forward results, ``grads`` the cotangents of each output (``None`` where
    an output received no gradient). Gradients must have the exact shape and dtype of the input.

Exactness
---------
The reference is the oracle every other runtime is checked against, so its forwards are the most
exact in the room: products and sums over many terms (Conv, ConvTranspose, MatMul, Gemm, Einsum,
the summing reductions, average pooling, normalization statistics, Softmax, the recurrent cells)
accumulate in float64 when the inputs are float16, bfloat16 or float32 (:func:`wide`), and the
result is rounded once to the ONNX output type. A float32 BLAS GEMM over K terms is off by about
``sqrt(K) * 6e-8`` relative; float64 leaves only the final rounding. Reverse mode
(:meth:`Executor.value_and_grad`, :meth:`Executor.vjp`) runs under :func:`fast_math`: gradients
for fine-tuning need no oracle precision, and float32 GEMMs are about twice as fast. Under it
float16 and bfloat16 accumulate in float32 (as on a GPU), never in their own type; outputs are
still rounded to their ONNX type.

A runner's constants (initializers, Constant values) are widened once, not once per run: the
executor hands kernels a :class:`WideConstants` (:func:`wide_constants`), and :func:`widen`
returns its read-only wide copy of a constant, made on first use. Only constants that a
wide-accumulating kernel reads get one (a float32 weight costs twice its size again in float64);
a kernel widens a constant before it reshapes or transposes it, so that the lookup finds it.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Forward = Callable[[list, dict, "OpContext"], Sequence[Any]]
Vjp = Callable[[list, dict, Sequence[Any], Sequence[Any], "OpContext"], list]


_EXACT: contextvars.ContextVar[bool] = contextvars.ContextVar("mconv_reference_exact", default=True)
_NARROW_FLOATS = {"float16", "bfloat16", "float32"}


def exact() -> bool:
    """Whether forwards accumulate wide (the default; off inside :func:`fast_math`)."""
    return _EXACT.get()


@contextlib.contextmanager
def fast_math() -> Iterator[None]:
    """Accumulate in float32 (reverse mode, fp16(mode=auto)'s trial runs: speed beats the last
    bits). float16 and bfloat16 inputs too: numpy has no BLAS for them, and a GPU accumulates
    them in float32 as well."""
    token = _EXACT.set(False)
    try:
        yield
    finally:
        _EXACT.reset(token)


def wide(dtype: np.dtype) -> np.dtype:
    """The dtype a forward accumulates in for inputs of ``dtype``: float64 for float16, bfloat16
    and float32 in exact mode, float32 for them under :func:`fast_math`, else ``dtype`` itself
    (float64, integers, ...)."""
    dtype = np.dtype(dtype)
    if dtype.name in _NARROW_FLOATS:
        return np.dtype(np.float64 if _EXACT.get() else np.float32)
    return dtype


class WideConstants:
    """Wide copies of one runner's constant arrays, made on first use and kept until the constant
    is replaced (:meth:`discard`). Arrays are told apart by identity; a slot holds its array, so
    its id cannot be reused while the slot lives. The copies are read-only, and a constant must
    not be written in place (replace it instead): its copy would go stale."""

    def __init__(self) -> None:
        self._slots: dict[int, tuple[np.ndarray, dict[np.dtype, np.ndarray]]] = {}

    def add(self, array: Any) -> None:
        if isinstance(array, np.ndarray) and array.dtype.kind in "fV":
            self._slots[id(array)] = (array, {})

    def discard(self, array: Any) -> None:
        self._slots.pop(id(array), None)

    def get(self, x: np.ndarray, dtype: np.dtype) -> np.ndarray | None:
        slot = self._slots.get(id(x))
        if slot is None or slot[0] is not x:
            return None
        copy = slot[1].get(dtype)
        if copy is None:
            copy = x.astype(dtype)
            copy.flags.writeable = False
            slot[1][dtype] = copy
        return copy

    @property
    def nbytes(self) -> int:
        """Bytes held by the wide copies."""
        return sum(c.nbytes for _, copies in self._slots.values() for c in copies.values())


_CONSTANTS: contextvars.ContextVar[WideConstants | None] = contextvars.ContextVar(
    "mconv_reference_constants", default=None
)


@contextlib.contextmanager
def wide_constants(constants: WideConstants) -> Iterator[None]:
    """Let :func:`widen` reuse the wide copies of ``constants`` (the executor's, while it runs)."""
    token = _CONSTANTS.set(constants)
    try:
        yield
    finally:
        _CONSTANTS.reset(token)


def widen(x: np.ndarray, dtype: Any = None) -> np.ndarray:
    """``x`` in ``dtype`` (default: :func:`wide` of its dtype); no copy when it already is, the
    runner's kept copy when ``x`` is one of its constants."""
    target = wide(x.dtype) if dtype is None else np.dtype(dtype)
    if x.dtype == target:
        return x
    constants = _CONSTANTS.get()
    if constants is not None:
        copy = constants.get(x, target)
        if copy is not None:
            return copy
    return x.astype(target)


@dataclass
class OpContext:
    """What an op may need beyond its inputs and attributes."""

    opset: int = 21  # opset version of the op's domain in the running model
    executor: Any = None  # the running Executor (control-flow ops run subgraphs through it)
    scope: Mapping[str, Any] = field(default_factory=dict)  # outer-scope values visible to subgraphs
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    num_outputs: int | None = None  # outputs the node declares (Split without sizes needs it)


@dataclass
class OpDef:
    op_type: str
    domain: str
    forward: Forward
    vjp: Vjp | None = None


REGISTRY: dict[tuple[str, str], OpDef] = {}


def _norm_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def register(*op_types: str, domain: str = "") -> Callable[[Forward], Forward]:
    """Register ``fn`` as the forward of each op type in ``op_types``."""

    def deco(fn: Forward) -> Forward:
        for op in op_types:
            key = (op, _norm_domain(domain))
            if key in REGISTRY:
                REGISTRY[key].forward = fn
            else:
                REGISTRY[key] = OpDef(op, key[1], fn)
        return fn

    return deco


def register_vjp(*op_types: str, domain: str = "") -> Callable[[Vjp], Vjp]:
    """Register ``fn`` as the vector-Jacobian product of each op type (forward registered first)."""

    def deco(fn: Vjp) -> Vjp:
        for op in op_types:
            REGISTRY[(op, _norm_domain(domain))].vjp = fn
        return fn

    return deco


def lookup(op_type: str, domain: str = "") -> OpDef | None:
    return REGISTRY.get((op_type, _norm_domain(domain)))


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
    "sequence",
    "quantization",
    "signal",
    "sampling",
    "misc",
    "ml",
    "contrib",
)

for _family in _FAMILIES:
    importlib.import_module(f"{__name__}.{_family}")
