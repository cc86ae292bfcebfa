"""The reference target's export options: none (it writes no bundle)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Options:
    pass
