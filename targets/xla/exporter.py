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
   embeds them as constants (see :mod:`mconv.engines.xla.lower.graph`, rule 3).
5. Determinism: MLIR locations keep only the innermost frame's file *base name* and line
   (``jax_include_full_tracebacks_in_locations`` off, directories removed with
   ``jax_hlo_source_file_canonicalization_regex``), so the same model, options, mconv and jax
   versions give byte-identical files on any checkout or install path.
6. 64-bit mode (``jax_enable_x64``) is on when a graph input or output is 64-bit, or an int64
   constant outside int32 feeds Add/Sub/Mul/Div/MatMul, so int64 and float64 keep their types; it
   is recorded in ``xla.json`` for the loader.
7. Symbolic dimensions: ``?``, empty and negative sizes get one symbol each (``d{input}_{axis}``);
   every symbol is constrained ``<= DIM_BOUND`` (1e9), so bounds of 1e9 / INT64_MAX simplify.
   When tracing with symbolic dimensions fails and the model's inputs are all fixed (the CLI's
   ``--input-shape`` fixes them before export), the program is exported with those static
   shapes instead, said in one line on stderr and recorded as ``static_fallback`` in the
   manifest's options and in ``xla.json``; when a dimension is still open, the error (exit 2)
   names the node and asks for ``--input-shape``.
8. A symbolic batch never changes the model's meaning: when the model declares batch 1 (made
   ``b`` by rule 1) and a ``Reshape`` constant pins it (light AlexNet's ``Reshape(x, [1,
   9216])``), the export is refused (exit 2) naming the node: the ``dynamic-batch`` pass rewrites
   such constants in the model itself (and checks the result), or ``batch=1`` keeps the batch.
