"""Op family: control flow (If, Loop, Scan). Bodies run through the executor's subgraph plans.

Rules
-----
1. A body is an ``onnx_ir.Graph`` attribute; ``ctx.executor.run_graph(body, inputs, ctx.scope)``
   runs it with positional inputs and the enclosing values visible by name (outer scope).
2. If: runs ``then_branch`` when the (single element) condition is true, else ``else_branch``.
   Its VJP runs the taken branch's reverse sweep and hands back the gradients of the outer
   values the branch read. Loop and Scan (opset 9+) VJPs re-run the forward recording each
   iteration's body inputs, then sweep the iterations backwards, carrying the state gradients.
3. Loop: ``M`` (trip count) and ``cond`` are both optional; the body gets ``(iteration, cond,
   carried...)`` and returns ``(cond, carried..., scan outputs...)``. Scan outputs are stacked on
   a new axis 0; with zero iterations they are empty with the body's declared element type.
4. Scan (opset 9+): the last ``num_scan_inputs`` inputs are sliced along their scan axis (reversed
   where the direction is 1); outputs are stacked along ``scan_output_axes`` (reversed likewise).
   Scan-8 has a leading ``sequence_lens`` input and a batch axis 0: each batch row is scanned on
   its axis 1 over its own length.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import onnx_ir as ir
from mconv.engines.reference.ops import register, register_vjp


def _as_bool(x) -> bool:
    return bool(np.asarray(x).reshape(-1)[0])


@register("If")
def if_forward(inputs, attrs, ctx):
    branch = attrs["then_branch"] if _as_bool(inputs[0]) else attrs["else_branch"]
    return tuple(ctx.executor.run_graph(branch, [], ctx.scope))


@register_vjp("If")
def if_vjp(inputs, attrs, outputs, grads, ctx):
    """The taken branch's VJP; gradients flow to the outer values the branch read."""
    branch = attrs["then_branch"] if _as_bool(inputs[0]) else attrs["else_branch"]
    _, outer = ctx.executor.subgraph_vjp(branch, [], ctx.scope, list(grads))
    return [None], outer


def _empty_like_output(value: ir.Value) -> np.ndarray:
    """An empty stack of ``value``'s elements (a Loop/Scan that ran zero times)."""
    dtype: npt.DTypeLike = np.float32
    shape: list[int] = []
    if isinstance(value.type, ir.TensorType):
        try:
            dtype = value.type.dtype.numpy()
        except Exception:  # noqa: BLE001 - dtypes numpy cannot represent fall back to float32
            dtype = np.float32
    if value.shape is not None:
        shape = [d if isinstance(d, int) else 0 for d in value.shape]
    return np.zeros([0, *shape], dtype=dtype)


@register("Loop")
def loop_forward(inputs, attrs, ctx):
    body: ir.Graph = attrs["body"]
    trip = inputs[0] if len(inputs) > 0 else None
    cond = inputs[1] if len(inputs) > 1 else None
    carried = list(inputs[2:])
    n_carried = len(carried)
    max_trip = int(np.asarray(trip).reshape(-1)[0]) if trip is not None else None
    keep_going = _as_bool(cond) if cond is not None else True
    scans: list[list] = [[] for _ in range(len(body.outputs) - 1 - n_carried)]
    run = ctx.executor.run_graph
    i = 0
    while keep_going and (max_trip is None or i < max_trip):
        cond_in = np.array(keep_going, dtype=bool)
        outs = run(body, [np.array(i, dtype=np.int64), cond_in, *carried], ctx.scope)
        if cond is not None:  # without a cond input the body's cond output is ignored (spec)
            keep_going = _as_bool(outs[0])
        carried = outs[1 : 1 + n_carried]
        for k, v in enumerate(outs[1 + n_carried :]):
            scans[k].append(v)
        i += 1
    stacked = []
    for k, items in enumerate(scans):
        if items:
            stacked.append(items if isinstance(items[0], list) else np.stack([np.asarray(v) for v in items]))
        else:
            stacked.append(_empty_like_output(body.outputs[1 + n_carried + k]))
    return (*carried, *stacked)


def _scan(body: ir.Graph, states: list, xs: list, attrs: dict, ctx, n_out_states: int):
    """One Scan over ``xs`` (already moved to axis 0 and direction-corrected by the caller)."""
    run = ctx.executor.run_graph
    steps = xs[0].shape[0] if xs else 0
    per_step: list[list] = [[] for _ in range(len(body.outputs) - n_out_states)]
    for t in range(steps):
        outs = run(body, [*states, *(x[t] for x in xs)], ctx.scope)
        states = outs[:n_out_states]
        for k, v in enumerate(outs[n_out_states:]):
            per_step[k].append(v)
    return states, per_step


@register("Scan")
def scan_forward(inputs, attrs, ctx):
    body: ir.Graph = attrs["body"]
    n_scan = int(attrs["num_scan_inputs"])
    if ctx.opset < 9:
        return _scan8(inputs, attrs, ctx, body, n_scan)
    n_state = len(inputs) - n_scan
    states = list(inputs[:n_state])
    scan_in = list(inputs[n_state:])
    in_axes = attrs.get("scan_input_axes", [0] * n_scan)
    in_dirs = attrs.get("scan_input_directions", [0] * n_scan)
    xs = []
    for x, axis, d in zip(scan_in, in_axes, in_dirs):
        x = np.moveaxis(x, axis % x.ndim, 0)
        xs.append(x[::-1] if d == 1 else x)
    states, per_step = _scan(body, states, xs, attrs, ctx, n_state)
    n_scan_out = len(per_step)
    out_axes = attrs.get("scan_output_axes", [0] * n_scan_out)
    out_dirs = attrs.get("scan_output_directions", [0] * n_scan_out)
    outs = []
    for k, items in enumerate(per_step):
        if not items:
            outs.append(_empty_like_output(body.outputs[n_state + k]))
            continue
        if out_dirs[k] == 1:
            items = items[::-1]
        y = np.stack(items)
        outs.append(np.moveaxis(y, 0, out_axes[k] % y.ndim))
    return (*states, *outs)


