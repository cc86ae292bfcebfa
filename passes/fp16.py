"""fp16: half-precision weights (default), half-precision compute with a block list (mode all),
with the nodes the data shows need float32 kept (mode auto), or in bfloat16 (mode bf16)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Literal

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
from mconv.edit.rewrite import fresh_name, is_overridable, taken_names, upgrade_ir3
from mconv.edit.weights import move_compression
from mconv.errors import show
from mconv.passes.base import MAX_COUNT, Pass, PassContext, PassReport, bounded, register_pass
from mconv.passes.shape_inference import infer_on_stripped_copy, merge_inferred

FP16_MAX = 65504.0
F32, F16, BF16 = ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16
_RANGE = {F16: FP16_MAX, BF16: float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)}
_NP = {F16: np.dtype(np.float16), BF16: np.dtype(ml_dtypes.bfloat16)}
_TYPE_STR = {F16: "tensor(float16)", BF16: "tensor(bfloat16)"}

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


def _is_tensor(value: ir.Value) -> bool:
    """A value typed as a tensor (not a sequence, optional or map, and not untyped)."""
    return isinstance(value.type, ir.TensorType)


def _half_plan(node: ir.Node, opset: int, half: ir.DataType = F16) -> set[int] | None:
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
    want = _TYPE_STR[half]
    for i, v in enumerate(node.inputs):
        if v is None or v.dtype not in (F32, half):
            continue
        param = formal(schema.inputs, i)
        if param is None:
            return None
        if want not in allowed.get(param.type_str, {param.type_str}):
            keep32.add(i)
    for i, v in enumerate(node.outputs):
        if v.dtype != F32:
            continue
        param = formal(schema.outputs, i)
        if param is None or want not in allowed.get(param.type_str, {param.type_str}):
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

    Mode ``auto`` (needs ``--data``): mode all, but the data decides what stays float32, not an
    op-type block list.

    10. The float32 model runs on the reference executor over the first ``samples`` samples
        (batches of the model's fixed batch size), keeping every value. Every run of rule 10
        accumulates in float32 (the executor's ``fast_math``: float16 products summed in float32
        as on a GPU, each op's output still rounded to its type; ~1e-6 relative, against a
        tolerance of ~1e-2). (0) The model all in half runs end to end: when every output is
        finite and within ``tolerance`` no node needs float32 and that is the result (one run;
        (a)-(c) would end there too). Otherwise: (a) Each node that could
        run in half precision is evaluated alone on those float32 inputs rounded to the half
        type, its outputs rounded: a node whose output overflows (a non-finite value where
        float32's is finite) or whose relative L2 error exceeds ``tolerance`` stays float32.
        (b) The graph so converted runs end to end on the reference executor (every op rounds
        its output to its type, as a GPU does; ONNX Runtime's CPU provider computes most float16
        ops in float32 behind Casts it inserts, which hides overflow). Nodes whose outputs turn
        non-finite while their inputs are finite are kept and it runs again; when every output is
        finite but its error exceeds ``tolerance``, the nodes whose error grows most (output
        error minus input error) are kept, 1, 2, 4, ... per run, at most ``max_rounds`` runs.
        (c) Then the nodes kept go back to half when the end-to-end run without them still has
        every output finite and within ``tolerance`` (an overflow the graph absorbs, such as a
        -inf attention mask before a Softmax, costs nothing): each, least local error first
        (all at once is step 0's run); at most ``max_rounds`` more runs.
        The note and the ``auto`` entry of the report name every node kept, the output error and
        whether it is within the tolerance.
    11. ``dtype="bfloat16"`` (modes all and auto) or mode ``bf16`` (mode all in bfloat16):
        bfloat16 instead of float16 (float32's range, 8 bits of mantissa), where the op schema
        allows ``tensor(bfloat16)``. The model's ``mconv.precision`` metadata says
        ``bfloat16``: ONNX Runtime's CPU provider has few bfloat16 kernels, so the written-model
        check accepts its refusal of a kernel (NOT_IMPLEMENTED) for such a model; the xla target
        and the reference executor run it.
    """

    @dataclass
    class Config:
        mode: Literal["weights", "all", "auto", "bf16"] = "weights"
        min_elements: int = bounded(16, 0, None)
        keep_io_types: bool = True
        block_list: list[str] = field(default_factory=lambda: list(DEFAULT_BLOCK_LIST))
        dtype: Literal["float16", "bfloat16"] = "float16"  # modes all / auto; mode bf16 = all in bfloat16
        tolerance: float = bounded(
            0.01, 0, None
        )  # mode auto: relative L2 error allowed per node and per graph output
        max_rounds: int = bounded(12, 0, 10**4)  # mode auto: end-to-end runs at most
        samples: int = bounded(16, 1, MAX_COUNT)  # mode auto: samples of --data used

    def run(self, model: ir.Model, config: Config, ctx: PassContext) -> PassReport:
        if config.mode == "weights":
            return self._weights(model, config)
        half = BF16 if config.mode == "bf16" or config.dtype == "bfloat16" else F16
        if config.mode == "auto":
            return self._auto(model, config, ctx, half)
        return self._all(model, config, half=half)

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

    def _all(
        self,
        model: ir.Model,
        config: Config,
        *,
        half: ir.DataType = F16,
        keep_nodes: frozenset[str] = frozenset(),
        blocked_ops: set[str] | None = None,
    ) -> PassReport:
        """Modes all and bf16 (``half``); mode auto passes the nodes it keeps in float32 by
        name (``keep_nodes``) and no op-type block list."""
        graph = model.graph
        ir_version = model.ir_version or 10
        opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 21))
        inferred = infer_on_stripped_copy(model, keep_bytes=1024, strict=False, data_prop=True)
        if inferred is not None:
            merge_inferred(model, inferred)
        taken = taken_names(graph)
        if blocked_ops is None:
            blocked_ops = set(config.block_list)
        blocked_ops = blocked_ops | _ALWAYS_BLOCKED
        H, hmax, hnp = half, _RANGE[half], _NP[half]
        hname = "fp16" if half == F16 else "bf16"
        half_values: set[ir.Value] = set()  # values that now hold float16 / bfloat16 data
        cache: dict[tuple[int, ir.DataType], ir.Value] = {}
        tensors, notes = [], []
        blocked_count = 0

        def cast(value: ir.Value, to: ir.DataType, before: ir.Node) -> ir.Value:
            key = (id(value), to)
            if key not in cache:
                suffix = hname if to == H else "fp32"
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
                assert before.graph is not None  # a node of the graph being converted
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
            if _beyond(array, hmax):
                notes.append(f"{name}: kept float32 (values beyond the {hnp.name} range)")
                continue
            h = array.astype(hnp)
            value.const_value = ir.tensor(h, name=name)
            value.dtype = H
            half_values.add(value)
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
                    value.dtype = H
                    half_values.add(value)

        for node in list(graph):
            runs = self._runs_half(node, blocked_ops) and node.name not in keep_nodes
            keep32 = _half_plan(node, opset, H) if runs else None
            run_half = keep32 is not None
            kept32 = keep32 if keep32 is not None else set()
            for i, v in enumerate(node.inputs):
                if v is None:
                    continue
                if (not run_half or i in kept32) and v in half_values:
                    node.replace_input_with(i, cast(v, F32, node))
                elif run_half and i not in kept32 and v.dtype == F32:
                    node.replace_input_with(i, cast(v, H, node))
            if not run_half:
                blocked_count += node.op_type != "Cast"
                self._unhalve_captured(node, half_values, cast)
                continue
            if node.op_type == "Cast" and node.attributes["to"].value == F32:
                node.attributes["to"] = ir.AttrInt64("to", H)
            for key in ("value",):
                attr = node.attributes.get(key)
                if attr is not None and attr.type == ir.AttributeType.TENSOR and attr.value.dtype == F32:
                    node.attributes[key] = ir.AttrTensor(key, ir.tensor(attr.value.numpy().astype(hnp)))
            if node.op_type == "Constant" and "value_float" in node.attributes:
                v = node.attributes.pop("value_float").value
                node.attributes["value"] = ir.AttrTensor("value", ir.tensor(np.array(v, dtype=hnp)))
            elif node.op_type == "Constant" and "value_floats" in node.attributes:
                floats = list(node.attributes.pop("value_floats").value)
                node.attributes["value"] = ir.AttrTensor("value", ir.tensor(np.array(floats, dtype=hnp)))
            for out in node.outputs:
                if out.dtype == F32:  # a tensor: _runs_half saw to that
                    out.dtype = H
                    half_values.add(out)

        for i, out in enumerate(list(graph.outputs)):
            if out in half_values and config.keep_io_types:
                out_name = out.name
                out.name = fresh_name(f"{out_name}_{hname}", taken)
                node = ir.Node(
                    "",
                    "Cast",
                    [out],
                    attributes=[ir.AttrInt64("to", F32)],
                    name=fresh_name(f"{out_name}_to_fp32", taken),
                )
                node.outputs[0].name, node.outputs[0].dtype, node.outputs[0].shape = out_name, F32, out.shape
                graph.append(node)
                graph.outputs[i] = node.outputs[0]
        if H == BF16:  # the validity check knows ORT's CPU provider lacks most bfloat16 kernels
            model.metadata_props["mconv.precision"] = "bfloat16"
        notes.insert(0, f"{len(tensors)} weights to {hnp.name}; {blocked_count} nodes kept in float32")
        return self.report(True, notes=notes, tensors=tensors)

    # --- mode "auto" ----------------------------------------------------------------------------

    def _auto(self, model: ir.Model, config: Config, ctx: PassContext, half: ir.DataType) -> PassReport:
        """Mode auto: rule 10. Keeps in float32 exactly the nodes the data shows need it."""
        t0 = time.perf_counter()
        graph = model.graph
        opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 21))
        batches = _auto_batches(model, ctx.data, config.samples)
        inferred = infer_on_stripped_copy(model, keep_bytes=1024, strict=False, data_prop=True)
        if inferred is not None:
            merge_inferred(model, inferred)
        taken = taken_names(graph)
        for node in graph:  # nodes are matched by name between the model and its trial copies
            if not node.name:
                node.name = fresh_name(f"{node.op_type}_node", taken)
        names = [n.name for n in graph]
        if len(set(names)) != len(names):
            for node in graph:
                node.name = (
                    fresh_name(node.name or node.op_type, taken) if names.count(node.name) > 1 else node.name
                )
        from mconv.engines.reference.executor import Executor
        from mconv.engines.reference.ops import fast_math

        reference = Executor(model)
        with fast_math():  # float32 accumulation: off by ~1e-6 relative, the tolerance is ~1e-2
            refs = [reference.run(feeds, intermediates=True) for feeds in batches]
        out_names = [v.name for v in graph.outputs]
        candidates = [
            n
            for n in graph
            if self._runs_half(n, set(_ALWAYS_BLOCKED)) and _half_plan(n, opset, half) is not None
        ]
        # (0) everything in half, its outputs compared: when they are within the tolerance no node
        # needs float32, and (a)-(c) would end there too.
        acc = self._end_to_end(model, config, half, set(), batches, refs, only=out_names)
        out_err = max((acc.rel(n) for n in out_names), default=0.0)
        if out_err <= config.tolerance and not any(acc.bad(n) for n in out_names):
            return self._auto_report(
                model, config, half, set(), out_err, 1, len(candidates), None, 0, batches, t0
            )
        # (a) each node alone: float32 inputs rounded to the half type, computed, output rounded.
        local: dict[str, float] = {}
        keep: set[str] = set()
        hnp = _NP[half]
        for node in candidates:
            if not any(o.dtype == F32 for o in node.outputs):
                continue
            err, over = _local_error(node, refs, opset, hnp)
            local[node.name or ""] = err
            if over or err > config.tolerance:
                keep.add(node.name or "")
        screened = len(keep)
        # (b) the whole graph with those kept, run end to end; overflow sources and the nodes whose
        # error grows most are added until every output is within the tolerance.
        rounds, out_err, step = 1, math.inf, 1
        while rounds < config.max_rounds + 1:
            rounds += 1
            acc = self._end_to_end(model, config, half, keep, batches, refs)
            out_err = max((acc.rel(n) for n in out_names), default=0.0)
            sources = [
                n.name or ""
                for n in graph
                if n.name not in keep
                and any(acc.bad(o.name) for o in n.outputs if o.name)
                and not any(acc.bad(v.name) for v in n.inputs if v is not None and v.name)
            ]
            if not sources and out_err <= config.tolerance and not any(acc.bad(n) for n in out_names):
                break
            if sources:
                keep.update(sources)
                continue
            growth = []
            for n in candidates:
                if n.name in keep:
                    continue
                outs = [acc.rel(o.name) for o in n.outputs if o.name]
                ins = [acc.rel(v.name) for v in n.inputs if v is not None and v.name]
                growth.append((max(outs, default=0.0) - max(ins, default=0.0), n.name))
            growth.sort(reverse=True)
            if not growth or growth[0][0] <= 0:
                break
            keep.update(name or "" for _, name in growth[:step])
            step *= 2
        # (c) the screened nodes back to half, one at a time, where the end-to-end run shows they
        # are not needed: an overflow whose inf the graph absorbs (a -inf attention mask before a
        # Softmax), a local error the outputs do not feel.
        # All of them at once is step (0)'s run, which failed.
        dropped = 0
        if out_err <= config.tolerance and len(keep) > 1:
            for name in sorted(keep, key=lambda n: local.get(n, math.inf)):
                if rounds >= 2 * config.max_rounds + 1:
                    break
                rounds += 1
                trial_keep = keep - {name}
                acc = self._end_to_end(model, config, half, trial_keep, batches, refs)
                err = max((acc.rel(n) for n in out_names), default=0.0)
                if err <= config.tolerance and not any(acc.bad(n) for n in out_names):
                    keep, out_err, dropped = trial_keep, err, dropped + 1
        return self._auto_report(
            model, config, half, keep, out_err, rounds, len(candidates), screened, dropped, batches, t0
        )

    def _auto_report(
        self, model, config, half, keep: set[str], out_err, rounds, candidates, screened, dropped, batches, t0
    ) -> PassReport:
        report = self._all(model, config, half=half, keep_nodes=frozenset(keep), blocked_ops=set())
        screen = (
            f"{screened} flagged by their own error or overflow, {dropped} of them returned to half by the "
            f"end-to-end check; {rounds} end-to-end run(s)"
            if screened is not None
            else "all in half is within the tolerance end to end: 1 run, no node screened"
        )
        shown = ", ".join(show(n) for n in sorted(keep)[:8]) + (", ..." if len(keep) > 8 else "")
        within = "within" if out_err <= config.tolerance else "NOT within"
        report.notes.insert(
            1,
            f"auto: {len(keep)} of {candidates} nodes kept in float32 ({screen}){': ' + shown if keep else ''}; "
            f"output relative error {out_err:.3g} {within} tolerance {config.tolerance:g} on "
            f"{sum(len(next(iter(b.values()))) for b in batches)} sample(s), {time.perf_counter() - t0:.2f} s",
        )
        report.tensors.append(
            {
                "name": "auto",
                "kept_float32": sorted(keep),
                "output_rel_error": float(out_err),
                "rounds": rounds,
            }
        )
        return report

    def _end_to_end(
        self, model: ir.Model, config: Config, half: ir.DataType, keep: set[str], batches, refs, only=None
    ):
        """The model converted with ``keep`` in float32, run on the reference executor over
        ``batches``, its values (only the values named ``only`` when given) against ``refs``
        (rule 10 b)."""
        from mconv.engines.reference.executor import Executor

        graph = model.graph
        trial = ir.serde.deserialize_model(ir.serde.serialize_model(model))
        for name, value in trial.graph.initializers.items():  # the same tensors (external ones too)
            original = graph.initializers.get(name)
            if original is not None:
                value.const_value = original.const_value
        self._all(trial, config, half=half, keep_nodes=frozenset(keep), blocked_ops=set())
        runner = Executor(trial, dtype_check=False)
        acc = _Accumulator()
        from mconv.engines.reference.ops import fast_math

        # float32 accumulation, every output still rounded to its type; a half value overflowing
        # is what the trial measures, not something to warn the user about
        with fast_math(), np.errstate(over="ignore", invalid="ignore"):
            self._accumulate(runner, batches, refs, only, acc)
        return acc

    @staticmethod
    def _accumulate(runner, batches, refs, only, acc) -> None:
        for feeds, ref in zip(batches, refs):
            if only is None:
                acc.add(runner.run(feeds, intermediates=True), ref)
            else:
                acc.add(runner.run(feeds, outputs=only), {n: ref[n] for n in only if n in ref})

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


