"""Activations and Softmax / LogSoftmax / Hardmax.

Rules:

1. Defaults are ONNX's (LeakyRelu alpha 0.01, Elu/Celu alpha 1, Selu's constants, HardSigmoid
   alpha 0.2 beta 0.5, ThresholdedRelu alpha 1, Shrink lambd 0.5 bias 0).
2. Gelu ``approximate="tanh"`` uses the tanh formula, otherwise the exact erf form.
3. Softmax-like ops before opset 13 coerce the input to 2-D at ``axis`` (default 1) and
   normalize the flattened trailing block; from opset 13 they act along ``axis`` (default -1).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax
from mconv.targets.xla.lower import lower


def _act(fn):
    return lambda inputs, attrs, ctx: (fn(inputs[0], attrs),)


_ACTS = {
    "Relu": lambda x, a: jnp.maximum(x, jnp.zeros((), x.dtype)),
    "LeakyRelu": lambda x, a: jnp.where(x >= 0, x, x * a.get("alpha", 0.01)),
    "Elu": lambda x, a: jnp.where(x > 0, x, a.get("alpha", 1.0) * jnp.expm1(x)),
    "Celu": lambda x, a: (
        jnp.maximum(x, 0) + jnp.minimum(0, a.get("alpha", 1.0) * jnp.expm1(x / a.get("alpha", 1.0)))
    ),
    "Selu": lambda x, a: (
        a.get("gamma", 1.05070102214813232421875)
        * jnp.where(x > 0, x, a.get("alpha", 1.67326319217681884765625) * jnp.expm1(x))
    ),
    "Sigmoid": lambda x, a: jax.nn.sigmoid(x),
    "HardSigmoid": lambda x, a: jnp.clip(a.get("alpha", 0.2) * x + a.get("beta", 0.5), 0, 1).astype(x.dtype),
    "HardSwish": lambda x, a: x * jnp.clip(x / 6 + 0.5, 0, 1).astype(x.dtype),
    "Tanh": lambda x, a: jnp.tanh(x),
    "Softplus": lambda x, a: jax.nn.softplus(x),
    "Softsign": lambda x, a: x / (1 + jnp.abs(x)),
    "Mish": lambda x, a: x * jnp.tanh(jax.nn.softplus(x)),
    "ThresholdedRelu": lambda x, a: jnp.where(x > a.get("alpha", 1.0), x, jnp.zeros((), x.dtype)),
    "Shrink": lambda x, a: jnp.where(
        x < -a.get("lambd", 0.5),
        x + a.get("bias", 0.0),
        jnp.where(x > a.get("lambd", 0.5), x - a.get("bias", 0.0), jnp.zeros((), x.dtype)),
    ).astype(x.dtype),
    "Gelu": lambda x, a: (
        0.5 * x * (1 + jnp.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
        if a.get("approximate", "none") == "tanh"
        else 0.5 * x * (1 + lax.erf(x / math.sqrt(2)))
    ),
}

for _op, _fn in _ACTS.items():
    lower(_op)(_act(_fn))


@lower("PRelu")
def prelu(inputs, attrs, ctx):
    x, slope = inputs
    return (jnp.where(x >= 0, x, x * slope),)


def _softmax_axes(x, attrs, ctx):
    if ctx.opset < 13:
        axis = attrs.get("axis", 1)
        axis = axis + x.ndim if axis < 0 else axis
        return tuple(range(axis, x.ndim))
    axis = attrs.get("axis", -1)
    return (axis + x.ndim if axis < 0 else axis,)


@lower("Softmax")
def softmax(inputs, attrs, ctx):
    x = inputs[0]
    return (jax.nn.softmax(x, axis=_softmax_axes(x, attrs, ctx)),)


@lower("LogSoftmax")
def log_softmax(inputs, attrs, ctx):
    x = inputs[0]
    return (jax.nn.log_softmax(x, axis=_softmax_axes(x, attrs, ctx)),)


@lower("Hardmax")
def hardmax(inputs, attrs, ctx):
    x = inputs[0]
    axes = _softmax_axes(x, attrs, ctx)
    lead = x.shape[: axes[0]]
    flat = jnp.reshape(x, (*lead, -1))
    idx = jnp.argmax(flat, axis=-1)
    return (jnp.reshape(jax.nn.one_hot(idx, flat.shape[-1], dtype=x.dtype), x.shape),)
