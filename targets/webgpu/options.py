"""The webgpu target's export options (:mod:`mconv.targets.base`: fields with help are CLI flags)."""

from __future__ import annotations

from dataclasses import dataclass

from mconv.targets.base import Options as Common
from mconv.targets.base import option


@dataclass(frozen=True)
class Options(Common):
    batch: int | None = option(None, help="Static batch size.", metavar="N")
    precision: str | None = option(None, help="Compute precision.", metavar="fp16|fp32")
    # the package's name (default: the graph's name, else the bundle folder's)
    model_name: str | None = None
