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
from mconv.cli.output import err_console, run_command

# ``-o`` names a command's output everywhere else; the demo writes a work folder (the model, the
# optimized model and the bundle), so it is ``--workdir``. ``-o`` still works for it, with one
# warning line after a run (never beside an error line).
DEPRECATED_O = "warning: demo -o is deprecated: it names the work folder; use --workdir DIR"


@app.command("demo", cls=Command)
def demo_cmd(
    workdir: Annotated[
        Path | None,
        typer.Option(
            "--workdir",
            metavar="DIR",
            help="Work folder, kept: the model, the optimized model and the cpu bundle "
            "(default: a temporary folder, removed).",
        ),
    ] = None,
    legacy_out: Annotated[
        Path | None,
        typer.Option("-o", metavar="DIR", help="Deprecated: the same as --workdir."),
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
        from mconv.errors import InputError

        folder = workdir
        if legacy_out is not None:
            if workdir is not None and workdir != legacy_out:
                raise InputError(
                    "-o and --workdir name different folders",
                    where="demo",
                    hint="give --workdir DIR only (-o is its deprecated spelling)",
                )
            folder = legacy_out
        result = demo(folder, recipe=recipe, progress=out.progress)
        render.render_demo(out, result)
        if legacy_out is not None:
            err_console.print(DEPRECATED_O, markup=False, soft_wrap=True)
        out.emit(result.as_dict())
        return 0 if result.passed else 1

    run_command(out, body)
