"""``mconv inspect``: what a model or bundle holds (:func:`mconv.api.inspect`)."""

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
    app,
    make_out,
)
from mconv.cli.output import run_command


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
    out = make_out(json_, quiet, debug)

    def body() -> int:
        import mconv.api as api

        doc = api.inspect(path, top=top, input_shapes=input_shape).as_dict()
        render.render_inspect(out, doc)
        out.emit(doc)
        return 0

    run_command(out, body)
