"""The GPU plan: the graph lowered to buffers and kernels in encode order, for every dialect.

One planner serves the metal and webgpu targets: a :class:`Dialect` gives it the kernel rules
of one language (MSL: :mod:`mconv.targets.metal.msl`; WGSL: :mod:`mconv.targets.webgpu.wgsl`)
and the limits of its API. The plan (``metal_plan.json``, ``webgpu_plan.json``: one schema) is
the single description that the hosts (Swift, the Linux harness, the WebGPU runner and page) are
generated from or read.

Rules:

1. Before planning, the model (a copy; the caller's model is not touched) gets static input
   shapes: a symbolic batch dimension becomes ``options["batch"]`` (default 1); any other
   symbolic dimension is refused (exit 2) with a hint naming the input and the
   ``export --input-shape NAME=DIMS`` that bakes it (the CLI fixes those before the target
   sees the model, so the planner reads them from the value infos). ONNX Runtime's quantized
   and ``com.microsoft`` contrib ops are rewritten into standard ops as their inputs' shapes
   become known (:mod:`mconv.targets.gpu.contrib`). Then, until nothing
   changes: Shape/Size of static values become constants, Cast/DequantizeLinear of constants
   are evaluated (fp16/int8 storage), float-to-float Casts become Identity, and
   ``fold,dce,eliminate-identity`` runs with shapes re-inferred; finally ``fuse-bn`` folds
   BatchNorm into convolutions. Every value must then have a static shape.
2. Every node is either a kernel (a rule of the dialect's ``lower``), a view
   (Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout: the output aliases the input's
   buffer) or unsupported. All unsupported nodes are named in one
   :class:`~mconv.errors.UnsupportedError`.
3. An activation whose input has no other use and is not a graph output is fused into the
   kernel of a fusible producer (Conv, ConvTranspose, Gemm, MatMul, pooling, reductions,
   binary elementwise ops, BatchNorm), and so is a chain of them (Relu then Min(x, 6), Keras'
   relu6); ``y * Sigmoid(y)`` is fused as swish the same way. Kernels compute floats: integer
   and bool tensors are held as floats (bool as 0/1), which is exact for integers up to 2^11 in
   half storage and 2^24 in float storage; only kernels exact on such values take them (data
   movement, comparisons, logic, Where, Cast, Q/DQ, Add/Sub/Mul/Min/Max: ``INTEGER_OPS``), any
   other node reading or writing them is unsupported, named with the reason, and so is an integer
   weight beyond the exact range. Runtime integer values beyond it are the caller's to avoid.
4. Buffers: one per graph input, per weight a kernel reads (an initializer), and per value a
   kernel writes; in the order first seen. A layer's bindings are its kernel's reads in order,
   then its output; binding ``i`` is ``[[buffer(i)]]``.
5. Kernel names are ``L<index>_<op>``; grids are exact (one thread per output element, per
   output pixel x channel, or per softmax row) and threadgroups at most 256 threads.
6. Storage (:func:`storage_for`): ``precision`` fp16 is half storage, fp32 float, except that a
   graph which quantizes computed values (a QuantizeLinear whose input is not a constant) is
   planned in float storage whatever the precision asked, and the plan's ``notes`` say so. Its
   dequantized activations ``(q - zp) * s`` and dequantized weights are not exact in half, and
   the next QuantizeLinear then lands codes away from the spec's (person_detect.tflite: 2 int8
   codes off its single output with half weights, up to 8 with half activations alone).
   So is a graph that quantizes at run time without QuantizeLinear (ORT's dynamic quantization,
   rewritten by :mod:`mconv.targets.gpu.contrib`: a Cast of computed floats to int32, int8 or
   uint8, a DynamicQuantizeLSTM), whose int32 accumulators float16 would not hold.
   Likewise a graph with a Gather (or a GatherND, by the longest axis its index tuples address)
   whose indices are computed at run time over an axis longer than 2^11 (a token embedding
   with a vocabulary over 2048): half storage would hold the ids
   inexactly (token 2049 read as 2048), so the graph is planned in float storage and the notes
   say so.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field

import numpy as np
import onnx_ir as ir
from mconv.errors import InputError, UnsupportedError, show
from mconv.irio import real_inputs
from mconv.targets.gpu.contrib import KEPT, contrib_shapes, decompose
from mconv.targets.gpu.ops import (
    FUSIBLE,
    INTEGER_OPS,
    Activation,
    LowerContext,
    activation_of,
    exact_integer_limit,
    runtime_gather_axes,
)
from mconv.targets.gpu.values import required

PLAN_VERSION = 1
VIEWS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout")
PREPASSES = "fold,dce,eliminate-identity,fuse-bn"
MAX_FOLD_ROUNDS = 64  # rounds of shape folding before planning (rule 1)


@dataclass
class Buffer:
    """A device buffer: kind is input, weight or activation; ``output`` names the graph outputs it holds."""

    index: int
    name: str
    kind: str
    shape: list[int]
    count: int


@dataclass
class Layer:
    """One dispatch: the kernel function, its buffer bindings (buffer indices, by binding index)."""

    kernel: str
    op: str
    nodes: list[str]
    bindings: list[int]
    binding_names: list[str]
    grid: list[int]
    threadgroup: list[int]


@dataclass
class GpuPlan:
    """A plan: buffers, layers in encode order, the kernels' text by name (rules 4, 5)."""

    model_name: str
    dtype: str  # storage type of every buffer: "half" or "float"
    buffers: list[Buffer]
    layers: list[Layer]
    inputs: list[dict]  # {"name", "buffer", "shape"}
    outputs: list[dict]  # {"name", "buffer", "shape"}
    batch: int
    version: int = PLAN_VERSION
    sources: dict[str, str] = field(default_factory=dict, repr=False)  # kernel -> dialect text (not in JSON)
    notes: list[str] = field(default_factory=list)  # rule 6 (in the JSON only when there are some)

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("sources")
        if not d["notes"]:
            d.pop("notes")
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> GpuPlan:
        return cls(
            model_name=d["model_name"],
            dtype=d["dtype"],
            buffers=[Buffer(**b) for b in d["buffers"]],
            layers=[Layer(**l) for l in d["layers"]],
            inputs=list(d["inputs"]),
            outputs=list(d["outputs"]),
            batch=int(d["batch"]),
            version=int(d.get("version", PLAN_VERSION)),
            notes=[str(n) for n in d.get("notes", [])],
        )

    def weight_buffers(self) -> list[Buffer]:
        return [b for b in self.buffers if b.kind == "weight"]