# --- mode "auto" helpers ------------------------------------------------------------------------


def _auto_batches(model: ir.Model, data, samples: int) -> list[dict[str, np.ndarray]]:
    """Rule 10: the feeds of ``--data`` (at most ``samples`` along the first axis), in batches of
    the model's fixed batch size where it has one."""
    from mconv.errors import InputError

    if not data:
        raise InputError(
            "fp16(mode=auto) needs data to run the model on",
            hint="give --data FEEDS.npz (arrays named as the model's inputs, samples along the first axis)",
        )
    inputs = [v for v in model.graph.inputs if not v.is_initializer()]
    missing = [v.name or "" for v in inputs if v.name not in data]
    if missing:
        raise InputError(
            f"--data has no array for input(s) {', '.join(show(n) for n in missing[:8])}",
            where="fp16(mode=auto)",
            hint=f"arrays in --data: {', '.join(show(k) for k in list(data)[:8]) or '(none)'}",
        )
    arrays = {v.name or "": np.asarray(data[v.name]) for v in inputs}
    n = min((a.shape[0] if a.ndim else 1) for a in arrays.values()) if arrays else 1
    n = max(1, min(n, samples))
    first = [v.shape[0] if v.shape is not None and len(v.shape) else None for v in inputs]
    fixed = next((d for d in first if isinstance(d, int)), None)
    size = fixed if fixed and fixed > 0 else n
    if n < size:
        raise InputError(
            f"--data holds {n} sample(s) but the model takes a batch of {size}",
            where="fp16(mode=auto)",
            hint=f"give at least {size} samples along the first axis",
        )
    batches = []
    for start in range(0, n - size + 1, size):
        batches.append({k: (a[start : start + size] if a.ndim else a) for k, a in arrays.items()})
    return batches


