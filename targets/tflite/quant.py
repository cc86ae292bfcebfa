"""Precision of a lowered TFLite graph: float16 weights, dynamic-range int8 weights, full int8.

Rules:

1. ``fp16``: every float constant of more than one element is stored float16 and read through a
   DEQUANTIZE at the head of the graph (LiteRT's own float16 form); compute stays float32.
2. ``int8-weights`` (dynamic range): conv filters int8 per output channel, fully connected
   weights int8 per tensor, symmetric (zero point 0, codes in [-127, 127]); LiteRT's hybrid kernels
   quantize activations on the fly. Everything else stays float.
3. ``int8`` (full integer): activation ranges come from running the float graph in LiteRT on the
   calibration samples with every tensor kept (:func:`calibrate`): ``minmax`` (the extremes),
   ``percentile`` (the ``percentile``-th and ``100 - percentile``-th of a seeded sample of each
   tensor's values) or ``entropy`` (the clip of |x| that minimizes the KL divergence between the
   128-level quantized histogram and the float one, TensorRT's method). Each range is widened to
   hold 0 and quantized asymmetric: ``scale = (max - min) / 255``, ``zero_point = round(-128 -
   min / scale)``.
4. Weights: conv filters int8 per output channel (axis 0; depthwise axis 3), fully connected per
   tensor, symmetric; biases int32 with ``scale = input_scale * weight_scale`` and zero point 0
   (LiteRT's requirements). Other constants read by an int8 op: int8 per tensor from their own
   range, or the range of the op's input where the op needs equal parameters.
   A constant holding inf, NaN or magnitudes over :data:`HUGE` (an attention mask of -inf or
   of float32's lowest) is refused by name: no int8 step holds it, and LiteRT aborts the
   process on the scale ratios it would give.
5. LiteRT's int8 kernels fix some parameters: SOFTMAX and LOGISTIC output ``1/256, -128``, TANH
   ``1/128, 0``, LOG_SOFTMAX ``16/256, 127``; RESHAPE, TRANSPOSE, pools, PAD(V2), CONCATENATION,
   MAXIMUM/MINIMUM, REDUCE_MAX and STRIDED_SLICE take and give one set of parameters, so their
   inputs and outputs share one range (the union), or the fixed parameters where one is fixed;
   except a CONCATENATION that joins a fixed-parameter value (a sigmoid's scores) to others (box
   coordinates): the fixed input gets a QUANTIZE (an int8-to-int8 requantization) to the range of
   the rest, which would otherwise be clipped to the fixed one's [-0.5, 0.5) or [0, 1).
6. An op with no int8 kernel (:data:`INT8_OPS` lists those with one) runs in float between a
   DEQUANTIZE and a QUANTIZE: a per-layer float fallback, named in the export's notes.
7. Inputs and outputs stay float (QUANTIZE after each input, DEQUANTIZE before each output) unless
   ``io_dtype`` is ``int8`` or ``uint8``: then they are the codes themselves (uint8 with zero point
   + 128, through a QUANTIZE to int8). An 8-bit input or output of the model itself (its codes,
   no quantization parameters: an imported int8 file's input that the graph casts) stays as it is.
8. The int8 file is measured against the float one on the calibration samples (the per-output
   rules of :mod:`mconv.targets.tflite.gate`). An output that fails and comes from a SOFTMAX or
   LOGISTIC (through ops that keep parameters) is an int8 output LiteRT's fixed ``1/256`` step
   cannot resolve (a 1,000-way distribution rounds to zeros): with float outputs, that op runs in
   float on dequantized inputs and its output leaves the graph as float, and the file is measured
   again. What still fails is said in the export's notes: the file is not silently worse.
9. ``bits=16`` (LiteRT's 16x8 mode): activations int16, symmetric (``scale = max(|lo|, |hi|) /
   32767``, zero point 0, as LiteRT's 16-bit kernels require); weights int8 as rule 4, fully
   connected ones per output channel too (LiteRT's 16x8 kernel takes them); biases
   int64 (``scale = input_scale * weight_scale``); other constants int16 per tensor; SOFTMAX,
   LOGISTIC and TANH output ``1/32768, 0``; ADD and SUB take general scales
   (``pot_scale_int16`` false). :data:`INT16_OPS` have 16-bit kernels, the rest run in float
   (rule 6). Inputs and outputs are float32 (a QUANTIZE after each input, a DEQUANTIZE before
   each output).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from mconv.quantmath import SAMPLE_VALUES, affine, symmetric
from mconv.quantmath import entropy_range as _entropy_range
from mconv.quantmath import mse_range as _mse_range
from mconv.targets.tflite.schema import Graph, Op, Quant, Tensor

INT8_OPS = frozenset(
    {
        "CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "ADD", "SUB", "MUL", "MAX_POOL_2D",
        "AVERAGE_POOL_2D", "RESHAPE", "TRANSPOSE", "CONCATENATION", "SOFTMAX", "LOGISTIC", "TANH",
        "RELU", "RELU6", "RELU_N1_TO_1", "LEAKY_RELU", "HARD_SWISH", "MEAN", "REDUCE_MAX", "PAD",
        "PADV2", "MAXIMUM", "MINIMUM", "LOG_SOFTMAX", "STRIDED_SLICE", "SQUEEZE", "SPLIT",
        "SPLIT_V", "RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR",
    }
)  # fmt: skip
SAME_PARAMS = frozenset(
    {"RESHAPE", "TRANSPOSE", "MAX_POOL_2D", "AVERAGE_POOL_2D", "PAD", "PADV2", "CONCATENATION",
     "MAXIMUM", "MINIMUM", "REDUCE_MAX", "STRIDED_SLICE", "SQUEEZE", "SPLIT", "SPLIT_V",
     "RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR"}
)  # fmt: skip
FIXED = {
    "SOFTMAX": (1 / 256, -128),
    "LOGISTIC": (1 / 256, -128),
    "TANH": (1 / 128, 0),
    "LOG_SOFTMAX": (16 / 256, 127),
}
_WEIGHT_AXIS = {"CONV_2D": 0, "DEPTHWISE_CONV_2D": 3, "FULLY_CONNECTED": None}
# rule 9: LiteRT's 16x8 kernels (int16 activations, int8 weights); the rest run in float
INT16_OPS = frozenset(
    {
        "CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "ADD", "SUB", "MUL", "MAX_POOL_2D",
        "AVERAGE_POOL_2D", "RESHAPE", "TRANSPOSE", "CONCATENATION", "SOFTMAX", "LOGISTIC", "TANH",
        "RELU", "RELU6", "LEAKY_RELU", "MEAN", "REDUCE_MAX", "PAD", "PADV2", "MAXIMUM", "MINIMUM",
        "STRIDED_SLICE", "SQUEEZE", "SPLIT", "RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR",
    }
)  # fmt: skip
FIXED16 = {"SOFTMAX": (1 / 32768, 0), "LOGISTIC": (1 / 32768, 0), "TANH": (1 / 32768, 0)}


def symmetric16(lo: float, hi: float) -> tuple[float, int]:
    """Rule 9: int16 scale (zero point 0) of the range [lo, hi]: ``max(|lo|, |hi|) / 32767``."""
    m = max(abs(float(lo)), abs(float(hi)))
    return (m / 32767.0 if m > 0 else 1.0), 0


def to_fp16(g: Graph) -> int:
    """Rule 1; returns how many constants became float16."""
    heads: list[Op] = []
    count = 0
    for i, t in enumerate(list(g.tensors)):
        if t.data is None or t.data.dtype != np.float32 or t.data.size <= 1:
            continue
        half = g.add(Tensor(t.name + "/fp16", t.shape, "float16", t.data.astype(np.float16)))
        t.data = None  # the float32 tensor is now the DEQUANTIZE's output
        heads.append(Op("DEQUANTIZE", [half], [i], "DequantizeOptions"))
        count += 1
    g.ops = heads + g.ops
    return count


def to_dynamic_range(g: Graph) -> int:
    """Rule 2; returns how many weights became int8."""
    count = 0
    for op in g.ops:
        if op.code not in _WEIGHT_AXIS or len(op.inputs) < 2:
            continue
        t = g.tensors[op.inputs[1]]
        if t.data is None or t.data.dtype != np.float32:
            continue
        axis = _WEIGHT_AXIS[op.code]
        q, scale = symmetric(t.data, axis)
        new = Tensor(
            t.name + "/int8", t.shape, "int8", q, Quant(scale, np.zeros(scale.size, np.int64), axis or 0)
        )
        op.inputs[1] = g.add(new)
        count += 1
    return count


# ---- calibration ------------------------------------------------------------------------------


def _batches(
    feeds: dict[str, np.ndarray], shapes: dict[str, list[int]], limit: int
) -> list[dict[str, np.ndarray]]:
    """Samples cut to the graph's static batch (one LiteRT invocation each), at most ``limit``."""
    name = next(iter(feeds))
    total = int(np.asarray(feeds[name]).shape[0])
    batch = max(int(shapes[name][0]), 1) if shapes[name] else 1
    out = []
    for start in range(0, min(total, limit) - batch + 1, batch):
        out.append({k: np.asarray(v)[start : start + batch] for k, v in feeds.items()})
    return out


