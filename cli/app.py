"""The ``mconv`` command line: thin wrappers over the library (parse, call, render)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from mconv import __version__
from mconv.cli.output import Out, human_bytes, run_command
from mconv.errors import GateFailed, InputError, UnsupportedError
from rich.markup import escape
from rich.table import Table
from typer.core import TyperCommand


def _argument_label(param, usage: bool = False) -> str:
    """``MODEL``, ``FILE...``, ``[DIR]``: an argument as the help shows it (no braces, no types)."""
    label = param.metavar or param.name.upper()
    if param.nargs != 1:
        label += "..."
    return f"[{label}]" if usage and not param.required else label


class Command(TyperCommand):
    """Help text for people: arguments as ``MODEL`` / ``FILE...`` / ``[DIR]`` (typer would write
    ``{MODEL}`` and ``<list[Path]>``), every option with its metavar and help, and a listing
    from the registries after the options where a command has one (``EPILOGS``)."""

    def collect_usage_pieces(self, ctx) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                pieces.append(_argument_label(param, usage=True))
            else:
                pieces.extend(param.get_usage_pieces(ctx))
        return pieces

    def format_options(self, ctx, formatter) -> None:
        args, opts = [], []
        for param in self.get_params(ctx):
            if getattr(param, "hidden", False):
                continue
            if param.param_type_name == "argument":
                extra = "  [required]" if param.required else ""
                args.append((_argument_label(param), (param.help or "") + extra))
            else:
                record = param.get_help_record(ctx)
                if record is not None:
                    opts.append(record)
        if args:
            with formatter.section("Arguments"):
                formatter.write_dl(args)
        if opts:
            with formatter.section("Options"):
                formatter.write_dl(opts)

    def format_epilog(self, ctx, formatter) -> None:
        listing = EPILOGS.get(self.name)
        if listing is not None:
            for title, rows in listing():
                with formatter.section(title):
                    formatter.write_dl(rows)
        super().format_epilog(ctx, formatter)


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0].replace("``", "'") if (text or "").strip() else ""


def _optimize_listing() -> list[tuple[str, list[tuple[str, str]]]]:
    """optimize --help: the registered passes and the built-in recipes, read from the registries."""
    import tomllib

    from mconv.passes.base import PASSES
    from mconv.passes.pipeline import RECIPE_DIR, recipe_names

    passes = [(name, _first_line(cls.__doc__)) for name, cls in sorted(PASSES.items())]
    recipes = []
    for name in recipe_names():
        try:
            desc = tomllib.loads((RECIPE_DIR / f"{name}.toml").read_text()).get("description", "")
        except (OSError, ValueError):
            desc = ""
        recipes.append((name, str(desc)))
    return [("Passes (--passes)", passes), ("Recipes (--recipe)", recipes)]


EPILOGS = {"optimize": _optimize_listing}

app = typer.Typer(
    name="mconv",
    help="Import, optimize (Deep Compression), verify and export neural network models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout, nothing else.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No tables or progress on stderr.")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks of internal errors.")]
InputShapeOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--input-shape",
        metavar="NAME=DIMS",
        help="Fix a symbolic input shape: NAME=1,3,224,224 (repeatable). An unknown name or a dim "
        "that contradicts a fixed one is refused; downstream shapes are inferred.",
    ),
]
SamplesOpt = Annotated[
    int | None,
    typer.Option(
        "--samples",
        metavar="N",
        help="Random samples when no --data/--input (default 4): a symbolic batch dim is set to N "
        "(one run); a fixed batch B runs N/B times (N must be a multiple of B).",
    ),
]
SeedOpt = Annotated[
    int, typer.Option("--seed", metavar="INT", help="Seed of the random inputs (same seed, same inputs).")
]


def _out(json_: bool, quiet: bool, debug: bool) -> Out:
    return Out(json=json_, quiet=quiet, debug=debug)


def _version_cb(value: bool) -> None:
    if value:
        typer.echo(f"mconv {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version_cb, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """mconv: one IR (ONNX semantics), many formats, passes and targets."""


# --- import ------------------------------------------------------------------------------------


@app.command("import", cls=Command)
def import_cmd(
    src: Annotated[
        list[Path],
        typer.Argument(metavar="FILE", help="Model file(s): FILE, or FILE1 FILE2 for split formats."),
    ],
    output: Annotated[Path, typer.Option("-o", "--output", metavar="FILE", help="Output .onnx path.")],
    format: Annotated[
        str | None,
        typer.Option("--format", metavar="NAME", help="Force the source format (default: from the file)."),
    ] = None,
    input_shape: InputShapeOpt = None,
    input_value: Annotated[
        list[str] | None,
        typer.Option(
            "--input-value",
            metavar="NAME=VALUE",
            help="PyTorch: bake an int, float or bool argument of forward() into the model as a "
            "constant, e.g. sr=16000 (repeatable).",
        ),
    ] = None,
    example_inputs: Annotated[
        Path | None,
        typer.Option(
            "--example-inputs",
            metavar="FILE.npz",
            help="PyTorch: example inputs, arrays keyed by forward() argument name; a 0-d array gives "
            "an int, float or bool argument's value.",
        ),
    ] = None,
    json_: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Read a model from any supported framework into ONNX."""
    out = _out(json_, quiet, debug)

    def body() -> int:
        from mconv.formats import import_model
        from mconv.irio import model_stats, save_onnx
        from mconv.passes.input_shapes import fix_input_shapes
        from mconv.verify import parse_input_shapes

        t0 = time.perf_counter()
        shapes = parse_input_shapes(input_shape)
        options = {"input_shapes": shapes}
        if input_value or example_inputs:  # PyTorch only (formats/torch_format.py rule 3)
            from mconv.formats.torch_format import parse_input_values

            options.update(input_values=parse_input_values(input_value), example_inputs=example_inputs)
        model = import_model(src, format=format, options=options)
        if (input_value or example_inputs) and model.metadata_props.get("mconv.source_format") != "torch":
            raise InputError(
                "--input-value and --example-inputs apply to PyTorch models only",
                path=str(src[0]),
                hint="give ONNX and other formats' input shapes with --input-shape",
            )
        # Every format: the names are checked, symbolic dims fixed, shapes inferred downstream.
        shape_notes = fix_input_shapes(model, shapes, path=str(src[0]))
        written = save_onnx(model, output)
        from mconv.formats.weights import is_weight_only
        from mconv.targets.validity import check_written

        check_written(
            output, src[0] if len(src) == 1 else None, what="import", graph=not is_weight_only(model)
        )
        stats = model_stats(model)
        doc = {
            "output": str(output),
            "files": [str(p) for p in written],
            "source_format": model.metadata_props.get("mconv.source_format"),
            "seconds": round(time.perf_counter() - t0, 3),
            **stats.as_dict(),
        }
        notes = model.metadata_props.get("mconv.import_notes")
        if notes or shape_notes:
            doc["notes"] = (notes.split("\n") if notes else []) + shape_notes
        out.print(
            f"imported [bold]{', '.join(map(str, src))}[/] ({doc['source_format']}) -> {output}: "
            f"{stats.nodes} nodes, {stats.params:,} parameters, {human_bytes(stats.bytes)}"
        )
        for note in doc.get("notes", []):
            out.print(f"  note: {note}", markup=False)
        out.emit(doc)
        return 0

    run_command(out, body)


