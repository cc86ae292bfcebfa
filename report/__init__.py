"""One self-contained HTML report of what ``optimize`` did and what ``verify`` found.

Rules:

1. The report reads the command's result as a dict (``as_dict()``, the ``--json`` document)
   and, for the weight histograms only, the models' weights; so the page and the JSON never
   disagree. A model summary is ``mconv inspect``'s dict of the same model.
2. One file: charts are inline SVG drawn by matplotlib (:mod:`mconv.report.charts`), every chart
   has its numbers in a table beside it, and a Content-Security-Policy meta tag forbids every
   request (``default-src 'none'``): nothing is fetched, nothing runs.
3. Everything taken from a model (names, metadata, options) is HTML-escaped: a model is
   untrusted input.
4. Bounded: the histograms cover the ``layers`` largest weights, long tables keep their largest
   rows and say how many they left out, the JSON appendix is left out above its size limit.
5. matplotlib is imported only when a report is asked for (``pip install 'mconv[report]'``);
   without it ``--report`` is one line, exit 2, before any work.
6. The file is written as every output is (:mod:`mconv.fileio`: checked, then atomic).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mconv.errors import InputError

PIP_HINT = "pip install 'mconv[report]' (or: pip install matplotlib)"
COMMANDS = ("optimize", "verify", "analyze", "inspect", "report")


def require() -> None:
    """matplotlib is importable, or one line, exit 2 (rule 5); cheap: nothing is imported."""
    try:
        found = importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):  # blocked, or a stand-in None in sys.modules
        found = False
    if not found:
        raise InputError("--report draws its charts with matplotlib, which is not installed", hint=PIP_HINT)


def check_path(path: str | os.PathLike, *inputs: str | os.PathLike | None) -> Path:
    """Before the work: matplotlib is there, ``path`` is an HTML file mconv may write (never one
    of ``inputs``, never a folder), rule 6."""
    from mconv.fileio import check_output, reading

    require()
    with reading(*[p for p in inputs if p is not None]):
        return check_output(path, "file")


def write_report(
    path: str | os.PathLike,
    command: str,
    doc: dict[str, Any],
    *,
    inputs: Sequence[str | os.PathLike | None] = (),
    summary: dict[str, Any] | None = None,
    before: Any = None,
    after: Any = None,
    layers: int = 6,
) -> Path:
    """Write the report of ``command``'s result ``doc`` (its ``as_dict()``) to ``path``.

    ``summary``: ``inspect``'s dict of the model; ``before`` / ``after``: ``onnx_ir`` models whose
    weights the histograms show (the ``layers`` largest); ``inputs``: the files the command read
    (the report never replaces one)."""
    from mconv.fileio import atomic_write_bytes
    from mconv.report.page import build

    if command not in COMMANDS:
        raise ValueError(f"no report for {command!r}")
    dest = check_path(path, *inputs)
    html = build(command, doc, summary=summary, before=before, after=after, layers=layers)
    atomic_write_bytes(dest, html.encode("utf-8"))
    return dest