def _local_error(node: ir.Node, refs: list[dict], opset: int, hnp: np.dtype) -> tuple[float, bool]:
    """``node`` alone in the half type: its float32 inputs (from the float32 run) rounded, computed,
    its outputs rounded. Returns the relative L2 error of its outputs and whether any overflows."""
    from mconv.passes.fold import evaluate_node

    d2 = r2 = 0.0
    over = False
    for ref in refs:
        inputs: list[np.ndarray | None] = []
        for v in node.inputs:
            if v is None:
                inputs.append(None)
                continue
            x = ref.get(v.name) if v.name else None
            if x is None and v.const_value is not None:
                x = v.const_value.numpy()
            if x is None:
                return 0.0, False
            x = np.asarray(x)
            with np.errstate(over="ignore"):  # an input beyond the half range is what it measures
                inputs.append(x.astype(hnp).astype(np.float32) if x.dtype == np.float32 else x)
        try:
            outs = evaluate_node(node, inputs, opset)
        except Exception:  # a kernel the reference executor cannot run alone: the end-to-end run decides
            return 0.0, False
        for o, y in zip(node.outputs, outs):
            r = ref.get(o.name) if o.name else None
            if r is None or np.asarray(r).dtype != np.float32:
                continue
            r = np.asarray(r, dtype=np.float64)
            with np.errstate(over="ignore", invalid="ignore"):
                h = np.asarray(y).astype(hnp).astype(np.float64)
            fin = np.isfinite(r)
            over |= bool(np.any(fin & ~np.isfinite(h)))
            ok = fin & np.isfinite(h)
            d2 += float(np.sum((h[ok] - r[ok]) ** 2))
            r2 += float(np.sum(r[ok] ** 2))
    return (math.sqrt(d2 / r2) if r2 > 0 else math.sqrt(d2)), over


