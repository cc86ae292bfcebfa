"""quantize(mode='static'): int8 activations from calibration data, as QuantizeLinear/DequantizeLinear (QDQ).

::

    before: y = Conv(x, W, b)
    after:  xq = QuantizeLinear(x, sx, zx); x' = DequantizeLinear(xq, sx, zx)
            W' = DequantizeLinear(W_int8, W_scale, axis=0)          (the quantize pass's rules)
            y0 = Conv(x', W', b); y = DequantizeLinear(QuantizeLinear(y0, sy, zy), sy, zy)

Rules:

1. Needs ``--data`` (calibration feeds keyed by input name); at most ``samples`` samples are run
   through the reference executor, one static batch at a time, every value kept.
2. Ranges per activation (the input and output of each Conv/Gemm/MatMul with a constant float
   weight) by ``method``: ``minmax``, ``percentile`` (``percentile`` and ``100 - percentile`` of a
   seeded sample of each value) or ``entropy`` (KL-optimal clip of |x|), the same calibration
   methods and int8 parameters as the tflite target's full-int8 writer
   (:mod:`mconv.quantmath`): the range widened to hold 0, ``scale = (max - min) / 255``,
   ``zero_point = round(-128 - min / scale)``, int8.
3. Weights: int8 per output channel, symmetric, through the ``quantize`` pass (its rules).
   Biases stay float (ONNX Runtime folds them into its integer kernels itself).
4. Per-layer fallback: a node whose config says ``skip`` (``quantize(mode=static, op_name={"conv2":
   {"skip": true}})``) keeps float weights and activations; so does one whose activation has no
   finite range.
5. An output of the graph keeps its name and float value: its Q/DQ pair goes on the other
   consumers only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir
from mconv.edit.rewrite import fresh_name, taken_names
from mconv.edit.weights import weight_refs
from mconv.errors import InputError
from mconv.passes.base import Pass, PassContext, PassReport

STATIC_OPS = ("Conv", "Gemm", "MatMul")


def _calibrate(
    model: ir.Model, names: list[str], data: dict, method: str, samples: int, percentile: float
) -> dict[str, tuple[float, float]]:
    """Rule 1 and 2: the range of each value in ``names``."""
    from mconv.engines.reference.executor import Executor
    from mconv.quantmath import SAMPLE_VALUES
    from mconv.quantmath import entropy_range as _entropy_range

    feeds = {k: np.asarray(v) for k, v in data.items() if k != "labels"}
    ex = Executor(model)
    first = model.graph.inputs[0]
    batch = first.shape[0] if first.shape is not None and isinstance(first.shape[0], int) else None
    total = min(int(next(iter(feeds.values())).shape[0]), samples)
    step = batch or total
    lo = dict.fromkeys(names, np.inf)
    hi = dict.fromkeys(names, -np.inf)
    kept: dict[str, list[np.ndarray]] = {n: [] for n in names}
    rng = np.random.default_rng(0)
    for start in range(0, total - step + 1, step):
        env = ex.run({k: v[start : start + step] for k, v in feeds.items()}, intermediates=True)
        for n in names:
            a = np.asarray(env.get(n, np.zeros(0)), np.float64).ravel()
            if a.size == 0:
                continue
            lo[n], hi[n] = min(lo[n], float(a.min())), max(hi[n], float(a.max()))
            if method != "minmax":
                kept[n].append(a if a.size <= SAMPLE_VALUES else rng.choice(a, SAMPLE_VALUES, replace=False))
    out = {}
    for n in names:
        if not np.isfinite(lo[n]) or not np.isfinite(hi[n]):
            continue
        if method == "minmax":
            out[n] = (lo[n], hi[n])
        elif method == "percentile":
            v = np.concatenate(kept[n])
            out[n] = (float(np.percentile(v, 100 - percentile)), float(np.percentile(v, percentile)))
        else:
            out[n] = _entropy_range(np.concatenate(kept[n]), lo[n], hi[n])
    return out


def _weights_int8(model: ir.Model, refs: list, taken: set[str], input_scale: dict[str, float]) -> None:
    """Rule 3 for the chosen layers only (the quantize pass's per-channel DequantizeLinear), and
    a Conv/Gemm bias as int32 codes at ``input_scale * weight_scale`` behind a DequantizeLinear:
    the form ONNX Runtime fuses into its integer kernels."""
    from mconv.passes.quantize import _dequantize, _initializer, quantize_per_channel

    graph = model.graph
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))
    new_nodes = []
    for ref in refs:
        w = ref.array()
        q, scale = quantize_per_channel(w, ref.out_axis)
        name, value, node = ref.name, ref.value, ref.node
        graph.initializers.pop(name)
        value.name = None
        q_value = _initializer(graph, fresh_name(f"{name}_int8", taken), q)
        s_value = _initializer(graph, fresh_name(f"{name}_scale", taken), scale)
        if opset >= 13:  # an explicit int8 zero point: ONNX Runtime's QDQ fusion looks for one
            z_value = _initializer(graph, fresh_name(f"{name}_zp", taken), np.zeros(scale.shape, np.int8))
            attrs = {"axis": ref.out_axis} if scale.size > 1 or w.ndim > 1 else {}
            nodes = [
                ir.node(
                    "DequantizeLinear",
                    [q_value, s_value, z_value],
                    attributes=attrs,
                    name=fresh_name(f"{name}_dq", taken),
                )
            ]
        else:
            nodes = _dequantize(q_value, s_value, ref.out_axis, w.ndim, opset, name, taken)
        out = nodes[-1].outputs[0]
        out.name, out.dtype, out.shape = name, ir.DataType.FLOAT, ir.Shape(w.shape)
        ir.convenience.replace_all_uses_with(value, out)
        new_nodes += nodes
        b = node.inputs[2] if len(node.inputs) > 2 else None
        x = node.inputs[0]
        sx = input_scale.get(x.name or "") if x is not None else None  # its DequantizeLinear's
        if (
            b is None or b.const_value is None or sx is None or opset < 13 or len(b.uses()) != 1
            or node.op_type not in ("Conv", "Gemm") or tuple(b.const_value.numpy().shape) != scale.shape
        ):  # fmt: skip
            continue
        bscale = (sx * scale.astype(np.float64)).astype(np.float32)
        codes = np.clip(np.round(b.const_value.numpy() / bscale), -(2**31), 2**31 - 1).astype(np.int32)
        bq = _initializer(graph, fresh_name(f"{b.name}_int32", taken), codes)
        bs = _initializer(graph, fresh_name(f"{b.name}_scale", taken), bscale)
        bz = _initializer(graph, fresh_name(f"{b.name}_zp", taken), np.zeros(codes.shape, np.int32))
        dq = ir.node(
            "DequantizeLinear", [bq, bs, bz], attributes={"axis": 0}, name=fresh_name(f"{b.name}_dq", taken)
        )
        dq.outputs[0].name = fresh_name(f"{b.name}_deq", taken)
        dq.outputs[0].dtype, dq.outputs[0].shape = ir.DataType.FLOAT, ir.Shape(codes.shape)
        node.replace_input_with(2, dq.outputs[0])
        if not b.uses() and b.name in graph.initializers:
            graph.initializers.pop(b.name)
        new_nodes.append(dq)
    if new_nodes:
        graph.insert_before(next(iter(graph)), new_nodes)


def quantize_static(owner: Pass, model: ir.Model, config: Any, ctx: PassContext) -> PassReport:
    """The pass in mode ``static`` (``config``: the quantize pass's Config; rules in the module doc)."""
    from mconv.quantmath import affine

    if not ctx.data:
        raise InputError(
            "quantize(mode=static) needs calibration inputs",
            where="pass quantize",
            hint="give --data FILE.npz",
        )
    op_types = tuple(t for t in config.op_types if t in STATIC_OPS)
    graph = model.graph
    chosen = []
    refs = weight_refs(model, op_types)
    total = len(refs)
    for ref in refs:
        cfg = ctx.config_for(ref.node) if ctx.spec is not None else config
        x = ref.node.inputs[0]
        if cfg.skip or x is None or x.const_value is not None or ref.array().dtype != np.float32:
            continue
        chosen.append(ref)
    if not chosen:
        return owner.report(False, notes=["no layer to quantize"])
    values = {}
    for ref in chosen:
        for v in (ref.node.inputs[0], ref.node.outputs[0]):
            if v is not None and v.name:
                values[v.name] = v
    ranges = _calibrate(model, list(values), ctx.data, config.method, config.samples, config.percentile)
    taken = taken_names(graph)
    new: list[tuple[ir.Node, list[ir.Node]]] = []
    done: dict[str, ir.Value] = {}
    qscale: dict[str, float] = {}
    layers = []

    def qdq(v: ir.Value) -> ir.Value | None:
        if v.name in done:
            return done[v.name]
        if v.name not in ranges:
            return None
        s, z = affine(*ranges[v.name])
        scale = ir.Value(
            name=fresh_name(f"{v.name}_scale", taken), const_value=ir.tensor(np.array(s, np.float32))
        )
        zp = ir.Value(name=fresh_name(f"{v.name}_zp", taken), const_value=ir.tensor(np.array(z, np.int8)))
        graph.register_initializer(scale)
        graph.register_initializer(zp)
        q = ir.node("QuantizeLinear", [v, scale, zp], name=fresh_name(f"{v.name}_q", taken))
        q.outputs[0].name = fresh_name(f"{v.name}_int8", taken)
        dq = ir.node("DequantizeLinear", [q.outputs[0], scale, zp], name=fresh_name(f"{v.name}_dq", taken))
        out = dq.outputs[0]
        out.name = fresh_name(f"{v.name}_qdq", taken)
        out.dtype, out.shape = v.dtype or ir.DataType.FLOAT, v.shape
        done[v.name] = out
        qscale[str(out.name)] = s
        new.append((q, [q, dq]))
        return out

    for ref in chosen:
        x = ref.node.inputs[0]
        assert x is not None
        xq = qdq(x)
        if xq is None:
            continue
        ref.node.replace_input_with(0, xq)
        y = ref.node.outputs[0]
        users = [(n, i) for n, i in y.uses() if n.op_type != "QuantizeLinear"]
        yq = qdq(y)
        if yq is not None:
            for n, i in users:  # rule 5: a graph output keeps its float value
                n.replace_input_with(i, yq)
        layers.append(ref.node.name)
    # the QDQ nodes go right after each value's producer (or first, for a graph input)
    for q, nodes in new:
        src = q.inputs[0]
        assert src is not None
        producer = src.producer()
        if producer is None:
            first = next(iter(graph))
            graph.insert_before(first, nodes)
        else:
            graph.insert_after(producer, nodes)
    _weights_int8(model, [r for r in chosen if r.node.name in set(layers)], taken, qscale)
    notes = [f"{len(layers)} layer(s) with int8 activations ({config.method} calibration) and int8 weights"]
    skipped = total - len(layers)
    if skipped > 0:
        notes.append(f"{skipped} layer(s) kept float")
    tensors = [
        {"name": ranges_name, "min": ranges[ranges_name][0], "max": ranges[ranges_name][1]}
        for ranges_name in ranges
    ]
    return owner.report(True, notes=notes, tensors=tensors)
