"""The webgpu target: WGSL compute kernels run through WebGPU (wgpu natively, or a browser).

Export rules:

1. The model is prepared and planned as for the Metal target (:mod:`mconv.targets.webgpu.plan`:
   BatchNorm folded, static batch ``options["batch"]`` (default 1), activations fused), and
   each layer gets one specialized WGSL module (:mod:`mconv.targets.webgpu.wgsl`). Unsupported
   nodes fail the export with one UnsupportedError naming every one of them (exit 2). Ifs
   follow the Metal target's rules (:mod:`mconv.targets.gpu.ifs`): one decided at export
   time is inlined, a cheap one decided at run time runs both branches and selects.
2. ``options["precision"]``: ``fp32`` (default: f32 storage) or ``fp16`` (f16 storage where the
   device has ``shader-f16``, f32 where not; f32 accumulation either way). With fp16 a weight
   the codec chooser would store raw is stored fp16 (the kernels read half anyway).
3. The bundle holds ``webgpu_plan.json`` (the Metal plan's schema: buffers, layers in dispatch
   order, bindings, grids), ``kernels/<kernel>.wgsl`` (one module per layer), ``weights.mcw``
   with every weight buffer the kernels read, ``webgpu_graph.onnx`` (the prepared graph the
   plan was built from, without the weights' data: :mod:`mconv.targets.gpu.graph`; the plan
   is built from the weights as stored), and the web page: ``index.html`` with the ES modules
   ``mconv_webgpu.js`` (loads the manifest, plan, kernels and weights, runs the model with the
   browser's WebGPU, one command buffer per inference in plan order, shows outputs and timing)
   and ``mcw.js`` (the weights.mcw decoder: raw, fp16, palette, sparse, Huffman). Serve the
   folder over HTTP (``python3 -m http.server``) and open ``index.html``.

Load rules:

1. A bundle is data: no shipped text is compiled or run. :func:`regenerate` reads
   ``webgpu_graph.onnx`` (checked like any ONNX file, no external data), restores its weights
   from ``weights.mcw`` and rebuilds plan and WGSL (precision, batch and model name from the
   manifest); the shipped plan and every kernel it names must be byte-identical, else one
   InputError (exit 2, re-export); a bundle without the graph file is refused the same way.
   ``mconv run``/``verify`` never open the bundle's page; the browser path
   (:mod:`mconv.targets.webgpu.browser`) serves mconv's own page files and the regenerated
   plan and kernels.
2. ``load(bundle)`` returns a :class:`~mconv.targets.webgpu.runner.WebGPURunner`: the weights
   decoded by the Python decoder of ``weights.mcw`` (:mod:`mconv.container`), the regenerated
   kernels compiled by the device, one command buffer per inference. Where no adapter exists it raises
   a one-line InputError (exit 2) saying so. Integer and bool inputs are written to the float
   buffers as their values; integer and bool outputs come back as the model's type (the bundle's
   output dtypes), as the Metal target's runner gives them.
3. ``load_model(model)`` exports to a temporary bundle and loads it.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx_ir as ir
from mconv.bundle import Bundle, TensorSpec, provenance_from_model, write_bundle
from mconv.errors import InputError, IntegrityError
from mconv.fileio import load_json
from mconv.irio import real_inputs
from mconv.targets.base import open_bundle
from mconv.targets.gpu.bundle import bundle_io, plan_json, plan_options, weight_spec
from mconv.targets.gpu.graph import graph_bytes, plan_with_stored_weights, read_graph, regenerated_mismatch
from mconv.targets.gpu.ifs import prepare_with_ifs
from mconv.targets.gpu.plan import GpuPlan
from mconv.targets.webgpu.browser import web_payload
from mconv.targets.webgpu.options import Options as Options  # the export options
from mconv.targets.webgpu.plan import build_plan
from mconv.targets.webgpu.runner import WebGPURunner

__all__ = ["GRAPH", "NAME", "PLAN", "TARGET", "export", "load", "load_model", "read_plan", "regenerate"]

NAME = "webgpu"
PLAN = "webgpu_plan.json"
GRAPH = "webgpu_graph.onnx"
KERNELS = "kernels"


def kernel_path(kernel: str) -> str:
    return f"{KERNELS}/{kernel}.wgsl"


def export(model: ir.Model, out_dir: str | os.PathLike, options: Mapping | None = None) -> Bundle:
    """Write a webgpu bundle (plan, WGSL kernels, weights.mcw) for ``model`` at ``out_dir``."""
    options = dict(options or {})
    options.setdefault("precision", "fp32")
    out_dir = Path(out_dir)
    original_inputs = [TensorSpec.from_value(v) for v in real_inputs(model.graph)]
    prepared = prepare_with_ifs(model, int(options.get("batch") or 1))  # the Metal target's If rules
    name = options.get("model_name") or model.graph.name or out_dir.name
    metadata = dict(prepared.metadata_props)
    plan_options = {**options, "model_name": name}
    plan, weights = plan_with_stored_weights(
        prepared,
        lambda m: build_plan(m, plan_options),
        lambda p, n, a: weight_spec(a, metadata, n, p.dtype, options.get("codec")),
    )
    plan_bytes = plan_json(plan)
    graph_outputs = [TensorSpec.from_value(v) for v in model.graph.outputs]
    inputs, outputs = bundle_io(plan, original_inputs, graph_outputs)
    payload = {PLAN: plan_bytes, GRAPH: graph_bytes(prepared, [b.name for b in plan.weight_buffers()])}
    payload.update(kernel_files(plan))
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


def kernel_files(plan: GpuPlan) -> dict[str, bytes]:
    """The WGSL modules of ``plan`` by bundle-relative path."""
    return {kernel_path(layer.kernel): plan.sources[layer.kernel].encode() for layer in plan.layers}


def read_plan(bundle: Bundle) -> GpuPlan:
    """The bundle's plan as shipped, checked to parse (for reading it; :func:`load` runs the
    plan it regenerates, see :func:`regenerate`)."""
    label = str(bundle.root)
    data = load_json(bundle.read_bytes(PLAN), PLAN, label, "re-export the bundle")
    try:
        plan = GpuPlan.from_dict(data)
        if plan.dtype not in ("half", "float"):
            raise ValueError(f"dtype {plan.dtype!r}")
        return plan
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(
            f"{PLAN} is not a valid plan ({type(exc).__name__}: {str(exc)[:80]})",
            path=label,
            hint="re-export the bundle",
        ) from None


def regenerate(bundle: Bundle, label: str) -> tuple[GpuPlan, dict[str, str], dict[str, np.ndarray]]:
    """(plan, WGSL by kernel name, weights) that mconv generates from the bundle's graph
    (``webgpu_graph.onnx`` with the weights of ``weights.mcw``); the shipped plan and every
    kernel the plan names must be byte-identical to them (load rule 1), else one InputError."""
    model, weights = read_graph(bundle, GRAPH, label)
    plan = build_plan(model, plan_options(bundle, label, "fp32"))
    regenerated_mismatch(bundle, {PLAN: plan_json(plan), **kernel_files(plan)}, label, GRAPH)
    if [o.name for o in bundle.outputs] != [o["name"] for o in plan.outputs]:
        raise IntegrityError(
            "manifest.json's outputs are not the plan's",
            path=label,
            hint="the bundle was edited after export; re-export it from the model",
        )
    return plan, {layer.kernel: plan.sources[layer.kernel] for layer in plan.layers}, weights


def load(bundle: Bundle | str | os.PathLike) -> WebGPURunner:
    """A runner that runs the bundle's kernels, as mconv regenerates them, on this machine's
    WebGPU adapter."""
    bundle = open_bundle(bundle, NAME)
    label = str(bundle.root)
    plan, sources, weights = regenerate(bundle, label)
    return WebGPURunner(
        plan,
        sources,
        {b.name: np.asarray(weights[b.name], dtype=np.float32) for b in plan.weight_buffers()},
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