def _beyond(array: np.ndarray, hmax: float) -> bool:
    """Whether a finite value of ``array`` exceeds ``hmax`` in magnitude: two reductions without
    a temporary, the masked test only when they see an infinity or a NaN."""
    if array.size == 0:
        return False
    lo, hi = float(array.min()), float(array.max())
    if math.isfinite(lo) and math.isfinite(hi):
        return hi > hmax or lo < -hmax
    return bool(np.any(np.abs(array[np.isfinite(array)]) > hmax))


def _sums(h: np.ndarray, r: np.ndarray) -> tuple[float | None, float]:
    """``sum((h - r)**2)`` and ``sum(r**2)`` in float32 (numpy's pairwise sums: a relative
    error of a few float32 roundings, all rule 10 needs), or ``(None, 0)`` when either is not
    finite: then some value is, or a float32 sum overflowed, and the caller takes the masked
    float64 sums."""
    r32 = np.ascontiguousarray(r, dtype=np.float32).ravel()
    with np.errstate(over="ignore", invalid="ignore"):
        d = np.ascontiguousarray(h, dtype=np.float32).ravel() - r32
        d2 = float(np.square(d, out=d).sum(dtype=np.float32))
        r2 = float(np.square(r32).sum(dtype=np.float32))
    if not (math.isfinite(d2) and math.isfinite(r2)):
        return None, 0.0
    return d2, r2


