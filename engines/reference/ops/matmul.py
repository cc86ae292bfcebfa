"""Op family: matrix products (MatMul, Gemm, MatMulInteger, Einsum), forward and VJP.

Rules
-----
0. Products accumulate in float64 for float16/bfloat16/float32 operands and are rounded once to
   the output type (``ops/__init__``, Exactness).
1. MatMul follows numpy.matmul: a 1-D first operand is a row ``(1, k)``, a 1-D second operand a
   column ``(k, 1)``, the added axis is removed from the result; batch axes broadcast. The VJP
   works on the promoted operands and sums gradients over broadcast batch axes.
2. Gemm: ``Y = alpha * A' @ B' + beta * C`` with ``A' = A^T`` if transA, ``B' = B^T`` if transB,
   C unidirectionally broadcast to (M, N) (optional from opset 11).
3. MatMulInteger: ``(A - a_zero_point) @ (B - b_zero_point)`` in int32; a_zero_point may be per
   row of A (shape (M,) or (M, 1)), b_zero_point per column of B.
4. Einsum's VJP for operand i is another einsum: the cotangent with every other operand,
   contracted to operand i's subscripts. Subscripts only operand i has (summed away in the
   forward) are restored with ones, repeated subscripts (diagonals) with identity matrices,
   and ellipsis axes that operand i broadcast from size 1 are summed.
"""

from __future__ import annotations

import string

import numpy as np

from . import OpContext, register, register_vjp, wide, widen


def _unbroadcast(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    lead = g.ndim - len(shape)
    if lead > 0:
        g = g.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, s in enumerate(shape) if s == 1 and g.shape[i] != 1)
    return (g.sum(axis=axes, keepdims=True) if axes else g).reshape(shape)


@register("MatMul")
def matmul(inputs: list, attrs: dict, ctx: OpContext) -> tuple[np.ndarray]:
    a, b = inputs
    # Accumulated in float64 for narrow floats (ops/__init__: Exactness); ONNX keeps the input type.
    acc = wide(np.result_type(a.dtype, b.dtype)) if a.dtype.kind != "V" else wide(a.dtype)
    # widen: a constant operand's wide copy is made once per runner (ops/__init__: Exactness)
    return (np.matmul(widen(a, acc), widen(b, acc)).astype(a.dtype, copy=False),)


@register_vjp("MatMul")
def matmul_vjp(inputs: list, attrs: dict, outputs, grads, ctx: OpContext) -> list:
    a, b = inputs
    g = grads[0]
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    g = np.reshape(g, np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]) + (a2.shape[-2], b2.shape[-1]))
    ga = np.matmul(g, np.swapaxes(b2, -1, -2))
    gb = np.matmul(np.swapaxes(a2, -1, -2), g)
    ga = _unbroadcast(ga, a2.shape).reshape(a.shape)
    gb = _unbroadcast(gb, b2.shape).reshape(b.shape)
    return [ga.astype(a.dtype, copy=False), gb.astype(b.dtype, copy=False)]


@register("Gemm")
def gemm(inputs: list, attrs: dict, ctx: OpContext) -> tuple[np.ndarray]:
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    out_dtype = a.dtype
    acc = wide(a.dtype)
    # Widened before transposing, so that a constant's wide copy (made once per runner) is found;
    # a transposed view goes to BLAS without a copy.
    a, b = widen(a, acc), widen(b, acc)
    a = a.T if attrs.get("transA", 0) else a
    b = b.T if attrs.get("transB", 0) else b
    y = np.matmul(a, b)
    if alpha != 1.0:
        y *= np.asarray(alpha, y.dtype)
    if c is not None:
        c = widen(c, y.dtype)
        y += c if beta == 1.0 else np.asarray(beta, y.dtype) * c
    return (y.astype(out_dtype, copy=False),)


