"""Elementwise ops with numpy broadcasting: arithmetic, comparison, logic, math, Where, Cast.

Rules:

1. Integer Div truncates toward zero (C semantics, as ONNX Runtime and the reference do).
2. Mod with ``fmod=0`` takes the divisor's sign (floor); ``fmod=1`` the dividend's (C fmod).
3. Variadic Max/Min/Sum/Mean fold left over all inputs with broadcasting.
4. Cast to a type jax cannot hold (strings) is not lowered; float -> int casts truncate.
5. When every input is a static shape value (possibly holding a symbolic dimension) the op
   is evaluated with numpy on object arrays, so shape arithmetic stays static. Equal on a
   symbolic dimension is True or False only when jax can prove it; otherwise the node fails to
   lower (and the exporter falls back to static shapes, or asks for ``--input-shape``).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
import onnx_ir as ir
from jax import lax
from mconv.engines.xla.lower import is_static, lower


def _static_all(inputs) -> bool:
    return all(is_static(x) for x in inputs)


def _binary(np_fn, jnp_fn):
    def rule(inputs, attrs, ctx):
        a, b = inputs
        if _static_all(inputs):
            return (np.asarray(np_fn(np.asarray(a), np.asarray(b))),)
        return (jnp_fn(a, b),)

    return rule


def _int_div(a, b):
    if jnp.issubdtype(jnp.result_type(a), jnp.integer):
        return lax.div(a, jnp.asarray(b, jnp.result_type(a)))
    return jnp.divide(a, b)


def _np_div(a, b):
    if a.dtype == object or b.dtype == object or np.issubdtype(a.dtype, np.integer):
        return a // b
    return a / b


lower("Add")(_binary(np.add, jnp.add))
lower("Sub")(_binary(np.subtract, jnp.subtract))
lower("Mul")(_binary(np.multiply, jnp.multiply))
lower("Div")(_binary(_np_div, _int_div))


def _decide_equal(x, y) -> bool:
    """``x == y`` where either may be a symbolic dimension: jax's ``==`` answers False when it
    cannot prove equality, which would silently pick one branch of a ``size == 1`` test."""
    d = x - y
    if isinstance(d, (int, np.integer)):
        return bool(d == 0)
    if d == 0:
        return True
    for test in (lambda: d >= 1, lambda: d <= -1):
        try:
            if test():
                return False
        except Exception:  # noqa: BLE001 - InconclusiveDimensionOperation
            pass
    raise ValueError(f"whether symbolic dimension {x} equals {y} is decided only at run time")


def _np_equal(a, b):
    if a.dtype == object or b.dtype == object:
        return np.vectorize(_decide_equal, otypes=[bool])(a, b)
    return np.equal(a, b)


lower("Equal")(_binary(_np_equal, jnp.equal))
lower("Less")(_binary(np.less, jnp.less))
lower("LessOrEqual")(_binary(np.less_equal, jnp.less_equal))
lower("Greater")(_binary(np.greater, jnp.greater))
lower("GreaterOrEqual")(_binary(np.greater_equal, jnp.greater_equal))
lower("And")(_binary(np.logical_and, jnp.logical_and))
lower("Or")(_binary(np.logical_or, jnp.logical_or))
lower("Xor")(_binary(np.logical_xor, jnp.logical_xor))
lower("BitwiseAnd")(_binary(np.bitwise_and, jnp.bitwise_and))
lower("BitwiseOr")(_binary(np.bitwise_or, jnp.bitwise_or))
lower("BitwiseXor")(_binary(np.bitwise_xor, jnp.bitwise_xor))


@lower("Pow")
def pow_(inputs, attrs, ctx):
    a, b = inputs
    if is_static(b) and np.ndim(b) == 0 and float(b) == 2.0:
        return (jnp.square(a),)
    return (jnp.power(a, jnp.asarray(b).astype(jnp.result_type(a))),)


@lower("Mod")
def mod(inputs, attrs, ctx):
    a, b = inputs
    return (lax.rem(a, jnp.asarray(b, a.dtype)) if attrs.get("fmod", 0) else jnp.mod(a, b),)


_UNARY = {
    "Abs": jnp.abs,
    "Neg": jnp.negative,
    "Exp": jnp.exp,
    "Log": jnp.log,
    "Sqrt": jnp.sqrt,
    "Reciprocal": jnp.reciprocal,
    "Floor": jnp.floor,
    "Ceil": jnp.ceil,
    "Round": jnp.round,  # half to even, as ONNX
    "Sign": jnp.sign,
    "Sin": jnp.sin,
    "Cos": jnp.cos,
    "Tan": jnp.tan,
    "Asin": jnp.arcsin,
    "Acos": jnp.arccos,
    "Atan": jnp.arctan,
    "Sinh": jnp.sinh,
    "Cosh": jnp.cosh,
    "Asinh": jnp.arcsinh,
    "Acosh": jnp.arccosh,
    "Atanh": jnp.arctanh,
    "Erf": lax.erf,
    "Not": jnp.logical_not,
    "BitwiseNot": jnp.bitwise_not,
    "IsNaN": jnp.isnan,
}


def _unary(fn):
    return lambda inputs, attrs, ctx: (fn(inputs[0]),)


for _op, _fn in _UNARY.items():
    lower(_op)(_unary(_fn))


@lower("IsInf")
def is_inf(inputs, attrs, ctx):
    x = inputs[0]
    pos, neg = attrs.get("detect_positive", 1), attrs.get("detect_negative", 1)
    return ((jnp.isposinf(x) & bool(pos)) | (jnp.isneginf(x) & bool(neg)),)


def _variadic(fn):
    def rule(inputs, attrs, ctx):
        return (functools.reduce(fn, inputs),)

    return rule


lower("Max")(_variadic(jnp.maximum))
lower("Min")(_variadic(jnp.minimum))
lower("Sum")(_variadic(jnp.add))


@lower("Mean")
def mean(inputs, attrs, ctx):
    return (functools.reduce(jnp.add, inputs) / len(inputs),)


@lower("Clip")
def clip(inputs, attrs, ctx):
    x = inputs[0]
    lo = inputs[1] if len(inputs) > 1 else attrs.get("min")
    hi = inputs[2] if len(inputs) > 2 else attrs.get("max")
    if lo is not None:
        x = jnp.maximum(x, jnp.asarray(lo, x.dtype))
    if hi is not None:
        x = jnp.minimum(x, jnp.asarray(hi, x.dtype))
    return (x,)


@lower("Where")
def where(inputs, attrs, ctx):
    c, a, b = inputs
    if _static_all(inputs):
        return (np.where(c, a, b),)
    return (jnp.where(c, a, b),)


def _onnx_dtype(code: int) -> np.dtype:
    return np.dtype(ir.DataType(code).numpy())


def cast_to(x, dtype):
    if is_static(x):
        arr = np.asarray(x)
        if arr.dtype == object and np.issubdtype(dtype, np.integer):
            return arr
        return arr.astype(dtype)
    return lax.convert_element_type(x, jnp.dtype(dtype))


@lower("Cast")
def cast(inputs, attrs, ctx):
    return (cast_to(inputs[0], _onnx_dtype(attrs["to"])),)


@lower("CastLike")
def cast_like(inputs, attrs, ctx):
    return (cast_to(inputs[0], np.dtype(inputs[1].dtype)),)
