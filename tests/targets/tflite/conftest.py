"""Fixtures of the LiteRT tests: the shared folder, and the real Caffe LeNet-5 with the 5,000 real
MNIST digits (``mnist5k.npz`` holds them sorted by label: a test takes a seeded shuffle or strided
picks, never a leading slice)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from _shared import shared_root  # noqa: E402


@pytest.fixture(scope="session")
def shared_root_dir() -> Path:
    return shared_root()


@pytest.fixture(scope="module")
def lenet_mnist(shared_root_dir):
    """``(model, digits, labels)``: the imported Caffe LeNet-5 and the digits as it was trained on
    them (pixels / 256, ``[N, 1, 28, 28]``), in the file's order (sorted by label)."""
    from mconv.formats import import_model

    caffe = shared_root_dir / "models" / "caffe"
    model = import_model([caffe / "lenet.prototxt", caffe / "lenet_iter_10000.caffemodel"])
    d = np.load(shared_root_dir / "data" / "mnist5k.npz")
    return model, d["images"][:, None].astype(np.float32) / 256, d["labels"]
