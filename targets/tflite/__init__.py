"""The tflite target: LiteRT (TensorFlow Lite) flatbuffers, run by LiteRT's interpreter.

Export rules:

1. ``model.tflite`` is written by :mod:`.writer` (builtin ops only, NHWC inside with the model's
   declared layout at its inputs and outputs, fused activations, op versions as LiteRT's
   ``op_version.cc`` gives them) at option ``precision``: ``fp32`` (default), ``fp16``,
   ``int8-weights`` or ``int8`` (full integer, calibrated on option ``data``). The manifest lists
   every constant of the file with codec ``"dense"`` (the flatbuffer holds them) and the
   writer's decisions as notes.
2. The bundle's inputs and outputs are the model's (names, dtypes, shapes with the batch fixed to
   the file's).
3. A weight that was stored anew for its palette (writer rule 3) has a ``palette`` entry in the
   manifest's ``weights``: how many distinct values, stored as what, exact or the worst error
   relative to the weight's largest magnitude.

Load rules:

1. The file is checked to be a ``TFL3`` flatbuffer, then handed to
   ``ai_edge_litert.interpreter.Interpreter`` as bytes; inputs and outputs are found by tensor
   name.
2. A feed whose leading dimension is a multiple of the file's batch runs as that many
   invocations, the outputs concatenated (a batch-1 file verifies on a whole data set).
3. A float feed for an int8/uint8 input is quantized with the input's parameters, and an
   int8/uint8 output of a full-int8 file is returned dequantized (``run``) so that it compares
   with the float reference; an output that is int8/uint8 in the model itself (a float-precision
   file of a quantized model, whose reference gives codes) comes back as its codes.
   ``run_codes`` returns the integer codes as LiteRT gives them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir
from mconv.bundle import DENSE, Bundle, TensorSpec, provenance_from_model, write_bundle
from mconv.errors import InputError
from mconv.irio import real_inputs
from mconv.targets.base import open_bundle
from mconv.targets.tflite.options import Options as Options  # the export options

NAME = "tflite"
PAYLOAD = "model.tflite"


def _specs(values: list[ir.Value], tensors: list[Any]) -> list[TensorSpec]:
    """The model's specs with the file's dtypes and static dims; a symbolic leading dim stays
    symbolic (load rule 2 runs any multiple of the file's batch)."""
    out = []
    for v, t in zip(values, tensors):
        spec = TensorSpec.from_value(v)
        shape = list(t.shape)
        if spec.shape and shape and not isinstance(spec.shape[0], int):
            shape[0] = spec.shape[0]
        out.append(TensorSpec(spec.name, spec.dtype if t.dtype == "float32" else t.dtype, tuple(shape)))
    return out


def _palette_entry(record: dict | None) -> dict:
    """Export rule 3: what a compressed weight became, for its manifest entry."""
    if record is None:
        return {}
    return {
        "palette": {
            "values": record["values"],
            "stored": record["stored"] + (" per-channel" if record["stored"] == "int8" else ""),
            "exact": record["exact"],
            "max_error": record["max_error"],
        }
    }


def export(model: ir.Model, out_dir: str | os.PathLike, options: Mapping | None = None) -> Bundle:
    """Write a tflite bundle (model.tflite + manifest.json) for ``model`` at ``out_dir``."""
    from mconv.targets.tflite.writer import build

    options = dict(options or {})
    written = build(model, options)
    g = written.graph
    palettes = {r["name"] + ("/int8" if r["stored"] == "int8" else "/fp16"): r for r in written.palettes}
    weights = [
        (t.name, t.data, {"codec": DENSE, **_palette_entry(palettes.get(t.name))})
        for t in g.tensors
        if t.data is not None and t.data.size > 1
    ]
    recorded = {k: str(v) if k == "data" else v for k, v in options.items() if k != "verification"}
    return write_bundle(
        out_dir,
        target=NAME,
        model_name=model.graph.name or Path(out_dir).name,
        inputs=_specs(list(real_inputs(model.graph)), [g.tensors[i] for i in g.inputs]),
        outputs=_specs(list(model.graph.outputs), [g.tensors[i] for i in g.outputs]),
        weights=weights,
        payload={PAYLOAD: written.data},
        options=recorded,
        provenance=provenance_from_model(model),
        verification=options.get("verification"),
        notes=written.notes,
    )


def save(model: ir.Model, dest: Path, options: dict) -> list[Path]:
    """``export --format tflite -o m.tflite``: the bare file (atomically)."""
    from mconv.fileio import atomic_write_bytes
    from mconv.targets.tflite.writer import build

    opts = {k: v for k, v in options.items() if k != "source"}
    written = build(model, opts)
    atomic_write_bytes(dest, written.data)
    return [dest]


@dataclass
class TfliteRunner:
    interpreter: Any
    inputs: list[TensorSpec]
    outputs: list[str]
    label: str = "model"
    _in: dict[str, dict] = field(default_factory=dict, repr=False)
    _out: dict[str, dict] = field(default_factory=dict, repr=False)
    codes_out: set[str] = field(default_factory=set)  # load rule 3: the model's own 8-bit outputs

    def _feed(self, name: str, arr: np.ndarray) -> np.ndarray:
        d = self._in[name]
        want = np.dtype(d["dtype"])
        if want.kind in "iu" and arr.dtype.kind == "f" and d["quantization"][0] > 0:  # load rule 3
            scale, zp = d["quantization"]
            info = np.iinfo(want)
            return np.clip(np.round(arr / scale) + zp, info.min, info.max).astype(want)
        if arr.dtype != want:
            raise InputError(
                f"dtype {arr.dtype.name}, expected {want.name}",
                path=self.label,
                where=f"input '{name}'",
                hint=f"cast the feed to {want.name}",
            )
        return arr

    def run_codes(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        unknown = sorted(set(feeds) - set(self._in))
        missing = [n for n in self._in if n not in feeds]
        if unknown or missing:
            raise InputError(
                f"unknown input(s) {', '.join(unknown)}"
                if unknown
                else f"missing input(s) {', '.join(missing)}",
                path=self.label,
                hint=f"the model's inputs are: {', '.join(self._in)}",
            )
        arrays = {n: self._feed(n, np.asarray(feeds[n])) for n in self._in}
        runs = 1
        for n, a in arrays.items():
            want = list(self._in[n]["shape"])
            got = list(a.shape)
            if got == want:
                continue
            if len(got) == len(want) and got[1:] == want[1:] and want[0] > 0 and got[0] % want[0] == 0:
                runs = max(runs, got[0] // want[0])  # load rule 2
                continue
            raise InputError(
                f"shape {got}, expected {want}",
                path=self.label,
                where=f"input '{n}'",
                hint="the file has static shapes; feed a multiple of its batch",
            )
        results: dict[str, list[np.ndarray]] = {n: [] for n in self.outputs}
        for r in range(runs):
            for n, a in arrays.items():
                b = int(self._in[n]["shape"][0])
                part = a if list(a.shape) == list(self._in[n]["shape"]) else a[r * b : (r + 1) * b]
                self.interpreter.set_tensor(self._in[n]["index"], np.ascontiguousarray(part))
            self.interpreter.invoke()
            for n in self.outputs:
                results[n].append(self.interpreter.get_tensor(self._out[n]["index"]).copy())
        return {n: v[0] if len(v) == 1 else np.concatenate(v) for n, v in results.items()}

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        codes = self.run_codes(feeds)
        out = {}
        for n, a in codes.items():
            scale, zp = self._out[n]["quantization"]
            out[n] = (
                ((a.astype(np.float32) - zp) * np.float32(scale))
                if a.dtype.kind in "iu" and scale > 0 and n not in self.codes_out
                else a
            )
        return out


def runner_for(data: bytes, label: str, inputs: list[TensorSpec] | None = None) -> TfliteRunner:
    """A LiteRT runner for the bytes of a ``.tflite`` file (load rule 1)."""
    from mconv.targets.tflite.litert import open_interpreter

    if len(data) < 8 or data[4:8] != b"TFL3":
        raise InputError(
            "is not a TFLite flatbuffer (no TFL3 identifier)", path=label, hint="re-export the bundle"
        )
    try:
        interp = open_interpreter(data)
    except Exception as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(
            f"LiteRT cannot load the model ({msg[:240]})", path=label, hint="re-export it"
        ) from None
    ins = {d["name"]: d for d in interp.get_input_details()}
    outs = {d["name"]: d for d in interp.get_output_details()}
    if inputs is None:
        inputs = [
            TensorSpec(n, np.dtype(d["dtype"]).name, tuple(int(x) for x in d["shape"]))
            for n, d in ins.items()
        ]
    return TfliteRunner(interp, inputs, list(outs), label, ins, outs)


def load(bundle: Bundle | str | os.PathLike) -> TfliteRunner:
    bundle = open_bundle(bundle, NAME)
    label = str(bundle.root)
    runner = runner_for(bundle.read_bytes(PAYLOAD), label)
    # the manifest's specs, float where the file takes int8 with float feeds quantized (rule 3)
    runner.inputs = [s for s in bundle.inputs] or runner.inputs
    if bundle.options.get("precision", "fp32") != "int8":  # 8-bit outputs are the model's own
        runner.codes_out = {s.name for s in bundle.outputs if s.dtype in ("int8", "uint8")}
    return runner


def load_model(model: ir.Model, label: str = "model") -> TfliteRunner:
    """A LiteRT runner for a bare IR model, written at fp32 in memory."""
    from mconv.targets.tflite.writer import build

    runner = runner_for(
        build(model).data, label, [TensorSpec.from_value(v) for v in real_inputs(model.graph)]
    )
    eight = (ir.DataType.INT8, ir.DataType.UINT8)
    runner.codes_out = {str(v.name) for v in model.graph.outputs if v.dtype in eight}
    return runner


name = NAME
TARGET = sys.modules[__name__]