# --- optimize ----------------------------------------------------------------------------------


def _load_data(path: Path | None, model) -> dict | None:
    if path is None:
        return None
    from mconv.irio import real_inputs
    from mconv.runtime import value_spec
    from mconv.verify import load_npz_feeds

    feeds, labels = load_npz_feeds(path, [value_spec(v) for v in real_inputs(model.graph)])
    if labels is not None:
        feeds["labels"] = labels
    return feeds


def render_pass_reports(out: Out, reports) -> None:
    if not out.show or not reports:
        return
    table = Table(title="passes", title_justify="left")
    for col in ("pass", "nodes", "params", "bytes", "time"):
        table.add_column(col, justify="left" if col == "pass" else "right")
    for r in reports:
        d = r.as_dict() if hasattr(r, "as_dict") else r
        table.add_row(
            d["name"],
            f"{d['nodes_before']} -> {d['nodes_after']}",
            f"{d['params_before']:,} -> {d['params_after']:,}",
            f"{human_bytes(d['bytes_before'])} -> {human_bytes(d['bytes_after'])}",
            f"{d['seconds']:.2f}s",
        )
    out.print(table)
    for r in reports:
        d = r.as_dict() if hasattr(r, "as_dict") else r
        for note in d.get("notes", []):
            out.print(f"  {d['name']}: {note}", markup=False)


