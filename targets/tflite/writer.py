"""An IR model to ``model.tflite`` bytes: prepare, lower, set precision, version each op.

Rules:

1. The model is prepared as the GPU targets prepare theirs (:func:`mconv.targets.gpu.plan.prepare`:
   a symbolic batch becomes 1, shape arithmetic and constants folded, BatchNorm folded into the
   conv before it, shapes inferred), then lowered (:mod:`.lower`) and given its precision
   (:mod:`.quant`).
2. Each op's version is the one LiteRT's ``op_version.cc`` gives it for its tensor types
   (:func:`op_version`); an op not listed there is version 1.
3. Weights of fp32 and fp16 files that lie on an int8 grid per channel, and in a clustered model
   (``mconv.compression`` metadata) weights of at most 256 distinct values, are stored the
   smallest way LiteRT runs them (:func:`mconv.targets.tflite.quant.compress_palettes`, option
   ``palette``); the notes and the manifest's weight entries say what each palette became.
4. A QDQ model (QuantizeLinear/DequantizeLinear, e.g. ONNX Runtime's ``quantize_static``): the
   constant weights' DequantizeLinear are folded to float by the preparation (so their int8 grid
   is stored back as int8 codes by rule 3 at fp32/fp16, or requantized to the same codes at
   int8). At ``int8`` each activation Q->DQ pair's parameters become its tensor's quantization
   parameters (the pairs vanish) and ``--data`` is needed only for tensors no pair covers
   (calibration ranges; the pairs' parameters win); at the float precisions the pairs are
   QUANTIZE/DEQUANTIZE ops, the model's own arithmetic. The notes say which.
   At ``int8`` and ``int16x8`` a QOperator model's integer products (QLinearConv,
   QLinearMatMul, QGemm) are prepared in QDQ form (:mod:`mconv.targets.gpu.contrib` rule 8),
   so their output codes' parameters are the model's as well, not a requantization of codes
   that the float graph computed.
5. The written bytes are loaded by LiteRT (tensors allocated) before they are returned: a file
   LiteRT would refuse (e.g. a bare 8-bit tensor its XNNPACK delegate cannot take) is an error,
   exit 2, and nothing is written.
6. ``--calibration auto`` (the default) builds the int8 file with each of :data:`AUTO_METHODS`'
   ranges in turn (``minmax``, then per-tensor ``mse``, then ``percentile``; one calibration pass
   collects what all three need) and keeps the first whose every output the int8 gate keeps on
   the calibration samples, else the one the gate scores best (:func:`gate.score`: most outputs
   kept, then the smallest worst shortfall). The notes name the method kept and what each
   method tried measured. A method named by ``--calibration`` is used alone.
7. Where no method's file is kept and the graph takes a LOG (no int8 kernel; its output's error
   grows without bound as its input nears 0: a log-spectrogram whose magnitudes int8 rounds to
   zero), the ops computing the LOG's input (its front end, back to the graph's inputs) run in
   float too and rule 6 is tried again; the best of all is kept, and the notes count the ops
   that front end put in float.
8. ``--precision int16x8`` writes LiteRT's 16x8 mode (:mod:`.quant` rule 9: int16 activations,
   symmetric; int8 weights; int64 biases; float32 inputs and outputs), with rules 6 and 7. At
   ``int8`` with float32 inputs and outputs, where no int8 file is kept, the 16x8 file with
   min-max ranges (16 bits hold the extremes) is built too and written instead when the gate
   scores it better; the notes say so (``16x8: ...``). An op without a 16-bit kernel runs in
   float as rule 6 of :mod:`.quant` says.
9. A QDQ model's pairs may clip (ONNX Runtime folds a ReLU6 or a hard-swish's clip into the
   output range of the QuantizeLinear before it): with the pairs gone from the float graph, the
   values past their range would reach the ops after them. Calibration and the gate's float
   reference run a copy of the float graph with each pair's tensor clamped to the pair's int8
   range (:func:`_clamped`), so both compute what the model computes.
10. At ``int8`` and ``int16x8`` the int8 codes of conv, depthwise and fully connected weights are
   fitted on the calibration samples (``--rounding gptq``, the default:
   :mod:`mconv.targets.tflite.gptq`; ``nearest`` rounds each weight alone). The same calibration
   pass gathers what GPTQ needs; the scales are those of plain rounding. With four or more
   calibration runs every fourth is left out of the fit, and the gate measures each file on
   those runs apart as well as on all of them, the worse figure per output counting: a file
   whose codes were fitted to a sample is not judged only on it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_ir as ir
from mconv.codecs.choose import COMPRESSION_KEY
from mconv.errors import InputError
from mconv.targets.tflite import gate, gptq, lower, quant
from mconv.targets.tflite.options import CALIBRATIONS, IO_DTYPES, PALETTES, PRECISIONS, ROUNDINGS
from mconv.targets.tflite.schema import Graph, serialize

CALIBRATION_SAMPLES = 500
AUTO_METHODS = ("minmax", "mse", "percentile")  # rule 6's order: ``--calibration auto``


@dataclass
class Written:
    data: bytes
    graph: Graph
    precision: str
    notes: list[str] = field(default_factory=list)
    palettes: list[dict] = field(default_factory=list)  # quant.compress_palettes' records


_INT16_VERSIONS = {
    "CONV_2D": 4, "DEPTHWISE_CONV_2D": 5, "FULLY_CONNECTED": 7, "ADD": 3, "SUB": 5, "MUL": 4,
    "MAX_POOL_2D": 3, "AVERAGE_POOL_2D": 3, "TRANSPOSE": 5, "SOFTMAX": 3, "MEAN": 3,
    "REDUCE_MAX": 3, "RELU6": 3, "RELU": 3, "LOGISTIC": 3, "TANH": 3, "LEAKY_RELU": 2, "PAD": 3,
    "PADV2": 3, "CONCATENATION": 3, "MAXIMUM": 4, "MINIMUM": 4, "SPLIT": 4, "RESIZE_BILINEAR": 4,
    "RESIZE_NEAREST_NEIGHBOR": 4, "DEQUANTIZE": 3,
}  # fmt: skip


def op_version(op: Any, g: Graph) -> int:
    """Rule 2 (tensorflow/lite/tools/versioning/op_version.cc, for the types mconv writes)."""
    ins = [g.tensors[i] for i in op.inputs if i >= 0]
    first = ins[0].dtype if ins else "float32"
    weight = ins[1].dtype if len(ins) > 1 else None
    int8 = first == "int8"
    per_channel = len(ins) > 1 and ins[1].quant is not None and ins[1].quant.scale.size > 1
    code = op.code
    if first == "int16" and code in _INT16_VERSIONS:  # 16x8 (int16 activations, int8 weights)
        return _INT16_VERSIONS[code]
    if code == "CONV_2D":
        if int8:
            return 3
        if weight == "int8":  # hybrid
            return 5 if per_channel else 2
        return (
            2 if op.options.get("DilationHFactor", 1) != 1 or op.options.get("DilationWFactor", 1) != 1 else 1
        )
    if code == "DEPTHWISE_CONV_2D":
        if int8:
            return 3
        if weight == "int8":
            return 6 if per_channel else 4
        return (
            2 if op.options.get("DilationHFactor", 1) != 1 or op.options.get("DilationWFactor", 1) != 1 else 1
        )
    if code == "FULLY_CONNECTED":
        if int8:
            return 4
        if weight == "int8":
            return 3
        return 1
    if code == "DEQUANTIZE":
        per_axis = ins[0].quant is not None and ins[0].quant.scale.size > 1
        return 3 if first == "float16" else (5 if per_axis else 2) if int8 else 1
    if code == "QUANTIZE":
        out = g.tensors[op.outputs[0]].dtype
        return 2 if first == "uint8" or out == "int16" else 1
    if code == "CAST":  # int8 on either side: 3; uint8 (and the rest mconv writes): 1
        out = g.tensors[op.outputs[0]].dtype
        if "float16" in (first, out):
            return 5
        return 3 if "int8" in (first, out) else 1
    if code == "TRANSPOSE_CONV":  # inputs: output_shape, weights, input, bias
        return 3 if len(op.inputs) > 3 and op.inputs[3] >= 0 else 2 if ins[2].dtype == "int8" else 1
    if code == "RESIZE_BILINEAR":
        return 3 if op.options.get("HalfPixelCenters") else 2 if int8 else 1
    if code == "RESIZE_NEAREST_NEIGHBOR":
        half_or_align = op.options.get("HalfPixelCenters") or op.options.get("AlignCorners")
        return 3 if half_or_align else 2 if int8 else 1
    if code in {
        "ADD", "SUB", "MUL", "MAX_POOL_2D", "AVERAGE_POOL_2D", "SOFTMAX", "LOGISTIC", "TANH",
        "CONCATENATION", "TRANSPOSE", "PAD", "PADV2", "MEAN", "RELU", "RELU6", "LEAKY_RELU",
        "MAXIMUM", "MINIMUM", "REDUCE_MAX", "STRIDED_SLICE", "LOG_SOFTMAX", "SPLIT", "SPLIT_V",
        "NOT_EQUAL",
    }:  # fmt: skip
        return 2 if int8 else 1
    if code == "GELU":
        return 2 if first in ("int8", "uint8") else 1
    return 1


def _choice(options: Mapping[str, Any], key: str, allowed: tuple[str, ...], default: str) -> str:
    value = options.get(key) or default
    if value not in allowed:
        flag = "--" + key.replace("_", "-")
        raise InputError(
            f"{flag} {value!r} is not one of {', '.join(allowed)}",
            where=flag,
            hint=f"give {flag} {allowed[0]}",
        )
    return str(value)


def _calibration_feeds(model: ir.Model, data: Any) -> dict[str, np.ndarray]:
    if isinstance(data, Mapping):
        return {str(k): np.asarray(v) for k, v in data.items() if k != "labels"}
    from mconv.bundle import TensorSpec
    from mconv.irio import real_inputs
    from mconv.metrics import load_npz_feeds

    specs = []
    for v in real_inputs(model.graph):  # any number of samples: the batch is left open
        spec = TensorSpec.from_value(v)
        shape = None if spec.shape is None else (None, *spec.shape[1:])
        specs.append(TensorSpec(spec.name, spec.dtype, shape))
    feeds, _ = load_npz_feeds(str(data), specs)
    return feeds


def build(model: ir.Model, options: Mapping[str, Any] | None = None) -> Written:
    """The ``model.tflite`` bytes of ``model`` with ``options`` (the target's Options fields)."""
    from mconv.targets.gpu.plan import prepare

    options = dict(options or {})
    precision = _choice(options, "precision", PRECISIONS, "fp32")
    method = _choice(options, "calibration", CALIBRATIONS, "auto")
    io_dtype = _choice(options, "io_dtype", IO_DTYPES, "float32")
    palette = _choice(options, "palette", PALETTES, "int8")
    rounding = _choice(options, "rounding", ROUNDINGS, "gptq")
    data = options.get("data")
    prepared = prepare(model, qdq=precision in ("int8", "int16x8"))  # rule 4: QOperator ops as QDQ
    qdq = sum(n.op_type == "QuantizeLinear" for n in prepared.graph)
    folded = sum(n.op_type == "DequantizeLinear" for n in model.graph) - sum(
        n.op_type == "DequantizeLinear" for n in prepared.graph
    )
    if precision == "int16x8" and data is None:
        raise InputError(
            "--precision int16x8 needs calibration inputs",
            where="--data",
            hint="give --data samples.npz (real inputs keyed by input name)",
        )
    if precision == "int16x8" and options.get("io_dtype") not in (None, "float32"):
        raise InputError(
            "--precision int16x8 files take and give float32",
            where="--io-dtype",
            hint="drop --io-dtype, or use --precision int8",
        )
    if precision == "int8" and data is None and not qdq:
        raise InputError(
            "--precision int8 needs calibration inputs",
            where="--data",
            hint="give --data samples.npz (real inputs keyed by input name), or --precision int8-weights",
        )
    calibrated = precision in ("int8", "int16x8")
    if not calibrated and (
        data is not None or options.get("io_dtype") or options.get("calibration") or options.get("rounding")
    ):
        raise InputError(
            "--data, --calibration, --rounding and --io-dtype apply to --precision int8 and int16x8 only",
            where="--precision",
            hint="add --precision int8 or drop them",
        )
    qparams: dict[int, tuple[float, int]] = {}
    if calibrated and qdq:  # rule 4: the model's own parameters
        g, qparams = lower.lower_with_params(prepared)
    else:
        g = lower.lower(prepared)
    notes: list[str] = []
    if qdq or folded > 0:
        notes.append(
            f"QDQ model: {max(folded, 0)} constant DequantizeLinear folded to float weights, "
            + (
                f"{len(qparams)} tensor(s) quantized with the model's QuantizeLinear parameters"
                if qparams
                else f"{qdq} QuantizeLinear/DequantizeLinear on activations kept as QUANTIZE/DEQUANTIZE"
            )
        )
    palettes: list[dict] = []
    if precision in ("fp32", "fp16"):  # rule 3
        palettes = quant.compress_palettes(g, COMPRESSION_KEY in model.metadata_props, palette)
        notes += palette_notes(palettes)
    if precision == "fp16":
        n = quant.to_fp16(g)
        notes.append(f"{n} float constant(s) stored float16, dequantized at load")
    elif precision == "int8-weights":
        n = quant.to_dynamic_range(g)
        notes.append(f"{n} weight(s) stored int8 (dynamic range: activations quantized at run time)")
    elif calibrated:
        for op in g.ops:
            op.version = op_version(op, g)
        if data is None:  # a QDQ model without samples: its parameters only
            ranges = quant.qdq_ranges(g, qparams)
            fallback = quant.to_int8(g, ranges, io_dtype)
            notes.append(f"full int8: the QDQ model's parameters, inputs/outputs {io_dtype}")
            if fallback:
                notes.append(
                    f"{len(fallback)} op(s) without an int8 kernel run in float: {', '.join(fallback)}"
                )
            return _finish(g, precision, notes, [])
        float_bytes = serialize(_clamped(g, qparams) if qparams else g)  # rule 9
        feeds = _calibration_feeds(prepared, data)
        missing = [g.tensors[i].name for i in g.inputs if g.tensors[i].name not in feeds]
        if missing:
            raise InputError(
                f"calibration data has no input {', '.join(missing)}",
                path=str(data) if not isinstance(data, Mapping) else None,
                hint="key the .npz by the model's input names",
            )
        limit = int(options.get("calibration_samples") or CALIBRATION_SAMPLES)
        methods = AUTO_METHODS if method == "auto" else (method,)
        hessians = gptq.Hessians(g) if rounding == "gptq" else None  # rule 10
        try:
            candidates = quant.calibrate_methods(
                float_bytes, g, feeds, methods, limit, float(options.get("percentile") or 99.99), hessians
            )
        except ValueError as exc:
            raise InputError(
                f"calibration failed ({exc})", where="--data", hint="give at least one sample"
            ) from None
        except RuntimeError as exc:  # LiteRT refused the float file it calibrates on
            raise InputError(
                f"LiteRT cannot run the float model to calibrate it ({str(exc).splitlines()[0][:200]})",
                hint="export --target cpu",
            ) from None
        own = quant.qdq_ranges(g, qparams, complete=False)
        base = copy.deepcopy(g)
        rounder = gptq.Rounder(hessians) if hessians is not None else None
        shapes = {base.tensors[i].name: base.tensors[i].shape for i in base.inputs}
        runs = quant._batches(feeds, shapes, limit)
        held = sorted(gptq.held_out(len(runs))) if rounder is not None else []
        # rule 10: where GPTQ fitted the weights, the gate also measures the runs it did not see
        # apart, the worse figure per output counting
        checks = [runs[:CHECK_SAMPLES]] + ([[runs[k] for k in held][:CHECK_SAMPLES]] if held else [])
        samples = checks[0]
        references = [_outputs_of(float_bytes, c) for c in checks]  # quant rule 8's oracle, run once

        def measured(data: bytes) -> list[dict]:
            """Per output, the worse record of the check sets (gate rule 7's order)."""
            sets = [gate.judge(_outputs_of(data, c), ref) for c, ref in zip(checks, references)]
            return [min(recs, key=lambda r: gate.score([r])) for recs in zip(*sets)]

        best: tuple | None = None
        tried = []

        def attempt(m: str, extra: frozenset[int], bits: int) -> tuple:
            ranges = {**candidates[m], **own}
            h = copy.deepcopy(base)
            fallback = quant.to_int8(h, ranges, io_dtype, extra, bits, rounder)
            written = _finish(h, precision, [], palettes)
            records = measured(written.data)
            softmaxes = _unresolved_outputs(base, records) if io_dtype == "float32" else frozenset()
            if softmaxes:  # quant rule 8: those outputs' softmax / logistic in float, measured again
                h = copy.deepcopy(base)
                fallback = quant.to_int8(h, ranges, io_dtype, extra | softmaxes, bits, rounder)
                written = _finish(h, precision, [], palettes)
                records = measured(written.data)
            what = f"{m}{' with the LOG front end in float' if extra else ''}{' 16x8' if bits == 16 else ''}"
            tried.append(f"{what} {gate.summary(records)}")
            return (gate.score(records), m, written, records, fallback, softmaxes, extra, bits)

        bits = 16 if precision == "int16x8" else 8
        front = _log_front_end(base)
        for extra in (frozenset(), front) if front else (frozenset(),):  # rule 7: then a float front end
            for m in methods:  # rule 6: the first method whose file the gate keeps, else the best
                got = attempt(m, extra, bits)
                if best is None or got[0] > best[0]:
                    best = got
                if all(r["ok"] for r in got[3]):
                    break
            if best is not None and all(r["ok"] for r in best[3]):
                break
        assert best is not None
        if bits == 8 and io_dtype == "float32" and not all(r["ok"] for r in best[3]):
            # rule 8: int16 activations where no int8 file is kept (min-max: 16 bits hold the extremes)
            wide: tuple | None
            try:
                wide = attempt("minmax" if "minmax" in candidates else best[1], best[6], 16)
            except InputError:  # LiteRT refused the 16x8 file: the int8 one stands
                wide = None
            if wide is not None and wide[0] > best[0]:
                best = wide
        _, method, written, records, fallback, softmaxes, extra, bits = best
        notes.append(
            f"full int8: activation ranges from {method} calibration, inputs/outputs {io_dtype}"
            if bits == 8
            else f"16x8: int16 activations (symmetric, ranges from {method} calibration), int8 weights, "
            f"int64 biases, inputs/outputs float32"
            + (" (no int8 file was kept: writer rule 8)" if precision == "int8" else "")
        )
        if rounder is not None and hessians is not None:
            notes.append(
                f"int8 weight codes fitted on the calibration samples (GPTQ) for "
                f"{len({k for k, _ in rounder.cache})} weight tensor(s), "
                + (
                    f"{len(held)} of {len(runs)} run(s) held out for the gate"
                    if held
                    else f"all {len(runs)} run(s) fitted (the gate's verdict is in-sample)"
                )
                + (
                    f"; {hessians.skipped} too large or shared kept the nearest codes"
                    if hessians.skipped
                    else ""
                )
            )
        if len(tried) > 1:
            notes.append(
                f"calibrations tried (rule: the first the int8 gate keeps, else the best): {'; '.join(tried)}"
            )
        if fallback:
            why = [f"{len(fallback) - len(softmaxes) - len(extra)} without an int{bits} kernel"]
            if softmaxes:
                why.append(f"{len(softmaxes)} whose int{bits} output could not resolve the float one")
            if extra:
                why.append(f"{len(extra)} computing a LOG's input (a float front end)")
            notes.append(f"{len(fallback)} op(s) run in float ({', '.join(why)}): {', '.join(fallback)}")
        verdict = "kept" if all(r["ok"] for r in records) else "NOT kept"
        notes.append(
            f"int{bits} against float on {len(samples)} calibration sample run(s)"
            + (f" and apart on the {len(checks[1])} GPTQ did not fit (the worse counts)" if held else "")
            + f": {gate.summary(records)} "
            f"({verdict}; rules: mconv.targets.tflite.gate; other inputs not measured)"
        )
        written.notes[:0] = notes
        return written
    return _finish(g, precision, notes, palettes)


CHECK_SAMPLES = 64  # calibration runs the int8 file is measured on (quant rule 8)


def _outputs_of(data: bytes, samples: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    """Quant rule 8: a file's outputs over ``samples``, in the graph's output order."""
    from mconv.targets.tflite import runner_for

    runner = runner_for(data, "int8 check")
    parts: dict[str, list[np.ndarray]] = {n: [] for n in runner.outputs}
    for feed in samples:
        got = runner.run(feed)
        for n in runner.outputs:
            parts[n].append(np.asarray(got[n], np.float64))
    return [np.concatenate(parts[n]) for n in runner.outputs]


def _unresolved_outputs(g: Graph, records: list[dict]) -> frozenset[int]:
    """Quant rule 8: the SOFTMAX / LOGISTIC ops (indices into ``g.ops``) behind failing outputs,
    followed back through ops that keep their input's parameters."""
    producer = {o: k for k, op in enumerate(g.ops) for o in op.outputs}
    found = set()
    for out, rec in zip(g.outputs, records):
        k = producer.get(out)
        while k is not None and not rec["ok"]:
            op = g.ops[k]
            if op.code in ("SOFTMAX", "LOGISTIC"):
                found.add(k)
                break
            if op.code not in quant.SAME_PARAMS or not op.inputs:
                break
            k = producer.get(op.inputs[0])
    return frozenset(found)


def _clamped(g: Graph, qparams: dict[int, tuple[float, int]]) -> Graph:
    """Rule 9: a copy of ``g`` whose tensors quantized by a Q->DQ pair of the model are clamped
    to the pair's int8 range (MAXIMUM, MINIMUM after their producer), tensor indices kept."""
    from mconv.targets.tflite.schema import Op, Tensor

    c = copy.deepcopy(g)
    made = {o: k for k, op in enumerate(c.ops) for o in op.outputs}
    after: dict[int, list[Op]] = {}
    for t, (scale, zp) in qparams.items():
        k = made.get(t)
        if k is None:  # an input: its values are the feed's
            continue
        name, shape = c.tensors[t].name, list(c.tensors[t].shape)
        raw = c.add(Tensor(name + "/unclamped", shape, "float32"))
        mid = c.add(Tensor(name + "/floor", shape, "float32"))
        lo = c.add(Tensor(name + "/lo", [], "float32", np.array((-128 - zp) * scale, np.float32)))
        hi = c.add(Tensor(name + "/hi", [], "float32", np.array((127 - zp) * scale, np.float32)))
        c.ops[k].outputs = [raw if o == t else o for o in c.ops[k].outputs]
        after.setdefault(k, []).extend([Op("MAXIMUM", [raw, lo], [mid]), Op("MINIMUM", [mid, hi], [t])])
    c.ops = [x for k, op in enumerate(c.ops) for x in (op, *after.get(k, []))]
    return c


def _log_front_end(g: Graph) -> frozenset[int]:
    """Rule 7: the ops with an int8 kernel (indices into ``g.ops``) that compute the input of a
    LOG, back to the graph's inputs."""
    made = {o: k for k, op in enumerate(g.ops) for o in op.outputs}
    stack = [made[i] for op in g.ops if op.code == "LOG" for i in op.inputs if i in made]
    seen: set[int] = set()
    while stack:
        k = stack.pop()
        if k not in seen:
            seen.add(k)
            stack += [made[i] for i in g.ops[k].inputs if i in made]
    return frozenset(k for k in seen if g.ops[k].code in quant.INT8_OPS)


def _finish(g: Graph, precision: str, notes: list[str], palettes: list[dict]) -> Written:
    g = lower.compact(g)  # the float constants a precision replaced are gone
    for op in g.ops:
        op.version = op_version(op, g)
    data = serialize(g)
    _loads(data)
    return Written(data, g, precision, notes, palettes)


def _loads(data: bytes) -> None:
    """Rule 5: LiteRT loads the file (tensors allocated) or nothing is written, exit 2."""
    try:
        import ai_edge_litert.interpreter  # noqa: F401
    except ImportError:  # no LiteRT here: the file is written unchecked (run needs LiteRT anyway)
        return
    from mconv.targets.tflite.litert import open_interpreter

    try:
        open_interpreter(data)
    except (RuntimeError, ValueError) as exc:
        msg = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise InputError(
            f"LiteRT cannot load the file written for this model ({msg}); nothing written",
            hint="export --target cpu",
        ) from None


def palette_notes(records: list[dict]) -> list[str]:
    """One note per stored form: which weights, how many values, exact or the worst error."""
    notes = []
    for stored, exact in (("int8", True), ("int8", False), ("float16", True), ("float16", False)):
        group = [r for r in records if r["stored"] == stored and r["exact"] == exact]
        if not group:
            continue
        names = ", ".join(f"{r['name']} ({r['values']} values)" for r in group)
        how = (
            "int8 codes with per-channel scales, dequantized at load"
            if stored == "int8"
            else "float16, dequantized at load"
        )
        err = (
            "exactly (the values lie on the grid)"
            if exact
            else f"max error {max(r['max_error'] for r in group):.2%} of the weight's largest magnitude"
        )
        notes.append(f"{len(group)} weight(s) stored as {how}, {err}: {names}")
    return notes
