"""What a GPU kernel rule is, for both dialects (MSL and WGSL): the fused activation, the kernel
a rule returns, the context it reads the graph through, and the op classes the planner uses.

Rules:

1. A rule ``lower(ctx, node, kernel, act) -> KernelSource`` (or a list, one per output or
   chunk) returns the kernel text of one dialect; everything else here is dialect-neutral.
2. :data:`FUSIBLE` ops may apply a following activation (plan rule 3); :data:`INTEGER_OPS` are
   exact on integers held as floats; both classes are the planner's, the same for every
   dialect (a dialect without a kernel for one of them refuses the node).
3. An activation node's :class:`Activation` (:func:`activation_of`) takes ONNX's attribute
   defaults from :mod:`mconv.onnx_rules`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir
from mconv import onnx_rules
from mconv.targets.gpu.params.elementwise import FLOAT_TYPES
from mconv.targets.gpu.values import static_dims

__all__ = [
    "ACTIVATIONS",
    "FUSIBLE",
    "INTEGER_OPS",
    "UNARY_ACTIVATIONS",
    "Activation",
    "KernelSource",
    "LowerContext",
    "activation_of",
    "check_unary",
    "exact_integer_limit",
    "flit",
    "runtime_gather_axes",
    "tensor_clip",
    "threadgroup_for",
]


@dataclass(frozen=True)
class Activation:
    """A fused activation (an elementwise function of one float): kind (relu, clip, leaky, sigmoid,
    tanh, gelu, gelu_tanh, swish, hardsigmoid, hardswish, elu, selu, celu, softplus, softsign,
    mish, neg, exp, log, sqrt, abs, reciprocal, erf, floor, ceil, round, sin, cos, identity; mul,
    add, div: by a constant scalar; quantize, dequantize: per-tensor Q/DQ) and
    params."""

    kind: str
    params: tuple[float, ...] = ()
    nodes: tuple[str, ...] = ()
    then: Activation | None = None  # applied to this one's result (a fused chain)

    def then_apply(self, other: Activation) -> Activation:
        """This activation followed by ``other``; ``kind`` names the chain (``relu+clip``)."""
        tail = other if self.then is None else self.then.then_apply(other)
        return Activation(f"{self.kind.split('+')[0]}+{tail.kind}", self.params, self.nodes, tail)


def flit(x: float) -> str:
    """A float32 literal for MSL/C++ (``1.5f``); infinities as ``INFINITY``."""
    v = float(np.float32(x))
    if np.isinf(v):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    text = repr(v)
    if "e" not in text and "." not in text:
        text += ".0"
    return f"({text}f)" if text.startswith("-") else f"{text}f"


@dataclass
class KernelSource:
    """A generated kernel: name, MSL text, the values it reads (binding order) and grid size.

    The output value is bound last, after ``reads``. A rule for a node with several outputs
    (Split) returns one KernelSource per output, each naming its ``output``.
    """

    name: str
    source: str
    reads: list[ir.Value]
    grid: tuple[int, int, int]
    threadgroup: tuple[int, int, int] = field(default=(1, 1, 1))
    output: ir.Value | None = None  # the value written; None: the node's first output

    def __post_init__(self) -> None:
        if self.threadgroup == (1, 1, 1):
            self.threadgroup = threadgroup_for(self.grid)


class LowerContext:
    """What a rule may ask about the graph: static shapes, constants, the storage type."""

    def __init__(self, storage: str, opset: int) -> None:
        self.storage = storage  # "half" or "float"
        self.opset = opset

    def shape(self, value: ir.Value) -> list[int]:
        """The static shape of ``value`` (the planner bakes every shape before lowering)."""
        assert value.shape is not None
        return static_dims(value.shape)

    @staticmethod
    def const(value: ir.Value | None) -> np.ndarray | None:
        if value is None or value.const_value is None:
            return None
        return value.const_value.numpy()


def threadgroup_for(grid: tuple[int, int, int]) -> tuple[int, int, int]:
    """A threadgroup of at most 256 threads that fits the grid (dispatchThreads trims edges)."""
    x = min(grid[0], 256)
    y = min(grid[1], max(1, 256 // x))
    z = min(grid[2], max(1, 256 // (x * y)))
    return (x, y, z)


# activation op types (standalone: the unary kernel; after a FUSIBLE op: fused).
ACTIVATIONS = (
    "Relu",
    "Clip",
    "LeakyRelu",
    "Sigmoid",
    "Tanh",
    "Gelu",
    "HardSigmoid",
    "HardSwish",
    "Elu",
    "Celu",
    "Selu",
    "Softplus",
    "Softsign",
    "Mish",
    "Neg",
    "Exp",
    "Log",
    "Sqrt",
    "Abs",
    "Reciprocal",
    "Erf",
    "Floor",
    "Ceil",
    "Round",
    "Sin",
    "Cos",
)


# the activation family's ops among them (kernels/activation.py); the rest are elementwise math
UNARY_ACTIVATIONS = (
    "Relu",
    "LeakyRelu",
    "Sigmoid",
    "Tanh",
    "Gelu",
    "HardSigmoid",
    "HardSwish",
    "Elu",
    "Celu",
    "Selu",
    "Softplus",
    "Softsign",
    "Mish",
)


def exact_integer_limit(storage: str) -> int:
    """The largest integer magnitude below which every integer is exact in ``storage``."""
    return 2**11 if storage == "half" else 2**24


_SIMPLE = {
    "HardSwish": "hardswish",
    "Softplus": "softplus",
    "Softsign": "softsign",
    "Mish": "mish",
    "Neg": "neg",
    "Exp": "exp",
    "Log": "log",
    "Sqrt": "sqrt",
    "Abs": "abs",
    "Reciprocal": "reciprocal",
    "Erf": "erf",
    "Floor": "floor",
    "Ceil": "ceil",
    "Round": "round",
    "Sin": "sin",
    "Cos": "cos",
}


def activation_of(ctx: LowerContext, node: ir.Node) -> Activation | None:
    """The Activation an activation node computes, or None when it cannot be expressed."""
    op = node.op_type
    names = (node.name or "",)  # a graph names its nodes
    if op == "Relu":
        return Activation("relu", (), names)
    if op == "LeakyRelu":
        return Activation(
            "leaky", (node.attributes.get_float("alpha", onnx_rules.default("LeakyRelu", "alpha")),), names
        )
    if op == "Sigmoid":
        return Activation("sigmoid", (), names)
    if op == "Tanh":
        return Activation("tanh", (), names)
    if op == "Gelu":
        kind = "gelu_tanh" if node.attributes.get_string("approximate", "none") == "tanh" else "gelu"
        return Activation(kind, (), names)
    if op == "HardSigmoid":
        a = node.attributes.get_float("alpha", onnx_rules.default("HardSigmoid", "alpha"))
        b = node.attributes.get_float("beta", onnx_rules.default("HardSigmoid", "beta"))
        return Activation("hardsigmoid", (a, b), names)
    if op == "Elu":
        return Activation(
            "elu", (node.attributes.get_float("alpha", onnx_rules.default("Elu", "alpha")),), names
        )
    if op == "Celu":
        return Activation(
            "celu", (node.attributes.get_float("alpha", onnx_rules.default("Celu", "alpha")),), names
        )
    if op == "Selu":
        a = node.attributes.get_float("alpha", onnx_rules.default("Selu", "alpha"))
        g = node.attributes.get_float("gamma", onnx_rules.default("Selu", "gamma"))
        return Activation("selu", (a, g), names)
    if op in _SIMPLE:
        return Activation(_SIMPLE[op], (), names)
    if op in ("QuantizeLinear", "DequantizeLinear"):  # per tensor: fused after the producer
        from mconv.targets.gpu.params.quantization import CODE_RANGES, code_type, quant_params

        got = quant_params(ctx, node)
        if isinstance(got, str) or got[0].size != 1:
            return None
        scale, zp = float(got[0][0]), float(got[1][0])
        if op == "DequantizeLinear":
            return Activation("dequantize", (scale, zp), (node.name or "",))
        code = code_type(node)
        assert code is not None
        lo, hi = CODE_RANGES[code]
        return Activation("quantize", (scale, zp, float(lo), float(hi)), (node.name or "",))
    if op in ("Mul", "Add", "Sub", "Div") and len(node.inputs) == 2:  # x op c, c a constant scalar
        c = LowerContext.const(node.inputs[1])
        x = node.inputs[0]
        if (
            c is None
            or c.size != 1
            or x is None
            or x.const_value is not None
            or x.dtype not in (*FLOAT_TYPES, ir.DataType.FLOAT16)
        ):
            return None
        value = float(c.reshape(()))
        kind = {"Mul": "mul", "Add": "add", "Sub": "add", "Div": "div"}[op]
        return Activation(kind, (-value if op == "Sub" else value,), (node.name or "",))
    if op in ("Min", "Max") and len(node.inputs) == 2:  # Min(x, 6) after a Relu: Keras' relu6
        c = LowerContext.const(node.inputs[1])
        if c is None or c.size != 1 or LowerContext.const(node.inputs[0]) is not None:
            return None
        bound = float(c.reshape(()))
        return Activation("clip", (-np.inf, bound) if op == "Min" else (bound, np.inf), names)
    if op == "Clip":
        if ctx.opset < 11 or len(node.inputs) == 1:
            clip_lo = node.attributes.get_float("min", -np.inf) if ctx.opset < 11 else -np.inf
            clip_hi = node.attributes.get_float("max", np.inf) if ctx.opset < 11 else np.inf
            return Activation("clip", (clip_lo, clip_hi), names)
        bounds = []
        for k, default in ((1, -np.inf), (2, np.inf)):
            v = node.inputs[k] if len(node.inputs) > k else None
            if v is None:
                bounds.append(default)
                continue
            arr = LowerContext.const(v)
            if arr is None or arr.size != 1:
                return None
            bounds.append(float(arr.reshape(())))
        return Activation("clip", tuple(bounds), names)
    return None


def tensor_clip(ctx: LowerContext, node: ir.Node) -> tuple[list[ir.Value], str] | None:
    """A Clip (opset 11+) whose min or max is computed or not one value: (operands, expression
    of ``a`` = x, then ``b``, ``c`` = the bounds present), one broadcast kernel; else None."""
    if node.op_type != "Clip" or ctx.opset < 11 or len(node.inputs) < 2 or activation_of(ctx, node):
        return None
    x = node.inputs[0]
    if x is None:
        return None
    operands, expr = [x], "a"
    for k, fn in ((1, "max"), (2, "min")):
        v = node.inputs[k] if len(node.inputs) > k else None
        if v is None:
            continue
        if v.shape is None or any(not isinstance(d, int) for d in v.shape):
            return None
        name = "abc"[len(operands)]
        operands.append(v)
        expr = f"{fn}({expr}, {name})"
    return operands, expr


def check_unary(ctx: LowerContext, node: ir.Node) -> str | None:
    if activation_of(ctx, node) is not None or tensor_clip(ctx, node) is not None:
        return None
    return "bounds that are not constant scalars"


def runtime_gather_axes(graph: ir.Graph) -> list[tuple[str, int]]:
    """(node name, length of the gathered axis) for every Gather whose indices are computed at
    run time (rule 3); for a GatherND, the longest axis its index tuples address."""
    found = []
    for node in graph:
        if (
            node.op_type not in ("Gather", "GatherND")
            or node.domain not in ("", "ai.onnx")
            or len(node.inputs) < 2
        ):
            continue
        x, idx = node.inputs[0], node.inputs[1]
        if x is None or idx is None or idx.const_value is not None or x.shape is None:
            continue
        if node.op_type == "GatherND":  # each component of an index tuple is held as a float
            b = node.attributes.get_int("batch_dims", 0)
            k = idx.shape[-1] if idx.shape is not None and len(idx.shape) else None
            dims = list(x.shape)[b : b + k] if isinstance(k, int) else [0]
            ints = [d for d in dims if isinstance(d, int)]
            n = max(ints, default=1) if len(ints) == len(dims) else 0
            found.append((node.name or "", n))
            continue
        axis = node.attributes.get_int("axis", 0)
        rank = len(x.shape)
        if not -rank <= axis < rank:
            continue
        dim = x.shape[axis]
        found.append((node.name or "", dim if isinstance(dim, int) else 0))
    return found


# op types whose kernel may apply a following activation node (plan rule 3).
FUSIBLE: frozenset[str] = frozenset(
    {
        *("Conv", "ConvTranspose", "Gemm", "MatMul", "BatchNormalization"),
        *("MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool"),
        *("Add", "Sum", "Sub", "Mul", "Div", "Max", "Min", "Mean", "Pow", "PRelu"),
        *("ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean"),
        *("ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare"),
    }
)
# op types whose kernels are exact on integer-valued tensors held as floats (data movement,
# comparisons, logic, Where, Cast, Q/DQ, +, -, *, min, max); the planner refuses integer or bool
# values in any other kernel.
INTEGER_OPS: frozenset[str] = frozenset(
    {
        *("Add", "Sum", "Sub", "Mul", "Max", "Min"),
        *("Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "And", "Or", "Xor", "Not"),
        *("Where", "IsInf", "IsNaN", "Cast", "CastLike", "QuantizeLinear", "DequantizeLinear"),
        *("Concat", "DepthToSpace", "SpaceToDepth", "Expand", "Gather", "GatherND", "Pad", "Slice", "Split"),
        *("Tile", "Transpose"),
    }
)
