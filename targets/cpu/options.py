"""The cpu target's export options (:mod:`mconv.targets.base`: fields with help are CLI flags)."""

from __future__ import annotations

from dataclasses import dataclass

from mconv.targets.base import Options as Common
from mconv.targets.base import option


@dataclass(frozen=True)
class Options(Common):
    dense: bool = option(False, help="Plain ONNX with dense weights, no container.")
    matmul_nbits: bool = option(
        False,
        help="int4 blockwise MatMuls as ORT's MatMulNBits.",
    )
    nbits_accuracy_level: int = 0  # MatMulNBits' accuracy_level (0: fp32 activations; 4: int8)