def calibrate(
    model: bytes,
    g: Graph,
    feeds: dict[str, np.ndarray],
    method: str = "minmax",
    limit: int = 500,
    percentile: float = 99.99,
) -> dict[int, tuple[float, float]]:
    """Rule 3: per float activation tensor of ``g`` (whose serialization is ``model``), its range."""
    return calibrate_methods(model, g, feeds, (method,), limit, percentile)[method]


def calibrate_methods(
    model: bytes,
    g: Graph,
    feeds: dict[str, np.ndarray],
    methods: Sequence[str],
    limit: int = 500,
    percentile: float = 99.99,
    hessians: Any = None,
) -> dict[str, dict[int, tuple[float, float]]]:
    """Rule 3 for each of ``methods`` from one pass over the samples: method -> tensor -> range.
    ``hessians`` (:class:`mconv.targets.tflite.gptq.Hessians`) gathers its sums on the same runs."""
    import warnings

    from mconv.targets.tflite.litert import open_interpreter

    with warnings.catch_warnings():  # LiteRT calls keeping every tensor a debugging aid: it is ours
        warnings.simplefilter("ignore")
        interp = open_interpreter(model, experimental_preserve_all_tensors=True)
    by_name = {d["name"]: d["index"] for d in interp.get_input_details()}
    dtypes = {d["name"]: d["dtype"] for d in interp.get_input_details()}  # an int8 input stays int8
    watch = [i for i, t in enumerate(g.tensors) if t.data is None and t.dtype == "float32"]
    lo = {i: np.inf for i in watch}
    hi = {i: -np.inf for i in watch}
    kept: dict[int, list[np.ndarray]] = {i: [] for i in watch}
    keep = any(m != "minmax" for m in methods)
    rng = np.random.default_rng(0)
    shapes = {g.tensors[i].name: g.tensors[i].shape for i in g.inputs}
    runs = _batches(feeds, shapes, limit)
    if not runs:
        raise ValueError("no calibration sample")
    for k, feed in enumerate(runs):
        for name, arr in feed.items():
            interp.set_tensor(by_name[name], np.ascontiguousarray(arr, dtypes[name]))
        interp.invoke()
        if hessians is not None:
            hessians.add(interp.get_tensor, k, len(runs))
        for i in watch:
            a = interp.get_tensor(i).ravel()
            if a.size == 0:
                continue
            lo[i] = min(lo[i], float(a.min()))
            hi[i] = max(hi[i], float(a.max()))
            if keep:
                kept[i].append(a if a.size <= SAMPLE_VALUES else rng.choice(a, SAMPLE_VALUES, replace=False))
    out: dict[str, dict[int, tuple[float, float]]] = {m: {} for m in methods}
    for i in watch:
        if not np.isfinite(lo[i]):
            continue
        values = np.concatenate(kept[i]).astype(np.float64) if keep else np.zeros(0)
        values = values[np.isfinite(values)]  # a NaN the float graph makes (0/0) bounds nothing
        for method in methods:
            if method == "minmax" or values.size == 0:
                out[method][i] = (lo[i], hi[i])
            elif method == "percentile":
                out[method][i] = (
                    float(np.percentile(values, 100 - percentile)),
                    float(np.percentile(values, percentile)),
                )
            elif method == "mse":
                out[method][i] = _mse_range(values, lo[i], hi[i], rng)
            else:
                out[method][i] = _entropy_range(values, lo[i], hi[i])
    return out