def _dims_text(shape, batch: int) -> str:
    return ",".join(
        str(d) if isinstance(d, int) else (str(batch) if i == 0 else str(getattr(d, "value", None) or "?"))
        for i, d in enumerate(shape)
    )


def _bake_inputs(model: ir.Model, batch: int) -> None:
    """Rule 1: a symbolic batch becomes ``batch``; any other symbolic dimension is refused."""
    from mconv.edit.input_shapes import fix_input_shapes
    from mconv.edit.rewrite import name_of
    from mconv.errors import show

    shapes: dict[str, list[int]] = {}
    # an UnsupportedError (exit 2), so that the CLI names the model file the input belongs to
    for v in real_inputs(model.graph):
        if v.shape is None:
            raise UnsupportedError(
                [(show(v.name), "no shape")],
                what="input",
                hint=f"the metal target bakes shapes: give it one with export --input-shape {show(v.name)}=DIMS",
            )
        dims = []
        for i, d in enumerate(v.shape):
            if isinstance(d, int):
                dims.append(d)
            elif i == 0:
                dims.append(batch)
            else:
                raise UnsupportedError(
                    [(show(v.name), f"dimension {i} is symbolic: {show(str(d))}")],
                    what="input",
                    hint=f"the metal target bakes shapes: give them with export --input-shape "
                    f"{show(v.name)}={_dims_text(v.shape, batch)} (a number for each symbol)",
                )
        if any(not isinstance(d, int) for d in v.shape):
            shapes[name_of(v)] = dims
    if shapes:
        fix_input_shapes(model, shapes)


