"""fold: constant folding with the reference executor's kernels."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir
from mconv.edit.rewrite import (
    add_initializer,
    constant_array,
    fresh_name,
    replace_value,
    taken_names,
    upgrade_ir3,
)
from mconv.passes.base import Pass, PassContext, PassReport, bounded, register_pass

# Ops whose outputs are random draws: folding would freeze one draw.
RANDOM_OPS = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}
)
# Ops that decompress stored weights at run time: folding them would undo fp16 / int8 storage.
DECOMPRESS_OPS = frozenset({"Cast", "DequantizeLinear", "DynamicQuantizeLinear"})


def evaluate_node(node: ir.Node, inputs: list[np.ndarray | None], opset: int) -> list[np.ndarray]:
    """Evaluate ``node`` on constant inputs with the reference executor's kernels.

    Folding uses the same kernels verification trusts; a node they cannot evaluate raises, and
    the pass keeps it (rule 5), rather than asking another implementation with other semantics.
    """
    from mconv.engines.reference.executor import attr_to_python, run_node

    attrs = {k: attr_to_python(a) for k, a in node.attributes.items()}
    outs = run_node(node.op_type, inputs, attrs, domain=node.domain, opset=opset)
    arrays = []
    for o in outs[: len(node.outputs)]:
        if not isinstance(o, (np.ndarray, np.generic)):  # a sequence, an optional, a map
            raise TypeError(f"gives a {type(o).__name__}, not a tensor")
        arrays.append(np.asarray(o))
    return arrays


def _fits(value: ir.Value, array: np.ndarray) -> bool:
    """Whether ``array`` can stand for ``value``: a tensor of the declared dtype and shape."""
    if value.type is not None and not isinstance(value.type, ir.TensorType):
        return False
    if value.dtype is not None and ir.DataType.from_numpy(array.dtype) != value.dtype:
        return False
    if value.shape is not None:
        if len(value.shape) != array.ndim:
            return False
        if any(isinstance(d, int) and d != n for d, n in zip(value.shape, array.shape)):
            return False
    return True


@register_pass("fold")
class ConstantFolding(Pass):
    """Evaluate nodes whose inputs are all constants and store their outputs as initializers.

    1. Constants are initializers (not overridable graph inputs) and outputs of ``Constant``
       nodes. A ``Constant`` node whose output is used becomes an initializer of the same name.
    2. A standard-domain node whose inputs are all constants is evaluated with the reference
       executor's kernels; each output becomes an initializer with the
       output's name, and the node is removed::

           before: w = ConstantOfShape(shape=[96,3,11,11]){value=0.02};  y = Conv(x, w)
           after:  w = initializer float32[96,3,11,11];               y = Conv(x, w)

    3. Not folded: random ops (a fold would freeze one draw); ops that decompress stored
       weights (``Cast`` to a wider type, ``DequantizeLinear``), which would undo fp16 / int8
       storage; nodes with subgraphs; nodes that feed a graph output directly; nodes with an
       output that is not a tensor (``SequenceEmpty``, ``Optional``: an initializer is always a
       tensor). A folded output keeps its rank, 0-d included, and must match the dtype and
       shape declared for it, else the node stays (note).
    4. Size cap: an output over ``max_bytes`` that is larger than the node's inputs (Expand,
       Tile, ...) is left unfolded, except for op types in ``always`` (ConstantOfShape, which
       the ONNX ``light_*`` models use to generate their weights).
    5. A node whose evaluation fails is left alone with a note; folding never fails a pipeline.
    Unused constants are left for ``dce``.
    """

    @dataclass
    class Config:
        max_bytes: int = bounded(1 << 20, 0, None)
        always: list[str] = field(default_factory=lambda: ["ConstantOfShape"])
        fold_constants: bool = True  # turn Constant nodes into initializers

    def run(self, model: ir.Model, config: Config, ctx: PassContext) -> PassReport:
        graph = model.graph
        ir_version = model.ir_version or 10
        opset = model.opset_imports.get("", 21)
        taken = taken_names(graph)
        folded, notes, tensors = 0, [], []
        nodes = list(graph)
        for i, node in enumerate(nodes):
            if i % 64 == 0:
                ctx.tick("fold", i, len(nodes))
            if node.domain not in ("", "ai.onnx"):
                continue
            if node.op_type == "Constant":
                if config.fold_constants and node.outputs[0].uses() and not node.outputs[0].is_graph_output():
                    array = constant_array(node.outputs[0], graph, ir_version)
                    if array is not None and array.dtype != object:
                        self._replace_with_initializers(graph, node, [array], taken)
                        folded += 1
                continue
            if not self._foldable(node, graph):
                continue
            inputs = [constant_array(v, graph, ir_version) if v is not None else None for v in node.inputs]
            if any(x is None for x, v in zip(inputs, node.inputs) if v is not None):
                continue
            if node.op_type in DECOMPRESS_OPS and self._widens(node, inputs):
                continue
            try:
                outputs = evaluate_node(node, inputs, model.opset_imports.get(node.domain or "", opset))
            except Exception as exc:  # any kernel failure: keep the node, say why
                notes.append(
                    f"{node.name or node.op_type}: not folded ({type(exc).__name__}: {str(exc)[:100]})"
                )
                continue
            if len(outputs) < len([o for o in node.outputs if o is not None]) or any(
                o.dtype == object for o in outputs
            ):
                continue
            if not all(_fits(v, a) for v, a in zip(node.outputs, outputs) if v is not None):
                notes.append(
                    f"{node.name or node.op_type}: not folded (result does not match the declared type)"
                )
                continue
            in_bytes = sum(x.nbytes for x in inputs if x is not None)
            out_bytes = sum(o.nbytes for o in outputs)
            if out_bytes > config.max_bytes and out_bytes > in_bytes and node.op_type not in config.always:
                notes.append(
                    f"{node.name or node.op_type}: not folded, output {out_bytes} bytes over max_bytes"
                )
                continue
            self._replace_with_initializers(graph, node, outputs, taken)
            folded += 1
            if out_bytes >= 1 << 16:
                tensors.append(
                    {"name": node.outputs[0].name, "op_type": node.op_type, "bytes": int(out_bytes)}
                )
        ctx.tick("fold", len(nodes), len(nodes))
        if folded and upgrade_ir3(model):
            notes.append("IR version raised from 3 to 4: weights are no longer listed as graph inputs")
        notes.insert(0, f"folded {folded} nodes")
        return self.report(folded > 0, notes=notes, tensors=tensors)

    @staticmethod
    def _foldable(node: ir.Node, graph: ir.Graph) -> bool:
        if node.op_type in RANDOM_OPS:
            return False
        if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()):
            return False
        if any(o.is_graph_output() for o in node.outputs):
            return False
        if any(o.type is not None and not isinstance(o.type, ir.TensorType) for o in node.outputs):
            return False
        return bool(node.outputs)

    @staticmethod
    def _widens(node: ir.Node, inputs: list[np.ndarray | None]) -> bool:
        if node.op_type != "Cast":
            return True  # DequantizeLinear & co always expand stored integers
        to = node.attributes.get("to")
        if to is None or inputs[0] is None:
            return False
        target = ir.DataType(to.value)
        return target.itemsize > inputs[0].dtype.itemsize

    @staticmethod
    def _replace_with_initializers(
        graph: ir.Graph, node: ir.Node, arrays: list[np.ndarray], taken: set[str]
    ) -> None:
        for out, array in zip(node.outputs, arrays):
            if out is None or not out.name and not out.uses():
                continue
            name = out.name or fresh_name(f"{node.name or node.op_type}_folded", taken)
            out.name = None  # free the name for the initializer that replaces it
            # np.asarray(order='C'), not np.ascontiguousarray, which turns a 0-d array into shape [1].
            const = add_initializer(graph, name, np.asarray(array, order="C"))
            replace_value(out, const)
        graph.remove(node, safe=True)
