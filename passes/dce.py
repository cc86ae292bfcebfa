"""dce: dead-code elimination."""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir
from mconv.passes.base import Pass, PassContext, PassReport, register_pass


def _remove_dead_nodes(graph: ir.Graph) -> int:
    """Remove nodes of ``graph`` (and its subgraphs) whose outputs nobody uses; returns the count."""
    removed = 0
    for node in reversed(list(graph)):
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                removed += _remove_dead_nodes(attr.value)
            elif attr.type == ir.AttributeType.GRAPHS:
                removed += sum(_remove_dead_nodes(g) for g in attr.value)
        if any(o.uses() or o.is_graph_output() for o in node.outputs):
            continue
        graph.remove(node, safe=True)
        removed += 1
    return removed


@register_pass("dce")
class DeadCodeElimination(Pass):
    """Remove what cannot affect a graph output.

    1. A node none of whose outputs is used (by a node, a subgraph node, or as a graph output)
       is removed, visiting nodes in reverse order so that whole dead chains go in one sweep;
       subgraphs are swept the same way. ONNX ops have no side effects, so this is always safe.
    2. An initializer with no use that is not a graph output is removed. If it is also listed as
       a graph input (old models list every weight as an input), it is removed from the inputs
       too: it was a weight, not something a caller feeds.
    3. Real graph inputs (those without an initializer) are kept even when unused, so the
       model's interface does not change.
    """

    @dataclass
    class Config:
        remove_initializers: bool = True

    def run(self, model: ir.Model, config: Config, ctx: PassContext) -> PassReport:
        graph = model.graph
        if len(graph) == 0 and not graph.outputs:
            # A weight-only model (mconv.formats.weights): its tensors are the product, not dead.
            return self.report(False, notes=["weight-only model: nothing is dead"])
        nodes = _remove_dead_nodes(graph)
        inits = 0
        if config.remove_initializers:
            for name, value in list(graph.initializers.items()):
                if value.uses() or value.is_graph_output():
                    continue
                graph.initializers.pop(name)
                if value in graph.inputs:
                    graph.inputs.remove(value)
                inits += 1
        notes = [f"removed {nodes} nodes and {inits} initializers"]
        return self.report(bool(nodes or inits), notes=notes)
