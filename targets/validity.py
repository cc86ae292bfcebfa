"""mconv never writes a model less valid than its input.

After ``import``, ``optimize`` and ``export --target cpu`` write a model with a graph,
:func:`check_written` opens what was written the way a user would: ONNX's checker and an ONNX
Runtime session (graph optimizations off, so only loading, type and shape inference run). When
that fails:
- the input was an ONNX model, opened the same way: if it was accepted, the refusal is mconv's
  bug, :class:`mconv.errors.MconvBug`, exit 3, one line naming the file written and ONNX
  Runtime's first line; an input refused itself (a custom op, say) makes no promise;
- the input was another framework's file: mconv has no oracle for it at run time (it runs no
  framework), and a damaged file can import into a graph whose shapes contradict each other, so
  the refusal is exit 2, saying that the source may be damaged or mconv has a bug.

The written file stays in place either way (it is complete; the user may want to look at it).
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

from mconv.errors import InputError, MconvBug, show


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
        # ORT's Python wrapper prints provider-fallback notes to stdout, which is the JSON's; the
        # refusal itself comes back as the exception.
        with contextlib.redirect_stdout(io.StringIO()):
            ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])
    except Exception as exc:
        if "NOT_IMPLEMENTED" in str(exc) and _computes_in_bfloat16(path):
            return None  # the checker accepted it; ORT's CPU provider has few bfloat16 kernels
        return f"ONNX Runtime: {_first_line(exc)}"
    return None


def _computes_in_bfloat16(path: str | os.PathLike) -> bool:
    """A model that the fp16 pass made compute in bfloat16 (mode bf16; for the xla target)."""
    import onnx

    props = onnx.load(str(path), load_external_data=False).metadata_props
    return any(p.key == "mconv.precision" and p.value == "bfloat16" for p in props)


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


def check_written(
    written: str | os.PathLike, source: str | os.PathLike | None, *, what: str, graph: bool = True
) -> None:
    """Raise when ``written`` is refused: :class:`MconvBug` when ``source`` was an ONNX model that
    ONNX Runtime accepted, else :class:`InputError`.

    ``written`` is an ``.onnx`` file or a cpu bundle folder; ``source`` the model file the command
    read. A source in another framework's format has no oracle here (mconv runs no framework), so
    a refusal then says that the source may be damaged or that mconv has a bug, exit 2.
    ``graph=False`` (a weight-only model: tensors, no graph to run) skips the check. ``what``
    names the command.
    """
    if not graph:
        return
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
    src = Path(source) if source is not None else None
    onnx_source = src is not None and src.suffix.lower() == ".onnx" and src.is_file()
    if src is not None and onnx_source and onnx_refusal(src) is not None:
        return  # the input was refused too: no promise to keep
    if not onnx_source:
        raise InputError(
            f"{what} made a model that ONNX Runtime or ONNX's checker refuses ({refusal})",
            path=str(written),
            hint=f"the source {show(source or 'file', 120)} may be damaged (check that it runs in its own "
            "framework); if it does, this is a bug in mconv: please report it",
        )
    raise MconvBug(
        f"{what} wrote a model that ONNX Runtime or ONNX's checker refuses although its input was "
        f"accepted ({refusal})",
        path=str(written),
        hint="this is a bug in mconv: please report it with the input model and the command",
    )
