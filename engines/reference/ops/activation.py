"""Op family: activations and the softmax family.

Rules:

1. Pointwise activations keep the input dtype; each VJP is ``g * f'(x)`` written from ``x`` and,
   where cheaper, the output ``y`` (Sigmoid: ``y (1 - y)``, Tanh: ``1 - y^2``).
2. At a kink (Relu at 0, ThresholdedRelu at alpha, Shrink at +-lambd) the subgradient is the
   right-hand one for x > kink only (0 at the kink itself), as PyTorch does.
3. Softmax, LogSoftmax and Hardmax before opset 13 coerce the input to 2-D at ``axis`` (default 1)
   and normalize over the flattened trailing block; from opset 13 they act along one axis
   (default -1). Hardmax is piecewise constant: zero gradient.
4. Gelu (opset 20) follows ``approximate``: ``none`` uses erf, ``tanh`` the tanh formula.
"""

from __future__ import annotations

import numpy as np
from mconv.onnx_rules import attr, softmax_axes

from . import register, register_vjp, wide
from ._special import special
from .elementwise import _same, is_float, unbroadcast


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return special.expit(x)


# name -> (forward(x, attrs), derivative(x, y, attrs))
_POINTWISE = {
    "Relu": (lambda x, a: np.maximum(x, 0), lambda x, y, a: (x > 0).astype(x.dtype)),
    "LeakyRelu": (
        lambda x, a: np.where(x >= 0, x, attr(a, "LeakyRelu", "alpha") * x),
        lambda x, y, a: np.where(x >= 0, 1.0, attr(a, "LeakyRelu", "alpha")),
    ),
    "Elu": (
        lambda x, a: np.where(x > 0, x, attr(a, "Elu", "alpha") * np.expm1(np.minimum(x, 0))),
        lambda x, y, a: np.where(x > 0, 1.0, attr(a, "Elu", "alpha") * np.exp(np.minimum(x, 0))),
    ),
    "Selu": (
        lambda x, a: (
            attr(a, "Selu", "gamma")
            * np.where(x > 0, x, attr(a, "Selu", "alpha") * np.expm1(np.minimum(x, 0)))
        ),
        lambda x, y, a: (
            attr(a, "Selu", "gamma")
            * np.where(x > 0, 1.0, attr(a, "Selu", "alpha") * np.exp(np.minimum(x, 0)))
        ),
    ),
    "Celu": (
        lambda x, a: (
            np.maximum(x, 0)
            + np.minimum(0, attr(a, "Celu", "alpha") * np.expm1(np.minimum(x, 0) / attr(a, "Celu", "alpha")))
        ),
        lambda x, y, a: np.where(x > 0, 1.0, np.exp(np.minimum(x, 0) / attr(a, "Celu", "alpha"))),
    ),
    "Sigmoid": (lambda x, a: _sigmoid(x), lambda x, y, a: y * (1 - y)),
    "HardSigmoid": (
        lambda x, a: np.clip(attr(a, "HardSigmoid", "alpha") * x + attr(a, "HardSigmoid", "beta"), 0, 1),
        lambda x, y, a: np.where(
            (attr(a, "HardSigmoid", "alpha") * x + attr(a, "HardSigmoid", "beta") > 0)
            & (attr(a, "HardSigmoid", "alpha") * x + attr(a, "HardSigmoid", "beta") < 1),
            attr(a, "HardSigmoid", "alpha"),
            0.0,
        ),
    ),
    "HardSwish": (
        lambda x, a: x * np.clip(x / 6 + 0.5, 0, 1),
        lambda x, y, a: np.where(x <= -3, 0.0, np.where(x >= 3, 1.0, x / 3 + 0.5)),
    ),
    "Mish": (
        lambda x, a: x * np.tanh(np.logaddexp(0, x)),
        lambda x, y, a: (
            np.tanh(np.logaddexp(0, x)) + x * _sigmoid(x) * (1 - np.tanh(np.logaddexp(0, x)) ** 2)
        ),
    ),
    "Softplus": (lambda x, a: np.logaddexp(0, x), lambda x, y, a: _sigmoid(x)),
    "Softsign": (lambda x, a: x / (1 + np.abs(x)), lambda x, y, a: 1 / (1 + np.abs(x)) ** 2),
    "ThresholdedRelu": (
        lambda x, a: np.where(x > a.get("alpha", 1.0), x, 0),
        lambda x, y, a: (x > a.get("alpha", 1.0)).astype(x.dtype),
    ),
    "Tanh": (lambda x, a: np.tanh(x), lambda x, y, a: 1 - y * y),
    "Shrink": (
        lambda x, a: np.where(
            x < -a.get("lambd", 0.5),
            x + a.get("bias", 0.0),
            np.where(x > a.get("lambd", 0.5), x - a.get("bias", 0.0), 0),
        ),
        lambda x, y, a: ((x < -a.get("lambd", 0.5)) | (x > a.get("lambd", 0.5))).astype(x.dtype),
    ),
}


