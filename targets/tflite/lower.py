"""ONNX (IR, static shapes, constants folded) to a float TFLite graph of builtin ops, NHWC inside.

Rules:

1. Layout. The graph's inputs and outputs keep the model's declared layout (a NCHW model takes
   and gives NCHW arrays, so ``mconv run``/``verify`` feed a bundle what they feed the model).
   Inside, each value lives in one of three layouts: ``orig`` (as ONNX has it), ``nhwc`` (a
   rank-4 value stored ``transpose(x, (0, 2, 3, 1))``) or ``flat`` (a ``Flatten`` of an ``nhwc``
   value, read only by fully connected layers, whose weight columns are permuted to match).
   Convolutions, pools, LRN and global pools read ``nhwc``; elementwise ops, Concat (axis
   remapped), Softmax over channels, reductions with ``keepdims`` (and any reduction over every
   axis to a scalar), Pad and BatchNorm keep their input's layout, their constants transposed to
   it; a computed one-element operand (a dynamic quantization's scale or zero point) broadcasts
   alike in every layout and takes no part in the choice; a Transpose is composed with the layout
   (and vanishes when the composition is the identity, as for an NHWC model's own
   NHWC-to-NCHW Transpose); Reshape and ops not listed read ``orig``. A value is converted at
   most once per layout (one TRANSPOSE, cached), so a conv chain carries no transposes.
2. Each op maps to builtins only; explicit pads that are not TF's SAME become a PAD (PADV2 with
   the float minimum before a max pool); Gemm's alpha/beta and transB fold into the weights.
3. Every node no rule maps is collected; one :class:`~mconv.errors.UnsupportedError` names all.
4. Fused activations: a RELU/RELU6/RELU_N1_TO_1 whose input only it reads, made by a conv, fully
   connected, pool, add, sub, mul or concatenation, becomes that op's fused activation. A RELU
   then MINIMUM with the scalar 6 (Keras's ReLU6) is a RELU6 first (:func:`relu_then_min_six`).
5. QuantizeLinear/DequantizeLinear (QDQ models, per-tensor int8/uint8 on activations; the
   constant weights' DequantizeLinear are folded to float by the preparation) become QUANTIZE and
   DEQUANTIZE (``qdq="ops"``: the model's own fake-quantized float arithmetic), or with
   ``qdq="params"`` each Q->DQ pair vanishes and its (scale, zero point) is kept for the tensor
   (:func:`lower_with_params`), so the full-int8 quantizer uses the model's parameters.
6. A 1-D Conv ([N, C, L]) is a CONV_2D (or DEPTHWISE_CONV_2D) over a unit H axis; its output
   lives in a fourth layout, ``nlc`` (``transpose(x, (0, 2, 1))``), which the next 1-D conv and
   elementwise ops (activations, Clip, BatchNorm) read as is, so a conv1d chain carries no
   transposes; other ops read it back as ``orig``.
7. Resize/Upsample over H and W become RESIZE_NEAREST_NEIGHBOR or RESIZE_BILINEAR with the
   (align_corners, half_pixel_centers) pair that samples exactly the source pixels ONNX's
   coordinate_transformation_mode (and nearest_mode) samples, checked index by index on the
   model's own sizes (:func:`resize_flags`); a mode no pair reproduces (e.g. cubic,
   tf_crop_and_resize, or round_prefer_ceil where it differs) is refused by name.
8. Exact GELU written out with Erf (``x * 0.5 * (1 + erf(x / sqrt(2)))``, the halving and the
   product in any order, as PyTorch's exporters write ``nn.GELU``) is one GELU builtin with
   ``approximate=false`` (:func:`gelu_patterns`): each intermediate value must be read only by
   the next step. LiteRT has no Erf builtin: an Erf outside this pattern is refused by name.
9. IsNaN is NOT_EQUAL(x, x) (true exactly for NaN). Gather with indices computed at run time is
   GATHER after FLOOR_MOD by the axis length, which maps ONNX's negative indices [-n, -1] onto
   [0, n - 1] and leaves [0, n - 1] as they are (constant indices are wrapped here).
10. An 8-bit value a QuantizeLinear made (``qdq="ops"``) keeps its quantization parameters
   through the data movement that follows it (the layout's TRANSPOSE, RESHAPE/Flatten, slices,
   GATHER, SPLIT, MAX_POOL_2D, DEPTH_TO_SPACE, CONCATENATION of inputs with equal parameters):
   the codes are the same numbers, and LiteRT's XNNPACK delegate refuses an 8-bit tensor
   without parameters (:func:`carry_quant`).
11. A DequantizeLinear whose (scale, zero point) are not its input tensor's parameters (ORT's
   QOperator rewrites read codes with scale 1 to compute on the centered integers, and an
   8-bit graph input has none) is CAST of the codes to float, SUB of the zero point and MUL by
   the scale: ONNX's ``(q - zp) * scale`` with its one rounding. DEQUANTIZE where they match.
12. With ``qdq="ops"`` (the float precisions) a QuantizeLinear read only by DequantizeLinears of
   its parameters stays in float: DIV by the scale, ROUND (half to even, as ONNX rounds; LiteRT's
   QUANTIZE multiplies by the scale's reciprocal, which puts values within an ulp of a half on
   the other side of it), MAXIMUM and MINIMUM at
   the type's range less the zero point; each DequantizeLinear is then a MUL by the scale. The
   result is ONNX's ``(saturate(round(x / s) + zp) - zp) * s`` exactly, as ONNX Runtime computes it.
13. Data movement that moves nothing goes (:func:`tidy`): a TRANSPOSE that only moves axes of
   length 1 is a RESHAPE, a chain of RESHAPEs is one, and a RESHAPE to its input's own shape is
   dropped; a PAD whose pads are TF's SAME pads for the VALID conv (or max pool) reading it is
   that op's SAME padding; 8-bit tensors and the graph's inputs and outputs stay as they are.
14. Per-channel constant MUL / ADD / SUB next to a linear layer fold into its weights and bias
   (:func:`fold_affine`): after a FULLY_CONNECTED or convolution without a fused activation, and
   before a FULLY_CONNECTED (LayerNorm's gamma and beta, a layer scale); not before a
   convolution, whose zero padding would see a shift.
15. A FULLY_CONNECTED's float bias that is all zeros is left out (input ``-1``, which LiteRT's
   kernel reads as no bias), as TensorFlow's converter does: randomly initialized Keras models
   and folds that cancel leave such biases, each a tensor and a buffer of its own shape.
16. A small parameter constant the lowering makes (rank <= 1, at most 8 elements: a scalar, axes,
   a shape, a permutation, a clip bound) is one tensor for all the ops that read its value, as
   TensorFlow's converter shares them: each tensor costs its name, shape and table in the file.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx_ir as ir
from mconv.errors import UnsupportedError, show
from mconv.targets.tflite.schema import Graph, Op, Tensor

TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)
_ACT = {"RELU": "RELU", "RELU6": "RELU6", "RELU_N1_TO_1": "RELU_N1_TO_1"}
_FUSES_INTO = {
    "CONV_2D",
    "DEPTHWISE_CONV_2D",
    "FULLY_CONNECTED",
    "ADD",
    "SUB",
    "MUL",
    "MAX_POOL_2D",
    "AVERAGE_POOL_2D",
}
_BINARY = {
    "Add": ("ADD", "AddOptions"),
    "Sub": ("SUB", "SubOptions"),
    "Mul": ("MUL", "MulOptions"),
    "Div": ("DIV", "DivOptions"),
    "Max": ("MAXIMUM", None),
    "Min": ("MINIMUM", None),
    "Pow": ("POW", None),
    "Equal": ("EQUAL", None),
    "Greater": ("GREATER", None),
    "Less": ("LESS", None),
    "GreaterOrEqual": ("GREATER_EQUAL", None),
    "LessOrEqual": ("LESS_EQUAL", None),
    "PRelu": ("PRELU", None),
    "And": ("LOGICAL_AND", None),
    "Or": ("LOGICAL_OR", None),
}

_UNARY = {
    "Relu": "RELU",
    "Sigmoid": "LOGISTIC",
    "Tanh": "TANH",
    "Exp": "EXP",
    "Sqrt": "SQRT",
    "Neg": "NEG",
    "Abs": "ABS",
    "Log": "LOG",
    "HardSwish": "HARD_SWISH",
    "Elu": "ELU",
    "Floor": "FLOOR",
    "Ceil": "CEIL",
    "Sin": "SIN",
    "Cos": "COS",
    "Rsqrt": "RSQRT",
    "Round": "ROUND",
    "Not": "LOGICAL_NOT",
}


def _perm_inverse(p: tuple[int, ...]) -> tuple[int, ...]:
    inv = [0] * len(p)
    for i, v in enumerate(p):
        inv[v] = i
    return tuple(inv)


def same_pads(size: int, k: int, stride: int, dil: int) -> tuple[int, int]:
    """TF's SAME padding (before, after) of one spatial axis: the output is ``ceil(size /
    stride)`` long and the extra row or column goes after."""
    total = max((-(-size // stride) - 1) * stride + (k - 1) * dil + 1 - size, 0)
    return total // 2, total - total // 2


def _static(value: Any) -> list[int]:
    if value.shape is None or not all(isinstance(d, int) for d in value.shape):
        raise UnsupportedError(
            [(show(value.name), "symbolic shape")], what="value", hint="give --input-shape"
        )
    return [int(d) for d in value.shape]


_ROUNDING: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "round_prefer_floor": lambda v: np.ceil(v - 0.5),
    "round_prefer_ceil": lambda v: np.floor(v + 0.5),
    "floor": np.floor,
    "ceil": np.ceil,
}


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _onnx_coords(ctm: str, n_in: int, n_out: int, scale: float) -> np.ndarray | None:
    """ONNX Resize's source coordinate of each output index (None: a mode not computed here)."""
    x = np.arange(n_out, dtype=np.float64)
    if ctm == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if ctm == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if n_out > 1 else np.zeros(n_out)
    if ctm == "align_corners":
        return x * (n_in - 1) / (n_out - 1) if n_out > 1 else np.zeros(n_out)
    if ctm == "asymmetric":
        return x / scale
    if ctm == "tf_half_pixel_for_nn":
        return (x + 0.5) / scale
    return None  # tf_crop_and_resize, half_pixel_symmetric


def _litert_coords(n_in: int, n_out: int, align: bool, half: bool) -> np.ndarray:
    """LiteRT's source coordinate (float32, as its kernels compute it)."""
    f = np.float32
    scale = f(n_in - 1) / f(n_out - 1) if align and n_out > 1 else f(n_in) / f(n_out)
    return (np.arange(n_out, dtype=f) + f(0.5 if half else 0.0)) * scale


def resize_flags(
    mode: str, ctm: str, nearest: str, axes: list[tuple[int, int, float | None]]
) -> tuple[bool, bool] | None:
    """LiteRT's (align_corners, half_pixel_centers) that sample exactly the pixels ONNX's Resize
    samples on every axis (``axes``: (in, out, scale or None) each), or None where none does.

    Nearest: the index maps are compared (ONNX's rounding mode on its coordinate against LiteRT's
    floor, or round with align_corners). Linear: the source coordinates, clamped to the input as
    both runtimes clamp them, must agree to 1e-4 of a pixel."""
    for align, half in ((False, False), (False, True), (True, False)):
        ok = True
        for n_in, n_out, scale in axes:
            want = _onnx_coords(ctm, n_in, n_out, scale if scale else n_out / n_in)
            if want is None:
                return None
            got = _litert_coords(n_in, n_out, align, half)
            if mode == "nearest":
                rounding = _ROUNDING.get(nearest)
                if rounding is None:
                    return None
                w = np.clip(rounding(want), 0, n_in - 1)
                g = np.floor(got + 0.5) if align else np.floor(got)  # TfLiteRound (half away) / floor
                g = np.clip(g, 0, n_in - 1)
                ok = ok and bool(np.array_equal(w, g))
            else:
                got = got - np.float32(0.5) if half else got
                ok = ok and bool(
                    np.allclose(np.clip(want, 0, n_in - 1), np.clip(got, 0, n_in - 1), rtol=0, atol=1e-4)
                )
        if ok:
            return align, half
    return None


