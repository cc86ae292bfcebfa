"""Op family: elementwise arithmetic, math functions, comparisons, logic, bitwise ops, Where and
casts.

Rules every op here keeps:

1. Outputs have the ONNX output dtype exactly: arithmetic keeps the first input's dtype (numpy's
   promotion of float32 with a Python float or an int64 exponent must not leak float64 out),
   comparisons and logic give ``bool``.
2. Integer ``Div`` truncates toward zero (C semantics, as ONNX Runtime does); ``Mod`` follows the
   divisor's sign unless ``fmod=1``, which follows the dividend's sign.
3. A VJP of a broadcasting op sums the cotangent over the broadcast axes back to each input's shape
   (:func:`unbroadcast`); piecewise-constant ops (Floor, Ceil, Round, Sign) have zero gradient;
   comparisons, logic and integer inputs have none (``None``).
"""

from __future__ import annotations

import numpy as np
import onnx

from . import register, register_vjp
from ._special import special

# --------------------------------------------------------------------------- helpers


def unbroadcast(grad: np.ndarray, shape: tuple[int, ...], dtype=None) -> np.ndarray:
    """Sum ``grad`` over the axes that broadcasting added or stretched, giving ``shape``."""
    grad = np.asarray(grad)
    extra = grad.ndim - len(shape)
    if extra > 0:
        grad = grad.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    if axes:
        grad = grad.sum(axis=axes, keepdims=True)
    grad = grad.reshape(shape)
    return grad.astype(dtype, copy=False) if dtype is not None else grad


def is_float(x) -> bool:
    """Whether ``x`` carries a gradient: a real floating array (float16/32/64, bfloat16)."""
    dt = np.asarray(x).dtype
    return np.issubdtype(dt, np.floating) or dt.name == "bfloat16"


def _grad_for(x: np.ndarray, g: np.ndarray) -> np.ndarray | None:
    """``g`` reduced to the shape and dtype of ``x``; ``None`` when ``x`` is not differentiable."""
    if x is None or not is_float(x):
        return None
    return unbroadcast(g, np.shape(x), np.asarray(x).dtype)


def _same(x: np.ndarray, y) -> np.ndarray:
    """``y`` as an array of ``x``'s dtype (numpy may have promoted it)."""
    return np.asarray(y).astype(np.asarray(x).dtype, copy=False)


# --------------------------------------------------------------------------- binary arithmetic


@register("Add")
def add(inputs, attrs, ctx):
    a, b = inputs
    return (_same(a, a + b),)


@register("Sub")
def sub(inputs, attrs, ctx):
    a, b = inputs
    return (_same(a, a - b),)


@register("Mul")
def mul(inputs, attrs, ctx):
    a, b = inputs
    return (_same(a, a * b),)


@register("Div")
def div(inputs, attrs, ctx):
    a, b = inputs
    if np.issubdtype(a.dtype, np.integer):
        # Truncation toward zero (numpy's // floors); x/0 is undefined in ONNX, we give 0.
        safe = np.where(b == 0, 1, b)
        q = a // safe
        q = q + (((a % safe) != 0) & ((a < 0) != (safe < 0)))
        return (_same(a, np.where(b == 0, 0, q)),)
    return (_same(a, a / b),)


@register("Pow")
def pow_(inputs, attrs, ctx):
    a, b = inputs
    if np.issubdtype(a.dtype, np.integer):
        return (_same(a, np.power(a.astype(np.int64), b.astype(np.int64))),)
    return (_same(a, np.power(a, b.astype(a.dtype, copy=False))),)


@register("Mod")
def mod(inputs, attrs, ctx):
    a, b = inputs
    if attrs.get("fmod", 0):
        return (_same(a, np.fmod(a, b)),)
    return (_same(a, np.mod(a, b)),)


@register_vjp("Add")
def add_vjp(inputs, attrs, outputs, grads, ctx):
    (g,) = grads
    return [_grad_for(inputs[0], g), _grad_for(inputs[1], g)]


@register_vjp("Sub")
def sub_vjp(inputs, attrs, outputs, grads, ctx):
    (g,) = grads
    return [_grad_for(inputs[0], g), _grad_for(inputs[1], -g)]


@register_vjp("Mul")
def mul_vjp(inputs, attrs, outputs, grads, ctx):
    a, b = inputs
    (g,) = grads
    return [_grad_for(a, g * b), _grad_for(b, g * a)]


