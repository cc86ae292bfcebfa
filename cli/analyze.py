"""``mconv analyze``: per-layer sensitivity and a suggested recipe (:func:`mconv.api.analyze`)."""

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
    ReportOpt,
    app,
    float_list,
    make_out,
    reuse_progress,
)
from mconv.cli.output import run_command


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
    engine: Annotated[
        str,
        typer.Option("--engine", metavar="NAME", help="reference (numpy) or xla (jax, compiled)."),
    ] = "reference",
    device: Annotated[
        str, typer.Option("--device", metavar="NAME", help="cpu or cuda (xla engine).")
    ] = "cpu",
    workers: Annotated[
        int,
        typer.Option("--workers", metavar="N", help="Run the layers' sweeps on a local Ray with N workers."),
    ] = 0,
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray", metavar="ADDRESS", help="Run the sweeps on this Ray cluster (ray://HOST:PORT or auto)."
        ),
    ] = None,
    report: ReportOpt = None,
    json_: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Sensitivity: prune (and cluster) one layer at a time, measure the drop, suggest a recipe."""
    out = make_out(json_, quiet, debug)

    def body() -> int:
        import mconv.api as api

        if report is not None:  # refused before the work
            from mconv.api.common import check_report_path as check_path

            check_path(report, model_path, data, output)
        sparsities = float_list(sweep, "--sweep")
        bit_list = [int(b) for b in float_list(bits, "--bits")] if bits else []
        with out.progress("analyze") as update:
            result = api.analyze(
                model_path,
                data,
                sweep=sparsities,
                bits=bit_list,
                max_drop=max_drop,
                output=output,
                progress=reuse_progress(update),
                engine=engine,
                device=device,
                workers=workers,
                ray_address=ray_address,
            )
        render.render_sensitivity(out, result.report)
        if result.recipe is not None:
            out.print(f"wrote recipe {output} (use: mconv optimize MODEL --recipe {output} --data D)")
        if report is not None:
            result.write_report(report)
        out.emit(result.as_dict())
        return 0

    run_command(out, body)
