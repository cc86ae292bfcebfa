"""How the CLI talks: JSON on stdout (and nothing else there), tables and progress on stderr.

Rules:

- ``--json``: one JSON document on stdout and nothing else; on an error before any document
  it is ``{"error": {...}}`` (the one line, exit code, kind, file, place, hint and, for
  unsupported ops, every item); a failed gate (exit 1) has its report as the document.
- Reports of work done (tables of passes, byte accounts, verify's metrics), notes and progress
  go to stderr, so a pipe of ``--json`` stays parseable and logs keep them.
- A command whose result *is* the table (``inspect``) prints it on stdout when not ``--json``
  (``mconv inspect m.onnx | less`` works); ``--quiet`` prints nothing there.
- Progress (:meth:`Out.progress`): on a terminal a bar with the stage, ``done/total`` and an
  ETA; off a terminal (CI, logs, pipes) one line every ``MCONV_PROGRESS_INTERVAL`` seconds
  (default 5) on stderr: ``progress: TITLE: STAGE | step 37/120 (31%) | elapsed 1m02s, ETA 2m10s``,
  also while the work makes no update (a heartbeat, :class:`ProgressLines`). Work that ends
  within the interval prints no progress line.

``run_command`` turns exceptions into the stable exit codes: 1 gate failed, 2 bad input or usage
(one line), 3 internal error (a traceback only with ``--debug``).
"""

from __future__ import annotations

import errno
import json
import math
import os
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import typer
from mconv.errors import EXIT_INTERNAL, InputError, MconvError, missing_optional, show
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

# Off a terminal (logs, CI, pipes) rich would wrap at 80 columns and truncate the size tables.
err_console = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 140)


PROGRESS_INTERVAL_ENV = "MCONV_PROGRESS_INTERVAL"
DEFAULT_PROGRESS_INTERVAL = 5.0


def progress_interval() -> float:
    """Seconds between progress lines off a terminal (``MCONV_PROGRESS_INTERVAL``, default 5)."""
    try:
        value = float(os.environ.get(PROGRESS_INTERVAL_ENV, DEFAULT_PROGRESS_INTERVAL))
    except ValueError:
        return DEFAULT_PROGRESS_INTERVAL
    return value if value >= 0 and math.isfinite(value) else DEFAULT_PROGRESS_INTERVAL


