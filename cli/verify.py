"""``mconv verify``: compare a candidate against a reference, with gates (:func:`mconv.api.verify`)."""

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
    SamplesOpt,
    SeedOpt,
    app,
    make_out,
    reuse_progress,
)
from mconv.cli.output import run_command


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
    max_rel_l2: Annotated[
        float | None,
        typer.Option(
            "--max-rel-l2",
            metavar="X",
            help="Gate: relative error ||cand - ref|| / ||ref|| per output <= X (>= 0).",
        ),
    ] = None,
    localize: Annotated[
        bool, typer.Option("--localize", help="Name the first node that drifts (reference executor).")
    ] = False,
    report: ReportOpt = None,
    json_: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Compare a candidate (model or bundle) against a reference, with gates.

    Without gate options the defaults apply: cosine >= 0.99, relative error ||cand - ref|| / ||ref||
    <= 0.03 (cosine misses a uniform scale error) and top-1 agreement >= 0.99 (top-1 on
    class-score outputs only); weight files compared by name: SNR >= 10 dB per tensor. Any gate
    option replaces the defaults."""
    out = make_out(json_, quiet, debug)

    def body() -> int:
        import mconv.api as api

        if report is not None:  # refused before the work (mconv.report.check_path)
            from mconv.api.common import check_report_path as check_path

            check_path(report, reference, candidate, data)
        with out.progress("verify") as update:
            result = api.verify(
                reference,
                candidate,
                data=data,
                samples=samples,
                seed=seed,
                input_shapes=input_shape,
                atol=atol,
                rtol=rtol,
                min_cosine=min_cosine,
                min_top1=min_top1,
                min_snr_db=min_snr_db,
                max_rel_l2=max_rel_l2,
                localize=localize,
                progress=reuse_progress(update, restart=True),
            )
        render.render_verify(out, result.report)
        if report is not None:
            result.write_report(report)
        out.emit(result.as_dict())
        result.check()
        return 0

    run_command(out, body)
