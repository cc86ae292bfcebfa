"""Shared test helpers: where ../shared is, and small model builders.

Also the suite's determinism rules (issue 11, item 15):
- hypothesis runs derandomized, with no example database, under the "mconv" profile loaded here
  (a test's own ``@settings(...)`` inherits these from the loaded profile);
- a test module's ``RNG`` (a module-level ``np.random.default_rng(<fixed seed>)``, the pattern the
  op tests use through small helpers) is replaced before every test by a fresh generator with the
  same seed, so every test sees the same numbers whatever ran before it (test order, xdist
  worker). ``tests/test_seeding.py`` checks that no other module-level random state exists.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent

settings.register_profile("mconv", derandomize=True, database=None, deadline=None, print_blob=True)
settings.load_profile("mconv")

_MODULE_SEEDS: dict[str, int] = {}


@pytest.fixture(autouse=True)
def _fresh_module_rng(request, monkeypatch):
    """Give each test its own generator: the module's ``RNG`` restarted from its fixed seed."""
    module = getattr(request, "module", None)
    gen = getattr(module, "RNG", None)
    if isinstance(gen, np.random.Generator):
        name = module.__name__
        if name not in _MODULE_SEEDS:
            entropy = gen.bit_generator.seed_seq.entropy
            if not isinstance(entropy, int):
                raise AssertionError(f"{name}.RNG must be np.random.default_rng(<fixed int seed>)")
            _MODULE_SEEDS[name] = entropy
        monkeypatch.setattr(module, "RNG", np.random.default_rng(_MODULE_SEEDS[name]))
    yield


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