@register_vjp("Div")
def div_vjp(inputs, attrs, outputs, grads, ctx):
    a, b = inputs
    (g,) = grads
    return [_grad_for(a, g / b), _grad_for(b, -g * a / (b * b))]


@register_vjp("Pow")
def pow_vjp(inputs, attrs, outputs, grads, ctx):
    a, b = inputs
    (g,) = grads
    (y,) = outputs
    bf = b.astype(a.dtype, copy=False) if is_float(a) else b
    ga = _grad_for(a, g * bf * np.power(a, bf - 1)) if is_float(a) else None
    gb = None
    if is_float(b):
        # d(a^b)/db = a^b ln a; defined as 0 where a == 0 (the limit for b > 0).
        with np.errstate(divide="ignore", invalid="ignore"):
            lg = np.where(a > 0, np.log(np.where(a > 0, a, 1)), 0.0)
        gb = _grad_for(b, g * y * lg)
    return [ga, gb]


@register_vjp("Mod")
def mod_vjp(inputs, attrs, outputs, grads, ctx):
    a, b = inputs
    (g,) = grads
    # a mod b = a - k b with k piecewise constant: trunc(a/b) for fmod, floor(a/b) otherwise.
    k = np.trunc(a / b) if attrs.get("fmod", 0) else np.floor(a / b)
    return [_grad_for(a, g), _grad_for(b, -g * k)]


# --------------------------------------------------------------------------- unary math

_UNARY = {
    "Neg": np.negative,
    "Abs": np.abs,
    "Reciprocal": np.reciprocal,
    "Sqrt": np.sqrt,
    "Exp": np.exp,
    "Log": np.log,
    "Sin": np.sin,
    "Cos": np.cos,
    "Tan": np.tan,
    "Asin": np.arcsin,
    "Acos": np.arccos,
    "Atan": np.arctan,
    "Sinh": np.sinh,
    "Cosh": np.cosh,
    "Asinh": np.arcsinh,
    "Acosh": np.arccosh,
    "Atanh": np.arctanh,
    "Erf": lambda x: special.erf(x),
    "Floor": np.floor,
    "Ceil": np.ceil,
    "Round": np.round,  # round half to even, as ONNX specifies
    "Sign": np.sign,
}

# dy/dx as a function of (x, y).
_UNARY_DERIV = {
    "Neg": lambda x, y: -np.ones_like(x),
    "Abs": lambda x, y: np.sign(x),
    "Reciprocal": lambda x, y: -y * y,
    "Sqrt": lambda x, y: 0.5 / y,
    "Exp": lambda x, y: y,
    "Log": lambda x, y: 1.0 / x,
    "Sin": lambda x, y: np.cos(x),
    "Cos": lambda x, y: -np.sin(x),
    "Tan": lambda x, y: 1.0 + y * y,
    "Asin": lambda x, y: 1.0 / np.sqrt(1.0 - x * x),
    "Acos": lambda x, y: -1.0 / np.sqrt(1.0 - x * x),
    "Atan": lambda x, y: 1.0 / (1.0 + x * x),
    "Sinh": lambda x, y: np.cosh(x),
    "Cosh": lambda x, y: np.sinh(x),
    "Asinh": lambda x, y: 1.0 / np.sqrt(x * x + 1.0),
    "Acosh": lambda x, y: 1.0 / np.sqrt(x * x - 1.0),
    "Atanh": lambda x, y: 1.0 / (1.0 - x * x),
    "Erf": lambda x, y: (2.0 / np.sqrt(np.pi)) * np.exp(-x * x),
    "Floor": lambda x, y: np.zeros_like(x),
    "Ceil": lambda x, y: np.zeros_like(x),
    "Round": lambda x, y: np.zeros_like(x),
    "Sign": lambda x, y: np.zeros_like(x),
}


def _make_unary(op: str):
    fn = _UNARY[op]

    def forward(inputs, attrs, ctx):
        x = inputs[0]
        return (_same(x, fn(x)),)

    def vjp(inputs, attrs, outputs, grads, ctx):
        x = inputs[0]
        if not is_float(x):
            return [None]
        return [_same(x, grads[0] * _UNARY_DERIV[op](x, outputs[0]))]

    register(op)(forward)
    register_vjp(op)(vjp)


for _op in _UNARY:
    _make_unary(_op)


@register("IsNaN")
def isnan(inputs, attrs, ctx):
    return (np.isnan(inputs[0]),)


