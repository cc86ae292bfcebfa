"""ONNX Runtime's quantized and ``com.microsoft`` contrib ops rewritten into standard ONNX ops
before planning, for the metal and webgpu targets (both plan from the same prepared graph).

Rules:

1. :func:`decompose` runs in :func:`mconv.targets.gpu.plan.prepare` after the inputs' shapes
   are baked, in rounds with shape inference between them: a node is rewritten once the static
   shapes its rewrite needs are known, into standard ONNX ops that the targets lower. A node
   whose parameters are not constants (scales, zero points, quantized weights), or that uses a
   feature the rewrite does not express (an attention past state, ``g_idx``, a norm's mean
   output) is left as it is, and the planner names it as unsupported.
2. Integer codes are floats on the targets (the GPU plan's rule 3). The integer products
   (ConvInteger, MatMulInteger, QLinearConv, QLinearMatMul, QGemm) become the float Conv /
   MatMul / Gemm of the zero-point-subtracted codes: exact while every partial sum is an
   integer below 2^24. The bound is computed from the constant weights (per output channel:
   sum of ``|w - zw|`` times the largest ``|x - zx|`` the input type allows, plus ``|bias|``);
   a node over it is refused (exit 2), naming it and its bound, never computed inexactly.
   The graph is then planned in float storage (the GPU plan's rule 6).
3. Requantization is ONNX Runtime's: the exact accumulator times the float32 ratio of scales
   (``x_scale * w_scale / y_scale``), rounded half to even, plus the zero point, saturated:
   a ``Mul`` by the ratio, then ``QuantizeLinear`` with scale 1 and the output zero point. The
   QOperator element ops (QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu,
   QLinearSoftmax, the QLinear pools, QLinearConcat) dequantize, compute in float and quantize
   again (QLinearSoftmax: one code off ORT's float32 exponential table at most, on ties).
4. DynamicQuantizeLinear is ``ReduceMin``/``ReduceMax`` (the range extended to 0), the scale
   ``(max - min) / 255`` (1 for an all-zero tensor), the zero point ``round(clip(-min /
   scale, 0, 255))`` and the codes ``clip(round(x / scale) + zp, 0, 255)``, as ORT.
5. Float contrib ops become their formulas: FusedConv (Conv, the optional sum, the
   activation), Gelu and BiasGelu (erf), FastGelu (tanh), QuickGelu, BiasAdd,
   Skip(Simplified)LayerNormalization and SimplifiedLayerNormalization (LayerNormalization from
   opset 17, reductions before), Attention (one projection, per-head MatMul, Softmax; a 2-D
   key mask or 1-D lengths, ``unidirectional``). MatMulNBits and GatherBlockQuantized with
   constant weights become a MatMul / Gather of the dequantized table (float32, or the scales'
   type), computed here once.
8. ``decompose(model, qdq=True)`` (the tflite target at int8 and int16x8) writes the integer
   products of QLinearConv, QLinearMatMul and QGemm in QDQ form instead of rule 2's: a
   DequantizeLinear of the input, the float Conv / MatMul / Gemm of the dequantized weights
   (``(w - zp) * scale``, per channel where the model's are) and bias (``b * x_scale *
   w_scale``), a QuantizeLinear with the output's scale and zero point. The element ops are in
   that form already (rule 3), so every activation keeps the model's own (scale, zero point)
   as a Q->DQ pair, which the tflite writer turns into its int8 tensor's parameters. A
   MaxPool, Flatten, Reshape, Transpose, Squeeze or Unsqueeze that the QOperator form runs on a
   QuantizeLinear's codes is put between a DequantizeLinear and a QuantizeLinear with those
   codes' parameters (exact: they commute with a per-tensor quantization).
6. DynamicQuantizeLSTM is not rewritten: its hidden state is quantized at every step, which no
   standard op expresses; the metal target runs it as its own kernel
   (:mod:`mconv.targets.metal.msl.recurrent`), the planner keeps its outputs' shapes
   (:func:`contrib_shapes`).
7. A MatMulInteger over the 2^24 bound whose product is only cast to float32 (as ORT's dynamic
   quantizer writes it: ``MatMulInteger -> Cast -> Mul``) is computed as two exact products,
   its weights split into digits ``B = base * B_hi + B_lo`` (:mod:`.split_product`), each
   product's bound within 2^24, then ``base * P_hi + P_lo``: the power-of-two scale is exact and
   the one Add rounds the exact integer to float32 once, to nearest even, as the Cast of the int32
   does. Anywhere else (an int32 output, an integer consumer) the node is refused as in rule 2.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx_ir as ir
from mconv.errors import UnsupportedError, show

__all__ = ["EXACT_LIMIT", "KEPT", "contrib_shapes", "decompose"]

MS = "com.microsoft"
EXACT_LIMIT = 2**24  # float32 holds every integer up to this exactly
# contrib ops a target kernel runs as they are (rule 6)
KEPT = {(MS, "DynamicQuantizeLSTM")}

_RANGES = {
    ir.DataType.UINT8: (0, 255),
    ir.DataType.INT8: (-128, 127),
    ir.DataType.UINT16: (0, 65535),
    ir.DataType.INT16: (-32768, 32767),
}


class _Rewrite:
    """Nodes built in front of ``node``; :meth:`finish` points its outputs at the results."""

    def __init__(self, model: ir.Model, node: ir.Node, taken: set[str], qdq: bool = False) -> None:
        self.qdq = qdq  # rule 8: integer products in QDQ form
        self.model = model
        self.graph = model.graph
        self.node = node
        self.taken = taken
        self.opset = int(model.opset_imports.get("", 13))
        self.base = node.name or node.op_type
        self.created: list[ir.Node] = []

    def name(self, what: str) -> str:
        from mconv.edit.rewrite import fresh_name

        return fresh_name(f"{self.base}__{what}", self.taken)

    def const(self, array, what: str = "c", dtype=np.float32) -> ir.Value:
        from mconv.edit.rewrite import add_initializer

        arr = np.array(array, dtype=dtype, order="C")  # a scalar stays 0-d
        return add_initializer(self.graph, self.name(what), arr)

    def op(self, op_type: str, inputs: list, n_out: int = 1, **attrs) -> ir.Value:
        node = ir.Node(
            "",
            op_type,
            inputs,
            [ir.convenience.convert_attribute(k, v) for k, v in attrs.items()],
            num_outputs=n_out,
            name=self.name(op_type),
        )
        for o in node.outputs:
            o.name = self.name(f"{op_type}_out")
        self.graph.insert_before(self.node, node)
        self.created.append(node)
        return node.outputs[0]

    def finish(self, results: dict[int, ir.Value]) -> None:
        from mconv.edit.rewrite import replace_value

        for i, new in results.items():
            old = self.node.outputs[i]
            replace_value(old, new)
        self.graph.remove(self.node, safe=True)

    # ---------------------------------------------------------------- opset-aware helpers

    def clip(self, x: ir.Value, lo: float | None, hi: float | None) -> ir.Value:
        if self.opset < 11:
            kw: dict[str, float] = {}
            if lo is not None:
                kw["min"] = float(lo)
            if hi is not None:
                kw["max"] = float(hi)
            return self.op("Clip", [x], **kw)  # type: ignore[arg-type]
        return self.op(
            "Clip",
            [
                x,
                self.const(lo, "lo") if lo is not None else None,
                self.const(hi, "hi") if hi is not None else None,
            ],
        )

    def reduce(self, op_type: str, x: ir.Value, axes: list[int]) -> ir.Value:
        if self.opset >= 18 or op_type == "ReduceSum" and self.opset >= 13:
            return self.op(op_type, [x, self.const(axes, "axes", np.int64)], keepdims=1)
        return self.op(op_type, [x], axes=axes, keepdims=1)

    def cast(self, x: ir.Value, to: ir.DataType) -> ir.Value:
        return self.op("Cast", [x], to=int(to))

    def dequant(self, x: ir.Value, scale, zp: ir.Value | None) -> ir.Value:
        """``(x - zp) * scale`` as a DequantizeLinear (scale a float constant)."""
        s = self.const(np.float32(scale), "one" if float(scale) == 1.0 else "scale")
        return self.op("DequantizeLinear", [x, s, zp] if zp is not None else [x, s])

    def quant(self, v: ir.Value, scale: ir.Value | float, zp: ir.Value | None, dtype: ir.DataType):
        s = scale if isinstance(scale, ir.Value) else self.const(np.float32(scale), "one")
        if zp is None:
            zp = self.const(np.zeros((), _np_dtype(dtype)), "zp", _np_dtype(dtype))
        return self.op("QuantizeLinear", [v, s, zp])


def _np_dtype(dt: ir.DataType):
    return dt.numpy()


def _in(node: ir.Node, i: int) -> ir.Value | None:
    return node.inputs[i] if len(node.inputs) > i and node.inputs[i] is not None else None


def _const(v: ir.Value | None) -> np.ndarray | None:
    return None if v is None or v.const_value is None else v.const_value.numpy()


def _shape(v: ir.Value | None) -> list[int] | None:
    if v is None or v.shape is None or not all(isinstance(d, int) for d in v.shape):
        return None
    return [d for d in v.shape if isinstance(d, int)]


def _used(v: ir.Value | None) -> bool:
    return v is not None and bool(v.uses() or v.is_graph_output())


def _attr(node: ir.Node, name: str, default):
    a = node.attributes.get(name)
    if a is None:
        return default
    v = a.value
    if isinstance(v, bytes):
        return v.decode()
    return list(v) if isinstance(v, tuple | list) else v


# ------------------------------------------------------------------------ integer products


def _code_span(v: ir.Value, zp: np.ndarray | None) -> float:
    """The largest ``|x - zp|`` the codes of ``v`` reach (rule 2)."""
    lo, hi = _RANGES.get(v.dtype, (0, 255)) if v.dtype is not None else (0, 255)
    if zp is None:
        return float(max(-lo, hi)) if v.dtype != ir.DataType.UINT8 else 255.0
    z = np.asarray(zp, np.float64)
    return float(np.max(np.maximum(np.abs(hi - z), np.abs(z - lo))))


def _refuse_inexact(node: ir.Node, bound: float) -> None:
    if bound > EXACT_LIMIT:
        raise UnsupportedError(
            [
                (
                    show(node.name or node.op_type),
                    f"{node.op_type}: int32 accumulator can reach {int(bound)}, over the 2^24 "
                    "integers float kernels hold exactly",
                )
            ],
            what="node",
            hint="run the model on the cpu target (ONNX Runtime's integer kernels)",
        )


def _centered(r: _Rewrite, x: ir.Value, zp: ir.Value | None) -> ir.Value:
    """``float(x) - float(zp)``: a DequantizeLinear with scale 1 when the zero point is a constant
    scalar, else Cast and Sub (a zero point computed at run time: DynamicQuantizeLinear's)."""
    zc = _const(zp)
    if zp is None or zc is not None and zc.size == 1:
        return r.dequant(x, 1.0, zp)
    xf = r.cast(x, ir.DataType.FLOAT)
    zf = r.cast(zp, ir.DataType.FLOAT)
    return r.op("Sub", [xf, zf])


def _weights(w: np.ndarray, zp: np.ndarray | None, axis: int) -> np.ndarray:
    """``w - zp`` in float64, ``zp`` per tensor or per index of ``axis``."""
    wf = w.astype(np.float64)
    if zp is None:
        return wf
    z = np.asarray(zp, np.float64)
    if z.size > 1:
        shape = [1] * w.ndim
        shape[axis] = z.size
        z = z.reshape(shape)
    return wf - z.reshape(z.shape if z.size > 1 else ())


def _conv_like(
    r: _Rewrite,
    x: ir.Value,
    x_zp: ir.Value | None,
    w: np.ndarray,
    w_zp: np.ndarray | None,
    bias: np.ndarray | None,
) -> ir.Value:
    """The exact float Conv of the centered codes (rule 2)."""
    node = r.node
    wf = _weights(w, w_zp, 0)
    span = _code_span(x, _const(x_zp))
    per = np.abs(wf).reshape(wf.shape[0], -1).sum(axis=1) * span
    if bias is not None:
        per = per + np.abs(bias.astype(np.float64))
    _refuse_inexact(node, float(per.max(initial=0)))
    xf = _centered(r, x, x_zp)
    attrs = _conv_attrs(node)
    inputs = [xf, r.const(wf.astype(np.float32), "w")]
    if bias is not None:
        inputs.append(r.const(bias.astype(np.float32), "bias"))
    return r.op("Conv", inputs, **attrs)


def _conv_attrs(node: ir.Node) -> dict:
    attrs = {
        k: a.value
        for k, a in node.attributes.items()
        if k in ("auto_pad", "dilations", "group", "pads", "strides")
    }
    return {
        k: (v.decode() if isinstance(v, bytes) else list(v) if isinstance(v, tuple) else v)
        for k, v in attrs.items()
    }


def _matmul_like(
    r: _Rewrite, a: ir.Value, a_zp: ir.Value | None, b: np.ndarray, b_zp: np.ndarray | None
) -> ir.Value:
    bf = _weights(b, b_zp, b.ndim - 1)
    span = _code_span(a, _const(a_zp))
    bound = float((np.abs(bf).sum(axis=-2) * span).max(initial=0))
    if bound > EXACT_LIMIT and _only_cast_to_float(r.node):
        from mconv.targets.gpu.split_product import split_weights

        parts = split_weights(bf, span, EXACT_LIMIT)
        if parts is not None:  # rule 7: two exact products, one rounding, as Cast(int32 -> float)
            hi, lo, base = parts
            xc = _centered(r, a, a_zp)
            top = r.op("MatMul", [xc, r.const(hi.astype(np.float32), "b_hi")])
            low = r.op("MatMul", [xc, r.const(lo.astype(np.float32), "b_lo")])
            return r.op("Add", [r.op("Mul", [top, r.const(np.float32(base), "base")]), low])
    _refuse_inexact(r.node, bound)
    return r.op("MatMul", [_centered(r, a, a_zp), r.const(bf.astype(np.float32), "b")])


def _only_cast_to_float(node: ir.Node) -> bool:
    """Every use of the node's product is ``Cast(to=FLOAT)`` (and it is no graph output)."""
    y = node.outputs[0]
    if y.is_graph_output() or not y.uses():
        return False
    for use in y.uses():
        user = use[0]
        if user.op_type != "Cast" or user.domain not in ("", "ai.onnx"):
            return False
        if _attr(user, "to", None) != int(ir.DataType.FLOAT):
            return False
    return True


def _conv_integer(r: _Rewrite) -> dict | None:
    n = r.node
    x, w = _in(n, 0), _const(_in(n, 1))
    x_zp, w_zp = _in(n, 2), _in(n, 3)
    if x is None or w is None or (w_zp is not None and _const(w_zp) is None):
        return None
    y = _conv_like(r, x, x_zp, w, _const(w_zp), None)
    return {0: r.cast(y, ir.DataType.INT32)}


def _matmul_integer(r: _Rewrite) -> dict | None:
    n = r.node
    a, b = _in(n, 0), _const(_in(n, 1))
    a_zp, b_zp = _in(n, 2), _in(n, 3)
    if a is None or b is None or (b_zp is not None and _const(b_zp) is None):
        return None
    if a_zp is not None and _shape(a_zp) not in ([], [1]):
        return None  # a per-row zero point of A
    return {0: r.cast(_matmul_like(r, a, a_zp, b, _const(b_zp)), ir.DataType.INT32)}


def _consts(n: ir.Node, idx: list[int]) -> list[np.ndarray] | None:
    out = []
    for i in idx:
        c = _const(_in(n, i))
        if c is None:
            return None
        out.append(c)
    return out


def _ratio(*scales: np.ndarray, over: np.ndarray | None = None) -> np.ndarray:
    """ORT's float32 requantization scale: the product of scales, divided by ``over``."""
    v = np.ones(1, np.float32)
    for s in scales:
        v = (v * np.asarray(s, np.float32).reshape(-1)).astype(np.float32)
    if over is not None:
        v = (v / np.asarray(over, np.float32).reshape(())).astype(np.float32)
    return np.asarray(v, np.float32)


def _scaled(w: np.ndarray, zp: np.ndarray | None, scale: np.ndarray, axis: int) -> np.ndarray:
    """Rule 8: ``(w - zp) * scale`` in float32, ``zp`` and ``scale`` per tensor or along ``axis``."""
    s = np.asarray(scale, np.float64)
    if s.size > 1:
        shape = [1] * w.ndim
        shape[axis] = s.size
        s = s.reshape(shape)
    return (_weights(w, zp, axis) * s.reshape(s.shape if s.size > 1 else ())).astype(np.float32)


def _requant(r: _Rewrite, v: ir.Value, y_s: np.ndarray, y_zp: ir.Value | None) -> ir.Value:
    """Rule 8: QuantizeLinear of ``v`` with the node's output scale and zero point."""
    assert y_zp is not None and y_zp.dtype is not None
    return r.quant(v, r.const(np.asarray(y_s, np.float32).reshape(()), "y_scale"), y_zp, y_zp.dtype)


def _qlinear_conv(r: _Rewrite) -> dict | None:
    n = r.node
    got = _consts(n, [1, 2, 3, 4, 5, 6, 7])
    x = _in(n, 0)
    if got is None or x is None or (_in(n, 8) is not None and _const(_in(n, 8)) is None):
        return None
    x_s, _, w, w_s, w_zp, y_s, _ = got
    bias = _const(_in(n, 8))
    if r.qdq:  # rule 8
        xf = _dq_const(r, x, _in(n, 1), _in(n, 2))
        if xf is None:
            return None
        inputs = [xf, r.const(_scaled(w, w_zp, w_s, 0), "w")]
        if bias is not None:
            ratio = np.asarray(x_s, np.float64).reshape(()) * np.asarray(w_s, np.float64).reshape(-1)
            inputs.append(r.const((bias.astype(np.float64) * ratio).astype(np.float32), "bias"))
        return {0: _requant(r, r.op("Conv", inputs, **_conv_attrs(n)), y_s, _in(n, 7))}
    acc = _conv_like(r, x, _in(n, 2), w, w_zp, bias)
    rank = len(w.shape)
    m = _ratio(x_s, w_s, over=y_s)
    if m.size > 1:
        m = m.reshape(1, -1, *([1] * (rank - 2)))
    v = r.op("Mul", [acc, r.const(m.reshape(m.shape if m.size > 1 else ()), "ratio")])
    y_zp = _in(n, 7)
    assert y_zp is not None and y_zp.dtype is not None
    return {0: r.quant(v, 1.0, y_zp, y_zp.dtype)}


def _qlinear_matmul(r: _Rewrite) -> dict | None:
    n = r.node
    got = _consts(n, [1, 2, 3, 4, 5, 6, 7])
    a = _in(n, 0)
    if got is None or a is None:
        return None
    a_s, _, b, b_s, b_zp, y_s, _ = got
    if r.qdq:  # rule 8
        af = _dq_const(r, a, _in(n, 1), _in(n, 2))
        if af is None:
            return None
        v = r.op("MatMul", [af, r.const(_scaled(b, b_zp, b_s, b.ndim - 1), "b")])
        return {0: _requant(r, v, y_s, _in(n, 7))}
    acc = _matmul_like(r, a, _in(n, 2), b, b_zp)
    m = _ratio(a_s, b_s, over=y_s)
    v = r.op("Mul", [acc, r.const(m if m.size > 1 else m.reshape(()), "ratio")])
    y_zp = _in(n, 7)
    assert y_zp is not None and y_zp.dtype is not None
    return {0: r.quant(v, 1.0, y_zp, y_zp.dtype)}


def _qgemm(r: _Rewrite) -> dict | None:
    n = r.node
    got = _consts(n, [1, 2, 3, 4, 5])
    a = _in(n, 0)
    c, y_s, y_zp = _in(n, 6), _in(n, 7), _in(n, 8)
    if (
        got is None
        or a is None
        or (c is not None and _const(c) is None)
        or (y_s is not None and _const(y_s) is None)
    ):
        return None
    if int(_attr(n, "transA", 0)):
        return None
    a_s, _, b, b_s, b_zp = got
    trans_b = int(_attr(n, "transB", 0))
    bk = b.T if trans_b else b  # [K, N]
    zk = b_zp
    cc = _const(c)
    if r.qdq:  # rule 8
        af = _dq_const(r, a, _in(n, 1), _in(n, 2))
        if af is None:
            return None
        scale_by = float(_attr(n, "alpha", 1.0))
        inputs = [af, r.const(_scaled(bk, zk, b_s, 1) * np.float32(scale_by), "b")]
        if cc is not None:
            ratio = (
                np.asarray(a_s, np.float64).reshape(()) * np.asarray(b_s, np.float64).reshape(-1) * scale_by
            )
            inputs.append(r.const((cc.astype(np.float64) * ratio).astype(np.float32), "c"))
        v = r.op("Gemm", inputs)
        ys = _const(y_s)
        return {0: v if ys is None else _requant(r, v, ys, y_zp)}
    bf = _weights(bk, zk, 1)
    span = _code_span(a, _const(_in(n, 2)))
    bound = np.abs(bf).sum(axis=0) * span + (np.abs(cc.astype(np.float64)) if cc is not None else 0)
    _refuse_inexact(n, float(np.max(bound, initial=0)))
    inputs = [_centered(r, a, _in(n, 2)), r.const(bf.astype(np.float32), "b")]
    if cc is not None:
        inputs.append(r.const(cc.astype(np.float32), "c"))
    acc = r.op("Gemm", inputs)
    alpha = np.float32(_attr(n, "alpha", 1.0))
    if y_s is None:
        m = _ratio(a_s, np.array([alpha]), b_s)
        return {0: r.op("Mul", [acc, r.const(m if m.size > 1 else m.reshape(()), "ratio")])}
    m = _ratio(a_s, b_s, np.array([alpha]), over=_const(y_s))
    v = r.op("Mul", [acc, r.const(m if m.size > 1 else m.reshape(()), "ratio")])
    assert y_zp is not None and y_zp.dtype is not None
    return {0: r.quant(v, 1.0, y_zp, y_zp.dtype)}


def _dynamic_quantize_linear(r: _Rewrite) -> dict | None:
    x = _in(r.node, 0)
    if x is None:
        return None
    zero, full = r.const(0.0, "zero"), r.const(255.0, "qmax")
    lo = r.op("Min", [r.op("ReduceMin", [x], keepdims=0), zero])
    hi = r.op("Max", [r.op("ReduceMax", [x], keepdims=0), zero])
    scale = r.op(
        "Where", [r.op("Equal", [hi, lo]), r.const(1.0, "one"), r.op("Div", [r.op("Sub", [hi, lo]), full])]
    )
    zp = r.op("Round", [r.clip(r.op("Sub", [zero, r.op("Div", [lo, scale])]), 0.0, 255.0)])
    q = r.clip(r.op("Add", [r.op("Round", [r.op("Div", [x, scale])]), zp]), 0.0, 255.0)
    zq = r.cast(zp, ir.DataType.UINT8)
    for v in (scale, zq):  # scalars by the op's definition, whatever x's shape (unknown before
        v.shape = ir.Shape([])  # a kept contrib op): MatMulInteger's rewrite needs a scalar A zero point
    return {0: r.cast(q, ir.DataType.UINT8), 1: scale, 2: zq}


# ------------------------------------------------------------------------ QOperator element ops


def _dq_const(r: _Rewrite, x: ir.Value | None, s: ir.Value | None, zp: ir.Value | None) -> ir.Value | None:
    """DequantizeLinear of ``x`` with constant per-tensor scale and zero point, or None."""
    sc, zc = _const(s), _const(zp)
    if x is None or sc is None or sc.size != 1 or (zp is not None and (zc is None or zc.size != 1)):
        return None
    return r.dequant(x, float(np.asarray(sc).reshape(())), zp)


def _out_zp(r: _Rewrite, zp: ir.Value | None, like: ir.Value | None) -> tuple[ir.Value | None, ir.DataType]:
    dt = zp.dtype if zp is not None and zp.dtype is not None else like.dtype if like is not None else None
    return zp, dt if dt is not None else ir.DataType.UINT8


def _qbinary(op: str) -> Callable[[_Rewrite], dict | None]:
    def rewrite(r: _Rewrite) -> dict | None:
        n = r.node
        c_s = _const(_in(n, 6))
        if c_s is None or (_in(n, 7) is not None and _const(_in(n, 7)) is None):
            return None
        a = _dq_const(r, _in(n, 0), _in(n, 1), _in(n, 2))
        b = _dq_const(r, _in(n, 3), _in(n, 4), _in(n, 5))
        if a is None or b is None:
            return None
        zp, dt = _out_zp(r, _in(n, 7), n.inputs[0])
        return {0: r.quant(r.op(op, [a, b]), r.const(c_s.reshape(()), "scale"), zp, dt)}

    return rewrite


def _qunary(build: Callable[[_Rewrite, ir.Value], ir.Value | None]) -> Callable[[_Rewrite], dict | None]:
    def rewrite(r: _Rewrite) -> dict | None:
        n = r.node
        y_s = _const(_in(n, 3))
        if y_s is None or (_in(n, 4) is not None and _const(_in(n, 4)) is None):
            return None
        x = _dq_const(r, _in(n, 0), _in(n, 1), _in(n, 2))
        if x is None:
            return None
        v = build(r, x)
        if v is None:
            return None
        zp, dt = _out_zp(r, _in(n, 4), n.inputs[0])
        return {0: r.quant(v, r.const(y_s.reshape(()), "scale"), zp, dt)}

    return rewrite


def _channels_last(r: _Rewrite, x: ir.Value, fn: Callable[[ir.Value], ir.Value]) -> ir.Value | None:
    if not int(_attr(r.node, "channels_last", 0)):
        return fn(x)
    shape = _shape(r.node.inputs[0])
    if shape is None:
        return None
    k = len(shape)
    to_first = [0, k - 1, *range(1, k - 1)]
    to_last = [0, *range(2, k), 1]
    return r.op("Transpose", [fn(r.op("Transpose", [x], perm=to_first))], perm=to_last)


def _pool_attrs(n: ir.Node) -> dict:
    keep = ("auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides", "dilations")
    return {k: _attr(n, k, None) for k in keep if n.attributes.get(k) is not None}


def _qlinear_softmax(r: _Rewrite, x: ir.Value) -> ir.Value | None:
    """Softmax with the semantics the node's ``opset`` attribute names (< 13: over the 2-D
    coercion at ``axis``, 13 on: over ``axis``), written for the model's own opset."""
    shape = _shape(r.node.inputs[0])
    if shape is None:
        return None
    rank = len(shape)
    axis = int(_attr(r.node, "axis", -1))
    axis = axis + rank if axis < 0 else axis
    coerce = int(_attr(r.node, "opset", 13)) < 13
    if axis == rank - 1 or coerce == (r.opset < 13):  # both semantics agree, or the model's is it
        return r.op("Softmax", [x], axis=axis)
    if coerce:  # the 2-D coercion in a model of opset 13 on
        rows = r.op("Reshape", [x, r.const([math.prod(shape[:axis]), -1], "rows", np.int64)])
        return r.op("Reshape", [r.op("Softmax", [rows], axis=1), r.const(shape, "shape", np.int64)])
    perm = [*(i for i in range(rank) if i != axis), axis]  # one axis in a model before 13
    back = [perm.index(i) for i in range(rank)]
    moved = r.op("Softmax", [r.op("Transpose", [x], perm=perm)], axis=rank - 1)
    return r.op("Transpose", [moved], perm=back)


def _qlinear_concat(r: _Rewrite) -> dict | None:
    n = r.node
    y_s, y_zp = _const(_in(n, 0)), _in(n, 1)
    if y_s is None or _const(y_zp) is None or (len(n.inputs) - 2) % 3:
        return None
    assert y_zp is not None and y_zp.dtype is not None
    parts = []
    for k in range(2, len(n.inputs), 3):
        x = _dq_const(r, _in(n, k), _in(n, k + 1), _in(n, k + 2))
        if x is None:
            return None
        parts.append(r.quant(x, r.const(y_s.reshape(()), "scale"), y_zp, y_zp.dtype))
    return {0: r.op("Concat", parts, axis=int(_attr(n, "axis", 0)))}


# ------------------------------------------------------------------------ float contrib ops


def _gelu_erf(r: _Rewrite, v: ir.Value) -> ir.Value:
    e = r.op("Erf", [r.op("Mul", [v, r.const(1.0 / math.sqrt(2.0), "rsqrt2")])])
    return r.op("Mul", [r.op("Mul", [v, r.const(0.5, "half")]), r.op("Add", [e, r.const(1.0, "one")])])


def _gelu_tanh(r: _Rewrite, v: ir.Value) -> ir.Value:
    cube = r.op("Mul", [r.op("Mul", [v, v]), v])
    inner = r.op("Add", [v, r.op("Mul", [cube, r.const(0.044715, "c")])])
    t = r.op("Tanh", [r.op("Mul", [inner, r.const(math.sqrt(2.0 / math.pi), "k")])])
    return r.op("Mul", [r.op("Mul", [v, r.const(0.5, "half")]), r.op("Add", [t, r.const(1.0, "one")])])


def _typed(r: _Rewrite, value: float, like: ir.Value) -> ir.Value:
    dt = like.dtype.numpy() if like.dtype is not None else np.float32
    return r.const(value, "c", dt)


def _gelu(r: _Rewrite) -> dict | None:
    x = _in(r.node, 0)
    if x is None or x.dtype != ir.DataType.FLOAT:
        return None
    if r.node.op_type == "BiasGelu":
        b = _in(r.node, 1)
        if b is None:
            return None
        x = r.op("Add", [x, b])
    return {0: _gelu_erf(r, x)}


def _fast_gelu(r: _Rewrite) -> dict | None:
    x, b = _in(r.node, 0), _in(r.node, 1)
    if x is None or x.dtype != ir.DataType.FLOAT:
        return None
    return {0: _gelu_tanh(r, r.op("Add", [x, b]) if b is not None else x)}


def _quick_gelu(r: _Rewrite) -> dict | None:
    x = _in(r.node, 0)
    if x is None or x.dtype != ir.DataType.FLOAT:
        return None
    alpha = float(_attr(r.node, "alpha", 1.702))
    return {0: r.op("Mul", [x, r.op("Sigmoid", [r.op("Mul", [x, r.const(alpha, "alpha")])])])}


def _bias_add(r: _Rewrite) -> dict | None:
    x, b, s = _in(r.node, 0), _in(r.node, 1), _in(r.node, 2)
    if x is None or b is None or s is None:
        return None
    return {0: r.op("Add", [r.op("Add", [x, b]), s])}


_FUSED = {
    "Relu": lambda r, v, p: r.op("Relu", [v]),
    "Tanh": lambda r, v, p: r.op("Tanh", [v]),
    "Sigmoid": lambda r, v, p: r.op("Sigmoid", [v]),
    "LeakyRelu": lambda r, v, p: r.op("LeakyRelu", [v], alpha=float(p[0] if p else 0.01)),
    "Clip": lambda r, v, p: r.clip(v, p[0], p[1]) if len(p) == 2 else None,
    "HardSigmoid": lambda r, v, p: r.op(
        "HardSigmoid", [v], alpha=float(p[0] if p else 0.2), beta=float(p[1] if len(p) > 1 else 0.5)
    ),
}


def _fused_conv(r: _Rewrite) -> dict | None:
    n = r.node
    x, w, b, z = _in(n, 0), _in(n, 1), _in(n, 2), _in(n, 3)
    act = str(_attr(n, "activation", "") or "")
    params = [float(p) for p in _attr(n, "activation_params", []) or []]
    if x is None or w is None or (act and act not in _FUSED) or (act == "Clip" and len(params) != 2):
        return None
    keep = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
    attrs = {k: _attr(n, k, None) for k in keep if n.attributes.get(k) is not None}
    y = r.op("Conv", [x, w, b] if b is not None else [x, w], **attrs)
    if z is not None:
        y = r.op("Add", [y, z])
    if act:
        y = _FUSED[act](r, y, params)
    return {0: y}


def _layer_norm(
    r: _Rewrite, v: ir.Value, gamma: ir.Value, beta: ir.Value | None, eps: float, axis: int, rank: int
):
    """LayerNormalization over ``axis``.. (the op from opset 17, its formula before)."""
    if r.opset >= 17:
        return r.op(
            "LayerNormalization", [v, gamma, beta] if beta is not None else [v, gamma], axis=axis, epsilon=eps
        )
    axes = list(range(axis % rank, rank))
    d = r.op("Sub", [v, r.reduce("ReduceMean", v, axes)])
    var = r.reduce("ReduceMean", r.op("Mul", [d, d]), axes)
    y = r.op("Mul", [r.op("Div", [d, r.op("Sqrt", [r.op("Add", [var, r.const(eps, "eps")])])]), gamma])
    return r.op("Add", [y, beta]) if beta is not None else y


def _rms_norm(r: _Rewrite, v: ir.Value, gamma: ir.Value, eps: float, axis: int, rank: int) -> ir.Value:
    axes = list(range(axis % rank, rank))
    ms = r.reduce("ReduceMean", r.op("Mul", [v, v]), axes)
    return r.op("Mul", [r.op("Div", [v, r.op("Sqrt", [r.op("Add", [ms, r.const(eps, "eps")])])]), gamma])


def _skip_norm(r: _Rewrite) -> dict | None:
    n = r.node
    simplified = n.op_type == "SkipSimplifiedLayerNormalization"
    x, skip, gamma = _in(n, 0), _in(n, 1), _in(n, 2)
    beta = None if simplified else _in(n, 3)
    bias = _in(n, 3 if simplified else 4)
    rank = len(_shape(x) or [])
    if x is None or skip is None or gamma is None or not rank or x.dtype != ir.DataType.FLOAT:
        return None
    if any(_used(o) for o in n.outputs[1:3]):
        return None  # mean / inv_std_var outputs
    s = r.op("Add", [x, skip])
    if bias is not None:
        s = r.op("Add", [s, bias])
    eps = float(_attr(n, "epsilon", 1e-12))
    y = _rms_norm(r, s, gamma, eps, -1, rank) if simplified else _layer_norm(r, s, gamma, beta, eps, -1, rank)
    out = {0: y}
    if len(n.outputs) > 3 and _used(n.outputs[3]):
        out[3] = s
    return out


def _simplified_norm(r: _Rewrite) -> dict | None:
    n = r.node
    x, gamma = _in(n, 0), _in(n, 1)
    rank = len(_shape(x) or [])
    if x is None or gamma is None or not rank or x.dtype != ir.DataType.FLOAT:
        return None
    if any(_used(o) for o in n.outputs[1:]):
        return None
    eps = float(_attr(n, "epsilon", 1e-5))
    return {0: _rms_norm(r, x, gamma, eps, int(_attr(n, "axis", -1)), rank)}


def _attention(r: _Rewrite) -> dict | None:
    n = r.node
    x, w, bias, mask = _in(n, 0), _in(n, 1), _in(n, 2), _in(n, 3)
    xs, ws = _shape(x), _shape(w)
    if x is None or w is None or xs is None or ws is None or len(xs) != 3 or x.dtype != ir.DataType.FLOAT:
        return None
    if any(_in(n, k) is not None for k in (4, 5, 6)) or any(_used(o) for o in n.outputs[1:]):
        return None
    heads = int(_attr(n, "num_heads", 0))
    sizes = [int(v) for v in _attr(n, "qkv_hidden_sizes", []) or []] or [ws[1] // 3] * 3
    if heads <= 0 or sum(sizes) != ws[1] or sizes[0] != sizes[1] or any(s % heads for s in sizes):
        return None
    B, S, _ = xs
    proj = r.op("MatMul", [x, w])
    if bias is not None:
        proj = r.op("Add", [proj, bias])
    bounds = np.cumsum([0, *sizes])

    def head(i: int, transpose: list[int]) -> ir.Value:
        part = r.op(
            "Slice",
            [
                proj,
                r.const([bounds[i]], "start", np.int64),
                r.const([bounds[i + 1]], "end", np.int64),
                r.const([2], "axis", np.int64),
            ],
        )
        shaped = r.op("Reshape", [part, r.const([B, S, heads, sizes[i] // heads], "shape", np.int64)])
        return r.op("Transpose", [shaped], perm=transpose)

    q, k, v = head(0, [0, 2, 1, 3]), head(1, [0, 2, 3, 1]), head(2, [0, 2, 1, 3])
    scale = _attr(n, "scale", None)
    scale = float(scale) if scale else 1.0 / math.sqrt(sizes[0] // heads)
    scores = r.op("Mul", [r.op("MatMul", [q, k]), r.const(scale, "scale")])
    filt = float(_attr(n, "mask_filter_value", -10000.0))
    if mask is not None:
        ms = _shape(mask)
        if ms == [B, S]:
            keep = r.cast(
                r.op("Reshape", [mask, r.const([B, 1, 1, S], "shape", np.int64)]), ir.DataType.FLOAT
            )
        elif ms == [B]:
            lens = r.cast(
                r.op("Reshape", [mask, r.const([B, 1, 1, 1], "shape", np.int64)]), ir.DataType.FLOAT
            )
            keep = r.cast(
                r.op("Less", [r.const(np.arange(S).reshape(1, 1, 1, S), "pos"), lens]), ir.DataType.FLOAT
            )
        else:
            return None
        # where(keep, s, s + filter): s + (1 - keep) * filter
        add = r.op("Mul", [r.op("Sub", [r.const(1.0, "one"), keep]), r.const(filt, "filter")])
        scores = r.op("Add", [scores, add])
    if int(_attr(n, "unidirectional", 0)):
        causal = np.where(np.tril(np.ones((S, S), bool)), 0.0, filt).astype(np.float32)
        scores = r.op("Add", [scores, r.const(causal, "causal")])
    y = r.op("MatMul", [r.op("Softmax", [scores], axis=-1), v])  # [B, n, S, dv]
    y = r.op("Transpose", [y], perm=[0, 2, 1, 3])
    return {0: r.op("Reshape", [y, r.const([B, S, sizes[2]], "shape", np.int64)])}


def _unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    per = 8 // bits
    p = packed.astype(np.uint8)
    parts = [(p >> (bits * i)) & ((1 << bits) - 1) for i in range(per)]
    return np.stack(parts, axis=-1).reshape(*p.shape[:-1], p.shape[-1] * per)


def _matmul_nbits(r: _Rewrite) -> dict | None:
    n = r.node
    a, b, scales, zp = _in(n, 0), _const(_in(n, 1)), _const(_in(n, 2)), _in(n, 3)
    K, N = int(_attr(n, "K", 0)), int(_attr(n, "N", 0))
    bits, block = int(_attr(n, "bits", 4)), int(_attr(n, "block_size", 0))
    if (
        a is None
        or b is None
        or scales is None
        or bits not in (2, 4, 8)
        or block <= 0
        or _in(n, 4) is not None
    ):
        return None
    if zp is not None and _const(zp) is None or a.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
        return None
    kb = (K + block - 1) // block
    codes = _unpack(b.reshape(N, kb, -1), bits)[:, :, :block].astype(np.float64)
    s = scales.reshape(N, kb).astype(np.float64)
    zc = _const(zp)
    if zc is None:
        z = np.full((N, kb), 2 ** (bits - 1), np.float64)
    elif zc.dtype == np.uint8:
        z = _unpack(zc.reshape(N, -1), bits)[:, :kb].astype(np.float64)
    else:
        z = zc.reshape(N, kb).astype(np.float64)
    wt = ((codes - z[..., None]) * s[..., None]).reshape(N, -1)[:, :K]
    y = r.op("MatMul", [a, r.const(wt.T, "w", a.dtype.numpy())])
    bias = _in(n, 5)
    return {0: r.op("Add", [y, bias]) if bias is not None else y}


def _gather_block_quantized(r: _Rewrite) -> dict | None:
    n = r.node
    data, idx, scales, zp = _const(_in(n, 0)), _in(n, 1), _const(_in(n, 2)), _in(n, 3)
    if data is None or idx is None or scales is None or (zp is not None and _const(zp) is None):
        return None
    from mconv.engines.reference.ops import OpContext
    from mconv.engines.reference.ops.contrib import gather_block_quantized

    # the table: every row gathered once, by the reference's own rule
    g_axis = int(_attr(n, "gather_axis", 0)) % data.ndim
    attrs = {k: _attr(n, k, None) for k in ("bits", "block_size", "gather_axis", "quantize_axis")}
    attrs = {k: v for k, v in attrs.items() if v is not None}
    rows = data.shape[g_axis]
    ins = [data, np.arange(rows, dtype=np.int64), scales] + ([_const(zp)] if zp is not None else [])
    (table,) = gather_block_quantized(ins, attrs, OpContext())
    if table.shape[g_axis] != rows:
        return None
    return {0: r.op("Gather", [r.const(table, "table", table.dtype), idx], axis=g_axis)}


def _qlinear_pool(r: _Rewrite, x: ir.Value) -> ir.Value | None:
    n = r.node
    if n.op_type == "QLinearGlobalAveragePool":
        return _channels_last(r, x, lambda v: r.op("GlobalAveragePool", [v]))
    return _channels_last(r, x, lambda v: r.op("AveragePool", [v], **_pool_attrs(n)))


def _on_codes(r: _Rewrite) -> dict | None:
    """Rule 8: an op ONNX Runtime's QOperator form runs on a QuantizeLinear's codes (a max pool,
    a reshape) between a DequantizeLinear and a QuantizeLinear with the codes' parameters
    (exact: these ops commute with a monotone per-tensor quantization)."""
    n = r.node
    x = _in(n, 0)
    q = x.producer() if r.qdq and x is not None else None
    if (
        x is None
        or q is None
        or q.op_type != "QuantizeLinear"
        or _used(n.outputs[1] if len(n.outputs) > 1 else None)
    ):
        return None
    sc, zp = _const(_in(q, 1)), _in(q, 2)
    zc = _const(zp)
    if sc is None or sc.size != 1 or zp is None or zc is None or zc.size != 1 or zp.dtype is None:
        return None
    xf = r.dequant(x, float(sc.reshape(())), zp)
    attrs = {k: _attr(n, k, None) for k in n.attributes}
    y = r.op(n.op_type, [xf, *n.inputs[1:]], **attrs)
    return {0: r.quant(y, r.const(sc.astype(np.float32).reshape(()), "scale"), zp, zp.dtype)}


_RULES: dict[tuple[str, str], Callable[[_Rewrite], dict | None]] = {
    **{("", op): _on_codes for op in ("MaxPool", "Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze")},
    ("", "DynamicQuantizeLinear"): _dynamic_quantize_linear,
    ("", "ConvInteger"): _conv_integer,
    ("", "MatMulInteger"): _matmul_integer,
    ("", "QLinearConv"): _qlinear_conv,
    ("", "QLinearMatMul"): _qlinear_matmul,
    (MS, "QGemm"): _qgemm,
    (MS, "QLinearAdd"): _qbinary("Add"),
    (MS, "QLinearMul"): _qbinary("Mul"),
    (MS, "QLinearSigmoid"): _qunary(lambda r, v: r.op("Sigmoid", [v])),
    (MS, "QLinearLeakyRelu"): _qunary(
        lambda r, v: r.op("LeakyRelu", [v], alpha=float(_attr(r.node, "alpha", 0.01)))
    ),
    (MS, "QLinearSoftmax"): _qunary(_qlinear_softmax),
    (MS, "QLinearAveragePool"): _qunary(_qlinear_pool),
    (MS, "QLinearGlobalAveragePool"): _qunary(_qlinear_pool),
    (MS, "QLinearConcat"): _qlinear_concat,
    (MS, "FusedConv"): _fused_conv,
    (MS, "Gelu"): _gelu,
    (MS, "BiasGelu"): _gelu,
    (MS, "FastGelu"): _fast_gelu,
    (MS, "QuickGelu"): _quick_gelu,
    (MS, "BiasAdd"): _bias_add,
    (MS, "SkipLayerNormalization"): _skip_norm,
    (MS, "SkipSimplifiedLayerNormalization"): _skip_norm,
    (MS, "SimplifiedLayerNormalization"): _simplified_norm,
    ("", "SimplifiedLayerNormalization"): _simplified_norm,
    (MS, "Attention"): _attention,
    (MS, "MatMulNBits"): _matmul_nbits,
    (MS, "GatherBlockQuantized"): _gather_block_quantized,
}


def _domain(node: ir.Node) -> str:
    return "" if node.domain in ("", "ai.onnx") else node.domain


def decompose(model: ir.Model, qdq: bool = False) -> int:
    """Rewrite every node of :data:`_RULES` whose rewrite applies now (rule 1); returns how
    many were rewritten. Call again after shape inference until it returns 0. ``qdq``: the
    integer products in QDQ form (rule 8)."""
    from mconv.edit.rewrite import taken_names

    taken = taken_names(model.graph)
    done = 0
    for node in list(model.graph):
        rule = _RULES.get((_domain(node), node.op_type))
        if rule is None:
            continue
        r = _Rewrite(model, node, taken, qdq)
        results = rule(r)
        if results is None:  # nodes built before the rule gave up are removed again
            for extra in reversed(r.created):
                model.graph.remove(extra, safe=True)
            continue
        r.finish(results)
        done += 1
    return done


def contrib_shapes(model: ir.Model) -> bool:
    """Rule 6: the outputs of the contrib nodes kept (:data:`KEPT`) get their shapes from their
    inputs' (shape inference knows no contrib schema); returns whether any shape was set."""
    changed = False
    for node in model.graph:
        if (_domain(node), node.op_type) != (MS, "DynamicQuantizeLSTM"):
            continue
        xs, ws = _shape(_in(node, 0)), _shape(_in(node, 2))
        if xs is None or ws is None or len(xs) != 3 or len(ws) != 3:
            continue
        T, B = xs[0], xs[1]
        nd, H = ws[0], ws[1]
        shapes = [[T, nd, B, H], [nd, B, H], [nd, B, H]]
        for out, shape in zip(node.outputs, shapes):
            if out is not None and _shape(out) != shape:
                out.shape = ir.Shape(shape)
                if out.dtype is None:
                    out.dtype = ir.DataType.FLOAT
                changed = True
    return changed