def _scalar(value: Any) -> float | None:
    """A constant scalar's value (any rank of one element), or None."""
    const = value.const_value if value is not None else None
    if const is None:
        return None
    a = const.numpy()
    return float(a.reshape(())) if a.size == 1 and a.dtype.kind == "f" else None


def _near(got: float | None, want: float) -> bool:
    return got is not None and abs(got - want) <= 1e-6 * abs(want)


def _other(node: Any, value: Any) -> Any:
    """The input of a binary ``node`` that is not ``value`` (None unless exactly one is)."""
    a, b = node.inputs[0], node.inputs[1]
    return b if a is value and b is not value else a if b is value and a is not value else None


def _sole_reader(value: Any) -> Any:
    """The one node reading ``value`` (None if it has several readers or is a graph output)."""
    uses = list(value.uses())
    if len(uses) != 1 or value.is_graph_output():
        return None
    return uses[0][0] if isinstance(uses[0], tuple) else uses[0].node


def gelu_patterns(graph: Any) -> dict[int, tuple[Any, Any, list[Any]]]:
    """Rule 8: per Erf node's id, (x, the GELU's output value, the pattern's nodes)."""
    found: dict[int, tuple[Any, Any, list[Any]]] = {}
    half, root2 = 0.5, float(np.sqrt(np.float64(2.0)))
    for erf in graph:
        if erf.op_type != "Erf" or erf.domain not in ("", "ai.onnx"):
            continue
        scaled = erf.inputs[0]
        pre = scaled.producer() if scaled is not None else None
        if pre is None or _sole_reader(scaled) is not erf or len(pre.inputs) != 2:
            continue
        if pre.op_type == "Div" and _near(_scalar(pre.inputs[1]), root2):
            x = pre.inputs[0]
        elif pre.op_type == "Mul" and _near(_scalar(pre.inputs[1]), 1 / root2):
            x = pre.inputs[0]
        elif pre.op_type == "Mul" and _near(_scalar(pre.inputs[0]), 1 / root2):
            x = pre.inputs[1]
        else:
            continue
        add = _sole_reader(erf.outputs[0])
        if add is None or add.op_type != "Add" or not _near(_scalar(_other(add, erf.outputs[0])), 1.0):
            continue
        m1 = _sole_reader(add.outputs[0])
        if m1 is None or m1.op_type != "Mul":
            continue
        partner = _other(m1, add.outputs[0])
        nodes = [pre, erf, add, m1]
        if partner is x:  # (x * a) * 0.5
            m2 = _sole_reader(m1.outputs[0])
            if m2 is None or m2.op_type != "Mul" or not _near(_scalar(_other(m2, m1.outputs[0])), half):
                continue
            nodes.append(m2)
            out = m2.outputs[0]
        elif _near(_scalar(partner), half):  # x * (a * 0.5)
            m2 = _sole_reader(m1.outputs[0])
            if m2 is None or m2.op_type != "Mul" or _other(m2, m1.outputs[0]) is not x:
                continue
            nodes.append(m2)
            out = m2.outputs[0]
        else:  # (x * 0.5) * a
            h = partner.producer() if partner is not None else None
            if h is None or h.op_type != "Mul" or _sole_reader(partner) is not m1:
                continue
            if _other(h, x) is None or not _near(_scalar(_other(h, x)), half):
                continue
            nodes.append(h)
            out = m1.outputs[0]
        found[id(erf)] = (x, out, nodes)
    return found