@register("IsInf")
def isinf(inputs, attrs, ctx):
    x = inputs[0]
    pos, neg = attrs.get("detect_positive", 1), attrs.get("detect_negative", 1)
    return (np.isinf(x) & (((x > 0) & bool(pos)) | ((x < 0) & bool(neg))),)


# --------------------------------------------------------------------------- variadic


def _variadic(inputs: list, fn) -> np.ndarray:
    out = inputs[0]
    for x in inputs[1:]:
        out = fn(out, x)
    return _same(inputs[0], out)


@register("Max")
def max_(inputs, attrs, ctx):
    return (_variadic(inputs, np.maximum),)


@register("Min")
def min_(inputs, attrs, ctx):
    return (_variadic(inputs, np.minimum),)


@register("Sum")
def sum_(inputs, attrs, ctx):
    return (_variadic(inputs, np.add),)


@register("Mean")
def mean_(inputs, attrs, ctx):
    return (_same(inputs[0], _variadic(inputs, np.add) / len(inputs)),)


@register_vjp("Sum")
def sum_vjp(inputs, attrs, outputs, grads, ctx):
    return [_grad_for(x, grads[0]) for x in inputs]


@register_vjp("Mean")
def mean_vjp(inputs, attrs, outputs, grads, ctx):
    return [_grad_for(x, grads[0] / len(inputs)) for x in inputs]


@register_vjp("Max", "Min")
def maxmin_vjp(inputs, attrs, outputs, grads, ctx):
    """The cotangent flows to the first input that attains the extremum (a subgradient at ties)."""
    (y,) = outputs
    (g,) = grads
    taken = np.zeros(y.shape, dtype=bool)
    out = []
    for x in inputs:
        hit = (np.broadcast_to(x, y.shape) == y) & ~taken
        taken |= hit
        out.append(_grad_for(x, np.where(hit, g, 0)))
    return out


# --------------------------------------------------------------------------- Clip


def _clip_bounds(inputs, attrs, ctx):
    x = inputs[0]
    if ctx.opset < 11:
        lo = attrs.get("min", -np.inf)
        hi = attrs.get("max", np.inf)
    else:
        lo = inputs[1] if len(inputs) > 1 and inputs[1] is not None else None
        hi = inputs[2] if len(inputs) > 2 and inputs[2] is not None else None
    return x, lo, hi


@register("Clip")
def clip(inputs, attrs, ctx):
    x, lo, hi = _clip_bounds(inputs, attrs, ctx)
    y = x
    if lo is not None:
        y = np.maximum(y, lo)
    if hi is not None:
        y = np.minimum(y, hi)  # min after max: when lo > hi, every value becomes hi (ONNX spec)
    return (_same(x, y),)


@register_vjp("Clip")
def clip_vjp(inputs, attrs, outputs, grads, ctx):
    x, lo, hi = _clip_bounds(inputs, attrs, ctx)
    (g,) = grads
    below = (x < lo) if lo is not None else np.zeros(x.shape, bool)
    above = (x > hi) if hi is not None else np.zeros(x.shape, bool)
    if hi is not None and lo is not None:
        below = below & ~(np.broadcast_to(lo, x.shape) > hi)  # lo > hi: hi wins everywhere
        above = above | (np.broadcast_to(lo, x.shape) > hi)
    out = [_grad_for(x, np.where(below | above, 0, g))]
    if ctx.opset >= 11:
        for bound, mask in ((lo, below), (hi, above)):
            out.append(None if bound is None else _grad_for(bound, np.where(mask, g, 0)))
        out += [None] * (len(inputs) - len(out))
    return out[: len(inputs)]


# --------------------------------------------------------------------------- logic and comparison

_LOGIC_BINARY = {
    "And": np.logical_and,
    "Or": np.logical_or,
    "Xor": np.logical_xor,
    "Equal": np.equal,
    "Less": np.less,
    "LessOrEqual": np.less_equal,
    "Greater": np.greater,
    "GreaterOrEqual": np.greater_equal,
}


def _make_logic(op: str):
    fn = _LOGIC_BINARY[op]

    def forward(inputs, attrs, ctx):
        return (np.asarray(fn(inputs[0], inputs[1]), dtype=bool),)

    register(op)(forward)


for _op in _LOGIC_BINARY:
    _make_logic(_op)


@register("Not")
def not_(inputs, attrs, ctx):
    return (np.logical_not(inputs[0]),)


# --------------------------------------------------------------------------- Cast

_FLOAT8 = {"float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float4_e2m1fn"}


