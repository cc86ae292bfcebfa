"""LiteRT's interpreter, opened quietly.

Rule: LiteRT's C++ runtime logs to the process's standard error (``INFO: Created TensorFlow Lite
XNNPACK delegate for CPU.`` whenever an interpreter applies its CPU delegate), which would break
mconv's promise that stderr carries only its own lines. Opening an interpreter (construction and
``allocate_tensors``, where the delegate is applied) therefore runs with file descriptor 2 sent to
the null device; LiteRT's errors still arrive, in the exceptions its Python wrapper raises.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def quiet_stderr() -> Iterator[None]:
    """File descriptor 2 goes to the null device for the block (nothing where it has none)."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a stderr without a descriptor (captured)
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), fd)
            yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)


def open_interpreter(data: bytes, **options: Any) -> Any:
    """A LiteRT interpreter over ``data`` with its tensors allocated (``options``: the
    interpreter's own keyword arguments)."""
    from ai_edge_litert.interpreter import Interpreter

    with quiet_stderr():
        interp = Interpreter(model_content=data, **options)
        interp.allocate_tensors()
    return interp
