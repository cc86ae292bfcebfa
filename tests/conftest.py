"""Shared test helpers: where ../shared is, and small model builders."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def shared_dir() -> Path | None:
    env = os.environ.get("MCONV_SHARED")
    candidates = [Path(env)] if env else []
    candidates.append(ROOT.parent / "shared")
    for c in candidates:
        if (c / "models").is_dir():
            return c
    return None


@pytest.fixture
def shared() -> Path:
    d = shared_dir()
    if d is None:
        pytest.skip("../shared (models and data) is absent; set MCONV_SHARED to its path")
    return d