def _materialize(model: ir.Model) -> int:
    """Shape/Size of static values become constants; Cast and DequantizeLinear of constants are
    evaluated (fold keeps them to keep stored weights narrow; the metal target converts every
    weight to its storage type anyway); Cast between float types is an Identity. Returns the
    number of nodes rewritten."""
    from mconv.edit.rewrite import add_initializer, fresh_name, replace_value, taken_names
    from mconv.passes.fold import evaluate_node

    graph = model.graph
    taken = taken_names(graph)
    opset = _opset(model)
    floats = {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE, ir.DataType.BFLOAT16}
    changed = 0
    for node in list(graph):
        if node.domain not in ("", "ai.onnx") or not node.outputs or node.outputs[0].is_graph_output():
            continue
        out = node.outputs[0]
        array = None
        shape = static_shape(node.inputs[0]) if node.op_type in ("Shape", "Size") and node.inputs else None
        if shape is not None:
            if node.op_type == "Size":
                array = np.array(int(np.prod(shape)), np.int64)
            else:
                start = node.attributes.get_int("start", 0)
                end = node.attributes.get_int("end", len(shape))
                array = np.array(shape[slice(start, end)], np.int64)
        elif node.op_type in ("Cast", "CastLike", "DequantizeLinear"):
            consts = [
                v.const_value.numpy() if v is not None and v.const_value is not None else None
                for v in node.inputs
            ]
            if all(c is not None for c, v in zip(consts, node.inputs) if v is not None):
                try:
                    array = evaluate_node(node, consts, opset)[0]
                except Exception:  # noqa: BLE001 - left for the planner to name
                    array = None
            elif (
                node.op_type == "Cast"
                and node.inputs[0] is not None
                and node.inputs[0].dtype in floats
                and ir.DataType(node.attributes.get_int("to", 0)) in floats
            ):
                node.op_type = "Identity"
                node.attributes.clear()
                changed += 1
                continue
        if array is None:
            continue
        name = out.name or fresh_name(f"{node.name or node.op_type}_const", taken)
        out.name = None
        replace_value(out, add_initializer(graph, name, np.asarray(array, order="C")))
        graph.remove(node, safe=True)
        changed += 1
    return changed


def _square_sums(model: ir.Model) -> int:
    """ReduceSum(Mul(t, t)) (or Pow(t, 2)) becomes ReduceSumSquare(t) when the square has no
    other use: one kernel squares in float, so small values do not underflow half storage on
    the way to the sum (a CQT's magnitudes). Returns the number of nodes rewritten."""
    opset = _opset(model)
    changed = 0
    for node in list(model.graph):
        if node.op_type != "ReduceSum" or node.domain not in ("", "ai.onnx") or not node.inputs:
            continue
        sq = node.inputs[0]
        prod = sq.producer() if sq is not None else None
        if sq is None or prod is None or sq.is_graph_output() or len(sq.uses()) != 1:
            continue
        if prod.op_type == "Mul" and len(prod.inputs) == 2 and prod.inputs[0] is prod.inputs[1]:
            t = prod.inputs[0]
        elif prod.op_type == "Pow" and len(prod.inputs) == 2:
            e = LowerContext.const(prod.inputs[1])
            if e is None or e.size != 1 or float(e.reshape(())) != 2.0:
                continue
            t = prod.inputs[0]
        else:
            continue
        if t is None or t.dtype not in _FLOATS:
            continue
        axes = node.inputs[1] if len(node.inputs) > 1 else None
        inputs: list[ir.Value | None] = [t]
        attrs = list(node.attributes.values())
        if axes is not None:
            if opset >= 18:
                inputs.append(axes)
            else:  # ReduceSumSquare takes axes as an attribute before opset 18
                values = LowerContext.const(axes)
                if values is None or values.size == 0:  # empty axes: noop_with_empty_axes decides
                    continue
                attrs = [a for a in attrs if a.name != "noop_with_empty_axes"]
                attrs.append(ir.AttrInt64s("axes", [int(v) for v in values.ravel()]))
        new = ir.Node("", "ReduceSumSquare", inputs, attrs, num_outputs=1, name=node.name)
        out = node.outputs[0]
        model.graph.insert_after(node, new)
        name, out.name = out.name, None
        new.outputs[0].name = name
        new.outputs[0].shape = out.shape
        if out.dtype is not None:
            new.outputs[0].dtype = out.dtype
        from mconv.edit.rewrite import replace_value

        replace_value(out, new.outputs[0])
        model.graph.remove(node, safe=True)
        if not sq.uses():
            model.graph.remove(prod, safe=True)
        changed += 1
    return changed


