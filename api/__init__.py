"""The library's front door: what every ``mconv`` command does, callable from Python.

``import mconv`` exposes these functions (the package root forwards them here)::

    import mconv

    model = mconv.load("lenet.prototxt", "lenet.caffemodel")            # ir.Model
    res = mconv.optimize(model, recipe="deep-compression", data="calib.npz", output="c.onnx")
    print(res.predicted_bundle_weight_bytes, res.as_dict()["passes"][0]["name"])
    exp = mconv.export(res.model, "cpu", "bundle/")
    report = mconv.metrics("lenet.onnx", "bundle/", data="test.npz")
    assert report.passed, report.failures

Each command of the CLI is one call here with the same options (``mconv import`` is
:func:`convert`; the others have the command's name), and each returns a dataclass whose
``as_dict()`` is exactly the command's ``--json`` document. The CLI only parses options, calls
one of these and renders the result. Errors are the same exception types as the CLI's, with the
same exit codes (:mod:`mconv.errors`): ``InputError`` (2), ``UnsupportedError`` (2),
``GateFailed`` (1; :func:`verify` returns the report and ``report.check()`` raises it), anything
else is a bug.

``progress``: where a call takes it, a factory ``progress(title, total)`` returning a context
manager that yields ``update(description=None, completed=None, total=None, info=None)`` (with
``update.advance(n)``), as the CLI's ``Out.progress``; None shows nothing.
"""

from __future__ import annotations

import builtins
import contextlib
import tempfile
import time
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir
from mconv.errors import GateFailed, InputError, UnsupportedError

__all__ = [
    "AnalyzeResult",
    "ConvertResult",
    "ExportResult",
    "InspectResult",
    "OptimizeResult",
    "RunResult",
    "VerifyResult",
    "analyze",
    "convert",
    "export",
    "inspect",
    "load",
    "open",
    "optimize",
    "run",
    "save",
    "verify",
]

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


def _guards(*inputs: str, output: str | None = None, kind: str | None = None):
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


# --- load / save / convert (mconv import) -----------------------------------------------------


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
    from mconv.formats import import_model
    from mconv.passes.input_shapes import fix_input_shapes

    if not paths:
        raise InputError("no model file given", hint="mconv.load('model.onnx')")
    paths = [Path(p) for p in paths]
    shapes = _shapes(input_shapes)
    opts: dict[str, Any] = {**dict(options or {}), "input_shapes": shapes}
    if input_values or example_inputs:  # PyTorch only (formats/torch_format.py rule 3)
        from mconv.formats.torch_format import parse_input_values

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


@dataclass
class ConvertResult:
    """``mconv import``: the model read and written (``as_dict()`` is its ``--json``)."""

    output: str
    files: list[str]
    source_format: str | None
    seconds: float
    stats: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    model: ir.Model | None = field(default=None, repr=False, compare=False)

    def as_dict(self) -> dict[str, Any]:
        doc = {
            "output": self.output,
            "files": self.files,
            "source_format": self.source_format,
            "seconds": self.seconds,
            **self.stats,
        }
        if self.notes:
            doc["notes"] = self.notes
        return doc


@_guards("src", "example_inputs", output="output", kind="file")
def convert(
    src: PathLike | Sequence[PathLike],
    output: PathLike,
    *,
    format: str | None = None,
    input_shapes=None,
    input_values=None,
    example_inputs: PathLike | None = None,
    options: Mapping[str, Any] | None = None,
) -> ConvertResult:
    """``mconv import SRC -o OUTPUT``: read ``src`` (one path, or two for split formats), write
    ``output`` (.onnx), and check that ONNX's checker and ONNX Runtime accept what was written."""
    from mconv.formats.weights import is_weight_only
    from mconv.irio import model_stats, save_onnx
    from mconv.targets.validity import check_written

    t0 = time.perf_counter()
    paths = [Path(src)] if isinstance(src, str | Path) else [Path(p) for p in src]
    output = Path(output)
    model, shape_notes = _load(paths, format, input_shapes, input_values, example_inputs, options)
    _note_model_files(model)
    written = save_onnx(model, output)
    check_written(
        output, paths[0] if len(paths) == 1 else None, what="import", graph=not is_weight_only(model)
    )
    notes = model.metadata_props.get("mconv.import_notes")
    return ConvertResult(
        output=str(output),
        files=[str(p) for p in written],
        source_format=model.metadata_props.get("mconv.source_format"),
        seconds=round(time.perf_counter() - t0, 3),
        stats=model_stats(model).as_dict(),
        notes=(notes.split("\n") if notes else []) + shape_notes,
        model=model,
    )