def format_duration(seconds: float | None) -> str:
    """``42s``, ``3m05s``, ``1h02m``; ``?`` when unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


class ProgressState:
    """What a progress display shows: a title, the current stage's text, ``completed/total``,
    elapsed time and an ETA.

    The ETA is the rate of the current count since it started (a new ``total``, or a count that
    went back, starts a new count: a pipeline's pass counter gives way to a fine-tune's step
    counter) times what is left of it."""

    def __init__(self, title: str, total: float | None, clock: Callable[[], float]) -> None:
        self.title = title
        self.description = title
        self.info = ""
        self.completed: float = 0
        self.total = total
        self.clock = clock
        self.start = clock()
        self._count_start = (self.start, 0.0)

    def update(self, description=None, completed=None, total=None, info=None) -> None:
        now = self.clock()
        if total is not None and total != self.total:
            self.total = total
            self._count_start = (now, float(completed or 0))
        if completed is not None:
            if completed < self.completed:
                self._count_start = (now, float(completed))
            self.completed = completed
        if description is not None:
            self.description = description
        if info is not None:
            self.info = info

    def eta(self) -> float | None:
        if not self.total:
            return None
        t0, c0 = self._count_start
        done = self.completed - c0
        if done <= 0:
            return None
        return (self.total - self.completed) * (self.clock() - t0) / done

    def line(self) -> str:
        parts = [f"progress: {self.title}"]
        if self.description and self.description != self.title:
            parts[0] += f": {self.description}"
        if self.info:
            parts.append(self.info)
        if self.total:
            pct = 100.0 * self.completed / self.total
            parts.append(f"{self.completed:g}/{self.total:g} ({pct:.0f}%)")
        timing = f"elapsed {format_duration(self.clock() - self.start)}"
        if self.total:
            timing += f", ETA {format_duration(self.eta())}"
        parts.append(timing)
        return " | ".join(parts)


class ProgressUpdate:
    """What :meth:`Out.progress` yields: ``update(description=None, completed=None, total=None,
    info=None)`` sets the display, ``update.advance(n)`` steps it by ``n``."""

    def __init__(
        self,
        update: Callable[[str | None, float | None, float | None, str | None], None],
        advance: Callable[[float], None],
    ) -> None:
        self._update = update
        self._advance = advance

    def __call__(
        self,
        description: str | None = None,
        completed: float | None = None,
        total: float | None = None,
        info: str | None = None,
    ) -> None:
        self._update(description, completed, total, info)

    def advance(self, n: float = 1) -> None:
        self._advance(n)


def _ignore_update(
    description: str | None, completed: float | None, total: float | None, info: str | None
) -> None:
    return None


def _ignore_advance(n: float) -> None:
    return None


@dataclass
class Out:
    """Per-command output settings.

    ``tty``: whether progress draws a bar (None: whether stderr is a terminal); ``clock`` and
    ``interval``: the time source and the seconds between progress lines off a terminal
    (None: ``MCONV_PROGRESS_INTERVAL`` or 5); tests set them."""

    json: bool = False
    quiet: bool = False
    debug: bool = False
    tty: bool | None = None
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    interval: float | None = None
    emitted: bool = field(default=False, repr=False)  # a document is on stdout already

    @property
    def show(self) -> bool:
        """Whether human-readable tables go to stderr."""
        return not self.quiet

    def print(self, *objects, **kwargs) -> None:
        if self.show:
            err_console.print(*objects, **kwargs)

    def print_result(self, *objects, **kwargs) -> None:
        """A command's result in human form (``inspect``'s tables): stdout, unless ``--json``
        (then stdout holds the JSON document only) or ``--quiet``."""
        if self.show and not self.json:
            Console(highlight=False, width=None if sys.stdout.isatty() else 140).print(*objects, **kwargs)

    def emit(self, doc: dict) -> None:
        if self.json:
            self.emitted = True
            sys.stdout.write(json.dumps(jsonable(doc), sort_keys=True, indent=2) + "\n")
            sys.stdout.flush()

    @contextmanager
    def progress(self, description: str, total: float | None = None) -> Iterator[ProgressUpdate]:
        """Progress of long work on stderr: a bar on a terminal, a line every few seconds off one.

        Yields ``update(description=None, completed=None, total=None, info=None)``, the signature
        passes use (``PassContext.progress``: ``update(description, completed, total)``);
        ``update.advance(n)`` steps it by ``n``.
        """

        if not self.show:
            yield ProgressUpdate(_ignore_update, _ignore_advance)
            return
        tty = err_console.is_terminal if self.tty is None else self.tty
        if not tty:
            yield from self._progress_lines(description, total)
            return
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=err_console,
            transient=True,
        ) as prog:
            task = prog.add_task(description, total=total, info="")
            state = ProgressState(description, total, self.clock)

            def update(
                description: str | None = None,
                completed: float | None = None,
                total: float | None = None,
                info: str | None = None,
            ) -> None:
                state.update(description, completed, total, info)
                if total is not None and total != prog.tasks[0].total:
                    # rich types reset's count as int; the update below sets the exact count
                    prog.reset(task, total=total, completed=int(completed or 0))
                if info is not None:
                    prog.update(task, description=description, completed=completed, info=info)
                else:  # the info field stays (None leaves description and count as they are)
                    prog.update(task, description=description, completed=completed)

            def advance(n: float = 1) -> None:
                state.update(completed=state.completed + n)
                prog.update(task, advance=n)

            yield ProgressUpdate(update, advance)

    def _progress_lines(self, description: str, total: float | None) -> Iterator[ProgressUpdate]:
        """Off a terminal: a line on stderr when ``interval`` seconds passed since the last one,
        on an update or, when the work makes none (a long forward pass, a compile), from the
        heartbeat (:class:`ProgressLines`)."""
        interval = progress_interval() if self.interval is None else self.interval
        lines = ProgressLines(description, total, self.clock, interval, _print_line)
        with lines.heartbeat(self.clock is time.monotonic):
            yield ProgressUpdate(lines.update, lines.advance)


def _print_line(text: str) -> None:
    err_console.print(text, markup=False, highlight=False, soft_wrap=True)


class ProgressLines:
    """The one progress object off a terminal: a :class:`ProgressState` on an injectable
    ``clock``, written by ``write`` (stderr) whenever ``interval`` seconds of that clock have
    passed since the last line (or the start). :meth:`poll` is the check; every update polls,
    and :meth:`heartbeat` polls from a thread too, so a stage that makes no update for minutes
    still prints a line every ``interval`` seconds (at most about one second late)."""

    def __init__(
        self,
        title: str,
        total: float | None,
        clock: Callable[[], float],
        interval: float,
        write: Callable[[str], None],
    ) -> None:
        self.state = ProgressState(title, total, clock)
        self.clock, self.interval, self.write = clock, interval, write
        self.last = self.state.start
        self._lock = threading.Lock()

    def poll(self) -> bool:
        """Write a line when ``interval`` has passed since the last; whether one was written."""
        with self._lock:
            now = self.clock()
            if now - self.last < self.interval:
                return False
            self.last = now
            self.write(self.state.line())
            return True

    def update(
        self,
        description: str | None = None,
        completed: float | None = None,
        total: float | None = None,
        info: str | None = None,
    ) -> None:
        self.state.update(description, completed, total, info)
        self.poll()

    def advance(self, n: float = 1) -> None:
        self.state.update(completed=self.state.completed + n)
        self.poll()

    @contextmanager
    def heartbeat(self, enabled: bool = True) -> Iterator[None]:
        """A daemon thread that polls about once a second while the block runs (``enabled``:
        off for a fake clock, which only the test moves)."""
        if not enabled:
            yield
            return
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(min(1.0, max(self.interval, 0.05))):
                self.poll()

        thread = threading.Thread(target=beat, name="mconv-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=2.0)


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


def _wanted_bytes(exc: BaseException) -> int | None:
    """How many bytes the failed allocation asked for, where that is known: numpy's
    _ArrayMemoryError says it; a mapping that failed (ENOMEM) is a tensor's, found as the
    ``self`` of the innermost frame that is a tensor with its byte count."""
    size = getattr(exc, "_total_size", None)
    if isinstance(size, int):
        return size
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        obj = frame.f_locals.get("self")
        nbytes = getattr(obj, "nbytes", None) if type(obj).__name__.endswith("Tensor") else None
        if isinstance(nbytes, int):
            return nbytes
    return None


def out_of_memory(exc: BaseException) -> InputError:
    """Memory that ran out (a MemoryError, or an OSError ENOMEM from mapping a file) as the input
    error it is: the model or data needs more memory than this process may have."""
    size = _wanted_bytes(exc)
    need = f"needs {size / 2**30:.2f} GiB of memory for one tensor" if size else "needs more memory"
    return InputError(
        f"{need}; the memory this process may use ran out",
        hint="run it where more memory is available (or raise the limit: ulimit -v), "
        "or give a sharded .safetensors checkpoint, which optimize streams",
    )


_NUMPY_FP_WARNING = r"(overflow|underflow|invalid value|divide by zero) encountered in "


def run_command(out: Out, fn: Callable[[], int | None]) -> None:
    """Run a command body with the exit-code contract."""
    try:
        try:
            with warnings.catch_warnings():
                # numpy's floating-point warnings ("overflow encountered in cast") are not the
                # user's business: a result that matters is checked and said (exit 2 or a gate)
                if not out.debug:
                    warnings.filterwarnings("ignore", message=_NUMPY_FP_WARNING, category=RuntimeWarning)
                code = fn() or 0
        except MemoryError as exc:  # anywhere: not a bug of mconv's, exit 2 with what it needs
            raise out_of_memory(exc) from None
        except ModuleNotFoundError as exc:  # an optional package this installation lacks: exit 2
            refusal = missing_optional(exc)
            if refusal is None:
                raise
            raise refusal from None
        except OSError as exc:
            if exc.errno != errno.ENOMEM:
                raise
            raise out_of_memory(exc) from None
    except MconvError as exc:
        label = "internal error" if exc.exit_code == EXIT_INTERNAL else "error"
        line = exc.line()
        err_console.print(f"{label}: {line}", markup=False, soft_wrap=True)
        details = exc.details() if hasattr(exc, "details") else None
        if out.debug:
            traceback.print_exc()
            for item in (details or {}).get("items", []):  # every unsupported op, one a line
                err_console.print(f"  {show(item['name'], 200)} ({show(item['kind'], 200)})", markup=False)
        if out.json and not out.emitted:  # a failed gate's report is the document already
            error = {
                "exit_code": exc.exit_code,
                "kind": type(exc).__name__,
                "line": line,
                "message": exc.message,
                "path": exc.path,
                "where": exc.where,
                "hint": exc.hint,
            }
            if details:
                error.update(details)
            out.emit({"error": error})
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