def _infer(model: ir.Model) -> ir.Model:
    from mconv.passes import parse_spec, run_pipeline

    for node in model.graph:  # stale symbolic shapes would survive a merge with inferred ones
        for out in node.outputs:
            out.shape = None
    for out in model.graph.outputs:
        out.shape = None
    model, _ = run_pipeline(model, parse_spec("shape-inference"))
    while contrib_shapes(model):  # contrib outputs kept for a kernel (contrib.py rule 6)
        model, _ = run_pipeline(model, parse_spec("shape-inference"))
    return model


def prepare(model: ir.Model, batch: int = 1, qdq: bool = False) -> ir.Model:
    """A copy of ``model`` with static shapes, shape arithmetic folded, BatchNorm folded and
    shapes inferred (rule 1). ``qdq``: ORT's integer products in QDQ form
    (:func:`mconv.targets.gpu.contrib.decompose` rule 8)."""
    from mconv.passes import parse_spec, run_pipeline
    from mconv.passes.pipeline import snapshot_model

    model = snapshot_model(model)
    _bake_inputs(model, batch)
    model = _infer(model)
    # ORT's quantized and contrib ops become standard ops as their inputs' shapes become known
    for _ in range(MAX_FOLD_ROUNDS):
        if not decompose(model, qdq):
            break
        model = _infer(model)
    # Shape -> Gather -> Concat -> Reshape chains fold a step at a time (each round's shape
    # inference makes the next Reshape static): Swin-T's windows take 17 rounds
    for _ in range(MAX_FOLD_ROUNDS):
        changed = _materialize(model)
        before = len(list(model.graph))
        model, _ = run_pipeline(model, parse_spec("fold,dce,eliminate-identity"))
        model = _infer(model)
        if not changed and len(list(model.graph)) == before:
            break
    _square_sums(model)
    model, _ = run_pipeline(model, parse_spec(PREPASSES))
    return _infer(model)


def static_shape(value: ir.Value | None) -> list[int] | None:
    if value is None or value.shape is None:
        return None
    dims = [d for d in value.shape if isinstance(d, int)]
    return dims if len(dims) == len(value.shape) else None


def _opset(model: ir.Model) -> int:
    return int(model.opset_imports.get("", 13))


_SEE_THROUGH = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")


def _fusions(model: ir.Model, ctx: LowerContext) -> dict[int, tuple[Activation, list[ir.Node]]]:
    """id(producer node) -> (activation, the nodes it absorbs) (rule 3)."""
    outputs = {v.name for v in model.graph.outputs}
    fused: dict[int, tuple[Activation, list[ir.Node]]] = {}
    taken: set[int] = set()  # nodes an earlier producer absorbed (Add by a scalar is both)
    for node in model.graph:
        if node.op_type not in FUSIBLE or len(node.outputs) != 1 or id(node) in taken:
            continue
        y = node.outputs[0]
        if y.name in outputs:
            continue
        uses = [u.node for u in y.uses()]
        views: list[ir.Node] = []
        # a reshaping view between the producer and an activation (Gemm -> Reshape -> Quantize):
        # the data is the same flat array, so the kernel applies the activation and writes the
        # activation's value; the view is absorbed
        if len(uses) == 1 and uses[0].op_type in _SEE_THROUGH and uses[0].inputs[0] is y:
            v = uses[0].outputs[0]
            after = [u.node for u in v.uses()]
            if v.name not in outputs and len(after) == 1 and after[0].inputs[0] is v:
                if activation_of(ctx, after[0]) is not None:
                    views, uses = [uses[0]], after
                    y = v
        if len(uses) == 1 and uses[0].domain in ("", "ai.onnx"):
            act = activation_of(ctx, uses[0])
            if act is None or uses[0].inputs[0] is not y:
                continue
            chain = [*views, uses[0]]
            while True:  # Relu then Min(6) (Keras' relu6) and such: one kernel applies both
                last = chain[-1].outputs[0]
                nxt = [u.node for u in last.uses()]
                if last.name in outputs or len(nxt) != 1 or nxt[0].domain not in ("", "ai.onnx"):
                    break
                more = activation_of(ctx, nxt[0])
                if more is None or nxt[0].inputs[0] is not last:
                    break
                act = act.then_apply(more)
                chain.append(nxt[0])
            fused[id(node)] = (act, chain)
            taken.update(id(c) for c in chain)
            continue
        if len(uses) == 2:  # swish: y * Sigmoid(y)
            sig = next((u for u in uses if u.op_type == "Sigmoid"), None)
            mul = next((u for u in uses if u.op_type == "Mul"), None)
            if sig is None or mul is None:
                continue
            s = sig.outputs[0]
            if s.name in outputs or len(s.uses()) != 1 or list(s.uses())[0].node is not mul:
                continue
            if {id(mul.inputs[0]), id(mul.inputs[1])} == {id(y), id(s)}:
                fused[id(node)] = (Activation("swish", (), (sig.name or "", mul.name or "")), [sig, mul])
                taken.update((id(sig), id(mul)))
    return fused


