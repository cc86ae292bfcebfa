"""``mconv run``: run a bundle or a model (:func:`mconv.api.run`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from mconv.cli import render
from mconv.cli.common import (
    Command,
    DebugOpt,
    InputShapeOpt,
    JsonOpt,
    QuietOpt,
    SamplesOpt,
    SeedOpt,
    app,
    make_out,
)
from mconv.cli.output import run_command
from mconv.errors import InputError


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
    engine: Annotated[
        str | None,
        typer.Option(
            "--engine",
            metavar="NAME",
            help="reference or xla: run a bare model on the numpy executor or compiled by XLA.",
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
    out = make_out(json_, quiet, debug)

    def body() -> int:
        import mconv.api as api

        chosen = target
        if engine is not None:
            from mconv.api.run import check_engine

            check_engine(engine)
            if target is not None and target != engine:
                raise InputError(f"--engine {engine} and --target {target} disagree", hint="give one of them")
            chosen = engine  # the engines are the reference and xla targets' in-memory runners
        feeds = {}
        for item in inputs or []:
            name, sep, file = item.partition("=")
            if not sep:
                raise InputError(f"bad --input '{item}'", hint="use NAME=file.npy")
            feeds[name] = Path(file)
        result = api.run(
            path,
            feeds or None,
            data=data,
            samples=samples,
            seed=seed,
            input_shapes=input_shape,
            target=chosen,
            output=output,
        )
        doc = result.as_dict()
        render.render_run(out, doc)
        out.emit(doc)
        return 0

    run_command(out, body)
