"""``--input-shape NAME=DIMS``: check the given shapes against a model's inputs and fix them in.

One place for every command that takes ``--input-shape`` (import, inspect, run, verify; export
can call :func:`fix_input_shapes` too):

1. :func:`check_input_shapes` compares the given shapes with the declared inputs (``TensorSpec``-
   like: name, shape): an unknown name, a rank that differs, a dimension that contradicts a fixed
   one, a dimension below 1, or one symbol given two sizes is an ``InputError`` (exit 2) that
   lists the model's inputs. ``?`` is no symbol (exporters write it for any unknown dim).
2. :func:`fix_input_shapes` writes the given dimensions into the graph inputs; a symbolic
   dimension fixed on one input (``N``) takes the same size wherever that symbol appears (other
   inputs, value infos, outputs); then ONNX shape inference runs so downstream shapes follow
   (inference that fails leaves the fixed inputs and says so in the returned notes).
"""

from __future__ import annotations

import onnx_ir as ir
from mconv.errors import InputError, show

# dim_params that exporters write for "unknown" (Paddle2ONNX: '?' for both height and width of
# rapidocr's classifier, which ORT runs at 48x192): not one shared symbol, each dim its own size.
ANONYMOUS_DIMS = frozenset({"?"})


def _describe(specs) -> str:
    parts = []
    for s in specs:
        shape = (
            "?" if s.shape is None else "[" + ",".join("?" if d is None else str(d) for d in s.shape) + "]"
        )
        parts.append(f"{show(s.name)} {shape}")
    return ", ".join(parts) or "none"


def check_input_shapes(specs, shapes: dict[str, list[int]], *, path: str | None = None) -> dict[str, int]:
    """Check ``shapes`` against ``specs``; returns the sizes the given shapes assign to symbols."""
    specs = list(specs)
    by_name = {s.name: s for s in specs}
    symbols: dict[str, int] = {}
    where_symbol: dict[str, str] = {}
    for name, dims in shapes.items():
        spec = by_name.get(name)
        if spec is None:
            raise InputError(
                f"--input-shape names '{show(name)}', which is not an input of the model",
                path=path,
                hint=f"inputs: {_describe(specs)}",
            )
        bad = [d for d in dims if not isinstance(d, int) or d < 1]
        if bad or not dims and spec.shape is None:
            raise InputError(
                f"--input-shape {show(name)}={','.join(map(str, dims))}: dimensions must be integers >= 1",
                path=path,
                hint=f"inputs: {_describe(specs)}",
            )
        if spec.shape is None:
            continue  # no declared shape: the given one is all there is
        if len(spec.shape) != len(dims):
            raise InputError(
                f"--input-shape {show(name)}={','.join(map(str, dims))} has {len(dims)} dimensions, "
                f"input '{show(name)}' has {len(spec.shape)}",
                path=path,
                hint=f"inputs: {_describe(specs)}",
            )
        for i, (declared, given) in enumerate(zip(spec.shape, dims)):
            if isinstance(declared, int) and declared >= 0 and declared != given:
                raise InputError(
                    f"--input-shape {show(name)}={','.join(map(str, dims))}: dimension {i} is fixed "
                    f"at {declared} in the model, not {given}",
                    path=path,
                    hint=f"only symbolic dimensions can be set; inputs: {_describe(specs)}",
                )
            if isinstance(declared, str) and declared and declared not in ANONYMOUS_DIMS:
                if declared in symbols and symbols[declared] != given:
                    raise InputError(
                        f"--input-shape gives symbol '{show(declared)}' two sizes: {symbols[declared]} "
                        f"(input '{show(where_symbol[declared])}') and {given} (input '{show(name)}')",
                        path=path,
                        hint="one symbolic dimension has one size in every input",
                    )
                symbols[declared] = given
                where_symbol[declared] = name
    return symbols


def _fixed(shape: ir.Shape, symbols: dict[str, int]) -> ir.Shape | None:
    dims: list[int | ir.SymbolicDim] = []
    hit = False
    for d in shape:
        if not isinstance(d, int) and d.value in symbols:
            dims.append(symbols[d.value])
            hit = True
        else:
            dims.append(d)
    return ir.Shape(dims) if hit else None


def fix_input_shapes(model: ir.Model, shapes: dict[str, list[int]], *, path: str | None = None) -> list[str]:
    """Fix the given input shapes in ``model`` (checked first); returns notes (what changed)."""
    if not shapes:
        return []
    from mconv.bundle import TensorSpec
    from mconv.irio import real_inputs

    inputs = real_inputs(model.graph)
    symbols = check_input_shapes([TensorSpec.from_value(v) for v in inputs], shapes, path=path)
    notes = []
    for value in inputs:
        if value.name in shapes:
            value.shape = ir.Shape(list(shapes[value.name]))
            notes.append(f"input '{show(value.name)}' fixed to {list(shapes[value.name])}")
    if symbols:  # the same symbol elsewhere takes the same size
        for graph in model.graphs():
            for value in ir.convenience.create_value_mapping(graph).values():
                if value.shape is not None and value.name not in shapes:
                    new = _fixed(value.shape, symbols)
                    if new is not None:
                        value.shape = new
    from mconv.edit.shapes import infer_on_stripped_copy, merge_inferred

    try:
        inferred = infer_on_stripped_copy(model, keep_bytes=1024, strict=False, data_prop=True)
    except Exception as exc:  # onnx raises InferenceError, ValidationError, RuntimeError...
        notes.append(f"shape inference after --input-shape failed: {str(exc).strip()[:160]}")
        return notes
    if inferred is not None:
        merge_inferred(model, inferred)
    return notes