def _scan8(inputs, attrs, ctx, body, n_scan):
    seq_lens = inputs[0]
    rest = list(inputs[1:])
    n_state = len(rest) - n_scan
    batch = rest[0].shape[0]
    dirs = attrs.get("directions", [0] * n_scan)
    all_states: list[list] = [[] for _ in range(n_state)]
    all_outs: list[list] = []
    for b in range(batch):
        states = [s[b] for s in rest[:n_state]]
        xs = []
        for x, d in zip(rest[n_state:], dirs):
            xb = x[b]
            n = int(seq_lens[b]) if seq_lens is not None else xb.shape[0]
            xb = xb[:n]
            xs.append(xb[::-1] if d == 1 else xb)
        states, per_step = _scan(body, states, xs, attrs, ctx, n_state)
        for k, s in enumerate(states):
            all_states[k].append(s)
        all_outs.append([np.stack(items) for items in per_step])
    outs = [np.stack([row[k] for row in all_outs]) for k in range(len(all_outs[0]))] if all_outs else []
    return (*[np.stack(s) for s in all_states], *outs)


def _zeros_if_none(g, like):
    return np.zeros_like(like) if g is None else g


def _add_outer(total: dict, outer: dict) -> None:
    for name, g in outer.items():
        if g is not None:
            total[name] = g if name not in total else total[name] + g


@register_vjp("Loop")
def loop_vjp(inputs, attrs, outputs, grads, ctx):
    body: ir.Graph = attrs["body"]
    trip = inputs[0] if len(inputs) > 0 else None
    cond = inputs[1] if len(inputs) > 1 else None
    carried = list(inputs[2:])
    n_carried = len(carried)
    max_trip = int(np.asarray(trip).reshape(-1)[0]) if trip is not None else None
    keep_going = _as_bool(cond) if cond is not None else True
    run = ctx.executor.run_graph
    recorded: list[list] = []
    i = 0
    while keep_going and (max_trip is None or i < max_trip):
        args = [np.array(i, dtype=np.int64), np.array(keep_going, dtype=bool), *carried]
        recorded.append(args)
        outs = run(body, args, ctx.scope)
        if cond is not None:
            keep_going = _as_bool(outs[0])
        carried = outs[1 : 1 + n_carried]
        i += 1
    g_carried = list(grads[:n_carried])
    g_scans = list(grads[n_carried:])
    outer_total: dict = {}
    for t in range(len(recorded) - 1, -1, -1):
        cot = [None, *g_carried, *(None if g is None else g[t] for g in g_scans)]
        in_grads, outer = ctx.executor.subgraph_vjp(body, recorded[t], ctx.scope, cot)
        g_carried = in_grads[2 : 2 + n_carried]
        _add_outer(outer_total, outer)
    return [None, None, *g_carried], outer_total


@register_vjp("Scan")
def scan_vjp(inputs, attrs, outputs, grads, ctx):
    if ctx.opset < 9:
        raise NotImplementedError("Scan-8 (batched, with sequence_lens) has no VJP")
    body: ir.Graph = attrs["body"]
    n_scan = int(attrs["num_scan_inputs"])
    n_state = len(inputs) - n_scan
    in_axes = attrs.get("scan_input_axes", [0] * n_scan)
    in_dirs = attrs.get("scan_input_directions", [0] * n_scan)
    xs = []
    for x, axis, d in zip(inputs[n_state:], in_axes, in_dirs):
        x = np.moveaxis(x, axis % x.ndim, 0)
        xs.append(x[::-1] if d == 1 else x)
    steps = xs[0].shape[0] if xs else 0
    states = list(inputs[:n_state])
    recorded = []
    for t in range(steps):
        args = [*states, *(x[t] for x in xs)]
        recorded.append(args)
        states = ctx.executor.run_graph(body, args, ctx.scope)[:n_state]
    n_out = len(outputs) - n_state
    out_axes = attrs.get("scan_output_axes", [0] * n_out)
    out_dirs = attrs.get("scan_output_directions", [0] * n_out)
    g_ys = []  # per scan output: step-major cotangents in the body's order
    for k in range(n_out):
        g = grads[n_state + k]
        if g is None:
            g_ys.append(None)
            continue
        g = np.moveaxis(g, out_axes[k] % g.ndim, 0)
        g_ys.append(g[::-1] if out_dirs[k] == 1 else g)
    g_states = list(grads[:n_state])
    g_xs: list[list] = [[None] * steps for _ in range(n_scan)]
    outer_total: dict = {}
    for t in range(steps - 1, -1, -1):
        cot = [*g_states, *(None if g is None else g[t] for g in g_ys)]
        in_grads, outer = ctx.executor.subgraph_vjp(body, recorded[t], ctx.scope, cot)
        g_states = in_grads[:n_state]
        for k in range(n_scan):
            g_xs[k][t] = in_grads[n_state + k]
        _add_outer(outer_total, outer)
    result = list(g_states)
    for k, (x, axis, d) in enumerate(zip(inputs[n_state:], in_axes, in_dirs)):
        if not steps or all(g is None for g in g_xs[k]):
            result.append(None)
            continue
        per_step = [_zeros_if_none(g, xs[k][t]) for t, g in enumerate(g_xs[k])]
        gx = np.stack(per_step)
        if d == 1:
            gx = gx[::-1]
        result.append(np.moveaxis(gx, 0, axis % x.ndim))
    return result, outer_total
