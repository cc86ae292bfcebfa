"""Small real data sets in the shapes that models expect."""

from __future__ import annotations

import numpy as np


def digits_as_mnist(images: np.ndarray) -> np.ndarray:
    """UCI 8x8 digits (values 0..16) in MNIST framing: (N, 1, 28, 28) float32 in [0, 1].

    As MNIST was made: the digit scaled into a 20x20 box (bilinear), then placed so its centre of
    mass sits at the centre of the 28x28 frame.
    """
    from scipy import ndimage

    images = np.asarray(images)
    out = np.zeros((len(images), 1, 28, 28), np.float32)
    for i, img in enumerate(images):
        box = np.clip(ndimage.zoom(img.astype(np.float64) / 16.0, 20 / 8, order=1), 0.0, 1.0)
        cy, cx = ndimage.center_of_mass(box)
        oy = int(np.clip(round(14 - cy), 0, 8))
        ox = int(np.clip(round(14 - cx), 0, 8))
        out[i, 0, oy : oy + 20, ox : ox + 20] = box
    return out