9. Weight layouts: XLA on the CPU wants a convolution's kernel as HWIO and a ``Gemm(transB=1)``
   matrix as [K, N]; a weight argument in ONNX's OIHW / [N, K] would be transposed (copied) on
   every call (AlexNet's 230 MB of fully connected weights: ~0.9 s a call). Such an argument
   takes the weight already permuted: ``xla.json`` records the permutation (``layout``) and the
   loader applies it once; inside the program the inverse transpose cancels against XLA's own.
   The container keeps the ONNX layout (codecs, byte account and the other targets unchanged).
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

import jax
import numpy as np
import onnx_ir as ir
from mconv.bundle import DENSE, Bundle, TensorSpec, provenance_from_model, write_bundle
from mconv.container import choose_codec
from mconv.engines.xla.lower import lower_graph
from mconv.errors import InputError, MconvError, shorten, show
from mconv.irio import real_inputs
from mconv.targets.xla.runtime import CONVENTION, PAYLOAD

NAME = "xla"
MLIR_BYTECODE = "model.mlirbc"
MLIR_TEXT = "model.stablehlo.mlir"
DEFAULT_PLATFORMS = ("cpu", "cuda")
_KNOWN_PLATFORMS = {"cpu", "cuda", "rocm", "tpu"}
_OPTION_KEYS = {"batch", "platforms", "mlir_text", "bake_weights", "codec", "verification"}


def _dtype_name(value: ir.Value) -> str:
    return TensorSpec.from_value(value).dtype


# Names jax's symbolic-shape parser reads as operators or keeps for itself.
_RESERVED = {"mod", "floordiv", "max", "min", "non_negative", "_", "b"}
DIM_BOUND = 1_000_000_000
"""Every symbolic dimension is declared ``<= DIM_BOUND`` (a jax symbolic constraint, checked at
call time): then a Slice end of 1e9 or INT64_MAX (``min(d, 1e9)``) simplifies to ``d``."""


def _symbol(name: str | None) -> str | None:
    """A jax symbol for an ONNX dim_param, or None when the name is no name (``?``, ``-1``, empty)."""
    if not name:
        return None
    s = re.sub(r"[^A-Za-z0-9_]", "_", name).strip("_")
    if not s:
        return None
    s = s if s[0].isalpha() else "d_" + s
    return "d_" + s if s in _RESERVED else s


def input_shapes(model: ir.Model, batch: int | None, *, static: bool = False) -> tuple[list[list], bool]:
    """Each real input's shape for export (ints and symbol names) and whether batch 1 became ``b``.

    The leading dimension of an input is the batch ``b`` when it is symbolic, or 1 on an input
    of rank >= 2 (``batch`` fixes it instead); a dim_param named on a leading dimension is ``b``
    wherever else it appears. Other dim_params keep their names (sanitized; the same name is the
    same symbol); unnamed ones (``?``, negative sizes) get one symbol each. ``static``: the shapes
    as the model declares them (None where a dimension is not fixed), for the static fallback.
    """
    declared: list[ir.Shape] = []
    for v in real_inputs(model.graph):
        if v.shape is None:
            raise InputError(
                f"input '{show(v.name)}' has no shape",
                where=f"input '{show(v.name)}'",
                hint="give the model static input shapes (--input-shape NAME=DIMS)",
            )
        declared.append(v.shape)
    if static:
        return [[d if isinstance(d, int) and d >= 0 else None for d in shape] for shape in declared], False
    leading: set[str] = set()
    for shape in declared:
        if len(shape) and not isinstance(shape[0], int) and shape[0].value:
            leading.add(str(shape[0].value))
    batch_sym = batch if batch is not None else "b"
    shapes, replaced = [], False
    for i, shape in enumerate(declared):
        dims: list = []
        for j, d in enumerate(shape):
            fixed = isinstance(d, int) and d >= 0
            name = None if isinstance(d, int) else (str(d.value) if d.value else None)
            if j == 0 and (not fixed or (d == 1 and len(shape) >= 2)):
                dims.append(batch_sym)
                replaced = replaced or (fixed and batch is None)
            elif fixed:
                dims.append(d)
            elif name is not None and name in leading:
                dims.append(batch_sym)
            else:
                dims.append(_symbol(name) or f"d{i}_{j}")
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
    if any(_dtype_name(v) in wide for v in vals):
        return True
    # an int64 constant beyond int32 fed to arithmetic (a fixed-point multiplier, a 2**62 offset:
    # the int8 LSTM of formats/tflite/lstm_int.py) means int64 arithmetic; Slice ends of INT64_MAX
    # and the like do not
    arith = {"Add", "Sub", "Mul", "Div", "MatMul"}
    for init in model.graph.initializers.values():
        t = init.const_value
        if t is None or _dtype_name(init) != "int64" or not t.size:
            continue
        if any(use[0].op_type in arith for use in init.uses()):
            a = t.numpy()
            if int(a.max()) > 2**31 - 1 or int(a.min()) < -(2**31):
                return True
    return False


def weight_layouts(model: ir.Model, weight_names: list[str]) -> dict[str, list[int]]:
    """Rule 9: the permutation each weight argument is passed in (only those that need one)."""
    graph = model.graph
    out: dict[str, list[int]] = {}
    for name in weight_names:
        value = graph.initializers.get(name)
        if value is None or value.const_value is None or value.is_graph_output():
            continue
        rank = len(value.const_value.shape)
        uses = list(value.uses())
        perms: set[tuple[int, ...] | None] = set()
        for use in uses:
            node, index = use[0], use[1]
            if node.domain not in ("", "ai.onnx") or index != 1:
                perms.add(None)
            elif node.op_type == "Conv" and rank >= 3:
                perms.add((*range(2, rank), 1, 0))
            elif node.op_type == "Gemm" and rank == 2:
                attr = node.attributes.get("transB")
                perms.add((1, 0) if attr is not None and attr.value else None)
            else:
                perms.add(None)
        if len(perms) == 1:
            (perm,) = perms
            if perm is not None:
                out[name] = list(perm)
    return out


def pinned_batch(model: ir.Model, batch: int) -> tuple[str, list[int]] | None:
    """Rule 8: the first Reshape whose constant shape pins the declared ``batch`` once dimension
    0 of the inputs is symbolic, as (``Reshape 'name'``, its shape), or None."""
    from mconv.edit.rewrite import constant_array, name_of
    from mconv.passes.dynamic_batch import _inferred_dims

    graph = model.graph
    reshapes = [
        n for n in graph if n.op_type == "Reshape" and n.domain in ("", "ai.onnx") and len(n.inputs) >= 2
    ]
    if not reshapes:
        return None
    saved = [(v, s) for v in real_inputs(graph) if (s := v.shape) is not None and len(s) >= 2]
    sym = "mconv_batch"
    try:
        for v, s in saved:
            if isinstance(s[0], int) and s[0] == batch:
                v.shape = ir.Shape([sym, *list(s)[1:]])
        dims = _inferred_dims(model)
    finally:
        for v, s in saved:
            v.shape = s
    for node in reshapes:
        data = node.inputs[0]
        d_in = dims.get(name_of(data)) if data is not None else None
        if not d_in or d_in[0] != sym:
            continue
        target = constant_array(node.inputs[1], graph, model.ir_version or 10)
        if target is None or target.ndim != 1 or target.size == 0 or int(target[0]) != batch:
            continue
        return f"Reshape '{show(node.name)}'", target.astype(np.int64).tolist()
    return None


def _trace(lowered, model: ir.Model, shapes: list[list], replaced: bool, x64: bool, platforms: tuple):
    """``jax.export`` the lowered graph for input ``shapes`` (ints and symbol names); weight
    arguments in the layouts of rule 9 (``lowered.layouts``)."""
    inputs = real_inputs(model.graph)
    symbols = sorted({d for dims in shapes for d in dims if isinstance(d, str)})
    with jax.enable_x64(x64):
        scope = jax.export.SymbolicScope([f"{s} <= {DIM_BOUND}" for s in symbols])
        specs = []
        batch_dim = None
        for v, dims in zip(inputs, shapes):
            text = ", ".join(str(d) for d in dims)
            shape: tuple = jax.export.symbolic_shape(text, scope=scope) if dims else ()
            if dims and isinstance(dims[0], str) and dims[0] == "b":
                batch_dim = shape[0]
            specs.append(jax.ShapeDtypeStruct(shape, np.dtype(_dtype_name(v))))
        layouts = lowered.layouts
        perms = []
        for name, arr in lowered.weights(stored=True):
            perm = layouts.get(name)
            perms.append(None if perm is None else tuple(int(i) for i in np.argsort(perm)))
            shape = arr.shape if perm is None else tuple(arr.shape[i] for i in perm)
            specs.append(jax.ShapeDtypeStruct(shape, arr.dtype))
        lowered.declared_batch = lowered.model_batch if replaced else None
        inner = lowered.function(batch_dim=batch_dim)
        n_in = len(inputs)

        def fn(*args):
            weights = [a if p is None else jax.numpy.transpose(a, p) for a, p in zip(args[n_in:], perms)]
            return inner(*args[:n_in], *weights)

        # Rule 5: no source locations in the program (they hold this checkout's paths).
        with (
            jax._src.config.include_full_tracebacks_in_locations(False),
            jax._src.config.hlo_source_file_canonicalization_regex(r"^.*[/\\]"),
        ):
            return jax.export.export(jax.jit(fn), platforms=platforms)(*specs)


def _static_shapes(model: ir.Model, shapes: list[list]) -> tuple[list[list], list[str]]:
    """The symbolic entries of ``shapes`` replaced by the sizes the model declares; and the
    inputs (``name [dims]``) that still have a dimension no one fixed."""
    declared, _ = input_shapes(model, None, static=True)
    out, open_inputs = [], []
    for v, dims, decl in zip(real_inputs(model.graph), shapes, declared):
        fixed = [d if isinstance(d, int) else decl[j] for j, d in enumerate(dims)]
        if any(d is None for d in fixed):
            shown = ",".join("?" if d is None else str(d) for d in fixed)
            open_inputs.append(f"{show(v.name)} [{shown}]")
        out.append(fixed)
    return out, open_inputs


def _why(exc: BaseException) -> str:
    if isinstance(exc, MconvError):
        return (f"{exc.where}: " if exc.where else "") + exc.message
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def export_program(model: ir.Model, options: Mapping | None = None):
    """Lower and ``jax.export`` ``model``: (exported, lowered graph, input shapes, x64).

    The program is first traced with symbolic dimensions (rule 1). When that fails and every
    input dimension is fixed in the model (``--input-shape`` fixes them before the target sees
    the model), it is traced again with those static shapes; ``lowered.shape_note`` then says
    so (the exporter prints it on stderr and records it in the manifest and ``xla.json``). When
    a dimension is still open, the error names the node and asks for ``--input-shape``.
    """
    options = dict(options or {})
    _check_options(options)
    lowered = lower_graph(model, bake_weights=bool(options.get("bake_weights", False)))
    lowered.model_batch = lowered.declared_batch
    lowered.layouts = weight_layouts(model, lowered.weight_names)
    shapes, replaced = input_shapes(model, options.get("batch"))
    pin_note = None
    if replaced and lowered.model_batch is not None:
        pin = pinned_batch(model, lowered.model_batch)
        if pin is not None:
            # A symbolic batch would change what the model computes: keep the batch it declares,
            # and say so (the dynamic-batch pass frees it in the model itself).
            shapes, replaced = input_shapes(model, lowered.model_batch)
            lowered.model_batch = lowered.declared_batch = None
            pin_note = shorten(
                f"xla: exported with the model's batch {pin[1][0] if pin[1] else 1}: {pin[0]} pins it in the "
                f"shape constant {pin[1]} (for a symbolic batch run the dynamic-batch pass first: "
                "mconv optimize MODEL --passes dynamic-batch -o M.onnx)",
                400,
            )
    x64 = _needs_x64(model)
    platforms = tuple(options.get("platforms") or DEFAULT_PLATFORMS)
    if not any(isinstance(d, str) for dims in shapes for d in dims):
        exported = _trace(lowered, model, shapes, replaced, x64, platforms)
        if pin_note:
            lowered.shape_note = pin_note
        return exported, lowered, shapes, x64
    try:
        return _trace(lowered, model, shapes, replaced, x64, platforms), lowered, shapes, x64
    except Exception as exc:  # noqa: BLE001 - any failure under symbolic shapes may be one of them
        first = exc
    static, open_inputs = _static_shapes(model, shapes)
    if open_inputs:
        where = first.where if isinstance(first, MconvError) else None
        message = first.message if isinstance(first, MconvError) else _why(first)
        raise InputError(
            f"cannot be lowered with symbolic input dimensions: {message}",
            path=first.path if isinstance(first, MconvError) else None,
            where=where,
            hint="pass --input-shape NAME=DIMS to export static shapes for "
            + ", ".join(open_inputs[:4])
            + (f" and {len(open_inputs) - 4} more" if len(open_inputs) > 4 else ""),
        ) from first
    exported = _trace(lowered, model, static, False, x64, platforms)
    described = ", ".join(
        f"{show(v.name)}=[{','.join(map(str, d))}]" for v, d in zip(real_inputs(model.graph), static)
    )
    lowered.shape_note = shorten(
        f"xla: exported with static shapes {described} (symbolic shapes failed: {_why(first)})", 400
    )
    return exported, lowered, static, x64


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
    for name, arr in lowered.weights(stored=True):
        spec = {"codec": forced} if forced and forced != "auto" else choose_codec(arr, metadata, name)
        weight_specs.append((name, arr, spec))
        arg = {"name": name, "dtype": arr.dtype.name, "shape": [int(d) for d in arr.shape]}
        if name in lowered.layouts:
            arg["layout"] = lowered.layouts[name]  # rule 9: the loader permutes it once
        weight_args.append(arg)
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
    if lowered.shape_note:
        print(lowered.shape_note, file=sys.stderr)
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
    if lowered.shape_note:
        convention["static_fallback"] = lowered.shape_note
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
        options={k: v for k, v in options.items() if k != "verification"}
        | ({"static_fallback": lowered.shape_note} if lowered.shape_note else {}),
        provenance=provenance_from_model(model),
        verification=options.get("verification"),
    )
