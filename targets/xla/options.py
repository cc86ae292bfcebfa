"""The xla target's export options (:mod:`mconv.targets.base`: fields with help are CLI flags)."""

from __future__ import annotations

from dataclasses import dataclass

from mconv.targets.base import Options as Common
from mconv.targets.base import option


@dataclass(frozen=True)
class Options(Common):
    batch: int | None = option(None, help="Static batch size.", metavar="N")
    bake_weights: bool = option(False, help="Embed weights.")
    mlir_text: bool = option(False, help="Also write StableHLO text.")
    # platforms to export for (default cpu and cuda; "tpu" may be added)
    platforms: list[str] | None = None
