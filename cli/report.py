"""``mconv report``: the HTML report of a model or bundle already written (:mod:`mconv.report`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from mconv.cli.common import Command, DebugOpt, JsonOpt, QuietOpt, app, make_out
from mconv.cli.output import run_command


@app.command("report", cls=Command)
def report_cmd(
    path: Annotated[Path, typer.Argument(metavar="MODEL|BUNDLE", help="A model file or a bundle.")],
    output: Annotated[Path, typer.Option("-o", "--output", metavar="FILE.html", help="The report to write.")],
    layers: Annotated[
        int, typer.Option("--layers", metavar="N", help="Weight histograms of the N largest tensors.")
    ] = 6,
    json_: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Write one self-contained HTML report of a model or bundle: its byte account, sparsity and
    bits per tensor, weight histograms, inputs, outputs, op counts, target and options."""
    out = make_out(json_, quiet, debug)

    def body() -> int:
        import mconv.api as api
        from mconv.api.common import check_report_path as check_path
        from mconv.errors import InputError

        if layers < 0:
            raise InputError(f"--layers {layers} is negative", where="--layers", hint="e.g. --layers 6")
        check_path(output, path)
        result = api.inspect(path)
        written = result.write_report(output, layers=layers)
        out.print(f"wrote {written}", markup=False)
        out.emit({"report": str(written), "path": str(path)})
        return 0

    run_command(out, body)
