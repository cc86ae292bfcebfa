"""mconv never writes a model less valid than its input (issue 12, item 1).

After ``import``, ``optimize`` and ``export --target cpu`` write a model, :func:`check_written`
opens what was written the way a user would: ONNX's checker and an ONNX Runtime session (graph
optimizations off, so only loading, type and shape inference run). When that fails, the input is
opened the same way; if the input was accepted (or came from another framework, which mconv
accepted), the refusal is mconv's bug: :class:`mconv.errors.MconvBug`, exit 3, one line naming
the file written and ONNX Runtime's first line. An input that ONNX Runtime refuses itself (a
custom op, say) makes no promise about its output, and nothing is reported.

The written file stays in place either way (it is complete; the user may want to look at it).
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from mconv.errors import MconvBug, show


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    return show(line, 300)


def onnx_refusal(path: str | os.PathLike) -> str | None:
    """Why ONNX's checker or ONNX Runtime refuses the ``.onnx`` at ``path``; None when both accept."""
    import onnx
    import onnxruntime as ort

    try:
        onnx.checker.check_model(str(path))
    except Exception as exc:  # the checker raises ValidationError, and others on bad protobufs
        return f"onnx.checker: {_first_line(exc)}"
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        # ORT's Python wrapper prints provider-fallback notes to stdout; stdout is the JSON's.
        with contextlib.redirect_stdout(sys.stderr):
            ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])
    except Exception as exc:
        return f"ONNX Runtime: {_first_line(exc)}"
    return None


def bundle_refusal(path: str | os.PathLike) -> str | None:
    """Why the cpu bundle at ``path`` does not open in ONNX Runtime; None when it does."""
    from mconv.errors import MconvError
    from mconv.targets import get_target

    try:
        get_target("cpu").load(path)
    except MconvError as exc:
        return exc.message
    except Exception as exc:
        return _first_line(exc)
    return None


def check_written(written: str | os.PathLike, source: str | os.PathLike | None, *, what: str) -> None:
    """Raise :class:`MconvBug` when ``written`` is refused although ``source`` was accepted.

    ``written`` is an ``.onnx`` file or a cpu bundle folder; ``source`` the model file the command
    read (None or a non-ONNX file: mconv's own import accepted it). ``what`` names the command.
    """
    written = Path(written)
    if written.is_dir():
        from mconv.bundle import load_bundle

        if load_bundle(written, verify=False).target != "cpu":
            return  # weights bundles hold no graph; the xla and metal targets check their own
        refusal = bundle_refusal(written)
    elif written.suffix.lower() == ".onnx":
        refusal = onnx_refusal(written)
    else:
        return
    if refusal is None:
        return
    if source is not None and Path(source).suffix.lower() == ".onnx" and Path(source).is_file():
        if onnx_refusal(source) is not None:
            return  # the input was refused too: no promise to keep
    raise MconvBug(
        f"{what} wrote a model that ONNX Runtime or ONNX's checker refuses although its input was "
        f"accepted ({refusal})",
        path=str(written),
        hint="this is a bug in mconv: please report it with the input model and the command",
    )