def _outer_or_matmul(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``x @ y``; with an inner dimension of 1 (batch-1 weight gradients) a broadcast multiply,
    which numpy runs about twice as fast as a rank-1 GEMM."""
    return np.multiply(x, y) if x.shape[1] == 1 else np.matmul(x, y)


@register_vjp("Gemm")
def gemm_vjp(inputs: list, attrs: dict, outputs, grads, ctx: OpContext) -> list:
    """``dA' = alpha g B'^T``, ``dB' = alpha A'^T g``, each computed directly in the layout of A or
    B (``dA = alpha B' g^T`` when transA), so no (possibly huge) weight gradient is transposed
    or copied again."""
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    g = grads[0]
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    ta, tb = bool(attrs.get("transA", 0)), bool(attrs.get("transB", 0))
    ap = a.T if ta else a
    bp = b.T if tb else b
    ga = _outer_or_matmul(bp, g.T) if ta else np.matmul(g, bp.T)
    gb = _outer_or_matmul(g.T, ap) if tb else _outer_or_matmul(ap.T, g)
    if alpha != 1.0:
        ga *= np.asarray(alpha, ga.dtype)
        gb *= np.asarray(alpha, gb.dtype)
    result = [ga.astype(a.dtype, copy=False), gb.astype(b.dtype, copy=False)]
    if len(inputs) > 2:
        result.append(
            None if c is None else _unbroadcast(beta * g if beta != 1.0 else g, c.shape).astype(c.dtype)
        )
    return result


@register("MatMulInteger")
def matmul_integer(inputs: list, attrs: dict, ctx: OpContext) -> tuple[np.ndarray]:
    a, b = inputs[0], inputs[1]
    az = inputs[2] if len(inputs) > 2 and inputs[2] is not None else np.zeros((), a.dtype)
    bz = inputs[3] if len(inputs) > 3 and inputs[3] is not None else np.zeros((), b.dtype)
    af = a.astype(np.int64) - (
        az.astype(np.int64).reshape(-1, 1) if az.size > 1 else az.astype(np.int64).reshape(())
    )
    bf = b.astype(np.int64) - bz.astype(np.int64).reshape(bz.shape[-1:] if bz.ndim else ())
    # int64 products are exact; the ONNX result type is int32.
    return (np.matmul(af, bf).astype(np.int32),)


# ----------------------------------------------------------------------------- Einsum


def _parse_einsum(equation: str, shapes: list[tuple[int, ...]]) -> tuple[list[str], str, dict[str, int]]:
    """Explicit subscripts per operand and for the output, ellipses replaced by fresh letters."""
    eq = equation.replace(" ", "")
    lhs, _, rhs = eq.partition("->")
    terms = lhs.split(",")
    used = set(eq)
    fresh = [ch for ch in string.ascii_letters if ch not in used]
    ell_rank = max((len(s) - (len(t) - 3) for t, s in zip(terms, shapes) if "..." in t), default=0)
    ell = "".join(fresh[:ell_rank])
    subs = []
    for t, s in zip(terms, shapes):
        if "..." in t:
            k = len(s) - (len(t) - 3)
            t = t.replace("...", ell[ell_rank - k :])
        subs.append(t)
    if "->" in eq:
        out = rhs.replace("...", ell)
    else:
        counts: dict[str, int] = {}
        for t in subs:
            for ch in t:
                counts[ch] = counts.get(ch, 0) + 1
        out = ell + "".join(sorted(ch for ch, n in counts.items() if n == 1 and ch not in ell))
    sizes: dict[str, int] = {}
    for t, s in zip(subs, shapes):
        for ch, n in zip(t, s):
            if n != 1 or ch not in sizes:
                sizes[ch] = max(sizes.get(ch, 1), n)
    return subs, out, sizes


@register("Einsum")
def einsum(inputs: list, attrs: dict, ctx: OpContext) -> tuple[np.ndarray]:
    eq = attrs["equation"]
    eq = eq.decode() if isinstance(eq, bytes) else eq
    return (_einsum(eq, inputs),)


def _einsum(eq: str, operands: list) -> np.ndarray:
    """np.einsum, run in float32 for float types numpy's einsum lacks (bfloat16 and friends)."""
    exotic = [x.dtype for x in operands if x.dtype.kind == "V"]  # ml_dtypes' types are kind "V"
    out = exotic[0] if exotic else np.result_type(*operands)
    acc = wide(out)
    if acc == out and not exotic:
        return np.asarray(np.einsum(eq, *operands, optimize=True))
    if acc == out:  # exotic types in fast mode: numpy's einsum has no bfloat16 loops
        acc = np.dtype(np.float32)
    y = np.einsum(eq, *[x.astype(acc) for x in operands], optimize=True)
    return np.asarray(y).astype(out)


@register_vjp("Einsum")
def einsum_vjp(inputs: list, attrs: dict, outputs, grads, ctx: OpContext) -> list:
    eq = attrs["equation"]
    eq = eq.decode() if isinstance(eq, bytes) else eq
    subs, out, sizes = _parse_einsum(eq, [x.shape for x in inputs])
    g = grads[0]
    taken = set("".join(subs) + out)
    spare = iter(ch for ch in string.ascii_letters if ch not in taken)
    result: list[np.ndarray | None] = []
    for i, x in enumerate(inputs):
        if not np.issubdtype(x.dtype, np.floating):
            result.append(None)
            continue
        operands, terms = [g], [out]
        for j, other in enumerate(inputs):
            if j != i:
                operands.append(other)
                terms.append(subs[j])
        target = []
        present = set("".join(terms))
        for axis, ch in enumerate(subs[i]):
            if x.shape[axis] == 1 and sizes[ch] != 1:
                # Broadcast from size 1: a fresh size-1 letter; the real one is summed away.
                new = next(spare)
                operands.append(np.ones(1, x.dtype))
                terms.append(new)
                target.append(new)
            elif ch in target:
                new = next(spare)
                operands.append(np.eye(sizes[ch], dtype=x.dtype))
                terms.append(ch + new)
                target.append(new)
            else:
                if ch not in present:
                    operands.append(np.ones(sizes[ch], x.dtype))
                    terms.append(ch)
                    present.add(ch)
                target.append(ch)
        spec = ",".join(terms) + "->" + "".join(target)
        gx = _einsum(spec, operands)
        result.append(np.asarray(gx).reshape(x.shape).astype(x.dtype, copy=False))
    return result
