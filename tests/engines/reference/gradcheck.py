"""Finite-difference check of a registered VJP, usable without the Executor.

``check_vjp`` runs the op's registered forward in float64, draws one random cotangent per floating
output, calls the registered VJP, and compares each requested input gradient with central
differences of the scalar ``L(x) = sum_k <cot_k, forward(x)_k>``:

    dL/dx[i] ~= (L(x + eps e_i) - L(x - eps e_i)) / (2 eps)

Small inputs (at most ``max_elements`` entries) are checked element by element; larger inputs
are checked along ``n_directions`` random unit directions v, comparing <grad, v> with the
directional central difference, which keeps big-shape checks to a few forward calls.

Usage in a test (tests/engines/reference/conftest.py puts this folder on ``sys.path``)::

    from gradcheck import check_vjp
    check_vjp("Conv", [x, w, b], {"pads": [1, 1, 1, 1]})
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from mconv.engines.reference.ops import OpContext, lookup


def _is_float(a: object) -> bool:
    return isinstance(a, np.ndarray) and np.issubdtype(a.dtype, np.floating)


def _as_float64(inputs: Sequence) -> list:
    return [a.astype(np.float64) if _is_float(a) else a for a in inputs]


def _scalar_loss(fwd, inputs: list, attrs: dict, ctx: OpContext, cots: list) -> float:
    outs = fwd(list(inputs), dict(attrs), ctx)
    total = 0.0
    for out, cot in zip(outs, cots):
        if cot is not None:
            total += float(np.sum(np.asarray(out, dtype=np.float64) * cot))
    return total


def check_vjp(
    op_type: str,
    inputs: list[np.ndarray],
    attrs: dict,
    *,
    wrt: list[int] | None = None,
    eps: float = 1e-6,
    rtol: float = 1e-5,
    atol: float = 1e-7,
    opset: int = 21,
    seed: int = 0,
    domain: str = "",
    outputs: list[int] | None = None,
    max_elements: int = 400,
    n_directions: int = 6,
) -> None:
    """Assert that the registered VJP of ``op_type`` matches central finite differences.

    ``wrt``: input indices to check (default: every floating input). ``outputs``: output indices
    that receive a random cotangent (default: every floating output). Raises ``AssertionError``
    naming the op, the input, the worst element and both values.
    """
    opdef = lookup(op_type, domain)
    assert opdef is not None, f"{op_type}: no forward registered"
    assert opdef.vjp is not None, f"{op_type}: no VJP registered"
    rng = np.random.default_rng(seed)
    xs = _as_float64(inputs)
    ctx = OpContext(opset=opset, rng=np.random.default_rng(seed))
    outs = list(opdef.forward(list(xs), dict(attrs), ctx))
    cots: list = []
    for k, out in enumerate(outs):
        wanted = outputs is None or k in outputs
        if wanted and out is not None and _is_float(np.asarray(out)):
            cots.append(rng.standard_normal(np.shape(out)))
        else:
            cots.append(None)
    assert any(c is not None for c in cots), f"{op_type}: no floating output to differentiate"
    grads = opdef.vjp(list(xs), dict(attrs), outs, [None if c is None else c.copy() for c in cots], ctx)
    assert len(grads) == len(xs), f"{op_type}: VJP returned {len(grads)} gradients for {len(xs)} inputs"
    if wrt is None:
        wrt = [i for i, a in enumerate(xs) if _is_float(a)]

    def loss(i: int, xi: np.ndarray) -> float:
        trial = list(xs)
        trial[i] = xi
        # A fresh context per call: ops that draw random numbers must draw the same ones.
        return _scalar_loss(
            opdef.forward, trial, attrs, OpContext(opset=opset, rng=np.random.default_rng(seed)), cots
        )

    for i in wrt:
        x = xs[i]
        g = grads[i]
        assert g is not None, f"{op_type}: VJP gave no gradient for input {i}"
        g = np.asarray(g)
        assert g.shape == x.shape, f"{op_type}: gradient of input {i} has shape {g.shape}, input {x.shape}"
        if x.size <= max_elements:
            num = np.empty(x.size)
            flat = x.reshape(-1)
            for j in range(x.size):
                xp = flat.copy()
                xp[j] += eps
                xm = flat.copy()
                xm[j] -= eps
                num[j] = (loss(i, xp.reshape(x.shape)) - loss(i, xm.reshape(x.shape))) / (2 * eps)
            num = num.reshape(x.shape)
            ana = g.astype(np.float64)
            bad = ~np.isclose(ana, num, rtol=rtol, atol=atol)
            if bad.any():
                err = np.abs(ana - num)
                worst = np.unravel_index(np.argmax(np.where(bad, err, -1)), x.shape)
                raise AssertionError(
                    f"{op_type} attrs={attrs}: d/d input {i} (shape {x.shape}) wrong at {bad.sum()} of "
                    f"{x.size} elements; worst at {tuple(int(t) for t in worst)}: vjp={ana[worst]:.9g} "
                    f"finite-diff={num[worst]:.9g} (max abs err {err.max():.3g})"
                )
        else:
            for d in range(n_directions):
                v = rng.standard_normal(x.shape)
                v /= np.linalg.norm(v)
                num_d = (loss(i, x + eps * v) - loss(i, x - eps * v)) / (2 * eps)
                ana_d = float(np.sum(g.astype(np.float64) * v))
                if not np.isclose(ana_d, num_d, rtol=rtol, atol=atol):
                    raise AssertionError(
                        f"{op_type} attrs={attrs}: d/d input {i} (shape {x.shape}) along random "
                        f"direction {d}: vjp={ana_d:.9g} finite-diff={num_d:.9g}"
                    )