def _safe(op: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "", op).lower()


_FLOATS = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE)
# integer and bool tensors are held as floats (rule 3): exact below exact_integer_limit
_INTEGERS = (
    ir.DataType.BOOL,
    ir.DataType.INT8,
    ir.DataType.UINT8,
    ir.DataType.INT16,
    ir.DataType.UINT16,
    ir.DataType.INT32,
    ir.DataType.UINT32,
    ir.DataType.INT64,
    ir.DataType.UINT64,
    ir.DataType.INT4,
    ir.DataType.UINT4,
)


def _selects(node: ir.Node) -> bool:
    """Kernels that select input elements, exact on integers held as floats beside
    :data:`INTEGER_OPS`: MaxPool (the max of exact values is one of them; no indices output) and a nearest-neighbour Resize / Upsample (a linear or cubic one
    interpolates, and ORT rounds integer results its own way)."""
    if node.op_type == "MaxPool":
        return len(node.outputs) < 2 or not node.outputs[1].uses()
    if node.op_type not in ("Resize", "Upsample"):
        return False
    mode = node.attributes.get("mode")
    value = mode.value if mode is not None else "nearest"
    return (value.decode() if isinstance(value, bytes) else value) == "nearest"


def value_reason(node: ir.Node, target: str) -> str | None:
    """Rule 3 for the values ``node`` reads (not constants) and writes: None when each is a float,
    or an integer or bool held as a float in a kernel exact on them (:data:`INTEGER_OPS`); else
    why not. Shared with the webgpu target, whose kernels of these ops are exact on them too."""
    for v in [*[v for v in node.inputs if v is not None and v.const_value is None], *node.outputs]:
        if (
            v is not None
            and v.dtype is not None
            and v.dtype not in _FLOATS
            and (v.uses() or v.is_graph_output())
        ):
            kind = v.dtype.name.lower()
            if v.dtype not in _INTEGERS:
                return f"{kind} values (the {target} target computes floats)"
            if node.op_type not in INTEGER_OPS and not _selects(node):
                return f"{kind} values ({node.op_type} on integers held as floats is not exact)"
    return None


def unsupported_reason(
    ctx: LowerContext, node: ir.Node, lower: Mapping, checks: Mapping, target: str
) -> str | None:
    """None when the node lowers (a kernel of ``lower`` or a view); else "" (unknown op) or why
    not (rules 2 and 3; ``checks`` holds the op types' own conditions)."""
    standard = node.domain in ("", "ai.onnx")
    if not standard and (node.domain, node.op_type) not in KEPT:
        return ""
    if node.op_type not in lower and (node.op_type not in VIEWS or not standard):
        return ""
    if node.op_type == "Dropout" and len(node.outputs) > 1 and node.outputs[1].uses():
        return "mask output"
    if node.op_type in VIEWS:
        return None
    data = [v for v in node.inputs[:1] if v is not None]
    if any(static_shape(v) is None for v in data):
        return "input shape not static"
    reason = value_reason(node, target)
    if reason is not None:
        return reason
    check = checks.get(node.op_type)
    return check(ctx, node) if check is not None else None


