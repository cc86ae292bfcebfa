"""Which initializer is a node's weight, which axes are its channels, and compression metadata.

Shared by ``prune``, ``cluster`` and ``quantize`` (and read by ``finetune`` and export).

Weight rules (input 1 of the node, a constant initializer that no caller may override):

======================  =================  ============  ===========
op                      weight layout      output axis   input axis
======================  =================  ============  ===========
Conv                    [O, I/g, k...]     0             1
ConvTranspose           [I, O/g, k...]     1             0
Gemm (transB=1)         [N, K]             0             1
Gemm (transB=0)         [K, N]             1             0
MatMul (2-D weight)     [K, N]             1             0
======================  =================  ============  ===========

Metadata rules (how compression state persists in the saved ``.onnx``):

1. Per value, in ``value.metadata_props`` (serialized by onnx_ir as the value_info's metadata):
   ``mconv.pruned = "1"`` when the tensor's exact zeros are a pruning mask that later passes
   must keep at exactly zero; ``mconv.cluster`` = JSON ``{"bits", "init", "groups", "axis"}``;
   ``mconv.index_bits`` = the relative-index width export should use.
2. Per model, ``metadata_props["mconv.compression"]`` = JSON ``{tensor name: {"pruned", "kept",
   "bits", "init", "groups", "axis", "index_bits"}}``, the same facts keyed by initializer name,
   for code that only sees the model's metadata (``mconv.container.choose_codec``).
3. A pass that moves a tensor's data to a new initializer (``fp16`` stores ``W`` as ``W_fp16``
   behind a Cast) carries both records over with :func:`move_compression`: casting a pruned or
   clustered tensor keeps its zeros zero and its distinct values at most ``2**bits``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
from mconv.codecs.choose import COMPRESSION_KEY  # defined once, beside the codec choice
from mconv.edit.rewrite import is_overridable
from mconv.irio import owned_array, weight_tensor

PRUNED_KEY = "mconv.pruned"
CLUSTER_KEY = "mconv.cluster"
INDEX_BITS_KEY = "mconv.index_bits"
WEIGHT_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


@dataclass
class WeightRef:
    """A node's weight initializer and the axes that hold its output and input channels."""

    node: ir.Node
    value: ir.Value
    out_axis: int
    in_axis: int

    @property
    def name(self) -> str:
        return self.value.name or ""

    @property
    def tensor(self) -> ir.TensorProtocol:
        """The weight's tensor (a WeightRef is made only for a value that holds one)."""
        tensor = self.value.const_value
        assert tensor is not None, f"weight {self.name} has no tensor"
        return tensor

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.tensor.shape.numpy())

    def array(self) -> np.ndarray:
        """The weight's values (read-only view for in-memory tensors; for an external tensor,
        a copy read from its file, so no memory map outlives the call)."""
        tensor = self.tensor
        if isinstance(tensor, ir.ExternalTensor):
            return owned_array(tensor)
        return tensor.numpy()

    def set_array(self, array: np.ndarray) -> None:
        """Replace the weight's data, keeping its name and value metadata (spilled to scratch
        when :func:`mconv.irio.spilling` is active and the array is large)."""
        self.value.const_value = weight_tensor(array, self.value.name)
        self.value.shape = ir.Shape(array.shape)


def _int_attr(node: ir.Node, key: str, default: int) -> int:
    attr = node.attributes.get(key)
    return int(attr.value) if attr is not None else default


