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
    ReportOpt,
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
    report: ReportOpt = None,
    json_: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Show ops, parameters, bytes by dtype, inputs/outputs and largest tensors (and a bundle's manifest)."""
    out = make_out(json_, quiet, debug)

    def body() -> int:
        import mconv.api as api

        if report is not None:
            from mconv.api.common import check_report_path as check_path

            check_path(report, path)
        result = api.inspect(path, top=top, input_shapes=input_shape)
        doc = result.as_dict()
        if report is not None:
            result.write_report(report)
        render.render_inspect(out, doc)
        out.emit(doc)
        return 0

    run_command(out, body)
