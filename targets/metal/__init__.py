"""The metal target: Metal Shading Language kernels plus a Swift package that runs them.

Export rules:

1. The model is prepared (:func:`mconv.targets.gpu.plan.prepare`: BatchNorm folded, static
   batch ``options["batch"]`` (default 1), shapes inferred) and lowered to a plan: buffers and
   one specialized ``kernel void`` per layer, activations fused (:mod:`mconv.targets.metal.plan`).
   Unsupported nodes fail the export with one :class:`~mconv.errors.UnsupportedError` naming
   every one of them (exit 2). An If whose condition is constant once shapes are static becomes
   its taken branch (the ``inline-if`` pass) and the model is prepared again; an If decided at
   run time whose branches are both cheap runs both and selects with Where
   (:mod:`mconv.targets.gpu.ifs`); an If left is refused, naming the graph inputs its
   condition depends on with the ``export --input-value NAME=VALUE`` that bakes them.
2. ``options["precision"]``: ``fp16`` (default: half storage, float accumulation) or ``fp32``.
3. The bundle holds ``metal_plan.json`` (the layers in encode order), the Swift package
   (:mod:`mconv.targets.metal.swift`), ``weights.mcw`` with every weight buffer the kernels
   read (with fp16 storage a weight the codec chooser would store raw is stored fp16: the
   kernels read half anyway) and ``metal_graph.onnx``, the prepared graph the plan was built
   from without the weights' data (:mod:`mconv.targets.gpu.graph`); the plan is built from
   the weights as stored, so plan and kernels are what a loader regenerates.

Load rules:

1. A bundle is data: nothing it ships is compiled. ``load`` reads ``metal_graph.onnx`` (checked
   like any ONNX file, no external data), restores its weights from ``weights.mcw`` and
   regenerates plan and ``kernels.metal`` (:func:`regenerate`; precision, batch and model name
   from the manifest); the shipped ``metal_plan.json`` and ``kernels.metal`` must be
   byte-identical to them, else one :class:`~mconv.errors.InputError` (exit 2, re-export). A
   bundle without the graph file (an older mconv's) is refused the same way.
2. ``load(bundle)`` returns a :class:`~mconv.targets.metal.harness.HarnessRunner`: the
   regenerated kernels compiled as C++ against ``metal_shim.h`` and run on the CPU in the Swift
   host's order (:mod:`mconv.targets.metal.harness`). Without a C++ compiler it raises a
   one-line :class:`~mconv.errors.InputError` (exit 2) saying so.
3. ``load_model(model)`` exports to a temporary bundle and loads it.
4. Names from the model (nodes, values, the model's name) reach generated code only escaped:
   in comments as :func:`~mconv.targets.metal.harness.comment_text`, in Swift strings as
   :func:`~mconv.targets.metal.swift.swift_string`.
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
from mconv.errors import InputError, IntegrityError, UnsupportedError
from mconv.fileio import load_json
from mconv.irio import real_inputs
from mconv.targets.base import open_bundle
from mconv.targets.gpu.bundle import bundle_io, plan_json, plan_options, weight_spec
from mconv.targets.gpu.graph import graph_bytes, plan_with_stored_weights, read_graph, regenerated_mismatch
from mconv.targets.gpu.plan import GpuPlan
from mconv.targets.metal.harness import HarnessRunner, compile_harness
from mconv.targets.metal.options import Options
from mconv.targets.metal.plan import build_plan, metal_source
from mconv.targets.metal.swift import package_files, swift_name

__all__ = [
    "NAME",
    "PLAN",
    "TARGET",
    "Options",
    "export",
    "load",
    "kernels_path",
    "load_model",
    "read_plan",
    "regenerate",
]

NAME = "metal"
PLAN = "metal_plan.json"
GRAPH = "metal_graph.onnx"


def _prepare_inlining_ifs(model: ir.Model, batch: int) -> ir.Model:
    """Rule 1: an If whose condition folds to a constant (static shapes make many of them so)
    becomes its taken branch, and a cheap If decided at run time runs both branches and
    selects (:mod:`mconv.targets.gpu.ifs`); the result is prepared again."""
    from mconv.targets.gpu.ifs import prepare_with_ifs

    return prepare_with_ifs(model, batch)


def _if_inputs(graph: ir.Graph, node: ir.Node) -> list[str]:
    """The graph inputs an If's condition is computed from."""
    inputs = {id(v): v.name or "" for v in real_inputs(graph)}
    found: list[str] = []
    seen: set[int] = set()
    todo: list[ir.Value | None] = [node.inputs[0]] if node.inputs else []
    while todo:
        v = todo.pop()
        if v is None or id(v) in seen:
            continue
        seen.add(id(v))
        if id(v) in inputs and inputs[id(v)] not in found:
            found.append(inputs[id(v)])
        producer = v.producer()
        if producer is not None:
            todo.extend(producer.inputs)
    return found


