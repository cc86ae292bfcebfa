"""If nodes for the metal and webgpu targets, which run no subgraphs.

Rules:

1. An If whose condition is constant once shapes are static becomes its taken branch (the
   ``inline-if`` pass), and the model is prepared again (:func:`prepare_with_ifs`).
2. An If whose condition is computed at run time (from the input: a wake-word classifier's
   gate) runs both branches and selects: when both branches together hold at most
   :data:`MAX_SELECT_NODES` nodes, none of them a Loop, Scan or If (running both must stay
   cheap), and each output pair has the same static shape and element type in both branches,
   both branches' nodes move into the graph and each If output becomes
   ``Where(cond, then_output, else_output)`` (the condition reshaped to a scalar). The
   branch not taken is computed and discarded: a NaN or infinity it makes never reaches the
   output, since Where picks element by element.
3. An If left (a branch too large, shapes that differ) is refused by the planner; the export
   names the inputs its condition depends on (``export --input-value`` bakes them).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

__all__ = ["MAX_SELECT_NODES", "prepare_with_ifs", "select_data_ifs"]

MAX_SELECT_NODES = 64
MAX_ROUNDS = 8


def _branch_cost(graph: ir.Graph) -> int | None:
    """Nodes in ``graph``, or None when one of them holds a subgraph (Loop, Scan, If)."""
    count = 0
    for node in graph:
        if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()):
            return None
        count += 1
    return count


def _static(value: ir.Value) -> tuple[int, ...] | None:
    if value.shape is None:
        return None
    dims = tuple(d for d in value.shape if isinstance(d, int))
    return dims if len(dims) == len(value.shape) else None


def _selectable(node: ir.Node) -> bool:
    """Rule 2's conditions for the If ``node``."""
    then_b = node.attributes.get("then_branch")
    else_b = node.attributes.get("else_branch")
    if then_b is None or else_b is None or not node.inputs or node.inputs[0] is None:
        return False
    tg, eg = then_b.as_graph(), else_b.as_graph()
    costs = [_branch_cost(tg), _branch_cost(eg)]
    if any(c is None for c in costs) or sum(c or 0 for c in costs) > MAX_SELECT_NODES:
        return False
    if len(tg.outputs) != len(node.outputs) or len(eg.outputs) != len(node.outputs):
        return False
    for t, e in zip(tg.outputs, eg.outputs):
        ts, es = _static(t), _static(e)
        if ts is None or ts != es or t.dtype is None or t.dtype != e.dtype:
            return False
    cond = node.inputs[0]
    return cond.shape is None or int(np.prod([d if isinstance(d, int) else 2 for d in cond.shape])) == 1


def select_data_ifs(model: ir.Model) -> list[str]:
    """Rule 2 on the main graph's Ifs; returns one note per If rewritten."""
    from mconv.edit.rewrite import add_initializer, fresh_name, replace_value
    from mconv.passes.inline_if import _all_names, move_branch

    graph = model.graph
    notes: list[str] = []
    for node in list(graph):
        if node.op_type != "If" or node.domain not in ("", "ai.onnx") or not _selectable(node):
            continue
        cond = node.inputs[0]
        assert cond is not None
        if cond.const_value is not None:
            continue  # rule 1's
        names = _all_names(model)
        taken = set(names)
        if cond.shape is None or len(cond.shape) != 0:
            shape = add_initializer(
                graph, fresh_name(f"{node.name or 'If'}_scalar", taken), np.zeros(0, np.int64)
            )
            reshape = ir.node("Reshape", [cond, shape], name=fresh_name(f"{node.name or 'If'}_cond", taken))
            reshape.outputs[0].name = fresh_name(f"{cond.name or 'cond'}_scalar", taken)
            reshape.outputs[0].type = cond.type
            reshape.outputs[0].shape = ir.Shape([])
            graph.insert_before(node, reshape)
            cond = reshape.outputs[0]
        names.update(taken)
        then_outs = move_branch(graph, node, True, names)
        else_outs = move_branch(graph, node, False, names)
        taken = set(names)
        for out, t, e in zip(node.outputs, then_outs, else_outs):
            where = ir.node("Where", [cond, t, e], name=fresh_name(f"{node.name or 'If'}_select", taken))
            y = where.outputs[0]
            y.name = fresh_name(f"{out.name or 'if_out'}_selected", taken)
            y.type = t.type
            y.shape = t.shape
            graph.insert_before(node, where)
            replace_value(out, y)
        graph.remove(node, safe=True)
        notes.append(f"If '{node.name or ''}': both branches run, Where selects")
    return notes


def prepare_with_ifs(model: ir.Model, batch: int) -> ir.Model:
    """The GPU planner's ``prepare`` with rules 1 and 2 applied until no If changes."""
    from mconv.passes.inline_if import inline_constant_ifs
    from mconv.targets.gpu.plan import prepare

    prepared = prepare(model, batch)
    for _ in range(MAX_ROUNDS):
        if not inline_constant_ifs(prepared) and not select_data_ifs(prepared):
            break
        prepared = prepare(prepared, batch)
    return prepared
