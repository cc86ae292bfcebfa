"""``mconv demo``: the main job on the embedded digits model (:func:`mconv.api.demo.demo`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from mconv.cli import render
from mconv.cli.common import (
    Command,
    DebugOpt,
    JsonOpt,
    QuietOpt,
    app,
    make_out,
)
from mconv.cli.output import run_command


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
    out = make_out(json_, quiet, debug)

    def body() -> int:
        from mconv.api.demo import demo

        result = demo(workdir, recipe=recipe, progress=out.progress)
        render.render_demo(out, result)
        out.emit(result.as_dict())
        return 0 if result.passed else 1

    run_command(out, body)
