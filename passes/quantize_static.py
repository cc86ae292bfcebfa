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
6. Budgeted fallback (``max_drop``, a fraction; the CLI's ``--max-drop`` with a static quantize
   pass): the last quarter of ``--data`` (at least :data:`MIN_HELD`, at most ``samples``) is held
   out of calibration and measures the quantized model against the float one: accuracy with
   ``labels`` and a scores output, else top-1 agreement over the first output's last axis. When
   the drop exceeds ``max_drop``, each layer is measured quantized alone; the layers are kept
   float from the most harmful down, the count found by bisection (the all-float end always
   holds), the smallest set whose model is within the budget. The report gives the drop, the
   held-out count and the layers kept float. A budget the held-out samples cannot resolve (one
   sample is more than ``max_drop``, except 0) is refused before any work.
7. Too few samples to hold any out (fewer than ``2 * MIN_HELD``) with ``max_drop``: exit 2.
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


def _batches(model: ir.Model, data: dict, samples: int | None = None) -> list[dict[str, np.ndarray]]:
    """The feeds of ``data`` (labels left out), at most ``samples`` of them, cut into the model's
    static batch (one batch of all where the batch is free); a last partial batch is left out."""
    feeds = {k: np.asarray(v) for k, v in data.items() if k != "labels"}
    first = model.graph.inputs[0]
    batch = first.shape[0] if first.shape is not None and isinstance(first.shape[0], int) else None
    total = int(next(iter(feeds.values())).shape[0])
    total = min(total, samples) if samples is not None else total
    step = batch or total
    return [{k: v[i : i + step] for k, v in feeds.items()} for i in range(0, total - step + 1, step)]


def _calibrate(
    model: ir.Model, names: list[str], data: dict, method: str, samples: int, percentile: float
) -> dict[str, tuple[float, float]]:
    """Rule 1 and 2: the range of each value in ``names``."""
    from mconv.engines.reference.executor import Executor
    from mconv.quantmath import SAMPLE_VALUES
    from mconv.quantmath import entropy_range as _entropy_range

    ex = Executor(model)
    lo = dict.fromkeys(names, np.inf)
    hi = dict.fromkeys(names, -np.inf)
    kept: dict[str, list[np.ndarray]] = {n: [] for n in names}
    rng = np.random.default_rng(0)
    for part in _batches(model, data, samples):
        env = ex.run(part, intermediates=True)
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


MIN_HELD = 20  # the fewest held-out samples a budgeted fallback measures on


def quantize_static(owner: Pass, model: ir.Model, config: Any, ctx: PassContext) -> PassReport:
    """The pass in mode ``static`` (``config``: the quantize pass's Config; rules in the module doc)."""
    if not ctx.data:
        raise InputError(
            "quantize(mode=static) needs calibration inputs",
            where="pass quantize",
            hint="give --data FILE.npz",
        )
    from mconv.edit.weights import layer_weights

    op_types = tuple(t for t in config.op_types if t in STATIC_OPS)
    lifted, _ = layer_weights(model, "quantize", op_types, required=False)  # Constant-node weights
    refs = weight_refs(model, op_types)
    total = len(refs)
    chosen = []
    for ref in refs:
        cfg = ctx.config_for(ref.node) if ctx.spec is not None else config
        x = ref.node.inputs[0]
        if cfg.skip or x is None or x.const_value is not None or ref.array().dtype != np.float32:
            continue
        chosen.append(str(ref.node.name))
    if not chosen:
        return owner.report(False, notes=["no layer to quantize"])
    max_drop: float | None = getattr(config, "max_drop", None)
    data, held = _split(ctx.data, max_drop)
    values = set()
    for ref in refs:
        if str(ref.node.name) in chosen:
            values |= {v.name for v in (ref.node.inputs[0], ref.node.outputs[0]) if v is not None and v.name}
    ranges = _calibrate(model, sorted(values), data, config.method, config.samples, config.percentile)
    notes: list[str] = (
        [f"{len(lifted)} weights stored as Constant nodes became initializers"] if lifted else []
    )
    floats: list[str] = []
    if held is not None and max_drop is not None:
        floats, drop, n = _fallback(model, chosen, ranges, held, max_drop, ctx)
        notes.append(
            f"held-out drop {100 * drop:.2f} pt on {n} samples (budget {100 * max_drop:.2f} pt)"
            + (f"; kept float for it: {', '.join(floats)}" if floats else "")
        )
    layers = _apply(model, [c for c in chosen if c not in floats], ranges)
    notes.insert(
        0, f"{len(layers)} layer(s) with int8 activations ({config.method} calibration) and int8 weights"
    )
    skipped = total - len(layers)
    if skipped > 0:
        notes.append(f"{skipped} layer(s) kept float")
    tensors = [{"name": k, "min": v[0], "max": v[1]} for k, v in ranges.items()]
    return owner.report(True, notes=notes, tensors=tensors)


