"""How the CLI talks: JSON on stdout (and nothing else there), tables and progress on stderr.

``run_command`` turns exceptions into the stable exit codes: 1 gate failed, 2 bad input or usage
(one line), 3 internal error (a traceback only with ``--debug``).
"""

from __future__ import annotations

import json
import math
import sys
import traceback
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import typer
from mconv.errors import EXIT_INTERNAL, MconvError
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

# Off a terminal (logs, CI, pipes) rich would wrap at 80 columns and truncate the size tables.
err_console = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 140)


@dataclass
class Out:
    """Per-command output settings."""

    json: bool = False
    quiet: bool = False
    debug: bool = False

    @property
    def show(self) -> bool:
        """Whether human-readable tables go to stderr."""
        return not self.quiet

    def print(self, *objects, **kwargs) -> None:
        if self.show:
            err_console.print(*objects, **kwargs)

    def emit(self, doc: dict) -> None:
        if self.json:
            sys.stdout.write(json.dumps(jsonable(doc), sort_keys=True, indent=2) + "\n")
            sys.stdout.flush()

    @contextmanager
    def progress(self, description: str, total: float | None = None):
        """A progress bar on stderr.

        Yields ``update(description=None, completed=None, total=None, info=None)``, the signature
        passes use (``PassContext.progress``); ``update.advance(n)`` steps it by ``n``.
        """

        def noop(*args, **kwargs) -> None:
            return None

        noop.advance = noop
        if not self.show:
            yield noop
            return
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=err_console,
            transient=True,
        ) as prog:
            task = prog.add_task(description, total=total, info="")

            def update(
                description: str | None = None,
                completed: float | None = None,
                total: float | None = None,
                info: str | None = None,
            ) -> None:
                kw = {
                    k: v
                    for k, v in (
                        ("description", description),
                        ("completed", completed),
                        ("total", total),
                        ("info", info),
                    )
                    if v is not None
                }
                prog.update(task, **kw)

            update.advance = lambda n=1: prog.update(task, advance=n)
            yield update


def jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        f = float(obj)
        if math.isnan(f):
            return None
        if math.isinf(f):
            return "inf" if f > 0 else "-inf"
        return f
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if hasattr(obj, "as_dict"):
        return jsonable(obj.as_dict())
    if hasattr(obj, "__fspath__"):
        return str(obj)
    return obj


def run_command(out: Out, fn: Callable[[], int | None]) -> None:
    """Run a command body with the exit-code contract."""
    try:
        code = fn() or 0
    except MconvError as exc:
        label = "internal error" if exc.exit_code == EXIT_INTERNAL else "error"
        err_console.print(f"{label}: {exc.line()}", markup=False, soft_wrap=True)
        if out.debug:
            traceback.print_exc()
        raise typer.Exit(exc.exit_code) from None
    except typer.Exit:
        raise
    except KeyboardInterrupt:
        err_console.print("interrupted", markup=False)
        raise typer.Exit(130) from None
    except Exception as exc:  # noqa: BLE001 - the contract: anything else is internal, exit 3
        if out.debug:
            traceback.print_exc()
        msg = f"internal error: {type(exc).__name__}: {exc}"
        err_console.print(
            msg[:500] + ("" if out.debug else " (rerun with --debug for a traceback)"),
            markup=False,
            soft_wrap=True,
        )
        raise typer.Exit(EXIT_INTERNAL) from None
    raise typer.Exit(code)


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} GB"
