"""Matrix products: MatMul, Gemm, Einsum (QLinearMatMul: :mod:`.quantization`).

Rules:

1. MatMul follows numpy's matmul (batched, broadcast, 1-D operands promoted and squeezed).
2. Gemm: alpha * op(A) @ op(B) + beta * C with op = transpose when transA/transB; C broadcasts.
3. Products accumulate at the highest precision XLA offers for the dtype
   (``precision=HIGHEST``), so float32 results match a float32 reference on every backend.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from mconv.engines.xla.lower import lower

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