@app.command("optimize", cls=Command)
def optimize_cmd(
    model_path: Annotated[
        Path, typer.Argument(metavar="IN", help="Input model (.onnx or any importable file).")
    ],
    output: Annotated[Path, typer.Option("-o", "--output", metavar="FILE", help="Output path (.onnx).")],
    passes: Annotated[
        str | None,
        typer.Option(
            "--passes", metavar="SPEC", help="Pass spec, e.g. 'fold,dce,prune(sparsity=0.9)' (passes below)."
        ),
    ] = None,
    recipe: Annotated[
        str | None,
        typer.Option("--recipe", metavar="NAME|FILE", help="Built-in recipe (below) or a TOML file."),
    ] = None,
    data: Annotated[
        Path | None,
        typer.Option("--data", metavar="FILE", help="Calibration / fine-tuning data (.npz)."),
    ] = None,
    seed: Annotated[
        int, typer.Option("--seed", metavar="INT", help="Seed of every random choice the passes make.")
    ] = 0,
    format: Annotated[
        str | None,
        typer.Option("--format", metavar="NAME", help="Output format (default: from the extension)."),
    ] = None,
    json_: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Run a pass pipeline (spec or recipe) over a model."""
    out = _out(json_, quiet, debug)

    def body() -> int:
        import tempfile

        from mconv import passes as P
        from mconv.irio import model_stats, spilling
        from mconv.runtime import open_model

        if bool(passes) == bool(recipe):
            raise InputError(
                "give exactly one of --passes or --recipe", hint=f"recipes: {', '.join(P.recipe_names())}"
            )
        specs = P.parse_spec(passes) if passes else P.load_recipe(recipe)
        # Large rewritten weights wait in a scratch folder beside the output (deleted at the end),
        # so the pipeline holds about one weight at a time in memory (mconv.irio.spilling).
        scratch_parent = output.resolve().parent if output.resolve().parent.is_dir() else None
        with spilling(scratch_parent or tempfile.gettempdir()):
            model = open_model(model_path)
            before = model_stats(model)
            ctx = P.PassContext(data=_load_data(data, model), seed=seed)
            with out.progress(f"optimize {recipe or passes}", total=len(specs)) as update:
                ctx.progress = update
                model, reports = P.run_pipeline(model, specs, ctx)
            written = _save_model(model, output, format, model_path)
            after = model_stats(model)
            render_pass_reports(out, reports)
            from mconv.account import predicted_account

            account = predicted_account(model)
            if account:  # what export will store, predicted before encoding (the paper's Table 4)
                render_byte_account(out, {"account": account}, title="weight storage at export (predicted)")
        from mconv.formats.weights import is_weight_only
        from mconv.targets.validity import check_written

        has_graph = not is_weight_only(model)
        del model
        check_written(output, model_path, what="optimize", graph=has_graph)
        file_bytes = sum(p.stat().st_size for p in written if p.is_file())
        predicted = account["total"]["bytes"] if account else None
        out.print(
            optimize_summary(output, before.bytes, after.bytes, file_bytes, predicted),
            markup=False,
            soft_wrap=True,
        )
        out.emit(
            {
                "output": str(output),
                "files": [str(p) for p in written],
                # like for like: weight bytes in the input and in the written model (dense)
                "bytes_before": before.bytes,
                "bytes_after": after.bytes,
                "weight_bytes_before": before.bytes,
                "weight_bytes_after": after.bytes,
                "file_bytes_after": file_bytes,
                # what an export stores for these weights, from the byte account (None: not
                # predicted, the model carries no pruning or clustering facts)
                "predicted_bundle_weight_bytes": predicted,
                "passes": [r.as_dict() for r in reports],
                "account": account,
            }
        )
        return 0

    run_command(out, body)


def optimize_summary(
    output: Path, weights_before: int, weights_after: int, file_bytes: int, predicted: int | None
) -> str:
    """optimize's last line: weights before -> after in the .onnx, and (when the byte account
    predicts one) what a bundle will store; pruned and clustered weights stay dense in the
    .onnx (exact zeros, repeated values) until export encodes them."""
    line = (
        f"wrote {output} ({human_bytes(file_bytes)}): weights {human_bytes(weights_before)} -> "
        f"{human_bytes(weights_after)} in the .onnx ({weights_before / max(weights_after, 1):.1f}x)"
    )
    if predicted is not None:
        line += (
            f"; predicted bundle weights {human_bytes(predicted)} "
            f"({weights_before / max(predicted, 1):.1f}x; stored dense in the .onnx until export)"
        )
    return line


def _save_model(model, output: Path, format: str | None, source: Path | None = None) -> list[Path]:
    from mconv.formats import get_format, registry

    name = format
    if name is None:
        suffix = output.name.lower()
        matches = [f for f in registry().values() if f.save and any(suffix.endswith(e) for e in f.extensions)]
        if not matches and not suffix.endswith(".onnx"):
            from mconv.formats.weights import is_weight_only

            if is_weight_only(model):  # tensors only: a weights bundle directory
                from mconv.weightbundle import export_weights

                bundle = export_weights(model, output, {})
                return [output / rel for rel in ("manifest.json", *bundle.files)]
        name = matches[0].name if len(matches) == 1 else "onnx"
    fmt = get_format(name)
    if fmt.save is None:
        raise InputError(f"format '{name}' has no writer", hint="write .onnx")
    # ``source``: the model file given, which a writer's refusal names (dlk-json).
    return fmt.save(model, output, {"source": str(source)} if source else {})


# --- export ------------------------------------------------------------------------------------


@app.command("export", cls=Command)
def export_cmd(
    model_path: Annotated[
        Path, typer.Argument(metavar="MODEL", help="Model (.onnx or any importable file).")
    ],
    output: Annotated[
        Path,
        typer.Option("-o", "--output", metavar="PATH", help="Bundle directory (or file for --format)."),
    ],
    target: Annotated[
        str, typer.Option("--target", metavar="NAME", help="cpu, xla, metal or weights.")
    ] = "cpu",
    format: Annotated[
        str | None,
        typer.Option(
            "--format",
            metavar="NAME",
            help="Write a model file instead of a bundle (dlk-json, safetensors, onnx).",
        ),
    ] = None,
    dense: Annotated[
        bool, typer.Option("--dense", help="Plain ONNX with dense weights, no container.")
    ] = False,
    batch: Annotated[
        int | None, typer.Option("--batch", metavar="N", help="Static batch size (xla).")
    ] = None,
    precision: Annotated[
        str | None, typer.Option("--precision", metavar="fp16|fp32", help="Compute precision (metal).")
    ] = None,
    bake_weights: Annotated[bool, typer.Option("--bake-weights", help="Embed weights (xla).")] = False,
    mlir_text: Annotated[bool, typer.Option("--mlir-text", help="Also write StableHLO text (xla).")] = False,
    input_shape: InputShapeOpt = None,
    json_: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Write a deployable bundle for a target."""
    out = _out(json_, quiet, debug)

    def body() -> int:
        from mconv.irio import model_stats
        from mconv.runtime import open_model
        from mconv.targets import get_target
        from mconv.verify import parse_input_shapes

        t0 = time.perf_counter()
        shapes = parse_input_shapes(input_shape)
        model = open_model(model_path)
        before = model_stats(model).bytes
        shape_notes: list[str] = []
        if shapes:
            from mconv.passes.input_shapes import fix_input_shapes

            shape_notes = fix_input_shapes(model, shapes, path=str(model_path))
            for note in shape_notes:
                out.print(note)
        if not format and target != "weights":
            from mconv.formats.weights import is_weight_only

            if is_weight_only(model):
                raise InputError(
                    f"holds tensors only; the {target} target needs a graph",
                    path=str(model_path),
                    hint="use --target weights (a weights bundle) or --format safetensors",
                )
        file_before = input_file_bytes(model_path, model)
        if format:
            written = _save_model(model, output, format, model_path)
            size = sum(p.stat().st_size for p in written)
            out.print(f"wrote {', '.join(map(str, written))} ({human_bytes(size)})")
            out.emit(
                {
                    "output": str(output),
                    "bytes_before": before,  # weight bytes of the input model
                    "bytes_after": size,  # a model file holds its weights: the file's bytes
                    "weight_bytes_before": before,
                    "file_bytes_before": file_before,
                    "file_bytes_after": size,
                    "passes": [],
                    "files": [str(p) for p in written],
                }
            )
            return 0
        options = {
            "dense": dense,
            "batch": batch,
            "precision": precision,
            "bake_weights": bake_weights,
            "mlir_text": mlir_text,
        }
        options = {k: v for k, v in options.items() if v not in (None, False)}
        with out.progress(f"export {target}"), naming_the_file(model_path):
            bundle = get_target(target).export(model, output, options)
        if target == "cpu":
            from mconv.targets.validity import check_written

            check_written(output, model_path, what="export")
        files = bundle.manifest.get("files", {})
        weights_bytes = sum(w.get("bytes", 0) for w in bundle.manifest.get("weights", []))
        file_after = bundle_file_bytes(output, files)
        render_byte_account(out, bundle.manifest)
        out.print(
            export_summary(output, target, len(files), before, weights_bytes, file_before, file_after),
            markup=False,
            soft_wrap=True,
        )
        out.emit(
            {
                "output": str(output),
                "target": target,
                # like for like (README, "JSON keys"): weights before and after (the stored
                # blobs), and the input's file bytes before, the bundle's (manifest included) after
                "bytes_before": before,
                "bytes_after": weights_bytes,
                "weight_bytes_before": before,
                "weight_bytes_after": weights_bytes,
                "weights_bytes": weights_bytes,
                "file_bytes_before": file_before,
                "file_bytes_after": file_after,
                "files": files,
                "passes": [],
                "seconds": round(time.perf_counter() - t0, 3),
                "account": bundle.manifest.get("account"),
                "notes": shape_notes,
            }
        )
        return 0

    run_command(out, body)


