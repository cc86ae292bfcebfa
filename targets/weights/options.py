"""The weights target's export options: the common ones only (``codec``)."""

from __future__ import annotations

from dataclasses import dataclass

from mconv.targets.base import Options as Common


@dataclass(frozen=True)
class Options(Common):
    pass