class _Union:
    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, x: int) -> int:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def join(self, a: int, b: int) -> None:
        self.parent[self.find(a)] = self.find(b)


def to_int8(
    g: Graph,
    ranges: dict[int, tuple[float, float]],
    io_dtype: str = "float32",
    float_ops: frozenset[int] = frozenset(),
    bits: int = 8,
    rounding: Callable[[int, np.ndarray, int | None], tuple[np.ndarray, np.ndarray] | None] | None = None,
) -> list[str]:
    """Rules 4-9 on ``g`` in place; returns the ops that fell back to float (rules 6 and 8).
    ``float_ops``: indices into ``g.ops`` kept float although they have an int8 kernel (rule 8).
    ``bits`` 16: int16 activations (rule 9, LiteRT's 16x8 mode), inputs and outputs float32.
    ``rounding(tensor, weights, axis)``: a weight's int8 codes and scales chosen another way
    (:class:`mconv.targets.tflite.gptq.Rounder`), or None for the nearest codes."""
    if bits not in (8, 16):
        raise ValueError(f"activation bits {bits}: 8 or 16")
    wide = bits == 16
    if wide and io_dtype != "float32":
        raise ValueError("16x8 files take and give float32")
    kernels = INT16_OPS if wide else INT8_OPS
    fixed_of = FIXED16 if wide else FIXED
    act, span = ("int16", 32767) if wide else ("int8", 127)
    params: dict[int, tuple[float, int]] = {}
    union = _Union()
    fixed: dict[int, tuple[float, int]] = {}
    acts = {i for i, t in enumerate(g.tensors) if t.data is None and t.dtype == "float32"}
    # a value made by a float op and read only by float ops (or leaving as a float output) stays
    # float: no QUANTIZE/DEQUANTIZE round trip between two float ops (rules 6 and 8)
    floats = {k for k, op in enumerate(g.ops) if op.code not in kernels or k in float_ops}
    made_by = {o: k for k, op in enumerate(g.ops) for o in op.outputs}
    readers: dict[int, set[int]] = {}
    for k, op in enumerate(g.ops):
        for i in op.inputs:
            readers.setdefault(i, set()).add(k)
    acts -= {
        t
        for t in acts
        if (made_by.get(t) in floats or t in g.inputs)
        and readers.get(t, set()) <= floats
        and (io_dtype == "float32" or (t not in g.outputs and t not in g.inputs))
    }
    group_fixed: dict[int, tuple[float, int]] = {}  # a group's root -> its fixed parameters

    def join(a: int, b: int) -> None:
        fp = group_fixed.get(union.find(a)) or group_fixed.get(union.find(b))
        union.join(a, b)
        if fp is not None:
            group_fixed[union.find(a)] = fp

    for k, op in enumerate(g.ops):
        if op.code not in kernels or k in float_ops:
            continue
        if op.code in ("SPLIT", "SPLIT_V"):  # inputs: axis, value / value, sizes, axis
            src = op.inputs[1] if op.code == "SPLIT" else op.inputs[0]
            for o in op.outputs:
                join(src, o)
        elif op.code == "CONCATENATION":  # rule 5: a fixed-parameter input beside others is requantized
            ins = [t for t in op.inputs if t in acts]
            fixes = [group_fixed.get(union.find(t)) for t in ins]
            mixed = any(p is not None for p in fixes) and len(set(fixes)) > 1
            for t, fp in zip(ins, fixes):
                if not (mixed and fp is not None):
                    join(t, op.outputs[0])
        elif op.code in SAME_PARAMS:
            if op.inputs[0] in acts:
                join(op.inputs[0], op.outputs[0])
        if op.code in fixed_of:
            fixed[op.outputs[0]] = fixed_of[op.code]
            group_fixed[union.find(op.outputs[0])] = fixed_of[op.code]
    groups: dict[int, list[int]] = {}
    for i in acts:
        groups.setdefault(union.find(i), []).append(i)
    for members in groups.values():
        fix = next((fixed[m] for m in members if m in fixed), None)
        if fix is None:
            known = [ranges[m] for m in members if m in ranges]
            lo = min((r[0] for r in known), default=0.0)
            hi = max((r[1] for r in known), default=0.0)
            fix = symmetric16(lo, hi) if wide else affine(lo, hi)
        for m in members:
            params[m] = fix
    for i in acts:
        s, z = params[i]
        g.tensors[i].dtype = act
        g.tensors[i].quant = Quant(np.array([s], np.float32), np.array([z], np.int64))
    fallback: list[str] = []
    new_ops: list[Op] = []
    qcache: dict[tuple, int] = {}

    def qconst(t_idx: int, role: tuple) -> int:
        key = (t_idx, role)
        if key in qcache:
            return qcache[key]
        t = g.tensors[t_idx]
        a = t.data
        assert a is not None
        if role[0] == "weight":
            got = rounding(t_idx, a, role[1]) if rounding is not None else None
            q, scale = got if got is not None else symmetric(a, role[1])
            quant = Quant(scale, np.zeros(scale.size, np.int64), role[1] or 0)
            new = Tensor(t.name + "/int8", t.shape, "int8", q, quant)
        elif role[0] == "bias":  # int32; int64 under 16x8 (LiteRT's 16x8 kernels take int64)
            scale = np.asarray(role[1], np.float64)
            top = 2**47 if wide else 2**31
            b = np.clip(np.round(a.astype(np.float64) / scale), -top, top - 1)
            bias_type = "int64" if wide else "int32"
            new = Tensor(
                t.name + "/" + bias_type,
                t.shape,
                bias_type,
                b.astype(bias_type),
                Quant(scale.astype(np.float32), np.zeros(scale.size, np.int64)),
            )
        else:  # per tensor, given or own parameters
            if not np.isfinite(a).all() or float(np.abs(a).max(initial=0)) > HUGE:
                # an attention mask of -inf or float32's lowest: no int8 step holds it and the
                # rest (LiteRT aborts on the scale ratios it gives)
                from mconv.errors import UnsupportedError

                raise UnsupportedError(
                    [(t.name, f"constant holding inf, NaN or values over {HUGE:g} (no int8 step for it)")],
                    what="tensor",
                    hint="export at --precision fp32, fp16 or int8-weights",
                )
            if role[0] == "params":
                s, z = role[1]
            else:
                s, z = (symmetric16 if wide else affine)(float(a.min()), float(a.max()))
            q = np.clip(np.round(a.astype(np.float64) / s) + z, -span - 1, span).astype(act)
            new = Tensor(
                t.name + "/" + act,
                t.shape,
                act,
                q,
                Quant(np.array([s], np.float32), np.array([z], np.int64)),
            )
        qcache[key] = g.add(new)
        return qcache[key]

    def float_copy(i: int, suffix: str) -> int:
        t = g.tensors[i]
        return g.add(Tensor(t.name + suffix, list(t.shape), "float32"))

    for k, op in enumerate(g.ops):
        if op.code not in kernels or k in float_ops:  # rules 6 and 8
            fallback.append(f"{op.label or op.code} ({op.code})")
            ins = []
            for i in op.inputs:
                if i in acts:
                    f = float_copy(i, "/float")
                    new_ops.append(Op("DEQUANTIZE", [i], [f], "DequantizeOptions"))
                    ins.append(f)
                else:
                    ins.append(i)
            outs, tail = [], []
            for o in op.outputs:
                if o in acts:
                    f = float_copy(o, "/float")
                    tail.append(Op("QUANTIZE", [f], [o], "QuantizeOptions"))
                    outs.append(f)
                else:
                    outs.append(o)
            op.inputs, op.outputs = ins, outs
            new_ops += [op, *tail]
            continue
        ins = list(op.inputs)
        if op.code in _WEIGHT_AXIS and len(ins) > 1 and g.tensors[ins[1]].data is not None:
            axis = 0 if wide and op.code == "FULLY_CONNECTED" else _WEIGHT_AXIS[op.code]
            ins[1] = qconst(ins[1], ("weight", axis))
            if len(ins) > 2 and ins[2] >= 0 and g.tensors[ins[2]].data is not None:
                s_in = params[ins[0]][0]
                wq = g.tensors[ins[1]].quant
                assert wq is not None
                ins[2] = qconst(ins[2], ("bias", tuple((s_in * wq.scale.astype(np.float64)).tolist())))
        else:
            for k, i in enumerate(ins):
                c = g.tensors[i] if i >= 0 else None
                if c is None or c.data is None or c.data.dtype != np.float32:
                    continue
                if op.code in SAME_PARAMS:
                    ins[k] = qconst(i, ("params", params[op.outputs[0]]))
                else:
                    ins[k] = qconst(i, ("own",))
        if op.code == "CONCATENATION":  # requantize an input whose parameters are not the output's
            for k, i in enumerate(ins):
                if i in acts and params[i] != params[op.outputs[0]]:
                    given = g.tensors[i]
                    r = g.add(
                        Tensor(
                            given.name + "/requant",
                            list(given.shape),
                            act,
                            None,
                            g.tensors[op.outputs[0]].quant,
                        )
                    )
                    new_ops.append(Op("QUANTIZE", [i], [r], "QuantizeOptions"))
                    ins[k] = r
        if wide and op.code in ("ADD", "SUB"):  # general scales, not powers of two only
            op.options["PotScaleInt16"] = False
        op.inputs = ins
        new_ops.append(op)
    g.ops = new_ops
    _io(g, io_dtype)
    return fallback


