"""fp16: half-precision weights (default) or half-precision compute with a block list."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import onnx
import onnx_ir as ir
from mconv.passes._weights import move_compression
from mconv.passes.base import Pass, PassContext, PassReport, register_pass
from mconv.passes.rewrite import fresh_name, is_overridable, taken_names, upgrade_ir3
from mconv.passes.shape_inference import infer_on_stripped_copy, merge_inferred

FP16_MAX = 65504.0
F32, F16 = ir.DataType.FLOAT, ir.DataType.FLOAT16

# Numerically fragile ops that stay float32 in mode "all" unless the user's block list says otherwise.
DEFAULT_BLOCK_LIST = [
    "Softmax",
    "LogSoftmax",
    "LayerNormalization",
    "ReduceMean",
    "ReduceSum",
    "ReduceSumSquare",
    "ReduceLogSumExp",
    "ReduceL2",
    "Exp",
    "Log",
    "Pow",
    "LRN",
    "Range",
    "CumSum",
]
# Ops that pick their output type from an attribute (or draw random numbers): always float32.
_ALWAYS_BLOCKED = frozenset(
    {
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
        "EyeLike",
    }
)
# Inputs that the ONNX spec requires to be float32 whatever the data type (Resize scales...);
# the op schemas say the same (``_half_plan``), this list is the floor when a schema is missing.
_FLOAT32_INPUTS = {"Resize": {1, 2}, "Upsample": {1}}
# Attributes that pick an output's data type: such a node keeps float32 (its output would not
# follow its inputs; BitCast's ``to`` needs the input's bit width). ``Cast``'s ``to`` is
# rewritten instead.
_DTYPE_ATTRS = frozenset({"dtype", "output_dtype", "output_datatype", "to"})
_HALF = "tensor(float16)"


def _is_tensor(value: ir.Value) -> bool:
    """A value typed as a tensor (not a sequence, optional or map, and not untyped)."""
    return isinstance(value.type, ir.TensorType)


def _half_plan(node: ir.Node, opset: int) -> set[int] | None:
    """Input positions that must stay float32 when ``node`` computes in float16, from its schema.

    None when the node cannot compute in float16 at this opset: no schema, an input position the
    schema does not have, or a float32 output whose type constraint has no ``tensor(float16)``
    (``QuantizeLinear`` before opset 19 takes only float32, ``TfIdfVectorizer`` gives float32).
    """
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain or "")
    except Exception:  # onnx.defs.SchemaError: unknown op or opset
        return None
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}

    def formal(params, i):
        if i < len(params):
            return params[i]
        last = params[-1] if params else None
        if last is not None and last.option == onnx.defs.OpSchema.FormalParameterOption.Variadic:
            return last
        return None

    keep32 = set(_FLOAT32_INPUTS.get(node.op_type, ()))
    for i, v in enumerate(node.inputs):
        if v is None or v.dtype not in (F32, F16):
            continue
        param = formal(schema.inputs, i)
        if param is None:
            return None
        if _HALF not in allowed.get(param.type_str, {param.type_str}):
            keep32.add(i)
    for i, v in enumerate(node.outputs):
        if v.dtype != F32:
            continue
        param = formal(schema.outputs, i)
        if param is None or _HALF not in allowed.get(param.type_str, {param.type_str}):
            return None
    return keep32


@register_pass("fp16")
class Float16(Pass):
    """Store weights in float16; optionally compute in float16.

    Mode ``weights`` (default): compute and I/O stay float32, weights are stored as float16 and
    widened at run time. Chosen over "float32 rounded to fp16 values" because the saved
    ``.onnx`` itself halves and any ONNX tool (onnxruntime, Netron) runs it as is::

        before: W = initializer float32[...];        y = Conv(x, W)
        after:  W_fp16 = initializer float16[...];   W = Cast(W_fp16, to=FLOAT);  y = Conv(x, W)

    1. Every float32 initializer with at least ``min_elements`` elements is converted; the Cast
       output keeps the initializer's name, so consumers and localization see the same value name.
    2. A tensor with a finite value beyond the float16 range (|x| > 65504) stays float32 (note).
    3. Overridable initializers (graph inputs, IR >= 4) and graph outputs stay float32; in an IR 3
       model, initializers listed as inputs are weights: they leave the inputs, the IR becomes 4.
    4. ``fold`` never folds these widening Casts back.
    5. Compression facts recorded by ``prune`` / ``cluster`` (value metadata and the model's
       ``mconv.compression`` entry) move to ``NAME_fp16`` with the data, so export still stores
       the float16 tensor with the sparse / palette codecs.

    Mode ``all``: the graph computes in float16.

    6. Shapes and dtypes are inferred first; float32 initializers and Constants become float16;
       each node not in ``block_list`` runs in float16 (float32 inputs are cast down, ``Cast(to=
       FLOAT)`` becomes ``to=FLOAT16``), each blocked node (and any node whose dtypes are unknown,
       or with subgraphs) runs in float32 with Casts around it.
    8. Only what the op's schema at the model's opset allows runs in float16: an input whose type
       constraint has no ``tensor(float16)`` (Resize's scales) stays float32; a node with such
       an output (``QuantizeLinear`` before opset 19), a node with a non-tensor value
       (sequences, optionals), a node whose output dtype comes from an attribute (``dtype``,
       BitCast's ``to``, ``ConstantOfShape`` without ``value``) stays float32 as a whole.
    9. If / Loop / Scan bodies are not rewritten: they compute in float32, outer float16 values
       they capture are cast back first, so every branch keeps the types of the node's outputs
       and every subgraph output is still produced inside its subgraph.
    7. ``keep_io_types=True``: graph inputs and outputs stay float32 with Casts at the boundary
       (the outputs keep their names); otherwise float32 inputs and outputs become float16.
    """

    @dataclass
    class Config:
        mode: Literal["weights", "all"] = "weights"
        min_elements: int = 16
        keep_io_types: bool = True
        block_list: list[str] = field(default_factory=lambda: list(DEFAULT_BLOCK_LIST))

    def run(self, model: ir.Model, config: Config, ctx: PassContext) -> PassReport:
        if config.mode == "weights":
            return self._weights(model, config)
        return self._all(model, config)

    # --- mode "weights" -------------------------------------------------------------------------

    def _weights(self, model: ir.Model, config: Config) -> PassReport:
        graph = model.graph
        ir_version = model.ir_version or 10
        taken = taken_names(graph)
        casts, tensors, notes = [], [], []
        for name, value in list(graph.initializers.items()):
            t = value.const_value
            if t is None or t.dtype != F32 or t.size < config.min_elements:
                continue
            if value.is_graph_output() or is_overridable(graph, value, ir_version):
                notes.append(f"{name}: kept float32 (graph input or output)")
                continue
            array = t.numpy()
            if np.any(np.abs(array[np.isfinite(array)]) > FP16_MAX):
                notes.append(f"{name}: kept float32 (values beyond the float16 range)")
                continue
            half = array.astype(np.float16)
            if value in graph.inputs:  # IR 3: a weight listed as an input
                upgrade_ir3(model)
            graph.initializers.pop(name)
            value.name = None
            stored = ir.Value(
                name=fresh_name(f"{name}_fp16", taken), shape=ir.Shape(half.shape), type=ir.TensorType(F16)
            )
            stored.const_value = ir.tensor(half, name=stored.name)
            graph.register_initializer(stored)
            cast = ir.Node(
                "",
                "Cast",
                [stored],
                attributes=[ir.AttrInt64("to", F32)],
                name=fresh_name(f"{name}_cast", taken),
            )
            cast.outputs[0].name = name
            cast.outputs[0].dtype = F32
            cast.outputs[0].shape = ir.Shape(half.shape)
            ir.convenience.replace_all_uses_with(value, cast.outputs[0])
            if move_compression(model, value, stored, old_name=name):  # pruning / clustering facts
                notes.append(f"{name}: compression record moved to {stored.name}")
            casts.append(cast)
            err = float(np.max(np.abs(half.astype(np.float32) - array))) if array.size else 0.0
            tensors.append(
                {
                    "name": name,
                    "elements": int(array.size),
                    "bytes_before": int(array.nbytes),
                    "bytes_after": int(half.nbytes),
                    "max_abs_error": err,
                }
            )
        if casts:
            first = next(iter(graph), None)
            if first is None:
                graph.extend(casts)
            else:
                graph.insert_before(first, casts)
        notes.insert(0, f"{len(casts)} weights stored as float16")
        return self.report(bool(casts), notes=notes, tensors=tensors)

    # --- mode "all" -----------------------------------------------------------------------------

    def _all(self, model: ir.Model, config: Config) -> PassReport:
        graph = model.graph
        ir_version = model.ir_version or 10
        opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 21))
        inferred = infer_on_stripped_copy(model, keep_bytes=1024, strict=False, data_prop=True)
        if inferred is not None:
            merge_inferred(model, inferred)
        taken = taken_names(graph)
        blocked_ops = set(config.block_list) | _ALWAYS_BLOCKED
        half: set[ir.Value] = set()  # values that now hold float16 data
        cache: dict[tuple[int, ir.DataType], ir.Value] = {}
        tensors, notes = [], []
        blocked_count = 0

        def cast(value: ir.Value, to: ir.DataType, before: ir.Node) -> ir.Value:
            key = (id(value), to)
            if key not in cache:
                suffix = "fp16" if to == F16 else "fp32"
                node = ir.Node(
                    "",
                    "Cast",
                    [value],
                    attributes=[ir.AttrInt64("to", to)],
                    name=fresh_name(f"{value.name}_to_{suffix}", taken),
                )
                out = node.outputs[0]
                out.name = fresh_name(f"{value.name}_{suffix}", taken)
                out.dtype, out.shape = to, value.shape
                before.graph.insert_before(before, node)
                cache[key] = out
            return cache[key]

        # Initializers and inputs.
        for name, value in list(graph.initializers.items()):
            t = value.const_value
            if (
                t is None
                or t.dtype != F32
                or value.is_graph_output()
                or is_overridable(graph, value, ir_version)
            ):
                continue
            array = t.numpy()
            if np.any(np.abs(array[np.isfinite(array)]) > FP16_MAX):
                notes.append(f"{name}: kept float32 (values beyond the float16 range)")
                continue
            h = array.astype(np.float16)
            value.const_value = ir.tensor(h, name=name)
            value.dtype = F16
            half.add(value)
            if value in graph.inputs:  # IR 3: a weight listed as an input
                upgrade_ir3(model)
            tensors.append(
                {
                    "name": name,
                    "elements": int(array.size),
                    "bytes_before": int(array.nbytes),
                    "bytes_after": int(h.nbytes),
                }
            )
        if not config.keep_io_types:
            for value in graph.inputs:
                if _is_tensor(value) and value.dtype == F32 and not value.is_initializer():
                    value.dtype = F16
                    half.add(value)

        for node in list(graph):
            keep32 = _half_plan(node, opset) if self._runs_half(node, blocked_ops) else None
            run_half = keep32 is not None
            for i, v in enumerate(node.inputs):
                if v is None:
                    continue
                if (not run_half or i in keep32) and v in half:
                    node.replace_input_with(i, cast(v, F32, node))
                elif run_half and i not in keep32 and v.dtype == F32:
                    node.replace_input_with(i, cast(v, F16, node))
            if not run_half:
                blocked_count += node.op_type != "Cast"
                self._unhalve_captured(node, half, cast)
                continue
            if node.op_type == "Cast" and node.attributes["to"].value == F32:
                node.attributes["to"] = ir.AttrInt64("to", F16)
            for key in ("value",):
                attr = node.attributes.get(key)
                if attr is not None and attr.type == ir.AttributeType.TENSOR and attr.value.dtype == F32:
                    node.attributes[key] = ir.AttrTensor(
                        key, ir.tensor(attr.value.numpy().astype(np.float16))
                    )
            if node.op_type == "Constant" and "value_float" in node.attributes:
                v = node.attributes.pop("value_float").value
                node.attributes["value"] = ir.AttrTensor("value", ir.tensor(np.array(v, dtype=np.float16)))
            elif node.op_type == "Constant" and "value_floats" in node.attributes:
                v = list(node.attributes.pop("value_floats").value)
                node.attributes["value"] = ir.AttrTensor("value", ir.tensor(np.array(v, dtype=np.float16)))
            for out in node.outputs:
                if out.dtype == F32:  # a tensor: _runs_half saw to that
                    out.dtype = F16
                    half.add(out)

        for i, out in enumerate(list(graph.outputs)):
            if out in half and config.keep_io_types:
                name = out.name
                out.name = fresh_name(f"{name}_fp16", taken)
                node = ir.Node(
                    "",
                    "Cast",
                    [out],
                    attributes=[ir.AttrInt64("to", F32)],
                    name=fresh_name(f"{name}_to_fp32", taken),
                )
                node.outputs[0].name, node.outputs[0].dtype, node.outputs[0].shape = name, F32, out.shape
                graph.append(node)
                graph.outputs[i] = node.outputs[0]
        notes.insert(0, f"{len(tensors)} weights to float16; {blocked_count} nodes kept in float32")
        return self.report(True, notes=notes, tensors=tensors)

    @staticmethod
    def _runs_half(node: ir.Node, blocked_ops: set[str]) -> bool:
        """Whether ``node`` can run in float16: standard op, not blocked, no subgraph, tensors of
        known dtypes only, and no attribute that fixes an output's dtype (``ConstantOfShape``
        without ``value`` gives float32 zeros)."""
        if node.domain not in ("", "ai.onnx") or node.op_type in blocked_ops:
            return False
        if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()):
            return False
        if node.op_type != "Cast" and _DTYPE_ATTRS & set(node.attributes):
            return False
        if node.op_type == "ConstantOfShape" and "value" not in node.attributes:
            return False
        if node.op_type == "Constant" and "sparse_value" in node.attributes:
            return False
        values = [v for v in node.inputs if v is not None] + list(node.outputs)
        return all(_is_tensor(v) and v.dtype is not None for v in values)

    @staticmethod
    def _unhalve_captured(node: ir.Node, half: set[ir.Value], cast) -> None:
        """Subgraphs run in float32: outer float16 values they capture are cast back first."""
        for attr in node.attributes.values():
            graphs = (
                [attr.value]
                if attr.type == ir.AttributeType.GRAPH
                else (list(attr.value) if attr.type == ir.AttributeType.GRAPHS else [])
            )
            for g in graphs:
                for inner in ir.traversal.RecursiveGraphIterator(g):
                    for i, v in enumerate(inner.inputs):
                        if v is not None and v in half:
                            inner.replace_input_with(i, cast(v, F32, node))