@_guards("model", output="path")
def save(
    model: ir.Model, path: PathLike, format: str | None = None, *, source: PathLike | None = None
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
    fmt = get_format(name)
    if fmt.save is None:
        raise InputError(f"format '{name}' has no writer", hint="write .onnx")
    # ``source``: the model file given, which a writer's refusal names (dlk-json).
    return fmt.save(model, output, {"source": str(source)} if source else {})


# --- optimize ----------------------------------------------------------------------------------


def load_data(data, model: ir.Model) -> dict[str, np.ndarray] | None:
    """Feeds for ``model`` from an .npz path (inputs by name, optional ``labels``) or a dict."""
    if data is None:
        return None
    if isinstance(data, Mapping):
        return {k: np.asarray(v) for k, v in data.items()}
    from mconv.api.runtime import value_spec
    from mconv.irio import real_inputs
    from mconv.metrics import load_npz_feeds

    feeds, labels = load_npz_feeds(data, [value_spec(v) for v in real_inputs(model.graph)])
    if labels is not None:
        feeds["labels"] = labels
    return feeds


@dataclass
class OptimizeResult:
    """``mconv optimize``: the optimized model, each pass's report, the predicted byte account."""

    output: str | None
    files: list[str]
    weight_bytes_before: int
    weight_bytes_after: int
    file_bytes_after: int | None
    predicted_bundle_weight_bytes: int | None
    reports: list = field(default_factory=list)
    account: dict | None = None
    model: ir.Model | None = field(default=None, repr=False, compare=False)
    budget: Any = field(default=None, repr=False)  # a passes.budget.BudgetResult
    # False: lossy passes ran and nothing measured the result (a recipe without data); None: no
    # such claim (lossless passes, or data was given)
    accuracy_measured: bool | None = None
    datafree: Any = field(default=None, repr=False)  # a passes.budget.DataFreePlan
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        doc = self._doc()
        if self.budget is not None:
            doc["budget"] = self.budget.as_dict()
            doc["accuracy_measured"] = self.budget.accuracy_measured
        elif self.accuracy_measured is not None:
            doc["accuracy_measured"] = self.accuracy_measured
        if self.datafree is not None:
            doc["datafree"] = self.datafree.as_dict()
        doc["warnings"] = list(self.warnings)
        return doc

    def _doc(self) -> dict[str, Any]:
        return {
            "output": self.output,
            "files": self.files,
            # like for like: weight bytes in the input and in the written model (dense)
            "bytes_before": self.weight_bytes_before,
            "bytes_after": self.weight_bytes_after,
            "weight_bytes_before": self.weight_bytes_before,
            "weight_bytes_after": self.weight_bytes_after,
            "file_bytes_after": self.file_bytes_after,
            # what an export stores for these weights, from the byte account (None: not
            # predicted, the model carries no pruning or clustering facts)
            "predicted_bundle_weight_bytes": self.predicted_bundle_weight_bytes,
            "passes": [r.as_dict() for r in self.reports],
            "account": self.account,
        }


def _stream_config(passes: str, scheme) -> dict:
    """The pass's whole config as the graph pipeline records it (every option, defaults
    included), with the streamed selection's ``min_elements``: a bundle's provenance."""
    import dataclasses

    from mconv import passes as P
    from mconv.passes.cluster import Cluster

    spec = P.parse_spec(passes)[0]
    return {**dataclasses.asdict(Cluster.Config()), **spec.config, "min_elements": scheme.min_elements}


def _optimize_streamed(src: Path, passes: str, scheme, output: Path, progress) -> OptimizeResult:
    """``optimize`` of a safetensors checkpoint by one streamable pass
    (:func:`mconv.formats.weights_stream.compress_checkpoint`)."""
    from mconv.formats.weights_stream import compress_checkpoint, compress_to_bundle, open_checkpoint
    from mconv.passes.base import PassReport

    with naming_the_file(src):
        n = sum(len(s.tensors) for s in open_checkpoint(src)[0])
        with _progress(progress)(f"optimize {passes}", n) as update:
            done = [0]

            def tick(name: str) -> None:
                update(f"stream {name}", done[0], n)
                done[0] += 1

            if scheme.bundle:  # one file to a folder: a weights bundle (weights_stream rule 7)
                r = compress_to_bundle(src, output, scheme, config=_stream_config(passes, scheme), tick=tick)
            else:
                r = compress_checkpoint(src, output, scheme, tick=tick)
    keys = ("bits", "init", "groups") if scheme.kind == "cluster" else ("bits", "block", "sym", "method")
    config = {k: getattr(scheme, k) for k in (*keys, "min_elements")}
    report = PassReport(
        scheme.kind,
        config,
        bytes_before=r.bytes_in,
        bytes_after=r.bytes_out,
        seconds=r.seconds,
        tensors=r.tensors,
        notes=[
            f"streamed: {r.mb_per_s:.0f} MB/s of input, {'a weights bundle' if scheme.bundle else 'packed safetensors'}"
        ],
        modified=bool(r.tensors),
    )
    files = [Path(f) for f in r.files]
    return OptimizeResult(
        output=str(output),
        files=r.files,
        weight_bytes_before=r.bytes_in,
        weight_bytes_after=r.bytes_out,
        file_bytes_after=sum(p.stat().st_size for p in files),
        predicted_bundle_weight_bytes=None,
        reports=[report],
    )


@_guards("model", "data", "val_data", "recipe", output="output")
def optimize(
    model: ModelLike,
    *,
    passes: str | None = None,
    recipe: str | None = None,
    data=None,
    seed: int = 0,
    output: PathLike | None = None,
    format: str | None = None,
    max_drop: float | None = None,
    target_size: int | str | None = None,
    save_recipe: PathLike | None = None,
    progress=None,
    target_of: str = "weights",
    engine: str | None = None,
    device: str | None = None,
    workers: int = 0,
    ray_address: str | None = None,
    val_data=None,
    epochs: int | None = None,
    force: bool = False,
) -> OptimizeResult:
    """``mconv optimize``: run a pass spec (``passes``) or a recipe (name or TOML path) over the
    model (an ``ir.Model``, mutated, or a path); with ``output``, write it and check that ONNX's
    checker and ONNX Runtime accept it. ``data``: calibration / fine-tuning feeds (.npz or dict).

    ``max_drop`` (a fraction: 0.005 is half a point), ``target_size`` (``44KB``, ``6.9MB``, bytes)
    and ``save_recipe`` (a TOML path) go with ``recipe="deep-compression"``; ``target_of``
    (``weights``, the default, or ``bundle``) says what ``target_size`` is the size of: the cpu
    bundle's ``weights.mcw``, or its whole directory (graph and manifest too): the budget search of
    :func:`mconv.passes.budget.compress_to_budget` picks each layer's sparsity and bits on a
    held-out split (its report is ``budget`` in the result); an unmet budget raises
    ``GateFailed`` (exit 1) after the best result was written. ``val_data`` (.npz or dict) is a
    validation set of its own for that gate: then fine-tuning uses all of ``data``. ``epochs``:
    the budget search's epochs per fine-tuning stage (default: from the model's multiply-adds
    and the samples, :func:`mconv.passes.budget.default_epochs`).

    ``engine`` (``reference`` or ``xla``) and ``device`` (``cpu`` or ``cuda``, xla only) say where
    fine-tuning runs: every ``finetune`` pass of the spec or recipe that does not name its own,
    and every fine-tuning stage of the budget search (whose gate stays on the reference).

    ``workers`` (a local Ray of N processes) or ``ray_address`` (a cluster) run the budget
    search's independent trials on Ray (each layer's candidate settings); the result is the
    in-process run's. They need the budget search (``max_drop`` / ``target_size``).

    A recipe run without ``data`` (and no budget option) backs every ``prune`` and ``cluster``
    off per layer until the data-free check holds (:func:`mconv.passes.budget.limit_datafree`;
    ``datafree`` and ``accuracy_measured: false`` in the result, and a warning). Data too few to
    measure (a held-out split under :data:`mconv.passes.budget.MIN_HELD_OUT`, or one whose one
    sample is more than ``max_drop``) is refused before any work. ``force`` runs the recipe as
    written without data, and goes on with too few samples."""
    from mconv import passes as P
    from mconv.passes.parallel import check_workers, uses_ray

    check_workers(workers, ray_address)
    from mconv.targets.xla.engine import check_engine

    if engine is not None or device is not None:
        check_engine(engine or "reference", device or "cpu")
    from mconv.account import predicted_account
    from mconv.irio import model_stats, spilling

    if bool(passes) == bool(recipe):
        raise InputError(
            "give exactly one of --passes or --recipe", hint=f"recipes: {', '.join(P.recipe_names())}"
        )
    budgeted = max_drop is not None or target_size is not None or save_recipe is not None
    if val_data is not None and not budgeted:
        raise InputError(
            "--val-data is the budget search's gate data",
            where="--val-data",
            hint="add --max-drop F or --target-size SIZE with --recipe deep-compression",
        )
    if epochs is not None and not budgeted:
        raise InputError(
            "--epochs is the budget search's, per fine-tuning stage",
            where="--epochs",
            hint="add --max-drop F or --target-size SIZE with --recipe deep-compression, or give "
            "finetune(epochs=N) in --passes",
        )
    if budgeted:
        return _optimize_budget(
            model,
            recipe,
            data,
            seed,
            output,
            format,
            max_drop,
            target_size,
            save_recipe,
            progress,
            engine or "reference",
            device or "cpu",
            workers,
            ray_address,
            val_data,
            target_of,
            epochs=epochs,
            force=force,
        )
    if uses_ray(workers, ray_address):
        raise InputError(
            "--workers/--ray run the budget search's trials; this optimize has no budget",
            where="--workers" if workers else "--ray",
            hint="add --max-drop F or --target-size SIZE with --recipe deep-compression, or drop --workers/--ray",
        )
    if passes and data is None and output is not None and not isinstance(model, ir.Model):
        from mconv.formats.weights_stream import stream_scheme

        scheme = stream_scheme(Path(model), passes, Path(output), format)
        if scheme is not None:  # a safetensors checkpoint streamed tensor by tensor (README)
            return _optimize_streamed(Path(model), passes, scheme, Path(output), progress)
    specs = P.parse_spec(passes) if passes else P.load_recipe(str(recipe))
    if engine is not None or device is not None:
        for spec in specs:  # the finetune passes that do not name their own engine
            if spec.name == "finetune":
                spec.config.setdefault("engine", engine or "reference")
                spec.config.setdefault("device", device or "cpu")
    out_path = Path(output) if output is not None else None
    # Large rewritten weights wait in a scratch folder beside the output (deleted at the end),
    # so the pipeline holds about one weight at a time in memory (mconv.irio.spilling).
    parent = out_path.resolve().parent if out_path is not None else None
    scratch = parent if parent is not None and parent.is_dir() else Path(tempfile.gettempdir())
    written: list[Path] = []
    source = None if isinstance(model, ir.Model) else Path(model)
    with spilling(scratch), naming_the_file(source) if source else contextlib.nullcontext():
        m, _ = _as_model(model)
        before = model_stats(m)
        ctx = P.PassContext(data=load_data(data, m), seed=seed)
        lossy = recipe is not None and any(s.name in ("prune", "cluster") for s in specs)
        if lossy and ctx.data is not None and not force:
            _refuse_too_few(m, ctx.data, specs, data)
        plans: list = []

        def limit(model_now: ir.Model, rest: list) -> list:
            from mconv.passes.budget import limit_datafree

            update("data-free check (weight SNR per layer)", 0, None)
            rest, plan = limit_datafree(model_now, rest)
            plans.append(plan)
            return rest

        # measured: a finetune pass holds samples out and reports the compressed model on them
        measured = ctx.data is not None and any(s.name == "finetune" for s in specs)
        datafree = lossy and not measured and not force
        with _progress(progress)(f"optimize {recipe or passes}", len(specs)) as update:
            ctx.progress = update
            m, reports = P.run_pipeline(m, specs, ctx, limit=limit if datafree else None)
        if out_path is not None:
            written = save(m, out_path, format, source=source)
        after = model_stats(m)
        account = predicted_account(m)
    file_bytes = None
    if out_path is not None:
        from mconv.formats.weights import is_weight_only
        from mconv.targets.validity import check_written

        check_written(out_path, source, what="optimize", graph=not is_weight_only(m))
        file_bytes = sum(p.stat().st_size for p in written if p.is_file())
    return OptimizeResult(
        output=str(out_path) if out_path is not None else None,
        files=[str(p) for p in written],
        weight_bytes_before=before.bytes,
        weight_bytes_after=after.bytes,
        file_bytes_after=file_bytes,
        predicted_bundle_weight_bytes=account["total"]["bytes"] if account else None,
        reports=list(reports),
        account=account or None,
        model=m,
        **_unmeasured(lossy and not measured, plans[0] if plans else None, ctx.data is None),
    )


def _unmeasured(unmeasured: bool, plan, no_data: bool) -> dict[str, Any]:
    """The result's ``accuracy_measured``, ``datafree`` and warning for a lossy recipe that
    nothing measured: no data, or no finetune pass to use it (``plan``: the data-free check's,
    None under ``force``)."""
    if not unmeasured:
        return {}
    why = "no --data" if no_data else "no finetune pass measured it"
    if plan is not None:
        note = plan.note(why)
    else:
        note = (
            f"ACCURACY WAS NOT MEASURED: {why}, and --force ran the recipe as written, unchecked; "
            "give --data D.npz (and a finetune pass) to measure it"
        )
    return {"accuracy_measured": False, "datafree": plan, "warnings": [note]}


def _refuse_too_few(m: ir.Model, feeds: Mapping[str, np.ndarray], specs: list, data) -> None:
    """A recipe's fine-tuning holds out too few samples to tell anything: exit 2 before work."""
    from mconv.passes.budget import _check_data, too_few_samples

    tunes = [s for s in specs if s.name == "finetune"]
    holdout = float(tunes[0].resolve().holdout) if tunes else 0.0
    if holdout <= 0:
        return
    n = _check_data(m, feeds)[2]
    held = min(max(int(round(holdout * n)), 1), n - 1) if n >= 2 else 0
    why = too_few_samples(held, None)
    if why is not None:
        raise InputError(
            f"{n} samples: {why}",
            path=str(data) if not isinstance(data, Mapping) else None,
            hint="give more samples, or --force to go on without a measure that means anything",
        )


def _optimize_budget(
    model,
    recipe,
    data,
    seed,
    output,
    format,
    max_drop,
    target_size,
    save_recipe,
    progress,
    engine: str = "reference",
    device: str = "cpu",
    workers: int = 0,
    ray_address: str | None = None,
    val_data=None,
    target_of: str = "weights",
    *,
    epochs: int | None = None,
    force: bool = False,
):
    """``--max-drop`` / ``--target-size`` / ``--save-recipe``: the budgeted Deep Compression."""
    from mconv.account import predicted_account
    from mconv.irio import model_stats
    from mconv.passes.budget import BudgetNotMet, compress_to_budget

    if recipe != "deep-compression":
        raise InputError(
            "--max-drop, --target-size and --save-recipe go with --recipe deep-compression",
            hint="mconv optimize MODEL --recipe deep-compression --data D.npz --max-drop 0.005",
        )
    source = None if isinstance(model, ir.Model) else Path(model)
    m, _ = _as_model(model)
    before = model_stats(m)
    feeds = load_data(data, m)
    val_feeds = load_data(val_data, m)

    def check_gate(held: int, gate: float | None) -> None:  # before the work: a gate too coarse
        from mconv.passes.budget import too_few_samples

        why = too_few_samples(held, gate)
        if why is not None and not force:
            where = val_data if val_feeds is not None else data
            raise InputError(
                why,
                path=str(where) if not isinstance(where, Mapping) else None,
                hint=f"give more samples ({'--val-data' if val_feeds is not None else '--data'}), "
                "a larger --max-drop, or --force to go on with a gate that cannot tell",
            )

    failed: GateFailed | None = None
    with naming_the_file(source) if source else contextlib.nullcontext():
        with _progress(progress)("optimize deep-compression (budget)", None) as update:
            try:
                budget = compress_to_budget(
                    m,
                    feeds,
                    max_drop=max_drop,
                    target_size=target_size,
                    target_of=target_of,
                    seed=seed,
                    progress=update,
                    engine=engine,
                    device=device,
                    workers=workers,
                    ray_address=ray_address,
                    val_data=val_feeds,
                    epochs=epochs,
                    check_gate=check_gate,
                )
            except BudgetNotMet as exc:  # the best result found is still written and reported
                budget, failed = exc.result, exc
    m = budget.model
    written: list[Path] = []
    file_bytes = None
    out_path = Path(output) if output is not None else None
    if out_path is not None:
        from mconv.formats.weights import is_weight_only
        from mconv.targets.validity import check_written

        written = save(m, out_path, format, source=source)
        check_written(out_path, source, what="optimize", graph=not is_weight_only(m))
        file_bytes = sum(p.stat().st_size for p in written if p.is_file())
    if save_recipe is not None:
        budget.write_recipe(save_recipe)
    account = predicted_account(m)
    result = OptimizeResult(
        output=str(out_path) if out_path is not None else None,
        files=[str(p) for p in written],
        weight_bytes_before=before.bytes,
        weight_bytes_after=model_stats(m).bytes,
        file_bytes_after=file_bytes,
        predicted_bundle_weight_bytes=account["total"]["bytes"] if account else None,
        reports=[],
        account=account or None,
        model=m,
        budget=budget,
    )
    if failed is not None:
        failed.result = result  # type: ignore[attr-defined]
        raise failed
    return result


# --- export ------------------------------------------------------------------------------------


def input_file_bytes(path: PathLike | None, model: ir.Model | None = None) -> int:
    """Bytes on disk of a model as given: the file (every file of a directory), plus the
    external-data files its tensors point at outside it."""
    seen: set[Path] = set()
    total = 0

    def add(f: Path) -> None:
        nonlocal total
        try:
            r = f.resolve()
            if r not in seen and r.is_file():
                seen.add(r)
                total += r.stat().st_size
        except OSError:
            pass

    if path is not None:
        p = Path(path)
        if p.is_dir():
            for f in sorted(p.rglob("*")):
                add(f)
        else:
            add(p)
    if model is not None:
        for value in model.graph.initializers.values():
            t = value.const_value
            if isinstance(t, ir.ExternalTensor):
                add(Path(t.path))
    return total


def bundle_file_bytes(output: PathLike, files: dict) -> int:
    """Bytes of a bundle on disk: its files (the manifest lists them) and the manifest itself."""
    total = sum(int(f.get("bytes", 0)) for f in files.values())
    manifest = Path(output) / "manifest.json"
    return total + (manifest.stat().st_size if manifest.is_file() else 0)


@dataclass
class ExportResult:
    """``mconv export``: the bundle (or model file) written, with like-for-like byte counts."""

    output: str
    target: str | None
    weight_bytes_before: int
    weight_bytes_after: int
    file_bytes_before: int
    file_bytes_after: int
    files: Any
    seconds: float | None = None
    account: dict | None = None
    notes: list[str] = field(default_factory=list)
    manifest: dict | None = field(default=None, repr=False)
    format: str | None = None

    def as_dict(self) -> dict[str, Any]:
        if self.format is not None:  # a model file
            return {
                "output": self.output,
                "bytes_before": self.weight_bytes_before,  # weight bytes of the input model
                "bytes_after": self.file_bytes_after,  # a model file holds its weights: its bytes
                "weight_bytes_before": self.weight_bytes_before,
                "file_bytes_before": self.file_bytes_before,
                "file_bytes_after": self.file_bytes_after,
                "passes": [],
                "files": self.files,
            }
        return {
            "output": self.output,
            "target": self.target,
            # like for like (README, "JSON keys"): weights before and after (the stored
            # blobs), and the input's file bytes before, the bundle's (manifest included) after
            "bytes_before": self.weight_bytes_before,
            "bytes_after": self.weight_bytes_after,
            "weight_bytes_before": self.weight_bytes_before,
            "weight_bytes_after": self.weight_bytes_after,
            "weights_bytes": self.weight_bytes_after,
            "file_bytes_before": self.file_bytes_before,
            "file_bytes_after": self.file_bytes_after,
            "files": self.files,
            "passes": [],
            "seconds": self.seconds,
            "account": self.account,
            "notes": self.notes,
        }


@_guards("model", output="out_dir", kind=lambda a: "file" if a.get("format") else "dir")
def export(
    model: ModelLike,
    target: str = "cpu",
    out_dir: PathLike = "bundle",
    *,
    format: str | None = None,
    input_shapes=None,
    input_values: Mapping[str, Any] | Sequence[str] | None = None,
    progress=None,
    **options: Any,
) -> ExportResult:
    """``mconv export``: a deployable bundle for ``target`` (cpu, xla, metal, weights) in
    ``out_dir``, or with ``format`` a model file. ``options``: the target's ``Options`` fields
    (:mod:`mconv.targets.base`: ``dense``, ``batch``, ``precision``, ``bake_weights``,
    ``mlir_text``, ``codec``, ...; one it does not declare is an InputError naming it);
    ``input_shapes`` fixes symbolic dims first; ``input_values`` (``{"sr": 16000}`` or the CLI's
    ``["sr=16000"]``) then bakes graph inputs as constants, folds and inlines the Ifs they decide
    (:func:`mconv.passes.inline_if.bake_input_values`)."""
    from mconv.irio import model_stats
    from mconv.targets import check_export_options, get_target

    t0 = time.perf_counter()
    output = Path(out_dir)
    shapes = _shapes(input_shapes)
    m, source = _as_model(model)
    before = model_stats(m).bytes
    notes: list[str] = []
    if shapes:
        from mconv.passes.input_shapes import fix_input_shapes

        notes = fix_input_shapes(m, shapes, path=str(source) if source else None)
    if input_values:
        from mconv.passes.inline_if import bake_input_values

        if isinstance(input_values, Mapping):
            values = {str(k): str(v) for k, v in input_values.items()}
        else:
            from mconv.formats.torch_format import parse_input_values

            values = parse_input_values(list(input_values))
        m, baked = bake_input_values(m, values, path=str(source) if source else None)
        notes += baked
    if not format and target != "weights":
        from mconv.formats.weights import is_weight_only

        if is_weight_only(m):
            raise InputError(
                f"holds tensors only; the {target} target needs a graph",
                path=str(source) if source else None,
                hint="use --target weights (a weights bundle) or --format safetensors",
            )
    file_before = input_file_bytes(source, m)
    if format:
        written = save(m, output, format, source=source)
        size = sum(p.stat().st_size for p in written)
        return ExportResult(
            output=str(output),
            target=None,
            weight_bytes_before=before,
            weight_bytes_after=size,
            file_bytes_before=file_before,
            file_bytes_after=size,
            files=[str(p) for p in written],
            notes=notes,
            format=format,
        )
    # each option one the target declares (mconv.targets.base); None/False: not given
    opts = check_export_options(target, options, path=str(source) if source else None)
    with _progress(progress)(f"export {target}", None), naming_the_file(source or output):
        bundle = get_target(target).export(m, output, opts)
    if target == "cpu":
        from mconv.targets.validity import check_written

        check_written(output, source, what="export")
    notes += [str(n) for n in bundle.manifest.get("notes") or []]  # the target's decisions
    files = bundle.manifest.get("files", {})
    weights_bytes = sum(w.get("bytes", 0) for w in bundle.weights)
    return ExportResult(
        output=str(output),
        target=target,
        weight_bytes_before=before,
        weight_bytes_after=weights_bytes,
        file_bytes_before=file_before,
        file_bytes_after=bundle_file_bytes(output, files),
        files=files,
        seconds=round(time.perf_counter() - t0, 3),
        account=bundle.account,  # per tensor (the manifest keeps its summary)
        notes=notes,
        manifest=bundle.manifest,
    )


# --- open / run --------------------------------------------------------------------------------


@_guards("path")
def open(path: PathLike, target: str | None = None, input_shapes=None):  # noqa: A001 - the API's name
    """A runner (``inputs``, ``outputs``, ``run(feeds) -> dict``) for a bundle (on its own
    target) or a model file (the reference executor, or ``target``). ``input_shapes`` fixes a
    model's symbolic dims, and is checked against a bundle's inputs."""
    from mconv.api.runtime import open_runner
    from mconv.bundle import is_bundle

    p = Path(path)
    shapes = _shapes(input_shapes)
    with naming_the_file(p):
        if not shapes or is_bundle(p) or p.is_dir():
            runner = open_runner(p, target)
            if shapes:
                from mconv.passes.input_shapes import check_input_shapes

                check_input_shapes(runner.inputs, shapes, path=str(p))
            return runner
        from mconv.passes.input_shapes import open_model_with_shapes
        from mconv.targets import get_target

        return get_target(target or "reference").load_model(open_model_with_shapes(p, shapes))


def output_summary(results: Mapping[str, np.ndarray]) -> dict[str, dict]:
    summary = {}
    for name, arr in results.items():
        a = np.asarray(arr)
        num = bool(a.size) and np.issubdtype(a.dtype, np.number)
        summary[name] = {
            "dtype": a.dtype.name,
            "shape": list(a.shape),
            "min": float(a.min()) if num else None,
            "max": float(a.max()) if num else None,
            "mean": float(a.mean()) if num else None,
        }
    return summary


@dataclass
class RunResult:
    """``mconv run``: the outputs (arrays), their summary, and how random inputs were drawn."""

    outputs: dict[str, np.ndarray] = field(repr=False)
    output: str | None
    seconds: float
    plan: Any = None

    def as_dict(self) -> dict[str, Any]:
        doc = {"output": self.output, "outputs": output_summary(self.outputs), "seconds": self.seconds}
        if self.plan is not None:  # random inputs: how many samples, and how they were batched
            doc.update({"samples": self.plan.samples, "batching": self.plan.as_dict()})
        return doc


@_guards("path", "feeds", "data", output="output", kind="file")
def run(
    path: PathLike,
    feeds: Mapping[str, np.ndarray | PathLike] | None = None,
    *,
    data: PathLike | None = None,
    samples: int | None = None,
    seed: int = 0,
    input_shapes=None,
    target: str | None = None,
    output: PathLike | None = None,
) -> RunResult:
    """``mconv run``: run a bundle or model on ``feeds`` (arrays, or .npy paths by input name),
    on ``data`` (.npz), or on random inputs drawn as verify draws them (``samples``, ``seed``);
    with ``output`` the outputs go to an .npz (atomically)."""
    from mconv.fileio import atomic_path, require_file
    from mconv.metrics import check_samples, load_npz_feeds, plan_random_feeds, run_feeds
    from mconv.npzio import read_npy, write_npz

    check_samples(samples)
    if samples is not None and (feeds or data is not None):
        raise InputError(
            "--samples draws random inputs; it does not go with --input or --data",
            hint="drop --samples, or drop --input/--data",
        )
    shapes = _shapes(input_shapes)
    runner = open(path, target, shapes)
    plan = None
    if not feeds and data is None:  # random inputs, drawn as verify draws them
        plan = plan_random_feeds(runner.inputs, samples=samples, seed=seed, input_shapes=shapes)
        t0 = time.perf_counter()
        results = run_feeds(runner, plan.feeds)
    else:
        given: dict[str, np.ndarray] = {}
        if data is not None:
            given, _ = load_npz_feeds(data, runner.inputs)
        names = {s.name for s in runner.inputs}
        for name, value in (feeds or {}).items():
            if name not in names:
                raise InputError(f"model has no input '{name}'", hint=f"inputs: {', '.join(sorted(names))}")
            if isinstance(value, str | Path):
                value = read_npy(require_file(value, "input array (.npy)"))  # header checked first
            given[name] = np.asarray(value)
        missing = sorted(names - set(given))
        if missing:
            raise InputError(f"no value for input(s) {', '.join(missing)}", hint="pass --input NAME=file.npy")
        t0 = time.perf_counter()
        results = runner.run(given)
    seconds = time.perf_counter() - t0
    if output is not None:
        with atomic_path(Path(output)) as tmp, builtins.open(tmp, "wb") as fh:
            write_npz(fh, results.items())  # any output name (savez takes them as keywords)
    return RunResult(
        outputs=dict(results), output=str(output) if output else None, seconds=seconds, plan=plan
    )


# --- verify ------------------------------------------------------------------------------------


class _Ticking:
    """A runner that reports each run to a progress display (verify over many batches)."""

    def __init__(self, runner, advance) -> None:
        self._runner, self._advance = runner, advance
        self.inputs = runner.inputs

    def run(self, feeds):
        result = self._runner.run(feeds)
        self._advance(1)
        return result


def _gate_failed(report) -> GateFailed:
    return GateFailed(
        "verification failed: " + "; ".join(f"{k}: {', '.join(v)}" for k, v in report.failures.items())
    )


@dataclass
class VerifyResult:
    """``mconv verify``: the report (metrics per output, gates, batching); ``as_dict()`` is the
    ``--json`` document, ``check()`` raises ``GateFailed`` (exit 1) when a gate failed."""

    report: Any

    @property
    def passed(self) -> bool:
        return bool(self.report.passed)

    @property
    def failures(self) -> dict:
        return self.report.failures

    def as_dict(self) -> dict[str, Any]:
        return self.report.as_dict()

    def check(self) -> VerifyResult:
        if not self.passed:
            raise _gate_failed(self.report)
        return self


@_guards("reference", "candidate", "data")
def verify(
    reference: PathLike,
    candidate: PathLike,
    *,
    data: PathLike | None = None,
    samples: int | None = None,
    seed: int = 0,
    input_shapes=None,
    atol: float | None = None,
    rtol: float | None = None,
    min_cosine: float | None = None,
    min_top1: float | None = None,
    min_snr_db: float | None = None,
    max_rel_l2: float | None = None,
    localize: bool = False,
    progress=None,
) -> VerifyResult:
    """``mconv verify REF CANDIDATE``: run both (models or bundles) on ``data`` or random inputs
    and gate the metrics; no gate given: the defaults (cosine >= 0.99, relative L2 error
    ``||cand - ref|| / ||ref||`` <= 0.03, top-1 agreement >= 0.99; weight files: SNR >= 10 dB per
    tensor). Returns the result; ``.check()`` raises on failure."""
    from mconv.metrics import (
        Gates,
        check_samples,
        load_npz_feeds,
        plan_random_feeds,
        run_feeds,
        verify_outputs,
    )
    from mconv.targets.weights import verify_weights, weight_pair

    check_samples(samples)
    user_gates = Gates(
        atol=atol,
        rtol=rtol,
        min_cosine=min_cosine,
        min_top1=min_top1,
        min_snr_db=min_snr_db,
        max_rel_l2=max_rel_l2,
    ).check()
    shapes = _shapes(input_shapes)
    reference, candidate = Path(reference), Path(candidate)
    pair = weight_pair(reference, candidate)
    if pair is not None:  # both sides are tensors only: compare them by name
        gates = user_gates if user_gates.any() else Gates.weight_defaults()
        report = verify_weights(*pair, gates)
        report.gates = gates.as_dict()
        report.gates_source = "user" if user_gates.any() else "default"
        return VerifyResult(report)
    ref = open(reference, None, shapes)
    cand = open(candidate, None, shapes)
    labels = None
    if data is not None:
        if samples is not None:
            raise InputError(
                "--samples draws random inputs; with --data every sample of the file is used",
                hint="drop --samples or --data",
            )
        feeds, labels = load_npz_feeds(data, ref.inputs)
        feed_list = [feeds]
        first = next((a for a in feeds.values() if np.ndim(a) > 0), None)
        n_samples = int(first.shape[0]) if first is not None else 1
        batching = {"mode": "data", "batch": n_samples, "runs": 1, "how": f"one run of {data}"}
    else:
        plan = plan_random_feeds(ref.inputs, samples=samples, seed=seed, input_shapes=shapes)
        feed_list, n_samples, batching = plan.feeds, plan.samples, plan.as_dict()
    gates = user_gates if user_gates.any() else Gates.defaults()
    runs = len(feed_list)
    with _progress(progress)("verify", 2 * runs) as bar:
        bar(description=f"reference, {runs} run(s)")
        ref_out = run_feeds(_Ticking(ref, bar.advance), feed_list)
        bar(description=f"candidate, {runs} run(s)")
        cand_out = run_feeds(_Ticking(cand, bar.advance), feed_list)
    report = verify_outputs(ref_out, cand_out, gates, labels, samples=n_samples)
    report.batching = batching
    report.gates_source = "user" if user_gates.any() else "default"
    if localize:
        from mconv.api.localize import localize as do_localize

        # The first run's feeds: a drift shows in one batch as well as in all.
        report.localized = do_localize(reference, candidate, feed_list[0], user_gates, shapes)
    return VerifyResult(report)


# --- inspect -----------------------------------------------------------------------------------


@dataclass
class InspectResult:
    """``mconv inspect``: ops, parameters, bytes by dtype, inputs/outputs, largest tensors, and a
    bundle's manifest."""

    doc: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return self.doc


@_guards("path")
def inspect(path: PathLike, *, top: int = 10, input_shapes=None) -> InspectResult:
    """``mconv inspect PATH``: a model file or a bundle (``input_shapes`` fixes a model's
    symbolic dims and is checked against a bundle's inputs)."""
    from mconv.api.inspection import inspect_model, inspect_path
    from mconv.bundle import is_bundle

    p = Path(path)
    shapes = _shapes(input_shapes)
    if shapes and not is_bundle(p) and not p.is_dir():
        from mconv.passes.input_shapes import open_model_with_shapes

        model = open_model_with_shapes(p, shapes)  # shapes fixed, downstream dims inferred
        kind = model.metadata_props.get("mconv.source_format", "onnx")
        return InspectResult({"path": str(p), "kind": kind, **inspect_model(model, top=top)})
    doc = inspect_path(p, top=top)
    if shapes:  # a bundle's inputs are what they are: the shapes are checked only
        from mconv.bundle import TensorSpec
        from mconv.passes.input_shapes import check_input_shapes

        specs = [TensorSpec.from_dict(d) for d in doc.get("inputs") or []]
        check_input_shapes(specs, shapes, path=str(p))
    return InspectResult(doc)


# --- analyze -----------------------------------------------------------------------------------


@dataclass
class AnalyzeResult:
    """``mconv analyze``: per-layer sensitivity (and the recipe written, if any)."""

    report: Any
    recipe: str | None = None

    def as_dict(self) -> dict[str, Any]:
        doc = self.report.as_dict()
        doc["recipe"] = self.recipe
        return doc


@_guards("model", "data", output="output", kind="file")
def analyze(
    model: ModelLike,
    data,
    *,
    sweep: Sequence[float] = (0.5, 0.7, 0.9),
    bits: Sequence[int] = (),
    max_drop: float | None = None,
    output: PathLike | None = None,
    progress=None,
    engine: str = "reference",
    device: str = "cpu",
    workers: int = 0,
    ray_address: str | None = None,
) -> AnalyzeResult:
    """``mconv analyze``: prune (and cluster at ``bits``) one layer at a time over ``sweep``,
    measure the metric drop on ``data``; with ``max_drop`` choose per layer, and with ``output``
    write that choice as a recipe (TOML). ``engine="xla"`` runs the sweep on the model lowered
    to jax (``device`` cpu or cuda). ``workers=N`` runs the layers' sweeps on a local Ray of N
    workers, ``ray_address`` on a Ray cluster; the report is the same."""
    from mconv.passes.analyze import analyze_sensitivity, write_recipe

    if output is not None and max_drop is None:
        raise InputError("-o needs --max-drop", hint="e.g. --max-drop 0.01 -o recipe.toml")
    m, _ = _as_model(model)
    feeds = load_data(data, m)
    if feeds is None:
        raise InputError("analyze needs data", hint="--data calib.npz (inputs by name, optional labels)")
    with _progress(progress)("analyze", None) as update:
        report = analyze_sensitivity(
            m,
            feeds,
            sweep=list(sweep),
            bits=[int(b) for b in bits],
            max_drop=max_drop,
            progress=update,
            engine=engine,
            device=device,
            workers=workers,
            ray_address=ray_address,
        )
    recipe = None
    if output is not None:
        write_recipe(report, output)
        recipe = str(output)
    return AnalyzeResult(report, recipe)
