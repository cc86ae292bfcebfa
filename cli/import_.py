"""``mconv import``: read a model from any supported framework into ONNX (:func:`mconv.api.convert`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
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
from mconv.errors import InputError


@app.command("import", cls=Command)
def import_cmd(
    src: Annotated[
        list[Path],
        typer.Argument(metavar="FILE", help="Model file(s): FILE, or FILE1 FILE2 for split formats."),
    ],
    output: Annotated[Path, typer.Option("-o", "--output", metavar="FILE", help="Output .onnx path.")],
    format: Annotated[
        str | None,
        typer.Option("--format", metavar="NAME", help="Force the source format (default: from the file)."),
    ] = None,
    input_shape: InputShapeOpt = None,
    input_value: Annotated[
        list[str] | None,
        typer.Option(
            "--input-value",
            metavar="NAME=VALUE",
            help="PyTorch: bake an int, float or bool argument of forward() into the model as a "
            "constant, e.g. sr=16000 (repeatable).",
        ),
    ] = None,
    example_inputs: Annotated[
        Path | None,
        typer.Option(
            "--example-inputs",
            metavar="FILE.npz",
            help="PyTorch: example inputs, arrays keyed by forward() argument name; a 0-d array gives "
            "an int, float or bool argument's value.",
        ),
    ] = None,
    option: Annotated[
        list[str] | None,
        typer.Option(
            "--option",
            metavar="KEY=VALUE",
            help="A format's import option (repeatable), e.g. activations=float for an int8 TFLite "
            "model's float activations (default: qdq, QuantizeLinear/DequantizeLinear pairs).",
        ),
    ] = None,
    json_: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Read a model from any supported framework into ONNX."""
    out = make_out(json_, quiet, debug)

    def body() -> int:
        import mconv.api as api

        result = api.convert(
            src,
            output,
            format=format,
            input_shapes=input_shape,
            input_values=input_value,
            example_inputs=example_inputs,
            options=_options(option),
        )
        doc = result.as_dict()
        out.print(
            f"imported [bold]{', '.join(map(str, src))}[/] ({doc['source_format']}) -> {output}: "
            f"{doc['nodes']} nodes, {doc['params']:,} parameters, {human_bytes(doc['bytes'])}"
        )
        for note in doc.get("notes", []):
            out.print(f"  note: {note}", markup=False)
        out.emit(doc)
        return 0

    run_command(out, body)


def _options(items: list[str] | None) -> dict:
    """``--option KEY=VALUE`` (repeatable): a format's import option, the value as text."""
    options = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"bad --option '{item}'", hint="use KEY=VALUE, e.g. --option activations=float")
        options[key.strip()] = value.strip()
    return options
