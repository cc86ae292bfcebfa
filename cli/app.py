"""The ``mconv`` command line: thin over the API (:mod:`mconv.api`): parse, call, render.

Each command lives in its own module and registers on the one Typer app (:mod:`mconv.cli.common`);
importing this module assembles them. ``main`` is the entry point.
"""

from __future__ import annotations

from mconv.cli import analyze, demo, export, import_, inspect, optimize, report, run, verify  # noqa: F401
from mconv.cli.common import app
from mconv.cli.render import format_shape, localize_line, render_verify

__all__ = ["app", "format_shape", "localize_line", "main", "render_verify"]


def _usage_line(exc) -> str:
    """Click's three-line usage error as one line: ``error: WHAT (hint: see 'mconv CMD --help')``."""
    from mconv.errors import InputError

    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None and ctx.command_path else "mconv"
    return "error: " + InputError(exc.format_message(), hint=f"see '{command} --help'").line()


def main() -> None:
    """The ``mconv`` entry point: the app with click's usage errors rendered as one line, exit 2.

    ``mconv`` alone and ``--help`` print the help as click does.
    """
    import sys

    import typer

    try:
        from typer._click import exceptions as click_exc  # typer >= 0.2x vendors click
    except ImportError:  # pragma: no cover - older typer on the real click
        from click import exceptions as click_exc  # type: ignore[no-redef]  # the same names, older typer

    no_args_help = getattr(click_exc, "NoArgsIsHelpError", None)
    try:
        code = app(prog_name="mconv", standalone_mode=False)  # 'mconv' in hints under python -m too
    except click_exc.ClickException as exc:
        if no_args_help is not None and isinstance(exc, no_args_help):
            exc.show()
            sys.exit(exc.exit_code)
        print(_usage_line(exc), file=sys.stderr)
        sys.exit(2)
    except typer.Abort:  # typer's own (its vendored click has none; older typer: click's)
        print("aborted", file=sys.stderr)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
