"""Exporting an ``onnx_ir`` model as an xla bundle: ``jax.export`` of the lowered graph.

Rules:

1. Batch: by default the leading dimension of an input is symbolic (``b``) when it is symbolic
   in the model or when it is 1 on an input of rank >= 2 (exporters often fix batch 1); other
   symbolic dimensions keep their own names. ``options["batch"] = N`` fixes it to N instead.
2. Platforms: ``options["platforms"]`` (default ``["cpu", "cuda"]``; ``"tpu"`` may be added).
3. Files: ``model.jax_export`` (``Exported.serialize()``), ``model.mlirbc`` (the StableHLO
   portable bytecode), ``model.stablehlo.mlir`` with ``options["mlir_text"]``, ``xla.json`` (the
   calling convention: inputs, weight arguments with dtype and shape, outputs, x64), plus the
   manifest and ``weights.mcw``.
4. Weights are arguments in their stored dtype (float16 initializers stay float16; a float32
   weight that the container stores as fp16 decodes back to float32). ``options["bake_weights"]``
   embeds them as constants (see :mod:`mconv.targets.xla.lower.graph`, rule 3).
5. Determinism: MLIR locations keep only the innermost frame's file *base name* and line
   (``jax_include_full_tracebacks_in_locations`` off, directories removed with
   ``jax_hlo_source_file_canonicalization_regex``), so the same model, options, mconv and jax
   versions give byte-identical files on any checkout or install path.
6. 64-bit mode (``jax_enable_x64``) is on when a graph input or output is 64-bit, so int64 and
   float64 keep their types; it is recorded in ``xla.json`` for the loader.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

import jax
import numpy as np
import onnx_ir as ir
from mconv.bundle import DENSE, Bundle, TensorSpec, provenance_from_model, write_bundle
from mconv.container import choose_codec
from mconv.errors import InputError
from mconv.irio import real_inputs
from mconv.targets.xla.lower import lower_graph
from mconv.targets.xla.runtime import CONVENTION, PAYLOAD

NAME = "xla"
MLIR_BYTECODE = "model.mlirbc"
MLIR_TEXT = "model.stablehlo.mlir"
DEFAULT_PLATFORMS = ("cpu", "cuda")
_KNOWN_PLATFORMS = {"cpu", "cuda", "rocm", "tpu"}
_OPTION_KEYS = {"batch", "platforms", "mlir_text", "bake_weights", "codec", "verification"}


def _dtype_name(value: ir.Value) -> str:
    return TensorSpec.from_value(value).dtype


def _symbol(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return s if s and (s[0].isalpha() or s[0] == "_") else "d_" + s


def input_shapes(model: ir.Model, batch: int | None) -> tuple[list[list], bool]:
    """Each real input's shape for export (ints and symbol names) and whether batch 1 became ``b``."""
    shapes, replaced = [], False
    for i, v in enumerate(real_inputs(model.graph)):
        if v.shape is None:
            raise InputError(
                f"input '{v.name}' has no shape",
                where=f"input '{v.name}'",
                hint="give the model static input shapes",
            )
        dims: list = []
        for j, d in enumerate(v.shape):
            fixed = isinstance(d, int)
            if j == 0 and (not fixed or (d == 1 and len(v.shape) >= 2)):
                dims.append(batch if batch is not None else "b")
                replaced = replaced or (fixed and batch is None)
            elif fixed:
                dims.append(int(d))
            else:
                dims.append(_symbol(str(d.value)) if d.value else f"d{i}_{j}")
        shapes.append(dims)
    return shapes, replaced


def _check_options(options: dict) -> None:
    unknown = sorted(set(options) - _OPTION_KEYS)
    if unknown:
        raise InputError(
            f"unknown xla option(s) {', '.join(unknown)}",
            hint=f"choose from: {', '.join(sorted(_OPTION_KEYS))}",
        )
    bad = sorted(set(options.get("platforms") or []) - _KNOWN_PLATFORMS)
    if bad:
        raise InputError(
            f"unknown platform(s) {', '.join(bad)}",
            where="platforms",
            hint=f"choose from: {', '.join(sorted(_KNOWN_PLATFORMS))}",
        )
    b = options.get("batch")
    if b is not None and (not isinstance(b, int) or isinstance(b, bool) or b < 1):
        raise InputError(
            f"batch must be a positive integer, got {b!r}", where="batch", hint="omit it for a symbolic batch"
        )


