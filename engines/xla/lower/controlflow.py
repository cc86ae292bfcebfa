"""Control flow: If, Loop, Scan. Bodies are lowered recursively with ``ctx.lower_subgraph``.

Rules:

1. A body sees the enclosing values by name (``ctx.scope``): static ones stay numpy (so a body's
   shape arithmetic still folds), traced ones are closed over by the ``lax`` primitive.
2. If: a static condition picks its branch at export time (the other branch is never lowered);
   a traced one becomes ``lax.cond``, whose branches must give the same shapes and dtypes.
3. Loop: with scan outputs the trip count ``M`` must be static (their length is part of the
   program's shape), the ``cond`` input absent or statically true, and the body's condition
   output statically true: it becomes ``lax.scan`` of length ``M``. Without scan outputs any
   trip count and a loop-carried condition become ``lax.while_loop`` over
   ``(iteration, cond, carried...)``. Loop-carried values must keep their shape and dtype.
4. Scan (opset 9+): ``lax.scan`` over the scan inputs moved to axis 0 (reversed where the
   direction is 1); outputs are stacked on axis 0, then reversed and moved to their
   ``scan_output_axes``. Scan-8 (batched, ``sequence_lens``) is ``jax.vmap`` over the batch
   when every sequence has the full length (``sequence_lens`` absent or static and full).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from mconv.engines.xla.lower import is_static, lower


def _static_bool(x) -> bool | None:
    """The value of a static condition, or None when it is traced."""
    if x is None:
        return None
    if is_static(x):
        return bool(np.asarray(x).reshape(-1)[0])
    return None


def _index_dtype():
    return jax.dtypes.canonicalize_dtype(np.int64)


def _arr(x):
    return jnp.asarray(x)


def _same_avals(kind: str, a: list, b: list) -> None:
    for i, (x, y) in enumerate(zip(a, b)):
        if tuple(x.shape) != tuple(y.shape) or x.dtype != y.dtype:
            raise NotImplementedError(
                f"{kind} value {i} changes from {x.dtype}{list(x.shape)} to {y.dtype}{list(y.shape)}; "
                "XLA needs the same shape and dtype"
            )


@lower("If")
def if_(inputs, attrs, ctx):
    run = ctx.lower_subgraph
    scope = ctx.scope
    then_g, else_g = attrs["then_branch"], attrs["else_branch"]
    cond = _static_bool(inputs[0])
    if cond is not None:
        return tuple(run(then_g if cond else else_g, [], scope))

    def branch(g):
        return lambda: tuple(_arr(v) for v in run(g, [], scope))

    t_shapes = jax.eval_shape(branch(then_g))
    e_shapes = jax.eval_shape(branch(else_g))
    _same_avals("If branch output", list(t_shapes), list(e_shapes))
    pred = jnp.asarray(inputs[0]).reshape(-1)[0].astype(bool)
    return lax.cond(pred, branch(then_g), branch(else_g))


@lower("Loop")
def loop(inputs, attrs, ctx):
    body = attrs["body"]
    run = ctx.lower_subgraph
    scope = ctx.scope
    trip = inputs[0] if len(inputs) > 0 else None
    cond = inputs[1] if len(inputs) > 1 else None
    carried = [_arr(v) for v in inputs[2:]]
    n_carried = len(carried)
    n_scan = len(body.outputs) - 1 - n_carried
    idt = _index_dtype()
    static_trip = int(np.asarray(trip).reshape(-1)[0]) if trip is not None and is_static(trip) else None
    static_cond = _static_bool(cond)

    def step(i, keep, state):
        outs = run(body, [jnp.asarray(i, idt), jnp.asarray(keep, bool), *state], scope)
        new_state = [
            _arr(v).astype(s.dtype) if _arr(v).dtype != s.dtype else _arr(v)
            for v, s in zip(outs[1 : 1 + n_carried], state)
        ]
        return outs[0], new_state, [_arr(v) for v in outs[1 + n_carried :]]

    if n_scan:
        if static_trip is None:
            raise NotImplementedError("a Loop with scan outputs needs a static trip count M")
        if cond is not None and static_cond is None:
            raise NotImplementedError("a Loop with scan outputs needs a static condition input")
        n = static_trip if (cond is None or static_cond) else 0
        if n == 0:
            probe = jax.eval_shape(lambda: step(0, True, carried)[2])
            return (*carried, *(jnp.zeros((0, *s.shape), s.dtype) for s in probe))

        def scan_body(state, i):
            c, new_state, ys = step(i, True, state)
            if cond is not None and _static_bool(c) is not True:
                raise NotImplementedError(
                    "a Loop with scan outputs needs a body condition that is statically true"
                )
            _same_avals("Loop-carried", state, new_state)
            return new_state, ys

        final, ys = lax.scan(scan_body, carried, jnp.arange(n, dtype=idt))
        return (*final, *ys)

    if cond is not None and static_cond is False:
        return tuple(carried)
    if trip is None and cond is None:
        raise NotImplementedError("a Loop with neither a trip count nor a condition never ends")
    limit = None if trip is None else jnp.asarray(trip).reshape(-1)[0].astype(idt)
    keep0 = jnp.asarray(True) if cond is None else jnp.asarray(cond).reshape(-1)[0].astype(bool)

    def cond_fn(carry):
        i, keep, _ = carry
        return keep & (i < limit) if limit is not None else keep

    def body_fn(carry):
        i, keep, state = carry
        c, new_state, _ = step(i, keep, state)
        _same_avals("Loop-carried", state, new_state)
        new_keep = jnp.asarray(True) if cond is None else _arr(c).reshape(-1)[0].astype(bool)
        return i + 1, new_keep, new_state

    _, _, final = lax.while_loop(cond_fn, body_fn, (jnp.asarray(0, idt), keep0, carried))
    return tuple(final)


def _scan(body, states, xs, run, scope):
    """``lax.scan`` of ``body`` over ``xs`` (each already on axis 0): (states, stacked outputs)."""
    n_state = len(states)

    def fn(state, x):
        outs = run(body, [*state, *x], scope)
        new_state = [_arr(v) for v in outs[:n_state]]
        _same_avals("Scan state", state, new_state)
        return new_state, [_arr(v) for v in outs[n_state:]]

    return lax.scan(fn, states, xs)


@lower("Scan")
def scan(inputs, attrs, ctx):
    body = attrs["body"]
    n_scan = int(attrs["num_scan_inputs"])
    run, scope = ctx.lower_subgraph, ctx.scope
    if ctx.opset < 9:
        return _scan8(inputs, attrs, body, n_scan, run, scope)
    n_state = len(inputs) - n_scan
    states = [_arr(v) for v in inputs[:n_state]]
    in_axes = attrs.get("scan_input_axes", [0] * n_scan)
    in_dirs = attrs.get("scan_input_directions", [0] * n_scan)
    xs = []
    for x, axis, d in zip(inputs[n_state:], in_axes, in_dirs):
        x = jnp.moveaxis(_arr(x), axis % np.ndim(x), 0)
        xs.append(x[::-1] if d == 1 else x)
    final, ys = _scan(body, states, xs, run, scope)
    out_axes = attrs.get("scan_output_axes", [0] * len(ys))
    out_dirs = attrs.get("scan_output_directions", [0] * len(ys))
    outs = []
    for y, axis, d in zip(ys, out_axes, out_dirs):
        if d == 1:
            y = y[::-1]
        outs.append(jnp.moveaxis(y, 0, axis % y.ndim))
    return (*final, *outs)


def _scan8(inputs, attrs, body, n_scan, run, scope):
    seq_lens = inputs[0]
    rest = [_arr(v) for v in inputs[1:]]
    n_state = len(rest) - n_scan
    full = rest[n_state].shape[1] if n_scan else 0
    if seq_lens is not None:
        if not is_static(seq_lens):
            raise NotImplementedError("Scan-8 needs static sequence_lens")
        if np.any(np.asarray(seq_lens) != full):
            raise NotImplementedError("Scan-8 with sequences shorter than the scan axis")
    dirs = attrs.get("directions", [0] * n_scan)

    def one(*row):
        states, xs = list(row[:n_state]), [x[::-1] if d == 1 else x for x, d in zip(row[n_state:], dirs)]
        final, ys = _scan(body, states, xs, run, scope)
        return (*final, *ys)

    return tuple(jax.vmap(one)(*rest))