def weight_of(node: ir.Node, model: ir.Model) -> WeightRef | None:
    """The weight of a Conv/ConvTranspose/Gemm/MatMul node, or None (not a constant weight)."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in WEIGHT_OPS or len(node.inputs) < 2:
        return None
    value = node.inputs[1]
    if value is None or not value.is_initializer() or value.const_value is None:
        return None
    if is_overridable(model.graph, value, model.ir_version or 10):
        return None
    if value.const_value.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE):
        return None
    rank = len(value.const_value.shape)
    op = node.op_type
    if op == "Conv" and rank >= 3:
        return WeightRef(node, value, 0, 1)
    if op == "ConvTranspose" and rank >= 3:
        return WeightRef(node, value, 1, 0)
    if op == "Gemm" and rank == 2:
        return WeightRef(node, value, 0, 1) if _int_attr(node, "transB", 0) else WeightRef(node, value, 1, 0)
    if op == "MatMul" and rank == 2:
        return WeightRef(node, value, 1, 0)
    return None


def weight_refs(model: ir.Model, op_types: tuple[str, ...] | list[str] = WEIGHT_OPS) -> list[WeightRef]:
    """Every weight of the main graph in node order; a weight shared by nodes appears once."""
    seen: set[int] = set()
    refs = []
    for node in model.graph:
        if node.op_type not in op_types:
            continue
        ref = weight_of(node, model)
        if ref is None or id(ref.value) in seen:
            continue
        seen.add(id(ref.value))
        refs.append(ref)
    return refs


def compression_info(model: ir.Model) -> dict[str, dict]:
    """The model-level record (rule 2): tensor name -> facts."""
    try:
        info = json.loads(model.metadata_props.get(COMPRESSION_KEY, "{}"))
    except json.JSONDecodeError:
        return {}
    return info if isinstance(info, dict) else {}


def record_compression(model: ir.Model, value: ir.Value, **facts) -> None:
    """Record ``facts`` about ``value`` per value (rule 1) and per model (rule 2)."""
    if facts.get("pruned"):
        value.metadata_props[PRUNED_KEY] = "1"
    cluster = {k: facts[k] for k in ("bits", "init", "groups", "axis", "block") if k in facts}
    if cluster:
        value.metadata_props[CLUSTER_KEY] = json.dumps(cluster, sort_keys=True)
    if facts.get("index_bits") is not None:
        value.metadata_props[INDEX_BITS_KEY] = str(int(facts["index_bits"]))
    info = compression_info(model)
    entry = info.setdefault(value.name or "", {})
    entry.update({k: v for k, v in facts.items() if v is not None})
    model.metadata_props[COMPRESSION_KEY] = json.dumps(info, sort_keys=True, separators=(",", ":"))


def move_compression(model: ir.Model, old: ir.Value, new: ir.Value, old_name: str | None = None) -> bool:
    """Carry ``old``'s compression facts over to ``new``, a value that now stores its data under
    another name (the fp16 pass's ``W`` -> ``W_fp16``): the value metadata (rule 1) is copied
    and the model-level entry (rule 2) moves from ``old_name`` (default ``old.name``) to
    ``new.name``. Answers whether there was anything to carry."""
    moved = False
    for key in (PRUNED_KEY, CLUSTER_KEY, INDEX_BITS_KEY):
        if key in old.metadata_props:
            new.metadata_props[key] = old.metadata_props[key]
            moved = True
    info = compression_info(model)
    entry = info.pop(old_name if old_name is not None else old.name or "", None)
    if entry is not None and new.name:
        info[new.name] = entry
        model.metadata_props[COMPRESSION_KEY] = json.dumps(info, sort_keys=True, separators=(",", ":"))
        moved = True
    return moved


def is_pruned(value: ir.Value) -> bool:
    """Whether the value's exact zeros are a pruning mask (rule 1)."""
    return value.metadata_props.get(PRUNED_KEY) == "1"


def squared_error(reference: np.ndarray, approx: np.ndarray | None, chunk: int = 1 << 20) -> float:
    """Sum of squared differences (of squares when ``approx`` is None) in float64, a chunk at a
    time: no full-size float64 copies of a large tensor."""
    a = reference.ravel()
    b = approx.ravel() if approx is not None else None
    total = 0.0
    for i in range(0, a.size, chunk):
        d = a[i : i + chunk].astype(np.float64)
        if b is not None:
            d -= b[i : i + chunk]
        total += float(np.dot(d, d))
    return total


def snr_db(reference: np.ndarray, approx: np.ndarray) -> float:
    """Signal-to-noise ratio of ``approx`` against ``reference`` in dB (inf when exact)."""
    noise = squared_error(reference, approx)
    signal = squared_error(reference, None)
    if noise == 0.0:
        return float("inf")
    return 10.0 * float(np.log10(max(signal, 1e-300) / noise))


def gather_tables(model: ir.Model, taken: list[WeightRef]) -> list[WeightRef]:
    """The embedding tables of ``model``: the float ``[vocab, dim]`` initializers that Gather
    nodes index along axis 0, that are not in ``taken`` (another node's weight) and that no graph
    input overrides, each once, in node order, as refs whose blocks run along axis 1. ``cluster``
    (its rule 9) and ``blockwise`` (its rule 6) compress these beside the weights of their ops."""
    seen = {id(r.value) for r in taken}
    refs = []
    for node in model.graph:
        if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or not node.inputs:
            continue
        value = node.inputs[0]
        if value is None or id(value) in seen or not value.is_initializer() or value.const_value is None:
            continue
        t = value.const_value
        axis = node.attributes.get("axis")
        if (axis is not None and int(axis.value) not in (0, -2)) or len(t.shape) != 2:
            continue
        if t.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE):
            continue
        if is_overridable(model.graph, value, model.ir_version or 10):
            continue
        seen.add(id(value))
        refs.append(WeightRef(node, value, 0, 1))
    return refs


# Ops that only move or convert a constant: a weight behind one of them is a constant, but not an
# initializer the weight passes can change in place (``fold`` makes it one; DequantizeLinear and
# a widening Cast are stored compression that ``fold`` keeps, rule 3 of the fold pass).
CONSTANT_CARRIERS = frozenset(
    {"Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Cast", "DequantizeLinear"}
)
_FLOATS = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE)