def refuse_unsupported(
    graph: ir.Graph, ctx: LowerContext, lower: Mapping, checks: Mapping, target: str
) -> None:
    """Rule 2: one UnsupportedError naming every node that does not lower, if any."""
    unsupported: list[tuple[str, str]] = []
    for node in graph:
        reason = unsupported_reason(ctx, node, lower, checks, target)
        if reason is not None:
            label = node.op_type if reason == "" else f"{node.op_type}: {reason}"
            unsupported.append((node.name or f"#{len(unsupported)}", label))
    if unsupported:
        raise UnsupportedError(
            unsupported,
            what="node",
            hint=f"the {target} target lowers " + ", ".join(sorted({*lower, *VIEWS})),
        )


def check_integer_constant(value: ir.Value, storage: str) -> None:
    """Rule 3: an integer weight beyond the integers ``storage`` holds exactly is refused in one
    line naming the value and the largest magnitude it holds."""
    if value.dtype not in _INTEGERS or value.const_value is None:
        return
    big = np.abs(value.const_value.numpy().astype(np.float64)).max(initial=0)
    if big > exact_integer_limit(storage):
        raise UnsupportedError(
            [(show(value.name), f"integer constant holds {int(big)}")],
            what="value",
            hint=f"{storage} storage holds integers exactly up to {exact_integer_limit(storage)}"
            + ("; export with --precision fp32" if storage == "half" else ""),
        )


_CODE_CASTS = (int(ir.DataType.INT32), int(ir.DataType.INT8), int(ir.DataType.UINT8))


def storage_for(model: ir.Model, precision: str) -> tuple[str, list[str]]:
    """(storage, notes) for ``precision`` (rule 6): ``half`` or ``float``; a graph that quantizes
    computed values is planned in float, and the note says why."""
    if precision not in ("fp16", "fp32"):
        raise InputError(f"precision '{precision}'", where="--precision", hint="choose fp16 or fp32")
    if precision == "fp32":
        return "float", []
    quantizers = [
        n
        for n in model.graph
        if n.op_type == "QuantizeLinear"
        and n.inputs
        and n.inputs[0] is not None
        and n.inputs[0].const_value is None
    ]
    # quantization done at run time without a QuantizeLinear (contrib.py rules 2, 4 and 6):
    # codes and int32 accumulators cast from computed floats, quantized recurrences
    exact = [
        n
        for n in model.graph
        if n.op_type == "Cast"
        and n.attributes.get_int("to", 0) in _CODE_CASTS
        and n.inputs
        and n.inputs[0] is not None
        and n.inputs[0].const_value is None
        or (n.domain, n.op_type) in KEPT
    ]
    limit = exact_integer_limit("half")
    gathers = [(name, n) for name, n in runtime_gather_axes(model.graph) if n == 0 or n > limit]
    notes = []
    if quantizers:
        notes.append(
            f"float32 storage, not float16: {len(quantizers)} QuantizeLinear node(s) quantize computed "
            "values, and dequantized int8 values are not exact in float16 (codes would land off the "
            "spec's); the kernels run as they would with --precision fp32"
        )
    if exact:
        notes.append(
            f"float32 storage, not float16: {len(exact)} node(s) quantize at run time or cast exact "
            "integer products (ORT's dynamic quantization), which float16 does not hold exactly; the "
            "kernels run as they would with --precision fp32"
        )
    if gathers:
        longest = max(n for _, n in gathers)
        notes.append(
            f"float32 storage, not float16: {len(gathers)} Gather/GatherND node(s) index an axis of up to "
            f"{longest or 'an unknown number of'} entries with indices computed at run time (token ids), "
            f"and float16 holds integers exactly only up to {limit}; the kernels run as they would "
            "with --precision fp32"
        )
    return ("float", notes) if notes else ("half", [])


@dataclass(frozen=True)
class Dialect:
    """What a kernel language gives the planner: its rules (``lower``: op type -> rule,
    ``checks``: op type -> condition), its context, the buffers a kernel may bind and what
    to say past that, the default precision, and a rewrite of the graph before planning."""

    target: str
    lower: Mapping[str, Callable]
    checks: Mapping[str, Callable]
    context: Callable[[str, int], LowerContext]
    max_bindings: int
    binding_hint: str
    default_precision: str
    before: Callable[[ir.Model, str], object] | None = None  # (model, storage)