def input_file_bytes(path: Path, model=None) -> int:
    """Bytes on disk of a model as given: the file (every file of a directory), plus the
    external-data files its tensors point at outside it."""
    p = Path(path)
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

    if p.is_dir():
        for f in sorted(p.rglob("*")):
            add(f)
    else:
        add(p)
    if model is not None:
        import onnx_ir as ir

        for value in model.graph.initializers.values():
            t = value.const_value
            if isinstance(t, ir.ExternalTensor):
                add(Path(t.path))
    return total


def bundle_file_bytes(output: Path, files: dict) -> int:
    """Bytes of a bundle on disk: its files (the manifest lists them) and the manifest itself."""
    total = sum(int(f.get("bytes", 0)) for f in files.values())
    manifest = Path(output) / "manifest.json"
    return total + (manifest.stat().st_size if manifest.is_file() else 0)


def export_summary(
    output: Path,
    target: str,
    n_files: int,
    weights_before: int,
    weights_after: int,
    file_before: int,
    file_after: int,
) -> str:
    """export's last line: weights before -> after and files before -> after, never mixed."""
    return (
        f"wrote bundle {output} for {target}: weights {human_bytes(weights_before)} -> "
        f"{human_bytes(weights_after)} ({weights_before / max(weights_after, 1):.2f}x); files "
        f"{human_bytes(file_before)} -> {human_bytes(file_after)} ({n_files} files + manifest)"
    )


def render_byte_account(
    out: Out, manifest: dict, title: str = "weight storage (per tensor)", *, result: bool = False
) -> None:
    """The per-layer byte account (the Deep Compression paper's Table 4) when the manifest has one.

    ``result``: part of a command's result (inspect), printed on stdout; else a report on stderr."""
    account = manifest.get("account")
    if not out.show or not account:
        return
    say = out.print_result if result else out.print
    rows = account.get("layers", [])
    table = Table(title=title, title_justify="left")
    for col in (
        "tensor",
        "codec",
        "kept",
        "w bits",
        "idx bits",
        "codebook",
        "bytes",
        "% of orig",
        "predicted",
    ):
        table.add_column(col, justify="left" if col in ("tensor", "codec") else "right")
    for r in rows:
        table.add_row(
            escape(r["name"]),
            r.get("codec", ""),
            f"{100 * r.get('kept', 1):.1f}%",
            str(r.get("weight_bits", "")),
            str(r.get("index_bits", "") or ""),
            str(r.get("codebook_bytes", "") or ""),
            f"{r['bytes']:,}",
            f"{100 * r['bytes'] / max(r['original_bytes'], 1):.2f}%",
            f"{r.get('predicted_bytes', '')}",
        )
    tot = account.get("total", {})
    if tot:
        table.add_row(
            "total",
            "",
            f"{100 * tot.get('kept', 1):.1f}%",
            "",
            "",
            "",
            f"{tot['bytes']:,}",
            f"{100 * tot['bytes'] / max(tot['original_bytes'], 1):.2f}%",
            f"{tot.get('predicted_bytes', '')}",
        )
    say(table)


# --- run ---------------------------------------------------------------------------------------