def _io(g: Graph, io_dtype: str) -> None:
    """Rule 7."""
    heads, tails = [], []
    rewire: dict[int, int] = {}
    for i in g.inputs:
        t = g.tensors[i]
        if t.dtype == "int16" and t.quant is not None:  # rule 9: 16x8 files take float32
            q = g.add(Tensor(t.name + "/int16", list(t.shape), "int16", None, t.quant))
            rewire[i] = q
            t.dtype, t.quant = "float32", None
            heads.append(Op("QUANTIZE", [i], [q], "QuantizeOptions"))
            continue
        if t.dtype != "int8" or io_dtype == "int8" or t.quant is None:  # None: the model's own codes
            continue
        q = g.add(Tensor(t.name + "/int8", list(t.shape), "int8", None, t.quant))
        rewire[i] = q
        assert t.quant is not None
        if io_dtype == "uint8":
            t.dtype = "uint8"
            t.quant = Quant(t.quant.scale, t.quant.zero_point + 128)
        else:
            t.dtype, t.quant = "float32", None
        heads.append(Op("QUANTIZE", [i], [q], "QuantizeOptions"))
    for op in g.ops:
        op.inputs = [rewire.get(i, i) for i in op.inputs]
    for o in g.outputs:
        t = g.tensors[o]
        if t.dtype == "int16" and t.quant is not None:  # rule 9: 16x8 files give float32
            q = g.add(Tensor(t.name + "/int16", list(t.shape), "int16", None, t.quant))
            for op in g.ops:
                op.outputs = [q if x == o else x for x in op.outputs]
                op.inputs = [q if x == o else x for x in op.inputs]
            t.dtype, t.quant = "float32", None
            tails.append(Op("DEQUANTIZE", [q], [o], "DequantizeOptions"))
            continue
        if t.dtype != "int8" or io_dtype == "int8" or t.quant is None:
            continue
        q = g.add(Tensor(t.name + "/int8", list(t.shape), "int8", None, t.quant))
        for op in g.ops:
            op.outputs = [q if x == o else x for x in op.outputs]
            op.inputs = [q if x == o else x for x in op.inputs]
        assert t.quant is not None
        if io_dtype == "uint8":
            t.dtype = "uint8"
            t.quant = Quant(t.quant.scale, t.quant.zero_point + 128)
            tails.append(Op("QUANTIZE", [q], [o], "QuantizeOptions"))
        else:
            t.dtype, t.quant = "float32", None
            tails.append(Op("DEQUANTIZE", [q], [o], "DequantizeOptions"))
    g.ops = heads + g.ops + tails