def _weight_inputs(model: ir.Model, op_types: tuple[str, ...] | list[str]) -> list[tuple[ir.Node, ir.Value]]:
    """(node, value) for every weight and bias input of the ``op_types`` nodes (inputs 1..) and
    the other operand of an Add right after one (a bias, as finetune reads it), in node order."""
    out = []
    for node in model.graph:
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type in op_types:
            out += [(node, v) for v in node.inputs[1:] if v is not None]
        elif node.op_type == "Add" and len(node.inputs) == 2:
            a, b = node.inputs
            for this, other in ((a, b), (b, a)):
                producer = other.producer() if other is not None else None
                if this is not None and producer is not None and producer.op_type in op_types:
                    out.append((node, this))
    return out


def lift_constant_weights(model: ir.Model, op_types: tuple[str, ...] | list[str] = WEIGHT_OPS) -> list[str]:
    """Every float ``Constant`` node that feeds a weight or bias of an ``op_types`` node (see
    :func:`_weight_inputs`) becomes an initializer of the same name holding the same tensor, as
    ``fold`` rule 1 does, for those nodes alone: the model computes exactly what it computed,
    and ``prune``, ``cluster`` and ``finetune`` then find the weights where they look (an
    exporter such as paddle2onnx stores every weight as a Constant node). A Constant whose
    output is a graph output stays. Returns the names lifted."""
    from mconv.edit.rewrite import constant_node_array

    graph, lifted = model.graph, []
    for _, value in _weight_inputs(model, op_types):
        node = value.producer()
        if node is None or node.op_type != "Constant" or node.domain not in ("", "ai.onnx"):
            continue
        if value.is_graph_output() or not value.name or value.name in graph.initializers:
            continue
        array = constant_node_array(node)
        if array is None or array.dtype == object or ir.DataType.from_numpy(array.dtype) not in _FLOATS:
            continue
        name = value.name
        value.name = None  # free the name for the initializer that replaces it
        tensor = ir.tensor(np.asarray(array, order="C"), name=name)
        init = ir.Value(
            name=name, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype), const_value=tensor
        )
        init.metadata_props.update(value.metadata_props)
        graph.register_initializer(init)
        ir.convenience.replace_all_uses_with(value, init)
        graph.remove(node, safe=True)
        lifted.append(name)
    return lifted


def computed_weights(
    model: ir.Model, op_types: tuple[str, ...] | list[str] = WEIGHT_OPS
) -> list[tuple[ir.Node, str]]:
    """The weight and bias inputs of ``op_types`` nodes that are constants computed at run time
    (a chain of :data:`CONSTANT_CARRIERS` ops from an initializer or a Constant node): (the
    consuming node, the first carrier op's type), in node order. The weight passes see none of
    them as a weight; ``fold`` turns the movable ones into initializers."""
    out = []
    for node, value in _weight_inputs(model, op_types):
        first, v = None, value
        for _ in range(8):  # a few carriers deep at most
            producer = v.producer()
            if producer is None or producer.op_type not in CONSTANT_CARRIERS or not producer.inputs:
                break
            first = first or producer.op_type
            nxt = producer.inputs[0]
            if nxt is None:
                break
            v = nxt
        if first is None:
            continue
        root = v.producer()
        if (v.is_initializer() and not v.is_graph_input()) or (
            root is not None and root.op_type == "Constant"
        ):
            out.append((node, first))
    return out


def weights_hint(
    model: ir.Model, where: str, op_types: tuple[str, ...] | list[str] = WEIGHT_OPS
) -> tuple[str, str] | None:
    """For a weight pass that found no layer weight it can change: (what the weights are fed
    through, what to run first); None when no weight input is a computed constant."""
    found = computed_weights(model, op_types)
    if not found:
        return None
    kinds = sorted({k for _, k in found})
    node = found[0][0]
    what = (
        f"{len(found)} weight input(s) are computed from constants through {', '.join(kinds)} "
        f"(first: node {node.name or node.op_type!r})"
    )
    if "DequantizeLinear" in kinds or "Cast" in kinds:  # stored compression fold keeps (fold rule 3)
        return what, f"the weights are stored quantized or as float16: run {where} on the float32 model"
    return what, f"fold them into initializers first: --passes fold,eliminate-identity,dce,{where}"


def layer_weights(
    model: ir.Model, where: str, op_types: tuple[str, ...] | list[str] = WEIGHT_OPS, required: bool = True
) -> tuple[list[str], list[WeightRef]]:
    """A weight pass's start: Constant-node weights lifted into initializers
    (:func:`lift_constant_weights`), then the layer weights (:func:`weight_refs`). With
    ``required`` and none found while some are computed from constants, one InputError line
    naming what they go through and what to run first (:func:`weights_hint`)."""
    from mconv.errors import InputError

    lifted = lift_constant_weights(model, op_types)
    refs = weight_refs(model)
    if required and not refs:
        hint = weights_hint(model, where, op_types)
        if hint is not None:
            raise InputError(
                f"{where} found no weight stored as an initializer: {hint[0]}",
                where=f"pass {where}",
                hint=hint[1],
            )
    return lifted, refs
