"""Normalization: BatchNormalization (inference), Instance/Layer/Group/Lp/MeanVariance norms, LRN.

Rules:

1. BatchNormalization uses the running mean and variance (inference mode); training mode
   (``training_mode=1``, extra outputs) is not lowered.
2. LayerNormalization normalizes over the axes from ``axis`` to the end; the optional Mean and
   InvStdDev outputs are produced (over the kept leading axes, keepdims).
3. GroupNormalization: before opset 21 scale/bias are per group, from 21 per channel.
4. LRN sums squares across channels (the spec, as ONNX Runtime): window
   [c - floor((size-1)/2), c + ceil((size-1)/2)], then x / (bias + alpha/size * sum)^beta.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from mconv.engines.xla.lower import lower


def _channel(v, ndim):
    return jnp.reshape(v, (1, -1) + (1,) * (ndim - 2))


@lower("BatchNormalization")
def batch_norm(inputs, attrs, ctx):
    x, scale, bias, mean, var = inputs[:5]
    if attrs.get("training_mode", 0) or ctx.num_outputs > 1:
        raise NotImplementedError("BatchNormalization in training mode is not lowered")
    eps = attrs.get("epsilon", 1e-5)
    inv = lax.rsqrt(_channel(var, x.ndim) + jnp.asarray(eps, x.dtype)) * _channel(scale, x.ndim)
    return ((x - _channel(mean, x.ndim)) * inv + _channel(bias, x.ndim),)


@lower("InstanceNormalization")
def instance_norm(inputs, attrs, ctx):
    x, scale, bias = inputs
    axes = tuple(range(2, x.ndim))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    y = (x - mean) * lax.rsqrt(var + attrs.get("epsilon", 1e-5))
    return (y * _channel(scale, x.ndim) + _channel(bias, x.ndim),)


@lower("LayerNormalization")
def layer_norm(inputs, attrs, ctx):
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    axis = attrs.get("axis", -1)
    axis = axis + x.ndim if axis < 0 else axis
    axes = tuple(range(axis, x.ndim))
    xf = x.astype(jnp.float32) if attrs.get("stash_type", 1) == 1 and x.dtype != jnp.float64 else x
    mean = jnp.mean(xf, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=axes, keepdims=True)
    inv = lax.rsqrt(var + attrs.get("epsilon", 1e-5))
    y = ((xf - mean) * inv).astype(x.dtype) * scale
    if bias is not None:
        y = y + bias
    return (y, mean, inv)[: ctx.num_outputs]


@lower("GroupNormalization")
def group_norm(inputs, attrs, ctx):
    x, scale, bias = inputs
    g = int(attrs["num_groups"])
    n, c = x.shape[0], x.shape[1]
    xg = jnp.reshape(x, (n, g, -1))
    mean = jnp.mean(xg, axis=2, keepdims=True)
    var = jnp.mean(jnp.square(xg - mean), axis=2, keepdims=True)
    y = jnp.reshape((xg - mean) * lax.rsqrt(var + attrs.get("epsilon", 1e-5)), x.shape)
    if ctx.opset < 21 and scale.shape[0] == g and g != c:
        scale, bias = jnp.repeat(scale, c // g), jnp.repeat(bias, c // g)
    return (y * _channel(scale, x.ndim) + _channel(bias, x.ndim),)


@lower("LpNormalization")
def lp_norm(inputs, attrs, ctx):
    x = inputs[0]
    axis, p = attrs.get("axis", -1), attrs.get("p", 2)
    if p == 1:
        norm = jnp.sum(jnp.abs(x), axis=axis, keepdims=True)
    else:
        norm = jnp.sqrt(jnp.sum(jnp.square(x), axis=axis, keepdims=True))
    return (x / jnp.where(norm == 0, jnp.ones_like(norm), norm),)


@lower("MeanVarianceNormalization")
def mean_variance_norm(inputs, attrs, ctx):
    x = inputs[0]
    axes = tuple(attrs.get("axes", [0, 2, 3]))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x), axis=axes, keepdims=True) - jnp.square(mean)
    return ((x - mean) / (jnp.sqrt(var) + 1e-9),)


@lower("LRN")
def lrn(inputs, attrs, ctx):
    x = inputs[0]
    size = int(attrs["size"])
    alpha, beta, bias = attrs.get("alpha", 1e-4), attrs.get("beta", 0.75), attrs.get("bias", 1.0)
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    window = (1, size) + (1,) * (x.ndim - 2)
    sq = lax.reduce_window(
        jnp.square(x),
        jnp.array(0, x.dtype),
        lax.add,
        window_dimensions=window,
        window_strides=(1,) * x.ndim,
        padding=((0, 0), (lo, hi)) + ((0, 0),) * (x.ndim - 2),
    )
    return (x / (bias + (alpha / size) * sq) ** beta,)
