"""The webgpu target: WGSL compute kernels run through WebGPU (wgpu natively, or a browser).

Export rules:

1. The model is prepared and planned as for the Metal target (:mod:`mconv.targets.webgpu.plan`:
   BatchNorm folded, static batch ``options["batch"]`` (default 1), activations fused), and
   each layer gets one specialized WGSL module (:mod:`mconv.targets.webgpu.wgsl`). Unsupported
   nodes fail the export with one UnsupportedError naming every one of them (exit 2).
2. ``options["precision"]``: ``fp32`` (default: f32 storage) or ``fp16`` (f16 storage where the
   device has ``shader-f16``, f32 where not; f32 accumulation either way). With fp16 a weight
   the codec chooser would store raw is stored fp16 (the kernels read half anyway).
3. The bundle holds ``webgpu_plan.json`` (the Metal plan's schema: buffers, layers in dispatch
   order, bindings, grids), ``kernels/<kernel>.wgsl`` (one module per layer) and ``weights.mcw``
   with every weight buffer the kernels read, and the web page: ``index.html`` with the ES
   modules ``mconv_webgpu.js`` (loads the manifest, plan, kernels and weights, runs the model
   with the browser's WebGPU, one command buffer per inference in plan order, shows outputs and
   timing) and ``mcw.js`` (the weights.mcw decoder: raw, fp16, palette, sparse, Huffman).
   Serve the folder over HTTP (``python3 -m http.server``) and open ``index.html``.

Load rules:

1. ``load(bundle)`` returns a :class:`~mconv.targets.webgpu.runner.WebGPURunner`: the weights
   decoded by the Python decoder of ``weights.mcw`` (:mod:`mconv.container`), the kernels
   compiled by the device, one command buffer per inference. Where no adapter exists it raises
   a one-line InputError (exit 2) saying so. Integer and bool inputs are written to the float
   buffers as their values; integer and bool outputs come back as the model's type (the bundle's
   output dtypes), as the Metal target's runner gives them.
2. ``load_model(model)`` exports to a temporary bundle and loads it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import onnx_ir as ir
from mconv.bundle import Bundle, TensorSpec, load_bundle, provenance_from_model, write_bundle
from mconv.errors import InputError
from mconv.irio import real_inputs
from mconv.targets.metal import _weight_spec
from mconv.targets.metal.plan import MetalPlan
from mconv.targets.webgpu.browser import web_payload
from mconv.targets.webgpu.options import Options as Options  # the export options
from mconv.targets.webgpu.plan import build_plan, prepare
from mconv.targets.webgpu.runner import WebGPURunner

__all__ = ["NAME", "PLAN", "TARGET", "export", "load", "load_model", "read_plan"]

NAME = "webgpu"
PLAN = "webgpu_plan.json"
KERNELS = "kernels"


def _held_type(dtype: str | None) -> str:
    """An output's bundle dtype: the model's integer or bool type (given back typed by the
    runner), float32 for every float (the kernels' float16 storage is read back as float32)."""
    return "float32" if dtype in (None, "float16") else dtype


def kernel_path(kernel: str) -> str:
    return f"{KERNELS}/{kernel}.wgsl"


def export(model: ir.Model, out_dir: str | os.PathLike, options: Mapping | None = None) -> Bundle:
    """Write a webgpu bundle (plan, WGSL kernels, weights.mcw) for ``model`` at ``out_dir``."""
    options = dict(options or {})
    options.setdefault("precision", "fp32")
    out_dir = Path(out_dir)
    original_inputs = [TensorSpec.from_value(v) for v in real_inputs(model.graph)]
    prepared = prepare(model, int(options.get("batch") or 1))
    name = options.get("model_name") or model.graph.name or out_dir.name
    plan = build_plan(prepared, {**options, "model_name": name})
    plan_bytes = (json.dumps(plan.as_dict(), sort_keys=True, indent=2) + "\n").encode()
    inits = prepared.graph.initializers
    metadata = dict(prepared.metadata_props)
    weights = []
    for b in plan.weight_buffers():
        const = inits[b.name].const_value
        assert const is not None
        stored, spec = _weight_spec(const.numpy(), metadata, b.name, plan.dtype, options.get("codec"))
        weights.append((b.name, stored, spec))
    symbolic = {s.name: bool(s.shape) and not isinstance((s.shape or (0,))[0], int) for s in original_inputs}
    inputs = []
    for spec in plan.inputs:
        shape = list(spec["shape"])
        if symbolic.get(spec["name"]):
            shape[0] = "batch"
        src = next((s for s in original_inputs if s.name == spec["name"]), None)
        inputs.append(TensorSpec(spec["name"], src.dtype if src else "float32", tuple(shape)))
    # integer and bool outputs are held as floats by the kernels; the runner gives them back typed
    out_dtypes = {s.name: s.dtype for s in (TensorSpec.from_value(v) for v in model.graph.outputs)}
    outputs = [
        TensorSpec(
            o["name"],
            _held_type(out_dtypes.get(o["name"])),
            tuple(["batch", *o["shape"][1:]] if any(symbolic.values()) and o["shape"] else o["shape"]),
        )
        for o in plan.outputs
    ]
    payload = {PLAN: plan_bytes}
    for layer in plan.layers:
        payload[kernel_path(layer.kernel)] = plan.sources[layer.kernel].encode()
    payload.update(web_payload())
    return write_bundle(
        out_dir,
        target=NAME,
        model_name=name,
        inputs=inputs,
        outputs=outputs,
        weights=weights,
        payload=payload,
        options={k: v for k, v in options.items() if k != "verification"},
        provenance=provenance_from_model(model),
        verification=options.get("verification"),
        notes=plan.notes,
    )


def read_plan(bundle: Bundle) -> MetalPlan:
    """The bundle's plan, checked to parse."""
    try:
        plan = MetalPlan.from_dict(json.loads(bundle.read_bytes(PLAN)))
        if plan.dtype not in ("half", "float"):
            raise ValueError(f"dtype {plan.dtype!r}")
        return plan
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(
            f"{PLAN} is not a valid plan ({type(exc).__name__}: {str(exc)[:80]})",
            path=str(bundle.root),
            hint="re-export the bundle",
        ) from None


def kernel_sources(bundle: Bundle, plan: MetalPlan, label: str) -> dict[str, str]:
    """Each layer's WGSL source from the bundle, by kernel name (UTF-8 text, else one line)."""
    sources: dict[str, str] = {}
    for layer in plan.layers:
        try:
            sources[layer.kernel] = bundle.read_bytes(kernel_path(layer.kernel)).decode()
        except UnicodeDecodeError:
            raise InputError(
                "kernel is not UTF-8 text",
                path=label,
                where=kernel_path(layer.kernel),
                hint="re-export the bundle",
            ) from None
    return sources


def load(bundle: Bundle | str | os.PathLike) -> WebGPURunner:
    """A runner that runs the bundle's kernels on this machine's WebGPU adapter."""
    if not isinstance(bundle, Bundle):
        bundle = load_bundle(bundle)
    label = str(bundle.root)
    if bundle.target != NAME:
        raise InputError(
            f"bundle is for target '{bundle.target}', not '{NAME}'",
            path=label,
            hint=f"run it with --target {bundle.target}",
        )
    plan = read_plan(bundle)
    sources = kernel_sources(bundle, plan, label)
    weights = bundle.arrays([b.name for b in plan.weight_buffers()])
    return WebGPURunner(
        plan,
        sources,
        weights,
        bundle.inputs,
        [o.name for o in bundle.outputs],
        label,
        output_dtypes={o.name: o.dtype for o in bundle.outputs},
    )


def load_model(model: ir.Model, label: str = "model", options: Mapping | None = None) -> WebGPURunner:
    """Export ``model`` to a temporary bundle and load it (``mconv run model.onnx --target webgpu``)."""
    tmp = Path(tempfile.mkdtemp(prefix="mconv-webgpu-bundle."))
    try:
        runner = load(export(model, tmp / "bundle", options))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    runner.label = label
    return runner


name = NAME
TARGET = sys.modules[__name__]  # the protocol (mconv.targets.base): this module
