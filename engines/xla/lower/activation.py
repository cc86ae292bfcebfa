"""Activations and Softmax / LogSoftmax / Hardmax.

Rules:

1. Defaults are ONNX's (:mod:`mconv.onnx_rules`; ThresholdedRelu alpha 1, Shrink lambd 0.5 bias
   0 here).
2. Gelu ``approximate="tanh"`` uses the tanh formula, otherwise the exact erf form.
3. Softmax-like ops normalize over :func:`mconv.onnx_rules.softmax_axes` (the opset-13 rule).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax
from mconv.engines.xla.lower import lower
from mconv.onnx_rules import attr, softmax_axes


def _act(fn):
    return lambda inputs, attrs, ctx: (fn(inputs[0], attrs),)


_ACTS = {
    "Relu": lambda x, a: jnp.maximum(x, jnp.zeros((), x.dtype)),
    "LeakyRelu": lambda x, a: jnp.where(x >= 0, x, x * attr(a, "LeakyRelu", "alpha")),
    "Elu": lambda x, a: jnp.where(x > 0, x, attr(a, "Elu", "alpha") * jnp.expm1(x)),
    "Celu": lambda x, a: (
        jnp.maximum(x, 0) + jnp.minimum(0, attr(a, "Celu", "alpha") * jnp.expm1(x / attr(a, "Celu", "alpha")))
    ),
    "Selu": lambda x, a: (
        attr(a, "Selu", "gamma") * jnp.where(x > 0, x, attr(a, "Selu", "alpha") * jnp.expm1(x))
    ),
    "Sigmoid": lambda x, a: jax.nn.sigmoid(x),
    "HardSigmoid": lambda x, a: jnp.clip(
        attr(a, "HardSigmoid", "alpha") * x + attr(a, "HardSigmoid", "beta"), 0, 1
    ).astype(x.dtype),
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
    return softmax_axes(x.ndim, attrs.get("axis"), ctx.opset)


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
