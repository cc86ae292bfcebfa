"""``mconv export``: write a deployable bundle for a target (:func:`mconv.api.export`)."""

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
from mconv.cli.output import human_bytes, run_command


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
        str, typer.Option("--target", metavar="NAME", help="cpu, xla, metal, webgpu or weights.")
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
                progress=_reuse(update),
                dense=dense,
                batch=batch,
                precision=precision,
                bake_weights=bake_weights,
                mlir_text=mlir_text,
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


def _reuse(update):
    from contextlib import contextmanager

    @contextmanager
    def factory(title, total=None):
        yield update

    return factory
