"""eliminate-identity: remove Identity nodes and inference-mode Dropout."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
from mconv.edit.rewrite import constant_array
from mconv.passes.base import Pass, PassContext, PassReport, register_pass


def _is_inference_dropout(node: ir.Node, graph: ir.Graph, ir_version: int) -> bool:
    """Dropout that passes its input through: no training mode, mask output absent or unused."""
    if (
        len(node.outputs) > 1
        and node.outputs[1] is not None
        and (node.outputs[1].uses() or node.outputs[1].is_graph_output())
    ):
        return False
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        training = constant_array(node.inputs[2], graph, ir_version)
        if training is None or bool(np.asarray(training).reshape(-1)[0]):
            return False
    is_test = node.attributes.get("is_test")  # opset <= 6: is_test=0 means training
    if is_test is not None and not is_test.value:
        return False
    return True


@register_pass("eliminate-identity")
class EliminateIdentity(Pass):
    """Remove nodes that pass their input through unchanged.

    1. ``y = Identity(x)`` and ``y = Dropout(x)`` in inference mode (``training_mode`` absent or
       constant false, ``is_test`` not 0, mask output absent or unused) are candidates::

           before: x -> Conv -> Dropout -> Relu        after: x -> Conv -> Relu

    2. If ``y`` is not a graph output, every use of ``y`` becomes a use of ``x``.
    3. If ``y`` is a graph output and ``x`` is produced by a node of the same graph (not a graph
       input, initializer or another graph output), ``x`` is renamed to ``y`` so the graph's
       output names are stable.
    4. Otherwise the node stays: ``y`` a graph output fed straight from a graph input or
       initializer (removing it would change the interface), or a subgraph output (If branch,
       Loop / Scan body) fed from an outer-scope value, which ONNX requires a node to produce::

           then_branch: () => (y) { y = Identity(x_outer) }    kept as it is

    Subgraphs (If, Loop, Scan bodies, nested at any depth) are visited like the main graph; uses
    of ``y`` inside subgraphs become uses of ``x`` as well.
    """

    @dataclass
    class Config:
        dropout: bool = True

    def run(self, model: ir.Model, config: Config, ctx: PassContext) -> PassReport:
        removed = 0
        ir_version = model.ir_version or 10
        for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
            if self._try_eliminate(node, config, ir_version):
                removed += 1
        return self.report(removed > 0, notes=[f"removed {removed} nodes"])

    @staticmethod
    def _try_eliminate(node: ir.Node, config: Config, ir_version: int) -> bool:
        if node.domain not in ("", "ai.onnx") or not node.inputs or node.inputs[0] is None:
            return False
        graph = node.graph
        assert graph is not None  # the traversal yields nodes of a graph
        if node.op_type == "Identity":
            pass
        elif node.op_type == "Dropout" and config.dropout:
            if not _is_inference_dropout(node, graph, ir_version):
                return False
        else:
            return False
        x, y = node.inputs[0], node.outputs[0]
        if y.is_graph_output():
            producer = x.producer()
            if (
                x.is_graph_input()
                or x.is_initializer()
                or x.is_graph_output()
                or producer is None
                or producer.graph is not graph  # an outer-scope value: a subgraph must produce y
            ):
                return False
            # x's other consumers keep seeing the same value under its new name.
            name = y.name
            ir.convenience.replace_all_uses_with(y, x, replace_graph_outputs=True)
            y.name = None
            x.name = name
        else:
            ir.convenience.replace_all_uses_with(y, x)
        if x.shape is None:
            x.shape = y.shape
        if x.type is None:
            x.type = y.type
        graph.remove(node, safe=True)
        return True
