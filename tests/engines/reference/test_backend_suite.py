"""ONNX's backend test suite (CPU cases that need no download) against the reference executor.

Every case expected to fail is listed in ``EXPECTED_FAILURES`` with its reason and marked
``expectedFailure``: a case that starts passing is reported as an unexpected success, so the list
stays honest.
"""

from __future__ import annotations

import warnings

import onnx.backend.test
from mconv.engines.reference import backend

# Cases whose model must be downloaded (real models with URLs outside the package) are skipped.
# The "light" real models ship inside onnx and run.
DOWNLOAD_PATTERNS: tuple[str, ...] = ()

_E8M0 = "Cast to FLOAT8E8M0 rounds differently from the spec (round-up mode): not implemented"
_UNSEEDED = "expected values come from numpy's unseeded global generator; no implementation can match"

# name (without the _cpu suffix) -> why it fails.
EXPECTED_FAILURES: dict[str, str] = {
    "test_cast_e8m0_FLOAT_to_FLOAT8E8M0": _E8M0,
    "test_cast_e8m0_FLOAT16_to_FLOAT8E8M0": _E8M0,
    **{
        f"test_bernoulli{case}": _UNSEEDED
        for case in ("", "_double", "_double_expanded", "_expanded", "_seed", "_seed_expanded")
    },
    **{
        name: (
            "expected values come from numpy in float16 rounded at every step; the reference "
            "accumulates in float64 and rounds once (2 of 192 values one float16 unit apart, the "
            "reference the closer to the float64 result: 4.0e-4 vs 4.9e-4)"
        )
        for name in ("test_attention_4d_causal_fp16", "test_attention_4d_causal_fp16_expanded")
    },
    "test_loop16_seq_none": (
        "onnx's runner cannot compare a sequence that holds a 0-d tensor (len() of unsized object)"
    ),
}


def select(bt: onnx.backend.test.BackendTest) -> None:
    """The selection shared with bench/conformance.py: CPU only, nothing that downloads."""
    bt.exclude(r"(_cuda)$")
    for pattern in DOWNLOAD_PATTERNS:
        bt.exclude(pattern)


def mark_expected(bt: onnx.backend.test.BackendTest) -> None:
    for name in EXPECTED_FAILURES:
        bt.xfail(rf"^{name}_cpu$")


with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    backend_test = onnx.backend.test.BackendTest(backend, __name__)
    select(backend_test)
    mark_expected(backend_test)
    globals().update(backend_test.test_cases)