def quant_params(t: Tensor) -> tuple[np.ndarray, np.ndarray] | None:
    return None if t.quant is None else (t.quant.scale, t.quant.zero_point)


def names(g: Graph, indices: Sequence[int]) -> list[str]:
    return [g.tensors[i].name for i in indices]


# ---- compressed (clustered, int8-representable) weights -----------------------------------------

PALETTE_MODES = ("int8", "fp16", "float32")
HUGE = 1e30  # a constant beyond this magnitude is a mask, not a value int8 can step over
MIN_ELEMENTS = 16  # smaller weights stay as they are (the cluster pass's own floor)
_PALETTE_AXIS = {"CONV_2D": 0, "DEPTHWISE_CONV_2D": 3, "FULLY_CONNECTED": 0}


def grid_codes(w: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Rule 8: int8 codes and per-channel scales that give back ``w`` exactly, or None.

    A channel is exact when its values are ``q * s`` (as float32, the product LiteRT's
    DEQUANTIZE computes) for integers ``|q| <= 127``; the coarsest such grid is taken (the largest
    magnitude is ``m * s`` for the smallest ``m`` that works)."""
    moved = np.moveaxis(w.astype(np.float32), axis, 0).reshape(w.shape[axis], -1)
    scales = np.ones(moved.shape[0], np.float32)
    for c, row in enumerate(moved):
        u = np.unique(row)
        if u.size > 255:
            return None
        top = float(np.abs(u).max())
        if top == 0:
            continue
        for m in range(1, 128):
            s = np.float32(top / m)
            if np.array_equal(np.round(u / s).astype(np.float32) * s, u):
                scales[c] = s
                break
        else:
            return None
    view = scales.reshape([-1 if i == axis else 1 for i in range(w.ndim)])
    q = np.round(w.astype(np.float32) / view)
    if np.abs(q).max() > 127:
        return None
    return q.astype(np.int8), scales


def compress_palettes(g: Graph, clustered: bool, mode: str = "int8") -> list[dict]:
    """Rules 8-9 on ``g`` in place (float compute); one record per weight it stored anew.

    A float32 weight of a CONV_2D, DEPTHWISE_CONV_2D or FULLY_CONNECTED of at least
    :data:`MIN_ELEMENTS` values is stored as int8 codes with per-channel scales, dequantized at
    load (DEQUANTIZE at the head of the graph), when its values lie exactly on an int8 grid per
    channel (:func:`grid_codes`: lossless, whatever the model). In a clustered model
    (``clustered``) a weight with at most 256 distinct values that is not on a grid is stored as
    ``mode`` says: ``int8`` per-channel symmetric (max |w| / 127; its error is recorded), ``fp16``
    (its error recorded too)
    or ``float32``: every weight left as it is, grids included."""
    records: list[dict] = []
    if mode == "float32":
        return records
    heads: list[Op] = []
    seen: set[int] = set()
    for op in g.ops:
        if op.code not in _PALETTE_AXIS or len(op.inputs) < 2:
            continue
        idx = op.inputs[1]
        t = g.tensors[idx]
        if idx in seen or t.data is None or t.data.dtype != np.float32 or t.data.size < MIN_ELEMENTS:
            continue
        seen.add(idx)
        w = t.data
        axis = _PALETTE_AXIS[op.code]
        distinct = int(np.unique(w).size)
        rec: dict = {"name": t.name, "elements": int(w.size), "values": distinct}
        exact = grid_codes(w, axis) if distinct <= 256 * w.shape[axis] else None
        if exact is not None:
            q, scale = exact
            rec.update(stored="int8", exact=True, max_error=0.0)
        elif clustered and distinct <= 256 and mode == "int8":
            q, scale = symmetric(w, axis)
            view = scale.reshape([-1 if i == axis else 1 for i in range(w.ndim)])
            err = np.abs(q.astype(np.float32) * view - w)
            top = float(np.abs(w).max()) or 1.0
            rec.update(stored="int8", exact=False, max_error=float(err.max()) / top)
        elif clustered and distinct <= 256 and mode == "fp16":
            half = w.astype(np.float16)
            err = float(np.abs(half.astype(np.float32) - w).max()) / (float(np.abs(w).max()) or 1.0)
            new = g.add(Tensor(t.name + "/fp16", list(t.shape), "float16", half))
            t.data = None
            heads.append(Op("DEQUANTIZE", [new], [idx], "DequantizeOptions"))
            rec.update(stored="float16", exact=err == 0.0, max_error=err)
            records.append(rec)
            continue
        else:
            continue
        quant = Quant(scale.astype(np.float32), np.zeros(scale.size, np.int64), axis)
        new = g.add(Tensor(t.name + "/int8", list(t.shape), "int8", q, quant))
        t.data = None  # the float32 tensor is now the DEQUANTIZE's output
        heads.append(Op("DEQUANTIZE", [new], [idx], "DequantizeOptions"))
        records.append(rec)
    g.ops = heads + g.ops
    return records


def qdq_ranges(
    g: Graph, qparams: dict[int, tuple[float, int]], complete: bool = True
) -> dict[int, tuple[float, float]]:
    """Writer rule 4: the range whose :func:`affine` parameters are a QDQ pair's (scale, zero point),
    per tensor. ``complete``: every float activation must have one (an InputError names those
    that have none: they need calibration samples)."""
    from mconv.errors import InputError

    ranges = {i: ((-128 - z) * s, (127 - z) * s) for i, (s, z) in qparams.items()}
    if complete:
        missing = [
            t.name
            for i, t in enumerate(g.tensors)
            if t.data is None and t.dtype == "float32" and i not in ranges
        ]
        if missing:
            raise InputError(
                f"{len(missing)} tensor(s) have no QuantizeLinear/DequantizeLinear parameters: "
                + ", ".join(missing[:8])
                + (", ..." if len(missing) > 8 else ""),
                where="--precision int8",
                hint="give --data samples.npz to calibrate them",
            )
    return ranges
