"""The compile options every jitted XLA program of mconv uses (the xla target's runtime rule 4).

XLA's CPU YNNPACK fusions are turned off (``xla_cpu_experimental_ynn_fusion_type`` empty): jaxlib
0.10's CPU compiler fuses a chain of dots and the reduction after it (a classifier's Gemms and its
Softmax) into one YNN fusion that runs 10-25x slower than the dots alone (``bench/xla_cpu.py``).
Left to the user when ``XLA_FLAGS`` names the option, and skipped where this jaxlib has no such
option. This module imports only jax and numpy, so the deployable loader can use it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

_CPU_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}
_OPTIONS: list[dict[str, str] | None] = []  # decided once per process


def compiler_options() -> dict[str, str] | None:
    """The XLA compile options of rule 4 (None: none to pass)."""
    if not _OPTIONS:
        chosen: dict[str, str] | None = dict(_CPU_OPTIONS)
        if any(k in os.environ.get("XLA_FLAGS", "") for k in _CPU_OPTIONS):
            chosen = None  # the user's flag wins
        else:
            try:  # a jaxlib without the option refuses it at compile time
                jax.jit(lambda x: x + 1, compiler_options=chosen).lower(np.float32(0)).compile()
            except Exception:
                chosen = None
        _OPTIONS.append(chosen)
    return _OPTIONS[0]


def jit(fn: Callable, **kwargs: Any) -> Callable:
    """``jax.jit`` with the compile options of rule 4."""
    return jax.jit(fn, compiler_options=compiler_options(), **kwargs)