def _gelu(x: np.ndarray, a: dict) -> np.ndarray:
    if a.get("approximate", "none") == "tanh":
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + special.erf(x / np.sqrt(2)))


def _gelu_deriv(x: np.ndarray, y: np.ndarray, a: dict) -> np.ndarray:
    if a.get("approximate", "none") == "tanh":
        c = np.sqrt(2 / np.pi)
        t = np.tanh(c * (x + 0.044715 * x**3))
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x)
    return 0.5 * (1 + special.erf(x / np.sqrt(2))) + x * np.exp(-0.5 * x * x) / np.sqrt(2 * np.pi)


_POINTWISE["Gelu"] = (_gelu, _gelu_deriv)


def _make_pointwise(op: str):
    fwd, deriv = _POINTWISE[op]

    def forward(inputs, attrs, ctx):
        x = inputs[0]
        return (_same(x, fwd(x, attrs)),)

    def vjp(inputs, attrs, outputs, grads, ctx):
        x = inputs[0]
        if not is_float(x):
            return [None]
        return [_same(x, grads[0] * deriv(x, outputs[0], attrs))]

    register(op)(forward)
    register_vjp(op)(vjp)


for _op in _POINTWISE:
    _make_pointwise(_op)


def _prelu_slope(x: np.ndarray, slope: np.ndarray, ctx) -> np.ndarray:
    """Before opset 7 a 1-D slope of C values applies along the channel axis (axis 1)."""
    if ctx.opset < 7 and slope.ndim == 1 and x.ndim > 2 and slope.shape[0] == x.shape[1] > 1:
        return slope.reshape((-1,) + (1,) * (x.ndim - 2))
    return slope


@register("PRelu")
def prelu(inputs, attrs, ctx):
    x, slope = inputs
    slope = _prelu_slope(x, slope, ctx)
    return (_same(x, np.where(x >= 0, x, slope * x)),)


@register_vjp("PRelu")
def prelu_vjp(inputs, attrs, outputs, grads, ctx):
    x, slope_in = inputs
    slope = _prelu_slope(x, slope_in, ctx)
    (g,) = grads
    gx = _same(x, np.where(x >= 0, g, g * slope))
    gs = None
    if is_float(slope_in):
        gs = unbroadcast(np.where(x >= 0, 0, g * x), slope.shape, slope.dtype).reshape(slope_in.shape)
    return [gx, gs]


# --------------------------------------------------------------------------- softmax family


def _softmax_axes(x: np.ndarray, attrs: dict, ctx) -> tuple[np.ndarray, tuple[int, ...]]:
    """The array to normalize and the axes to normalize over (old opsets: the coerced 2-D block)."""
    return x, softmax_axes(x.ndim, attrs.get("axis"), ctx.opset)


@register("Softmax")
def softmax(inputs, attrs, ctx):
    x, axes = _softmax_axes(inputs[0], attrs, ctx)
    xs = x.astype(wide(x.dtype), copy=False)  # float64 for narrow floats (ops/__init__: Exactness)
    e = np.exp(xs - np.max(xs, axis=axes, keepdims=True))
    return (_same(x, e / np.sum(e, axis=axes, keepdims=True)),)


@register_vjp("Softmax")
def softmax_vjp(inputs, attrs, outputs, grads, ctx):
    x, axes = _softmax_axes(inputs[0], attrs, ctx)
    (y,) = outputs
    (g,) = grads
    return [_same(x, y * (g - np.sum(g * y, axis=axes, keepdims=True)))]


@register("LogSoftmax")
def log_softmax(inputs, attrs, ctx):
    x, axes = _softmax_axes(inputs[0], attrs, ctx)
    xs = x.astype(wide(x.dtype), copy=False)
    s = xs - np.max(xs, axis=axes, keepdims=True)
    return (_same(x, s - np.log(np.sum(np.exp(s), axis=axes, keepdims=True))),)


@register_vjp("LogSoftmax")
def log_softmax_vjp(inputs, attrs, outputs, grads, ctx):
    x, axes = _softmax_axes(inputs[0], attrs, ctx)
    (y,) = outputs
    (g,) = grads
    return [_same(x, g - np.exp(y) * np.sum(g, axis=axes, keepdims=True))]


@register("Hardmax")
def hardmax(inputs, attrs, ctx):
    x, axes = _softmax_axes(inputs[0], attrs, ctx)
    # Move the normalized block last and flatten it: the first maximum wins.
    lead = x.shape[: axes[0]]
    moved = np.moveaxis(x, axes[0], -1) if len(axes) == 1 else x.reshape(*lead, -1)
    flat = moved.reshape(-1, moved.shape[-1])
    out = np.zeros_like(flat)
    if flat.shape[-1]:
        out[np.arange(flat.shape[0]), np.argmax(flat, axis=-1)] = 1
    out = out.reshape(moved.shape)
    out = np.moveaxis(out, -1, axes[0]) if len(axes) == 1 else out.reshape(x.shape)
    return (_same(x, out),)


@register_vjp("Hardmax")
def hardmax_vjp(inputs, attrs, outputs, grads, ctx):
    return [np.zeros_like(inputs[0])]
