"""What every command shares: loading and saving models and data, progress, and the guards on the files a call reads and writes."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir
from mconv.errors import InputError, UnsupportedError

PathLike = str | Path


ModelLike = ir.Model | str | Path


@contextmanager
def _no_progress(title: str, total: float | None = None):
    def update(*args, **kwargs) -> None:
        return None

    update.advance = update  # type: ignore[attr-defined]
    yield update


def _progress(progress):
    return progress if progress is not None else _no_progress


@contextmanager
def naming_the_file(path: PathLike):
    """A refusal raised without a file (the executor, a target's lowering, a pass) names the
    model file it came from: every exit-2 line says which file."""
    try:
        yield
    except (UnsupportedError, InputError) as exc:
        if exc.path is None:
            exc.path = str(path)
        raise


def _external_files(model: ir.Model) -> list[Path]:
    """The files a model's initializers still read from (ONNX external data, spilled tensors)."""
    return sorted(
        {
            Path(v.const_value.path)
            for v in model.graph.initializers.values()
            if isinstance(v.const_value, ir.ExternalTensor)
        }
    )


def _paths_in(value: Any) -> list[Any]:
    """The file paths an argument names: a path, paths in a list or a mapping's values, a
    model's external data files."""
    if isinstance(value, str | Path):
        return [value]
    if isinstance(value, ir.Model):
        return list(_external_files(value))
    if isinstance(value, Mapping):
        return [v for v in value.values() if isinstance(v, str | Path)]
    if isinstance(value, list | tuple):
        return [v for v in value if isinstance(v, str | Path)]
    return []


def _guards(*inputs: str, output: str | None = None, kind: str | Callable[[dict], str] | None = None):
    """Run the call under :func:`mconv.fileio.reading` of the files its ``inputs`` arguments
    name (a FIFO, a device or a socket refused, rule 7), and check its ``output`` argument
    first (:func:`mconv.fileio.check_output`: never an input, never a folder mconv did not
    write) so a refusal comes before the work; every writer checks again when it writes.
    ``kind``: what the output is ("file", "dir"), or a callable of the bound arguments."""
    import functools
    import inspect as _inspect

    def deco(fn):
        sig = _inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            from mconv.fileio import check_output, reading

            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            named = [p for name in inputs for p in _paths_in(bound.arguments.get(name))]
            with reading(*named):
                dest = bound.arguments.get(output) if output else None
                if dest is not None:
                    check_output(dest, kind(bound.arguments) if callable(kind) else kind)
                return fn(*args, **kwargs)

        return wrapper

    return deco


def _note_model_files(model: ir.Model) -> None:
    """The model's external data files are inputs too (:func:`mconv.fileio.note_input`)."""
    from mconv.fileio import note_input

    for f in _external_files(model):
        note_input(f, "model's external data")


def _shapes(input_shapes) -> dict[str, list[int]]:
    """``{"x": [1, 3, 224, 224]}`` as given, or the CLI's ``["x=1,3,224,224", ...]``."""
    if not input_shapes:
        return {}
    if isinstance(input_shapes, Mapping):
        return {str(k): [int(d) for d in v] for k, v in input_shapes.items()}
    from mconv.metrics import parse_input_shapes

    return parse_input_shapes(list(input_shapes))


@_guards("paths", "example_inputs")
def load(
    *paths: PathLike,
    format: str | None = None,
    input_shapes=None,
    input_values: Mapping[str, Any] | Sequence[str] | None = None,
    example_inputs: PathLike | None = None,
    options: Mapping[str, Any] | None = None,
) -> ir.Model:
    """Read a model from any supported format (two paths for split formats) into the IR.

    ``input_shapes`` fixes symbolic input dims (checked and named; downstream shapes inferred);
    ``input_values`` / ``example_inputs`` give a PyTorch ``forward()``'s non-tensor arguments;
    ``options``: format options (e.g. ``{"activations": "float"}`` for an int8 TFLite).
    The notes of the import are in ``model.metadata_props["mconv.import_notes"]``."""
    model, _ = _load(list(paths), format, input_shapes, input_values, example_inputs, options)
    return model


def _load(paths, format, input_shapes, input_values, example_inputs, options):
    from mconv.edit.input_shapes import fix_input_shapes
    from mconv.formats import import_model

    if not paths:
        raise InputError("no model file given", hint="mconv.load('model.onnx')")
    paths = [Path(p) for p in paths]
    shapes = _shapes(input_shapes)
    opts: dict[str, Any] = {**dict(options or {}), "input_shapes": shapes}
    if input_values or example_inputs:  # PyTorch only (formats/pytorch/__init__.py rule 3)
        from mconv.formats.pytorch import parse_input_values

        values = input_values
        if values is not None and not isinstance(values, Mapping):
            values = parse_input_values(list(values))
        opts.update(input_values=dict(values or {}), example_inputs=example_inputs)
    model = import_model(paths, format=format, options=opts)
    if (input_values or example_inputs) and model.metadata_props.get("mconv.source_format") != "torch":
        raise InputError(
            "--input-value and --example-inputs apply to PyTorch models only",
            path=str(paths[0]),
            hint="give ONNX and other formats' input shapes with --input-shape",
        )
    # Every format: the names are checked, symbolic dims fixed, shapes inferred downstream.
    shape_notes = fix_input_shapes(model, shapes, path=str(paths[0]))
    return model, shape_notes


def open_model(path: PathLike) -> ir.Model:
    """A model file as the IR: ``.onnx`` read directly, any other format imported."""
    from mconv.api.runtime import open_model as _open

    return _open(path)


def _as_model(model: ModelLike) -> tuple[ir.Model, Path | None]:
    if isinstance(model, ir.Model):
        return model, None
    m = open_model(model)
    _note_model_files(m)
    return m, Path(model)


@_guards("model", output="path")
def save(
    model: ir.Model,
    path: PathLike,
    format: str | None = None,
    *,
    source: PathLike | None = None,
    options: dict | None = None,
) -> list[Path]:
    """Write ``model``: the format from ``format`` or the file name (``.onnx`` by default; a
    tensors-only model to a name with no known extension becomes a weights bundle). Returns the
    files written."""
    from mconv.formats import get_format, registry

    output = Path(path)
    name = format
    if name is None:
        suffix = output.name.lower()
        matches = [f for f in registry().values() if f.save and any(suffix.endswith(e) for e in f.extensions)]
        if not matches and not suffix.endswith(".onnx"):
            from mconv.formats.weights import is_weight_only

            if is_weight_only(model):  # tensors only: a weights bundle directory
                from mconv.targets.weights import export_weights

                bundle = export_weights(model, output, {})
                return [output / rel for rel in ("manifest.json", *bundle.files)]
        name = matches[0].name if len(matches) == 1 else "onnx"
    if name == "tflite":  # the tflite file is the tflite target's payload: written by that target
        from mconv.targets.tflite import save as save_tflite

        return save_tflite(model, output, {**(options or {}), **({"source": str(source)} if source else {})})
    fmt = get_format(name)
    if fmt.save is None:
        raise InputError(f"format '{name}' has no writer", hint="write .onnx")
    # ``source``: the model file given, which a writer's refusal names (dlk-json); ``options``:
    # a writer's own (tflite: its target's export options)
    return fmt.save(model, output, {**(options or {}), **({"source": str(source)} if source else {})})


def load_data(data, model: ir.Model, *, free_leading: bool = False) -> dict[str, np.ndarray] | None:
    """Feeds for ``model`` from an .npz path (inputs by name, optional ``labels``) or a dict
    (``free_leading``: an input declared ``[1, ...]`` takes any number of samples)."""
    if data is None:
        return None
    if isinstance(data, Mapping):
        return {k: np.asarray(v) for k, v in data.items()}
    from mconv.api.runtime import value_spec
    from mconv.irio import real_inputs
    from mconv.metrics import load_npz_feeds

    specs = [value_spec(v) for v in real_inputs(model.graph)]
    feeds, labels = load_npz_feeds(data, specs, free_leading=free_leading)
    if labels is not None:
        feeds["labels"] = labels
    return feeds


def load_data_batched(model: ir.Model, *data) -> tuple[list[dict[str, np.ndarray] | None], bool]:
    """Feeds for ``model`` from each of ``data`` (see :func:`load_data`); where the model's inputs
    fix the batch at 1 and a set holds more samples, the model's batch is freed in place (the
    ``dynamic-batch`` pass, which checks samples at once against each alone) and True is
    returned: the caller gives the result :func:`mconv.edit.batch.fix_batch` before writing it."""
    from mconv.api.runtime import value_spec
    from mconv.edit.batch import batched_data, fixed_batch_inputs
    from mconv.irio import real_inputs
    from mconv.passes import PassContext, get_pass

    fixed = fixed_batch_inputs(model)
    sets = [load_data(d, model, free_leading=fixed) for d in data]
    if not fixed:
        return sets, False
    specs = [value_spec(v) for v in real_inputs(model.graph)]
    for d, feeds in zip(data, sets):
        n = batched_data(feeds, specs) if feeds is not None else None
        if n is not None:
            try:  # rewritten in place, checked on samples at once against each alone
                cls = get_pass("dynamic-batch")
                cls().run(model, cls.Config(), PassContext())
            except InputError as exc:
                raise InputError(
                    f"the model's inputs fix the batch at 1 and the data holds {n} samples, but its "
                    f"graph does not batch ({exc.message})",
                    path=None if isinstance(d, Mapping) else str(d),
                    hint="give data of one sample, or a model whose batch dimension is free",
                ) from None
            return sets, True
    for d, feeds in zip(data, sets):  # freed nowhere: every set must be of one sample
        counts = {int(np.shape(feeds[s.name])[0]) for s in specs if feeds is not None and s.name in feeds}
        if counts - {1}:
            raise InputError(
                f"the inputs hold different numbers of samples ({', '.join(map(str, sorted(counts)))})",
                path=None if isinstance(d, Mapping) else str(d),
                hint="give every input the same number of samples along the first axis",
            )
    return sets, False


def check_report_path(report: PathLike, *others: PathLike | None) -> None:
    """Refuse a ``--report`` path before any work: an input, the command's output, a folder or
    a FIFO (:func:`mconv.report.check_path`)."""
    from mconv.report import check_path

    check_path(report, *others)