class Lowering:
    def __init__(self, model: ir.Model, qdq: str = "ops") -> None:
        self.model = model
        self.qdq = qdq  # rule 5: "ops" (QUANTIZE/DEQUANTIZE) or "params" (pairs dropped)
        self.qparams: dict[str, tuple[float, int]] = {}  # value name -> int8 (scale, zero point)
        self.centered: set[str] = set()  # rule 12: QuantizeLinear outputs kept as float codes - zp
        self.g = Graph()
        self.consts: dict[str, np.ndarray] = {}
        for name, v in model.graph.initializers.items():
            if v.const_value is not None:
                self.consts[name] = v.const_value.numpy()
        # value name -> layout -> tensor index
        self.at: dict[str, dict[str, int]] = {}
        self.flat: dict[str, tuple[int, int, int]] = {}  # a 'flat' value's (C, H, W)
        self.const_cache: dict[tuple, int] = {}
        self.unsupported: list[tuple[str, str]] = []
        self.consumers: dict[str, list[ir.Node]] = {}
        # rule 8: the last node of each GELU pattern emits it; the pattern's other nodes vanish
        self.gelu_at: dict[int, tuple[Any, Any]] = {}
        self.skip: set[int] = set()
        for x, out, nodes in gelu_patterns(model.graph).values():
            last = max(nodes, key=lambda n: self._order(model.graph, n))
            self.gelu_at[id(last)] = (x, out)
            self.skip.update(id(n) for n in nodes)
        for node in model.graph:
            for i in node.inputs:
                if i is not None:
                    self.consumers.setdefault(str(i.name), []).append(node)

    @staticmethod
    def _order(graph: Any, node: Any) -> int:
        for k, n in enumerate(graph):
            if n is node:
                return k
        raise AssertionError("node not in graph")

    # ---- values
    def layout_of(self, name: str) -> str:
        have = self.at[name]
        return "nhwc" if "nhwc" in have else "flat" if "flat" in have else "orig"

    def is_const(self, v: Any | None) -> bool:
        return v is not None and v.name in self.consts

    def const(self, name: str, array: np.ndarray, dtype: Any = None) -> int:
        a = np.ascontiguousarray(np.asarray(array, dtype=dtype or array.dtype))
        # rule 16: a parameter (a scalar, axes, a shape, a permutation: rank <= 1, at most 8
        # elements) is one tensor for every op that reads its value, named after its first use
        shared = a.ndim <= 1 and a.size <= 8
        key = ("" if shared else name, a.dtype.str, a.shape, a.tobytes())
        if key not in self.const_cache:
            label = (
                name if not any(t.name == name for t in self.g.tensors) else f"{name}_{len(self.g.tensors)}"
            )
            self.const_cache[key] = self.g.const(label, a)
        return self.const_cache[key]

    def new(self, name: str, shape: list[int], dtype: str = "float32") -> int:
        return self.g.add(Tensor(name, list(shape), dtype))

    def op(
        self,
        code: str,
        ins: list[int],
        outs: list[int],
        opt_type: str | None = None,
        label: str | None = "",
        **opts: Any,
    ) -> Op:
        o = Op(code, ins, outs, opt_type, opts, label=label or "")
        self.g.ops.append(o)
        return o

    def transposed(self, idx: int, perm: tuple[int, ...], name: str) -> int:
        t = self.g.tensors[idx]
        out = self.new(name, [t.shape[p] for p in perm], t.dtype)
        self.op(
            "TRANSPOSE",
            [idx, self.const(f"{name}/perm", np.array(perm, np.int32))],
            [out],
            "TransposeOptions",
        )
        return out

    def get(self, v: Any, layout: str = "orig") -> int:
        """The tensor of ``v`` in ``layout`` (a constant transformed, an activation transposed once)."""
        name = v.name
        if name in self.consts:
            a = self.consts[name]
            if a.dtype == np.float64:
                a = a.astype(np.float32)
            if layout == "nhwc":
                a = np.transpose(a.reshape((1,) * (4 - a.ndim) + a.shape), TO_NHWC)
            return self.const(name, a)
        have = self.at[name]
        if layout in have:
            return have[layout]
        if layout == "orig" and "nhwc" in have:
            have["orig"] = self.transposed(have["nhwc"], TO_NCHW, name + "/nchw")
        elif layout == "nhwc" and "orig" in have:
            have["nhwc"] = self.transposed(have["orig"], TO_NHWC, name + "/nhwc")
        elif layout == "orig" and "nlc" in have:
            have["orig"] = self.transposed(have["nlc"], (0, 2, 1), name + "/ncl")
        elif layout == "nlc" and "orig" in have:
            have["nlc"] = self.transposed(have["orig"], (0, 2, 1), name + "/nlc")
        elif layout == "orig" and "flat" in have:
            c, h, w = self.flat[name]
            src = have["flat"]
            n = self.g.tensors[src].shape[0]
            r = self.reshape(src, [n, h, w, c], name + "/hwc")
            nchw = self.transposed(r, TO_NCHW, name + "/nchw")
            have["orig"] = self.reshape(nchw, [n, c * h * w], name + "/chw")
        else:
            raise AssertionError(f"no way from {list(have)} to {layout}")
        return have[layout]

    def reshape(self, src: int, shape: list[int], name: str) -> int:
        out = self.new(name, shape, self.g.tensors[src].dtype)
        self.op(
            "RESHAPE", [src, self.const(f"{name}/shape", np.array(shape, np.int32))], [out], "ReshapeOptions"
        )
        return out

    def out(self, v: Any, layout: str, dtype: str | None = None) -> int:
        """The tensor of ONNX value ``v`` (its dtype unless given) in ``layout``."""
        if dtype is None:
            dtype = v.dtype.numpy().name if v.dtype is not None else "float32"
        shape = _static(v)
        if layout == "nhwc":
            shape = [shape[p] for p in TO_NHWC]
        elif layout == "nlc":
            shape = [shape[0], shape[2], shape[1]]
        idx = self.new(v.name, shape, dtype)
        self.at[v.name] = {layout: idx}
        return idx

    def alias(self, v: Any, src: Any) -> None:
        self.at[v.name] = self.at[src.name]
        if src.name in self.flat:
            self.flat[v.name] = self.flat[src.name]

    # ---- lowering
    def run(self, compacted: bool = True) -> Graph:
        """The lowered graph; ``compacted=False`` keeps the indices ``self.at`` holds."""
        g = self.model.graph
        for v in g.inputs:
            if v.name in self.consts:
                continue
            dtype = v.dtype.numpy().name if v.dtype is not None else "float32"
            idx = self.new(str(v.name), _static(v), dtype)
            self.g.inputs.append(idx)
            self.at[str(v.name)] = {"orig": idx}
        for node in g:
            if id(node) in self.gelu_at:
                self._fused_gelu(node, *self.gelu_at[id(node)])
                continue
            if id(node) in self.skip:
                continue
            handler: Callable[[ir.Node], None] | None = getattr(self, f"_{node.op_type}", None)
            if node.domain not in ("", "ai.onnx") or handler is None:
                self.unsupported.append((show(node.name or node.outputs[0].name), node.op_type))
                continue
            if self.unsupported:  # keep collecting (rule 3): no tensors for values after a gap
                try:
                    handler(node)
                except Exception:  # a value an unsupported node would have made
                    pass
                continue
            handler(node)
        if self.unsupported:
            raise UnsupportedError(
                self.unsupported,
                hint="LiteRT has no builtin op for these; export --target cpu or rewrite them",
            )
        for v in g.outputs:
            if v.name in self.consts:
                idx = self.get(v)
            else:
                idx = self.get(v, "orig")
            t = self.g.tensors[idx]
            if t.name != v.name and idx not in self.g.outputs and idx not in self.g.inputs and t.data is None:
                t.name = str(v.name)  # an alias (Identity, a vanished Transpose): the output's name
            if self.g.tensors[idx].name != v.name or idx in self.g.outputs:  # shared, or a constant
                t = self.g.tensors[idx]
                out = self.new(str(v.name), t.shape, t.dtype)
                self.reshape_to(idx, out)
                idx = out
            self.g.outputs.append(idx)
        carry_quant(self.g)
        fuse_activations(self.g)
        tidy(self.g)
        fold_affine(self.g)
        drop_zero_bias(self.g)
        return compact(self.g) if compacted else self.g

    def reshape_to(self, src: int, out: int) -> None:
        shape = self.g.tensors[out].shape
        self.op("RESHAPE", [src, self.const("shape", np.array(shape, np.int32))], [out], "ReshapeOptions")

    # ---- helpers
    def attr(self, node: Any, name: str, default: Any = None) -> Any:
        a = node.attributes.get(name)
        return default if a is None else a.value

    def refuse(self, node: Any, why: str) -> None:
        self.unsupported.append((show(node.name or node.outputs[0].name), f"{node.op_type}({why})"))

    def _pads(
        self,
        node: Any,
        x_shape: list[int],
        k: list[int],
        s: list[int],
        d: list[int],
        out: list[int],
        explicit: list[int] | None = None,
    ) -> tuple[str, list[int]]:
        """'SAME', 'VALID', or 'EXPLICIT' with [top, left, bottom, right] pads (rule 2)."""
        auto = self.attr(node, "auto_pad", "NOTSET")
        if isinstance(auto, bytes):
            auto = auto.decode()
        h, w = x_shape[2], x_shape[3]
        same = [same_pads(h, k[0], s[0], d[0]), same_pads(w, k[1], s[1], d[1])]
        if auto == "VALID":
            return "VALID", [0, 0, 0, 0]
        if auto == "SAME_UPPER":
            return "SAME", []
        if auto == "SAME_LOWER":
            pads = [same[0][1], same[1][1], same[0][0], same[1][0]]
        else:
            pads = explicit if explicit is not None else list(self.attr(node, "pads", [0, 0, 0, 0]))
        # ceil_mode: more bottom/right pad until a VALID window count reaches ONNX's
        for i, (size, kk, ss, dd) in enumerate(((h, k[0], s[0], d[0]), (w, k[1], s[1], d[1]))):
            while (size + pads[i] + pads[i + 2] - (kk - 1) * dd - 1) // ss + 1 < out[i]:
                pads[i + 2] += 1
        if not any(pads):
            return "VALID", pads
        if (
            (pads[0], pads[2]) == same[0]
            and (pads[1], pads[3]) == same[1]
            and out == [-(-h // s[0]), -(-w // s[1])]
        ):
            return "SAME", pads
        return "EXPLICIT", pads

    def _padded(self, x: int, pads: list[int], name: str, value: float | None = None) -> int:
        t = self.g.tensors[x]
        n, h, w, c = t.shape
        shape = [n, h + pads[0] + pads[2], w + pads[1] + pads[3], c]
        out = self.new(name, shape)
        p = self.const(
            f"{name}/paddings", np.array([[0, 0], [pads[0], pads[2]], [pads[1], pads[3]], [0, 0]], np.int32)
        )
        if value is None:
            self.op("PAD", [x, p], [out], "PadOptions")
        else:
            v = self.const(f"{name}/value", np.array(value, np.float32))
            self.op("PADV2", [x, p, v], [out], "PadV2Options")
        return out

    # ---- ops
    def _Conv(self, node: Any) -> None:
        """A 2-D conv on ``nhwc``; a 1-D conv as a CONV_2D over a unit H axis (rule 6)."""
        xv, wv = node.inputs[0], node.inputs[1]
        bv = node.inputs[2] if len(node.inputs) > 2 else None
        if not self.is_const(wv) or (bv is not None and not self.is_const(bv)):
            return self.refuse(node, "weights not constant")
        w = self.consts[wv.name].astype(np.float32)
        if w.ndim not in (3, 4):
            return self.refuse(node, f"{w.ndim - 2}-D")
        xs, ys = _static(xv), _static(node.outputs[0])
        group = int(self.attr(node, "group", 1))
        o = w.shape[0]
        b = self.consts[bv.name].astype(np.float32) if bv is not None else np.zeros(o, np.float32)
        one_d = w.ndim == 3
        if one_d:  # [N, C, L] as [N, C, 1, L]
            w = w[:, :, None, :]
            xs, ys = [xs[0], xs[1], 1, xs[2]], [ys[0], ys[1], 1, ys[2]]
            s = [1, *self.attr(node, "strides", [1])]
            d = [1, *self.attr(node, "dilations", [1])]
            p1 = list(self.attr(node, "pads", [0, 0]))
            pads_attr: list[int] | None = [0, p1[0], 0, p1[1]]
        else:
            s = list(self.attr(node, "strides", [1, 1]))
            d = list(self.attr(node, "dilations", [1, 1]))
            pads_attr = None
        k = list(w.shape[2:])
        mode, pads = self._pads(node, xs, k, s, d, ys[2:], pads_attr)
        if group == 1:
            code, opt, wt = "CONV_2D", "Conv2DOptions", np.transpose(w, (0, 2, 3, 1))
            extra: dict[str, Any] = {}
        elif group == xs[1] and w.shape[1] == 1:
            code, opt, wt = "DEPTHWISE_CONV_2D", "DepthwiseConv2DOptions", np.transpose(w, (1, 2, 3, 0))
            extra = {"DepthMultiplier": o // group}
        elif xs[1] % group == 0 and o % group == 0:
            code, opt, wt, extra = "", "", w, {}
        else:
            return self.refuse(node, f"group={group}")
        yv = node.outputs[0]
        if one_d:
            xl = self.get(xv, "nlc")
            x = self.reshape(xl, [xs[0], 1, xs[3], xs[1]], yv.name + "/in_nhwc")
            y = self.new(yv.name + "/nhwc", [ys[0], 1, ys[3], ys[1]])
        else:
            x = self.get(xv, "nhwc")
            y = -1
        if not code:
            y = self._grouped(node, x, y, w, b, group, mode, pads, s, d)
        else:
            if mode == "EXPLICIT":
                x = self._padded(x, pads, yv.name + "/pad")
                mode = "VALID"
            if y < 0:
                y = self.out(yv, "nhwc")
            self.op(
                code,
                [x, self.const(wv.name, wt), self.const(bv.name if bv else f"{wv.name}/bias", b)],
                [y],
                opt,
                label=node.name,
                Padding=0 if mode == "SAME" else 1,
                StrideH=s[0],
                StrideW=s[1],
                DilationHFactor=d[0],
                DilationWFactor=d[1],
                **extra,
            )
        if one_d:
            self.at[yv.name] = {"nlc": self.reshape(y, [ys[0], ys[3], ys[1]], yv.name + "/nlc")}

    def _ConvTranspose(self, node: Any) -> None:
        """TRANSPOSE_CONV (VALID, bias as its fourth input) on ``nhwc``; ONNX's pads and
        output_padding as a STRIDED_SLICE of the full output. Groups and dilations are refused."""
        xv, wv = node.inputs[0], node.inputs[1]
        bv = node.inputs[2] if len(node.inputs) > 2 else None
        if not self.is_const(wv) or (bv is not None and not self.is_const(bv)):
            return self.refuse(node, "weights not constant")
        w = self.consts[wv.name].astype(np.float32)  # [C_in, C_out, kh, kw]
        if w.ndim != 4:
            return self.refuse(node, f"{w.ndim - 2}-D")
        if int(self.attr(node, "group", 1)) != 1:
            return self.refuse(node, "group")
        if any(v != 1 for v in self.attr(node, "dilations", [1, 1])):
            return self.refuse(node, "dilations")
        if _text(self.attr(node, "auto_pad", "NOTSET")) not in ("NOTSET", "VALID"):
            return self.refuse(node, "auto_pad")
        xs, ys = _static(xv), _static(node.outputs[0])
        s = list(self.attr(node, "strides", [1, 1]))
        k = list(w.shape[2:])
        o = w.shape[1]
        full = [(xs[2] - 1) * s[0] + k[0], (xs[3] - 1) * s[1] + k[1]]
        pads = list(self.attr(node, "pads", [0, 0, 0, 0]))
        begin = [pads[0], pads[1]]
        if any(begin[i] + ys[2 + i] > full[i] for i in range(2)):
            return self.refuse(node, "output_padding beyond the full output")
        b = self.consts[bv.name].astype(np.float32) if bv is not None else np.zeros(o, np.float32)
        x = self.get(xv, "nhwc")
        name = node.outputs[0].name
        cut = begin != [0, 0] or full != ys[2:]
        y = self.new(name + "/full", [xs[0], *full, o]) if cut else self.out(node.outputs[0], "nhwc")
        self.op(
            "TRANSPOSE_CONV",
            [
                self.const(f"{name}/output_shape", np.array([xs[0], *full, o], np.int32)),
                self.const(wv.name, np.transpose(w, (1, 2, 3, 0))),
                x,
                self.const(bv.name if bv else f"{wv.name}/bias", b),
            ],
            [y],
            "TransposeConvOptions",
            label=node.name,
            Padding=1,
            StrideH=s[0],
            StrideW=s[1],
        )
        if cut:
            out = self.out(node.outputs[0], "nhwc")
            c = [
                self.const(f"{name}/{key}", np.array(v, np.int32))
                for key, v in (
                    ("begin", [0, begin[0], begin[1], 0]),
                    ("end", [xs[0], begin[0] + ys[2], begin[1] + ys[3], o]),
                    ("strides", [1, 1, 1, 1]),
                )
            ]
            self.op("STRIDED_SLICE", [y, *c], [out], "StridedSliceOptions")

    def _grouped(
        self,
        node: Any,
        x: int,
        y: int,
        w: np.ndarray,
        b: np.ndarray,
        group: int,
        mode: str,
        pads: list[int],
        s: list[int],
        d: list[int],
    ) -> int:
        """A grouped conv: SPLIT along channels, one CONV_2D per group, CONCATENATION; its output
        is ``y`` (a new ``nhwc`` tensor of the node's output where -1)."""
        name = node.outputs[0].name
        if mode == "EXPLICIT":
            x = self._padded(x, pads, name + "/pad")
            mode = "VALID"
        n, h, ww, c = self.g.tensors[x].shape
        parts = [self.new(f"{name}/in{i}", [n, h, ww, c // group]) for i in range(group)]
        self.op(
            "SPLIT", [self.const("axis_c", np.array(3, np.int32)), x], parts, "SplitOptions", NumSplits=group
        )
        if y < 0:
            y = self.out(node.outputs[0], "nhwc")
        oshape = self.g.tensors[y].shape
        og = w.shape[0] // group
        outs = []
        for i in range(group):
            t = self.new(f"{name}/out{i}", [*oshape[:3], og])
            wi = np.transpose(w[i * og : (i + 1) * og], (0, 2, 3, 1))
            self.op(
                "CONV_2D",
                [
                    parts[i],
                    self.const(f"{name}/w{i}", wi),
                    self.const(f"{name}/b{i}", b[i * og : (i + 1) * og]),
                ],
                [t],
                "Conv2DOptions",
                Padding=0 if mode == "SAME" else 1,
                StrideH=s[0],
                StrideW=s[1],
                DilationHFactor=d[0],
                DilationWFactor=d[1],
            )
            outs.append(t)
        self.op("CONCATENATION", outs, [y], "ConcatenationOptions", label=node.name, Axis=3)
        return y

    def _Sum(self, node: Any) -> None:
        """Sum of n inputs: a chain of ADDs (ADD has an int8 kernel, ADD_N has none)."""
        ins = [v for v in node.inputs if v is not None]
        yv = node.outputs[0]
        rank = len(_static(yv))
        acts = [v for v in ins if not self.is_const(v)]
        nhwc = (
            rank == 4
            and all(len(_static(v)) == 4 for v in acts)
            and any(self.layout_of(v.name) == "nhwc" for v in acts)
        )
        layout = "nhwc" if nhwc else "orig"
        if len(ins) == 1:
            return self.alias(yv, ins[0])
        acc = self.get(ins[0], layout)
        y = self.out(yv, layout)
        for k, v in enumerate(ins[1:], 1):
            dest = y if k == len(ins) - 1 else self.new(f"{yv.name}/{k}", self.g.tensors[y].shape)
            self.op("ADD", [acc, self.get(v, layout)], [dest], "AddOptions", label=node.name)
            acc = dest

    def _pool(self, node: Any, code: str) -> None:
        xv, yv = node.inputs[0], node.outputs[0]
        xs, ys = _static(xv), _static(yv)
        one_d = len(xs) == 3  # rule 6: over a unit H axis
        if len(xs) not in (3, 4):
            return self.refuse(node, f"{len(xs) - 2}-D")
        lead = [1] if one_d else []
        k = lead + list(self.attr(node, "kernel_shape"))
        s = lead + list(self.attr(node, "strides", [1] * (len(xs) - 2)))
        d = lead + list(self.attr(node, "dilations", [1] * (len(xs) - 2)))
        if any(v != 1 for v in d):
            return self.refuse(node, "dilations")
        explicit = None
        if one_d:
            p1 = list(self.attr(node, "pads", [0, 0]))
            explicit = [0, p1[0], 0, p1[1]]
            xs, ys = [xs[0], xs[1], 1, xs[2]], [ys[0], ys[1], 1, ys[2]]
            x = self.reshape(self.get(xv, "nlc"), [xs[0], 1, xs[3], xs[1]], yv.name + "/in_nhwc")
        else:
            x = self.get(xv, "nhwc")
        mode, pads = self._pads(node, xs, k, s, d, ys[2:], explicit)
        counts = None
        if mode == "EXPLICIT":
            if code == "MAX_POOL_2D":
                x = self._padded(x, pads, node.outputs[0].name + "/pad", float(np.finfo(np.float32).min))
            else:
                x = self._padded(x, pads, node.outputs[0].name + "/pad")
                if not self.attr(node, "count_include_pad", 0):
                    # the window's real elements: zero pads summed, then k*k / count per position
                    ones = np.pad(np.ones(xs[2:]), [(pads[0], pads[2]), (pads[1], pads[3])])
                    counts = np.array(
                        [
                            [
                                ones[i * s[0] : i * s[0] + k[0], j * s[1] : j * s[1] + k[1]].sum()
                                for j in range(ys[3])
                            ]
                            for i in range(ys[2])
                        ]
                    )
            mode = "VALID"
        elif mode == "SAME" and code == "AVERAGE_POOL_2D" and self.attr(node, "count_include_pad", 0):
            x = self._padded(x, pads, node.outputs[0].name + "/pad")
            mode = "VALID"
        y = self.out(yv, "nhwc") if not one_d else self.new(yv.name + "/nhwc", [ys[0], 1, ys[3], ys[1]])
        self._pool_op(node, code, x, y, mode, k, s, counts, ys)
        if one_d:  # the pool's output read back as [N, L, C]
            self.at[yv.name] = {"nlc": self.reshape(y, [ys[0], ys[3], ys[1]], yv.name + "/nlc")}

    def _pool_op(
        self,
        node: Any,
        code: str,
        x: int,
        y: int,
        mode: str,
        k: list[int],
        s: list[int],
        counts: np.ndarray | None,
        ys: list[int],
    ) -> None:
        if counts is not None:
            if (counts == 0).any():
                return self.refuse(node, "a window of pads only")
            pooled = self.new(node.outputs[0].name + "/sum", self.g.tensors[y].shape)
            factor = (k[0] * k[1] / counts).astype(np.float32).reshape(1, ys[2], ys[3], 1)
            self.op(
                code,
                [x],
                [pooled],
                "Pool2DOptions",
                Padding=1,
                StrideH=s[0],
                StrideW=s[1],
                FilterHeight=k[0],
                FilterWidth=k[1],
            )
            self.op(
                "MUL",
                [pooled, self.const(node.outputs[0].name + "/count", factor)],
                [y],
                "MulOptions",
                label=node.name,
            )
            return
        self.op(
            code,
            [x],
            [y],
            "Pool2DOptions",
            label=node.name,
            Padding=0 if mode == "SAME" else 1,
            StrideH=s[0],
            StrideW=s[1],
            FilterHeight=k[0],
            FilterWidth=k[1],
        )

    def _MaxPool(self, node: Any) -> None:
        if len(node.outputs) > 1 and node.outputs[1] is not None and node.outputs[1].name:
            return self.refuse(node, "indices")
        self._pool(node, "MAX_POOL_2D")

    def _AveragePool(self, node: Any) -> None:
        self._pool(node, "AVERAGE_POOL_2D")

    def _global(self, node: Any, code: str) -> None:
        xv = node.inputs[0]
        if len(_static(xv)) != 4:
            return self.refuse(node, "rank")
        x = self.get(xv, "nhwc")
        y = self.out(node.outputs[0], "nhwc")
        self.op(
            code,
            [x, self.const("axes_hw", np.array([1, 2], np.int32))],
            [y],
            "ReducerOptions",
            label=node.name,
            KeepDims=True,
        )

    def _GlobalAveragePool(self, node: Any) -> None:
        self._global(node, "MEAN")

    def _GlobalMaxPool(self, node: Any) -> None:
        self._global(node, "REDUCE_MAX")

    def _fc(self, node: Any, av: Any, w: np.ndarray, b: np.ndarray | None) -> None:
        """A fully connected layer with ``w`` [out, in]; a 'flat' input permutes its columns."""
        rank = len(_static(av))
        if self.layout_of(av.name) == "flat" and rank == 2:
            c, h, ww = self.flat[av.name]
            a = self.at[av.name]["flat"]
            w = w.reshape(w.shape[0], c, h, ww).transpose(0, 2, 3, 1).reshape(w.shape[0], -1)
        else:
            a = self.get(av, "orig")
        y = self.out(node.outputs[0], "orig")
        name = node.inputs[1].name
        bias = self.const(f"{name}/bias", b.astype(np.float32)) if b is not None else -1
        self.op(
            "FULLY_CONNECTED",
            [a, self.const(name, np.ascontiguousarray(w, np.float32)), bias],
            [y],
            "FullyConnectedOptions",
            label=node.name,
            KeepNumDims=rank > 2,
        )

    def _Gemm(self, node: Any) -> None:
        av, bv = node.inputs[0], node.inputs[1]
        cv = node.inputs[2] if len(node.inputs) > 2 else None
        if (
            self.attr(node, "transA", 0)
            or not self.is_const(bv)
            or (cv is not None and not self.is_const(cv))
        ):
            return self.refuse(node, "transA or non-constant B/C")
        w = self.consts[bv.name].astype(np.float32)
        w = (w if self.attr(node, "transB", 0) else w.T) * float(self.attr(node, "alpha", 1.0))
        b = None
        if cv is not None:
            c = self.consts[cv.name].astype(np.float32) * float(self.attr(node, "beta", 1.0))
            if c.size not in (1, w.shape[0]):
                return self.refuse(node, "C not a bias vector")
            b = np.broadcast_to(c.reshape(-1), (w.shape[0],)).copy()
        self._fc(node, av, w, b)

    def _MatMul(self, node: Any) -> None:
        av, bv = node.inputs
        if self.is_const(bv) and self.consts[bv.name].ndim == 2:
            return self._fc(node, av, self.consts[bv.name].astype(np.float32).T, None)
        y = self.out(node.outputs[0], "orig")
        self.op("BATCH_MATMUL", [self.get(av), self.get(bv)], [y], "BatchMatMulOptions", label=node.name)

    def _reshape(self, node: Any) -> None:
        xv, yv = node.inputs[0], node.outputs[0]
        xs, ys = _static(xv), _static(yv)
        readers = self.consumers.get(yv.name, [])
        if (
            self.layout_of(xv.name) == "nhwc"
            and len(ys) == 2
            and ys == [xs[0], xs[1] * xs[2] * xs[3]]
            and readers
            and all(
                n.op_type in ("Gemm", "MatMul")
                and n.inputs[0] is yv
                and self.is_const(n.inputs[1])
                and not self.attr(n, "transA", 0)
                for n in readers
            )
            and yv not in self.model.graph.outputs
        ):  # rule 1: flat, the FC weights permuted instead of a transpose
            out = self.reshape(self.at[xv.name]["nhwc"], ys, yv.name)
            self.at[yv.name] = {"flat": out}
            self.flat[yv.name] = (xs[1], xs[2], xs[3])
            return
        x = self.get(xv, "orig")
        out = self.reshape(x, ys, yv.name)
        self.at[yv.name] = {"orig": out}

    _Flatten = _Reshape = _Squeeze = _Unsqueeze = _reshape

    def _Identity(self, node: Any) -> None:
        self.alias(node.outputs[0], node.inputs[0])

    _Dropout = _Identity

    def _Transpose(self, node: Any) -> None:
        xv, yv = node.inputs[0], node.outputs[0]
        rank = len(_static(xv))
        perm = tuple(self.attr(node, "perm", list(range(rank))[::-1]))
        layout = self.layout_of(xv.name) if self.layout_of(xv.name) != "flat" else "orig"
        if layout == "flat":
            layout = "orig"
        x = self.get(xv, layout)
        q = TO_NHWC if layout == "nhwc" else tuple(range(rank))
        inv = _perm_inverse(q)
        e = tuple(inv[perm[k]] for k in range(rank))  # orig_out = transpose(stored_in, e)
        options = [("orig", e)]
        if rank == 4:
            options.append(("nhwc", tuple(e[TO_NHWC[k]] for k in range(4))))
        for lay, p in options:
            if p == tuple(range(rank)):
                self.at[yv.name] = {lay: x}
                return
        y = self.out(yv, "orig")
        self.op(
            "TRANSPOSE",
            [x, self.const(f"{yv.name}/perm", np.array(e, np.int32))],
            [y],
            "TransposeOptions",
            label=node.name,
        )

    def _Concat(self, node: Any) -> None:
        yv = node.outputs[0]
        rank = len(_static(yv))
        axis = int(self.attr(node, "axis")) % rank
        acts = [v for v in node.inputs if v is not None and not self.is_const(v)]
        layout = "nhwc" if rank == 4 and any(self.layout_of(v.name) == "nhwc" for v in acts) else "orig"
        ins = [self.get(v, layout) for v in node.inputs if v is not None]
        if layout == "nhwc":
            axis = TO_NHWC.index(axis)
        y = self.out(yv, layout)
        self.op("CONCATENATION", ins, [y], "ConcatenationOptions", label=node.name, Axis=axis)

    def _binary(self, node: Any) -> None:
        code, opt = _BINARY[node.op_type]
        yv = node.outputs[0]
        layout = self._shared_layout(node)
        ins = [self._operand(v, layout) for v in node.inputs]
        y = self.out(yv, layout)
        self.op(code, ins, [y], opt, label=node.name)

    def _shared_layout(self, node: Any) -> str:
        """The layout of a broadcasting op of a rank-4 output: NHWC where every computed input
        of more than one element is rank 4 and one of them is NHWC already. A computed input of
        one element (a dynamic quantization's scale or zero point) takes no part: it broadcasts
        the same in every layout."""
        rank = len(_static(node.outputs[0]))
        acts = [v for v in node.inputs if not self.is_const(v) and int(np.prod(_static(v))) != 1]
        nhwc = (
            rank == 4
            and all(len(_static(v)) == 4 for v in acts)
            and any(self.layout_of(v.name) == "nhwc" for v in acts)
        )
        return "nhwc" if nhwc else "orig"

    def _operand(self, v: Any, layout: str) -> int:
        """A broadcasting op's input in ``layout``; a computed one-element input as it is."""
        if not self.is_const(v) and int(np.prod(_static(v))) == 1:
            return self.get(v, self._keep_layout(v))
        return self.get(v, layout)

    _Add = _Sub = _Mul = _Div = _Max = _Min = _Pow = _binary
    _Equal = _Greater = _Less = _GreaterOrEqual = _LessOrEqual = _PRelu = _And = _Or = _binary

    def _Where(self, node: Any) -> None:
        yv = node.outputs[0]
        layout = self._shared_layout(node)
        ins = [self._operand(v, layout) for v in node.inputs]
        y = self.out(yv, layout)
        self.op("SELECT_V2", ins, [y], label=node.name)

    def _Slice(self, node: Any) -> None:
        xv = node.inputs[0]
        dims = _static(xv)
        rank = len(dims)
        consts: list[Any] = []
        for i in range(1, 5):
            v = node.inputs[i] if len(node.inputs) > i else None
            if v is not None and not self.is_const(v):
                return self.refuse(node, "starts/ends not constant")
            consts.append(None if v is None else list(self.consts[v.name].astype(np.int64).tolist()))
        starts, ends, axes, steps = consts
        if starts is None or ends is None:
            return self.refuse(node, "no starts/ends")
        axes = [a % rank for a in (axes if axes is not None else range(len(starts)))]
        steps = steps if steps is not None else [1] * len(axes)
        begin, end, stride = [0] * rank, list(dims), [1] * rank
        for a, st, en, sp in zip(axes, starts, ends, steps):
            if sp < 0:
                return self.refuse(node, "negative step")
            st = max(0, min(st + dims[a] if st < 0 else st, dims[a]))
            en = max(0, min(en + dims[a] if en < 0 else en, dims[a]))
            begin[a], end[a], stride[a] = st, en, sp
        layout = self._keep_layout(xv) if rank == 4 else "orig"
        if layout == "nhwc":
            begin, end, stride = ([lst[p] for p in TO_NHWC] for lst in (begin, end, stride))
        x = self.get(xv, layout)
        y = self.out(node.outputs[0], layout)
        c = [
            self.const(f"{node.outputs[0].name}/{k}", np.array(v, np.int32))
            for k, v in (("begin", begin), ("end", end), ("strides", stride))
        ]
        self.op("STRIDED_SLICE", [x, *c], [y], "StridedSliceOptions", label=node.name)

    def _Split(self, node: Any) -> None:
        """SPLIT (equal parts) or SPLIT_V, in the input's layout; the parts' sizes are the
        outputs' static shapes (so the ``split`` input, attribute or ``num_outputs`` agree)."""
        xv = node.inputs[0]
        rank = len(_static(xv))
        axis = int(self.attr(node, "axis", 0)) % rank
        outs = list(node.outputs)
        if any(o is None or not o.name for o in outs):
            return self.refuse(node, "an output left out")
        sizes = [_static(o)[axis] for o in outs]
        layout = self._keep_layout(xv) if rank == 4 else "orig"
        ax = TO_NHWC.index(axis) if layout == "nhwc" else axis
        x = self.get(xv, layout)
        ys = [self.out(o, layout) for o in outs]
        axis_t = self.const(f"{outs[0].name}/axis", np.array(ax, np.int32))
        if len(set(sizes)) == 1:
            self.op("SPLIT", [axis_t, x], ys, "SplitOptions", label=node.name, NumSplits=len(ys))
        else:
            sz = self.const(f"{outs[0].name}/sizes", np.array(sizes, np.int32))
            self.op("SPLIT_V", [x, sz, axis_t], ys, "SplitVOptions", label=node.name, NumSplits=len(ys))

    def _Resize(self, node: Any) -> None:
        """RESIZE_NEAREST_NEIGHBOR / RESIZE_BILINEAR over H and W (rule 7)."""
        mode = _text(self.attr(node, "mode", "nearest"))
        ctm = _text(self.attr(node, "coordinate_transformation_mode", "half_pixel"))
        nearest = _text(self.attr(node, "nearest_mode", "round_prefer_floor"))
        scales = None
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            if not self.is_const(node.inputs[2]):
                return self.refuse(node, "scales not constant")
            scales = self.consts[node.inputs[2].name].astype(np.float64).ravel()
        self._resize(node, mode, ctm, nearest, scales)

    def _Upsample(self, node: Any) -> None:
        """Upsample (opsets 7-9): Resize with asymmetric coordinates, nearest rounding down."""
        scales = self.attr(node, "scales", None)
        if scales is None and len(node.inputs) > 1:
            if not self.is_const(node.inputs[1]):
                return self.refuse(node, "scales not constant")
            scales = self.consts[node.inputs[1].name]
        mode = _text(self.attr(node, "mode", "nearest"))
        arr = None if scales is None else np.asarray(scales, np.float64).ravel()
        self._resize(node, mode, "asymmetric", "floor", arr)

    def _resize(self, node: Any, mode: str, ctm: str, nearest: str, scales: np.ndarray | None) -> None:
        xv, yv = node.inputs[0], node.outputs[0]
        xs, ys = _static(xv), _static(yv)
        if len(xs) != 4 or xs[:2] != ys[:2]:
            return self.refuse(node, "not over H and W of a 4-D tensor")
        if int(self.attr(node, "antialias", 0)):
            return self.refuse(node, "antialias")
        if _text(self.attr(node, "keep_aspect_ratio_policy", "stretch")) != "stretch":
            return self.refuse(node, "keep_aspect_ratio_policy")
        if mode not in ("nearest", "linear"):
            return self.refuse(node, f"mode {mode}")
        if scales is not None and scales.size == 0:
            scales = None
        if scales is not None and scales.size != 4:
            return self.refuse(node, "axes")
        flags = resize_flags(
            mode,
            ctm,
            nearest,
            [(xs[i], ys[i], None if scales is None else float(scales[i])) for i in (2, 3)],
        )
        if flags is None:
            what = f"coordinate_transformation_mode {ctm}"
            return self.refuse(node, what + (f", nearest_mode {nearest}" if mode == "nearest" else ""))
        align, half = flags
        code, opt = (
            ("RESIZE_BILINEAR", "ResizeBilinearOptions")
            if mode == "linear"
            else ("RESIZE_NEAREST_NEIGHBOR", "ResizeNearestNeighborOptions")
        )
        x = self.get(xv, "nhwc")
        y = self.out(yv, "nhwc")
        size = self.const(f"{yv.name}/size", np.array(ys[2:], np.int32))
        self.op(code, [x, size], [y], opt, label=node.name, AlignCorners=align, HalfPixelCenters=half)

    def _DepthToSpace(self, node: Any) -> None:
        """DEPTH_TO_SPACE on ``nhwc``: TF's order is ONNX's DCR; CRD is refused."""
        if _text(self.attr(node, "mode", "DCR")) != "DCR":
            return self.refuse(node, "mode CRD")
        x = self.get(node.inputs[0], "nhwc")
        y = self.out(node.outputs[0], "nhwc")
        bs = int(self.attr(node, "blocksize"))
        self.op("DEPTH_TO_SPACE", [x], [y], "DepthToSpaceOptions", label=node.name, BlockSize=bs)

    def _Cast(self, node: Any) -> None:
        xv, yv = node.inputs[0], node.outputs[0]
        layout = self._keep_layout(xv)
        x = self.get(xv, layout)
        y = self.out(yv, layout)
        if self.g.tensors[x].dtype == self.g.tensors[y].dtype:
            self.g.tensors.pop()
            self.at[yv.name] = self.at[xv.name] if xv.name in self.at else {layout: x}
            return
        self.op("CAST", [x], [y], label=node.name)

    def _Reciprocal(self, node: Any) -> None:
        xv = node.inputs[0]
        layout = self._elementwise_layout(xv)
        x = self.get(xv, layout)
        y = self.out(node.outputs[0], layout)
        one = self.const("one", np.array(1.0, np.float32))
        self.op("DIV", [one, x], [y], "DivOptions", label=node.name)

    def _ReduceSumSquare(self, node: Any) -> None:
        """x * x, then SUM."""
        xv = node.inputs[0]
        layout = self._keep_layout(xv)
        x = self.get(xv, layout)
        sq = self.new(node.outputs[0].name + "/sq", self.g.tensors[x].shape)
        self.op("MUL", [x, x], [sq], "MulOptions")
        self.at[node.outputs[0].name + "/sq"] = {layout: sq}
        self._reduce(node, "SUM", source=sq, layout=layout)

    def _LayerNormalization(self, node: Any) -> None:
        """(x - mean) * rsqrt(var + eps) * scale + bias over the trailing axes: MEAN, SUB, MUL,
        MEAN, ADD, RSQRT, MUL, MUL, ADD (LiteRT has no layer norm builtin), in ONNX's layout."""
        xv, yv = node.inputs[0], node.outputs[0]
        if len(node.outputs) > 1 and any(o is not None and o.name for o in node.outputs[1:]):
            return self.refuse(node, "mean/inv_std outputs")
        if not all(self.is_const(v) for v in node.inputs[1:] if v is not None):
            return self.refuse(node, "scale/bias not constant")
        dims = _static(xv)
        rank = len(dims)
        axis = int(self.attr(node, "axis", -1)) % rank
        axes = self.const(f"{yv.name}/axes", np.arange(axis, rank, dtype=np.int32))
        eps = float(self.attr(node, "epsilon", 1e-5))
        x = self.get(xv, "orig")
        name = str(yv.name)
        red = [*dims[:axis], *([1] * (rank - axis))]

        def t(suffix: str, shape: list[int]) -> int:
            return self.new(f"{name}/{suffix}", shape)

        mean = t("mean", red)
        self.op("MEAN", [x, axes], [mean], "ReducerOptions", KeepDims=True)
        d = t("centered", dims)
        self.op("SUB", [x, mean], [d], "SubOptions")
        sq = t("sq", dims)
        self.op("MUL", [d, d], [sq], "MulOptions")
        var = t("var", red)
        self.op("MEAN", [sq, axes], [var], "ReducerOptions", KeepDims=True)
        ve = t("var_eps", red)
        self.op("ADD", [var, self.const(f"{name}/eps", np.array(eps, np.float32))], [ve], "AddOptions")
        inv = t("inv_std", red)
        self.op("RSQRT", [ve], [inv])
        n = t("normed", dims)
        self.op("MUL", [d, inv], [n], "MulOptions")
        tail = dims[axis:]
        scale = self.consts[node.inputs[1].name].astype(np.float32)
        bias = (
            self.consts[node.inputs[2].name].astype(np.float32)
            if len(node.inputs) > 2 and node.inputs[2] is not None
            else None
        )
        y = self.out(yv, "orig")
        if bias is None:
            self.op(
                "MUL",
                [n, self.const(f"{name}/scale", np.broadcast_to(scale, tail).copy())],
                [y],
                "MulOptions",
                label=node.name,
            )
            return
        sc = t("scaled", dims)
        self.op(
            "MUL", [n, self.const(f"{name}/scale", np.broadcast_to(scale, tail).copy())], [sc], "MulOptions"
        )
        self.op(
            "ADD",
            [sc, self.const(f"{name}/bias", np.broadcast_to(bias, tail).copy())],
            [y],
            "AddOptions",
            label=node.name,
        )

    def _Gather(self, node: Any) -> None:
        """GATHER in ONNX's layout; negative indices wrapped (constant ones here, computed ones
        by FLOOR_MOD: rule 9)."""
        xv, iv = node.inputs[0], node.inputs[1]
        dims = _static(xv)
        axis = int(self.attr(node, "axis", 0)) % len(dims)
        x = self.get(xv, "orig")
        name = str(node.outputs[0].name)
        if self.is_const(iv):
            idx = self.consts[iv.name].astype(np.int64)
            idx = np.where(idx < 0, idx + dims[axis], idx).astype(np.int32)
            ind = self.const(f"{name}/indices", idx.reshape(-1) if idx.ndim == 0 else idx)
            scalar = idx.ndim == 0
        else:
            if iv.dtype not in (ir.DataType.INT32, ir.DataType.INT64):
                return self.refuse(node, f"indices of type {iv.dtype}")
            dtype = "int64" if iv.dtype == ir.DataType.INT64 else "int32"
            shape = _static(iv)
            scalar = not shape
            raw = self.get(iv, "orig")
            if scalar:
                raw = self.reshape(raw, [1], f"{name}/index")
            ind = self.new(f"{name}/wrapped", shape or [1], dtype)
            n = self.const(f"{name}/axis_len", np.array(dims[axis], dtype))
            self.op("FLOOR_MOD", [raw, n], [ind])
        y = self.out(node.outputs[0], "orig")
        if scalar:  # a scalar index: gather one, then drop the axis
            one = self.new(f"{name}/one", [*dims[:axis], 1, *dims[axis + 1 :]], self.g.tensors[x].dtype)
            self.op("GATHER", [x, ind], [one], "GatherOptions", Axis=axis, BatchDims=0)
            self.reshape_to(one, y)
            return
        self.op("GATHER", [x, ind], [y], "GatherOptions", label=node.name, Axis=axis, BatchDims=0)

    def _keep_layout(self, xv: Any) -> str:
        lay = self.layout_of(xv.name)
        return "orig" if lay == "flat" else lay

    def _elementwise_layout(self, xv: Any) -> str:
        """An elementwise op's layout: its input's, ``nlc`` included (rule 6)."""
        if xv.name not in self.consts and set(self.at[xv.name]) == {"nlc"}:
            return "nlc"
        return self._keep_layout(xv)

    def _unary(self, node: Any, code: str, opt: str | None = None, **opts: Any) -> None:
        xv = node.inputs[0]
        layout = self._elementwise_layout(xv)
        x = self.get(xv, layout)
        y = self.out(node.outputs[0], layout)
        self.op(code, [x], [y], opt, label=node.name, **opts)

    def __getattr__(self, name: str) -> Any:
        op = name[1:] if name.startswith("_") else None
        if op in _UNARY:
            return lambda node: self._unary(node, _UNARY[op])
        raise AttributeError(name)

    def _LeakyRelu(self, node: Any) -> None:
        self._unary(node, "LEAKY_RELU", "LeakyReluOptions", Alpha=float(self.attr(node, "alpha", 0.01)))

    def _HardSigmoid(self, node: Any) -> None:
        """max(0, min(1, alpha * x + beta)): MUL, ADD, MAXIMUM, MINIMUM (no builtin of its own);
        HARD_SWISH where the only reader multiplies it by its own input with ONNX's defaults."""
        alpha = float(self.attr(node, "alpha", 0.2))
        beta = float(self.attr(node, "beta", 0.5))
        xv, yv = node.inputs[0], node.outputs[0]
        layout = self._elementwise_layout(xv)
        x = self.get(xv, layout)
        shape = self.g.tensors[x].shape
        name = str(yv.name)
        steps = [
            ("MUL", "MulOptions", alpha),
            ("ADD", "AddOptions", beta),
            ("MAXIMUM", None, 0.0),
            ("MINIMUM", None, 1.0),
        ]
        for k, (code, opt, value) in enumerate(steps):
            c = self.const(f"{name}/{code.lower()}", np.array(value, np.float32))
            t = self.out(yv, layout) if k == len(steps) - 1 else self.new(f"{name}/{k}", shape)
            self.op(code, [x, c], [t], opt, label=node.name if k == len(steps) - 1 else "")
            x = t

    def _Gelu(self, node: Any) -> None:
        approx = self.attr(node, "approximate", "none")
        self._unary(node, "GELU", "GeluOptions", Approximate=approx in ("tanh", b"tanh"))

    def _fused_gelu(self, node: Any, xv: Any, yv: Any) -> None:
        """Rule 8: one GELU (approximate=false) from ``x`` to the pattern's output."""
        layout = self._elementwise_layout(xv)
        x = self.get(xv, layout)
        y = self.out(yv, layout)
        self.op("GELU", [x], [y], "GeluOptions", label=node.name, Approximate=False)

    def _IsNaN(self, node: Any) -> None:
        """Rule 9: NOT_EQUAL(x, x)."""
        xv = node.inputs[0]
        layout = self._elementwise_layout(xv)
        x = self.get(xv, layout)
        y = self.out(node.outputs[0], layout, "bool")
        self.op("NOT_EQUAL", [x, x], [y], label=node.name)

    def _Clip(self, node: Any) -> None:
        lo, hi = self.attr(node, "min", None), self.attr(node, "max", None)
        for i, name in ((1, "lo"), (2, "hi")):
            if len(node.inputs) > i and node.inputs[i] is not None:
                if not self.is_const(node.inputs[i]):
                    return self.refuse(node, "bounds not constant")
                val = float(self.consts[node.inputs[i].name])
                lo, hi = (val, hi) if name == "lo" else (lo, val)
        named = {(0.0, 6.0): "RELU6", (-1.0, 1.0): "RELU_N1_TO_1", (0.0, None): "RELU"}
        if (lo, hi) in named:
            return self._unary(node, named[(lo, hi)])
        xv = node.inputs[0]
        layout = self._elementwise_layout(xv)
        x = self.get(xv, layout)
        if lo is not None:
            t = self.new(node.outputs[0].name + "/lo", self.g.tensors[x].shape)
            self.op("MAXIMUM", [x, self.const("clip_lo", np.array(lo, np.float32))], [t])
            x = t
        y = self.out(node.outputs[0], layout)
        if hi is not None:
            self.op("MINIMUM", [x, self.const("clip_hi", np.array(hi, np.float32))], [y], label=node.name)
        else:
            self.g.ops[-1].outputs = [y]
            self.g.tensors.pop()

    def _softmax(self, node: Any, code: str, opt: str | None) -> None:
        xv = node.inputs[0]
        dims = _static(xv)
        rank = len(dims)
        old = self.model.opset_imports.get("", 21) < 13  # axis 1 by default, over dims axis.. jointly
        axis = int(self.attr(node, "axis", 1 if old else -1)) % rank
        kw: dict[str, Any] = {"Beta": 1.0} if opt else {}
        if old and any(d != 1 for d in dims[axis + 1 :]):
            if any(d != 1 for d in dims[axis:-1]):  # a real flatten: softmax over [before, after]
                before = int(np.prod(dims[:axis]))
                x = self.reshape(
                    self.get(xv, "orig"), [before, int(np.prod(dims[axis:]))], node.outputs[0].name + "/2d"
                )
                t = self.new(node.outputs[0].name + "/2d/out", self.g.tensors[x].shape)
                self.op(code, [x], [t], opt, None, **kw)
                y = self.out(node.outputs[0], "orig")
                self.op(
                    "RESHAPE",
                    [t, self.const("shape", np.array(dims, np.int32))],
                    [y],
                    "ReshapeOptions",
                    label=node.name,
                )
                return
            axis = rank - 1
        if self.layout_of(xv.name) == "nhwc" and axis == 1:
            layout = "nhwc"
        elif axis == rank - 1:
            layout = "orig"
        else:  # the axis moved last and back: two TRANSPOSEs around the softmax
            perm = tuple(a for a in range(rank) if a != axis) + (axis,)
            name = node.outputs[0].name
            t = self.transposed(self.get(xv, "orig"), perm, name + "/last")
            sm = self.new(name + "/softmax", self.g.tensors[t].shape)
            self.op(code, [t], [sm], opt, **kw)
            y = self.out(node.outputs[0], "orig")
            inv = _perm_inverse(perm)
            self.op(
                "TRANSPOSE",
                [sm, self.const(f"{name}/perm", np.array(inv, np.int32))],
                [y],
                "TransposeOptions",
                label=node.name,
            )
            return
        x = self.get(xv, layout)
        y = self.out(node.outputs[0], layout)
        self.op(code, [x], [y], opt, label=node.name, **kw)

    def _Softmax(self, node: Any) -> None:
        self._softmax(node, "SOFTMAX", "SoftmaxOptions")

    def _LogSoftmax(self, node: Any) -> None:
        self._softmax(node, "LOG_SOFTMAX", None)

    def _BatchNormalization(self, node: Any) -> None:
        xv = node.inputs[0]
        if not all(self.is_const(v) for v in node.inputs[1:5]):
            return self.refuse(node, "statistics not constant")
        g, b, m, var = (self.consts[v.name].astype(np.float64) for v in node.inputs[1:5])
        scale = g / np.sqrt(var + float(self.attr(node, "epsilon", 1e-5)))
        shift = b - m * scale
        rank = len(_static(xv))
        layout = self._elementwise_layout(xv)
        shape = (-1,) if layout in ("nhwc", "nlc") or rank == 2 else (-1,) + (1,) * (rank - 2)
        x = self.get(xv, layout)
        t = self.new(node.outputs[0].name + "/scaled", self.g.tensors[x].shape)
        self.op(
            "MUL",
            [x, self.const(f"{node.outputs[0].name}/scale", scale.astype(np.float32).reshape(shape))],
            [t],
            "MulOptions",
        )
        y = self.out(node.outputs[0], layout)
        self.op(
            "ADD",
            [t, self.const(f"{node.outputs[0].name}/shift", shift.astype(np.float32).reshape(shape))],
            [y],
            "AddOptions",
            label=node.name,
        )

    def _reduce(self, node: Any, code: str, source: int = -1, layout: str = "") -> None:
        xv = node.inputs[0]
        rank = len(_static(xv))
        axes = self.attr(node, "axes", None)
        if axes is None and len(node.inputs) > 1 and node.inputs[1] is not None:
            if not self.is_const(node.inputs[1]):
                return self.refuse(node, "axes not constant")
            axes = self.consts[node.inputs[1].name].tolist()
        axes = [int(a) % rank for a in (axes if axes is not None else range(rank))]
        keep = bool(self.attr(node, "keepdims", 1))
        if source >= 0 and layout == "nhwc" and not keep:  # a squared nhwc value, read as orig
            source, layout = self.transposed(source, TO_NCHW, node.outputs[0].name + "/sq_nchw"), "orig"
        whole = not keep and source < 0 and not layout and sorted(axes) == list(range(rank))
        layout = layout or (self._keep_layout(xv) if keep or whole else "orig")
        if layout == "nhwc":
            axes = [TO_NHWC.index(a) for a in axes]
        x = source if source >= 0 else self.get(xv, layout)
        # a reduction over every axis to a scalar reads its input in the layout it has
        y = self.out(node.outputs[0], "orig" if whole else layout)
        self.op(
            code,
            [x, self.const("axes", np.array(sorted(axes), np.int32))],
            [y],
            "ReducerOptions",
            label=node.name,
            KeepDims=keep,
        )

    def _ReduceMean(self, node: Any) -> None:
        self._reduce(node, "MEAN")

    def _ReduceMax(self, node: Any) -> None:
        self._reduce(node, "REDUCE_MAX")

    def _ReduceMin(self, node: Any) -> None:
        self._reduce(node, "REDUCE_MIN")

    def _ReduceSum(self, node: Any) -> None:
        self._reduce(node, "SUM")

    def _Pad(self, node: Any) -> None:
        xv = node.inputs[0]
        mode = _text(self.attr(node, "mode", "constant"))
        if mode not in ("constant", "reflect"):
            return self.refuse(node, f"mode {mode}")
        if len(node.inputs) < 2 or not self.is_const(node.inputs[1]):
            return self.refuse(node, "pads not constant")
        pads = self.consts[node.inputs[1].name].astype(np.int64).reshape(2, -1).T  # [rank, 2]
        if len(node.inputs) > 3 and node.inputs[3] is not None:
            return self.refuse(node, "axes")
        value = 0.0
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            value = float(self.consts[node.inputs[2].name]) if self.is_const(node.inputs[2]) else np.nan
        if (pads < 0).any() or np.isnan(value):
            return self.refuse(node, "negative pads or non-constant value")
        layout = self._keep_layout(xv)
        if layout == "nhwc":
            pads = pads[list(TO_NHWC)]
        x = self.get(xv, layout)
        y = self.out(node.outputs[0], layout)
        p = self.const(f"{node.outputs[0].name}/paddings", pads.astype(np.int32))
        if mode == "reflect":  # ONNX's reflect excludes the edge: MIRROR_PAD's REFLECT
            self.op("MIRROR_PAD", [x, p], [y], "MirrorPadOptions", label=node.name, Mode=0)
        elif value == 0.0:
            self.op("PAD", [x, p], [y], "PadOptions", label=node.name)
        else:
            self.op(
                "PADV2",
                [x, p, self.const("pad_value", np.array(value, np.float32))],
                [y],
                "PadV2Options",
                label=node.name,
            )

    def _qparams(self, node: Any) -> tuple[float, int, str] | None:
        """A Q/DQ node's per-tensor (scale, zero point, int8|uint8), or None (refused)."""
        sv = node.inputs[1]
        zv = node.inputs[2] if len(node.inputs) > 2 else None
        if not self.is_const(sv) or (zv is not None and not self.is_const(zv)):
            self.refuse(node, "scale/zero point not constant")
            return None
        scale = np.asarray(self.consts[sv.name], np.float64)
        zp = np.asarray(self.consts[zv.name]) if zv is not None else np.zeros((), np.uint8)
        if scale.size != 1 or zp.size != 1 or zp.dtype not in (np.int8, np.uint8):
            self.refuse(node, f"per-axis or {zp.dtype.name} activation quantization")
            return None
        return float(scale.reshape(())), int(zp.reshape(())), zp.dtype.name

    def _pair(self, node: Any) -> bool:
        """Whether a QuantizeLinear's every reader is a DequantizeLinear with its parameters."""
        readers = self.consumers.get(node.outputs[0].name, [])
        mine = [self.consts.get(str(v.name)) if v is not None else None for v in node.inputs[1:3]]
        if not readers or node.outputs[0] in self.model.graph.outputs:
            return False
        for r in readers:
            theirs = [self.consts.get(str(v.name)) if v is not None else None for v in r.inputs[1:3]]
            if r.op_type != "DequantizeLinear" or len(theirs) != len(mine):
                return False
            if any(a is None or b is None or not np.array_equal(a, b) for a, b in zip(mine, theirs)):
                return False
        return True

    def _QuantizeLinear(self, node: Any) -> None:
        q = self._qparams(node)
        if q is None:
            return
        scale, zp, dtype = q
        xv, yv = node.inputs[0], node.outputs[0]
        if self.qdq == "params" and self._pair(node):  # the pair vanishes; its parameters stay
            self.qparams[xv.name] = (scale, zp - 128 if dtype == "uint8" else zp)
            self.alias(yv, xv)
            return
        layout = self._keep_layout(xv)
        x = self.get(xv, layout)
        if self.qdq == "ops" and self._pair(node):  # rule 12: ONNX's rounding, in float
            lo, hi = (-128, 127) if dtype == "int8" else (0, 255)
            name = str(yv.name)
            shape = self.g.tensors[x].shape
            steps = [
                ("DIV", "DivOptions", scale),
                ("ROUND", None, None),
                ("MAXIMUM", None, lo - zp),
                ("MINIMUM", None, hi - zp),
            ]
            for k, (code, opt, value) in enumerate(steps):
                last = k == len(steps) - 1
                t = self.out(yv, layout, "float32") if last else self.new(f"{name}/{code.lower()}", shape)
                ins = (
                    [x]
                    if value is None
                    else [x, self.const(f"{name}/{code.lower()}_by", np.array(value, np.float32))]
                )
                self.op(code, ins, [t], opt, label=node.name if last else "")
                x = t
            self.centered.add(name)
            return
        y = self.out(yv, layout, dtype)
        from mconv.targets.tflite.schema import Quant

        self.g.tensors[y].quant = Quant(np.array([scale], np.float32), np.array([zp], np.int64))
        self.op("QUANTIZE", [x], [y], "QuantizeOptions", label=node.name)

    def _DequantizeLinear(self, node: Any) -> None:
        xv, yv = node.inputs[0], node.outputs[0]
        if self.is_const(xv):  # a constant weight: folded to float (prepare folds these first)
            return self.refuse(node, "constant input not folded")
        if self.qdq == "params" and xv.name in self.at and xv.name not in self.g_inputs():
            producer = xv.producer()
            if producer is not None and producer.op_type == "QuantizeLinear" and self._pair(producer):
                self.alias(yv, xv)
                return
        q = self._qparams(node)
        if q is None:
            return
        scale, zp, _ = q
        layout = self._keep_layout(xv)
        x = self.get(xv, layout)
        if xv.name in self.centered:  # rule 12: the pair's codes, already centered, in float
            y = self.out(yv, layout, "float32")
            self.op(
                "MUL",
                [x, self.const(f"{yv.name}/scale", np.array(scale, np.float32))],
                [y],
                "MulOptions",
                label=node.name,
            )
            return
        have = self.g.tensors[x].quant
        if (
            have is not None
            and have.scale.size == 1
            and float(have.scale[0]) == float(np.float32(scale))
            and int(have.zero_point[0]) == zp
        ):
            y = self.out(yv, layout, "float32")
            self.op("DEQUANTIZE", [x], [y], "DequantizeOptions", label=node.name)
            return
        # rule 11: the codes read with this node's own parameters, not the tensor's
        name = str(yv.name)
        shape = self.g.tensors[x].shape
        codes = self.new(f"{name}/codes", shape)
        self.op("CAST", [x], [codes])
        if zp:
            centered = self.new(f"{name}/centered", shape)
            self.op(
                "SUB", [codes, self.const(f"{name}/zp", np.array(zp, np.float32))], [centered], "SubOptions"
            )
            codes = centered
        y = self.out(yv, layout, "float32")
        self.op(
            "MUL",
            [codes, self.const(f"{name}/scale", np.array(scale, np.float32))],
            [y],
            "MulOptions",
            label=node.name,
        )

    def g_inputs(self) -> set[str]:
        return {str(v.name) for v in self.model.graph.inputs}

    def _LRN(self, node: Any) -> None:
        size = int(self.attr(node, "size"))
        if size % 2 == 0:
            return self.refuse(node, "even size")
        x = self.get(node.inputs[0], "nhwc")
        y = self.out(node.outputs[0], "nhwc")
        self.op(
            "LOCAL_RESPONSE_NORMALIZATION",
            [x],
            [y],
            "LocalResponseNormalizationOptions",
            label=node.name,
            Radius=(size - 1) // 2,
            Bias=float(self.attr(node, "bias", 1.0)),
            Alpha=float(self.attr(node, "alpha", 1e-4)) / size,
            Beta=float(self.attr(node, "beta", 0.75)),
        )


_MOVES = {
    "RESHAPE", "TRANSPOSE", "SQUEEZE", "EXPAND_DIMS", "STRIDED_SLICE", "SLICE", "GATHER", "SPLIT",
    "MAX_POOL_2D", "DEPTH_TO_SPACE", "SPACE_TO_DEPTH", "BROADCAST_TO", "CONCATENATION",
}  # fmt: skip


def carry_quant(g: Graph) -> None:
    """Rule 10: an 8-bit output of a data-movement op takes its 8-bit input's parameters."""
    for op in g.ops:
        if op.code not in _MOVES:
            continue
        data = [g.tensors[i] for i in (op.inputs[1:2] if op.code == "SPLIT" else op.inputs[:1])]
        if op.code == "CONCATENATION":
            data = [g.tensors[i] for i in op.inputs]
        q = data[0].quant
        if q is None or any(
            t.quant is None
            or t.dtype != data[0].dtype
            or not np.array_equal(t.quant.scale, q.scale)
            or not np.array_equal(t.quant.zero_point, q.zero_point)
            for t in data
        ):
            continue
        for i in op.outputs:
            t = g.tensors[i]
            if t.quant is None and t.dtype == data[0].dtype:
                t.quant = q


def relu_then_min_six(g: Graph) -> None:
    """Rule 4's first step: RELU followed by MINIMUM with the scalar 6 (Keras writes ReLU6,
    ``ReLU(max_value=6)``, as Relu then Min) is one RELU6, min(max(x, 0), 6) the same numbers,
    when nothing else reads the RELU's output and neither tensor is 8-bit."""
    producer = g.producer()
    consumers = g.consumers()
    dropped: set[int] = set()
    for k, op in enumerate(g.ops):
        if op.code != "MINIMUM" or len(op.inputs) != 2:
            continue
        const = [i for i in op.inputs if g.tensors[i].data is not None]
        rest = [i for i in op.inputs if g.tensors[i].data is None]
        if len(const) != 1 or len(rest) != 1 or rest[0] not in producer:
            continue
        c, t, y = g.tensors[const[0]], rest[0], op.outputs[0]
        relu = g.ops[producer[t]]
        assert c.data is not None
        if (
            relu.code == "RELU"
            and c.data.size == 1
            and c.dtype == "float32"
            and float(c.data.reshape(())) == 6.0
            and len(consumers.get(t, [])) == 1
            and t not in g.outputs
            and list(g.tensors[t].shape) == list(g.tensors[y].shape)
            and g.tensors[t].quant is None
            and g.tensors[y].quant is None
        ):
            relu.code, relu.outputs = "RELU6", [y]
            dropped.add(k)
    g.ops = [op for k, op in enumerate(g.ops) if k not in dropped]


def fuse_activations(g: Graph) -> None:
    """Rule 4."""
    relu_then_min_six(g)
    producer = g.producer()
    consumers = g.consumers()
    keep: list[Op] = []
    dropped: set[int] = set()
    for k, op in enumerate(g.ops):
        if op.code in _ACT and op.inputs[0] in producer:
            p = g.ops[producer[op.inputs[0]]]
            t = op.inputs[0]
            if (
                p.code in _FUSES_INTO
                and len(consumers.get(t, [])) == 1
                and t not in g.outputs
                and p.options_type is not None
                and p.options.get("FusedActivationFunction", 0) == 0
            ):
                import tflite

                p.options["FusedActivationFunction"] = getattr(tflite.ActivationFunctionType, _ACT[op.code])
                p.outputs = [op.outputs[0]]
                dropped.add(k)
                continue
        keep.append(op)
    g.ops = keep


def _moves_in_order(shape: list[int], perm: list[int]) -> bool:
    """A TRANSPOSE by ``perm`` of a value of ``shape`` keeps its elements' memory order: the
    axes longer than 1 stay in the same relative order."""
    kept = [a for a in perm if shape[a] != 1]
    return kept == sorted(kept)


def tidy(g: Graph) -> None:
    """Rule 13: data movement that moves nothing goes. A TRANSPOSE that keeps the memory order
    (only axes of length 1 move) is a RESHAPE; a RESHAPE of a RESHAPE that nothing else reads
    reads the first one's input; a RESHAPE to its input's own shape is dropped (its readers read
    the input). An 8-bit tensor, a graph input or output stays as it is. Squeeze-excite blocks
    lowered from NHWC Keras models (a MEAN, then TRANSPOSE, RESHAPE, RESHAPE back to [1, 1, 1, C])
    keep only the MEAN."""
    protected = set(g.inputs) | set(g.outputs)

    def plain(i: int) -> bool:
        return g.tensors[i].quant is None and i not in protected

    for op in g.ops:  # TRANSPOSE -> RESHAPE
        if op.code != "TRANSPOSE" or len(op.inputs) != 2 or g.tensors[op.inputs[1]].data is None:
            continue
        x, y = op.inputs[0], op.outputs[0]
        perm = [int(a) for a in np.asarray(g.tensors[op.inputs[1]].data).ravel()]
        shape = list(g.tensors[x].shape)
        if len(perm) != len(shape) or g.tensors[x].quant is not None or g.tensors[y].quant is not None:
            continue
        if _moves_in_order(shape, perm):
            out = list(g.tensors[y].shape)
            op.code, op.options_type, op.options = "RESHAPE", "ReshapeOptions", {}
            op.inputs = [x, g.const(g.tensors[y].name + "/shape", np.array(out, np.int32))]
    changed = True
    while changed:
        changed = False
        producer = g.producer()
        consumers = g.consumers()
        drop: set[int] = set()
        for k, op in enumerate(g.ops):
            if op.code != "RESHAPE" or k in drop:
                continue
            x, y = op.inputs[0], op.outputs[0]
            p = producer.get(x)
            if (
                p is not None
                and p not in drop
                and g.ops[p].code == "RESHAPE"
                and plain(x)
                and len(consumers.get(x, [])) == 1
                and g.tensors[g.ops[p].inputs[0]].quant is None
            ):
                op.inputs = [g.ops[p].inputs[0], *op.inputs[1:]]
                drop.add(p)
                changed = True
                continue
            src = op.inputs[0]
            if (
                list(g.tensors[src].shape) == list(g.tensors[y].shape)
                and plain(y)
                and g.tensors[src].quant is None
                and g.tensors[src].dtype == g.tensors[y].dtype
            ):
                for c in consumers.get(y, []):
                    g.ops[c].inputs = [src if i == y else i for i in g.ops[c].inputs]
                drop.add(k)
                changed = True
        g.ops = [op for k, op in enumerate(g.ops) if k not in drop]
    _pads_into_same(g, protected)


def _pads_into_same(g: Graph, protected: set[int]) -> None:
    """Rule 13's last step: a zero PAD read only by a VALID convolution, or a PADV2 with float32's
    lowest read only by a VALID max pool, whose pads are exactly TF's SAME pads for that op's
    kernel, stride and dilation, is the op's own SAME padding (Keras's ZeroPadding2D before a
    stride-1 3x3 conv: ResNetV2)."""
    producer, consumers = g.producer(), g.consumers()
    drop: set[int] = set()
    for op in g.ops:
        if (
            op.code not in ("CONV_2D", "DEPTHWISE_CONV_2D", "MAX_POOL_2D")
            or op.options.get("Padding", 0) != 1
        ):
            continue
        x = op.inputs[0]
        k = producer.get(x)
        if k is None or x in protected or len(consumers.get(x, [])) != 1 or g.tensors[x].quant is not None:
            continue
        pad = g.ops[k]
        want = "PADV2" if op.code == "MAX_POOL_2D" else "PAD"
        if pad.code != want or g.tensors[pad.inputs[1]].data is None:
            continue
        if want == "PADV2":
            v = g.tensors[pad.inputs[2]].data if len(pad.inputs) > 2 else None
            if v is None or float(np.asarray(v).reshape(-1)[0]) > float(np.finfo(np.float32).min):
                continue
        pads = np.asarray(g.tensors[pad.inputs[1]].data).reshape(-1, 2)
        src = g.tensors[pad.inputs[0]]
        if pads.shape[0] != 4 or pads[0].any() or pads[3].any() or len(src.shape) != 4:
            continue
        if op.code == "MAX_POOL_2D":
            kh, kw = int(op.options.get("FilterHeight", 1)), int(op.options.get("FilterWidth", 1))
            dh = dw = 1
        else:
            wshape = g.tensors[op.inputs[1]].shape
            kh, kw = int(wshape[1]), int(wshape[2])
            dh, dw = int(op.options.get("DilationHFactor", 1)), int(op.options.get("DilationWFactor", 1))
        sh, sw = int(op.options.get("StrideH", 1)), int(op.options.get("StrideW", 1))
        if tuple(pads[1]) == same_pads(src.shape[1], kh, sh, dh) and tuple(pads[2]) == same_pads(
            src.shape[2], kw, sw, dw
        ):
            op.inputs = [pad.inputs[0], *op.inputs[1:]]
            op.options["Padding"] = 0
            drop.add(k)
    g.ops = [op for k, op in enumerate(g.ops) if k not in drop]


_AFFINE_INTO = {"FULLY_CONNECTED": 0, "CONV_2D": 0, "DEPTHWISE_CONV_2D": 3}  # output channel axis


def _channel_const(g: Graph, i: int, channels: int) -> np.ndarray | None:
    """A float constant that broadcasts along the last axis only (one value, or one a channel):
    its ``channels`` values, else None."""
    t = g.tensors[i]
    if t.data is None or t.dtype != "float32" or t.quant is not None:
        return None
    a = np.asarray(t.data, np.float32)
    if a.size == 1:
        return np.full(channels, float(a.reshape(())), np.float32)
    if a.shape[-1] == channels and a.size == channels:
        return a.reshape(channels)
    return None


def _palette_like(w: np.ndarray, axis: int) -> bool:
    """A weight the writer stores as int8 codes (writer rule 3): on an int8 grid per channel (a
    quantized model's, dequantized) or of at most 256 distinct values (a clustered palette). A
    fold would spread it over other values, and the file would grow fourfold there."""
    from mconv.targets.tflite.quant import grid_codes

    return np.unique(w).size <= 256 or grid_codes(w, axis) is not None


def fold_affine(g: Graph) -> None:
    """Rule 14: per-channel constant MUL / ADD / SUB next to a linear layer become its weights and
    bias. After a FULLY_CONNECTED, CONV_2D or DEPTHWISE_CONV_2D without a fused activation whose
    output only it reads: ``y * c`` scales each output channel's weights and bias, ``y + c`` (or
    ``- c``) adds to the bias (the op takes over the MUL's or ADD's fused activation). Before a
    FULLY_CONNECTED whose input only it reads (LayerNorm's gamma and beta): ``W (x * g)`` is
    ``(W * g) x`` and ``W (x + b)`` adds ``W b`` to the bias. Not before a convolution: its zero
    padding would see the shift. Weights and biases are new constants (others may share the old
    ones); 8-bit tensors, the graph's outputs and weights the writer stores as int8 codes
    (:func:`_palette_like`) stay as they are."""
    import tflite

    none = tflite.ActivationFunctionType.NONE
    outputs = set(g.outputs) | set(g.inputs)
    changed = True
    while changed:
        changed = False
        producer, consumers = g.producer(), g.consumers()
        for k, op in enumerate(g.ops):
            if op.code not in ("MUL", "ADD", "SUB") or len(op.inputs) != 2:
                continue
            x = next((i for i in op.inputs if g.tensors[i].data is None), None)
            if x is None or x in outputs or len(consumers.get(x, [])) != 1 or x not in producer:
                continue
            c_idx = op.inputs[1] if op.inputs[0] == x else op.inputs[0]
            if op.code == "SUB" and op.inputs[0] != x:
                continue
            lin = g.ops[producer[x]]
            if (
                lin.code not in _AFFINE_INTO
                or lin.options.get("FusedActivationFunction", none) != none
                or g.tensors[x].quant is not None
                or g.tensors[lin.inputs[1]].data is None
                or g.tensors[lin.inputs[1]].dtype != "float32"
                or g.tensors[op.outputs[0]].quant is not None
            ):
                continue
            w = np.asarray(g.tensors[lin.inputs[1]].data, np.float32)
            axis = _AFFINE_INTO[lin.code]
            if _palette_like(w, axis):
                continue
            n = w.shape[axis]
            c = _channel_const(g, c_idx, n)
            if c is None or list(g.tensors[op.outputs[0]].shape) != list(g.tensors[x].shape):
                continue
            has_bias = len(lin.inputs) > 2 and lin.inputs[2] >= 0
            b = np.asarray(g.tensors[lin.inputs[2]].data, np.float32) if has_bias else np.zeros(n, np.float32)
            if has_bias and (g.tensors[lin.inputs[2]].data is None or b.size != n):
                continue
            b = b.reshape(n)
            view = [-1 if a == axis else 1 for a in range(w.ndim)]
            if op.code == "MUL":
                w, b = w * c.reshape(view), b * c
            else:
                b = b + (c if op.code == "ADD" else -c)
            name = g.tensors[lin.inputs[1]].name
            ins = list(lin.inputs) + [-1] * (3 - len(lin.inputs))
            ins[1] = g.const(name + "/folded", w)
            ins[2] = g.const(name + "/bias_folded", b)
            lin.inputs = ins
            lin.outputs = list(op.outputs)
            act = op.options.get("FusedActivationFunction", none)
            if act != none:
                lin.options["FusedActivationFunction"] = act
            g.ops.pop(k)
            changed = True
            break
        if changed:
            continue
        for op in g.ops:  # before a FULLY_CONNECTED
            if op.code != "FULLY_CONNECTED" or g.tensors[op.inputs[1]].data is None:
                continue
            x = op.inputs[0]
            if x in outputs or len(consumers.get(x, [])) != 1 or x not in producer:
                continue
            k = producer[x]
            pre = g.ops[k]
            if pre.code not in ("MUL", "ADD", "SUB") or len(pre.inputs) != 2:
                continue
            if pre.options.get("FusedActivationFunction", none) != none:
                continue
            u = next((i for i in pre.inputs if g.tensors[i].data is None), None)
            if u is None or g.tensors[u].quant is not None or g.tensors[x].quant is not None:
                continue
            c_idx = pre.inputs[1] if pre.inputs[0] == u else pre.inputs[0]
            if pre.code == "SUB" and pre.inputs[0] != u:
                continue
            w = np.asarray(g.tensors[op.inputs[1]].data, np.float32)
            if g.tensors[op.inputs[1]].dtype != "float32" or w.ndim != 2 or _palette_like(w, 0):
                continue
            c = _channel_const(g, c_idx, w.shape[1])
            if c is None or list(g.tensors[u].shape) != list(g.tensors[x].shape):
                continue
            has_bias = len(op.inputs) > 2 and op.inputs[2] >= 0
            if has_bias and g.tensors[op.inputs[2]].data is None:
                continue
            b = (
                np.asarray(g.tensors[op.inputs[2]].data, np.float32).reshape(-1)
                if has_bias
                else np.zeros(w.shape[0], np.float32)
            )
            if pre.code == "MUL":
                w = w * c[None, :]
            else:
                b = b + w @ (c if pre.code == "ADD" else -c)
            name = g.tensors[op.inputs[1]].name
            ins = list(op.inputs) + [-1] * (3 - len(op.inputs))
            ins[0] = u
            ins[1] = g.const(name + "/folded", w.astype(np.float32))
            ins[2] = g.const(name + "/bias_folded", b.astype(np.float32))
            op.inputs = ins
            g.ops.pop(k)
            changed = True
            break


def drop_zero_bias(g: Graph) -> None:
    """Rule 15: an all-zero float bias of a FULLY_CONNECTED is input ``-1``. Only the fully
    connected kernel documents the bias as optional; convolutions keep theirs."""
    for op in g.ops:
        if op.code != "FULLY_CONNECTED" or len(op.inputs) < 3 or op.inputs[2] < 0:
            continue
        b = g.tensors[op.inputs[2]]
        if b.data is not None and b.quant is None and b.data.dtype.kind == "f" and not np.any(b.data):
            op.inputs = [*op.inputs[:2], -1]


def compact(g: Graph) -> Graph:
    """The graph with only the tensors its ops, inputs and outputs use, renumbered in use order."""
    used: list[int] = []
    seen: set[int] = set()
    for idx in [*g.inputs, *(t for op in g.ops for t in [*op.inputs, *op.outputs]), *g.outputs]:
        if idx >= 0 and idx not in seen:
            seen.add(idx)
            used.append(idx)
    new = {old: i for i, old in enumerate(used)}
    new[-1] = -1
    out = Graph([g.tensors[i] for i in used])
    out.inputs = [new[i] for i in g.inputs]
    out.outputs = [new[i] for i in g.outputs]
    for op in g.ops:
        op.inputs = [new[i] for i in op.inputs]
        op.outputs = [new[i] for i in op.outputs]
        out.ops.append(op)
    # unique names (the runner and LiteRT's signature key on them); inputs and outputs keep theirs
    io = [*out.inputs, *out.outputs]
    taken = {out.tensors[i].name for i in io}
    for i, t in enumerate(out.tensors):
        if i in io:
            continue
        if t.name in taken:
            k = 1
            while f"{t.name}_{k}" in taken:
                k += 1
            t.name = f"{t.name}_{k}"
        taken.add(t.name)
    return out


def lower(model: ir.Model, qdq: str = "ops") -> Graph:
    return Lowering(model, qdq).run()


def lower_with_params(model: ir.Model) -> tuple[Graph, dict[int, tuple[float, int]]]:
    """Rule 5 with ``qdq="params"``: the float graph and, per activation tensor that a
    QuantizeLinear/DequantizeLinear pair quantized, its int8 (scale, zero point)."""
    low = Lowering(model, "params")
    g = low.run(compacted=False)
    params: dict[int, tuple[float, int]] = {}
    for value, p in low.qparams.items():
        for idx in low.at.get(value, {}).values():
            params[idx] = p
    return compact_with(g, params)


def compact_with(
    g: Graph, params: dict[int, tuple[float, int]]
) -> tuple[Graph, dict[int, tuple[float, int]]]:
    """:func:`compact` carrying a per-tensor mapping along."""
    keep = {id(g.tensors[i]): p for i, p in params.items()}
    out = compact(g)
    return out, {i: keep[id(t)] for i, t in enumerate(out.tensors) if id(t) in keep}
