"""``mconv export``: write a deployable bundle for a target (:func:`mconv.api.export`).

The target options (``--dense``, ``--batch``, ``--precision``, ``--bake-weights``,
``--mlir-text``) are not written here: they are the fields with help of every target's
``Options`` dataclass (:mod:`mconv.targets.base`), one flag per field name whose help names the
targets that take it; the API refuses one the chosen target does not take (exit 2).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any

import typer
from mconv.cli import render
from mconv.cli.common import (
    Command,
    DebugOpt,
    InputShapeOpt,
    JsonOpt,
    QuietOpt,
    app,
    make_out,
    reuse_progress,
)
from mconv.cli.output import human_bytes, run_command


def _target_parameters() -> list[inspect.Parameter]:
    """One keyword parameter per target option flag (a switch for a bool, else a value). The
    flags come from the targets' light registry (``options.py`` files), not through
    :mod:`mconv.api`, whose import loads onnx_ir: building the commands stays free of it."""
    from mconv.targets import names, options_class
    from mconv.targets.base import flag_help, flags

    params = []
    for f in flags({name: options_class(name) for name in names()}):
        if f.type is bool:
            annotation: Any = Annotated[bool, typer.Option(f.flag, help=flag_help(f))]
            default: Any = False
        else:
            metavar = f.metavar or f.type.__name__.upper()
            annotation = Annotated[f.type | None, typer.Option(f.flag, metavar=metavar, help=flag_help(f))]
            default = None
        params.append(
            inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
        )
    return params


def _with_target_flags(fn):
    """``fn(..., **target_options)`` as typer sees it: the target flags in place of the ``**``."""
    sig = inspect.signature(fn, eval_str=True)
    fixed = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    # keyword-only after the positional-or-keyword ones: typer reads them all as options
    fixed = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in fixed]
    options = _target_parameters()
    at = next(i for i, p in enumerate(fixed) if p.name == "input_shape")
    params = [*fixed[:at], *options, *fixed[at:]]
    fn.__signature__ = sig.replace(parameters=params)
    fn.__annotations__ = {p.name: p.annotation for p in params} | {"return": sig.return_annotation}
    return fn


@app.command("export", cls=Command)
@_with_target_flags
def export_cmd(
    model_path: Annotated[
        Path, typer.Argument(metavar="MODEL", help="Model (.onnx or any importable file).")
    ],
    output: Annotated[
        Path,
        typer.Option("-o", "--output", metavar="PATH", help="Bundle directory (or file for --format)."),
    ],
    target: Annotated[
        str, typer.Option("--target", metavar="NAME", help="cpu, xla, metal, webgpu, tflite or weights.")
    ] = "cpu",
    format: Annotated[
        str | None,
        typer.Option(
            "--format",
            metavar="NAME",
            help="Write a model file instead of a bundle (dlk-json, safetensors, onnx, tflite).",
        ),
    ] = None,
    input_shape: InputShapeOpt = None,
    input_value: Annotated[
        list[str] | None,
        typer.Option(
            "--input-value",
            metavar="NAME=VALUE",
            help="Bake a graph input into the model as a constant before exporting (its dtype, "
            "broadcast to its shape), then fold and inline the Ifs it decides, e.g. sr=16000 "
            "(repeatable).",
        ),
    ] = None,
    json_: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
    **target_options: Any,
) -> None:
    """Write a deployable bundle for a target."""
    out = make_out(json_, quiet, debug)

    def body() -> int:
        import mconv.api as api

        with out.progress(f"export {target}") as update:
            result = api.export(
                model_path,
                target,
                output,
                format=format,
                input_shapes=input_shape,
                input_values=input_value,
                progress=reuse_progress(update),
                **target_options,
            )
        for note in result.notes:
            out.print(note, markup=False)
        if result.format is not None:
            out.print(f"wrote {', '.join(result.files)} ({human_bytes(result.file_bytes_after)})")
        else:
            render.render_byte_account(out, result.manifest or {})
            out.print(
                render.export_summary(
                    output,
                    target,
                    len(result.files),
                    result.weight_bytes_before,
                    result.weight_bytes_after,
                    result.file_bytes_before,
                    result.file_bytes_after,
                ),
                markup=False,
                soft_wrap=True,
            )
        out.emit(result.as_dict())
        return 0

    run_command(out, body)