def _needs_x64(model: ir.Model) -> bool:
    wide = {"int64", "float64", "uint64"}
    vals = list(real_inputs(model.graph)) + list(model.graph.outputs)
    return any(_dtype_name(v) in wide for v in vals)


def export_program(model: ir.Model, options: Mapping | None = None):
    """Lower and ``jax.export`` ``model``: (exported, lowered graph, input shapes, x64)."""
    options = dict(options or {})
    _check_options(options)
    lowered = lower_graph(model, bake_weights=bool(options.get("bake_weights", False)))
    shapes, replaced = input_shapes(model, options.get("batch"))
    x64 = _needs_x64(model)
    platforms = tuple(options.get("platforms") or DEFAULT_PLATFORMS)
    inputs = real_inputs(model.graph)
    with jax.enable_x64(x64):
        scope = jax.export.SymbolicScope()
        specs = []
        batch_dim = None
        for v, dims in zip(inputs, shapes):
            text = ", ".join(str(d) for d in dims)
            shape = jax.export.symbolic_shape(text, scope=scope) if dims else ()
            if dims and isinstance(dims[0], str) and dims[0] == "b":
                batch_dim = shape[0]
            specs.append(jax.ShapeDtypeStruct(shape, np.dtype(_dtype_name(v))))
        for _name, arr in lowered.weights():
            specs.append(jax.ShapeDtypeStruct(arr.shape, arr.dtype))
        if not replaced:
            lowered.declared_batch = None
        fn = lowered.function(batch_dim=batch_dim)
        # Rule 5: no source locations in the program (they hold this checkout's paths).
        with (
            jax._src.config.include_full_tracebacks_in_locations(False),
            jax._src.config.hlo_source_file_canonicalization_regex(r"^.*[/\\]"),
        ):
            exported = jax.export.export(jax.jit(fn), platforms=platforms)(*specs)
    return exported, lowered, shapes, x64


def _aval_shape(aval) -> list:
    return [d if isinstance(d, int) else str(d) for d in aval.shape]


def export(model: ir.Model, out_dir: str | os.PathLike, options: Mapping | None = None) -> Bundle:
    """Write an xla bundle for ``model`` at ``out_dir``."""
    options = dict(options or {})
    exported, lowered, shapes, x64 = export_program(model, options)
    forced = options.get("codec")
    metadata = dict(model.metadata_props)
    weight_specs = []
    weight_args = []
    for name, arr in lowered.weights():
        spec = {"codec": forced} if forced and forced != "auto" else choose_codec(arr, metadata, name)
        weight_specs.append((name, arr, spec))
        weight_args.append({"name": name, "dtype": arr.dtype.name, "shape": [int(d) for d in arr.shape]})
    for name, arr in list(lowered.baked.items()) + list(lowered.static_values.items()):
        weight_specs.append((name, arr, {"codec": DENSE}))
    n_in = len(lowered.input_names)
    in_specs = [
        {"name": n, "dtype": np.dtype(a.dtype).name, "shape": _aval_shape(a)}
        for n, a in zip(lowered.input_names, exported.in_avals[:n_in])
    ]
    out_specs = [
        {"name": n, "dtype": np.dtype(a.dtype).name, "shape": _aval_shape(a)}
        for n, a in zip(lowered.output_names, exported.out_avals)
    ]
    convention = {
        "inputs": in_specs,
        "weight_args": weight_args,
        "outputs": lowered.output_names,
        "output_specs": out_specs,
        "platforms": list(exported.platforms),
        "x64": x64,
        "calling_convention_version": exported.calling_convention_version,
        "jax_version": jax.__version__,
    }
    payload = {
        PAYLOAD: bytes(exported.serialize()),
        MLIR_BYTECODE: bytes(exported.mlir_module_serialized),
        CONVENTION: (json.dumps(convention, sort_keys=True, indent=2) + "\n").encode("utf-8"),
    }
    if options.get("mlir_text"):
        payload[MLIR_TEXT] = exported.mlir_module().encode("utf-8")
    return write_bundle(
        out_dir,
        target=NAME,
        model_name=model.graph.name or Path(out_dir).name,
        inputs=in_specs,
        outputs=out_specs,
        weights=weight_specs,
        payload=payload,
        options={k: v for k, v in options.items() if k != "verification"},
        provenance=provenance_from_model(model),
        verification=options.get("verification"),
    )