@app.command("run", cls=Command)
def run_cmd(
    path: Annotated[Path, typer.Argument(metavar="BUNDLE_OR_MODEL", help="A bundle, or a model file.")],
    inputs: Annotated[
        list[str] | None,
        typer.Option("--input", "-i", metavar="NAME=FILE", help="An input from a .npy file (repeatable)."),
    ] = None,
    data: Annotated[
        Path | None,
        typer.Option("--data", metavar="FILE", help="Feeds from an .npz keyed by input name."),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", metavar="FILE", help="Write outputs to this .npz.")
    ] = None,
    target: Annotated[
        str | None,
        typer.Option(
            "--target", metavar="NAME", help="Run a bare model on this target (default: reference)."
        ),
    ] = None,
    samples: SamplesOpt = None,
    seed: SeedOpt = 0,
    input_shape: InputShapeOpt = None,
    json_: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Run a bundle on its target, or a model on the reference executor (or --target).

    Without --input or --data the inputs are random (--samples, --seed), as verify draws them."""
    out = _out(json_, quiet, debug)

    def body() -> int:
        from mconv.fileio import require_file
        from mconv.npzio import read_npy
        from mconv.verify import (
            check_samples,
            load_npz_feeds,
            parse_input_shapes,
            plan_random_feeds,
            run_feeds,
        )

        check_samples(samples)
        if samples is not None and (inputs or data is not None):
            raise InputError(
                "--samples draws random inputs; it does not go with --input or --data",
                hint="drop --samples, or drop --input/--data",
            )
        shapes = parse_input_shapes(input_shape)
        runner = open_runner_cli(path, target, shapes)
        if not inputs and data is None:  # random inputs, drawn as verify draws them
            plan = plan_random_feeds(runner.inputs, samples=samples, seed=seed, input_shapes=shapes)
            t0 = time.perf_counter()
            results = run_feeds(runner, plan.feeds)
            seconds = time.perf_counter() - t0
            return _emit_run(out, results, output, seconds, plan)
        feeds: dict[str, np.ndarray] = {}
        if data is not None:
            feeds, _ = load_npz_feeds(data, runner.inputs)
        names = {s.name for s in runner.inputs}
        for item in inputs or []:
            name, sep, file = item.partition("=")
            if not sep:
                raise InputError(f"bad --input '{item}'", hint="use NAME=file.npy")
            if name not in names:
                raise InputError(f"model has no input '{name}'", hint=f"inputs: {', '.join(sorted(names))}")
            f = require_file(file, "input array (.npy)")
            feeds[name] = read_npy(f)  # the header's size checked against the file first
        missing = sorted(names - set(feeds))
        if missing:
            raise InputError(f"no value for input(s) {', '.join(missing)}", hint="pass --input NAME=file.npy")
        t0 = time.perf_counter()
        results = runner.run(feeds)
        seconds = time.perf_counter() - t0
        return _emit_run(out, results, output, seconds, None)

    run_command(out, body)


def _emit_run(out: Out, results: dict, output: Path | None, seconds: float, plan) -> int:
    """The run command's outputs: -o .npz (atomic), a table on stderr, the JSON summary."""
    from mconv.fileio import atomic_path

    if output is not None:
        with atomic_path(output) as tmp:
            with open(tmp, "wb") as fh:
                np.savez(fh, **results)
    table = Table(title="outputs", title_justify="left")
    for col in ("name", "dtype", "shape", "min", "max", "mean"):
        table.add_column(col)
    summary = {}
    for name, arr in results.items():
        a = np.asarray(arr)
        num = a.size and np.issubdtype(a.dtype, np.number)
        summary[name] = {
            "dtype": a.dtype.name,
            "shape": list(a.shape),
            "min": float(a.min()) if num else None,
            "max": float(a.max()) if num else None,
            "mean": float(a.mean()) if num else None,
        }
        s = summary[name]
        table.add_row(
            name,
            s["dtype"],
            str(s["shape"]),
            f"{s['min']:.4g}" if num else "",
            f"{s['max']:.4g}" if num else "",
            f"{s['mean']:.4g}" if num else "",
        )
    out.print(table)
    doc = {"output": str(output) if output else None, "outputs": summary, "seconds": seconds}
    if plan is not None:  # random inputs: how many samples, and how they were batched
        doc.update({"samples": plan.samples, "batching": plan.as_dict()})
        out.print(f"random inputs: {plan.samples} samples, {plan.as_dict()['how']}", markup=False)
    out.emit(doc)
    return 0


# --- verify ------------------------------------------------------------------------------------


@app.command("verify", cls=Command)
def verify_cmd(
    reference: Annotated[
        Path, typer.Argument(metavar="REF", help="The reference: a model file or a bundle.")
    ],
    candidate: Annotated[
        Path, typer.Argument(metavar="CANDIDATE", help="The candidate: a model file or a bundle.")
    ],
    data: Annotated[
        Path | None,
        typer.Option("--data", metavar="FILE", help=".npz keyed by input name (+ optional labels)."),
    ] = None,
    samples: SamplesOpt = None,
    seed: SeedOpt = 0,
    input_shape: InputShapeOpt = None,
    atol: Annotated[
        float | None,
        typer.Option(
            "--atol",
            metavar="X",
            help="Gate: every |cand - ref| <= atol + rtol*|ref| (atol >= 0; with --rtol).",
        ),
    ] = None,
    rtol: Annotated[
        float | None,
        typer.Option("--rtol", metavar="X", help="Gate: relative tolerance >= 0 (see --atol)."),
    ] = None,
    min_cosine: Annotated[
        float | None,
        typer.Option(
            "--min-cosine", metavar="X", help="Gate: cosine similarity per output >= X, in [-1, 1]."
        ),
    ] = None,
    min_top1: Annotated[
        float | None,
        typer.Option(
            "--min-top1",
            metavar="X",
            help="Gate: top-1 agreement >= X, in [0, 1], for class-score outputs (2-D [N, C], C >= 2).",
        ),
    ] = None,
    min_snr_db: Annotated[
        float | None,
        typer.Option("--min-snr-db", metavar="DB", help="Gate: SNR per output or tensor >= DB (dB)."),
    ] = None,
    localize: Annotated[
        bool, typer.Option("--localize", help="Name the first node that drifts (reference executor).")
    ] = False,
    json_: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Compare a candidate (model or bundle) against a reference, with gates.

    Without gate options the defaults apply: cosine >= 0.99 and top-1 agreement >= 0.99 (top-1 on
    class-score outputs only); weight files compared by name: SNR >= 10 dB per tensor. Any gate
    option replaces the defaults."""
    out = _out(json_, quiet, debug)

    def body() -> int:
        from mconv.verify import (
            Gates,
            check_samples,
            load_npz_feeds,
            parse_input_shapes,
            plan_random_feeds,
            run_feeds,
            verify_outputs,
        )
        from mconv.weightbundle import verify_weights, weight_pair

        check_samples(samples)
        user_gates = Gates(
            atol=atol, rtol=rtol, min_cosine=min_cosine, min_top1=min_top1, min_snr_db=min_snr_db
        ).check()
        shapes = parse_input_shapes(input_shape)
        pair = weight_pair(reference, candidate)
        if pair is not None:  # both sides are tensors only: compare them by name
            gates = user_gates if user_gates.any() else Gates.weight_defaults()
            report = verify_weights(*pair, gates)
            report.gates = gates.as_dict()
            report.gates_source = "user" if user_gates.any() else "default"
            render_verify(out, report)
            out.emit(report.as_dict())
            if not report.passed:
                raise GateFailed(
                    "verification failed: "
                    + "; ".join(f"{k}: {', '.join(v)}" for k, v in report.failures.items())
                )
            return 0
        ref = open_runner_cli(reference, None, shapes)
        cand = open_runner_cli(candidate, None, shapes)
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
        with out.progress("verify", total=2 * runs) as bar:
            bar(description=f"reference, {runs} run(s)")
            ref_out = run_feeds(_Ticking(ref, bar.advance), feed_list)
            bar(description=f"candidate, {runs} run(s)")
            cand_out = run_feeds(_Ticking(cand, bar.advance), feed_list)
        report = verify_outputs(ref_out, cand_out, gates, labels, samples=n_samples)
        report.batching = batching
        report.gates_source = "user" if user_gates.any() else "default"
        if localize:
            from mconv.localize import localize as do_localize

            # The first run's feeds: a drift shows in one batch as well as in all.
            report.localized = do_localize(reference, candidate, feed_list[0], user_gates, shapes)
        render_verify(out, report)
        out.emit(report.as_dict())
        if not report.passed:
            raise GateFailed(
                "verification failed: "
                + "; ".join(f"{k}: {', '.join(v)}" for k, v in report.failures.items())
            )
        return 0

    run_command(out, body)


@contextmanager
def naming_the_file(path: Path):
    """An unsupported-op refusal raised without a file (the executor, a target's lowering) names
    the model file it came from: every exit-2 line says which file."""
    try:
        yield
    except UnsupportedError as exc:
        if exc.path is None:
            exc.path = str(path)
        raise


class _Ticking:
    """A runner that reports each run to a progress display (verify over many batches)."""

    def __init__(self, runner, advance) -> None:
        self._runner, self._advance = runner, advance
        self.inputs = runner.inputs

    def run(self, feeds):
        result = self._runner.run(feeds)
        self._advance(1)
        return result


def open_runner_cli(path: Path, target: str | None = None, shapes: dict | None = None):
    """A runner for a bundle or a model, with ``--input-shape`` checked (a bundle) or fixed in."""
    from mconv.bundle import is_bundle
    from mconv.runtime import open_runner

    p = Path(path)
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


def render_verify(out: Out, report) -> None:
    if not out.show:
        return
    how = (report.batching or {}).get("how")
    table = Table(title=f"verify ({report.samples} samples{', ' + how if how else ''})", title_justify="left")
    cols = [
        "output",
        "max_abs",
        "max_rel",
        "mean_abs",
        "cosine",
        "snr_db",
        "top1",
        "top5",
        "acc ref",
        "acc cand",
        "gate",
    ]
    for c in cols:
        table.add_column(c, justify="left" if c == "output" else "right")

    def f(v, fmt="{:.3g}"):
        return "" if v is None else (str(v) if isinstance(v, str) else fmt.format(v))

    for name, m in report.outputs.items():
        table.add_row(
            name,
            f(m["max_abs"]),
            f(m["max_rel"]),
            f(m["mean_abs"]),
            f(m["cosine"], "{:.6f}"),
            f(m["snr_db"], "{:.1f}"),
            f(m.get("top1_agreement"), "{:.4f}"),
            f(m.get("top5_agreement"), "{:.4f}"),
            f(m.get("accuracy_reference"), "{:.4f}"),
            f(m.get("accuracy_candidate"), "{:.4f}"),
            "FAIL" if name in report.failures else "ok",
        )
    out.print(table)
    gates = ", ".join(f"{k} {v:g}" for k, v in report.gates.items()) or "none"
    out.print(f"gates ({getattr(report, 'gates_source', 'user')}): {gates}", markup=False)
    if report.localized:
        out.print(localize_line(report.localized), markup=False)


def _metric(value, fmt: str = "{:.3g}") -> str | None:
    """A metric for a sentence, or None when there is none to show (missing, NaN)."""
    if value is None or isinstance(value, str):
        return value
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return None if np.isnan(v) else fmt.format(v)


def localize_line(loc: dict) -> str:
    """What ``--localize`` found, as a sentence: the first drifting node (its name, or its op and
    output when unnamed) with the metrics that exist, or that no node drifts and why; never a
    ``None`` or ``nan`` standing in for something unknown."""
    from mconv.errors import show

    node, value = loc.get("node"), loc.get("value")
    if not node and not value:  # nothing named: localize's reason says why
        return f"localize: {loc.get('note') or 'no drifting node found'}"
    op = loc.get("op_type")
    who = f"node '{show(node)}'" if node else "an unnamed node"
    if op:
        who += f" ({show(op)})"
    if value:
        who += f", output '{show(value)}'"
    facts = [
        f"{k} {v}"
        for k, v in (
            ("max_abs", _metric(loc.get("max_abs"))),
            ("cosine", _metric(loc.get("cosine"), "{:.6f}")),
            ("snr_db", _metric(loc.get("snr_db"), "{:.1f}")),
        )
        if v is not None
    ]
    fails = loc.get("failures") or []
    if fails:
        facts.append("fails " + ", ".join(map(str, fails)))
    if loc.get("fused_from"):
        facts.append(f"fused from {show(loc['fused_from'])}")
    line = f"first drifting node: {who}"
    if facts:
        line += ": " + "; ".join(facts)
    if loc.get("note"):
        line += f" ({loc['note']})"
    return line


# --- inspect -----------------------------------------------------------------------------------


@app.command("inspect", cls=Command)
def inspect_cmd(
    path: Annotated[Path, typer.Argument(metavar="PATH", help="A model file or a bundle.")],
    top: Annotated[
        int, typer.Option("--top", metavar="N", help="How many of the largest tensors to list.")
    ] = 10,
    input_shape: InputShapeOpt = None,
    json_: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Show ops, parameters, bytes by dtype, inputs/outputs and largest tensors (and a bundle's manifest)."""
    out = _out(json_, quiet, debug)

    def body() -> int:
        from mconv.bundle import is_bundle
        from mconv.inspect import inspect_model, inspect_path
        from mconv.verify import parse_input_shapes

        shapes = parse_input_shapes(input_shape)
        if shapes and not is_bundle(path) and not path.is_dir():
            from mconv.passes.input_shapes import open_model_with_shapes

            model = open_model_with_shapes(path, shapes)  # shapes fixed, downstream dims inferred
            kind = model.metadata_props.get("mconv.source_format", "onnx")
            doc = {"path": str(path), "kind": kind, **inspect_model(model, top=top)}
        else:
            doc = inspect_path(path, top=top)
            if shapes:  # a bundle's inputs are what they are: the shapes are checked only
                from mconv.bundle import TensorSpec
                from mconv.passes.input_shapes import check_input_shapes

                specs = [TensorSpec.from_dict(d) for d in doc.get("inputs") or []]
                check_input_shapes(specs, shapes, path=str(path))
        render_inspect(out, doc)
        out.emit(doc)
        return 0

    run_command(out, body)


def format_shape(shape) -> str:
    """``[1,3,224,224]``, ``[N,3,?,?]`` (a symbolic dim by its name, an unknown one as ``?``),
    ``[]`` for a scalar, ``?`` when the rank is unknown."""
    if shape is None:
        return "?"
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def render_inspect(out: Out, doc: dict) -> None:
    """inspect's result in human form, on stdout (``--json`` prints the document instead)."""
    if not out.show or out.json:
        return
    say = out.print_result
    say(
        f"{doc['path']} ({doc['kind']}): {doc['nodes']} nodes, {doc['params']:,} parameters, "
        f"{human_bytes(doc['bytes'])}",
        markup=False,
    )
    io = Table(title="inputs and outputs", title_justify="left")
    for c in ("", "name", "dtype", "shape"):
        io.add_column(c)
    for kind in ("inputs", "outputs"):
        for v in doc[kind]:
            io.add_row(kind[:-1], escape(v["name"]), v["dtype"], escape(format_shape(v["shape"])))
    say(io)
    ops = Table(title="ops", title_justify="left")
    ops.add_column("op")
    ops.add_column("count", justify="right")
    for op, n in sorted(doc["ops"].items(), key=lambda kv: (-kv[1], kv[0])):
        ops.add_row(escape(op), str(n))
    say(ops)
    if doc.get("bytes_by_dtype"):
        say(
            "bytes by dtype: " + ", ".join(f"{k} {human_bytes(v)}" for k, v in doc["bytes_by_dtype"].items()),
            markup=False,
        )
    big = Table(title="largest tensors", title_justify="left")
    for c in ("name", "dtype", "shape", "bytes"):
        big.add_column(c, justify="right" if c == "bytes" else "left")
    for t in doc["largest"]:
        big.add_row(escape(t["name"]), t["dtype"], escape(format_shape(t["shape"])), f"{t['bytes']:,}")
    say(big)
    if doc.get("manifest"):
        render_byte_account(out, doc["manifest"], result=True)
        m = doc["manifest"]
        say(
            f"bundle: target {m.get('target')}, files: "
            + ", ".join(f"{k} ({human_bytes(v['bytes'])})" for k, v in sorted(m.get("files", {}).items())),
            markup=False,
        )


# --- analyze -----------------------------------------------------------------------------------


def _float_list(text: str, option: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(
            f"{option} '{text}' is not a comma-separated list of numbers", hint=f"e.g. {option} 0.5,0.7,0.9"
        ) from None


@app.command("analyze", cls=Command)
def analyze_cmd(
    model_path: Annotated[
        Path, typer.Argument(metavar="MODEL", help="Model (.onnx or any importable file).")
    ],
    data: Annotated[
        Path,
        typer.Option("--data", metavar="FILE", help=".npz keyed by input name (+ optional labels)."),
    ],
    max_drop: Annotated[
        float | None,
        typer.Option(
            "--max-drop",
            metavar="X",
            help="Metric budget per layer as a fraction (0.01 = one point); writes -o.",
        ),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", metavar="FILE", help="Recipe to write (.toml).")
    ] = None,
    sweep: Annotated[
        str, typer.Option("--sweep", metavar="S,S,...", help="Sparsities to try per layer.")
    ] = "0.5,0.7,0.9",
    bits: Annotated[
        str | None,
        typer.Option("--bits", metavar="B,B,...", help="Also cluster at these bits, e.g. 8,6,5,4."),
    ] = None,
    json_: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Sensitivity: prune (and cluster) one layer at a time, measure the drop, suggest a recipe."""
    out = _out(json_, quiet, debug)

    def body() -> int:
        from mconv.analyze import analyze_sensitivity, write_recipe
        from mconv.runtime import open_model

        if output is not None and max_drop is None:
            raise InputError("-o needs --max-drop", hint="e.g. --max-drop 0.01 -o recipe.toml")
        sparsities = _float_list(sweep, "--sweep")
        bit_list = [int(b) for b in _float_list(bits, "--bits")] if bits else []
        model = open_model(model_path)
        feeds = _load_data(data, model)
        with out.progress("analyze") as update:
            report = analyze_sensitivity(
                model, feeds, sweep=sparsities, bits=bit_list, max_drop=max_drop, progress=update
            )
        render_sensitivity(out, report)
        doc = report.as_dict()
        doc["recipe"] = None
        if output is not None:
            write_recipe(report, output)
            doc["recipe"] = str(output)
            out.print(f"wrote recipe {output} (use: mconv optimize MODEL --recipe {output} --data D)")
        out.emit(doc)
        return 0

    run_command(out, body)


def render_sensitivity(out: Out, report) -> None:
    """One row per layer: metric at each sparsity (unclustered), a sparkline, bits, the choice."""
    from mconv.analyze import sparkline

    if not out.show:
        return
    sparsities = sorted({p.sparsity for layer in report.layers for p in layer.sweep})
    bit_list = sorted({p.bits for layer in report.layers for p in layer.sweep if p.bits}, reverse=True)
    metrics = [p.metric for layer in report.layers for p in layer.sweep]
    lo = min(metrics, default=0.0)
    table = Table(
        title=f"sensitivity: {report.metric} per layer, pruned alone ({report.samples} samples, "
        f"baseline {report.baseline:.4f})",
        title_justify="left",
    )
    table.add_column("layer")
    table.add_column("op")
    table.add_column("params", justify="right")
    for s in sparsities:
        table.add_column(f"s={s:g}", justify="right")
    table.add_column("curve")
    for b in bit_list:
        table.add_column(f"{b}b@s=0", justify="right")
    if report.max_drop is not None:
        table.add_column(f"choice (drop <= {report.max_drop:g})")
    for layer in report.layers:
        plain = {p.sparsity: p.metric for p in layer.sweep if p.bits is None}
        at_zero = {p.bits: p.metric for p in layer.sweep if p.bits and p.sparsity == 0.0}
        row = [layer.name, layer.op_type, f"{layer.params:,}"]
        row += [f"{plain[s]:.4f}" if s in plain else "" for s in sparsities]
        row.append(sparkline([plain[s] for s in sparsities if s in plain], lo, report.baseline))
        row += [f"{at_zero[b]:.4f}" if b in at_zero else "" for b in bit_list]
        if report.max_drop is not None:
            c = layer.choice or {}
            row.append(
                f"sparsity {c.get('sparsity', 0):g}" + (f", {c['bits']} bits" if c.get("bits") else "")
            )
        table.add_row(*row)
    out.print(table)
    for note in report.notes:
        out.print(f"  note: {note}", markup=False)


# --- demo --------------------------------------------------------------------------------------


@app.command("demo", cls=Command)
def demo_cmd(
    workdir: Annotated[
        Path | None,
        typer.Option("--workdir", "-o", metavar="DIR", help="Write here instead of a temporary folder."),
    ] = None,
    recipe: Annotated[
        str | None,
        typer.Option("--recipe", metavar="NAME|FILE", help="Recipe to run (default: the demo's)."),
    ] = None,
    json_: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Import -> optimize -> export cpu -> verify on the embedded digits model; print size and accuracy."""
    out = _out(json_, quiet, debug)

    def body() -> int:
        from mconv.demo import run_demo

        doc = run_demo(workdir, out, recipe=recipe)
        out.emit(doc)
        return 0 if doc["passed"] else 1

    run_command(out, body)


def _usage_line(exc) -> str:
    """Click's three-line usage error as one line: ``error: WHAT (hint: see 'mconv CMD --help')``."""
    from mconv.errors import InputError

    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None and ctx.command_path else "mconv"
    return "error: " + InputError(exc.format_message(), hint=f"see '{command} --help'").line()


def main() -> None:
    """The ``mconv`` entry point: the app with click's usage errors rendered as one line, exit 2.

    ``mconv`` alone and ``--help`` print the help as click does.
    """
    import sys

    try:
        from typer._click import exceptions as click_exc  # typer >= 0.2x vendors click
    except ImportError:  # pragma: no cover - older typer on the real click
        from click import exceptions as click_exc

    no_args_help = getattr(click_exc, "NoArgsIsHelpError", None)
    try:
        code = app(prog_name="mconv", standalone_mode=False)  # 'mconv' in hints under python -m too
    except click_exc.ClickException as exc:
        if no_args_help is not None and isinstance(exc, no_args_help):
            exc.show()
            sys.exit(exc.exit_code)
        print(_usage_line(exc), file=sys.stderr)
        sys.exit(2)
    except click_exc.Abort:
        print("aborted", file=sys.stderr)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
