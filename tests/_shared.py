"""Where ``../shared`` (the real models and data) is, for test modules that need it outside a
fixture: MCONV_SHARED, else the folder beside the project root (tests/conftest.py's rule). Import
with ``tests/`` on ``sys.path`` (``from _shared import shared_root``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def shared_root() -> Path:
    """The shared folder; skips the calling test where it is absent."""
    env = os.environ.get("MCONV_SHARED")
    root = Path(env) if env else Path(__file__).resolve().parents[1].parent / "shared"
    if not (root / "models").is_dir():
        pytest.skip("../shared (models and data) is absent; set MCONV_SHARED to its path")
    return root
