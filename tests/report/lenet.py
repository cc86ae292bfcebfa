"""The Caffe LeNet-5 of ../shared/models and real MNIST digits (pixels / 256, as it was trained)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.conftest import shared_dir  # noqa: F401  (the one place ../shared is found)

ROOT = Path(__file__).resolve().parents[2]


def lenet_onnx(shared: Path, dest: Path) -> Path:
    import mconv.api as api

    caffe = shared / "models" / "caffe"
    out = dest / "lenet.onnx"
    api.save(api.load(caffe / "lenet.prototxt", caffe / "lenet_iter_10000.caffemodel"), out)
    return out


def digits(shared: Path, n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``n`` MNIST digits (a seeded draw), as LeNet-5's ``data`` input and their labels."""
    with np.load(shared / "data" / "mnist5k.npz") as z:
        idx = np.sort(np.random.default_rng(seed).permutation(len(z["labels"]))[:n])
        return {
            "data": (z["images"][idx].astype(np.float32) / 256.0)[:, None],
            "labels": z["labels"][idx].astype(np.int64),
        }


def digits_npz(shared: Path, dest: Path, n: int, seed: int = 0) -> Path:
    path = dest / f"mnist{n}.npz"
    np.savez(path, **digits(shared, n, seed))
    return path