def np_dtype(onnx_type: int) -> np.dtype:
    """The numpy dtype of an ONNX ``TensorProto`` data type (ml_dtypes for bfloat16, float8, int4)."""
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(onnx_type))


def cast_array(x: np.ndarray, to: np.dtype, saturate: bool = True) -> np.ndarray:
    """``x`` converted to ``to`` with ONNX Cast rules (strings parse and print, float8 saturates)."""
    x = np.asarray(x)
    if to == x.dtype:
        return x.copy()
    if to.kind == "O" or to.kind == "U":
        if x.dtype.kind == "f" or x.dtype.name in ("bfloat16",) or x.dtype.name in _FLOAT8:
            flat = [_float_str(float(v)) for v in x.astype(np.float32).ravel()]
            return np.array(flat, dtype=object).reshape(x.shape)
        return np.array([str(v) for v in x.ravel().tolist()], dtype=object).reshape(x.shape)
    if x.dtype.kind in "OU":
        vals = x.astype(str).ravel()
        if to == np.bool_:
            return np.array([v.lower() not in ("0", "false", "") for v in vals]).reshape(x.shape)
        src = np.array([float(v) for v in vals], dtype=np.float64).reshape(x.shape)
        if np.issubdtype(to, np.integer):
            return np.array([int(v) for v in vals], dtype=to).reshape(x.shape)
        return cast_array(src, to, saturate)
    if to.name in _FLOAT8 and saturate:
        import ml_dtypes

        info = ml_dtypes.finfo(to)
        x32 = x.astype(np.float32)
        finite = np.isfinite(x32)
        x32 = np.where(finite, np.clip(x32, float(info.min), float(info.max)), x32)
        # Saturation maps +-inf to +-max too (the conformance data agree, E5M2 included).
        x32 = np.where(np.isinf(x32), np.sign(x32) * float(info.max), x32)
        return x32.astype(to)
    if to.name in _FLOAT8 or to.name == "bfloat16":
        return x.astype(np.float32).astype(to)
    if x.dtype.name in _FLOAT8 or x.dtype.name == "bfloat16":
        return x.astype(np.float32).astype(to)
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(to)


def _float_str(v: float) -> str:
    if np.isnan(v):
        return "NaN"
    if np.isinf(v):
        return "INF" if v > 0 else "-INF"
    return np.format_float_positional(np.float32(v), trim="-") if abs(v) < 1e16 else repr(v)


@register("Cast")
def cast(inputs, attrs, ctx):
    return (cast_array(inputs[0], np_dtype(attrs["to"]), bool(attrs.get("saturate", 1))),)


@register("CastLike")
def cast_like(inputs, attrs, ctx):
    return (cast_array(inputs[0], np.asarray(inputs[1]).dtype, bool(attrs.get("saturate", 1))),)


@register_vjp("Cast", "CastLike")
def cast_vjp(inputs, attrs, outputs, grads, ctx):
    x = inputs[0]
    g = grads[0]
    gx = _same(x, np.asarray(g, dtype=np.float64)) if is_float(x) and is_float(outputs[0]) else None
    return [gx] + [None] * (len(inputs) - 1)


# --------------------------------------------------------------------------- bitwise


@register("BitwiseAnd")
def bitwise_and(inputs, attrs, ctx):
    return (np.bitwise_and(inputs[0], inputs[1]),)


@register("BitwiseOr")
def bitwise_or(inputs, attrs, ctx):
    return (np.bitwise_or(inputs[0], inputs[1]),)


@register("BitwiseXor")
def bitwise_xor(inputs, attrs, ctx):
    return (np.bitwise_xor(inputs[0], inputs[1]),)


@register("BitwiseNot")
def bitwise_not(inputs, attrs, ctx):
    return (np.bitwise_not(inputs[0]),)


# --------------------------------------------------------------------------- Where


@register("Where")
def where(inputs, attrs, ctx):
    c, x, y = inputs
    out = np.where(c, x, y)
    return (out.astype(np.result_type(x.dtype, y.dtype), copy=False),)


@register_vjp("Where")
def where_vjp(inputs, attrs, outputs, grads, ctx):
    c, x, y = inputs
    g = grads[0]
    gx = unbroadcast(np.where(c, g, 0), x.shape, x.dtype) if is_float(x) else None
    gy = unbroadcast(np.where(c, 0, g), y.shape, y.dtype) if is_float(y) else None
    return [None, gx, gy]
