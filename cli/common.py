"""What every command shares: the Typer app, the help formatting, the common options.

One module per command (``cli/import_.py``, ``optimize.py``, ...) registers on :data:`app`;
rendering lives in :mod:`mconv.cli.render`; :mod:`mconv.cli.app` assembles them and holds the
entry point."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from mconv import __version__
from mconv.cli.output import Out
from mconv.errors import InputError
from typer.core import TyperCommand


def _argument_label(param, usage: bool = False) -> str:
    """``MODEL``, ``FILE...``, ``[DIR]``: an argument as the help shows it (no braces, no types)."""
    label = param.metavar or param.name.upper()
    if param.nargs != 1:
        label += "..."
    return f"[{label}]" if usage and not param.required else label


class Command(TyperCommand):
    """Help text for people: arguments as ``MODEL`` / ``FILE...`` / ``[DIR]`` (typer would write
    ``{MODEL}`` and ``<list[Path]>``), every option with its metavar and help, and a listing
    from the registries after the options where a command has one (``EPILOGS``)."""

    def collect_usage_pieces(self, ctx) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                pieces.append(_argument_label(param, usage=True))
            else:
                pieces.extend(param.get_usage_pieces(ctx))
        return pieces

    def format_options(self, ctx, formatter) -> None:
        args, opts = [], []
        for param in self.get_params(ctx):
            if getattr(param, "hidden", False):
                continue
            if param.param_type_name == "argument":
                extra = "  [required]" if param.required else ""
                args.append((_argument_label(param), (getattr(param, "help", None) or "") + extra))
            else:
                record = param.get_help_record(ctx)
                if record is not None:
                    opts.append(record)
        if args:
            with formatter.section("Arguments"):
                formatter.write_dl(args)
        if opts:
            with formatter.section("Options"):
                formatter.write_dl(opts)

    def format_epilog(self, ctx, formatter) -> None:
        listing = EPILOGS.get(self.name) if self.name is not None else None
        if listing is not None:
            for title, rows in listing():
                with formatter.section(title):
                    formatter.write_dl(rows)
        super().format_epilog(ctx, formatter)


def _optimize_listing() -> list[tuple[str, list[tuple[str, str]]]]:
    """optimize --help: the registered passes and the built-in recipes (:func:`mconv.api.optimize.pass_listing`)."""
    from mconv.api.optimize import pass_listing

    return pass_listing()


EPILOGS = {"optimize": _optimize_listing}

app = typer.Typer(
    name="mconv",
    help="Import, optimize (Deep Compression), verify and export neural network models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout, nothing else.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No tables or progress on stderr.")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks of internal errors.")]
InputShapeOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--input-shape",
        metavar="NAME=DIMS",
        help="Fix a symbolic input shape: NAME=1,3,224,224 (repeatable). An unknown name or a dim "
        "that contradicts a fixed one is refused; downstream shapes are inferred.",
    ),
]
ReportOpt = Annotated[
    Path | None,
    typer.Option(
        "--report",
        metavar="FILE.html",
        help="Also write one self-contained HTML report with charts (needs matplotlib: mconv[report]).",
    ),
]
SamplesOpt = Annotated[
    int | None,
    typer.Option(
        "--samples",
        metavar="N",
        help="Random samples when no --data/--input (default 4): a symbolic batch dim is set to N "
        "(one run); a fixed batch B runs N/B times (N must be a multiple of B).",
    ),
]
SeedOpt = Annotated[
    int, typer.Option("--seed", metavar="INT", help="Seed of the random inputs (same seed, same inputs).")
]


def make_out(json_: bool, quiet: bool, debug: bool) -> Out:
    return Out(json=json_, quiet=quiet, debug=debug)


def _version_cb(value: bool) -> None:
    if value:
        typer.echo(f"mconv {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version_cb, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """mconv: one IR (ONNX semantics), many formats, passes and targets."""


def float_list(text: str, option: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(
            f"{option} '{text}' is not a comma-separated list of numbers", hint=f"e.g. {option} 0.5,0.7,0.9"
        ) from None


def reuse_progress(update, *, restart: bool = False):
    """A progress factory for the API (``progress(title, total)``) that hands back the display the
    command already opened; ``restart``: each API stage starts the count afresh with its title."""
    from contextlib import contextmanager

    @contextmanager
    def factory(title, total=None):
        if restart:
            update(description=title, total=total, completed=0)
        yield update

    return factory
