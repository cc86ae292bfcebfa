"""Op family: sequences and optionals. A sequence is a Python list of arrays; an empty optional
is ``None``.

Rules
-----
1. Positions may be negative (counted from the end); a position out of range is an error.
2. SequenceInsert without a position appends; SequenceErase without one removes the last.
3. SplitToSequence: with ``split`` absent, chunks of 1 along ``axis`` (squeezed unless
   ``keepdims=0``); a scalar ``split`` gives equal chunks with a shorter last one; a 1-D one gives
   the chunk lengths.
4. ConcatFromSequence with ``new_axis=1`` stacks (the axis may then be ``rank``).
5. SequenceMap runs its body once per position; tensor (non-sequence) inputs are broadcast to
   every call, sequence inputs give their element at that position.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from mconv.engines.reference.ops import register, register_vjp


def _position(pos, n: int, *, insert: bool = False) -> int:
    p = int(np.asarray(pos).reshape(-1)[0])
    limit = n if insert else n - 1
    if p < -n or p > limit:
        raise IndexError(f"sequence position {p} out of range for length {n}")
    return p + n if p < 0 else p


def _elem_dtype(tp) -> np.dtype:
    """The element dtype of a sequence (or tensor) type attribute, float32 when unknown."""
    t = tp
    while t is not None and not isinstance(t, ir.TensorType):
        t = getattr(t, "elem_type", None)
    try:
        return np.dtype(t.dtype.numpy()) if t is not None else np.dtype(np.float32)
    except Exception:  # noqa: BLE001 - exotic dtypes
        return np.dtype(np.float32)


@register("SequenceEmpty")
def sequence_empty(inputs, attrs, ctx):
    return ([],)


@register("SequenceConstruct")
def sequence_construct(inputs, attrs, ctx):
    return (list(inputs),)


@register_vjp("SequenceConstruct")
def sequence_construct_vjp(inputs, attrs, outputs, grads, ctx):
    g = grads[0]
    if g is None:
        return [None] * len(inputs)
    return [gi if gi is not None else np.zeros_like(x) for gi, x in zip(g, inputs)]


@register("SequenceInsert")
def sequence_insert(inputs, attrs, ctx):
    seq = list(inputs[0])
    pos = len(seq) if len(inputs) < 3 or inputs[2] is None else _position(inputs[2], len(seq), insert=True)
    seq.insert(pos, inputs[1])
    return (seq,)


@register("SequenceErase")
def sequence_erase(inputs, attrs, ctx):
    seq = list(inputs[0])
    pos = len(seq) - 1 if len(inputs) < 2 or inputs[1] is None else _position(inputs[1], len(seq))
    del seq[pos]
    return (seq,)


@register("SequenceAt")
def sequence_at(inputs, attrs, ctx):
    seq = inputs[0]
    return (seq[_position(inputs[1], len(seq))],)


@register_vjp("SequenceAt")
def sequence_at_vjp(inputs, attrs, outputs, grads, ctx):
    seq = inputs[0]
    pos = _position(inputs[1], len(seq))
    g = [np.zeros_like(x) for x in seq]
    if grads[0] is not None:
        g[pos] = grads[0]
    return [g, None]


@register("SequenceLength")
def sequence_length(inputs, attrs, ctx):
    return (np.array(len(inputs[0]), dtype=np.int64),)


@register("SplitToSequence")
def split_to_sequence(inputs, attrs, ctx):
    x = inputs[0]
    split = inputs[1] if len(inputs) > 1 else None
    axis = int(attrs.get("axis", 0)) % x.ndim
    if split is None:
        parts = np.split(x, x.shape[axis], axis=axis)
        if int(attrs.get("keepdims", 1)) == 0:
            parts = [np.squeeze(p, axis=axis) for p in parts]
        return (parts,)
    split = np.asarray(split)
    if split.ndim == 0:
        step = int(split)
        bounds = list(range(step, x.shape[axis], step))
    else:
        bounds = list(np.cumsum(split)[:-1])
    return (np.split(x, bounds, axis=axis),)


@register("ConcatFromSequence")
def concat_from_sequence(inputs, attrs, ctx):
    seq = inputs[0]
    axis = int(attrs["axis"])
    if int(attrs.get("new_axis", 0)) == 1:
        return (np.stack(seq, axis=axis if axis >= 0 else axis + seq[0].ndim + 1),)
    return (np.concatenate(seq, axis=axis),)


@register("SequenceMap")
def sequence_map(inputs, attrs, ctx):
    body: ir.Graph = attrs["body"]
    n = len(inputs[0])
    outs: list[list] = [[] for _ in body.outputs]
    for i in range(n):
        args = [x[i] if isinstance(x, list) else x for x in inputs]
        for k, y in enumerate(ctx.executor.run_graph(body, args, ctx.scope)):
            outs[k].append(y)
    return tuple(outs)


@register("Optional")
def optional(inputs, attrs, ctx):
    return (inputs[0] if inputs else None,)


@register("OptionalHasElement")
def optional_has_element(inputs, attrs, ctx):
    return (np.array(bool(inputs) and inputs[0] is not None),)


@register("OptionalGetElement")
def optional_get_element(inputs, attrs, ctx):
    if inputs[0] is None:
        raise ValueError("OptionalGetElement on an empty optional")
    return (inputs[0],)