class _Accumulator:
    """Per value: squared error and squared reference (finite entries), and whether the half run
    gave a non-finite value where the float32 run did not."""

    def __init__(self) -> None:
        self.d2: dict[str, float] = {}
        self.r2: dict[str, float] = {}
        self.nonfinite: set[str] = set()

    def add(self, got: dict, ref: dict) -> None:
        for name, r in ref.items():
            h = got.get(name)
            if h is None or not isinstance(r, np.ndarray) or r.dtype != np.float32:
                continue
            h = np.asarray(h)
            if h.shape != r.shape or h.dtype.kind != "f" and h.dtype != _NP[BF16]:
                continue
            d2, r2 = _sums(h, r)
            if d2 is None:  # a non-finite value somewhere: the masked sums
                h64, r64 = h.astype(np.float64), r.astype(np.float64)
                fin = np.isfinite(r64)
                if np.any(fin & ~np.isfinite(h64)):
                    self.nonfinite.add(name)
                ok = fin & np.isfinite(h64)
                d2, r2 = float(np.sum((h64[ok] - r64[ok]) ** 2)), float(np.sum(r64[ok] ** 2))
            self.d2[name] = self.d2.get(name, 0.0) + d2
            self.r2[name] = self.r2.get(name, 0.0) + r2

    def rel(self, name: str | None) -> float:
        if not name or name not in self.d2:
            return 0.0
        if name in self.nonfinite:
            return math.inf
        r2 = self.r2[name]
        return math.sqrt(self.d2[name] / r2) if r2 > 0 else math.sqrt(self.d2[name])

    def bad(self, name: str | None) -> bool:
        return bool(name) and name in self.nonfinite
