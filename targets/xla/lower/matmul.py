"""Matrix products: MatMul, Gemm, Einsum, QLinearMatMul.

Rules:

1. MatMul follows numpy's matmul (batched, broadcast, 1-D operands promoted and squeezed).
2. Gemm: alpha * op(A) @ op(B) + beta * C with op = transpose when transA/transB; C broadcasts.
3. Products accumulate at the highest precision XLA offers for the dtype
   (``precision=HIGHEST``), so float32 results match a float32 reference on every backend.
4. QLinearMatMul accumulates the codes minus their zero points in int32, then requantizes
   (float32 scale, round half to even, saturate to the output zero point's type).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from mconv.targets.xla.lower import lower

_P = lax.Precision.HIGHEST


@lower("MatMul")
def matmul(inputs, attrs, ctx):
    a, b = inputs
    return (jnp.matmul(a, jnp.asarray(b).astype(jnp.result_type(a)), precision=_P),)


@lower("Gemm")
def gemm(inputs, attrs, ctx):
    a, b = inputs[0], jnp.asarray(inputs[1])
    c = inputs[2] if len(inputs) > 2 else None
    if attrs.get("transA", 0):
        a = a.T
    if attrs.get("transB", 0):
        b = b.T
    y = jnp.matmul(a, b.astype(a.dtype), precision=_P)
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    if alpha != 1.0:
        y = y * jnp.asarray(alpha, y.dtype)
    if c is not None:
        y = y + (jnp.asarray(c, y.dtype) if beta == 1.0 else jnp.asarray(beta, y.dtype) * c)
    return (y,)


@lower("Einsum")
def einsum(inputs, attrs, ctx):
    return (jnp.einsum(attrs["equation"].replace(" ", ""), *inputs, precision=_P),)


@lower("QLinearMatMul")
def qlinear_matmul(inputs, attrs, ctx):
    """int32 accumulation of the zero-point-free codes, requantized (half to even, saturated)."""
    a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = inputs
    ai = jnp.asarray(a).astype(jnp.int32) - jnp.asarray(a_zp).astype(jnp.int32).reshape(
        (-1, 1) if jnp.size(a_zp) > 1 else ()
    )
    bz = jnp.asarray(b_zp).astype(jnp.int32)
    bi = jnp.asarray(b).astype(jnp.int32) - (bz.reshape(-1) if bz.size > 1 else bz.reshape(()))
    acc = jnp.matmul(ai, bi, preferred_element_type=jnp.int32)
    bs = jnp.asarray(b_s).astype(jnp.float32)
    bs = bs.reshape(-1) if bs.size > 1 else bs.reshape(())
    as_ = jnp.asarray(a_s).astype(jnp.float32)
    as_ = as_.reshape(-1, 1) if as_.size > 1 else as_.reshape(())
    scale = as_ * bs / jnp.asarray(y_s).astype(jnp.float32)
    out_dtype = jnp.asarray(y_zp).dtype
    info = jnp.iinfo(out_dtype)
    y = jnp.round(acc.astype(jnp.float32) * scale) + jnp.asarray(y_zp).astype(jnp.float32)
    return (jnp.clip(y, info.min, info.max).astype(out_dtype),)
