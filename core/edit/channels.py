"""Structured channel pruning for ``prune(structured=...)``: remove output channels and rewire.

For a Conv (group 1) or Gemm whose output channels ``keep`` survive, the plan follows the
output value through the graph and slices every tensor that indexes those channels:

1. The producer: its weight along the output axis and its bias.
2. Channel-preserving ops pass the channel set on unchanged: unary elementwise activations,
   Dropout, Identity, MaxPool/AveragePool/LpPool and their Global forms.
3. BatchNormalization: scale, B, mean and var are sliced.
4. Add/Sub/Mul/Div with a constant: the constant is sliced where it spans the channel axis
   (a scalar or a size-1 axis broadcasts and stays). With a non-constant other input, the op is
   safe only when that input carries the very same channel set (both branches pruned alike);
   otherwise it is a residual connection and the layer is refused.
5. Concat along the channel axis: the removed channels move by the input's offset.
6. Flatten(axis=1), and Reshape to ``[N, C*H*W]`` / ``[N, -1]`` / ``[0, -1]`` / ``[-1, C*H*W]``:
   each channel expands to its H*W feature positions (an explicit feature count in the Reshape's
   shape constant is updated).
7. The consumers that end the walk: Conv (group 1) slices its weight's input axis; Gemm
   (transA=0) and MatMul with a 2-D constant weight slice the weight's input axis. A depthwise
   Conv (group == channels) drops the same channels from its weight, bias and group and the
   walk continues from its output (a channel multiplier m keeps m outputs per channel).
8. Anything else is unsafe and refuses the layer: a graph output, a residual connection, a
   grouped (non-depthwise) convolution, LRN (it mixes neighbouring channels), a Reshape of
   other semantics, a weight or constant shared with another node, shapes that are unknown.

The whole plan is made before anything changes, so a refused layer leaves the model untouched.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir
from mconv.edit.weights import WeightRef
from mconv.errors import InputError

PASS_THROUGH = frozenset(
    {
        "Relu",
        "LeakyRelu",
        "PRelu",
        "Sigmoid",
        "Tanh",
        "Elu",
        "Selu",
        "Celu",
        "Softplus",
        "Softsign",
        "HardSigmoid",
        "HardSwish",
        "Gelu",
        "Mish",
        "Identity",
        "Dropout",
        "Abs",
        "Neg",
        "Clip",
        "MaxPool",
        "AveragePool",
        "LpPool",
        "GlobalAveragePool",
        "GlobalMaxPool",
        "GlobalLpPool",
    }
)
BINARY = frozenset({"Add", "Sub", "Mul", "Div"})


class Unsafe(Exception):
    """A layer whose channels cannot be removed safely: the node and why."""

    def __init__(self, node: ir.Node | None, reason: str) -> None:
        super().__init__(reason)
        self.node = node
        self.reason = reason


@dataclass
class Plan:
    """What removing a set of channels changes, collected before anything is changed."""

    slices: dict[int, tuple[ir.Value, int, list[int]]] = field(default_factory=dict)
    shapes: list[tuple[ir.Value, int, int]] = field(default_factory=list)
    attrs: list[tuple[ir.Node, str, int]] = field(default_factory=list)
    consts: list[tuple[ir.Value, np.ndarray]] = field(default_factory=list)
    visited: dict[int, tuple[int, tuple[int, ...]]] = field(default_factory=dict)

    def slice(self, value: ir.Value, axis: int, keep: list[int], node: ir.Node) -> None:
        if value is None or not value.is_initializer() or value.const_value is None:
            raise Unsafe(node, f"input {value.name if value else '?'} is not a constant initializer")
        if len(value.uses()) != 1:
            raise Unsafe(node, f"{value.name} is shared with another node")
        previous = self.slices.get(id(value))
        if previous is not None and (previous[1], previous[2]) != (axis, keep):
            raise Unsafe(node, f"{value.name} would be sliced two different ways")
        self.slices[id(value)] = (value, axis, keep)

    def apply(self) -> None:
        for value, axis, keep in self.slices.values():
            tensor = value.const_value
            assert tensor is not None  # slice() admits constant initializers only
            array = np.take(tensor.numpy(), keep, axis=axis)
            value.const_value = ir.tensor(np.ascontiguousarray(array), name=value.name)
            value.shape = ir.Shape(array.shape)
        for value, array in self.consts:
            value.const_value = ir.tensor(array, name=value.name)
        for node, key, v in self.attrs:
            node.attributes[key] = ir.AttrInt64(key, v)
        for value, axis, size in self.shapes:
            if value.shape is not None and axis < len(value.shape):
                dims = list(value.shape)
                dims[axis] = size
                value.shape = ir.Shape(dims)


def _attr(node: ir.Node, key: str, default):
    a = node.attributes.get(key)
    return a.value if a is not None else default


def _const(value: ir.Value | None) -> np.ndarray | None:
    if value is not None and value.is_initializer() and value.const_value is not None:
        return value.const_value.numpy()
    return None


def _dims(value: ir.Value, node: ir.Node) -> list[int]:
    dims = [d for d in value.shape or () if isinstance(d, int)]
    if value.shape is None or len(dims) != len(value.shape):
        raise Unsafe(node, f"the shape of {value.name} is unknown (run shape-inference first)")
    return dims


def channel_norms(ref: WeightRef, kind: str) -> np.ndarray:
    w = np.moveaxis(ref.array().astype(np.float64), ref.out_axis, 0).reshape(ref.shape[ref.out_axis], -1)
    return np.abs(w).sum(axis=1) if kind == "l1" else np.sqrt((w * w).sum(axis=1))


def plan_removal(ref: WeightRef, keep: list[int]) -> Plan:
    """The rewiring plan for keeping output channels ``keep`` of ``ref.node`` (rules 1-8)."""
    node = ref.node
    plan = Plan()
    if node.op_type == "Conv":
        if int(_attr(node, "group", 1)) != 1:
            raise Unsafe(node, "grouped convolution (its channels are tied to its groups)")
    elif node.op_type == "Gemm":
        if int(_attr(node, "transA", 0)):
            raise Unsafe(node, "Gemm with transA=1")
    else:
        raise Unsafe(node, f"structured pruning removes output channels of Conv and Gemm, not {node.op_type}")
    count = ref.shape[ref.out_axis]
    plan.slice(ref.value, ref.out_axis, keep, node)
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        bias = node.inputs[2]
        b = _const(bias)
        if b is None:
            raise Unsafe(node, "its bias is not a constant")
        if b.size == count and b.ndim >= 1 and b.shape[-1] == count:
            plan.slice(bias, b.ndim - 1, keep, node)
        elif b.size != 1:
            raise Unsafe(node, f"bias of shape {list(b.shape)} does not broadcast per channel")
    _walk(plan, node.outputs[0], 1, keep, count)
    return plan


def _walk(plan: Plan, start: ir.Value, axis: int, keep: list[int], count: int) -> None:
    work = [(start, axis, keep, count)]
    pending: list[tuple[ir.Node, int, list[int], int]] = []
    while True:
        while work:
            value, axis, keep, count = work.pop()
            key = (axis, tuple(keep))
            if id(value) in plan.visited:
                if plan.visited[id(value)] != key:
                    raise Unsafe(value.producer(), f"{value.name} reached with two different channel sets")
                continue
            plan.visited[id(value)] = key
            if value.is_graph_output():
                raise Unsafe(value.producer(), f"its output {value.name} is a graph output")
            plan.shapes.append((value, axis, len(keep)))
            for consumer, index in value.uses():
                _visit(plan, consumer, index, value, axis, keep, count, work, pending)
        progressed = False
        for item in list(pending):
            node, axis, keep, count = item
            others = [v for v in node.inputs if v is not None and _const(v) is None]
            if all(plan.visited.get(id(v)) == (axis, tuple(keep)) for v in others):
                pending.remove(item)
                work.append((node.outputs[0], axis, keep, count))
                progressed = True
        if not progressed:
            break
    if pending:
        node = pending[0][0]
        raise Unsafe(node, f"residual {node.op_type}: its other input is not pruned the same way")


def _visit(plan, consumer, index, value, axis, keep, count, work, pending) -> None:
    op = consumer.op_type
    name = consumer.name or op
    if consumer.domain not in ("", "ai.onnx"):
        raise Unsafe(consumer, f"custom op {consumer.domain}.{op}")
    if op in PASS_THROUGH and index == 0:
        if op.endswith("Pool") and axis != 1:
            raise Unsafe(consumer, f"{op} over an axis other than channels")
        if op == "PRelu":
            slope = _const(consumer.inputs[1])
            if slope is None or slope.size not in (1, count):
                raise Unsafe(consumer, "PRelu slope not per channel or constant")
            if slope.size == count:
                plan.slice(consumer.inputs[1], int(np.argmax(slope.shape)), keep, consumer)
        for out in consumer.outputs:
            if out is not None and (op != "Dropout" or out is consumer.outputs[0] or out.uses()):
                work.append((out, axis, keep, count))
        return
    if op == "BatchNormalization" and index == 0 and axis == 1:
        for i in range(1, 5):
            plan.slice(consumer.inputs[i], 0, keep, consumer)
        work.append((consumer.outputs[0], axis, keep, count))
        return
    if op in BINARY:
        other = consumer.inputs[1 - index]
        const = _const(other)
        if const is None:
            pending.append((consumer, axis, keep, count))
            return
        rank = len(_dims(value, consumer))
        d = const.ndim - (rank - axis)
        if 0 <= d and const.shape[d] == count and count > 1:
            plan.slice(other, d, keep, consumer)
        elif 0 <= d and const.shape[d] not in (1, count):
            raise Unsafe(consumer, f"constant of shape {list(const.shape)} does not broadcast per channel")
        work.append((consumer.outputs[0], axis, keep, count))
        return
    if op == "Concat":
        rank = len(_dims(value, consumer))
        cat = int(_attr(consumer, "axis", 1)) % rank
        if cat != axis:
            raise Unsafe(consumer, f"Concat along axis {cat}, not the channel axis")
        offset = 0
        for v in consumer.inputs[:index]:
            offset += _dims(v, consumer)[axis]
        total = _dims(consumer.outputs[0], consumer)[axis]
        removed = {offset + c for c in set(range(count)) - set(keep)}
        work.append((consumer.outputs[0], axis, [c for c in range(total) if c not in removed], total))
        return
    if op in ("Flatten", "Reshape") and index == 0:
        dims = _dims(value, consumer)
        if axis != 1:
            raise Unsafe(consumer, f"{op} of a value whose channels are on axis {axis}")
        spatial = int(np.prod(dims[2:], dtype=np.int64))
        features = count * spatial
        if op == "Flatten":
            if int(_attr(consumer, "axis", 1)) != 1:
                raise Unsafe(consumer, "Flatten with axis other than 1")
        else:
            target = _const(consumer.inputs[1])
            if target is None or target.ndim != 1 or target.size != 2:
                raise Unsafe(consumer, "Reshape with a shape that is not a constant [N, features]")
            n, f = int(target[0]), int(target[1])
            if f == -1 and n in (0, dims[0]):
                pass
            elif f == features and n in (0, -1, dims[0]):
                new = target.copy()
                new[1] = len(keep) * spatial
                if len(consumer.inputs[1].uses()) != 1:
                    raise Unsafe(consumer, "its shape constant is shared with another node")
                plan.consts.append((consumer.inputs[1], new))
            else:
                raise Unsafe(consumer, f"Reshape to {target.tolist()} is not a flatten of {dims}")
        expanded = [c * spatial + j for c in keep for j in range(spatial)]
        work.append((consumer.outputs[0], 1, expanded, features))
        return
    if op == "Conv" and index == 0 and axis == 1:
        group = int(_attr(consumer, "group", 1))
        w = _const(consumer.inputs[1])
        if w is None:
            raise Unsafe(consumer, "its weight is not a constant")
        if group == 1:
            plan.slice(consumer.inputs[1], 1, keep, consumer)
            return
        if group == count and w.shape[1] == 1:  # depthwise
            mult = w.shape[0] // count
            out_keep = [c * mult + j for c in keep for j in range(mult)]
            plan.slice(consumer.inputs[1], 0, out_keep, consumer)
            if len(consumer.inputs) > 2 and consumer.inputs[2] is not None:
                plan.slice(consumer.inputs[2], 0, out_keep, consumer)
            plan.attrs.append((consumer, "group", len(keep)))
            work.append((consumer.outputs[0], 1, out_keep, w.shape[0]))
            return
        raise Unsafe(consumer, f"grouped convolution (group={group}) consumes the channels")
    if op == "Gemm" and index == 0 and axis == 1 and not int(_attr(consumer, "transA", 0)):
        plan.slice(consumer.inputs[1], 1 if int(_attr(consumer, "transB", 0)) else 0, keep, consumer)
        return
    if op == "MatMul" and index == 0:
        w = _const(consumer.inputs[1])
        if w is not None and w.ndim == 2 and axis == len(_dims(value, consumer)) - 1:
            plan.slice(consumer.inputs[1], 0, keep, consumer)
            return
    raise Unsafe(consumer, f"{op} node {name} (input {index}) is not an op whose channels mconv can rewire")


def prune_channels(model: ir.Model, selected: list) -> tuple[list[dict], list[str]]:
    """Remove the weakest output channels of each selected (WeightRef, config); see prune's rule 4."""
    from mconv.edit.shapes import infer_on_stripped_copy, merge_inferred

    inferred = infer_on_stripped_copy(model, keep_bytes=1024, strict=False, data_prop=True)
    if inferred is not None:
        merge_inferred(model, inferred)
    tensors, notes = [], []
    for ref, cfg in selected:
        if cfg.sparsity <= 0:
            continue
        if ref.node.op_type == "Conv" and int(_attr(ref.node, "group", 1)) != 1:
            # Its channels follow its input's (rule 7): never a producer of its own.
            notes.append(f"{ref.node.name or ref.name}: skipped (grouped convolution)")
            continue
        count = ref.shape[ref.out_axis]
        n_remove = min(int(round(cfg.sparsity * count)), count - 1)
        if n_remove <= 0:
            continue
        order = np.argsort(channel_norms(ref, cfg.structured), kind="stable")
        removed = sorted(int(c) for c in order[:n_remove])
        keep = sorted(int(c) for c in order[n_remove:])
        try:
            plan = plan_removal(ref, keep)
        except Unsafe as exc:
            where = f"node {exc.node.name or exc.node.op_type}" if exc.node is not None else "graph"
            if cfg.on_unsafe == "error":
                raise InputError(
                    f"cannot remove channels of {ref.node.name or ref.name}: {exc.reason}",
                    where=where,
                    hint="exclude the layer (op_name override sparsity=0) or set on_unsafe='skip'",
                ) from None
            notes.append(f"{ref.node.name or ref.name}: skipped ({where}: {exc.reason})")
            continue
        shape = list(ref.shape)
        plan.apply()
        tensors.append(
            {
                "name": ref.name,
                "node": ref.node.name,
                "op": ref.node.op_type,
                "shape": shape,
                "kept": len(keep) / count,
                "threshold": None,
                "channels_removed": removed,
                "structured": cfg.structured,
            }
        )
    return tensors, notes
