"""The tflite target's export options (:mod:`mconv.targets.base`: fields with help are CLI flags)."""

from __future__ import annotations

from dataclasses import dataclass

from mconv.targets.base import Options as Common
from mconv.targets.base import option

PRECISIONS = ("fp32", "fp16", "int8-weights", "int8", "int16x8")
CALIBRATIONS = ("auto", "minmax", "percentile", "entropy", "mse")
IO_DTYPES = ("float32", "int8", "uint8")
PALETTES = ("int8", "fp16", "float32")
ROUNDINGS = ("gptq", "nearest")


@dataclass(frozen=True)
class Options(Common):
    precision: str | None = option(
        None, help="Compute precision.", metavar="fp32|fp16|int8-weights|int8|int16x8"
    )
    data: str | None = option(None, help="Calibration samples (.npz) for int8.", metavar="NPZ")
    calibration: str | None = option(
        None, help="int8 range method.", metavar="auto|minmax|mse|percentile|entropy"
    )
    io_dtype: str | None = option(None, help="int8 model I/O dtype.", metavar="float32|int8|uint8")
    rounding: str | None = option(
        None, help="int8 weight codes: fitted (GPTQ) or nearest.", metavar="gptq|nearest"
    )
    palette: str | None = option(None, help="How off-grid palettes are stored.", metavar="int8|fp16|float32")
    calibration_samples: int | None = None  # at most this many samples of --data (default 500)
    percentile: float | None = None  # the percentile calibration's bound (default 99.99)