def _name_if_inputs(prepared: ir.Model, exc: UnsupportedError) -> UnsupportedError:
    """An If left after preparing decides at run time: its item names the inputs its condition
    depends on, and the hint says how to bake them (``export --input-value``)."""
    from mconv.errors import show

    ifs = {n.name: n for n in prepared.graph if n.op_type == "If" and n.domain in ("", "ai.onnx")}
    if not ifs or not any(kind == "If" for _, kind in exc.items):
        return exc
    names: list[str] = []
    items = []
    for item, kind in exc.items:
        node = ifs.get(item) if kind == "If" else None
        if node is None:
            items.append((item, kind))
            continue
        deps = _if_inputs(prepared.graph, node)
        names += [d for d in deps if d not in names]
        items.append(
            (
                item,
                f"If: condition from input {', '.join(show(d) for d in deps)}"
                if deps
                else "If: condition computed at run time",
            )
        )
    example = " ".join(f"--input-value {show(d)}=VALUE" for d in names[:3]) or "--input-value NAME=VALUE"
    hint = (
        f"bake what the If's condition depends on: export {example} (an If decided at export time is inlined)"
    )
    if exc.hint and any(kind != "If" and not kind.startswith("If:") for _, kind in items):
        hint += f"; {exc.hint}"
    new = UnsupportedError(items, what=exc.what, path=exc.path, hint=hint)
    new.where = exc.where
    return new


def export(model: ir.Model, out_dir: str | os.PathLike, options: Mapping | None = None) -> Bundle:
    """Write a metal bundle (plan, Swift package, kernels, weights.mcw) for ``model`` at ``out_dir``."""
    options = dict(options or {})
    out_dir = Path(out_dir)
    original_inputs = [TensorSpec.from_value(v) for v in real_inputs(model.graph)]
    prepared = _prepare_inlining_ifs(model, int(options.get("batch") or 1))
    name = options.get("model_name") or model.graph.name or out_dir.name
    metadata = dict(prepared.metadata_props)
    plan_options = {**options, "model_name": name}
    try:
        plan, weights = plan_with_stored_weights(
            prepared,
            lambda m: build_plan(m, plan_options),
            lambda p, n, a: weight_spec(a, metadata, n, p.dtype, options.get("codec")),
        )
    except UnsupportedError as exc:
        raise _name_if_inputs(prepared, exc) from None
    kernels = metal_source(plan)
    plan_bytes = plan_json(plan)
    graph_outputs = [TensorSpec.from_value(v) for v in model.graph.outputs]
    inputs, outputs = bundle_io(plan, original_inputs, graph_outputs)
    payload = {
        PLAN: plan_bytes,
        GRAPH: graph_bytes(prepared, [b.name for b in plan.weight_buffers()]),
        **package_files(plan, kernels),
    }
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


def read_plan(bundle: Bundle) -> GpuPlan:
    """The bundle's plan as shipped, checked to parse (for reading it; :func:`load` runs the
    plan it regenerates, see :func:`regenerate`)."""
    label = str(bundle.root)
    data = load_json(bundle.read_bytes(PLAN), PLAN, label, "re-export the bundle")
    try:
        return GpuPlan.from_dict(data)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(
            f"{PLAN} is not a valid plan ({type(exc).__name__}: {str(exc)[:80]})",
            path=label,
            hint="re-export the bundle",
        ) from None


def regenerate(bundle: Bundle, label: str) -> tuple[GpuPlan, str, dict[str, np.ndarray]]:
    """(plan, kernels.metal text, weights) that mconv generates from the bundle's graph
    (``metal_graph.onnx`` with the weights of ``weights.mcw``); the shipped plan and kernels
    must be byte-identical to them (load rule 1), else one InputError."""
    model, weights = read_graph(bundle, GRAPH, label)
    plan = build_plan(model, plan_options(bundle, label, "fp16"))
    kernels = metal_source(plan)
    regenerated_mismatch(bundle, {PLAN: plan_json(plan), kernels_path(plan): kernels.encode()}, label, GRAPH)
    outputs = [o.name for o in bundle.outputs]
    if outputs != [o["name"] for o in plan.outputs]:
        raise IntegrityError(
            "manifest.json's outputs are not the plan's",
            path=label,
            hint="the bundle was edited after export; re-export it from the model",
        )
    return plan, kernels, weights


def kernels_path(plan: GpuPlan) -> str:
    return f"Sources/{swift_name(plan.model_name)}/kernels.metal"


def load(bundle: Bundle | str | os.PathLike) -> HarnessRunner:
    """A runner that runs the bundle's kernels on the CPU through the C++ harness."""
    bundle = open_bundle(bundle, NAME)
    label = str(bundle.root)
    plan, kernels, weights = regenerate(bundle, label)
    exe = compile_harness(plan, kernels, label)
    return HarnessRunner(
        plan,
        exe,
        weights,
        bundle.inputs,
        [o.name for o in bundle.outputs],
        label,
        output_dtypes={o.name: o.dtype for o in bundle.outputs},
    )


def load_model(model: ir.Model, label: str = "model", options: Mapping | None = None) -> HarnessRunner:
    """Export ``model`` to a temporary bundle and load it (``mconv run model.onnx --target metal``)."""
    tmp = Path(tempfile.mkdtemp(prefix="mconv-metal-bundle."))
    try:
        bundle = export(model, tmp / "bundle", options)
        runner = load(bundle)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    runner.label = label
    return runner


# The target (the protocol of mconv.targets.base) is this module.
name = NAME
TARGET = sys.modules[__name__]