def build_plan(model: ir.Model, dialect: Dialect, options: Mapping | None = None) -> GpuPlan:
    """Lower a prepared model (see :func:`prepare`) to a :class:`GpuPlan` whose ``sources`` are
    ``dialect``'s kernels."""
    from mconv.edit.rewrite import name_of

    options = dict(options or {})
    storage, notes = storage_for(model, options.get("precision") or dialect.default_precision)
    batch = int(options.get("batch") or 1)
    ctx = dialect.context(storage, _opset(model))
    if dialect.before is not None:
        dialect.before(model, storage)
    graph = model.graph
    graph.sort()

    refuse_unsupported(graph, ctx, dialect.lower, dialect.checks, dialect.target)

    fused = _fusions(model, ctx)
    absorbed = {id(n) for _, nodes in fused.values() for n in nodes}
    buffers: list[Buffer] = []
    by_value: dict[str, int] = {}  # value name -> buffer index (views share their input's)

    def buffer_for(value: ir.Value, kind: str) -> int:
        name = name_of(value)
        if name in by_value:
            return by_value[name]
        if kind == "weight":
            check_integer_constant(value, storage)
        shape = static_shape(value)
        if shape is None:
            raise InputError(
                "value has no static shape", where=f"value '{value.name}'", hint="check the model's shapes"
            )
        buffers.append(Buffer(len(buffers), name, kind, shape, int(np.prod(shape)) if shape else 1))
        by_value[name] = len(buffers) - 1
        return by_value[name]

    inputs = []
    for v in real_inputs(graph):
        inputs.append({"name": v.name, "buffer": buffer_for(v, "input"), "shape": static_shape(v)})

    layers: list[Layer] = []
    sources: dict[str, str] = {}
    for node in graph:
        if id(node) in absorbed:
            continue
        if node.op_type in VIEWS:
            src = required(node.inputs[0], node)
            if src.name not in by_value:
                buffer_for(src, "weight" if src.const_value is not None else "activation")
            by_value[name_of(node.outputs[0])] = by_value[name_of(src)]
            continue
        act, extra = fused.get(id(node), (None, []))
        kernel = f"L{len(layers)}_{_safe(node.op_type)}"
        try:
            lowered = dialect.lower[node.op_type](ctx, node, kernel, act)
        except InputError as exc:
            if exc.where is None:
                exc.where = f"node '{node.name}'"
            raise
        for ks in lowered if isinstance(lowered, list) else [lowered]:
            out_value = ks.output or (extra[-1].outputs[0] if extra else node.outputs[0])
            # a fused node's result is the last absorbed node's output; the kernel writes it
            if len(ks.reads) + 1 > dialect.max_bindings:
                raise UnsupportedError(
                    [(node.name or "<unnamed>", node.op_type)], what="node", hint=dialect.binding_hint
                )
            reads = [buffer_for(v, "weight" if v.const_value is not None else "activation") for v in ks.reads]
            out = buffer_for(out_value, "activation")
            layers.append(
                Layer(
                    kernel=ks.name,
                    op=node.op_type if act is None else f"{node.op_type}+{act.kind}",
                    nodes=[node.name or "", *[n.name or "" for n in extra]],
                    bindings=[*reads, out],
                    binding_names=[*[name_of(v) for v in ks.reads], name_of(out_value)],
                    grid=list(ks.grid),
                    threadgroup=list(ks.threadgroup),
                )
            )
            sources[ks.name] = ks.source
    outputs = []
    for v in graph.outputs:
        if v.name not in by_value:
            raise InputError(
                "graph output is not computed by any kernel",
                where=f"output '{v.name}'",
                hint=f"the {dialect.target} target needs outputs computed from the inputs",
            )
        outputs.append({"name": v.name, "buffer": by_value[v.name], "shape": static_shape(v)})
    return GpuPlan(
        model_name=options.get("model_name") or graph.name or "Model",
        dtype=storage,
        buffers=buffers,
        layers=layers,
        inputs=inputs,
        outputs=outputs,
        batch=batch,
        sources=sources,
        notes=notes,
    )