def _split(data: dict, max_drop: float | None) -> tuple[dict, dict | None]:
    """Rule 6/7: (calibration feeds, held-out feeds or None without a budget)."""
    if max_drop is None:
        return data, None
    n = int(next(iter(v for k, v in data.items() if k != "labels")).shape[0])
    held = max(n // 4, MIN_HELD)
    if n < 2 * MIN_HELD:
        raise InputError(
            f"{n} samples: a budgeted quantize holds out at least {MIN_HELD} and calibrates on the rest",
            where="pass quantize",
            hint=f"give {2 * MIN_HELD} or more samples in --data, or drop max_drop",
        )
    if max_drop > 0 and 1.0 / held > max_drop:
        raise InputError(
            f"one of the {held} held-out samples is {100 / held:.2f} pt, more than max_drop "
            f"{100 * max_drop:.2f} pt: the drop cannot be measured that finely",
            where="pass quantize",
            hint=f"give at least {int(np.ceil(4 / max_drop))} samples, or a larger max_drop",
        )
    cut = n - held
    return {k: v[:cut] for k, v in data.items()}, {k: v[cut:] for k, v in data.items()}


def _metric(outs: list[np.ndarray], ref: list[np.ndarray], labels: np.ndarray | None) -> float:
    """Accuracy against ``labels`` where the first output holds class scores, else top-1
    agreement with ``ref`` over the first output's last axis."""
    from mconv.metrics import looks_like_scores

    y = outs[0]
    if labels is not None and looks_like_scores(y) and len(labels) == len(y):
        return float(np.mean(y.argmax(-1) == np.asarray(labels).reshape(-1)))
    return float(np.mean(y.argmax(-1) == ref[0].argmax(-1)))


def _fallback(
    model: ir.Model, chosen: list[str], ranges: dict, held: dict, max_drop: float, ctx: PassContext
) -> tuple[list[str], float, int]:
    """Rule 6: the layers kept float, the held-out drop of the result, the held-out count."""
    import onnx
    from mconv.engines.reference.executor import Executor
    from mconv.irio import from_proto, to_proto

    blob = to_proto(model).SerializeToString()  # a fresh proto a trial: the IR edits what it wraps
    labels = held.get("labels")

    def outputs(m: ir.Model) -> list[np.ndarray]:
        ex = Executor(m)
        parts = [ex.run(part) for part in _batches(m, held)]
        names = [str(o.name) for o in m.graph.outputs]
        return [np.concatenate([p[k] for p in parts]) for k in names]

    ref = outputs(model)
    base = _metric(ref, ref, labels)
    count = int(ref[0].shape[0])
    cache: dict[frozenset, float] = {}

    def drop(quantized: list[str]) -> float:
        key = frozenset(quantized)
        if key not in cache:
            m = from_proto(onnx.load_from_string(blob))
            _apply(m, quantized, ranges)
            cache[key] = base - _metric(outputs(m), ref, labels)
        return cache[key]

    ctx.tick("budgeted fallback: all layers int8", 0, len(chosen) + 1)
    whole = drop(chosen)
    if whole <= max_drop + 1e-12:
        return [], whole, count
    harm = {}
    for i, name in enumerate(chosen):  # each layer quantized alone
        ctx.tick(f"budgeted fallback: {name} alone", i + 1, len(chosen) + 1)
        harm[name] = drop([name])
    order = sorted(chosen, key=lambda n: (-harm[n], chosen.index(n)))
    lo, hi = 0, len(order)  # float count: lo fails, hi (all float) holds
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if drop([n for n in chosen if n not in order[:mid]]) <= max_drop + 1e-12:
            hi = mid
        else:
            lo = mid
    floats = order[:hi]
    rest = [n for n in chosen if n not in floats]
    return floats, drop(rest) if rest else 0.0, count


def _apply(model: ir.Model, names: list[str], ranges: dict) -> list[str]:
    """Rules 2-5 for the layers named: QDQ around each one's activations, int8 weights. Returns
    the layers quantized (a layer whose input has no finite range stays float)."""
    from mconv.quantmath import affine

    graph = model.graph
    wanted = set(names)
    chosen = [r for r in weight_refs(model, STATIC_OPS) if str(r.node.name) in wanted]
    taken = taken_names(graph)
    new: list[tuple[ir.Node, list[ir.Node]]] = []
    done: dict[str, ir.Value] = {}
    qscale: dict[str, float] = {}
    layers = []

    def qdq(v: ir.Value) -> ir.Value | None:
        key = str(v.name)
        if key in done:
            return done[key]
        if key not in ranges:
            return None
        s, z = affine(*ranges[key])
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
        done[key] = out
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
        layers.append(str(ref.node.name))
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
    _weights_int8(model, [r for r in chosen if str(r.node.name) in set(layers)], taken, qscale)
    return layers
